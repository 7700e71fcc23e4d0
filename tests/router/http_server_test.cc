#include "router/http_server.h"

#include <gtest/gtest.h>
#include <fstream>
#include <optional>
#include <random>
#include <sstream>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

namespace baton::router {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;
using Response = http::response<http::string_body>;

constexpr auto kClientTimeout = 5s;  // a hung server fails the test instead of hanging it

std::string str(beast::string_view s) { return std::string(s.data(), s.size()); }

// A blocking HTTP client whose every read gives up after kClientTimeout.
class Client {
 public:
  explicit Client(uint16_t port) : socket_(io_) {
    socket_.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port));
  }

  void send(std::string_view bytes) { asio::write(socket_, asio::buffer(bytes)); }
  uint16_t local_port() const { return socket_.local_endpoint().port(); }

  // One response; a chunked body arrives de-chunked, and each chunk is also
  // appended to `chunks` when given.
  beast::error_code read(Response& out, std::vector<std::string>* chunks = nullptr) {
    http::response_parser<http::string_body> parser;
    parser.body_limit(64u << 20);
    auto on_header = [&](uint64_t size, beast::string_view, beast::error_code&) {
      if (size > 0) chunks->emplace_back();
    };
    auto on_body = [&](uint64_t, beast::string_view body, beast::error_code&) {
      chunks->back().append(body.data(), body.size());
      return body.size();
    };
    if (chunks != nullptr) {
      parser.on_chunk_header(on_header);
      parser.on_chunk_body(on_body);
    }
    beast::error_code result;
    run([&](auto done) { http::async_read(socket_, buffer_, parser, done); }, result);
    if (!result) out = parser.release();
    return result;
  }

  // Reads the status line and headers of a response only.
  beast::error_code read_header(http::response_parser<http::string_body>& parser) {
    beast::error_code result;
    run([&](auto done) { http::async_read_header(socket_, buffer_, parser, done); }, result);
    return result;
  }

  // True if the server closes the connection (EOF or reset) within `timeout`.
  bool closed_by_server(std::chrono::milliseconds timeout) {
    beast::error_code result;
    char byte;
    run([&](auto done) { socket_.async_read_some(asio::buffer(&byte, 1), done); }, result, timeout);
    return result && result != asio::error::timed_out;
  }

  void close() {
    beast::error_code ignored;
    socket_.close(ignored);
  }

 private:
  // Runs one async operation for at most `timeout`; `result` gets its error, or
  // timed_out.
  template <typename Start>
  void run(Start start, beast::error_code& result,
           std::chrono::milliseconds timeout = kClientTimeout) {
    bool done = false;
    start([&](beast::error_code ec, size_t = 0) {
      result = ec;
      done = true;
    });
    io_.restart();
    io_.run_for(timeout);
    if (!done) {
      socket_.cancel();
      io_.restart();
      io_.run();
      result = asio::error::timed_out;
    }
  }

  asio::io_context io_;
  tcp::socket socket_;
  beast::flat_buffer buffer_;
};

std::string get(std::string_view target, std::string_view extra_headers = "") {
  return "GET " + std::string(target) + " HTTP/1.1\r\nHost: t\r\n" + std::string(extra_headers) +
         "\r\n";
}

// `bytes` random lowercase letters, fresh each run.
std::string random_letters(size_t bytes) {
  std::mt19937_64 rng(std::random_device{}());
  std::string text(bytes, '\0');
  for (char& c : text) c = char('a' + rng() % 26);
  return text;
}

