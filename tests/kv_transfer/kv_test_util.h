// tests/kv_transfer/kv_test_util.h — shared by the transfer tests and their
// helper process: deterministic pool contents, byte checks, hex, child processes.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/kv_layout.h"
#include "common/pool_copier.h"

extern char** environ;

namespace baton::kv_transfer::testing {

inline constexpr uint8_t kPoison = 0xA5;

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Sender pools hold pattern(seed, byte offset): random-looking, reproducible.
inline void fill_pattern(uint8_t* pool, size_t bytes, uint64_t seed) {
  for (size_t w = 0; w * 8 < bytes; ++w) {
    uint64_t v = splitmix64(seed ^ (w * 0x100000001b3ull));
    std::memcpy(pool + w * 8, &v, std::min<size_t>(8, bytes - w * 8));
  }
}

// Whether `n` bytes at `dst` equal the pattern at source byte offset `src_offset`.
inline bool matches_pattern(const uint8_t* dst, size_t src_offset, size_t n, uint64_t seed) {
  // Offsets in the tests are block multiples, so 8-byte aligned.
  for (size_t i = 0; i < n; i += 8) {
    uint64_t v = splitmix64(seed ^ (((src_offset + i) / 8) * 0x100000001b3ull));
    if (std::memcmp(dst + i, &v, std::min<size_t>(8, n - i)) != 0) return false;
  }
  return true;
}

// A staged pool in plain host memory that UCX never sees: the transfer
// engine's staging path for device pools, run where there is no device (the
// CUDA copier runs it where there is). The copies are the host-memory
// copier's (make_host_pool_copier: every range checked against the pool
// and the engine's host memory); this one counts the bytes it moved each
// way, can be slow, and `fail` makes it fail like a device error.
class HostPoolCopier : public PoolCopier {
 public:
  HostPoolCopier(uint8_t* pool, size_t bytes) : copier_(make_host_pool_copier(pool, bytes)) {}
  Status to_host(void* slots, std::span<const Range> ranges) override {
    if (fail) return internal_error("injected copy-out failure");
    return counted(copy_out_delay, copies_in_flight, most_copies_in_flight, to_host_bytes, ranges,
                   [&] { return copier_->to_host(slots, ranges); });
  }
  Status to_device(const void* slots, std::span<const Range> ranges) override {
    if (fail) return internal_error("injected copy-in failure");
    return counted(copy_in_delay, copy_ins_in_flight, most_copy_ins_in_flight, to_device_bytes,
                   ranges, [&] { return copier_->to_device(slots, ranges); });
  }
  // Not pinned, but the engine's host memory is known from here on: a copy
  // past it fails.
  Status pin(void* host, size_t bytes) override { return copier_->pin(host, bytes); }
  const char* name() const override { return "host memory"; }

  std::atomic<uint64_t> to_host_bytes{0}, to_device_bytes{0};
  std::atomic<bool> fail{false};  // every copy fails (a device error)
  // A slow device: each copy out takes this long; copies_in_flight counts
  // them, most_copies_in_flight the most at once so far.
  std::chrono::milliseconds copy_out_delay{0};
  std::atomic<int> copies_in_flight{0}, most_copies_in_flight{0};
  // The same for copies into the pool.
  std::chrono::milliseconds copy_in_delay{0};
  std::atomic<int> copy_ins_in_flight{0}, most_copy_ins_in_flight{0};

