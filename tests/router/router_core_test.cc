// The dispatcher core on its own: its control socket on loopback, and the
// test playing its decode node.
#include "router/router_core.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <numeric>
#include <stdexcept>
#include <thread>

namespace baton::router {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// What a node of `role` named `name` registers with (a CPU node of 16-token
// F32 blocks).
control::Register registration(const std::string& name, Role role) {
  return control::Register{name, role, {1, 2, 3}, 16, 1024, ::getpid(), "f32", 256, "cpu", ""};
}

// A front end whose sink throws (out of memory building a reply, a bug)
// loses that request, not the core's thread: the request is aborted on its
// node, and the next one is served.
TEST(RouterCoreTest, ASinkThatThrowsEndsItsRequestNotTheCore) {
  RouterCoreConfig config;
  config.control_endpoint = "tcp://127.0.0.1:*";
  config.nodes = {{"decode-0", Role::kDecode}};
  auto core = RouterCore::start(config);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  auto node = control::ControlSocket::connect((*core)->control_endpoint(), "decode-0");
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  ASSERT_TRUE((*node)->send("", registration("decode-0", Role::kDecode)).is_ok());
  // What the node is sent, heartbeating meanwhile, until `done`.
  auto serve = [&](auto&& on_message, auto&& done) {
    for (auto until = Clock::now() + 10s; !done() && Clock::now() < until;) {
      (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
      for (auto& received : (*node)->poll(20ms)) on_message(received.message);
    }
  };
  GenerationRequest request;
  request.prompt = {1, 2, 3};
  request.sampling.max_tokens = 4;
  auto submit = [&](UpdateSink sink) {
    Result<uint64_t> id = unavailable("not submitted");
    serve([](control::Message&) {},
          [&] { return (id = (*core)->submit(request, sink)).is_ok(); });  // once registered
    return id;
  };
  // Answers a Generate with `events` events of one token each, in one
  // message, the last ending the request when `last`.
  auto answer = [&](control::Message& message, bool last, int events = 1) {
    if (auto* generate = std::get_if<control::Generate>(&message)) {
      control::Events answered;
      for (int i = 0; i < events; ++i) {
        control::TokenEvent event;
        event.request_id = generate->request_id;
        event.tokens = {7};
        if (last && i + 1 == events) event.finish_reason = FinishReason::kLength;
        answered.events.push_back(event);
      }
      (void)(*node)->send("", answered);
    }
  };

  // Its tokens come three events to a message, the last ending it, handled
  // in one pass: once the sink has thrown, the request gets only its error,
  // and one abort.
  std::atomic<int> thrower_calls = 0;
  std::atomic<bool> thrower_told_error = false;
  const Result<uint64_t> thrower = submit([&](const GenerationUpdate& update) {
    ++thrower_calls;
    if (!update.tokens.empty()) throw std::runtime_error("a front end's bug");
    thrower_told_error = update.finished && !update.error.is_ok();
  });
  ASSERT_TRUE(thrower.is_ok()) << thrower.status().to_string();
  int aborts = 0;
  auto count_aborts = [&](control::Message& message) {
    answer(message, true, 3);
    if (auto* abort = std::get_if<control::Abort>(&message))
      aborts += abort->request_id == *thrower;
  };
  serve(count_aborts, [&] { return aborts > 0; });
  EXPECT_EQ(aborts, 1) << "the request whose sink threw was not aborted on its node";
  const auto settled = Clock::now() + 300ms;
  serve(count_aborts, [&] { return Clock::now() > settled; });
  EXPECT_EQ(aborts, 1);
  EXPECT_EQ(thrower_calls.load(), 2) << "the sink that threw was not given its error alone";
  EXPECT_TRUE(thrower_told_error);

  std::promise<GenerationUpdate> last;
  const Result<uint64_t> served = submit([&](const GenerationUpdate& update) {
    if (update.finished) last.set_value(update);
  });
  ASSERT_TRUE(served.is_ok()) << served.status().to_string();
  std::future<GenerationUpdate> end = last.get_future();
  serve([&](control::Message& message) { answer(message, true); },
        [&] { return end.wait_for(0s) == std::future_status::ready; });
  ASSERT_EQ(end.wait_for(0s), std::future_status::ready) << "the core's thread is gone";
  const GenerationUpdate update = end.get();
  EXPECT_TRUE(update.error.is_ok()) << update.error.to_string();
  EXPECT_EQ(update.tokens, std::vector<int32_t>{7});
  // Forgotten once its sink returned.
  for (auto until = Clock::now() + 2s; (*core)->in_flight() != 0 && Clock::now() < until;)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ((*core)->in_flight(), 0) << "a request was kept";
}

// A router started again (the same configuration, its nodes still up)
// numbers its requests apart from the one before: nodes may still hold
// the earlier router's requests (a transfer's callback, a job draining)
// and ignore a request whose id they hold as a duplicate.
TEST(RouterCoreTest, ARestartedRouterNumbersItsRequestsApart) {
  RouterCoreConfig config;
  config.control_endpoint = "tcp://127.0.0.1:*";
  config.nodes = {{"decode-0", Role::kDecode}};
  // The id of the first request a freshly started core sends its node.
  auto first_id = [&]() -> uint64_t {
    auto core = RouterCore::start(config);
    if (!core.is_ok()) return 0;
    auto node = control::ControlSocket::connect((*core)->control_endpoint(), "decode-0");
    if (!node.is_ok()) return 0;
    (void)(*node)->send(
        "", control::Register{
                "decode-0", Role::kDecode, {1, 2, 3}, 16, 1024, ::getpid(), "f32", 256, "cpu", ""});
    GenerationRequest request;
    request.prompt = {1, 2, 3};
    request.sampling.max_tokens = 4;
    Result<uint64_t> id = unavailable("not submitted");
    for (auto until = Clock::now() + 10s; Clock::now() < until;) {
      (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
      if (!id.is_ok()) id = (*core)->submit(request, [](const GenerationUpdate&) {});
      for (auto& received : (*node)->poll(20ms))
        if (auto* generate = std::get_if<control::Generate>(&received.message))
          return generate->request_id;
    }
    return 0;
  };
  const uint64_t a = first_id(), b = first_id();
  ASSERT_NE(a, 0u) << "the first core never sent its request";
  ASSERT_NE(b, 0u) << "the second core never sent its request";
  EXPECT_NE(a, b);
  EXPECT_LT(a, uint64_t(1) << 49);  // exact in any JSON reader
}

// The samples of one prompt (prompt_group): the first is placed alone; the
// others wait for its first tokens and then go to its decode node, to be
// computed there (no prefill node), where its KV is. A sample the client
// cancels while it waits is never placed; where the first fails before any
// token, the others are placed as any request is.
TEST(RouterCoreTest, TheSamplesOfAPromptFollowTheFirstToItsDecodeNode) {
  RouterCoreConfig config;
  config.control_endpoint = "tcp://127.0.0.1:*";
  config.nodes = {
      {"decode-0", Role::kDecode}, {"decode-1", Role::kDecode}, {"prefill-0", Role::kPrefill}};
  auto core = RouterCore::start(config);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  struct Node {
    std::string name;
    std::unique_ptr<control::ControlSocket> socket;
    std::vector<control::Generate> generates;
  };
  std::vector<Node> nodes;
  for (const auto& [name, role] : config.nodes) {
    auto socket = control::ControlSocket::connect((*core)->control_endpoint(), name);
    ASSERT_TRUE(socket.is_ok()) << socket.status().to_string();
    ASSERT_TRUE((*socket)->send("", registration(name, role)).is_ok());
    nodes.push_back({name, std::move(socket).value(), {}});
  }
  // Heartbeats every node and keeps what it is sent, until `done`.
  auto serve = [&](auto&& done) {
    for (auto until = Clock::now() + 10s; !done() && Clock::now() < until;) {
      for (Node& node : nodes) {
        (void)node.socket->send("", control::Heartbeat{node.name, {}});
        for (auto& received : node.socket->poll(5ms)) {
          if (auto* generate = std::get_if<control::Generate>(&received.message))
            node.generates.push_back(*generate);
        }
      }
    }
  };
  auto placed = [&] {
    size_t n = 0;
    for (const Node& node : nodes) n += node.generates.size();
    return n;
  };
  // Every node up before the first sample, which a prefill node must take.
  serve([&] {
    const auto cluster = (*core)->snapshot();
    return cluster->prefill_up == 1 && cluster->decode_up == 2;
  });
  std::vector<int32_t> prompt(100);
  std::iota(prompt.begin(), prompt.end(), 1);
  std::atomic<int> finished = 0;
  auto sample = [&](uint64_t group) {
    GenerationRequest request;
    request.prompt = prompt;
    request.sampling.max_tokens = 4;
    request.prompt_group = group;
    Result<uint64_t> id = unavailable("not submitted");
    serve([&] {
      return (id = (*core)->submit(request,
                                   [&](const GenerationUpdate& update) {
                                     if (update.finished) ++finished;
                                   }))
          .is_ok();
    });
    return id;
  };

  for (const bool first_fails : {false, true}) {
    SCOPED_TRACE(first_fails ? "the first fails" : "the first answers");
    for (Node& node : nodes) node.generates.clear();
    const uint64_t group = first_fails ? 2 : 1;
    std::vector<uint64_t> ids;
    for (int j = 0; j < 4; ++j) {
      auto id = sample(group);
      ASSERT_TRUE(id.is_ok()) << id.status().to_string();
      ids.push_back(*id);
    }
    (*core)->cancel(ids[3]);  // waiting still: never placed
    const auto settled = Clock::now() + 300ms;
    serve([&] { return Clock::now() > settled; });
    ASSERT_EQ(placed(), 1u) << "the others were placed before the first's tokens";
    Node* leader_node = nullptr;
    for (Node& node : nodes)
      if (node.name.starts_with("decode") && !node.generates.empty()) leader_node = &node;
    ASSERT_NE(leader_node, nullptr);
    const control::Generate first = leader_node->generates[0];
    EXPECT_EQ(first.request_id, ids[0]);
    EXPECT_EQ(first.prefill_node, "prefill-0") << "a long prompt goes to the prefill node";
    control::TokenEvent event;
    event.request_id = first.request_id;
    if (first_fails) {
      event.finish_reason = FinishReason::kError;
      event.error = "injected";
    } else {
      event.tokens = {7};
    }
    ASSERT_TRUE(leader_node->socket->send("", control::Events{{event}}).is_ok());
    serve([&] { return placed() == 3; });
    ASSERT_EQ(placed(), 3u);
    for (const Node& node : nodes) {
      for (const control::Generate& generate : node.generates) {
        if (generate.request_id == first.request_id) continue;
        EXPECT_NE(generate.request_id, ids[3]) << "a cancelled sample was placed";
        if (first_fails) {
          EXPECT_EQ(generate.prefill_node, "prefill-0") << "placed as any request";
        } else {
          EXPECT_EQ(node.name, leader_node->name) << "not beside the first";
          EXPECT_EQ(generate.prefill_node, "") << "not computed where the KV is";
        }
      }
    }
    // The rest end; nothing is left in the router.
    for (Node& node : nodes) {
      for (const control::Generate& generate : node.generates) {
        if (!node.name.starts_with("decode")) continue;
        if (first_fails && generate.request_id == first.request_id) continue;
        control::TokenEvent last;
        last.request_id = generate.request_id;
        last.tokens = {8};
        last.finish_reason = FinishReason::kLength;
        ASSERT_TRUE(node.socket->send("", control::Events{{last}}).is_ok());
      }
    }
    serve([&] { return (*core)->in_flight() == 0; });
    EXPECT_EQ((*core)->in_flight(), 0);
  }
}

// A sample held for its prompt's first has no timeout of its own beyond
// the request's: where the first runs out of time without a token, the
// others end with it, never placed.
TEST(RouterCoreTest, HeldSamplesEndWithinTheRequestsTimeout) {
  RouterCoreConfig config;
  config.control_endpoint = "tcp://127.0.0.1:*";
  // A prefill node up: the first is placed to be prefilled there, and its
  // samples held (where it is computed on its decode node they go at once).
  config.nodes = {{"decode-0", Role::kDecode}, {"prefill-0", Role::kPrefill}};
  config.request_timeout = 600ms;
  auto core = RouterCore::start(config);
  ASSERT_TRUE(core.is_ok()) << core.status().to_string();
  auto node = control::ControlSocket::connect((*core)->control_endpoint(), "decode-0");
  ASSERT_TRUE(node.is_ok()) << node.status().to_string();
  ASSERT_TRUE((*node)->send("", registration("decode-0", Role::kDecode)).is_ok());
  auto prefill = control::ControlSocket::connect((*core)->control_endpoint(), "prefill-0");
  ASSERT_TRUE(prefill.is_ok()) << prefill.status().to_string();
  ASSERT_TRUE((*prefill)->send("", registration("prefill-0", Role::kPrefill)).is_ok());
  int generates = 0;
  auto serve = [&](auto&& done) {
    for (auto until = Clock::now() + 10s; !done() && Clock::now() < until;) {
      (void)(*node)->send("", control::Heartbeat{"decode-0", {}});
      (void)(*prefill)->send("", control::Heartbeat{"prefill-0", {}});
      (void)(*prefill)->poll(1ms);
      for (auto& received : (*node)->poll(5ms))
        generates += std::holds_alternative<control::Generate>(received.message);
    }
  };
  serve([&] {
    const auto cluster = (*core)->snapshot();
    return cluster->prefill_up == 1 && cluster->decode_up == 1;
  });
  GenerationRequest request;
  request.prompt = std::vector<int32_t>(100, 5);
  request.sampling.max_tokens = 4;
  request.prompt_group = 7;
  std::atomic<int> timed_out = 0;
  const auto start = Clock::now();
  for (int j = 0; j < 3; ++j) {
    Result<uint64_t> id = unavailable("not submitted");
    serve([&] {
      return (id = (*core)->submit(request,
                                   [&](const GenerationUpdate& update) {
                                     if (update.finished &&
                                         update.error.code() == StatusCode::kDeadlineExceeded)
                                       ++timed_out;
                                   }))
          .is_ok();
    });
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  }
  serve([&] { return timed_out == 3; });
  EXPECT_EQ(timed_out.load(), 3);
  EXPECT_LT(Clock::now() - start, 1500ms) << "a held sample got a timeout of its own";
  EXPECT_EQ(generates, 1) << "held samples were placed after their first timed out";
  serve([&] { return (*core)->in_flight() == 0; });
  EXPECT_EQ((*core)->in_flight(), 0);
}

}  // namespace
}  // namespace baton::router
