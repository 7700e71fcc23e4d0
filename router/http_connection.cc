#include "router/http_connection.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/field.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <cctype>
#include <cstdio>
#include <exception>
#include <random>

#include "router/api_error.h"
#include "router/http_request_reader.h"

namespace baton::router {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;

namespace {

// Pipelined bytes buffered while a reply is pending; past this the watch read
// stops (TCP pushes back) and a disconnect shows only when a write fails.
constexpr size_t kMaxWatchBufferBytes = 1u << 20;
constexpr size_t kWatchReadBytes = 16u << 10;
// After a final error reply, unread request bytes are drained for a while so
// the close does not turn into a reset that destroys the reply in flight.
constexpr std::chrono::milliseconds kLingerTimeout{2000};
constexpr size_t kMaxLingerBytes = 16u << 20;
constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";

std::string_view to_std(beast::string_view s) { return {s.data(), s.size()}; }

bool has_line_break(std::string_view s) {
  return s.find_first_of("\r\n") != std::string_view::npos;
}

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) !=
        std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

// Framing is the server's business; a handler's header must not contradict it.
bool is_framing_header(std::string_view name) {
  return iequals(name, "content-length") || iequals(name, "transfer-encoding") ||
         iequals(name, "connection");
}

// A status a status line can carry: a handler's out of range is a 500.
int wire_status(int status) { return status < 100 || status > 999 ? 500 : status; }

// "HTTP/1.1 200 OK\r\nServer: baton\r\n..." up to, not including, the blank line.
std::string response_head(int status, std::string_view content_type, bool keep_alive) {
  std::string_view reason = to_std(http::obsolete_reason(http::int_to_status(status)));
  if (http::int_to_status(status) == http::status::unknown) reason = "Unknown";
  if (has_line_break(content_type)) content_type = "application/octet-stream";
  std::string head = "HTTP/1.1 " + std::to_string(status) + " " + std::string(reason) +
                     "\r\nServer: baton\r\nContent-Type: " + std::string(content_type) + "\r\n";
  if (!keep_alive) head += "Connection: close\r\n";
  return head;
}

std::string error_body(int status, std::string type, std::string message) {
  ApiError error;
  error.http_status = status;
  error.type = std::move(type);
  error.message = std::move(message);
  return error.to_json().dump();
}

bool is_http_error(const beast::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::end_of_stream).category();
}

// The handler's view of one request. Every call hops onto the strand.
class ConnectionResponder final : public HttpResponder {
 public:
  ConnectionResponder(std::shared_ptr<HttpConnection> connection, uint64_t request_id)
      : connection_(std::move(connection)), request_id_(request_id) {}

  ~ConnectionResponder() override {
    connection_->post([c = connection_, id = request_id_] { c->on_responder_dropped(id); });
  }

  void respond(int status, std::string content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> extra_headers) override {
    connection_->post([c = connection_, id = request_id_, status, type = std::move(content_type),
                       body = std::move(body), extra = std::move(extra_headers)]() mutable {
      c->on_respond(id, status, std::move(type), std::move(body), std::move(extra));
    });
  }
  void start_stream(int status, std::string content_type) override {
    connection_->post(
        [c = connection_, id = request_id_, status, type = std::move(content_type)]() mutable {
          c->on_start_stream(id, status, std::move(type));
        });
  }
  void write(std::string chunk) override {
    if (chunk.empty()) return;  // a zero-length chunk would end the stream
    connection_->post([c = connection_, id = request_id_, chunk = std::move(chunk)]() mutable {
      c->on_write(id, std::move(chunk));
    });
  }
  void finish() override {
    connection_->post([c = connection_, id = request_id_] { c->on_finish(id); });
  }
  bool closed() const override { return connection_->closed(); }
  void on_close(std::function<void()> cb) override {
    connection_->post([c = connection_, id = request_id_, cb = std::move(cb)]() mutable {
      c->on_set_close_callback(id, std::move(cb));
    });
  }

 private:
  const std::shared_ptr<HttpConnection> connection_;
  const uint64_t request_id_;
};

}  // namespace

HttpConnection::HttpConnection(std::shared_ptr<HttpServerCore> core, tcp::socket socket)
    : core_(std::move(core)),
      socket_(std::move(socket)),
      strand_(socket_.get_executor()),
      timer_(strand_),
      write_timer_(strand_) {}

HttpConnection::~HttpConnection() {
  // A stopped io_context may drop a write's handler without running it.
  core_->unsent_bytes -= queued_bytes_ + in_flight_bytes_;
}

void HttpConnection::post(std::function<void()> fn) {
  core_->post_unless_stopped(strand_, std::move(fn));
}

