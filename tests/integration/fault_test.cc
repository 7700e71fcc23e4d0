// Nodes killed with SIGKILL under load: affected requests end with an error
// within a bounded time, blocks are freed, the router routes around the dead
// node and keeps serving.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "common/control_socket.h"
#include "tests/integration/cluster_harness.h"

namespace baton::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// Sends SIGCONT to a process the test stops, however the test ends.
struct ResumeOnExit {
  pid_t pid;
  ~ResumeOnExit() { ::kill(pid, SIGCONT); }
};

// When a node was killed, written by the test's thread and read by its
// client threads (an atomic: a plain time_point there was a data race).
class KillTime {
 public:
  void set_now() { nanos_.store(Clock::now().time_since_epoch().count()); }
  bool known() const { return nanos_.load() != 0; }
  // Seconds from the kill to now; negative before it (or when unknown).
  double seconds_since() const {
    if (!known()) return -1;
    const Clock::time_point at{Clock::duration(nanos_.load())};
    return std::chrono::duration<double>(Clock::now() - at).count();
  }

 private:
  std::atomic<Clock::rep> nanos_{0};
};

struct StreamOutcome {
  bool ok = false;           // ended with a finish_reason and [DONE]
  std::string what;          // how it ended, for failure messages
  bool error_event = false;  // an SSE error event and [DONE], or a 503 before streaming
  std::string finish_reason;
  double seconds_after_kill = -1;
};

// Streams one request and classifies how it ended; counts streams that got
// their first bytes.
StreamOutcome stream_one(const Cluster& cluster, const json& body, const KillTime* killed_at,
                         std::atomic<int>* streams_started) {
  StreamOutcome outcome;
  std::string buffer;
  bool started = false;
  auto response = tools::http_stream(
      "127.0.0.1", cluster.http_port(), "/v1/completions", body.dump(),
      [&](std::string_view data) {
        if (!started) ++*streams_started;
        started = true;
        buffer.append(data);
        return true;
      },
      60s);
  if (killed_at != nullptr && killed_at->known()) {
    outcome.seconds_after_kill = killed_at->seconds_since();
  }
  outcome.what =
      (response.is_ok() ? std::to_string(response->status) : response.status().to_string()) + " " +
      buffer.substr(buffer.size() > 300 ? buffer.size() - 300 : 0);
  if (!response.is_ok()) return outcome;
  if (response->status != 200) {
    // Failed before its first token: an HTTP error with the JSON error body.
    json error = json::parse(buffer, nullptr, false);
    outcome.error_event = response->status == 503 && error.contains("error");
    return outcome;
  }
  std::vector<std::string> events = sse_payloads(buffer);
  if (events.empty() || events.back() != "[DONE]") return outcome;
  for (const std::string& event : events) {
    if (event == "[DONE]") continue;
    json chunk = json::parse(event, nullptr, false);
    if (chunk.contains("error")) outcome.error_event = true;
    if (chunk.contains("choices") && !chunk["choices"].empty() &&
        !chunk["choices"][0]["finish_reason"].is_null()) {
      outcome.finish_reason = chunk["choices"][0]["finish_reason"];
    }
  }
  outcome.ok = !outcome.error_event && !outcome.finish_reason.empty();
  return outcome;
}

