// Registration, liveness and routing choices of the router's node registry.
#include "router/node_registry.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

namespace baton::router {
namespace {

using namespace std::chrono_literals;
using Clock = NodeRegistry::Clock;

control::Register registration(const std::string& name, Role role, int32_t block_size = 16) {
  control::Register r;
  r.node = name;
  r.role = role;
  r.descriptor = {1, 2, 3};
  r.block_size = block_size;
  r.max_model_len = 1024;
  r.kv_dtype = "bf16";
  r.kv_bytes_per_token = 1024;
  return r;
}

std::map<std::string, Role> two_by_two() {
  return {
      {"p0", Role::kPrefill}, {"p1", Role::kPrefill}, {"d0", Role::kDecode}, {"d1", Role::kDecode}};
}

TEST(NodeRegistry, RefusesUnknownNamesWrongRolesAndMismatchedBlockSizes) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kRoundRobin);
  auto now = Clock::now();
  EXPECT_NE(registry.register_node(registration("x9", Role::kDecode), now)
                .message()
                .find("not in the cluster config"),
            std::string::npos);
  EXPECT_NE(registry.register_node(registration("p0", Role::kDecode), now)
                .message()
                .find("configured as prefill"),
            std::string::npos);
  ASSERT_TRUE(registry.register_node(registration("p0", Role::kPrefill, 16), now).is_ok());
  EXPECT_NE(registry.register_node(registration("d0", Role::kDecode, 32), now)
                .message()
                .find("block size 32"),
            std::string::npos);
  EXPECT_EQ(registry.up_count(Role::kPrefill), 1);
  EXPECT_EQ(registry.up_count(Role::kDecode), 0);
}

// A node whose KV pool keeps another format could neither send its blocks
// to the others nor read theirs: refused, the message naming both formats.
TEST(NodeRegistry, RefusesANodeOfAnotherKvFormatNamingBoth) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kRoundRobin);
  auto now = Clock::now();
  ASSERT_TRUE(registry.register_node(registration("p0", Role::kPrefill), now).is_ok());
  control::Register other = registration("d0", Role::kDecode);
  other.kv_dtype = "int8";
  const std::string message = registry.register_node(other, now).message();
  EXPECT_NE(message.find("node 'd0' keeps KV as int8, the cluster's nodes as bf16 (node 'p0')"),
            std::string::npos)
      << message;
  EXPECT_EQ(registry.up_count(Role::kDecode), 0);
  other.kv_dtype = "bf16";
  EXPECT_TRUE(registry.register_node(other, now).is_ok());
  EXPECT_EQ(registry.find("d0")->kv_bytes_per_token, 1024);
  // A format Baton has not is refused (it would go into /metrics as a label).
  control::Register odd = registration("d1", Role::kDecode);
  odd.kv_dtype = "bf16\"} 1\nx";
  EXPECT_NE(registry.register_node(odd, now).message().find("unknown format"), std::string::npos);
  EXPECT_EQ(registry.up_count(Role::kDecode), 1);
}

// A node on a GPU beside CPU nodes (or the reverse) lays its KV blocks out
// otherwise (keys token-major, not grouped): refused, naming both nodes.
TEST(NodeRegistry, RefusesANodeOnAnotherKindOfDeviceNamingBoth) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kRoundRobin);
  auto now = Clock::now();
  control::Register p0 = registration("p0", Role::kPrefill);
  p0.device = "cuda:0";
  ASSERT_TRUE(registry.register_node(p0, now).is_ok());
  control::Register d0 = registration("d0", Role::kDecode);
  d0.device = "cpu";
  const std::string message = registry.register_node(d0, now).message();
  EXPECT_NE(message.find("node 'd0' computes on cpu, node 'p0' on cuda:0"), std::string::npos)
      << message;
  EXPECT_EQ(registry.up_count(Role::kDecode), 0);
  d0.device = "tpu";  // no device Baton has
  EXPECT_NE(registry.register_node(d0, now).message().find("node 'd0''s device"),
            std::string::npos);
  // Another GPU is the same kind of device.
  d0.device = "cuda:1";
  EXPECT_TRUE(registry.register_node(d0, now).is_ok());
  EXPECT_EQ(registry.up_count(Role::kDecode), 1);
}

