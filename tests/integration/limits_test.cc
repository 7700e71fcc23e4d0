// The router's limits through real processes: a full queue answers 429 with
// Retry-After; a request past the router's timeout ends with 504 and its
// blocks are freed on the nodes.
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <atomic>
#include <limits>
#include <mutex>
#include <numeric>
#include <thread>

#include "tests/integration/cluster_harness.h"

namespace baton::testing {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

TEST(LimitsTest, FullRouterAnswers429WithRetryAfter) {
  ClusterShape shape;
  shape.max_num_seqs = 1;
  shape.extra_router_yaml = "  max_queued_requests: 2\n";
  Cluster cluster(shape);
  const double errors_at_start =
      cluster.metric("vllm:request_success_total", "finished_reason=\"error\"");
  ASSERT_GE(errors_at_start, 0) << "no such metric";
  constexpr int kClients = 8;
  std::vector<tools::HttpResponse> responses(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&, i] {
      json body = {{"prompt", std::string(20 + i, 'r')}, {"max_tokens", 800}, {"ignore_eos", true}};
      auto response = cluster.post("/v1/completions", body);
      if (response.is_ok()) responses[i] = *response;
    });
  }
  for (auto& client : clients) client.join();
  int ok = 0, refused = 0;
  for (const auto& response : responses) {
    if (response.status == 200) ++ok;
    if (response.status == 429) {
      ++refused;
      EXPECT_EQ(response.retry_after, "1");
      json error = json::parse(response.body, nullptr, false);
      EXPECT_EQ(error["error"]["code"], 429) << response.body;
    }
    EXPECT_TRUE(response.status == 200 || response.status == 429)
        << response.status << " " << response.body;
  }
  EXPECT_GE(ok, 2);
  EXPECT_GE(refused, 1);
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  // A refused request never ran: it is no finished request, in error or not.
  EXPECT_EQ(cluster.metric("vllm:request_success_total", "finished_reason=\"error\""),
            errors_at_start);

  // A request of more generations than the router ever holds could not be
  // admitted by retrying: 400 naming the limit, and nothing counted as a
  // finished request.
  const double errors_before =
      cluster.metric("vllm:request_success_total", "finished_reason=\"error\"");
  ASSERT_GE(errors_before, 0) << "no such metric";
  auto too_many =
      cluster.post("/v1/completions", json{{"prompt", {"a", "b"}}, {"n", 2}, {"max_tokens", 2}});
  ASSERT_TRUE(too_many.is_ok());
  EXPECT_EQ(too_many->status, 400) << too_many->body;
  EXPECT_NE(too_many->body.find("asks for 4 generations"), std::string::npos) << too_many->body;
  EXPECT_NE(too_many->body.find("router.max_queued_requests"), std::string::npos);
  EXPECT_EQ(cluster.metric("vllm:request_success_total", "finished_reason=\"error\""),
            errors_before);
}

