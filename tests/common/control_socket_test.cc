// The control sockets over real ZeroMQ on loopback.
#include "common/control_socket.h"

#include <gtest/gtest.h>
#include <zmq.hpp>

#include <nlohmann/json.hpp>
#include <random>
#include <thread>

namespace baton::control {
namespace {

using namespace std::chrono_literals;

std::vector<ControlSocket::Received> poll_until(ControlSocket& socket, size_t want) {
  std::vector<ControlSocket::Received> all;
  auto deadline = std::chrono::steady_clock::now() + 5s;
  while (all.size() < want && std::chrono::steady_clock::now() < deadline) {
    for (auto& r : socket.poll(50ms)) all.push_back(std::move(r));
  }
  return all;
}

TEST(ControlSocket, NodesAndRouterExchangeMessagesByName) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:*");
  ASSERT_TRUE(router.is_ok()) << router.status().to_string();
  std::string endpoint = (*router)->endpoint();
  auto node_a = ControlSocket::connect(endpoint, "decode-0");
  auto node_b = ControlSocket::connect(endpoint, "prefill-0");
  ASSERT_TRUE(node_a.is_ok() && node_b.is_ok());
  ASSERT_TRUE((*node_a)->send("", Heartbeat{"decode-0", {}}).is_ok());
  ASSERT_TRUE((*node_b)->send("", Heartbeat{"prefill-0", {}}).is_ok());
  auto got = poll_until(**router, 2);
  ASSERT_EQ(got.size(), 2u);
  for (auto& r : got) {
    ASSERT_TRUE(std::holds_alternative<Heartbeat>(r.message));
    EXPECT_EQ(std::get<Heartbeat>(r.message).node, r.from);
  }
  ASSERT_TRUE((*router)->send("prefill-0", Abort{5, "test"}).is_ok());
  auto at_b = poll_until(**node_b, 1);
  ASSERT_EQ(at_b.size(), 1u);
  EXPECT_EQ(std::get<Abort>(at_b[0].message).request_id, 5u);
  EXPECT_TRUE((*node_a)->poll(50ms).empty());
  Status unknown = (*router)->send("decode-9", Abort{1, ""});
  EXPECT_EQ(unknown.code(), StatusCode::kUnavailable);
}

TEST(ControlSocket, ATwinCannotTakeALiveNodesNameOver) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:*");
  ASSERT_TRUE(router.is_ok());
  auto real = ControlSocket::connect((*router)->endpoint(), "decode-0");
  ASSERT_TRUE(real.is_ok());
  ASSERT_TRUE((*real)->send("", Heartbeat{"decode-0", {}}).is_ok());
  ASSERT_EQ(poll_until(**router, 1).size(), 1u);
  {
    // The twin, a plain DEALER under the same name, watched until its ZMTP
    // handshake with the router is done: from then on the router has ruled
    // on its name, and a message it sends would be read within
    // milliseconds. (Only absence can show the refusal: libzmq neither
    // closes the refused connection nor reports it.)
    zmq::context_t context;
    zmq::socket_t twin(context, zmq::socket_type::dealer);
    twin.set(zmq::sockopt::routing_id, "decode-0");
    twin.set(zmq::sockopt::linger, 0);
    ASSERT_EQ(
        zmq_socket_monitor(twin.handle(), "inproc://twin-monitor", ZMQ_EVENT_HANDSHAKE_SUCCEEDED),
        0);
    zmq::socket_t monitor(context, zmq::socket_type::pair);
    monitor.set(zmq::sockopt::rcvtimeo, 5000);
    monitor.connect("inproc://twin-monitor");
    twin.connect((*router)->endpoint());
    zmq::message_t event;
    ASSERT_TRUE(monitor.recv(event)) << "the twin never completed its handshake";
    const std::vector<uint8_t> frame = encode(Heartbeat{"twin", {}});
    twin.send(zmq::buffer(frame), zmq::send_flags::none);
    std::this_thread::sleep_for(200ms);
    for (auto& r : (*router)->poll(100ms)) {
      EXPECT_NE(std::get<Heartbeat>(r.message).node, "twin") << "the twin's messages are not taken";
    }
    ASSERT_TRUE((*router)->send("decode-0", Abort{11, ""}).is_ok());
    auto at_real = poll_until(**real, 1);
    ASSERT_EQ(at_real.size(), 1u) << "the router still reaches the real node";
    twin.set(zmq::sockopt::rcvtimeo, 100);
    zmq::message_t stray;
    EXPECT_FALSE(twin.recv(stray)) << "the router's message reached the twin";
    zmq_socket_monitor(twin.handle(), nullptr, 0);
  }
  // The twin is gone; the real node still talks both ways.
  ASSERT_TRUE((*real)->send("", Heartbeat{"decode-0", {}}).is_ok());
  ASSERT_EQ(poll_until(**router, 1).size(), 1u);
  ASSERT_TRUE((*router)->send("decode-0", Abort{12, ""}).is_ok());
  auto again = poll_until(**real, 1);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(std::get<Abort>(again[0].message).request_id, 12u);
}