// A one-shot flag to wait on with a bound.
class Event {
 public:
  // Notifies under the lock: a waiter may destroy the Event as soon as it wakes.
  void set() {
    std::lock_guard lock(mutex_);
    set_ = true;
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [&] { return set_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool set_ = false;
};

class HttpServerTest : public ::testing::Test {
 protected:
  // Stops the server and joins the workers when a test's body ends — before
  // the locals its handlers and callbacks refer to go away, even on failure.
  struct Running {
    HttpServerTest* test;
    ~Running() { test->shutdown(); }
  };
  [[nodiscard]] Running start(HttpHandler handler, HttpServerConfig config = {}) {
    auto server = HttpServer::start(config, std::move(handler));
    if (!server.is_ok()) throw std::runtime_error(server.status().to_string());
    server_ = std::move(server).value();
    return Running{this};
  }
  // Runs `fn` on a thread of its own, joined before the server stops.
  void later(std::function<void()> fn) {
    std::lock_guard lock(mutex_);
    workers_.emplace_back(std::move(fn));
  }
  // Starts a stream of `chunk_bytes` chunks, a millisecond apart, written by
  // a thread of its own until the responder closes or `stop` is set.
  void firehose(std::shared_ptr<HttpResponder> responder, std::atomic<bool>& stop,
                size_t chunk_bytes) {
    responder->start_stream(200);
    later([responder, &stop, chunk_bytes] {
      const std::string chunk(chunk_bytes, 'x');
      while (!stop.load() && !responder->closed()) {
        responder->write(chunk);
        std::this_thread::sleep_for(1ms);
      }
    });
  }
  // Keeps a responder alive for the whole test, so a dropped responder cannot
  // be what ends a stream.
  void keep(std::shared_ptr<HttpResponder> responder) {
    std::lock_guard lock(mutex_);
    kept_.push_back(std::move(responder));
  }
  // Server first, so no handler starts another worker; then the workers.
  void shutdown() {
    if (server_) server_->stop();
    std::vector<std::thread> workers;
    {
      std::lock_guard lock(mutex_);
      workers.swap(workers_);
    }
    for (auto& worker : workers) worker.join();
  }
  bool wait_for_connections(int32_t n, std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    while (server_->open_connections() != n) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      std::this_thread::sleep_for(1ms);
    }
    return true;
  }

  std::unique_ptr<HttpServer> server_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::vector<std::shared_ptr<HttpResponder>> kept_;
};

void expect_json_error(const Response& response, int status) {
  EXPECT_EQ(response.result_int(), static_cast<unsigned>(status));
  EXPECT_EQ(str(response[http::field::content_type]), "application/json");
  auto body = nlohmann::json::parse(response.body(), nullptr, false);
  ASSERT_TRUE(body.is_object()) << response.body();
  const auto& error = body["error"];
  EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
  EXPECT_EQ(error["type"], "BadRequestError");
  EXPECT_TRUE(error["param"].is_null());
  EXPECT_EQ(error["code"], status);
}

TEST_F(HttpServerTest, PostRoundTripCarriesTargetHeadersAndBody) {
  std::mutex mutex;
  std::vector<HttpRequest> seen;
  auto running = start([&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    std::string reply = request.method + " " + request.target + " " + request.body;
    {
      std::lock_guard lock(mutex);
      seen.push_back(std::move(request));
    }
    responder->respond(201, "text/plain", reply, {{"X-Reply", "yes"}, {"Bad", "a\r\nInjected: 1"}});
  });
  Client client(server_->port());
  client.send(
      "POST /v1/completions?stream=0 HTTP/1.1\r\nHost: t\r\nX-Test: Abc\r\n"
      "Content-Length: 5\r\n\r\nhello");
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.result_int(), 201u);
  EXPECT_EQ(response.body(), "POST /v1/completions?stream=0 hello");
  EXPECT_EQ(str(response[http::field::server]), "baton");
  EXPECT_EQ(str(response[http::field::content_type]), "text/plain");
  EXPECT_EQ(str(response["X-Reply"]), "yes");
  EXPECT_EQ(response.count("Injected"), 0u);
  EXPECT_EQ(response.count("Bad"), 0u);

  client.send(get("/health"));
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.body(), "GET /health ");

  std::lock_guard lock(mutex);
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[0].header("x-test"), "Abc");
  EXPECT_EQ(seen[0].header("content-length"), "5");
  EXPECT_EQ(seen[0].header("absent"), "");
  for (const auto& [name, value] : seen[0].headers) {
    EXPECT_TRUE(std::none_of(name.begin(), name.end(), [](unsigned char c) {
      return std::isupper(c);
    })) << name;
  }
}

TEST_F(HttpServerTest, KeepAliveServesSequentialRequestsOnOneConnection) {
  auto running = start([](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    responder->respond(200, "text/plain", request.target);
  });
  Client client(server_->port());
  for (std::string target : {"/one", "/two", "/three"}) {
    client.send(get(target));
    Response response;
    ASSERT_FALSE(client.read(response));
    EXPECT_EQ(response.body(), target);
    EXPECT_TRUE(response.keep_alive());
  }
  EXPECT_EQ(server_->open_connections(), 1);
}

