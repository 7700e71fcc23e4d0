// common/zap_handler.h — ZeroMQ's authentication protocol (ZAP, RFC 27) for
// a CURVE server socket: admits only clients that prove they hold one
// public key (the ring's client key, common/curve_keys.h).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "common/curve_keys.h"
#include "common/status.h"

namespace baton::control {

class ZapHandler {
 public:
  // Binds the context's ZAP endpoint. Start it before the server socket
  // exists, so no handshake can come before it; it must also outlive that
  // socket. `what` names the socket in log lines ("control socket").
  static Result<std::unique_ptr<ZapHandler>> start(zmq::context_t& context,
                                                   std::string allowed_public_key,
                                                   std::string what);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

 private:
  ZapHandler() = default;
  void serve(zmq::socket_t handler);

  std::string allowed_;  // the Z85 public key
  std::string what_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Makes `socket` a CURVE server with `keys.server`, whose ZAP handler (of
// the socket's context) decides who may connect.
void make_curve_server(zmq::socket_t& socket, const CurveKeys& keys, const char* zap_domain);
// Makes `socket` a CURVE client of a server holding `keys.server`.
void make_curve_client(zmq::socket_t& socket, const CurveKeys& keys);

}  // namespace baton::control