// The prefix cache counters the router exports only grow: heartbeats add
// their increases, and a node that restarts (a new pid, or a smaller count)
// adds from zero again.
TEST(NodeRegistry, PrefixCacheTotalsOnlyGrow) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kRoundRobin);
  auto now = Clock::now();
  control::Register d0 = registration("d0", Role::kDecode);
  d0.pid = 100;
  ASSERT_TRUE(registry.register_node(d0, now).is_ok());
  auto beat = [&](int64_t queries, int64_t hits, int64_t ssd_hits) {
    control::NodeLoad load;
    load.prefix_cache_queries = queries;
    load.prefix_cache_hits = hits;
    load.prefix_cache_ssd_hits = ssd_hits;
    EXPECT_TRUE(registry.heartbeat("d0", load, now));
    const NodeState& node = registry.nodes().at("d0");
    return std::vector<int64_t>{node.prefix_cache_queries, node.prefix_cache_hits,
                                node.prefix_cache_ssd_hits};
  };
  using Totals = std::vector<int64_t>;
  EXPECT_EQ(beat(40, 16, 0), (Totals{40, 16, 0}));
  EXPECT_EQ(beat(50, 16, 16), (Totals{50, 16, 16}));
  EXPECT_EQ(beat(7, 2, 1), (Totals{57, 18, 17}));  // restarted
  d0.pid = 200;  // a new process that has counted more than the old one did
  ASSERT_TRUE(registry.register_node(d0, now).is_ok());
  EXPECT_EQ(beat(60, 20, 20), (Totals{117, 38, 37}));
}

TEST(NodeRegistry, SilentNodesGoDownAndMustRegisterAgain) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kRoundRobin);
  auto t0 = Clock::now();
  ASSERT_TRUE(registry.register_node(registration("d0", Role::kDecode), t0).is_ok());
  ASSERT_TRUE(registry.register_node(registration("d1", Role::kDecode), t0).is_ok());
  EXPECT_TRUE(registry.heartbeat("d1", {}, t0 + 900ms));
  auto down = registry.expire(t0 + 1500ms, 1000ms);
  ASSERT_EQ(down, std::vector<std::string>{"d0"});
  EXPECT_FALSE(registry.heartbeat("d0", {}, t0 + 1600ms));  // must register again
  EXPECT_FALSE(registry.heartbeat("nobody", {}, t0));
  for (int i = 0; i < 10; ++i) EXPECT_EQ(registry.pick(Role::kDecode)->name, "d1");
  EXPECT_EQ(registry.pick(Role::kPrefill), nullptr);
}

TEST(NodeRegistry, RoundRobinCyclesOverNodesThatAreUp) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kRoundRobin);
  auto now = Clock::now();
  for (const char* name : {"d0", "d1"})
    ASSERT_TRUE(registry.register_node(registration(name, Role::kDecode), now).is_ok());
  std::map<std::string, int> picks;
  for (int i = 0; i < 100; ++i) picks[registry.pick(Role::kDecode)->name]++;
  EXPECT_EQ(picks["d0"], 50);
  EXPECT_EQ(picks["d1"], 50);
}

TEST(NodeRegistry, LeastLoadedFollowsAssignedWorkAndFreeBlocks) {
  std::mt19937 rng(std::random_device{}());
  NodeRegistry registry(two_by_two(), RoutingPolicy::kLeastLoaded);
  auto now = Clock::now();
  for (const char* name : {"p0", "p1"})
    ASSERT_TRUE(registry.register_node(registration(name, Role::kPrefill), now).is_ok());
  for (const char* name : {"d0", "d1"})
    ASSERT_TRUE(registry.register_node(registration(name, Role::kDecode), now).is_ok());
  int a = 1 + int(rng() % 50), b = a + 1 + int(rng() % 50);
  registry.find("p0")->assigned_tokens = b;
  registry.find("p1")->assigned_tokens = a;
  EXPECT_EQ(registry.pick(Role::kPrefill)->name, "p1");
  registry.find("d0")->assigned_requests = 3;
  registry.find("d1")->assigned_requests = 3;
  control::NodeLoad load;
  load.free_blocks = 100;
  ASSERT_TRUE(registry.heartbeat("d1", load, now));
  load.free_blocks = 10;
  ASSERT_TRUE(registry.heartbeat("d0", load, now));
  EXPECT_EQ(registry.pick(Role::kDecode)->name, "d1");  // same requests, more free blocks
  registry.find("d1")->assigned_requests = 4;
  EXPECT_EQ(registry.pick(Role::kDecode)->name, "d0");  // fewer requests wins
  // Idle, equal nodes share the work.
  registry.find("p0")->assigned_tokens = 0;
  registry.find("p1")->assigned_tokens = 0;
  std::map<std::string, int> picks;
  for (int i = 0; i < 10; ++i) picks[registry.pick(Role::kPrefill)->name]++;
  EXPECT_EQ(picks["p0"], 5);
  EXPECT_EQ(picks["p1"], 5);
}

