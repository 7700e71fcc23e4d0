// The blocking HTTP client's deadline holds at every stage: a server that
// accepts and never answers, one that answers half a reply, and a host that
// never completes the connection all fail within the timeout, not after the
// kernel's or the peer's patience.
#include "tools/http_client.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace baton::tools {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A loopback listener that accepts connections and, for each, writes
// `reply` (perhaps nothing) and then holds it open without a word more.
class SilentServer {
 public:
  explicit SilentServer(std::string reply) : reply_(std::move(reply)) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd_ < 0 || ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        ::listen(fd_, 8) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      ADD_FAILURE() << "cannot listen on loopback";
      return;
    }
    port_ = ntohs(address.sin_port);
    thread_ = std::thread([this] {
      while (!stop_) {
        const int client = ::accept(fd_, nullptr, nullptr);
        if (client < 0) break;
        if (!reply_.empty()) (void)!::write(client, reply_.data(), reply_.size());
        held_.push_back(client);
      }
    });
  }
  ~SilentServer() {
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    if (thread_.joinable()) thread_.join();
    for (int client : held_) ::close(client);
  }
  uint16_t port() const { return port_; }

 private:
  std::string reply_;
  int fd_ = -1;
  uint16_t port_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<int> held_;
};

TEST(HttpClient, EveryStageOfAnExchangeEndsAtTheDeadline) {
  const auto timeout = std::chrono::milliseconds(200 + std::random_device{}() % 300);
  for (const std::string& reply :
       {std::string(), std::string("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nhalf")}) {
    SCOPED_TRACE(reply.empty() ? "no reply" : "half a reply");
    SilentServer server(reply);
    const auto start = Clock::now();
    auto got = http_request("127.0.0.1", server.port(), "GET", "/health", {}, timeout);
    const auto took = Clock::now() - start;
    ASSERT_FALSE(got.is_ok());
    EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().to_string();
    EXPECT_GE(took, timeout);
    EXPECT_LT(took, timeout + 2s);

    const auto stream_start = Clock::now();
    auto streamed = http_stream(
        "127.0.0.1", server.port(), "/v1/completions", "{}", [](std::string_view) { return true; },
        timeout);
    ASSERT_FALSE(streamed.is_ok());
    EXPECT_EQ(streamed.status().code(), StatusCode::kDeadlineExceeded)
        << streamed.status().to_string();
    EXPECT_LT(Clock::now() - stream_start, timeout + 2s);
  }
}

// A body the server never reads: the write blocks once the socket buffers
// are full, and ends at the deadline like the other stages.
TEST(HttpClient, AWriteNoOneReadsEndsAtTheDeadline) {
  const auto timeout = std::chrono::milliseconds(200 + std::random_device{}() % 300);
  SilentServer server("");
  const std::string body(size_t(64) << 20, 'x');  // past any socket buffer
  const auto start = Clock::now();
  auto got = http_request("127.0.0.1", server.port(), "POST", "/v1/completions", body, timeout);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(got.is_ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().to_string();
  EXPECT_GE(took, timeout);
  EXPECT_LT(took, timeout + 2s);
}

// A connection no one completes: a loopback listener whose accept queue is
// full drops further SYNs, so a connect to it waits (the kernel would retry
// for minutes); the client's ends at the deadline.
TEST(HttpClient, AConnectionNoOneCompletesEndsAtTheDeadline) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_GE(listener, 0);
  ASSERT_EQ(::bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(::listen(listener, 0), 0);
  ASSERT_EQ(::getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length), 0);
  // Connections never accepted, until the queue is full and one waits.
  std::vector<int> fillers;
  bool waiting = false;
  for (int i = 0; i < 8 && !waiting; ++i) {
    const int filler = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(filler, 0);
    fillers.push_back(filler);
    (void)::connect(filler, reinterpret_cast<sockaddr*>(&address), sizeof address);
    pollfd connected{filler, POLLOUT, 0};
    waiting = ::poll(&connected, 1, 300) == 0;
  }
  ASSERT_TRUE(waiting) << "the premise: a full accept queue leaves a connect waiting";
  const auto timeout = std::chrono::milliseconds(200 + std::random_device{}() % 300);
  const auto start = Clock::now();
  auto got = http_request("127.0.0.1", ntohs(address.sin_port), "GET", "/health", {}, timeout);
  const auto took = Clock::now() - start;
  ASSERT_FALSE(got.is_ok());
  EXPECT_EQ(got.status().code(), StatusCode::kDeadlineExceeded) << got.status().to_string();
  EXPECT_GE(took, timeout);
  EXPECT_LT(took, timeout + 2s);
  for (const int filler : fillers) ::close(filler);
  ::close(listener);
}

}  // namespace
}  // namespace baton::tools