// Requests whose cost shows before they run: log-probabilities past the
// router's budget for one request are a 400 naming the setting (at the
// budget, served); a text prompt far past the context is refused as too
// long, the count it names a floor (its encoding stopped at the limit).
TEST(LimitsTest, RequestsTooCostlyForTheRouterAreRefusedBeforeTheyRun) {
  ClusterShape shape;
  // Two choices of 100 positions with 20 alternatives each: 2 x 100 x 21.
  shape.extra_router_yaml = "  limits:\n    max_reply_logprobs: 4200\n";
  Cluster cluster(shape);
  std::vector<int32_t> ids(10);
  std::iota(ids.begin(), ids.end(), 20);
  json body = {{"prompt", ids},      {"n", 2},
               {"max_tokens", 100},  {"logprobs", 20},
               {"ignore_eos", true}, {"temperature", 1.0}};
  auto at_budget = cluster.post("/v1/completions", body);
  ASSERT_TRUE(at_budget.is_ok());
  ASSERT_EQ(at_budget->status, 200) << at_budget->body.substr(0, 500);
  json served = json::parse(at_budget->body);
  ASSERT_EQ(served["choices"].size(), 2u);
  for (const json& choice : served["choices"]) {
    EXPECT_EQ(choice["logprobs"]["tokens"].size(), 100u);
  }
  body["max_tokens"] = 101;
  auto past = cluster.post("/v1/completions", body);
  ASSERT_TRUE(past.is_ok());
  EXPECT_EQ(past->status, 400) << past->body;
  EXPECT_NE(past->body.find("could hold 4242 log-probabilities"), std::string::npos) << past->body;
  EXPECT_NE(past->body.find("router.limits.max_reply_logprobs"), std::string::npos);

  // The tiny model's tokenizer makes a token of each byte: 6 MB of text is
  // six million tokens.
  // Token ids the model has no row for, named with their field.
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"logit_bias", json{{"999999", 1}}}, {"stop_token_ids", json::array({3, 999999})}}) {
    auto out_of_vocabulary =
        cluster.post("/v1/completions", json{{"prompt", ids}, {"max_tokens", 1}, {field, value}});
    ASSERT_TRUE(out_of_vocabulary.is_ok());
    EXPECT_EQ(out_of_vocabulary->status, 400) << out_of_vocabulary->body;
    EXPECT_NE(out_of_vocabulary->body.find(field + ": token id 999999 is out of vocabulary"),
              std::string::npos)
        << out_of_vocabulary->body;
  }

  const std::string text(6u << 20, 'x');
  auto too_long = cluster.post("/v1/completions", json{{"prompt", text}, {"max_tokens", 1}});
  ASSERT_TRUE(too_long.is_ok());
  EXPECT_EQ(too_long->status, 400) << too_long->body;
  EXPECT_NE(
      too_long->body.find("has at least " + std::to_string(shape.max_model_len) + " input tokens"),
      std::string::npos)
      << too_long->body;
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

TEST(LimitsTest, RequestPastTheRouterTimeoutGets504AndItsBlocksBack) {
  ClusterShape shape;
  shape.max_model_len = 2048;  // the tiny model's limit
  // A second for the first token (under ASan too), and tokens paced well
  // below what the request asks for in that time: it times out mid-stream.
  shape.extra_router_yaml = "  request_timeout_ms: 1000\n";
  shape.decode_min_step_interval_ms = 50;
  Cluster cluster(shape);
  const int64_t before = cluster.generated_tokens("decode");
  const double errors_before =
      cluster.metric("vllm:request_success_total", "finished_reason=\"error\"");
  // A short prompt leaves room for many more tokens than a node makes
  // before the timeout's abort reaches it (hundreds on a fast machine).
  constexpr int kMaxTokens = 2000;
  json body = {{"prompt", std::string(16, 't')}, {"max_tokens", kMaxTokens}, {"ignore_eos", true}};
  auto response = cluster.post("/v1/completions", body);
  ASSERT_TRUE(response.is_ok());
  EXPECT_EQ(response->status, 504) << response->body;
  EXPECT_NE(response->body.find("request timeout"), std::string::npos) << response->body;
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  // The decode node stopped it: the drain alone could not tell, since a
  // request runs to its end in well under a second. (One that ran on would
  // make kMaxTokens - 1 here, its first token coming from the prefill node.)
  const int64_t after_first = cluster.generated_tokens("decode");
  EXPECT_LT(after_first - before, kMaxTokens / 2) << "tokens generated for a request timed out";
  // Streamed: the stream has started (its first tokens came well inside
  // the timeout), so the timeout ends it with an SSE error event.
  body["stream"] = true;
  auto streamed = cluster.post("/v1/completions", body);
  ASSERT_TRUE(streamed.is_ok());
  ASSERT_EQ(streamed->status, 200) << streamed->body;
  std::vector<std::string> events = sse_payloads(streamed->body);
  ASSERT_GE(events.size(), 3u) << "no token before the timeout: " << streamed->body;
  EXPECT_EQ(events.back(), "[DONE]");
  json error = json::parse(events[events.size() - 2], nullptr, false);
  ASSERT_TRUE(error.contains("error")) << "a stream that times out ends with an error event";
  EXPECT_NE(error["error"]["message"].get<std::string>().find("request timeout"), std::string::npos)
      << error.dump();
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
  EXPECT_LT(cluster.generated_tokens("decode") - after_first, kMaxTokens / 2)
      << "tokens generated for a streamed request timed out";
  // And the router counted both as ended in error.
  EXPECT_EQ(
      cluster.metric("vllm:request_success_total", "finished_reason=\"error\"") - errors_before, 2);
}

}  // namespace
}  // namespace baton::testing