TEST(FaultTest, DecodeNodeKilledMidStream) {
  ClusterShape shape;
  shape.prefill_nodes = 1;
  shape.decode_nodes = 2;
  shape.policy = "round-robin";
  shape.max_num_seqs = 1;  // streams queue on their decode node, so a kill finds them in flight
  Cluster cluster(shape);
  pid_t victim = cluster.node_pid("decode-0");
  ASSERT_GT(victim, 0);

  constexpr int kStreams = 6;
  std::vector<StreamOutcome> outcomes(kStreams);
  KillTime killed_at;
  std::atomic<int> streams_started{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kStreams; ++i) {
    clients.emplace_back([&, i] {
      json body = {{"prompt", std::string(30 + i, 'q')},
                   {"max_tokens", 900},
                   {"ignore_eos", true},
                   {"stream", true},
                   {"temperature", 0}};
      outcomes[i] = stream_one(cluster, body, &killed_at, &streams_started);
    });
    std::this_thread::sleep_for(5ms);  // round-robin alternates decode nodes in submission order
  }
  // Kill once both decode nodes stream: with one sequence at a time per node,
  // decode-0 then has one stream running and others queued behind it.
  auto wait_until = Clock::now() + 10s;
  while (streams_started.load() < 2 && Clock::now() < wait_until) {
    std::this_thread::sleep_for(1ms);
  }
  killed_at.set_now();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  for (auto& client : clients) client.join();

  int failed = 0, finished = 0;
  for (const StreamOutcome& outcome : outcomes) {
    EXPECT_TRUE(outcome.ok || outcome.error_event)
        << "every stream ends, with a finish or an error event: " << outcome.what;
    if (outcome.error_event) {
      ++failed;
      EXPECT_LT(outcome.seconds_after_kill, 5.0) << "failed within a bounded time of the kill";
    }
    if (outcome.ok) {
      ++finished;
      EXPECT_EQ(outcome.finish_reason, "length");
    }
  }
  EXPECT_GT(failed, 0) << "the killed node had streams in flight";
  EXPECT_GT(finished, 0) << "the other decode node's streams finished";

  // The router marks the node down (within the heartbeat timeout) and keeps
  // serving on the survivor.
  bool marked_down = false;
  for (auto until = Clock::now() + 5s; !marked_down && Clock::now() < until;) {
    for (const auto& node : cluster.nodes().value("nodes", json::array())) {
      if (node["name"] == "decode-0" && !node["up"].get<bool>()) marked_down = true;
    }
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(marked_down);
  for (int i = 0; i < 4; ++i) {
    auto response =
        cluster.post("/v1/completions", {{"prompt", std::string(20 + i, 'z')}, {"max_tokens", 5}});
    ASSERT_TRUE(response.is_ok());
    EXPECT_EQ(response->status, 200) << response->body;
  }
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);

  // Restarted by hand, the node registers again and takes work again.
  cluster.start_node("decode", "decode-0");
  bool back = false;
  for (auto until = Clock::now() + 20s; !back && Clock::now() < until;) {
    back = cluster.node_up("decode-0");
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(back) << cluster.nodes().dump(2);
  std::set<std::string> served;
  for (int i = 0; i < 6; ++i) {
    auto response =
        cluster.post("/v1/completions", {{"prompt", std::string(20 + i, 'w')}, {"max_tokens", 3}});
    ASSERT_TRUE(response.is_ok());
    ASSERT_EQ(response->status, 200) << response->body;
    served.insert(
        json::parse(response->body)["choices"][0]["served_by"]["decode"].get<std::string>());
  }
  EXPECT_EQ(served, (std::set<std::string>{"decode-0", "decode-1"}))
      << "round-robin uses the restarted node";
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// A decode node that only stopped (SIGSTOP) is declared dead and its stream
// failed; when it resumes, it must not generate that request to the end:
// the router aborts work it no longer waits for as soon as the node reports
// it.
TEST(FaultTest, ANodeDeclaredDeadStopsTheWorkTheRouterFailed) {
  ClusterShape shape;
  shape.prefill_nodes = 1;
  shape.decode_nodes = 1;
  Cluster cluster(shape);
  const pid_t node = cluster.node_pid("decode-0");
  ASSERT_GT(node, 0);
  const ResumeOnExit resume{node};

  constexpr int kMaxTokens = 900;
  // Stop the node once tokens stream: its engine is then mid-generation.
  std::atomic<int> events{0};
  std::string buffer;
  std::thread client([&] {
    json body = {{"prompt", std::string(30, 'q')},
                 {"max_tokens", kMaxTokens},
                 {"ignore_eos", true},
                 {"stream", true},
                 {"temperature", 0}};
    (void)tools::http_stream(
        "127.0.0.1", cluster.http_port(), "/v1/completions", body.dump(),
        [&](std::string_view data) {
          buffer.append(data);
          size_t n = 0;
          for (size_t at = 0; (at = buffer.find("data:", at)) != std::string::npos; ++at) ++n;
          events.store(int(n));
          return true;
        },
        60s);
  });
  for (auto until = Clock::now() + 10s; events.load() < 3 && Clock::now() < until;) {
    std::this_thread::sleep_for(50us);
  }
  ASSERT_EQ(::kill(node, SIGSTOP), 0);
  client.join();
  ASSERT_NE(buffer.find("\"error\""), std::string::npos)
      << "the router failed the stream: "
      << buffer.substr(buffer.size() > 300 ? buffer.size() - 300 : 0);
  // Tokens it had generated when it stopped: about what the client got.
  const int64_t before = events.load();
  // With its only decode node dead, the cluster says it cannot serve, and why.
  auto health = cluster.get("/health");
  ASSERT_TRUE(health.is_ok());
  EXPECT_EQ(health->status, 503) << health->body;
  EXPECT_EQ(json::parse(health->body).value("reason", ""), "no decode node is up") << health->body;

  ASSERT_EQ(::kill(node, SIGCONT), 0);
  // Back, registered, and idle in a heartbeat sent well after that (its
  // registration carries no counters; heartbeats come every 100 ms).
  json reported;
  auto read_node = [&] {
    for (const auto& n : cluster.nodes().value("nodes", json::array())) {
      if (n["name"] == "decode-0") reported = n;
    }
  };
  for (auto until = Clock::now() + 20s; Clock::now() < until;) {
    read_node();
    if (reported.value("up", false)) break;
    std::this_thread::sleep_for(20ms);
  }
  std::this_thread::sleep_for(600ms);
  for (auto until = Clock::now() + 10s; Clock::now() < until;) {
    read_node();
    if (reported.value("running", 1) == 0 && reported.value("waiting", 1) == 0) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GT(reported.value("total_blocks", 0), 0) << cluster.nodes().dump(2);
  EXPECT_EQ(reported.value("running", 1), 0) << reported.dump();
  EXPECT_EQ(reported["free_blocks"], reported["total_blocks"]) << reported.dump();
  const int64_t generated = reported["generation_tokens"].get<int64_t>();
  EXPECT_LT(generated - before, kMaxTokens / 2)
      << "the resumed node generated the failed request on: " << before << " tokens streamed, "
      << generated << " generated";
}

// A decode node whose loop hangs in a step (BATON_FAULT_STALL_FIRST_STEP
// holds it 6 s) while its heartbeat thread runs on: past
// router.node_stall_timeout_ms the heartbeats stop, so the router fails the
// request at once instead of at its request timeout, and places nothing
// there meanwhile. When the loop comes round, the node registers again and
// serves.
TEST(FaultTest, ANodeWhoseLoopHangsStopsHeartbeatingAndComesBack) {
  constexpr auto kStall = 6s;
  ASSERT_EQ(::setenv("BATON_FAULT_STALL_FIRST_STEP",
                     ("decode-0:" + std::to_string(kStall / 1ms)).c_str(), 1),
            0);
  ClusterShape shape;
  shape.extra_router_yaml = "  node_stall_timeout_ms: 1000\n";
  Cluster cluster(shape);
  ::unsetenv("BATON_FAULT_STALL_FIRST_STEP");  // the nodes took it
  json body = {{"prompt", std::string(40, 'q')}, {"max_tokens", 4}, {"temperature", 0}};
  const auto sent = Clock::now();
  auto failed = cluster.post("/v1/completions", body);
  const auto waited = Clock::now() - sent;
  ASSERT_TRUE(failed.is_ok()) << failed.status().to_string();
  EXPECT_GE(failed->status, 500) << failed->body;
  EXPECT_NE(failed->body.find("heartbeat"), std::string::npos) << failed->body;
  // Heartbeats stop 1 s into the stall and the router waits 0.6 s more.
  EXPECT_LT(waited, kStall - 2s) << "the request waited for the stalled step";
  EXPECT_FALSE(cluster.node_up("decode-0")) << cluster.nodes().dump(2);

  for (auto until = Clock::now() + kStall + 20s; Clock::now() < until;) {
    if (cluster.node_up("decode-0")) break;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(cluster.node_up("decode-0")) << cluster.nodes().dump(2);
  body["prompt"] = std::string(41, 'q');
  auto served = cluster.post("/v1/completions", body);
  ASSERT_TRUE(served.is_ok()) << served.status().to_string();
  EXPECT_EQ(served->status, 200) << served->body;
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// A cluster whose one decode node the test plays (the prefill node is
// configured but never started: prompts are prefilled on the decode node).
ClusterShape played_decode_node_shape(int heartbeat_timeout_ms) {
  ClusterShape shape;
  shape.prefill_nodes = 1;
  shape.min_remote_prefill_tokens = 1000;
  shape.decode_nodes = 1;
  shape.separate_roles = true;
  shape.start_nodes = false;
  shape.wait_until_up = false;
  shape.heartbeat_timeout_ms = heartbeat_timeout_ms;
  return shape;
}

// Registers the test's decode node (this process, its pool `descriptor`)
// and waits for the welcome; false if none came. The registration is sent
// once: ZeroMQ delivers it when the router is up.
bool welcome_played_decode_node(control::ControlSocket& node, std::vector<uint8_t> descriptor) {
  const control::Register hello{
      "decode-0", Role::kDecode, std::move(descriptor), 16, 1024, ::getpid(), "f32", 256, "cpu",
      ""};
  if (!node.send("", hello).is_ok()) return false;
  for (auto until = Clock::now() + 30s; Clock::now() < until;) {
    for (const auto& received : node.poll(200ms)) {
      if (auto* ack = std::get_if<control::RegisterAck>(&received.message); ack && ack->accepted)
        return true;
    }
  }
  return false;
}

// The test's decode node, connected and welcomed by the router.
Result<std::unique_ptr<control::ControlSocket>> register_played_decode_node(Cluster& cluster) {
  auto node = control::ControlSocket::connect(
      "tcp://127.0.0.1:" + std::to_string(cluster.control_port()), "decode-0");
  if (!node.is_ok()) return node.status();
  if (!welcome_played_decode_node(**node, {1, 2, 3})) {
    return deadline_exceeded("the router never welcomed the test's node");
  }
  return node;
}

// Heartbeats as the played decode node until the router sends it a
// request; that request's id, or 0 if none came.
uint64_t wait_for_generate(control::ControlSocket& node) {
  for (auto until = Clock::now() + 20s; Clock::now() < until;) {
    (void)node.send("", control::Heartbeat{"decode-0", {}});
    for (const auto& received : node.poll(50ms))
      if (auto* generate = std::get_if<control::Generate>(&received.message))
        return generate->request_id;
  }
  return 0;
}

// A node registers again while the router holds it up when its retry left
// before the first welcome reached it: the same process (pid and pool
// descriptor) keeps its requests. A new process under the same name and
// pid (a container's) has a new descriptor: it restarted, and what the
// old one held fails.
TEST(FaultTest, ARegisterRepeatedByTheSameProcessIsNoRestart) {
  ClusterShape shape = played_decode_node_shape(5000);
  shape.extra_router_yaml = "  request_timeout_ms: 60000\n";
  Cluster cluster(shape);
  auto node = register_played_decode_node(cluster);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  Result<tools::HttpResponse> response = unavailable("not answered");
  std::atomic<bool> answered{false};
  std::thread client([&] {
    response = cluster.post("/v1/completions", {{"prompt", "hello there"}, {"max_tokens", 4}});
    answered = true;
  });
  const uint64_t held = wait_for_generate(**node);
  if (held == 0) client.join();
  ASSERT_NE(held, 0u) << "the router never sent the request";
  const double downs_before = cluster.metric("baton:node_down_total");
  ASSERT_GE(downs_before, 0) << "no such metric";
  // Registers again (as its first copy), then as a restarted process.
  ASSERT_TRUE(welcome_played_decode_node(**node, {1, 2, 3}));
  EXPECT_EQ(cluster.metric("baton:node_down_total"), downs_before)
      << "the same process registering again was taken for a restart";
  EXPECT_FALSE(answered.load()) << "the request the node holds ended";
  ASSERT_TRUE(welcome_played_decode_node(**node, {4, 5, 6}));
  EXPECT_EQ(cluster.metric("baton:node_down_total"), downs_before + 1);
  client.join();
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->status, 503) << response->body;  // failed with the restart
}

// A node that cannot read the router's message for a request answers why
// (its control socket does, as TheSenderOfARefusedFrameIsToldWhy shows);
// the router then fails the request at once, naming the node and the
// reason, and aborts it on the node, instead of letting it wait out
// request_timeout_ms. The test plays the decode node and refuses.
TEST(FaultTest, ARequestItsNodeRefusesFailsAtOnce) {
  ClusterShape shape = played_decode_node_shape(5000);
  shape.extra_router_yaml = "  request_timeout_ms: 60000\n";
  Cluster cluster(shape);
  auto node = register_played_decode_node(cluster);
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();

  std::atomic<bool> answered{false};
  Result<tools::HttpResponse> response = unavailable("not sent");
  double seconds = -1;
  std::thread client([&] {
    const auto start = Clock::now();
    response = cluster.post("/v1/completions", {{"prompt", "hello there"}, {"max_tokens", 4}});
    seconds = std::chrono::duration<double>(Clock::now() - start).count();
    answered = true;
  });
  const std::string reason = "generate.sampling.stop_token_ids: more than 1024 entries";
  uint64_t refused = 0;
  bool aborted = false;
  for (auto until = Clock::now() + 20s; !(answered && aborted) && Clock::now() < until;) {
    (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
    for (const auto& received : (*node)->poll(50ms)) {
      if (auto* generate = std::get_if<control::Generate>(&received.message)) {
        refused = generate->request_id;
        (void)(*node)->send("", control::Rejected{"generate", refused, reason});
      } else if (auto* abort = std::get_if<control::Abort>(&received.message)) {
        aborted |= refused != 0 && abort->request_id == refused;
      }
    }
  }
  client.join();
  ASSERT_NE(refused, 0u) << "the router never sent the request";
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->status, 500) << response->body;
  EXPECT_NE(response->body.find("decode-0"), std::string::npos) << response->body;
  EXPECT_NE(response->body.find("stop_token_ids"), std::string::npos) << response->body;
  EXPECT_LT(seconds, 5.0) << "the request waited for its timeout";
  EXPECT_TRUE(aborted) << "the router did not abort the request on the node";
}

// The reply to `body` where the test, playing the cluster's decode node,
// answers the request's Generate with the one event `answer` makes of it.
Result<tools::HttpResponse> reply_with(
    const json& body, const std::function<control::TokenEvent(const control::Generate&)>& answer) {
  Cluster cluster(played_decode_node_shape(5000));
  auto node = register_played_decode_node(cluster);
  if (!node.is_ok()) return node.status();
  std::atomic<bool> answered{false};
  Result<tools::HttpResponse> response = unavailable("not sent");
  std::thread client([&] {
    response = cluster.post("/v1/completions", body);
    answered = true;
  });
  bool sent = false;
  for (auto until = Clock::now() + 20s; !answered && Clock::now() < until;) {
    (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
    for (const auto& received : (*node)->poll(50ms)) {
      if (auto* generate = std::get_if<control::Generate>(&received.message)) {
        (void)(*node)->send("", control::Events{{answer(*generate)}});
        sent = true;
      }
    }
  }
  client.join();
  if (!sent) return deadline_exceeded("the router never sent the request");
  return response;
}

// A node that sends more tokens than a request asked for is broken (or
// hostile): the router fails the request at once instead of keeping what
// it sends (memory it could grow without end). The test plays the node.
TEST(FaultTest, ANodeSendingMoreTokensThanAskedFailsTheRequest) {
  auto response = reply_with({{"prompt", "hello there"}, {"max_tokens", 4}},
                             [](const control::Generate& generate) {
                               control::TokenEvent flood;
                               flood.request_id = generate.request_id;
                               flood.tokens.assign(1000, 7);
                               flood.finish_reason = FinishReason::kLength;
                               return flood;
                             });
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->status, 500) << response->body;
  EXPECT_NE(response->body.find("sent more tokens than the 4 asked for"), std::string::npos)
      << response->body;
}

// Nor does the router keep log-probabilities a request did not ask for
// (up to 1024 alternatives a token pass the decoder), or more alternatives
// than it asked for.
TEST(FaultTest, ANodeSendingLogprobsNotAskedForFailsTheRequest) {
  for (const int asked : {0, 2}) {
    SCOPED_TRACE("logprobs " + std::to_string(asked));
    json body = {{"prompt", "hello there"}, {"max_tokens", 4}};
    if (asked > 0) body["logprobs"] = asked;
    auto response = reply_with(body, [](const control::Generate& generate) {
      control::TokenEvent event;
      event.request_id = generate.request_id;
      event.tokens = {7};
      control::TokenLogprobs& scored = event.logprobs.emplace_back();
      scored.logprob = -1;
      for (int32_t k = 0; k < 1024; ++k) {
        scored.top_ids.push_back(k);
        scored.top_logprobs.push_back(-1 - float(k));
      }
      return event;
    });
    ASSERT_TRUE(response.is_ok()) << response.status().to_string();
    EXPECT_EQ(response->status, 500) << response->body;
    EXPECT_NE(response->body.find("decode-0 sent log-probabilities"), std::string::npos)
        << response->body;
  }
}

// A node that only stopped is declared dead holding a request that makes
// no events (as a decode node's reservation awaiting KV does); the router
// fails the request then but cannot tell the node. When the same process
// comes back and registers again, the router aborts the request on it, so
// nothing waits out kv_wait_timeout. The test plays the decode node.
TEST(FaultTest, ANodeBackFromTheDeadIsToldWhatFailedMeanwhile) {
  Cluster cluster(played_decode_node_shape(600));
  auto node = control::ControlSocket::connect(
      "tcp://127.0.0.1:" + std::to_string(cluster.control_port()), "decode-0");
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  const control::Register hello{"decode-0", Role::kDecode, {1, 2, 3}, 16,    1024,
                                ::getpid(), "f32",         256,       "cpu", ""};
  std::set<uint64_t> aborts;  // every Abort the node was sent
  uint64_t registration = 0;  // the last welcome's number
  // Registers and waits for the welcome, heartbeating; true once welcomed.
  auto register_node = [&] {
    (void)(*node)->send("", hello);
    bool welcomed = false;
    for (auto until = Clock::now() + 30s; !welcomed && Clock::now() < until;) {
      (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
      for (const auto& received : (*node)->poll(100ms)) {
        if (auto* ack = std::get_if<control::RegisterAck>(&received.message);
            ack && ack->accepted) {
          welcomed = true;
          registration = ack->registration;
        }
        if (auto* abort = std::get_if<control::Abort>(&received.message))
          aborts.insert(abort->request_id);
      }
    }
    return welcomed;
  };
  ASSERT_TRUE(register_node()) << "the router never welcomed the test's node";

  Result<tools::HttpResponse> response = unavailable("not sent");
  std::thread client([&] {
    response = cluster.post("/v1/completions", {{"prompt", "hello there"}, {"max_tokens", 4}});
  });
  const uint64_t held = wait_for_generate(**node);
  // Silent (stopped) past the heartbeat timeout: declared dead, the request failed.
  client.join();
  ASSERT_NE(held, 0u) << "the router never sent the request; the client got "
                      << (response.is_ok() ? std::to_string(response->status) + " " + response->body
                                           : response.status().to_string());
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  EXPECT_EQ(response->status, 503) << response->body;
  for (const auto& received : (*node)->poll(0ms))
    if (auto* abort = std::get_if<control::Abort>(&received.message))
      aborts.insert(abort->request_id);
  ASSERT_FALSE(aborts.contains(held)) << "the premise: a node declared dead is not told";

  // Back: its heartbeat is answered "register again", naming the
  // registration it was sent under (so that the node can tell the answers
  // to heartbeats that crossed its registering again), and it registers.
  const uint64_t before = registration;
  EXPECT_NE(before, 0u);
  (void)(*node)->send("", control::Heartbeat{"decode-0", {}, {}, before});
  std::optional<control::RegisterAck> again;
  for (auto until = Clock::now() + 5s; !again && Clock::now() < until;) {
    for (const auto& received : (*node)->poll(50ms)) {
      if (auto* ack = std::get_if<control::RegisterAck>(&received.message)) again = *ack;
    }
  }
  ASSERT_TRUE(again.has_value()) << "no answer to a dead node's heartbeat";
  EXPECT_FALSE(again->accepted);
  EXPECT_EQ(again->registration, before);
  ASSERT_TRUE(register_node());
  EXPECT_NE(registration, before) << "each welcome numbers its registration anew";
  for (auto until = Clock::now() + 5s; !aborts.contains(held) && Clock::now() < until;) {
    (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
    for (const auto& received : (*node)->poll(50ms))
      if (auto* abort = std::get_if<control::Abort>(&received.message))
        aborts.insert(abort->request_id);
  }
  EXPECT_TRUE(aborts.contains(held))
      << "the router did not abort the failed request on the node that came back";
}

// A request for decode-0 whose prompt prefill-0 is to compute (no such node
// sends KV unless the test starts one): greedy, max_tokens tokens whatever
// EOS.
control::Generate remote_request(uint64_t id, std::vector<int32_t> prompt, int32_t max_tokens) {
  control::Generate g;
  g.request_id = id;
  g.prompt = std::move(prompt);
  g.sampling.max_tokens = max_tokens;
  g.sampling.temperature = 0;
  g.sampling.ignore_eos = true;
  g.prefill_node = "prefill-0";
  return g;
}

// A cluster whose router the test plays: `baton router|decode` processes,
// none started (extra_router_yaml: the router section's additions, which
// the nodes read too).
ClusterShape played_router_shape(const std::string& extra_router_yaml) {
  ClusterShape shape;
  shape.separate_roles = true;
  shape.start_nodes = false;
  shape.wait_until_up = false;
  shape.extra_router_yaml = extra_router_yaml;
  return shape;
}

// Stops the cluster's router, binds its control port in its place, starts
// the nodes {role, name} and welcomes them; `registered` (if given) gets
// each node's Register.
Result<std::unique_ptr<control::ControlSocket>> play_router(
    Cluster& cluster, const std::vector<std::pair<std::string, std::string>>& nodes,
    std::map<std::string, control::Register>* registered = nullptr) {
  cluster.kill_process("router");
  auto router =
      control::ControlSocket::bind("tcp://127.0.0.1:" + std::to_string(cluster.control_port()));
  if (!router.is_ok()) return router.status();
  for (const auto& [role, name] : nodes) cluster.start_node(role, name);
  std::set<std::string> welcomed;
  for (auto until = Clock::now() + 60s; welcomed.size() < nodes.size() && Clock::now() < until;) {
    for (const auto& received : (*router)->poll(200ms)) {
      if (const auto* hello = std::get_if<control::Register>(&received.message)) {
        BATON_RETURN_IF_ERROR((*router)->send(hello->node, control::RegisterAck{true, ""}));
        welcomed.insert(hello->node);
        if (registered != nullptr) (*registered)[hello->node] = *hello;
      }
    }
  }
  if (welcomed.size() < nodes.size()) return unavailable("a node never registered");
  return router;
}

Result<std::unique_ptr<control::ControlSocket>> play_router_with_decode_node(Cluster& cluster) {
  return play_router(cluster, {{"decode", "decode-0"}});
}

// A request the decode node cannot reserve KV for (its sampling refused)
// ends with an error, and the requests queued behind it are served: they
// get their reservations, nothing is dropped, an abort of the ended one is
// ignored and the node stays up. The test plays the router, so that it can
// send what a router's own checks would stop.
TEST(FaultTest, ARequestThatCannotBeReservedLeavesTheQueueWhole) {
  Cluster cluster(played_router_shape(""));
  auto router = play_router_with_decode_node(cluster);
  ASSERT_TRUE(router.is_ok()) << router.status().to_string();

  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 1);
  auto remote = [&](uint64_t id, float top_p) {
    control::Generate g;
    g.request_id = id;
    g.prompt = prompt;
    g.sampling.top_p = top_p;
    g.sampling.max_tokens = 4;
    g.prefill_node = "prefill-0";
    return g;
  };
  // In one batch: the node takes them in order, and 1 fails its reservation
  // first in the queue, with 2 and 3 behind it.
  ASSERT_TRUE((*router)->send("decode-0", remote(1, 0.0f)).is_ok());
  ASSERT_TRUE((*router)->send("decode-0", remote(2, 1.0f)).is_ok());
  ASSERT_TRUE((*router)->send("decode-0", remote(3, 0.5f)).is_ok());
  std::set<uint64_t> ready, failed;
  for (auto until = Clock::now() + 10s;
       (ready.size() < 2 || failed.empty()) && Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms)) {
      if (auto* r = std::get_if<control::PrefillReady>(&received.message))
        ready.insert(r->request_id);
      if (auto* e = std::get_if<control::Events>(&received.message))
        for (const auto& event : e->events)
          if (event.finish_reason == FinishReason::kError) failed.insert(event.request_id);
    }
  EXPECT_EQ(failed, std::set<uint64_t>{1}) << "the refused request ends with an error";
  EXPECT_EQ(ready, (std::set<uint64_t>{2, 3})) << "the requests behind it get their blocks";

  // The ended request's abort finds nothing; the node then serves a request
  // it prefills itself to the end.
  ASSERT_TRUE((*router)->send("decode-0", control::Abort{1, "client left"}).is_ok());
  control::Generate local;
  local.request_id = 4;
  local.prompt = {5, 6, 7};
  local.sampling.max_tokens = 3;
  local.sampling.ignore_eos = true;
  ASSERT_TRUE((*router)->send("decode-0", local).is_ok());
  size_t tokens = 0;
  bool finished = false;
  for (auto until = Clock::now() + 10s; !finished && Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms))
      if (auto* e = std::get_if<control::Events>(&received.message))
        for (const auto& event : e->events)
          if (event.request_id == 4) {
            tokens += event.tokens.size();
            finished |= event.finish_reason != FinishReason::kNone;
          }
  EXPECT_TRUE(finished) << "the node stopped answering";
  EXPECT_EQ(tokens, 3u);
}

// A decode node whose KV never comes (its prefill node never sends)
// fails the request when its receive times out, before any router abort,
// and forgets it: its load reports no request held and every block free
// (once, the request stayed held for good). The test plays the router.
TEST(FaultTest, AReceiveThatTimesOutEndsItsRequestOnTheDecodeNode) {
  // The nodes wait request_timeout + heartbeat_timeout for KV.
  Cluster cluster(played_router_shape("  request_timeout_ms: 1000\n"));
  auto router = play_router_with_decode_node(cluster);
  ASSERT_TRUE(router.is_ok()) << router.status().to_string();

  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 1);
  const control::Generate remote = remote_request(7, prompt, 4);  // no KV will come
  ASSERT_TRUE((*router)->send("decode-0", remote).is_ok());
  bool ready = false, failed = false;
  std::optional<control::NodeLoad> idle;  // the first load after the failure that shows no work
  for (auto until = Clock::now() + 20s; !idle && Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms)) {
      if (auto* r = std::get_if<control::PrefillReady>(&received.message))
        ready |= r->request_id == 7;
      if (auto* e = std::get_if<control::Events>(&received.message))
        for (const auto& event : e->events)
          failed |= event.request_id == 7 && event.finish_reason == FinishReason::kError;
      if (auto* h = std::get_if<control::Heartbeat>(&received.message);
          h && failed && h->load.free_blocks == h->load.total_blocks && h->load.awaiting_kv == 0)
        idle = h->load;
    }
  ASSERT_TRUE(ready) << "the node never reserved the request's blocks";
  ASSERT_TRUE(failed) << "the node never failed the request whose KV did not come";
  ASSERT_TRUE(idle.has_value()) << "the node's blocks never came back";
  // Heartbeats are published by the node's loop: a few more show whether
  // the request is still held.
  int64_t held = idle->requests;
  for (auto until = Clock::now() + 1s; held != 0 && Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms))
      if (auto* h = std::get_if<control::Heartbeat>(&received.message)) held = h->load.requests;
  EXPECT_EQ(held, 0) << "the decode node still holds the failed request";
}

