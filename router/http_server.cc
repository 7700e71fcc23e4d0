#include "router/http_server.h"

#include <spdlog/spdlog.h>

#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>

#include "router/http_connection.h"

namespace baton::router {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

namespace {

// stop() gives connections this long to close on their own strands before the
// io threads are stopped and the rest are closed from the stopping thread.
constexpr std::chrono::milliseconds kStopGrace{1000};
// After an accept error (out of file descriptors), wait before the next accept
// rather than spinning.
constexpr std::chrono::milliseconds kAcceptRetryDelay{50};

void accept_next(const std::shared_ptr<HttpServerCore>& core);

void on_accept(const std::shared_ptr<HttpServerCore>& core, boost::system::error_code ec,
               tcp::socket socket) {
  if (ec == asio::error::operation_aborted || !core->acceptor.is_open()) return;
  if (ec) {
    spdlog::warn("http accept failed: {}", ec.message());
    core->accept_retry.expires_after(kAcceptRetryDelay);
    core->accept_retry.async_wait([core](boost::system::error_code wait_ec) {
      if (!wait_ec && core->acceptor.is_open()) accept_next(core);
    });
    return;
  }
  auto connection = std::make_shared<HttpConnection>(core, std::move(socket));
  switch (core->add_connection(connection)) {
    case HttpServerCore::Admission::kAdmitted:
      asio::post(connection->strand(), [connection] { connection->start(); });
      break;
    case HttpServerCore::Admission::kOverLimit:
      asio::post(connection->strand(), [connection] { connection->start_rejected(); });
      break;
    case HttpServerCore::Admission::kStopped:
      return;  // the socket closes with `connection`
  }
  accept_next(core);
}

void accept_next(const std::shared_ptr<HttpServerCore>& core) {
  // Each connection gets its own strand, so its handlers never run concurrently.
  core->acceptor.async_accept(asio::make_strand(core->io),
                              [core](boost::system::error_code ec, tcp::socket socket) {
                                on_accept(core, ec, std::move(socket));
                              });
}

std::string host_port(const std::string& host, uint16_t port) {
  bool ipv6 = host.find(':') != std::string::npos;
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

}  // namespace

// ---- HttpServerCore ----------------------------------------------------------

HttpServerCore::HttpServerCore(HttpServerConfig config_in, HttpHandler handler_in)
    : acceptor(asio::make_strand(io)),
      accept_retry(acceptor.get_executor()),
      config(std::move(config_in)),
      handler(std::move(handler_in)) {}

HttpServerCore::Admission HttpServerCore::add_connection(
    const std::shared_ptr<HttpConnection>& connection) {
  std::lock_guard lock(mutex_);
  if (stopped_) return Admission::kStopped;
  bool over_limit = static_cast<int64_t>(connections_.size()) >= config.max_connections;
  connections_.emplace(connection.get(), connection);
  return over_limit ? Admission::kOverLimit : Admission::kAdmitted;
}

void HttpServerCore::remove_connection(const HttpConnection* connection) {
  {
    std::lock_guard lock(mutex_);
    connections_.erase(connection);
  }
  connections_changed_.notify_all();
}

int32_t HttpServerCore::connection_count() const {
  std::lock_guard lock(mutex_);
  return static_cast<int32_t>(connections_.size());
}

void HttpServerCore::post_unless_stopped(const asio::any_io_executor& strand,
                                         std::function<void()> fn) {
  {
    std::lock_guard lock(mutex_);
    if (!stopped_) {
      asio::post(strand, std::move(fn));
      return;
    }
  }
  // Dropped outside the lock: `fn` may own a responder whose destructor posts.
  fn = nullptr;
}

std::vector<std::shared_ptr<HttpConnection>> HttpServerCore::begin_stop() {
  std::lock_guard lock(mutex_);
  stopped_ = true;
  std::vector<std::shared_ptr<HttpConnection>> live;
  for (const auto& [key, weak] : connections_) {
    if (auto connection = weak.lock()) live.push_back(std::move(connection));
  }
  return live;
}

bool HttpServerCore::wait_until_no_connections(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  return connections_changed_.wait_for(lock, timeout, [&] { return connections_.empty(); });
}

// ---- HttpServer --------------------------------------------------------------

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerConfig& config,
                                                      HttpHandler handler) {
  if (config.threads < 1) return invalid_argument("http threads must be at least 1");
  if (config.max_connections < 1) return invalid_argument("http max_connections must be >= 1");
  if (config.idle_timeout.count() <= 0) return invalid_argument("http idle_timeout must be > 0");
  if (!handler) return invalid_argument("http handler is empty");

  auto core = std::make_shared<HttpServerCore>(config, std::move(handler));
  std::string where = host_port(config.host, config.port);
  boost::system::error_code ec;
  tcp::resolver resolver(core->io);
  auto endpoints = resolver.resolve(config.host, std::to_string(config.port),
                                    tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) {
    return unavailable("cannot listen on " + where + ": " +
                       (ec ? ec.message() : std::string("no address")));
  }
  tcp::endpoint endpoint = endpoints.begin()->endpoint();
  auto fail = [&](std::string_view step) {
    return unavailable("cannot listen on " + where + ": " + std::string(step) + ": " +
                       ec.message());
  };
  if (core->acceptor.open(endpoint.protocol(), ec); ec) return fail("open");
  if (core->acceptor.set_option(tcp::acceptor::reuse_address(true), ec); ec) return fail("option");
  if (core->acceptor.bind(endpoint, ec); ec) return fail("bind");
  if (core->acceptor.listen(asio::socket_base::max_listen_connections, ec); ec) {
    return fail("listen");
  }
  uint16_t port = core->acceptor.local_endpoint(ec).port();
  if (ec) return fail("local_endpoint");

  std::unique_ptr<HttpServer> server(new HttpServer());
  server->core_ = core;
  server->port_ = port;
  accept_next(core);
  for (int32_t i = 0; i < config.threads; ++i) {
    server->threads_.emplace_back([core] { core->io.run(); });
  }
  return server;
}

HttpServer::~HttpServer() { stop(); }

uint16_t HttpServer::port() const { return port_; }

int32_t HttpServer::open_connections() const { return core_->connection_count(); }

size_t HttpServer::unsent_bytes() const { return core_->unsent_bytes.load(); }

void HttpServer::stop() {
  std::lock_guard lock(stop_mutex_);
  if (stopped_) return;
  stopped_ = true;

  auto live = core_->begin_stop();  // no more connections, no more responder posts
  asio::post(core_->acceptor.get_executor(), [core = core_] {
    boost::system::error_code ignored;
    core->acceptor.close(ignored);
    core->accept_retry.cancel();
  });
  for (const auto& connection : live) {
    asio::post(connection->strand(), [connection] { connection->close(); });
  }
  core_->wait_until_no_connections(kStopGrace);

  core_->io.stop();
  for (auto& thread : threads_) thread.join();
  threads_.clear();

  // No io thread runs now, so whatever did not close in time can be closed
  // here; then run the completions that closing produced, which frees every
  // connection not held by a responder.
  boost::system::error_code ignored;
  core_->acceptor.close(ignored);
  core_->accept_retry.cancel();
  for (const auto& connection : live) connection->close();
  live.clear();
  core_->io.restart();
  core_->io.poll();
}

}  // namespace baton::router