TEST(ControlSocket, MalformedFramesAreDroppedAndCounted) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:*");
  ASSERT_TRUE(router.is_ok());
  zmq::context_t context;
  zmq::socket_t rogue(context, zmq::socket_type::dealer);
  rogue.set(zmq::sockopt::routing_id, "rogue");
  rogue.connect((*router)->endpoint());
  rogue.send(zmq::str_buffer("not msgpack at all"), zmq::send_flags::none);
  rogue.send(zmq::str_buffer("a"), zmq::send_flags::sndmore);
  rogue.send(zmq::str_buffer("b"), zmq::send_flags::none);
  std::vector<uint8_t> good = encode(Abort{3, ""});
  rogue.send(zmq::buffer(good), zmq::send_flags::none);
  auto got = poll_until(**router, 1);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(std::get<Abort>(got[0].message).request_id, 3u);
  EXPECT_EQ((*router)->rejected(), 2u);
}

// The sender of a frame that does not decode hears why, with the request
// it was about; a refused rejection is not answered (no ping-pong).
TEST(ControlSocket, TheSenderOfARefusedFrameIsToldWhy) {
  auto node = ControlSocket::bind("tcp://127.0.0.1:*");
  ASSERT_TRUE(node.is_ok());
  zmq::context_t context;
  zmq::socket_t peer(context, zmq::socket_type::dealer);
  peer.set(zmq::sockopt::routing_id, "router");
  peer.set(zmq::sockopt::rcvtimeo, 2000);
  peer.connect((*node)->endpoint());
  const uint64_t id = std::random_device{}() + 1;
  nlohmann::json generate = nlohmann::json::from_msgpack(encode(Generate{id, {1, 2}, {}, "", ""}));
  generate["sampling"]["stop_token_ids"] = std::vector<int>(kMaxStopTokenIds + 1, 7);
  std::vector<uint8_t> bad = nlohmann::json::to_msgpack(generate);
  peer.send(zmq::buffer(bad), zmq::send_flags::none);
  EXPECT_TRUE((*node)->poll(1s).empty());
  zmq::message_t answer;
  ASSERT_TRUE(peer.recv(answer)) << "no answer to a refused frame";
  auto decoded = decode(std::span(static_cast<const uint8_t*>(answer.data()), answer.size()));
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  ASSERT_TRUE(std::holds_alternative<Rejected>(*decoded));
  const Rejected& rejected = std::get<Rejected>(*decoded);
  EXPECT_EQ(rejected.type, "generate");
  EXPECT_EQ(rejected.request_id, id);
  EXPECT_NE(rejected.reason.find("stop_token_ids"), std::string::npos) << rejected.reason;

  nlohmann::json bad_rejection = nlohmann::json::from_msgpack(encode(rejected));
  bad_rejection["request_id"] = "not a number";
  std::vector<uint8_t> frame = nlohmann::json::to_msgpack(bad_rejection);
  peer.send(zmq::buffer(frame), zmq::send_flags::none);
  EXPECT_TRUE((*node)->poll(1s).empty());
  EXPECT_EQ((*node)->rejected(), 2u);
  peer.set(zmq::sockopt::rcvtimeo, 300);
  EXPECT_FALSE(peer.recv(answer)) << "a refused rejection was answered";
}

TEST(ControlSocket, WakeFdInterruptsPoll) {
  auto router = ControlSocket::bind("tcp://127.0.0.1:*");
  ASSERT_TRUE(router.is_ok());
  WakeFd wake;
  std::thread waker([&] {
    std::this_thread::sleep_for(50ms);
    wake.signal();
  });
  auto start = std::chrono::steady_clock::now();
  (*router)->poll(5s, wake.fd());
  auto waited = std::chrono::steady_clock::now() - start;
  waker.join();
  wake.drain();
  EXPECT_LT(waited, 2s);
}

}  // namespace
}  // namespace baton::control