// A decode node whose KV landed but whose first token never comes (the
// prefill node's PrefillDone lost on the way, its sender gone) fails the
// request kv_wait_timeout after the KV landed and frees its blocks, rather
// than holding them for good. The test plays the router, between a real
// prefill node and a real decode node, and keeps the PrefillDone.
TEST(FaultTest, LandedKvWithoutAFirstTokenExpiresOnTheDecodeNode) {
  // The nodes wait request_timeout + heartbeat_timeout for the prefill.
  Cluster cluster(played_router_shape("  request_timeout_ms: 1000\n"));
  std::map<std::string, control::Register> registered;
  auto router =
      play_router(cluster, {{"decode", "decode-0"}, {"prefill", "prefill-0"}}, &registered);
  ASSERT_TRUE(router.is_ok()) << router.status().to_string();
  ASSERT_TRUE(
      (*router)
          ->send("prefill-0", control::PeerInfo{"decode-0", registered.at("decode-0").descriptor})
          .is_ok());
  std::vector<int32_t> prompt(40);
  std::iota(prompt.begin(), prompt.end(), 1);
  const control::Generate remote = remote_request(11, prompt, 4);
  ASSERT_TRUE((*router)->send("decode-0", remote).is_ok());
  bool prefilled = false, failed = false;
  std::optional<control::NodeLoad> idle;  // the decode node's load once it let go
  const auto start = Clock::now();
  for (auto until = start + 20s; !idle && Clock::now() < until;)
    for (const auto& received : (*router)->poll(50ms)) {
      if (auto* ready = std::get_if<control::PrefillReady>(&received.message)) {
        control::Prefill prefill{ready->request_id,    remote.prompt,         remote.sampling,
                                 "decode-0",           ready->transfer_id,    ready->dst_blocks,
                                 ready->cached_blocks, ready->skipped_blocks, ""};
        ASSERT_TRUE((*router)->send("prefill-0", prefill).is_ok());
      }
      if (auto* done = std::get_if<control::PrefillDone>(&received.message))
        prefilled |= done->request_id == 11 && done->error.empty();  // kept, not forwarded
      if (auto* e = std::get_if<control::Events>(&received.message))
        for (const auto& event : e->events)
          failed |= event.request_id == 11 && event.finish_reason == FinishReason::kError &&
                    event.error.find("no first token") != std::string::npos;
      if (auto* h = std::get_if<control::Heartbeat>(&received.message);
          h && h->node == "decode-0" && failed && h->load.free_blocks == h->load.total_blocks &&
          h->load.requests == 0)
        idle = h->load;
    }
  ASSERT_TRUE(prefilled) << "the prefill node never sent the KV";
  EXPECT_TRUE(failed) << "the decode node never failed the request whose first token never came";
  EXPECT_TRUE(idle.has_value()) << "the decode node kept the request or its blocks";
}

