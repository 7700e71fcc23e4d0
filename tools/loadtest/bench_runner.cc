#include "tools/loadtest/bench_runner.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

#include "tools/loadtest/stream_record.h"

namespace baton::loadtest {
namespace {

constexpr int kBarWidth = 40;
constexpr auto kRedrawEvery = std::chrono::milliseconds(100);

// "[=========>          ]  45/100  (2 failed)  12.3 s" on stderr, redrawn in place.
class ProgressBar {
 public:
  ProgressBar(bool enabled, size_t total, Clock::time_point start)
      : enabled_(enabled), total_(total), start_(start) {}

  void completed(bool success) {
    std::lock_guard lock(mutex_);
    ++done_;
    failed_ += !success;
    if (!enabled_) return;
    const auto now = Clock::now();
    if (done_ < total_ && now - last_draw_ < kRedrawEvery) return;
    last_draw_ = now;
    draw(now);
  }

  void finish() {
    if (enabled_) std::fputc('\n', stderr);
  }

 private:
  void draw(Clock::time_point now) {
    const int filled = total_ == 0 ? kBarWidth : int(done_ * kBarWidth / total_);
    std::string bar(size_t(filled), '=');
    if (filled < kBarWidth) bar += '>';
    bar.resize(kBarWidth, ' ');
    std::fprintf(stderr, "\r[%s] %zu/%zu", bar.c_str(), done_, total_);
    if (failed_ > 0) std::fprintf(stderr, "  (%zu failed)", failed_);
    std::fprintf(stderr, "  %.1f s ", std::chrono::duration<double>(now - start_).count());
    std::fflush(stderr);
  }

  const bool enabled_;
  const size_t total_;
  const Clock::time_point start_;
  std::mutex mutex_;
  size_t done_ = 0, failed_ = 0;
  Clock::time_point last_draw_{};
};

RequestRecord failed_record(const std::string& error) {
  RequestRecord record;
  record.error = error;
  return record;
}

}  // namespace

RunOutcome run_requests(const std::vector<PlannedRequest>& plan, const ClientFactory& connect,
                        const RunOptions& options) {
  RunOutcome outcome;
  outcome.records.resize(plan.size());
  const int64_t limit = options.max_concurrency > 0 ? options.max_concurrency : kMaxInFlight;
  const size_t workers = std::min(plan.size(), size_t(limit));
  outcome.started_at_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  const auto start = Clock::now();
  ProgressBar progress(options.progress, plan.size(), start);
  std::atomic<size_t> next{0};
  auto work = [&] {
    Result<std::unique_ptr<BenchClient>> client = connect();
    for (size_t i = next++; i < plan.size(); i = next++) {
      const PlannedRequest& request = plan[i];
      std::this_thread::sleep_until(start + std::chrono::duration_cast<Clock::duration>(
                                                std::chrono::duration<double>(request.send_at_s)));
      const double sent_s = std::chrono::duration<double>(Clock::now() - start).count();
      RequestRecord record;
      // A request that throws (no descriptor left for its I/O context, out
      // of memory) is a failed request, not the end of the run.
      try {
        record = client.is_ok() ? (*client)->stream(options.path, request.body, request.prompt_len)
                                : failed_record(client.status().message());
      } catch (const std::exception& e) {
        record = failed_record(e.what());
      }
      record.start_s = sent_s;
      progress.completed(record.success);
      outcome.records[i] = std::move(record);
    }
  };
  std::vector<std::thread> threads;
  for (size_t w = 0; w < workers; ++w) threads.emplace_back(work);
  for (auto& thread : threads) thread.join();
  outcome.duration_s = std::chrono::duration<double>(Clock::now() - start).count();
  progress.finish();
  return outcome;
}

}  // namespace baton::loadtest
