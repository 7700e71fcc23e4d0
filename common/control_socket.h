// common/control_socket.h — the ZeroMQ sockets that carry control messages.
//
// The router binds one ROUTER socket; every node connects one DEALER whose
// routing id is its node name, so the router addresses nodes by name. A
// second connection under a name already connected is refused (no
// ZMQ_ROUTER_HANDOVER); ZMTP heartbeats drop connections whose peer vanished,
// so a restarted node gets its name back. Both ends set
// high-water marks and a maximum frame size, so no queue grows without bound:
// a send that would block fails with ResourceExhausted instead. Frames that do
// not decode are dropped with a log line and counted, never surfaced, and
// their sender is told why (a Rejected message naming the request), so a
// request no node can take fails at once rather than at its timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/control_messages.h"
#include "common/curve_keys.h"
#include "common/status.h"
#include "common/unique_fd.h"

namespace baton::control {

// A node sends heartbeats from a second DEALER whose routing id is its name
// plus this suffix, so they flow while its main loop is busy in a long step.
inline constexpr std::string_view kHeartbeatIdentitySuffix = "/heartbeat";

// Bounds of one socket's queues (messages, each direction).
inline constexpr int kControlHighWaterMark = 100000;
// ZMTP-level heartbeats: a connection whose peer vanished without closing it
// (host down, cable pulled, process stopped) is dropped within the timeout,
// which frees its routing id for the node's next incarnation (and, on the
// client front end, cancels the client's requests).
inline constexpr int kZmtpHeartbeatIntervalMs = 1000;
inline constexpr int kZmtpHeartbeatTimeoutMs = 5000;

class ControlSocket {
 public:
  // A node's DEALER, connected to the router's control endpoint
  // ("tcp://host:port"). With `keys`, over CURVE as the cluster's node.
  static Result<std::unique_ptr<ControlSocket>> connect(const std::string& endpoint,
                                                        const std::string& node_name,
                                                        const CurveKeys* keys = nullptr);
  // The router's ROUTER, bound to `endpoint`. With `keys`, a CURVE server
  // that admits only connections holding the nodes' key: a ZAP handler
  // refuses every other client key, and nothing is accepted in the clear.
  static Result<std::unique_ptr<ControlSocket>> bind(const std::string& endpoint,
                                                     const CurveKeys* keys = nullptr);
  ~ControlSocket();
  ControlSocket(const ControlSocket&) = delete;
  ControlSocket& operator=(const ControlSocket&) = delete;

  // Router side: `to` is the node's name; node side: `to` is ignored. Never
  // blocks. Unavailable when the router knows no such node; ResourceExhausted
  // when the peer's queue is full.
  Status send(const std::string& to, const Message& message);

  struct Received {
    std::string from;  // router side: the sending node's name; node side: empty
    Message message;
  };
  // Waits up to `timeout` until a frame arrives or `wake_fd` (an eventfd, -1
  // for none) becomes readable, then returns every frame already queued (at
  // most `max_messages`). Malformed frames are dropped, counted and answered
  // with a Rejected message.
  std::vector<Received> poll(std::chrono::milliseconds timeout, int wake_fd = -1,
                             size_t max_messages = 4096);

  // The bound or connected endpoint ("tcp://127.0.0.1:41234" after binding port *).
  std::string endpoint() const;

  // Frames dropped because they did not decode.
  uint64_t rejected() const { return rejected_; }

 private:
  struct Sockets;
  void answer_rejection(const std::string& to, const Rejected& rejected);
  ControlSocket(std::unique_ptr<Sockets> sockets, bool is_router);

  std::unique_ptr<Sockets> sockets_;
  bool is_router_;
  uint64_t rejected_ = 0;
};

// An eventfd another thread signals to wake a poll() above.
class WakeFd {
 public:
  WakeFd();
  int fd() const { return fd_.get(); }
  void signal();  // thread-safe, async-signal-safe
  void drain();   // clears pending signals
 private:
  UniqueFd fd_;
};

}  // namespace baton::control