void HttpConnection::start() {
  if (phase_ == Phase::kClosed) return;  // stop() got here first
  beast::error_code ec;
  socket_.set_option(tcp::no_delay(true), ec);  // SSE chunks go out as produced
  // Only the watch uses synchronous reads; they must never block the io thread.
  socket_.non_blocking(true, ec);
  if (ec) return close();
  read_next();
}

void HttpConnection::start_rejected() {
  if (phase_ == Phase::kClosed) return;
  ++request_id_;
  phase_ = Phase::kHandling;
  reply_error_and_close(503, "ServiceUnavailableError", "too many open connections");
}

// ---- Reading requests ------------------------------------------------------

void HttpConnection::read_next() {
  phase_ = Phase::kReading;
  parser_.emplace();
  limit_request_parser(*parser_, core_->config.max_body_bytes);
  arm_timer(core_->config.idle_timeout);
  http::async_read_header(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
}

void HttpConnection::on_header(beast::error_code ec) {
  if (phase_ != Phase::kReading) return;
  if (ec) return on_read_error(ec);
  // curl and others wait for this before sending a large body.
  if (iequals(to_std(parser_->get()[http::field::expect]), "100-continue")) {
    enqueue(std::string(kContinue), false);
  }
  http::async_read(
      socket_, buffer_, *parser_,
      [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
}

void HttpConnection::on_request(beast::error_code ec) {
  if (phase_ != Phase::kReading) return;
  if (ec) return on_read_error(ec);
  cancel_timer();
  dispatch(parser_->release());
}

void HttpConnection::on_read_error(beast::error_code ec) {
  cancel_timer();
  if (ec == http::error::body_limit) {
    ++request_id_;
    phase_ = Phase::kHandling;
    return reply_error_and_close(413, "BadRequestError",
                                 "request body exceeds the limit of " +
                                     std::to_string(core_->config.max_body_bytes) + " bytes");
  }
  // end_of_stream: the client closed between requests; partial_message: it left
  // mid-request. Neither has anyone left to answer.
  if (is_http_error(ec) && ec != http::error::end_of_stream && ec != http::error::partial_message) {
    ++request_id_;
    phase_ = Phase::kHandling;
    return reply_error_and_close(400, "BadRequestError", "malformed HTTP request: " + ec.message());
  }
  close();
}

void HttpConnection::dispatch(http::request<http::string_body> message) {
  keep_alive_ = message.keep_alive();
  head_request_ = message.method() == http::verb::head;
  HttpRequest request = to_http_request(std::move(message));
  // The handler sees the id and the response echoes it.
  x_request_id_ = request.header("x-request-id");

  ++request_id_;
  phase_ = Phase::kHandling;
  reply_ = Reply::kNone;
  on_close_ = nullptr;
  start_watch();

  auto responder = std::make_shared<ConnectionResponder>(shared_from_this(), request_id_);
  try {
    core_->handler(std::move(request), std::move(responder));
  } catch (const std::exception& e) {
    spdlog::error("http handler threw: {}", e.what());
    on_respond(request_id_, 500, "application/json",
               error_body(500, "InternalServerError", "internal error"), {});
  } catch (...) {
    spdlog::error("http handler threw a non-exception");
    on_respond(request_id_, 500, "application/json",
               error_body(500, "InternalServerError", "internal error"), {});
  }
}

void HttpConnection::reply_error_and_close(int status, std::string type, std::string message) {
  tell_reply(status);
  keep_alive_ = false;
  reply_ = Reply::kComplete;
  std::string body = error_body(status, std::move(type), std::move(message));
  std::string bytes = response_head(status, "application/json", false);
  // A full server (too many connections) may have room in a moment.
  if (status == 503) bytes += "Retry-After: 1\r\n";
  bytes += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  enqueue(std::move(bytes), true);
}

// ---- Replies (from responders) ----------------------------------------------

void HttpConnection::on_respond(uint64_t request_id, int status, std::string content_type,
                                std::string body,
                                std::vector<std::pair<std::string, std::string>> extra_headers) {
  if (request_id != request_id_ || phase_ != Phase::kHandling || reply_ != Reply::kNone) return;
  reply_ = Reply::kComplete;
  // Refused while the bound is passed already: a reply larger than the
  // bound still goes out when the others have been read.
  if (const size_t unsent = core_->unsent_bytes.load();
      body.size() > kSmallReplyBytes && unsent > core_->config.max_unsent_bytes) {
    spdlog::warn("http: a reply of {} bytes answered 503: {} bytes of replies are unread",
                 body.size(), unsent);
    status = 503;
    content_type = "application/json";
    body = error_body(503, "ServiceUnavailableError",
                      "the router holds " + std::to_string(unsent) +
                          " bytes of replies their clients have not read yet "
                          "(router.max_unsent_reply_bytes); retry later");
    extra_headers.clear();
  }
  status = wire_status(status);
  tell_reply(status);
  std::string bytes = response_head(status, content_type, keep_alive_);
  bytes += "X-Request-Id: " + x_request_id_ + "\r\n";
  for (const auto& [name, value] : extra_headers) {
    if (name.empty() || has_line_break(name) || name.find(':') != std::string::npos ||
        has_line_break(value) || is_framing_header(name) || iequals(name, "x-request-id")) {
      continue;
    }
    bytes += name + ": " + value + "\r\n";
  }
  bytes += "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n";
  if (!head_request_) bytes += body;
  enqueue(std::move(bytes), true);
}

void HttpConnection::on_start_stream(uint64_t request_id, int status, std::string content_type) {
  if (request_id != request_id_ || phase_ != Phase::kHandling || reply_ != Reply::kNone) return;
  reply_ = Reply::kStreaming;
  status = wire_status(status);
  tell_reply(status);
  enqueue(response_head(status, content_type, keep_alive_) + "X-Request-Id: " + x_request_id_ +
              "\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
          false);
}

void HttpConnection::on_write(uint64_t request_id, std::string chunk) {
  if (request_id != request_id_ || phase_ != Phase::kHandling || reply_ != Reply::kStreaming ||
      chunk.empty() || head_request_) {
    return;
  }
  char size[24];
  int n = std::snprintf(size, sizeof(size), "%zx\r\n", chunk.size());
  chunk.insert(0, size, static_cast<size_t>(n));
  chunk += "\r\n";
  enqueue(std::move(chunk), false);
}

void HttpConnection::on_finish(uint64_t request_id) {
  if (request_id != request_id_ || phase_ != Phase::kHandling || reply_ != Reply::kStreaming) {
    return;
  }
  reply_ = Reply::kComplete;
  enqueue(head_request_ ? std::string() : std::string("0\r\n\r\n"), true);
}

void HttpConnection::on_set_close_callback(uint64_t request_id, std::function<void()> cb) {
  if (request_id != request_id_) return;  // that reply finished long ago
  if (phase_ == Phase::kHandling) {
    on_close_ = std::move(cb);
  } else if (phase_ == Phase::kClosed && closed_mid_reply_ && cb) {
    cb();
  }
}

void HttpConnection::tell_reply(int status) {
  if (core_->config.on_reply) core_->config.on_reply(status);
}

void HttpConnection::on_responder_dropped(uint64_t request_id) {
  if (request_id != request_id_ || phase_ != Phase::kHandling) return;
  if (reply_ == Reply::kNone) {
    spdlog::warn("http handler dropped a request without replying");
    on_respond(request_id, 500, "application/json",
               error_body(500, "InternalServerError", "the request was dropped without a reply"),
               {});
  } else if (reply_ == Reply::kStreaming) {
    close();  // the client sees a truncated stream, not a clean end
  }
}

// ---- Write queue -------------------------------------------------------------

void HttpConnection::enqueue(std::string bytes, bool completes_reply) {
  if (phase_ == Phase::kClosed) return;
  queued_bytes_ += bytes.size();
  core_->unsent_bytes += bytes.size();
  if (!bytes.empty()) queued_.push_back(std::move(bytes));
  if (writing_ && queued_bytes_ > core_->config.max_queued_write_bytes) {
    // The client stopped reading: its output would grow without bound. (A
    // whole reply, however large, goes out when nothing waits ahead of it;
    // the write timeout bounds a client that then reads none of it.)
    spdlog::warn("http: dropping a client that left {} bytes unread", queued_bytes_);
    return close();
  }
  if (writing_ && queued_bytes_ > kSmallReplyBytes &&
      core_->unsent_bytes.load() > core_->config.max_unsent_bytes) {
    spdlog::warn(
        "http: dropping a client that left {} bytes unread while the server holds {} unread in "
        "all (router.max_unsent_reply_bytes)",
        queued_bytes_, core_->unsent_bytes.load());
    return close();
  }
  if (completes_reply) reply_complete_queued_ = true;
  pump_writes();
}

void HttpConnection::pump_writes() {
  if (writing_ || phase_ == Phase::kClosed) return;
  if (queued_.empty()) {
    if (reply_complete_queued_) reply_finished();
    return;
  }
  in_flight_.assign(std::make_move_iterator(queued_.begin()),
                    std::make_move_iterator(queued_.end()));
  queued_.clear();
  in_flight_bytes_ = std::exchange(queued_bytes_, 0);
  // A client that stops reading leaves the write pending forever.
  const uint64_t generation = ++write_generation_;
  write_timer_.expires_after(core_->config.write_timeout);
  write_timer_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
    if (ec || generation != self->write_generation_ || !self->writing_) return;
    spdlog::warn("http: dropping a client that read nothing for {} ms",
                 self->core_->config.write_timeout.count());
    self->close();
  });
  std::vector<asio::const_buffer> buffers;
  buffers.reserve(in_flight_.size());
  for (const auto& s : in_flight_) buffers.emplace_back(s.data(), s.size());
  writing_ = true;
  asio::async_write(socket_, buffers, [self = shared_from_this()](beast::error_code ec, size_t) {
    self->on_written(ec);
  });
}

void HttpConnection::on_written(beast::error_code ec) {
  writing_ = false;
  ++write_generation_;
  write_timer_.cancel();
  in_flight_.clear();
  core_->unsent_bytes -= std::exchange(in_flight_bytes_, 0);
  if (phase_ == Phase::kClosed) return;
  if (ec) return close();
  pump_writes();
}

void HttpConnection::reply_finished() {
  reply_complete_queued_ = false;
  on_close_ = nullptr;  // the reply is whole; a later disconnect is no news to the handler
  if (phase_ != Phase::kHandling) return;  // e.g. the 100 Continue path never completes a reply
  if (!keep_alive_) return linger_then_close();
  stop_watch();
  read_next();
}

// ---- Disconnect watch --------------------------------------------------------

void HttpConnection::start_watch() {
  if (watching_ || phase_ != Phase::kHandling) return;
  if (buffer_.size() >= kMaxWatchBufferBytes) return;  // let TCP push back
  watching_ = true;
  uint64_t generation = ++watch_generation_;
  socket_.async_wait(tcp::socket::wait_read,
                     [self = shared_from_this(), generation](beast::error_code ec) {
                       self->on_readable(ec, generation);
                     });
}

void HttpConnection::stop_watch() {
  if (!watching_) return;
  watching_ = false;
  ++watch_generation_;
  beast::error_code ignored;
  socket_.cancel(ignored);  // only the watch is pending: no write is in flight here
}

void HttpConnection::on_readable(beast::error_code ec, uint64_t generation) {
  if (generation != watch_generation_) return;
  watching_ = false;
  if (phase_ != Phase::kHandling) return;
  if (ec) {
    if (ec != asio::error::operation_aborted) close();
    return;
  }
  // Keep what arrived (a pipelined request) for the next parse; EOF or a reset
  // means the client is gone.
  size_t n = socket_.read_some(buffer_.prepare(kWatchReadBytes), ec);
  if (ec == asio::error::would_block || ec == asio::error::try_again) return start_watch();
  if (ec) return close();
  buffer_.commit(n);
  start_watch();
}

// ---- Closing -----------------------------------------------------------------

void HttpConnection::linger_then_close() {
  phase_ = Phase::kLingering;
  stop_watch();
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_send, ignored);
  buffer_.consume(buffer_.size());
  arm_timer(kLingerTimeout);
  linger_read();
}

