// router/http_server.h — the router's HTTP/1.1 server (Boost.Beast over Asio).
//
// Parses requests, hands each one to an HttpHandler with an HttpResponder, and
// sends what the responder is given: whole responses or chunked streams (SSE).
// It knows nothing of the OpenAI API; the router's endpoints sit on top. Boost
// stays out of this header so users of the server compile without it.
//
// Per connection: keep-alive, pipelined requests answered in order (the next
// request is parsed only once the current response has been sent), a read kept
// pending while a response is outstanding so a vanished client is noticed in
// milliseconds, malformed HTTP answered with a JSON 400 (413 for bodies over
// the limit) and the connection closed. A client that half-closes (shuts down
// its sending side) while its reply is pending counts as gone.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "common/request_limits.h"
#include "common/status.h"

namespace baton::router {

using baton::kMaxRequestBodyBytes;  // common/request_limits.h

// Replies this small always go out, whatever max_unsent_bytes says: errors,
// and what a full server answers instead of a large reply.
inline constexpr size_t kSmallReplyBytes = size_t(64) << 10;

struct HttpServerConfig {
  std::string host = "127.0.0.1";
  uint16_t port = 0;    // 0: the OS picks one; HttpServer::port() tells which
  int32_t threads = 1;  // io threads
  size_t max_body_bytes = kMaxRequestBodyBytes;  // larger bodies: 413 with a JSON error
  // Keep-alive connections idle this long are closed. It also bounds how long
  // one request may take to arrive, from its first byte to its last.
  std::chrono::milliseconds idle_timeout{60000};
  int32_t max_connections = 4096;  // over it: 503 + close
  // A client that does not read what it is sent is dropped (and its request
  // cancelled, as on a disconnect) once a write has waited this long, or once
  // this many bytes wait behind the write in flight.
  std::chrono::milliseconds write_timeout{30000};
  size_t max_queued_write_bytes = 4u << 20;
  // Bytes of replies the server holds unread by their clients, across all
  // connections (a few thousand clients that read nothing could otherwise
  // hold a large reply each until their write timeouts): while more are
  // held, a whole reply larger than kSmallReplyBytes is answered 503
  // instead, and a client behind on its stream is dropped.
  size_t max_unsent_bytes = size_t(1) << 30;
  // Told (on an io thread) the status of each reply as it goes out: the
  // handler's, or the one the server makes in its place (a malformed
  // request's 400, 413, the 503s for too many connections or unread bytes,
  // the 500 of a handler that threw or dropped its responder). A reply to a
  // client that has gone is not told. Optional.
  std::function<void(int status)> on_reply;
};

struct HttpRequest {
  std::string method;  // "GET", "POST", ...
  std::string target;  // "/v1/completions" (query string kept as sent)
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string header(std::string_view lower_name) const;     // "" if absent
};

// One request's reply channel. Thread-safe: any thread may call any method;
// calls are serialised onto the connection's strand, in the order one thread
// made them. Exactly one of respond() or start_stream()+...+finish() is used per
// request; later calls are ignored, and so is every call once the connection
// is gone or the server stopped. A responder outliving its connection or the
// server is harmless.
//
// Dropping the last reference without responding sends a 500; dropping it with
// a stream still open closes the connection, so the client sees a truncated
// stream rather than a clean end.
//
// Writes are queued without bound: streams are produced at token rate, far
// below what a socket drains, so a bound would only add a failure mode. A
// client that stops reading holds its queued chunks until it leaves.
class HttpResponder {
 public:
  virtual ~HttpResponder() = default;
  // A complete response with Content-Length. Headers whose name or value holds
  // CR or LF are dropped.
  virtual void respond(int status, std::string content_type, std::string body,
                       std::vector<std::pair<std::string, std::string>> extra_headers = {}) = 0;
  // Starts a chunked streaming response (SSE: "text/event-stream", Cache-Control: no-cache).
  virtual void start_stream(int status, std::string content_type = "text/event-stream") = 0;
  virtual void write(std::string chunk) = 0;  // one HTTP chunk, sent in order; "" is skipped
  virtual void finish() = 0;                  // final zero-length chunk
  // True once the client is gone (connection closed/reset or timed out).
  virtual bool closed() const = 0;
  // `cb` runs once (on an io thread) if the client disconnects before the
  // response finished — including while a stream is open and idle. Set it
  // right away in the handler; if already closed, it runs immediately.
  // stop() counts as a disconnect; a callback set after stop() never runs.
  virtual void on_close(std::function<void()> cb) = 0;
};

// Called on an io thread for every parsed request; must not block (hand work
// to another thread and reply later through the responder). An exception it
// throws is answered with a 500.
using HttpHandler = std::function<void(HttpRequest, std::shared_ptr<HttpResponder>)>;

struct HttpServerCore;  // http_connection.h

class HttpServer {
 public:
  // Binds and listens (error Status naming host:port if it cannot), starts the io threads.
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerConfig& config,
                                                   HttpHandler handler);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  uint16_t port() const;
  // Stops accepting, closes every connection, joins the io threads. Idempotent.
  // Must not be called from a handler or callback (it joins the io threads).
  void stop();
  int32_t open_connections() const;
  // Reply bytes queued or being written, unread by their clients yet.
  size_t unsent_bytes() const;

 private:
  HttpServer() = default;

  std::shared_ptr<HttpServerCore> core_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::mutex stop_mutex_;
  bool stopped_ = false;
};

}  // namespace baton::router
