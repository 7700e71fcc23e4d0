// common/control_socket.cc — cppzmq behind the control socket.
#include "common/control_socket.h"

#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/zap_handler.h"

namespace baton::control {

struct ControlSocket::Sockets {
  zmq::context_t context{1};
  // The router's ZAP handler, when keyed: started before the socket, and
  // (declared before it) destroyed after it closes.
  std::unique_ptr<ZapHandler> zap;
  zmq::socket_t socket;
};

namespace {

void set_bounds(zmq::socket_t& socket) {
  socket.set(zmq::sockopt::sndhwm, kControlHighWaterMark);
  socket.set(zmq::sockopt::rcvhwm, kControlHighWaterMark);
  socket.set(zmq::sockopt::maxmsgsize, int64_t(kMaxMessageBytes));
  socket.set(zmq::sockopt::linger, 0);
  socket.set(zmq::sockopt::heartbeat_ivl, kZmtpHeartbeatIntervalMs);
  socket.set(zmq::sockopt::heartbeat_timeout, kZmtpHeartbeatTimeoutMs);
}

}  // namespace

ControlSocket::ControlSocket(std::unique_ptr<Sockets> sockets, bool is_router)
    : sockets_(std::move(sockets)), is_router_(is_router) {}

ControlSocket::~ControlSocket() = default;

Result<std::unique_ptr<ControlSocket>> ControlSocket::connect(const std::string& endpoint,
                                                              const std::string& node_name,
                                                              const CurveKeys* keys) {
  auto sockets = std::make_unique<Sockets>();
  try {
    sockets->socket = zmq::socket_t(sockets->context, zmq::socket_type::dealer);
    set_bounds(sockets->socket);
    sockets->socket.set(zmq::sockopt::routing_id, node_name);
    if (keys != nullptr) make_curve_client(sockets->socket, *keys);
    sockets->socket.connect(endpoint);
  } catch (const zmq::error_t& e) {
    return unavailable("control socket: cannot connect to " + endpoint + ": " + e.what());
  }
  return std::unique_ptr<ControlSocket>(new ControlSocket(std::move(sockets), false));
}

Result<std::unique_ptr<ControlSocket>> ControlSocket::bind(const std::string& endpoint,
                                                           const CurveKeys* keys) {
  auto sockets = std::make_unique<Sockets>();
  try {
    if (keys != nullptr) {
      BATON_ASSIGN_OR_RETURN(
          sockets->zap,
          ZapHandler::start(sockets->context, keys->client.public_key, "control socket"));
    }
    sockets->socket = zmq::socket_t(sockets->context, zmq::socket_type::router);
    set_bounds(sockets->socket);
    if (keys != nullptr) make_curve_server(sockets->socket, *keys, "baton-control");
    sockets->socket.set(zmq::sockopt::router_mandatory, 1);
    // No ZMQ_ROUTER_HANDOVER: a second connection claiming a live node's
    // name (a misconfigured twin cluster) must not take the name over, which
    // orphans the real node's connection. A restarted node's old connection
    // is gone (closed by its kernel, or dropped by the ZMTP heartbeat), so
    // its name is free again.
    sockets->socket.bind(endpoint);
  } catch (const zmq::error_t& e) {
    return unavailable("control socket: cannot bind " + endpoint + ": " + e.what());
  }
  return std::unique_ptr<ControlSocket>(new ControlSocket(std::move(sockets), true));
}

Status ControlSocket::send(const std::string& to, const Message& message) {
  std::vector<uint8_t> frame = encode(message);
  try {
    zmq::socket_t& socket = sockets_->socket;
    if (is_router_) {
      if (!socket.send(zmq::buffer(to), zmq::send_flags::sndmore | zmq::send_flags::dontwait)) {
        return resource_exhausted("control socket: queue to " + to + " is full");
      }
    }
    if (!socket.send(zmq::buffer(frame), zmq::send_flags::dontwait)) {
      return resource_exhausted("control socket: send queue is full");
    }
  } catch (const zmq::error_t& e) {
    if (e.num() == EHOSTUNREACH)
      return unavailable("control socket: no node named " + to + " is connected");
    return unavailable(std::string("control socket: send failed: ") + e.what());
  }
  return Status::ok();
}

std::vector<ControlSocket::Received> ControlSocket::poll(std::chrono::milliseconds timeout,
                                                         int wake_fd, size_t max_messages) {
  std::vector<Received> received;
  zmq::socket_t& socket = sockets_->socket;
  zmq::pollitem_t items[2] = {{socket.handle(), 0, ZMQ_POLLIN, 0},
                              {nullptr, wake_fd, ZMQ_POLLIN, 0}};
  try {
    zmq::poll(items, wake_fd >= 0 ? 2 : 1, timeout);
    while (received.size() < max_messages) {
      std::string from;
      zmq::message_t frame;
      if (is_router_) {
        zmq::message_t identity;
        if (!socket.recv(identity, zmq::recv_flags::dontwait)) break;
        from = identity.to_string();
        if (!identity.more() || !socket.recv(frame, zmq::recv_flags::dontwait)) {
          ++rejected_;
          spdlog::warn("control socket: dropped a frame without payload from '{}'", from);
          continue;
        }
      } else if (!socket.recv(frame, zmq::recv_flags::dontwait)) {
        break;
      }
      // A sender that splits a message into parts is not speaking this protocol.
      bool extra_parts = false;
      while (frame.more()) {
        zmq::message_t extra;
        if (!socket.recv(extra, zmq::recv_flags::dontwait)) break;
        extra_parts = true;
        frame.swap(extra);
      }
      if (extra_parts) {
        ++rejected_;
        spdlog::warn("control socket: dropped a multi-part frame from '{}'", from);
        answer_rejection(from, Rejected{"", 0, "a multi-part frame"});
        continue;
      }
      std::span bytes(static_cast<const uint8_t*>(frame.data()), frame.size());
      Result<Message> message = decode(bytes);
      if (!message.is_ok()) {
        ++rejected_;
        spdlog::warn("control socket: dropped a frame from '{}': {}", from,
                     message.status().message());
        answer_rejection(from, rejection_of(bytes, message.status()));
        continue;
      }
      received.push_back({std::move(from), std::move(message).value()});
    }
  } catch (const zmq::error_t& e) {
    // A signal (the stop request) interrupts the wait; the caller's loop looks at its flag.
    if (e.num() != EINTR) spdlog::error("control socket: poll failed: {}", e.what());
  }
  return received;
}

void ControlSocket::answer_rejection(const std::string& to, const Rejected& rejected) {
  // Never answer a refused answer: two peers that cannot read each other
  // would otherwise bounce rejections forever.
  if (rejected.type == "rejected") return;
  (void)send(to, rejected);
}

std::string ControlSocket::endpoint() const {
  return sockets_->socket.get(zmq::sockopt::last_endpoint);
}

WakeFd::WakeFd() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

void WakeFd::signal() {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd_.get(), &one, sizeof(one));
}

void WakeFd::drain() {
  uint64_t value;
  while (::read(fd_.get(), &value, sizeof(value)) > 0) {
  }
}

}  // namespace baton::control