 private:
  // `copy` after `delay`, its bytes counted once it is done.
  template <typename Copy>
  static Status counted(std::chrono::milliseconds delay, std::atomic<int>& in_flight,
                        std::atomic<int>& most_in_flight, std::atomic<uint64_t>& bytes,
                        std::span<const Range> ranges, Copy copy) {
    const int now = ++in_flight;
    for (int most = most_in_flight.load(); now > most;) {
      if (most_in_flight.compare_exchange_weak(most, now)) break;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    Status copied = copy();
    if (copied.is_ok())
      for (const Range& r : ranges) bytes += r.bytes;
    --in_flight;
    return copied;
  }

  std::unique_ptr<PoolCopier> copier_;
};

// The peer process to spawn: $BATON_TRANSFER_PEER when set (a bundle run on
// another machine, deploy/gpu_bundle.sh), else the one this build made.
inline std::string transfer_peer_binary(const char* built) {
  const char* env = std::getenv("BATON_TRANSFER_PEER");
  return env != nullptr && *env != '\0' ? env : built;
}

inline std::string to_hex(const std::vector<uint8_t>& b) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (uint8_t x : b) {
    s += d[x >> 4];
    s += d[x & 15];
  }
  return s;
}

inline std::vector<uint8_t> from_hex(const std::string& s) {
  std::vector<uint8_t> b;
  for (size_t i = 0; i + 1 < s.size(); i += 2)
    b.push_back(uint8_t(std::stoi(s.substr(i, 2), nullptr, 16)));
  return b;
}

// `n` distinct block ids in [0, num_blocks), in a random order with some
// adjacent stretches, so merging has something to do on both sides.
inline std::vector<int32_t> random_blocks(std::mt19937_64& rng, int32_t num_blocks, int32_t n) {
  std::vector<int32_t> all(num_blocks);
  for (int32_t i = 0; i < num_blocks; ++i) all[i] = i;
  std::vector<int32_t> out;
  std::vector<bool> used(num_blocks, false);
  while (int32_t(out.size()) < n) {
    int32_t start = int32_t(rng() % num_blocks);
    int32_t run = 1 + int32_t(rng() % 4);
    for (int32_t b = start; b < num_blocks && run > 0 && int32_t(out.size()) < n; ++b, --run) {
      if (used[b]) break;
      used[b] = true;
      out.push_back(b);
    }
  }
  return out;
}

// A child process with line-based stdin/stdout; killed and reaped on destruction.
class Child {
 public:
  explicit Child(const std::vector<std::string>& argv) {
    // A write to a child that died fails with EPIPE (ignored: the test sees
    // the child's silence) instead of killing the whole binary with SIGPIPE.
    ::signal(SIGPIPE, SIG_IGN);
    int in[2], out[2];
    if (pipe(in) != 0 || pipe(out) != 0) return;
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, in[0], 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], 1);
    posix_spawn_file_actions_addclose(&actions, in[1]);
    posix_spawn_file_actions_addclose(&actions, out[0]);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
    close(in[0]);
    close(out[1]);
    to_child_ = in[1];
    from_child_ = out[0];
    fcntl(to_child_, F_SETFD, FD_CLOEXEC);
    fcntl(from_child_, F_SETFD, FD_CLOEXEC);
  }
  ~Child() {
    kill_now();
    if (to_child_ >= 0) close(to_child_);
    if (from_child_ >= 0) close(from_child_);
  }
  bool alive() const { return pid_ > 0; }
  void send(const std::string& line) {
    std::string l = line + "\n";
    ssize_t n = write(to_child_, l.data(), l.size());
    (void)n;
  }
  // Next line starting with `prefix`, or nullopt on timeout/EOF. Lines that
  // do not match stay queued for later calls.
  std::optional<std::string> wait_for(
      const std::string& prefix, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    auto until = std::chrono::steady_clock::now() + timeout;
    while (true) {
      for (auto it = lines_.begin(); it != lines_.end(); ++it) {
        if (it->rfind(prefix, 0) == 0) {
          std::string line = *it;
          lines_.erase(it);
          return line;
        }
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          until - std::chrono::steady_clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd fd{from_child_, POLLIN, 0};
      if (poll(&fd, 1, int(left.count())) <= 0) continue;
      char chunk[65536];
      ssize_t n = read(from_child_, chunk, sizeof chunk);
      if (n <= 0) return std::nullopt;
      buffer_.append(chunk, size_t(n));
      for (auto nl = buffer_.find('\n'); nl != std::string::npos; nl = buffer_.find('\n')) {
        lines_.push_back(buffer_.substr(0, nl));
        buffer_.erase(0, nl + 1);
      }
    }
  }
  // SIGSTOP / SIGCONT: a peer that hangs without dying.
  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  void kill_now() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
  }
  // Asks the child to quit; reaps it (kills it after `timeout`).
  void quit(std::chrono::milliseconds timeout = std::chrono::seconds(5)) {
    if (pid_ <= 0) return;
    send("QUIT");
    auto until = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < until) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      usleep(10000);
    }
    kill_now();
  }

 private:
  pid_t pid_ = -1;
  int to_child_ = -1, from_child_ = -1;
  std::string buffer_;
  std::deque<std::string> lines_;
};

inline std::vector<std::string> split(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  std::string w;
  while (in >> w) words.push_back(w);
  return words;
}

}  // namespace baton::kv_transfer::testing
