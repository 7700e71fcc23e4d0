// common/zap_handler.cc — the ZAP request loop.
#include "common/zap_handler.h"

#include <spdlog/spdlog.h>

#include <array>
#include <cstring>
#include <zmq_addon.hpp>

namespace baton::control {

Result<std::unique_ptr<ZapHandler>> ZapHandler::start(zmq::context_t& context,
                                                      std::string allowed_public_key,
                                                      std::string what) {
  std::unique_ptr<ZapHandler> handler(new ZapHandler());
  handler->allowed_ = std::move(allowed_public_key);
  handler->what_ = std::move(what);
  try {
    zmq::socket_t socket(context, zmq::socket_type::rep);
    socket.set(zmq::sockopt::linger, 0);
    socket.bind("inproc://zeromq.zap.01");
    handler->thread_ = std::thread(&ZapHandler::serve, handler.get(), std::move(socket));
  } catch (const zmq::error_t& e) {
    return unavailable(handler->what_ + ": cannot start its ZAP handler: " + e.what());
  }
  return handler;
}

ZapHandler::~ZapHandler() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void ZapHandler::serve(zmq::socket_t handler) {
  std::array<uint8_t, 32> allowed{};
  zmq_z85_decode(allowed.data(), allowed_.c_str());
  while (!stop_) {
    zmq::pollitem_t item{handler.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, std::chrono::milliseconds(100)) == 0) continue;
      std::vector<zmq::message_t> request;
      if (!zmq::recv_multipart(handler, std::back_inserter(request))) continue;
      // version, request id, domain, address, identity, mechanism, key
      const bool ok = request.size() >= 7 && request[5].to_string_view() == "CURVE" &&
                      request[6].size() == allowed.size() &&
                      std::memcmp(request[6].data(), allowed.data(), allowed.size()) == 0;
      if (!ok) {
        spdlog::warn("{}: refused a connection from {} without the key", what_,
                     request.size() > 3 ? request[3].to_string() : std::string("?"));
      }
      std::array<zmq::const_buffer, 6> reply = {
          zmq::str_buffer("1.0"),
          zmq::buffer(request.size() > 1 ? request[1].to_string_view() : std::string_view()),
          ok ? zmq::str_buffer("200") : zmq::str_buffer("400"),
          ok ? zmq::str_buffer("OK") : zmq::str_buffer("not a holder of the key"),
          zmq::str_buffer(""),
          zmq::str_buffer("")};
      (void)zmq::send_multipart(handler, reply);
    } catch (const zmq::error_t& e) {
      if (e.num() == ETERM) return;
    }
  }
}

void make_curve_server(zmq::socket_t& socket, const CurveKeys& keys, const char* zap_domain) {
  socket.set(zmq::sockopt::curve_server, 1);
  socket.set(zmq::sockopt::curve_secretkey, keys.server.secret_key);
  socket.set(zmq::sockopt::zap_domain, zap_domain);
}

void make_curve_client(zmq::socket_t& socket, const CurveKeys& keys) {
  socket.set(zmq::sockopt::curve_serverkey, keys.server.public_key);
  socket.set(zmq::sockopt::curve_publickey, keys.client.public_key);
  socket.set(zmq::sockopt::curve_secretkey, keys.client.secret_key);
}

}  // namespace baton::control