void HttpConnection::linger_read() {
  socket_.async_read_some(buffer_.prepare(kWatchReadBytes),
                          [self = shared_from_this()](beast::error_code ec, size_t n) {
                            if (self->phase_ != Phase::kLingering) return;
                            self->lingered_bytes_ += n;
                            if (ec || self->lingered_bytes_ > kMaxLingerBytes) return self->close();
                            self->linger_read();  // discard: nothing reads buffer_ any more
                          });
}

void HttpConnection::close() {
  if (phase_ == Phase::kClosed) return;
  bool mid_reply = phase_ == Phase::kHandling;
  phase_ = Phase::kClosed;
  closed_mid_reply_ = mid_reply;
  closed_.store(true, std::memory_order_release);
  cancel_timer();
  watching_ = false;
  beast::error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  ++write_generation_;
  write_timer_.cancel();
  queued_.clear();
  core_->unsent_bytes -= std::exchange(queued_bytes_, 0);  // in_flight_ goes once written
  core_->remove_connection(this);
  if (std::function<void()> cb = std::exchange(on_close_, nullptr); cb && mid_reply) {
    try {
      cb();
    } catch (const std::exception& e) {
      spdlog::error("http on_close callback threw: {}", e.what());
    } catch (...) {
      spdlog::error("http on_close callback threw a non-exception");
    }
  }
}

void HttpConnection::arm_timer(std::chrono::milliseconds timeout) {
  uint64_t generation = ++timer_generation_;
  timer_.expires_after(timeout);
  timer_.async_wait([self = shared_from_this(), generation](beast::error_code ec) {
    if (!ec && generation == self->timer_generation_) self->close();
  });
}

void HttpConnection::cancel_timer() {
  ++timer_generation_;
  timer_.cancel();
}

}  // namespace baton::router