// Prompts of `blocks` full 16-token blocks of their own (a distinct first
// token each), then one more token.
std::vector<int32_t> prompt_of(int32_t first, int32_t blocks) {
  std::vector<int32_t> prompt(size_t(blocks) * 16 + 1, 7);
  prompt[0] = first;
  return prompt;
}

TEST(NodeRegistry, PrefixAwareSendsAPromptWhereItsPrefixWent) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kPrefixAware);
  auto now = Clock::now();
  for (const char* name : {"d0", "d1"})
    ASSERT_TRUE(registry.register_node(registration(name, Role::kDecode), now).is_ok());
  // Idle nodes: two different prompts go to different nodes (rotation).
  const auto a = prompt_of(1, 4), b = prompt_of(2, 4);
  NodeState* first = registry.pick(Role::kDecode, a);
  NodeState* second = registry.pick(Role::kDecode, b);
  ASSERT_NE(first, nullptr);
  ASSERT_NE(second, nullptr);
  EXPECT_NE(first->name, second->name);
  // Each later prompt that starts like one of them follows it, whatever the
  // rotation says, while the loads stay even.
  std::vector<int32_t> a_longer = a;
  a_longer.insert(a_longer.end(), 40, 9);
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(registry.pick(Role::kDecode, a_longer)->name, first->name) << i;
    EXPECT_EQ(registry.pick(Role::kDecode, b)->name, second->name) << i;
  }
  // A prompt that shares only a partial first block shares nothing: plain
  // least-loaded (d1 is less loaded).
  registry.find(first->name)->assigned_requests = 2;
  registry.find(second->name)->assigned_requests = 1;
  std::vector<int32_t> short_a(a.begin(), a.begin() + 10);
  EXPECT_EQ(registry.pick(Role::kDecode, short_a)->name, second->name);
  // The holder is chosen while within the margin of the least-loaded...
  registry.find(first->name)->assigned_requests = 5;
  EXPECT_EQ(registry.pick(Role::kDecode, a)->name, first->name);
  // ...and not past it: then the prompt goes to the least-loaded node, which
  // the router now remembers as holding it.
  registry.find(first->name)->assigned_requests = 6;
  EXPECT_EQ(registry.pick(Role::kDecode, a)->name, second->name);
  // Both now hold it: the less loaded one gets it.
  registry.find(first->name)->assigned_requests = 2;
  registry.find(second->name)->assigned_requests = 1;
  EXPECT_EQ(registry.pick(Role::kDecode, a)->name, second->name);
  registry.find(first->name)->assigned_requests = 1;
  registry.find(second->name)->assigned_requests = 2;
  EXPECT_EQ(registry.pick(Role::kDecode, a)->name, first->name);
}

TEST(NodeRegistry, PrefixAwareForgetsWhatARestartedNodeHeld) {
  NodeRegistry registry(two_by_two(), RoutingPolicy::kPrefixAware);
  auto now = Clock::now();
  control::Register d0 = registration("d0", Role::kDecode), d1 = registration("d1", Role::kDecode);
  d0.pid = 10;
  d1.pid = 11;
  ASSERT_TRUE(registry.register_node(d0, now).is_ok());
  ASSERT_TRUE(registry.register_node(d1, now).is_ok());
  const auto a = prompt_of(3, 2);
  const std::string holder = registry.pick(Role::kDecode, a)->name;
  EXPECT_EQ(registry.pick(Role::kDecode, a)->name, holder);
  EXPECT_GT(registry.sent_block_count(holder), 0u);
  // The holder restarts (a new process): its cache is empty, so the prompt
  // goes by load again, and rotation picks the other node first.
  control::Register again = holder == "d0" ? d0 : d1;
  again.pid = 99;
  ASSERT_TRUE(registry.register_node(again, now).is_ok());
  EXPECT_EQ(registry.sent_block_count(holder), 0u);
  std::map<std::string, int> picks;
  for (const auto& p : {prompt_of(4, 2), prompt_of(5, 2)})
    picks[registry.pick(Role::kDecode, p)->name]++;
  EXPECT_EQ(picks.size(), 2u) << "fresh prompts still rotate over idle nodes";
}

}  // namespace
}  // namespace baton::router