TEST_F(HttpServerTest, PipelinedRequestsAreHandledOneAtATimeInOrder) {
  std::mutex mutex;
  std::vector<std::string> events;
  auto log = [&](std::string e) {
    std::lock_guard lock(mutex);
    events.push_back(std::move(e));
  };
  auto running = start([&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    log("handle " + request.target);
    if (request.target == "/slow") {
      later([&, responder] {
        std::this_thread::sleep_for(50ms);
        log("reply /slow");
        responder->respond(200, "text/plain", "/slow");
      });
    } else {
      responder->respond(200, "text/plain", request.target);
    }
  });
  Client client(server_->port());
  client.send(get("/slow") + get("/fast"));
  Response first, second;
  ASSERT_FALSE(client.read(first));
  ASSERT_FALSE(client.read(second));
  EXPECT_EQ(first.body(), "/slow");
  EXPECT_EQ(second.body(), "/fast");
  std::lock_guard lock(mutex);
  EXPECT_EQ(events, (std::vector<std::string>{"handle /slow", "reply /slow", "handle /fast"}));
}

// Bytes waiting unread in the receive queue of the server's end of the
// connection from `client_port` to `server_port`, as /proc/net/tcp shows
// them; nullopt when the connection is not listed.
std::optional<uint64_t> server_unread_bytes(uint16_t server_port, uint16_t client_port) {
  std::ifstream table("/proc/net/tcp");
  std::string line;
  std::getline(table, line);  // the header
  while (std::getline(table, line)) {
    // sl local_address rem_address st tx_queue:rx_queue ...
    std::istringstream fields(line);
    std::string slot, local, remote, state, queues;
    fields >> slot >> local >> remote >> state >> queues;
    auto port_of = [](const std::string& address) {
      return uint16_t(std::stoul(address.substr(address.find(':') + 1), nullptr, 16));
    };
    if (port_of(local) != server_port || port_of(remote) != client_port) continue;
    return std::stoull(queues.substr(queues.find(':') + 1), nullptr, 16);
  }
  return std::nullopt;
}

// The second request arrives while the first is pending, so the disconnect
// watch reads it; it must be kept for the next parse, not dropped.
TEST_F(HttpServerTest, RequestSentWhileReplyPendingIsKept) {
  Event first_handled;
  std::shared_ptr<HttpResponder> first;
  auto running = start([&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    if (request.target == "/first") {
      std::lock_guard lock(mutex_);
      first = responder;
      first_handled.set();
      return;
    }
    responder->respond(200, "text/plain", request.target);
  });
  Client client(server_->port());
  client.send(get("/first"));
  ASSERT_TRUE(first_handled.wait(1000ms));
  client.send(get("/second"));
  // The premise: the watch has read the second request off the socket
  // (nothing waits unread on the server's end) before the first is answered.
  std::optional<uint64_t> unread;
  for (auto until = std::chrono::steady_clock::now() + 2s; std::chrono::steady_clock::now() < until;
       std::this_thread::sleep_for(1ms)) {
    unread = server_unread_bytes(server_->port(), client.local_port());
    if (unread == 0u) break;
  }
  ASSERT_EQ(unread, 0u) << "the disconnect watch never read the pipelined request";
  {
    std::lock_guard lock(mutex_);
    first->respond(200, "text/plain", "/first");
  }
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.body(), "/first");
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.body(), "/second");
}

TEST_F(HttpServerTest, ManyClientsOnFourIoThreads) {
  HttpServerConfig config;
  config.threads = 4;
  auto running = start(
      [&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        if (request.target.ends_with("/stream")) {
          responder->start_stream(200);
          later([responder, body = request.body] {
            for (char c : body) responder->write(std::string(1, c));
            responder->finish();
          });
        } else {
          responder->respond(200, "text/plain", request.body);
        }
      },
      config);
  constexpr int kClients = 8;
  constexpr int kRequests = 20;
  std::atomic<int> good = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      Client client(server_->port());
      for (int i = 0; i < kRequests; ++i) {
        std::string body = std::to_string(c) + "-" + std::to_string(i);
        std::string target = i % 2 ? "/stream" : "/plain";
        client.send("POST " + target + " HTTP/1.1\r\nHost: t\r\nContent-Length: " +
                    std::to_string(body.size()) + "\r\n\r\n" + body);
        Response response;
        if (!client.read(response) && response.body() == body) ++good;
      }
    });
  }
  for (auto& client : clients) client.join();
  EXPECT_EQ(good.load(), kClients * kRequests);
}

TEST_F(HttpServerTest, HandlerRepliesFromAnotherThreadLater) {
  auto running = start([&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
    later([responder] {
      std::this_thread::sleep_for(50ms);
      responder->respond(200, "application/json", R"({"ok":true})");
    });
  });
  Client client(server_->port());
  auto begin = std::chrono::steady_clock::now();
  client.send(get("/later"));
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_GE(std::chrono::steady_clock::now() - begin, 50ms);
  EXPECT_EQ(response.body(), R"({"ok":true})");
}