// One engine's greedy answer to `prompt` (`baton generate --prompt-ids`,
// ignoring EOS): its output ids, or null where it printed none.
json one_engine_greedy_ids(const Cluster& cluster, const std::vector<int32_t>& prompt,
                           int max_tokens) {
  std::string ids;
  for (int32_t id : prompt) {
    if (!ids.empty()) ids += ',';  // appended piece by piece: GCC 12 warns on `"," + ...`
    ids += std::to_string(id);
  }
  const BatonRun one = run_baton({"generate", "--model", cluster.model_dir().string(),
                                  "--prompt-ids", ids, "--max-tokens", std::to_string(max_tokens),
                                  "--temperature", "0", "--ignore-eos", "--json"});
  EXPECT_EQ(one.exit_code, 0) << one.output;
  const size_t at = one.output.find("{\"");
  const json line =
      at == std::string::npos
          ? json()
          : json::parse(one.output.substr(at, one.output.find('\n', at) - at), nullptr, false);
  EXPECT_TRUE(line.is_object()) << one.output;
  return line.is_object() ? line.value("output_ids", json()) : json();
}

// A failed prefill reported to the decode node (a PrefillDone carrying an
// error: the router forwards the prefill node's, or makes one for a dead
// prefill node) has it compute the prompt itself: it gives back the blocks
// it reserved for the KV (cancelling a receive no one will send) and
// answers with one engine's greedy tokens, timed as computed there. The
// test plays the router; no prefill node exists.
TEST(FaultTest, AFailedPrefillIsComputedOnTheDecodeNode) {
  Cluster cluster(played_router_shape(""));
  auto router = play_router_with_decode_node(cluster);
  ASSERT_TRUE(router.is_ok()) << router.status().to_string();
  std::vector<int32_t> prompt(40);
  std::mt19937 rng(std::random_device{}());
  for (int32_t& id : prompt) id = 3 + int32_t(rng() % 500);
  const control::Generate remote = remote_request(21, prompt, 5);
  ASSERT_TRUE((*router)->send("decode-0", remote).is_ok());
  bool ready = false, told = false, computed_here = false, finished = false;
  std::vector<int32_t> tokens;
  std::optional<control::NodeLoad> idle;  // the decode node's load once done
  for (auto until = Clock::now() + 20s; !idle && Clock::now() < until;)
    for (const auto& received : (*router)->poll(50ms)) {
      if (auto* r = std::get_if<control::PrefillReady>(&received.message))
        ready |= r->request_id == 21;
      if (ready && !told) {
        control::PrefillDone failed;
        failed.request_id = 21;
        failed.error = "node prefill-0 failed during the request: killed";
        ASSERT_TRUE((*router)->send("decode-0", failed).is_ok());
        told = true;
      }
      if (auto* e = std::get_if<control::Events>(&received.message))
        for (const auto& event : e->events) {
          if (event.request_id != 21) continue;
          ASSERT_NE(event.finish_reason, FinishReason::kError) << event.error;
          if (tokens.empty() && !event.tokens.empty()) computed_here = event.prefill_seconds >= 0;
          tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
          finished |= event.finish_reason != FinishReason::kNone;
        }
      if (auto* h = std::get_if<control::Heartbeat>(&received.message);
          h && finished && h->load.free_blocks == h->load.total_blocks && h->load.requests == 0)
        idle = h->load;
    }
  ASSERT_TRUE(ready) << "the node never reserved the request's blocks";
  ASSERT_TRUE(finished) << "the request never finished";
  EXPECT_TRUE(computed_here) << "the first token's timings are not the decode node's";
  EXPECT_TRUE(idle.has_value()) << "the decode node kept the request or its blocks";
  EXPECT_EQ(json(tokens), one_engine_greedy_ids(cluster, remote.prompt, 5));
}