namespace baton::testing {
namespace {

TEST(LimitsTest, SigtermDrainsRunningRequestsThenStopsEveryProcess) {
  ClusterShape shape;
  // Paced, so that SIGTERM finds the stream running (300 steps of at least
  // 8 ms; unpaced, the tiny model may finish it first).
  shape.decode_min_step_interval_ms = 8;
  Cluster cluster(shape);
  std::atomic<bool> first_bytes{false};
  std::mutex received_mutex;
  std::string received;
  std::thread client([&] {
    json body = {{"prompt", std::string(40, 'd')},
                 {"max_tokens", 300},
                 {"ignore_eos", true},
                 {"stream", true}};
    auto response = tools::http_stream("127.0.0.1", cluster.http_port(), "/v1/completions",
                                       body.dump(), [&](std::string_view data) {
                                         std::lock_guard lock(received_mutex);
                                         received.append(data);
                                         first_bytes = true;
                                         return true;
                                       });
    EXPECT_TRUE(response.is_ok());
  });
  auto until = std::chrono::steady_clock::now() + 10s;
  while (!first_bytes && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(1ms);
  size_t events_before = 0;
  {
    std::lock_guard lock(received_mutex);
    events_before = sse_payloads(received).size();
  }
  int status = cluster.terminate(10s);
  client.join();
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "baton up exits cleanly: " << status;
  std::vector<std::string> events = sse_payloads(received);
  ASSERT_GE(events.size(), 2u);
  // The premise: the stream still ran when SIGTERM came, and went on.
  EXPECT_GT(events.size(), events_before + 2) << "no tokens came after SIGTERM";
  EXPECT_EQ(events.back(), "[DONE]");
  json last = json::parse(events[events.size() - 2]);
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length")
      << "the running request was drained, not cut";
  // Nothing listens any more.
  auto after = tools::http_request("127.0.0.1", cluster.http_port(), "GET", "/health", {}, 1s);
  EXPECT_FALSE(after.is_ok() && after->status == 200);
}

}  // namespace
}  // namespace baton::testing

namespace baton::testing {
namespace {

// Heartbeats flow from their own thread: engine steps longer than the
// heartbeat timeout must not get a live node declared dead. Four
// 2000-token prompts, none sharing a prefix with another, take some 230 ms
// on one thread in one step (`baton generate`), and the steps here outlast
// the timeout: heartbeats sent from the engine's loop instead missed it in
// every run. A timeout of 60 ms was missed once in about 150 runs beside
// other tests on two cores, by a heartbeat thread that waited that long
// for a core; so the timeout is 200 ms, and a step of sixteen prompts
// outlasts it twice (420-520 ms here; eight took 170-290).
TEST(LimitsTest, LongEngineStepsDoNotLookLikeDeadNodes) {
  constexpr int kPrompts = 16;
  ClusterShape shape;
  shape.max_model_len = 2048;
  shape.max_num_batched_tokens = 32768;  // sixteen 2000-token prompts in one step
  shape.kv_cache_bytes = "40MiB";
  shape.heartbeat_interval_ms = 10;
  shape.heartbeat_timeout_ms = 200;
  Cluster cluster(shape);
  // The shortest round's mean prefill time: the prompts of a round are
  // prefilled in one step, so each one's prefill time is about that step's.
  double shortest_step_s = std::numeric_limits<double>::infinity();
  for (int round = 0; round < 3; ++round) {
    const double sum_before = cluster.metric("vllm:request_prefill_time_seconds_sum");
    const double count_before = cluster.metric("vllm:request_prefill_time_seconds_count");
    std::vector<std::thread> clients;
    std::vector<int> statuses(kPrompts, 0);
    std::vector<std::string> bodies(kPrompts);
    for (int i = 0; i < kPrompts; ++i) {
      clients.emplace_back([&, i] {
        json body = {{"prompt", std::string(2000, char('!' + round * kPrompts + i))},
                     {"max_tokens", 2}};
        auto response = cluster.post("/v1/completions", body);
        statuses[i] = response.is_ok() ? response->status : -1;
        bodies[i] = response.is_ok() ? response->body : response.status().to_string();
      });
    }
    for (auto& client : clients) client.join();
    const double count = cluster.metric("vllm:request_prefill_time_seconds_count") - count_before;
    ASSERT_EQ(count, kPrompts) << "each request's prefill time is reported";
    shortest_step_s =
        std::min(shortest_step_s,
                 (cluster.metric("vllm:request_prefill_time_seconds_sum") - sum_before) / count);
    for (int i = 0; i < kPrompts; ++i) EXPECT_EQ(statuses[i], 200) << bodies[i];
  }
  // The premise: a prefill step lasts longer than the heartbeat timeout. On
  // a machine fast enough to break it, this test checks nothing until its
  // prompts grow.
  EXPECT_GT(shortest_step_s * 1e3, double(shape.heartbeat_timeout_ms))
      << "the premise: steps outlast the heartbeat timeout; shortest " << shortest_step_s * 1e3
      << " ms";
  EXPECT_TRUE(cluster.node_up("prefill-0"));
  EXPECT_TRUE(cluster.node_up("decode-0"));
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

// A non-streamed reply with echo and 20 log-probabilities for each of many
// choices takes longer to build than the heartbeat timeout here. No node is
// declared down meanwhile (once, every node was, failing other clients'
// requests, and each re-registered several times): the reply is built on a
// request worker, not on the core thread, and the core judges silence as
// of its last read of the control socket. Either alone keeps this passing;
// it fails with both undone.
TEST(LimitsTest, ALargeReplyDoesNotLookLikeDeadNodes) {
  ClusterShape shape;
  shape.heartbeat_interval_ms = 10;
  shape.heartbeat_timeout_ms = 100;
  shape.kv_cache_bytes = "16MiB";
  Cluster cluster(shape);
  const double downs_before = cluster.metric("baton:node_down_total");
  ASSERT_GE(downs_before, 0);
  std::vector<int32_t> ids(100);
  std::iota(ids.begin(), ids.end(), 10);
  const json prompts = json::array({ids, ids, ids, ids, ids, ids, ids, ids});
  json body = {{"prompt", prompts}, {"n", 16},      {"max_tokens", 64},
               {"logprobs", 20},    {"echo", true}, {"ignore_eos", true},
               {"temperature", 1.0}};
  auto response = cluster.post("/v1/completions", body);
  ASSERT_TRUE(response.is_ok()) << response.status().to_string();
  ASSERT_EQ(response->status, 200) << response->body.substr(0, 500);
  // The premise, as far as it shows from outside: 128 choices of 164
  // positions with 21 log-probabilities each, some 10 MB of JSON.
  EXPECT_GT(response->body.size(), size_t(8) << 20);
  EXPECT_EQ(cluster.metric("baton:node_down_total"), downs_before)
      << "a node was declared down while the reply was built";
  EXPECT_TRUE(cluster.node_up("prefill-0"));
  EXPECT_TRUE(cluster.node_up("decode-0"));
  EXPECT_TRUE(cluster.wait_drained(10s)) << cluster.nodes().dump(2);
}

}  // namespace
}  // namespace baton::testing