TEST_F(HttpServerTest, StreamDeliversChunksInOrderThenKeepsTheConnection) {
  auto running = start([&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    if (request.target != "/stream") return responder->respond(200, "text/plain", "after");
    responder->start_stream(200);
    later([responder] {
      for (int i = 1; i <= 3; ++i) {
        responder->write("data: " + std::to_string(i) + "\n\n");
        std::this_thread::sleep_for(5ms);
      }
      responder->finish();
      responder->write("ignored after finish");
    });
  });
  Client client(server_->port());
  client.send(get("/stream"));
  Response response;
  std::vector<std::string> chunks;
  ASSERT_FALSE(client.read(response, &chunks));
  EXPECT_EQ(response.result_int(), 200u);
  EXPECT_EQ(str(response[http::field::content_type]), "text/event-stream");
  EXPECT_EQ(str(response[http::field::cache_control]), "no-cache");
  EXPECT_TRUE(response.chunked());
  EXPECT_EQ(chunks, (std::vector<std::string>{"data: 1\n\n", "data: 2\n\n", "data: 3\n\n"}));

  client.send(get("/next"));
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.body(), "after");
}

// X-Request-Id, as vLLM treats it: the client's is handed to the handler
// and echoed on the response, plain or streamed; without one (or with one
// unfit for a header or a log line) a fresh id is made and echoed.
TEST_F(HttpServerTest, RequestIdsAreEchoedOrMade) {
  std::mutex mutex;
  std::vector<std::string> seen;
  size_t most_ids = 0;  // X-Request-Id headers the handler saw in one request
  auto running = start([&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    {
      std::lock_guard lock(mutex);
      seen.push_back(request.header("x-request-id"));
      most_ids = std::max<size_t>(
          most_ids, std::count_if(request.headers.begin(), request.headers.end(),
                                  [](const auto& h) { return h.first == "x-request-id"; }));
    }
    if (request.target != "/stream") {
      return responder->respond(200, "text/plain", "ok", {{"X-Request-Id", "forged"}});
    }
    responder->start_stream(200);
    responder->write("data: 1\n\n");
    responder->finish();
  });
  Client client(server_->port());
  Response response;
  client.send(get("/plain", "X-Request-Id: client-id-42\r\n"));
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(str(response["X-Request-Id"]), "client-id-42");
  EXPECT_EQ(response.count("X-Request-Id"), 1u);  // the handler's own is dropped
  client.send(get("/stream", "X-Request-Id: stream-7\r\n"));
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(str(response["X-Request-Id"]), "stream-7");
  client.send(get("/plain"));
  ASSERT_FALSE(client.read(response));
  const std::string made = str(response["X-Request-Id"]);
  EXPECT_EQ(made.size(), 24u) << made;
  client.send(get("/plain", "X-Request-Id: " + std::string(200, 'x') + "\r\n"));
  ASSERT_FALSE(client.read(response));
  const std::string replaced = str(response["X-Request-Id"]);
  EXPECT_EQ(replaced.size(), 24u) << replaced;
  EXPECT_NE(replaced, made);
  // Two ids: the first is the request's, and the handler sees only it.
  client.send(get("/plain", "X-Request-Id: first-1\r\nx-request-id: second-2\r\n"));
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(str(response["X-Request-Id"]), "first-1");
  std::lock_guard lock(mutex);
  EXPECT_EQ(seen,
            (std::vector<std::string>{"client-id-42", "stream-7", made, replaced, "first-1"}));
  EXPECT_EQ(most_ids, 1u);
}

TEST_F(HttpServerTest, ClientDisconnectMidStreamFiresOnClose) {
  Event closed;
  std::shared_ptr<HttpResponder> stream;
  auto running = start([&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
    responder->on_close([&] { closed.set(); });
    responder->start_stream(200);
    responder->write("data: first\n\n");
    keep(responder);
    std::lock_guard lock(mutex_);
    stream = responder;
  });
  Client client(server_->port());
  client.send(get("/stream"));
  http::response_parser<http::string_body> parser;
  ASSERT_FALSE(client.read_header(parser));
  client.close();  // the stream stays open and idle on the server side
  ASSERT_TRUE(closed.wait(1000ms));
  std::lock_guard lock(mutex_);
  EXPECT_TRUE(stream->closed());
}