// A failed prefill reported for a request still queued on the decode node
// (its blocks not yet reserved: another request's reservation holds the
// pool) is computed there once the blocks free up, never reserved for KV.
TEST(FaultTest, AFailedPrefillOfAQueuedRequestIsComputedOnTheDecodeNode) {
  ClusterShape shape = played_router_shape("");
  shape.kv_cache_bytes = "256KiB";  // 1024 tokens of the tiny model: one long prompt
  Cluster cluster(shape);
  auto router = play_router_with_decode_node(cluster);
  ASSERT_TRUE(router.is_ok()) << router.status().to_string();
  // Two 700-token prompts: the first's reservation leaves no room for the second.
  auto remote = [](uint64_t id) {
    std::vector<int32_t> prompt(700);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(3 + (i * 7 + id) % 500);
    return remote_request(id, std::move(prompt), 4);
  };
  const control::Generate first = remote(31), second = remote(32);
  ASSERT_TRUE((*router)->send("decode-0", first).is_ok());
  std::set<uint64_t> ready;
  for (auto until = Clock::now() + 10s; !ready.contains(31) && Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms))
      if (auto* r = std::get_if<control::PrefillReady>(&received.message))
        ready.insert(r->request_id);
  ASSERT_TRUE(ready.contains(31)) << "the first request was never reserved";
  ASSERT_TRUE((*router)->send("decode-0", second).is_ok());
  for (auto until = Clock::now() + 500ms; Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms))
      if (auto* r = std::get_if<control::PrefillReady>(&received.message))
        ready.insert(r->request_id);
  ASSERT_FALSE(ready.contains(32)) << "the pool held both: the second was never queued";
  control::PrefillDone failed;
  failed.request_id = 32;
  failed.error = "node prefill-0 failed during the request: killed";
  ASSERT_TRUE((*router)->send("decode-0", failed).is_ok());
  ASSERT_TRUE((*router)->send("decode-0", control::Abort{31, "client left"}).is_ok());
  std::vector<int32_t> tokens;
  bool finished = false;
  for (auto until = Clock::now() + 20s; !finished && Clock::now() < until;)
    for (const auto& received : (*router)->poll(100ms)) {
      if (auto* r = std::get_if<control::PrefillReady>(&received.message))
        ready.insert(r->request_id);
      if (auto* e = std::get_if<control::Events>(&received.message))
        for (const auto& event : e->events) {
          if (event.request_id != 32) continue;
          ASSERT_NE(event.finish_reason, FinishReason::kError) << event.error;
          tokens.insert(tokens.end(), event.tokens.begin(), event.tokens.end());
          finished |= event.finish_reason != FinishReason::kNone;
        }
    }
  ASSERT_TRUE(finished) << "the queued request was never computed";
  EXPECT_FALSE(ready.contains(32)) << "blocks were reserved for KV that will never come";
  EXPECT_EQ(json(tokens), one_engine_greedy_ids(cluster, second.prompt, 4));
}

