// router/http_connection.h — one accepted connection of HttpServer, and the
// state every connection shares with the listener. Internal to http_server.cc
// and http_connection.cc; users include router/http_server.h only.
//
// Every member of HttpConnection except the thread-safe entry points is touched
// only on the connection's strand.
#pragma once

#include <atomic>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/string_body.hpp>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "router/http_request_reader.h"
#include "router/http_server.h"

namespace baton::router {

class HttpConnection;

// What the listener and every connection share. Each connection holds it, so
// the io_context outlives every socket — including a socket that a responder
// keeps alive after the HttpServer object is gone.
struct HttpServerCore {
  HttpServerCore(HttpServerConfig config, HttpHandler handler);

  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor;  // on its own strand
  boost::asio::steady_timer accept_retry;   // backs off after accept errors (EMFILE)
  const HttpServerConfig config;
  const HttpHandler handler;
  // Reply bytes queued or being written on every connection (max_unsent_bytes).
  std::atomic<size_t> unsent_bytes{0};

  enum class Admission { kAdmitted, kOverLimit, kStopped };
  // Registers a new connection. Over max_connections it is registered anyway
  // (so stop() can close it) but told to answer 503.
  Admission add_connection(const std::shared_ptr<HttpConnection>& connection);
  void remove_connection(const HttpConnection* connection);
  int32_t connection_count() const;

  // Queues `fn` on a connection's strand unless stop() has begun. After that
  // nothing more is queued, so the io_context drains and no queued handler keeps
  // a connection (and through it this core) alive.
  void post_unless_stopped(const boost::asio::any_io_executor& strand, std::function<void()> fn);

  // Marks the core stopped and returns every registered connection.
  std::vector<std::shared_ptr<HttpConnection>> begin_stop();
  // Waits until every connection has closed or `timeout` passed.
  bool wait_until_no_connections(std::chrono::milliseconds timeout);

 private:
  mutable std::mutex mutex_;
  std::condition_variable connections_changed_;
  bool stopped_ = false;
  std::unordered_map<const HttpConnection*, std::weak_ptr<HttpConnection>> connections_;
};

class HttpConnection : public std::enable_shared_from_this<HttpConnection> {
 public:
  HttpConnection(std::shared_ptr<HttpServerCore> core, boost::asio::ip::tcp::socket socket);
  ~HttpConnection();  // gives back what it still counts in core->unsent_bytes

  const boost::asio::any_io_executor& strand() const { return strand_; }

  // On the strand.
  void start();           // reads the first request
  void start_rejected();  // answers 503 (max_connections reached), then closes
  void close();           // idempotent; fires on_close if a request was pending

  // Any thread: queue the matching on_* call onto the strand.
  void post(std::function<void()> fn);
  bool closed() const { return closed_.load(std::memory_order_acquire); }

  // On the strand, for the request numbered `request_id`; calls for any other
  // request, or out of order (write before start_stream), are ignored.
  void on_respond(uint64_t request_id, int status, std::string content_type, std::string body,
                  std::vector<std::pair<std::string, std::string>> extra_headers);
  void on_start_stream(uint64_t request_id, int status, std::string content_type);
  void on_write(uint64_t request_id, std::string chunk);
  void on_finish(uint64_t request_id);
  void on_set_close_callback(uint64_t request_id, std::function<void()> cb);
  void on_responder_dropped(uint64_t request_id);

 private:
  enum class Phase {
    kReading,    // waiting for / parsing a request; the idle timer runs
    kHandling,   // a request is out with its responder, or an error reply is being sent
    kLingering,  // final reply sent; draining the client's unread bytes before closing
    kClosed,
  };
  enum class Reply { kNone, kStreaming, kComplete };

  void read_next();
  void on_header(boost::beast::error_code ec);
  void on_request(boost::beast::error_code ec);
  void on_read_error(boost::beast::error_code ec);
  void dispatch(boost::beast::http::request<boost::beast::http::string_body> message);
  void reply_error_and_close(int status, std::string type, std::string message);
  void tell_reply(int status);  // config.on_reply

  void enqueue(std::string bytes, bool completes_reply);
  void pump_writes();
  void on_written(boost::beast::error_code ec);
  void reply_finished();

  void start_watch();
  void stop_watch();
  void on_readable(boost::beast::error_code ec, uint64_t generation);

  void linger_then_close();
  void linger_read();

  void arm_timer(std::chrono::milliseconds timeout);
  void cancel_timer();

  const std::shared_ptr<HttpServerCore> core_;
  boost::asio::ip::tcp::socket socket_;
  const boost::asio::any_io_executor strand_;
  boost::asio::steady_timer timer_;  // idle timeout while reading, linger deadline
  uint64_t timer_generation_ = 0;
  boost::asio::steady_timer write_timer_;  // the write in flight's deadline
  uint64_t write_generation_ = 0;

  // Bytes read but not yet parsed; the watch read appends pipelined data here.
  boost::beast::flat_buffer buffer_;
  std::optional<RequestParser> parser_;

  Phase phase_ = Phase::kReading;
  Reply reply_ = Reply::kNone;
  uint64_t request_id_ = 0;  // numbers the requests handed out; responders carry theirs
  // The current request's X-Request-Id (the client's, or one made here),
  // echoed on its response.
  std::string x_request_id_;
  bool keep_alive_ = true;
  bool head_request_ = false;  // HEAD: headers only
  std::function<void()> on_close_;
  bool closed_mid_reply_ = false;  // closed while request_id_'s reply was unfinished
  std::atomic<bool> closed_{false};

  // Write queue: one async_write at a time, everything queued since goes out
  // together in the next. Unbounded (see HttpResponder).
  std::deque<std::string> queued_;
  size_t queued_bytes_ = 0;  // of queued_
  std::vector<std::string> in_flight_;
  size_t in_flight_bytes_ = 0;  // of in_flight_ (queued_bytes_ and it count in unsent_bytes)
  bool writing_ = false;
  bool reply_complete_queued_ = false;  // the reply's last bytes are queued or in flight

  bool watching_ = false;  // an async_wait for readability is pending
  uint64_t watch_generation_ = 0;
  size_t lingered_bytes_ = 0;
};

}  // namespace baton::router