// A client that never reads what it is streamed is dropped, and its
// request's on_close fires (as on a disconnect), once a write has waited past
// the write timeout, or once its unread output passes the queue limit;
// before, it held the connection and an unbounded queue forever.
TEST_F(HttpServerTest, ClientThatStopsReadingIsDropped) {
  struct Case {
    std::chrono::milliseconds write_timeout;
    size_t max_queued;
  } cases[] = {{300ms, size_t(1) << 30}, {60000ms, size_t(1) << 20}};
  for (const Case& c : cases) {
    SCOPED_TRACE("write timeout " + std::to_string(c.write_timeout.count()) + " ms, queue " +
                 std::to_string(c.max_queued));
    Event closed;
    std::atomic<bool> stop{false};
    HttpServerConfig config;
    config.write_timeout = c.write_timeout;
    config.max_queued_write_bytes = c.max_queued;
    auto running = start(
        [&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
          responder->on_close([&] { closed.set(); });
          firehose(responder, stop, 64 << 10);
        },
        config);
    Client client(server_->port());
    client.send(get("/firehose"));  // and never read
    const bool dropped = closed.wait(10000ms);
    stop.store(true);
    ASSERT_TRUE(dropped) << "the client that reads nothing was never dropped";
    EXPECT_TRUE(wait_for_connections(0, 2000ms));
  }
}

// The queue limit is for output that waits behind a write the client has
// not taken: a whole reply larger than it (a batch of long completions with
// log-probabilities) is delivered, byte for byte.
TEST_F(HttpServerTest, AReplyLargerThanTheQueueLimitIsDelivered) {
  const std::string body = random_letters(3u << 20);
  HttpServerConfig config;
  config.max_queued_write_bytes = 1u << 20;
  auto running = start(
      [&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
        responder->respond(200, "text/plain", body);
      },
      config);
  Client client(server_->port());
  client.send(get("/large"));
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.result_int(), 200);
  EXPECT_TRUE(response.body() == body) << "got " << response.body().size() << " bytes";
}