// The prefill node killed while it computes eight long prompts: nothing is
// lost. Each request whose prefill died with it is computed by its decode
// node instead (its answer names no prefill node), promptly, and greedy
// answers are one engine's; the decode node's reservations for the dead
// node come back. `staged`: the nodes stage their pools through host
// slots, as GPU nodes do, as few as one longest prompt needs: the decode
// node's slots come back too.
void kill_the_prefill_node_mid_prefill(bool staged) {
  ClusterShape shape;
  shape.prefill_nodes = 1;
  shape.decode_nodes = 1;
  shape.max_num_batched_tokens = 32;  // long prompts take many chunked steps
  shape.max_model_len = 2048;
  if (staged) {
    shape.staging_blocks = shape.max_model_len / 16;
    ASSERT_EQ(::setenv("BATON_TEST_STAGED_POOL", "1", 1), 0);
  }
  Cluster cluster(shape);
  ::unsetenv("BATON_TEST_STAGED_POOL");  // `baton up` and its nodes took it
  pid_t victim = cluster.node_pid("prefill-0");
  ASSERT_GT(victim, 0);

  constexpr int kRequests = 8;
  std::vector<std::string> prompts;
  std::vector<json> answers(kRequests);
  std::vector<std::thread> clients;
  KillTime killed_at;
  std::vector<double> seconds_after_kill(kRequests, -1);
  for (int i = 0; i < kRequests; ++i) {
    // Each prompt differs from its first block on: no prefix cache
    // shortens its prefill.
    prompts.push_back(char('a' + i) + std::string(1500 + i, 'p'));
    clients.emplace_back([&, i] {
      json body =
          with_tie_evidence({{"prompt", prompts[i]}, {"max_tokens", 4}, {"temperature", 0}});
      auto response = cluster.post("/v1/completions", body);
      seconds_after_kill[i] = killed_at.seconds_since();
      answers[i] =
          response.is_ok() && response->status == 200
              ? json::parse(response->body, nullptr, false)
              : json{{"failed", response.is_ok() ? response->body : response.status().to_string()}};
    });
  }
  std::this_thread::sleep_for(100ms);
  killed_at.set_now();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  for (auto& client : clients) client.join();

  int computed_on_decode = 0;
  for (int i = 0; i < kRequests; ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i));
    ASSERT_TRUE(answers[i].contains("choices")) << answers[i].dump();
    const json& choice = answers[i]["choices"][0];
    if (choice["served_by"]["prefill"].is_null()) {
      ++computed_on_decode;
      // The decode node computes the prompts one after another (14 s for
      // the last under ASan); a request left waiting for a timeout would
      // wait ten minutes (router.request_timeout_ms, the decode node's KV
      // wait).
      EXPECT_LT(seconds_after_kill[i], 60.0);
    }
    const json expected =
        baton_generate(prompts[i], {"--max-tokens", "4", "--temperature", "0", "--logprobs", "2"});
    expect_greedy_equal_or_tied(choice, expected, "prompt " + std::to_string(i));
  }
  // Requests dispatched once the node was known dead go to the decode node
  // at once; those whose prefill died with it fell back.
  const double fell_back = cluster.metric("baton:prefill_fallbacks_total");
  EXPECT_GT(fell_back, 0) << "the killed prefill node had requests in flight";
  EXPECT_LE(fell_back, computed_on_decode);
  // The decode node's reservations for the dead prefill are freed.
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  json nodes = cluster.nodes();
  for (const auto& node : nodes["nodes"]) {
    if (node["name"] == "decode-0") {
      EXPECT_TRUE(node["up"].get<bool>());
      EXPECT_EQ(node["free_blocks"], node["total_blocks"]);
      EXPECT_EQ(node["staging_slots_free"], staged ? 128 : 0) << node.dump();
    }
  }
  auto health = cluster.get("/health");
  ASSERT_TRUE(health.is_ok());
  EXPECT_EQ(health->status, 503) << "no prefill node is up";
}

// KV that lands corrupted (the decode node flips a bit of layer 0 of each
// transfer it receives: BATON_FAULT_CORRUPT_LAYER) fails its checksum and is
// never read: the decode node computes each prompt itself instead, so every
// request is answered as one engine answers it, naming no prefill node; the
// fallbacks are counted and every block comes back.
TEST(FaultTest, ACorruptedKvTransferIsComputedOnTheDecodeNode) {
  ClusterShape shape;
  shape.prefill_nodes = 1;
  shape.decode_nodes = 1;
  ASSERT_EQ(::setenv("BATON_FAULT_CORRUPT_LAYER", "decode-0:0", 1), 0);
  Cluster cluster(shape);
  ::unsetenv("BATON_FAULT_CORRUPT_LAYER");  // `baton up` and its nodes took it
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr int kPrompts = 3;
  for (int i = 0; i < kPrompts; ++i) {
    std::string prompt(40 + rng() % 40, ' ');  // long enough for a remote prefill
    for (char& c : prompt) c = char('a' + rng() % 26);
    auto response = cluster.post(
        "/v1/completions",
        with_tie_evidence({{"prompt", prompt}, {"max_tokens", 6}, {"temperature", 0}}));
    ASSERT_TRUE(response.is_ok());
    ASSERT_EQ(response->status, 200) << response->body;
    const json choice = json::parse(response->body)["choices"][0];
    EXPECT_TRUE(choice["served_by"]["prefill"].is_null()) << choice.dump();
    const json expected =
        baton_generate(prompt, {"--max-tokens", "6", "--temperature", "0", "--logprobs", "2"});
    expect_greedy_equal_or_tied(choice, expected, "prompt '" + prompt + "'");
  }
  EXPECT_EQ(cluster.metric("baton:prefill_fallbacks_total"), kPrompts);
  EXPECT_EQ(cluster.metric("baton:prompt_placements_total", "placement=\"prefill_node\""), kPrompts)
      << "the prompts went to the prefill node first";
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  const json nodes = cluster.nodes();  // the loop reads it: not a temporary
  for (const auto& node : nodes["nodes"])
    EXPECT_EQ(node["free_blocks"], node["total_blocks"]) << node.dump();
}

TEST(FaultTest, PrefillNodeKilledMidPrefillFreesTheDecodeNodesReservations) {
  kill_the_prefill_node_mid_prefill(/*staged=*/false);
}

TEST(FaultTest, PrefillNodeKilledMidPrefillFreesTheDecodeNodesStagingSlots) {
  kill_the_prefill_node_mid_prefill(/*staged=*/true);
}