// The statuses HttpServerConfig::on_reply was told, in order.
class ToldReplies {
 public:
  std::function<void(int)> hook() {
    return [this](int status) {
      std::lock_guard lock(mutex_);
      statuses_.push_back(status);
    };
  }
  std::vector<int> statuses() const {
    std::lock_guard lock(mutex_);
    return statuses_;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<int> statuses_;
};

// Every reply is told as it goes out, the handler's or the one the server
// makes in its place, with the status on the wire; one to a client gone is
// not.
TEST_F(HttpServerTest, EveryReplyIsToldWithTheStatusItWentOutWith) {
  ToldReplies told;
  HttpServerConfig config;
  config.on_reply = told.hook();
  config.max_body_bytes = 1024;
  std::mutex mutex;
  std::shared_ptr<HttpResponder> held;  // /held: answered after its client left
  auto running = start(
      [&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        if (request.target == "/ok") return responder->respond(200, "text/plain", "ok");
        if (request.target == "/missing") return responder->respond(404, "text/plain", "no");
        if (request.target == "/odd") return responder->respond(42, "text/plain", "odd");
        if (request.target == "/stream") {
          responder->start_stream(200);
          responder->write("data: x\n\n");
          return responder->finish();
        }
        if (request.target == "/throw") throw std::runtime_error("handler bug");
        if (request.target == "/held") {
          std::lock_guard lock(mutex);
          held = std::move(responder);
        }
        // anything else: dropped without a reply
      },
      config);
  const std::vector<std::pair<std::string, int>> cases = {
      {"/ok", 200},    {"/missing", 404}, {"/odd", 500}, {"/stream", 200},
      {"/throw", 500}, {"/dropped", 500}, {"/ok", 200}};
  std::vector<int> want;
  {
    Client client(server_->port());
    for (const auto& [target, status] : cases) {
      SCOPED_TRACE(target);
      client.send(get(target));
      Response response;
      ASSERT_FALSE(client.read(response));
      EXPECT_EQ(response.result_int(), unsigned(status));
      want.push_back(status);
      EXPECT_EQ(told.statuses(), want);
    }
  }
  {
    Client client(server_->port());  // a body over max_body_bytes: the server's 413
    client.send("POST /ok HTTP/1.1\r\nHost: t\r\nContent-Length: 4096\r\n\r\n" +
                std::string(4096, 'x'));
    Response response;
    ASSERT_FALSE(client.read(response));
    EXPECT_EQ(response.result_int(), 413u);
    want.push_back(413);
    EXPECT_EQ(told.statuses(), want);
  }
  {
    Client client(server_->port());
    client.send(get("/held"));
    for (auto until = std::chrono::steady_clock::now() + kClientTimeout;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(1ms)) {
      std::lock_guard lock(mutex);
      if (held != nullptr) break;
    }
    client.close();
  }
  std::shared_ptr<HttpResponder> late;
  {
    std::lock_guard lock(mutex);
    late = std::move(held);
  }
  ASSERT_NE(late, nullptr);
  for (auto until = std::chrono::steady_clock::now() + kClientTimeout;
       !late->closed() && std::chrono::steady_clock::now() < until;) {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_TRUE(late->closed());
  late->respond(200, "text/plain", "too late");
  Client probe(server_->port());  // a reply after it: the late one had its turn
  probe.send(get("/ok"));
  Response response;
  ASSERT_FALSE(probe.read(response));
  want.push_back(200);
  EXPECT_EQ(told.statuses(), want) << "a reply to a client gone was told";
}

// Replies their clients leave unread are bounded across connections, not
// only each connection's queue: while the server holds more than
// max_unsent_bytes of them, a large reply is answered 503 (a small one still
// goes out; one larger than the bound goes out when nothing else waits),
// and the count comes back as clients read their replies or go away.
TEST_F(HttpServerTest, UnreadRepliesAreBoundedAcrossConnections) {
  const std::string body = random_letters(32u << 20);
  HttpServerConfig config;
  config.max_unsent_bytes = 16u << 20;
  ToldReplies told;
  config.on_reply = told.hook();
  auto running = start(
      [&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        responder->respond(200, "text/plain", request.target == "/small" ? "ok" : body);
      },
      config);
  // Whether the server's count of unsent bytes comes to pass `holds` within 5 s.
  auto eventually = [&](auto holds) {
    for (auto until = std::chrono::steady_clock::now() + 5s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(5ms)) {
      if (holds(server_->unsent_bytes())) return true;
    }
    return false;
  };
  // What the kernel's socket buffers do not take of a reply the server holds.
  auto holds_at_least = [&](size_t bytes) {
    return eventually([bytes](size_t unsent) { return unsent >= bytes; });
  };
  auto holds_none = [&] { return eventually([](size_t unsent) { return unsent == 0; }); };
  Client idle(server_->port());
  idle.send(get("/large"));  // and reads nothing for now
  ASSERT_TRUE(holds_at_least(17u << 20)) << "held " << server_->unsent_bytes();

  Client refused(server_->port());
  refused.send(get("/large"));
  Response response;
  ASSERT_FALSE(refused.read(response));
  EXPECT_EQ(response.result_int(), 503u);
  EXPECT_NE(response.body().find("max_unsent_reply_bytes"), std::string::npos) << response.body();
  EXPECT_EQ(told.statuses(), (std::vector<int>{200, 503}))
      << "the 503 is told in place of the reply it replaced";
  refused.send(get("/small"));
  ASSERT_FALSE(refused.read(response));
  EXPECT_EQ(response.result_int(), 200u);
  EXPECT_EQ(response.body(), "ok");

  ASSERT_FALSE(idle.read(response));  // reading, it gets its reply whole
  EXPECT_EQ(response.result_int(), 200u);
  EXPECT_TRUE(response.body() == body) << "got " << response.body().size() << " bytes";
  EXPECT_TRUE(holds_none()) << "held " << server_->unsent_bytes();
  refused.send(get("/large"));
  ASSERT_FALSE(refused.read(response));
  EXPECT_EQ(response.result_int(), 200u) << "the bound outlived the unread reply";

  Client leaves(server_->port());
  leaves.send(get("/large"));
  ASSERT_TRUE(holds_at_least(17u << 20)) << "held " << server_->unsent_bytes();
  leaves.close();
  EXPECT_TRUE(holds_none()) << "a closed connection's reply is still counted: "
                            << server_->unsent_bytes();
}

// While the unread replies pass max_unsent_bytes, a client behind on its
// stream is dropped (its request's on_close fires, as on a disconnect),
// though its own queue is far below max_queued_write_bytes and its write
// timeout far off.
TEST_F(HttpServerTest, AClientBehindOnItsStreamIsDroppedWhileUnreadRepliesPassTheBound) {
  const std::string large(32u << 20, 'x');
  Event closed;
  std::atomic<bool> stop{false};
  HttpServerConfig config;
  config.max_unsent_bytes = 16u << 20;
  config.max_queued_write_bytes = size_t(1) << 30;
  config.write_timeout = 60000ms;
  auto running = start(
      [&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
        if (request.target == "/large") return responder->respond(200, "text/plain", large);
        responder->on_close([&] { closed.set(); });
        firehose(responder, stop, 16 << 10);
      },
      config);
  Client idle(server_->port());
  idle.send(get("/large"));  // and reads nothing: the server holds most of it
  for (auto until = std::chrono::steady_clock::now() + 5s;
       server_->unsent_bytes() <= config.max_unsent_bytes &&
       std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(5ms);
  ASSERT_GT(server_->unsent_bytes(), config.max_unsent_bytes) << "the premise";
  Client streamed(server_->port());
  streamed.send(get("/stream"));  // and never reads
  const bool dropped = closed.wait(10000ms);
  stop.store(true);
  EXPECT_TRUE(dropped) << "a client behind on its stream was kept while the bound was passed";
}

TEST_F(HttpServerTest, ClientDisconnectWhileReplyPendingFiresOnClose) {
  Event handled, closed;
  auto running = start([&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
    responder->on_close([&] { closed.set(); });
    keep(responder);
    handled.set();
  });
  Client client(server_->port());
  client.send(get("/pending"));
  ASSERT_TRUE(handled.wait(1000ms));
  client.close();
  ASSERT_TRUE(closed.wait(1000ms));
  EXPECT_TRUE(wait_for_connections(0, 1000ms));
  // A callback set after the close runs at once.
  Event late;
  std::lock_guard lock(mutex_);
  kept_.at(0)->on_close([&] { late.set(); });
  EXPECT_TRUE(late.wait(1000ms));
}

TEST_F(HttpServerTest, OnCloseDoesNotFireForAFinishedReply) {
  Event closed, replied;
  auto running = start([&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
    responder->on_close([&] { closed.set(); });
    responder->respond(200, "text/plain", "done");
  });
  Client client(server_->port());
  client.send(get("/"));
  Response response;
  ASSERT_FALSE(client.read(response));
  client.close();
  ASSERT_TRUE(wait_for_connections(0, 1000ms));
  EXPECT_FALSE(closed.wait(50ms));
}

struct Malformed {
  const char* name;
  std::string bytes;
};

class MalformedRequestTest : public HttpServerTest,
                             public ::testing::WithParamInterface<Malformed> {};

TEST_P(MalformedRequestTest, Gets400WithJsonErrorAndClose) {
  std::atomic<bool> handled = false;
  std::atomic<int> refused_status = 0, refusals = 0;
  HttpServerConfig config;
  // The router counts these replies in its metrics through this.
  config.on_reply = [&](int status) {
    refused_status = status;
    ++refusals;
  };
  auto running = start(
      [&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
        handled = true;
        responder->respond(200, "text/plain", "should not happen");
      },
      config);
  Client client(server_->port());
  client.send(GetParam().bytes);
  Response response;
  ASSERT_FALSE(client.read(response));
  expect_json_error(response, 400);
  EXPECT_FALSE(response.keep_alive());
  EXPECT_TRUE(client.closed_by_server(1000ms));
  EXPECT_FALSE(handled);
  EXPECT_EQ(refusals.load(), 1);
  EXPECT_EQ(refused_status.load(), 400);
}

INSTANTIATE_TEST_SUITE_P(
    Inputs, MalformedRequestTest,
    ::testing::Values(Malformed{"BadRequestLine", "THIS IS NOT HTTP\r\n\r\n"},
                      Malformed{"BadVersion", "GET / HTTP/x.y\r\nHost: t\r\n\r\n"},
                      Malformed{"BadChunk",
                                "POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n"
                                "zz\r\nhello\r\n0\r\n\r\n"},
                      Malformed{"HeaderTooLarge", "GET / HTTP/1.1\r\nX-Big: " +
                                                      std::string(100000, 'a') + "\r\n\r\n"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_F(HttpServerTest, OversizedBodyGets413) {
  HttpServerConfig config;
  config.max_body_bytes = 1024;
  std::atomic<bool> handled = false;
  auto running = start(
      [&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
        handled = true;
        responder->respond(200, "text/plain", "");
      },
      config);
  {
    Client client(server_->port());
    client.send("POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 4096\r\n\r\n" +
                std::string(4096, 'x'));
    Response response;
    ASSERT_FALSE(client.read(response));
    expect_json_error(response, 413);
    EXPECT_TRUE(client.closed_by_server(1000ms));
  }
  {
    Client client(server_->port());  // chunked: no length to check up front
    std::string chunk = "400\r\n" + std::string(1024, 'y') + "\r\n";
    client.send("POST / HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk + chunk +
                "0\r\n\r\n");
    Response response;
    ASSERT_FALSE(client.read(response));
    expect_json_error(response, 413);
  }
  EXPECT_FALSE(handled);
}

TEST_F(HttpServerTest, StopReturnsPromptlyWithIdleConnectionAndOpenStream) {
  Event streaming, closed;
  auto running = start([&](HttpRequest request, std::shared_ptr<HttpResponder> responder) {
    if (request.target != "/stream") return responder->respond(200, "text/plain", "hi");
    responder->on_close([&] { closed.set(); });
    responder->start_stream(200);
    keep(responder);
    streaming.set();
  });
  Client idle(server_->port());
  idle.send(get("/"));
  Response response;
  ASSERT_FALSE(idle.read(response));
  Client stream(server_->port());
  stream.send(get("/stream"));
  ASSERT_TRUE(streaming.wait(1000ms));

  auto begin = std::chrono::steady_clock::now();
  server_->stop();
  EXPECT_LT(std::chrono::steady_clock::now() - begin, 2s);
  EXPECT_TRUE(closed.wait(0ms));
  EXPECT_TRUE(idle.closed_by_server(1000ms));
  EXPECT_EQ(server_->open_connections(), 0);
  server_->stop();  // idempotent
}

TEST_F(HttpServerTest, ResponderOutlivingTheServerIsHarmless) {
  Event handled;
  auto running = start([&](HttpRequest, std::shared_ptr<HttpResponder> responder) {
    keep(responder);
    handled.set();
  });
  Client client(server_->port());
  client.send(get("/"));
  ASSERT_TRUE(handled.wait(1000ms));
  server_.reset();
  std::lock_guard lock(mutex_);
  auto& responder = kept_.at(0);
  EXPECT_TRUE(responder->closed());
  responder->start_stream(200);
  responder->write("x");
  responder->finish();
  responder->on_close([] {});
  kept_.clear();  // the last reference goes with no server left
}

TEST_F(HttpServerTest, DroppedResponderGets500) {
  auto running = start([](HttpRequest, std::shared_ptr<HttpResponder>) {});
  Client client(server_->port());
  client.send(get("/"));
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.result_int(), 500u);
}

TEST_F(HttpServerTest, IdleKeepAliveConnectionIsClosed) {
  HttpServerConfig config;
  config.idle_timeout = 100ms;
  auto running = start(
      [](HttpRequest, std::shared_ptr<HttpResponder> r) { r->respond(200, "text/plain", ""); },
      config);
  Client client(server_->port());
  // Taken before the request: the server's idle timer cannot start earlier,
  // while this thread may read the reply well after the timer started.
  auto begin = std::chrono::steady_clock::now();
  client.send(get("/"));
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_TRUE(client.closed_by_server(2000ms));
  EXPECT_GE(std::chrono::steady_clock::now() - begin, 100ms);
}

TEST_F(HttpServerTest, ConnectionsOverTheLimitGet503) {
  HttpServerConfig config;
  config.max_connections = 1;
  auto running = start(
      [](HttpRequest, std::shared_ptr<HttpResponder> r) { r->respond(200, "text/plain", ""); },
      config);
  Client first(server_->port());
  first.send(get("/"));
  Response response;
  ASSERT_FALSE(first.read(response));
  EXPECT_EQ(response.result_int(), 200u);

  Client second(server_->port());
  ASSERT_FALSE(second.read(response));
  EXPECT_EQ(response.result_int(), 503u);
  EXPECT_EQ(response[http::field::retry_after], "1") << "a full server may have room soon";
  EXPECT_TRUE(second.closed_by_server(1000ms));
}

TEST_F(HttpServerTest, ExpectContinueGets100BeforeTheBody) {
  auto running = start([](HttpRequest request, std::shared_ptr<HttpResponder> r) {
    r->respond(200, "text/plain", request.body);
  });
  Client client(server_->port());
  client.send("POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  Response response;
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.result_int(), 100u);
  client.send("body");
  ASSERT_FALSE(client.read(response));
  EXPECT_EQ(response.body(), "body");
}

TEST_F(HttpServerTest, BindFailureNamesHostAndPort) {
  auto running = start([](HttpRequest, std::shared_ptr<HttpResponder>) {});
  HttpServerConfig config;
  config.port = server_->port();
  auto second = HttpServer::start(config, [](HttpRequest, std::shared_ptr<HttpResponder>) {});
  ASSERT_FALSE(second.is_ok());
  EXPECT_NE(second.status().message().find("127.0.0.1:" + std::to_string(config.port)),
            std::string::npos)
      << second.status().message();
}

}  // namespace
}  // namespace baton::router