// Roles run as separate processes (as on several hosts): a router that dies
// and comes back finds its nodes registering again on their own.
TEST(FaultTest, RestartedRouterGetsItsNodesBack) {
  ClusterShape shape;
  shape.separate_roles = true;
  Cluster cluster(shape);
  auto first = cluster.post(
      "/v1/completions", {{"prompt", std::string(30, 'r')}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(first.is_ok());
  ASSERT_EQ(first->status, 200) << first->body;

  cluster.kill_process("router");
  cluster.start_router();
  bool back = false;
  for (auto until = Clock::now() + 20s; !back && Clock::now() < until;) {
    back = cluster.node_up("prefill-0") && cluster.node_up("decode-0");
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(back) << cluster.nodes().dump(2);
  auto again = cluster.post(
      "/v1/completions", {{"prompt", std::string(30, 'r')}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->status, 200) << again->body;
  EXPECT_EQ(json::parse(again->body)["choices"][0]["text"],
            json::parse(first->body)["choices"][0]["text"]);
  EXPECT_EQ(json::parse(again->body)["choices"][0]["served_by"]["prefill"], "prefill-0");
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// router.max_prefill_queue_tokens: while the prefill node holds a queue at
// the limit (it is held, SIGSTOP, with a prompt placed on it), the next long
// prompt is prefilled on its decode node and served at once, as the same
// prompt is over the prefill node once that is back.
TEST(FaultTest, APromptPastAFullPrefillQueueIsPrefilledOnItsDecodeNode) {
  ClusterShape shape;
  shape.separate_roles = true;
  shape.heartbeat_timeout_ms = 20000;  // the held prefill node is not declared dead
  // As min_remote_prefill_tokens: one prompt placed fills the queue.
  shape.extra_router_yaml = "  max_prefill_queue_tokens: 8\n";
  Cluster cluster(shape);
  const pid_t prefill = cluster.node_pid("prefill-0");
  ASSERT_GT(prefill, 0);
  const ResumeOnExit resume{prefill};
  const json held_request = {
      {"prompt", std::string(40, 'h')}, {"max_tokens", 4}, {"temperature", 0}};
  const json request = {{"prompt", std::string(40, 'q')}, {"max_tokens", 6}, {"temperature", 0}};
  ASSERT_EQ(::kill(prefill, SIGSTOP), 0);
  Result<tools::HttpResponse> held = unavailable("not answered");
  std::thread client([&] { held = cluster.post("/v1/completions", held_request); });
  int64_t queued = 0;
  for (auto until = Clock::now() + 10s; queued < 8 && Clock::now() < until;) {
    for (const json& node : cluster.nodes().value("nodes", json::array())) {
      if (node["name"] == "prefill-0") queued = node.value("queued_prompt_tokens", int64_t(0));
    }
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_GE(queued, 8) << cluster.nodes().dump(2);

  auto local = cluster.post("/v1/completions", request);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  ASSERT_EQ(local->status, 200) << local->body;
  const json local_choice = json::parse(local->body)["choices"][0];
  EXPECT_TRUE(local_choice["served_by"]["prefill"].is_null()) << local_choice.dump();
  EXPECT_EQ(cluster.metric("baton:prompt_placements_total", "placement=\"prefill_queues_full\""), 1)
      << "placed as no_prefill_node "
      << cluster.metric("baton:prompt_placements_total", "placement=\"no_prefill_node\"")
      << ", prefill_node "
      << cluster.metric("baton:prompt_placements_total", "placement=\"prefill_node\"") << "; "
      << cluster.nodes().dump();

  ASSERT_EQ(::kill(prefill, SIGCONT), 0);
  client.join();
  ASSERT_TRUE(held.is_ok()) << held.status().to_string();
  ASSERT_EQ(held->status, 200) << held->body;
  EXPECT_EQ(json::parse(held->body)["choices"][0]["served_by"]["prefill"], "prefill-0");
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  auto remote = cluster.post("/v1/completions", request);
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  ASSERT_EQ(remote->status, 200) << remote->body;
  const json remote_choice = json::parse(remote->body)["choices"][0];
  EXPECT_EQ(remote_choice["served_by"]["prefill"], "prefill-0");
  EXPECT_EQ(remote_choice["text"], local_choice["text"]);
  EXPECT_EQ(cluster.metric("baton:prompt_placements_total", "placement=\"prefill_node\""), 2);
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// A router that dies while a request's KV is on its way: the decode node
// holds a reservation awaiting the KV (the prefill node is held, SIGSTOP,
// with the Prefill queued for it), which makes no events for a new router to
// abort. Refused by the new router ("register again"), each node drops what
// it holds, and both pools drain long before the KV wait's own timeout.
TEST(FaultTest, NodesDropTheWorkOfARouterThatDied) {
  ClusterShape shape;
  shape.separate_roles = true;
  shape.heartbeat_timeout_ms = 20000;  // the held prefill node is not declared dead
  Cluster cluster(shape);
  const pid_t prefill = cluster.node_pid("prefill-0");
  ASSERT_GT(prefill, 0);
  const ResumeOnExit resume{prefill};
  ASSERT_EQ(::kill(prefill, SIGSTOP), 0);
  std::thread client([&] {
    (void)cluster.post("/v1/completions",
                       {{"prompt", std::string(40, 'd')}, {"max_tokens", 4}, {"temperature", 0}});
  });
  bool awaiting = false;
  for (auto until = Clock::now() + 10s; !awaiting && Clock::now() < until;) {
    for (const json& node : cluster.nodes().value("nodes", json::array()))
      awaiting = awaiting || node.value("awaiting_kv", 0) > 0;
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(awaiting) << cluster.nodes().dump(2);
  cluster.kill_process("router");
  client.join();  // its connection died with the router
  cluster.start_router();
  ASSERT_EQ(::kill(prefill, SIGCONT), 0);
  bool back = false;
  for (auto until = Clock::now() + 20s; !back && Clock::now() < until;) {
    back = cluster.node_up("prefill-0") && cluster.node_up("decode-0");
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(back) << cluster.nodes().dump(2);
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  auto again = cluster.post(
      "/v1/completions", {{"prompt", std::string(40, 'd')}, {"max_tokens", 4}, {"temperature", 0}});
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(again->status, 200) << again->body;
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// Posts `count` completions of prompts of `fill`, the first `length`
// characters long and each one longer, and returns each answer's
// served_by; an answer other than 200 fails the test (and gives null).
std::vector<json> post_completions(const Cluster& cluster, int count, size_t length, char fill) {
  std::vector<json> served_by;
  for (int i = 0; i < count; ++i) {
    auto response = cluster.post(
        "/v1/completions", {{"prompt", std::string(length + size_t(i), fill)}, {"max_tokens", 3}});
    if (!response.is_ok() || response->status != 200) {
      ADD_FAILURE() << (response.is_ok() ? response->body : response.status().to_string());
      served_by.push_back(json::object());
      continue;
    }
    served_by.push_back(json::parse(response->body)["choices"][0]["served_by"]);
  }
  return served_by;
}

// A prefill node that died moments ago still counts as up in the router
// until its heartbeats run out, but its connection is gone at once: the
// prefill the router cannot send it goes to another prefill node (the
// decode node takes the KV from whoever sends it) instead of failing.
TEST(FaultTest, PrefillTheDeadNodeCannotTakeGoesToAnotherPrefillNode) {
  ClusterShape shape;
  shape.prefill_nodes = 2;
  shape.decode_nodes = 1;
  shape.heartbeat_timeout_ms = 20000;  // the router notices the death by the connection only
  Cluster cluster(shape);
  // A transfer from each prefill node: their endpoints to the decode node
  // are wired up before one dies (UCX 1.13 can crash a node whose peer dies
  // during the wire-up).
  std::set<std::string> prefilled_by;
  for (const json& by : post_completions(cluster, 2, 30, 'w'))
    prefilled_by.insert(by.value("prefill", json()).is_string() ? by["prefill"].get<std::string>()
                                                                : by.dump());
  ASSERT_EQ(prefilled_by, (std::set<std::string>{"prefill-0", "prefill-1"}));

  const pid_t victim = cluster.node_pid("prefill-0");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  std::this_thread::sleep_for(300ms);  // ZeroMQ drops the connection
  ASSERT_TRUE(cluster.node_up("prefill-0")) << "the router was to think the node up still";

  // Round-robin would give prefill-0 one of the first two.
  for (const json& by : post_completions(cluster, 4, 40, 'g'))
    EXPECT_EQ(by.value("prefill", json()), "prefill-1") << by.dump();
  EXPECT_FALSE(cluster.node_up("prefill-0")) << "a failed send marks the node down";
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// Pids of the children of `pid`.
std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> children;
  for (pid_t child = 0; file >> child;) children.push_back(child);
  return children;
}

// `baton up` waits for its nodes before it says the cluster is up, but a
// client (or this harness) may see them all up in the router first and
// lose one: a node killed after it registered is a run-time failure, not a
// failed start-up, and must not stop the rest of the cluster. `baton up`
// is held (SIGSTOP) from the moment it has started every process until the
// router has marked the killed node down, so it looks only then.
TEST(FaultTest, NodeKilledAfterRegisteringDuringStartUpLeavesTheClusterRunning) {
  ClusterShape shape;
  shape.prefill_nodes = 1;
  shape.decode_nodes = 2;
  shape.wait_until_up = false;
  Cluster cluster(shape);
  const pid_t up = cluster.up_pid();
  ASSERT_GT(up, 0);
  // The router and three nodes started, none of them registered yet.
  bool spawned = false;
  for (auto until = Clock::now() + 30s; !spawned && Clock::now() < until;) {
    spawned = children_of(up).size() == 4;
    if (!spawned) std::this_thread::sleep_for(100us);
  }
  ASSERT_TRUE(spawned) << "baton up did not start 4 processes";
  ASSERT_EQ(::kill(up, SIGSTOP), 0);
  struct Resume {
    pid_t pid;
    ~Resume() { ::kill(pid, SIGCONT); }
  } resume{up};
  ASSERT_TRUE(cluster.nodes().empty() || cluster.nodes().value("nodes", json::array()).size() < 3)
      << "every node registered before baton up was held";

  bool all_up = false;
  for (auto until = Clock::now() + 30s; !all_up && Clock::now() < until;) {
    all_up =
        cluster.node_up("prefill-0") && cluster.node_up("decode-0") && cluster.node_up("decode-1");
    if (!all_up) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(all_up) << cluster.nodes().dump(2);
  // A transfer to each decode node: the prefill node's endpoints to them are
  // wired up before one dies (UCX 1.13 can crash a node whose peer dies
  // during the wire-up).
  post_completions(cluster, 2, 30, 'w');
  const pid_t victim = cluster.node_pid("decode-1");
  ASSERT_GT(victim, 0);
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  bool marked_down = false;
  for (auto until = Clock::now() + 10s; !marked_down && Clock::now() < until;) {
    marked_down = !cluster.node_up("decode-1");
    if (!marked_down) std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(marked_down) << cluster.nodes().dump(2);

  // `baton up` now finds decode-1 gone and the router saying so.
  ASSERT_EQ(::kill(up, SIGCONT), 0);
  std::this_thread::sleep_for(500ms);
  ASSERT_TRUE(cluster.up_running()) << "baton up stopped the cluster";
  for (const json& by : post_completions(cluster, 3, 20, 'k'))
    EXPECT_EQ(by.value("decode", json()), "decode-0") << by.dump();
  EXPECT_TRUE(cluster.up_running());
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// The child of `parent` whose command line has `word` as one of its
// arguments; 0 if none has.
pid_t child_running(pid_t parent, const std::string& word) {
  for (pid_t child : children_of(parent)) {
    std::ifstream file("/proc/" + std::to_string(child) + "/cmdline");
    for (std::string arg; std::getline(file, arg, '\0');)
      if (arg == word) return child;
  }
  return 0;
}

// `baton up` starts again a role that died: a decode node killed with
// SIGKILL comes back under a new pid and serves the same answers; so does
// the router, with whom the nodes register again. The cluster never stops.
TEST(SupervisionTest, KilledRolesAreStartedAgainAndServe) {
  ClusterShape shape;
  shape.max_restarts = 3;
  Cluster cluster(shape);
  const json request = {{"prompt", std::string(30, 's')}, {"max_tokens", 4}, {"temperature", 0}};
  auto first = cluster.post("/v1/completions", request);
  ASSERT_TRUE(first.is_ok());
  ASSERT_EQ(first->status, 200) << first->body;
  const json text = json::parse(first->body)["choices"][0]["text"];

  const pid_t decode = cluster.node_pid("decode-0");
  ASSERT_GT(decode, 0);
  ASSERT_EQ(::kill(decode, SIGKILL), 0);
  bool back = false;
  for (auto until = Clock::now() + 30s; !back && Clock::now() < until;) {
    back = cluster.node_up("decode-0") && cluster.node_pid("decode-0") != decode;
    if (!back) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(back) << "decode-0 was not started again: " << cluster.nodes().dump(2);
  auto again = cluster.post("/v1/completions", request);
  ASSERT_TRUE(again.is_ok());
  ASSERT_EQ(again->status, 200) << again->body;
  EXPECT_EQ(json::parse(again->body)["choices"][0]["text"], text);

  const pid_t router = child_running(cluster.up_pid(), "router");
  ASSERT_GT(router, 0);
  ASSERT_EQ(::kill(router, SIGKILL), 0);
  back = false;
  for (auto until = Clock::now() + 30s; !back && Clock::now() < until;) {
    const pid_t now_router = child_running(cluster.up_pid(), "router");
    back = now_router != 0 && now_router != router && cluster.node_up("prefill-0") &&
           cluster.node_up("decode-0");
    if (!back) std::this_thread::sleep_for(50ms);
  }
  ASSERT_TRUE(back) << "the router was not started again, or its nodes did not come back";
  auto third = cluster.post("/v1/completions", request);
  ASSERT_TRUE(third.is_ok());
  ASSERT_EQ(third->status, 200) << third->body;
  EXPECT_EQ(json::parse(third->body)["choices"][0]["text"], text);
  EXPECT_TRUE(cluster.up_running()) << "baton up stopped the cluster";
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// A node that exits while it starts (here: a fault setting it cannot read)
// fails the start-up: `baton up` stops everything and exits, rather than
// taking the node for one that registered and died, restarting it and
// saying the cluster is up (the router lists every configured node from
// its start, registered or not).
TEST(SupervisionTest, ANodeThatNeverStartsFailsTheStartUp) {
  ASSERT_EQ(::setenv("BATON_FAULT_STALL_FIRST_STEP", "decode-0:soon", 1), 0);
  ClusterShape shape;
  shape.wait_until_up = false;
  Cluster cluster(shape);
  ::unsetenv("BATON_FAULT_STALL_FIRST_STEP");  // the nodes took it
  bool running = true;
  for (auto until = Clock::now() + 30s; running && Clock::now() < until;) {
    running = cluster.up_running();
    if (running) std::this_thread::sleep_for(50ms);
  }
  EXPECT_FALSE(running) << "baton up went on without decode-0";
  auto health = cluster.get("/health");
  EXPECT_FALSE(health.is_ok()) << "the router still answers: " << health->status;
}

// A second `baton up` of a running cluster's YAML finds the router's ports
// taken: it fails at once, naming the port, without ever saying the
// cluster is up (the first cluster's router answers on the same port, with
// nodes of the same names), and the first cluster serves on.
TEST(SupervisionTest, ASecondUpOfTheSameConfigFailsNamingThePort) {
  Cluster cluster(ClusterShape{});
  const auto start = Clock::now();
  const std::string command = std::string(BATON_BINARY) + " up " + cluster.config_file().string() +
                              " --ready-timeout 30 2>&1";
  FILE* pipe = ::popen(command.c_str(), "r");
  ASSERT_NE(pipe, nullptr);
  std::string output;
  char buffer[4096];
  for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) output.append(buffer, n);
  const int status = ::pclose(pipe);
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << output;
  EXPECT_LT(seconds, 20.0) << output;
  EXPECT_EQ(output.find("Baton is up"), std::string::npos) << output;
  EXPECT_NE(output.find("router exited"), std::string::npos) << output;
  auto names = [&](uint16_t port) {
    return output.find(fmt::format(":{}", port)) !=
           std::string::npos;  // fmt: GCC 12 warns on `":" + ...`
  };
  const bool names_a_port = names(cluster.http_port()) || names(cluster.control_port());
  EXPECT_TRUE(names_a_port) << output;

  EXPECT_TRUE(cluster.up_running());
  for (const json& by : post_completions(cluster, 2, 30, 'u'))
    EXPECT_EQ(by.value("decode", json()), "decode-0") << by.dump();
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

}  // namespace
}  // namespace baton::testing
