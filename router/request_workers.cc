// router/request_workers.cc — a fixed pool of threads over one queue.
#include "router/request_workers.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <exception>

namespace baton::router {

RequestWorkers::RequestWorkers(int32_t threads, size_t max_queued_bytes)
    : max_queued_bytes_(max_queued_bytes) {
  for (int32_t i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { run(); });
}

RequestWorkers::~RequestWorkers() { stop(); }

bool RequestWorkers::try_post(size_t bytes, std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return false;
    if (queued_bytes_ > 0 && queued_bytes_ + bytes > max_queued_bytes_) return false;
    queued_bytes_ += bytes;
    queue_.push_back({bytes, std::move(work)});
  }
  wake_.notify_one();
  return true;
}

void RequestWorkers::post(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      queue_.push_back({0, std::move(work)});
      wake_.notify_one();
      return;
    }
  }
  work();
}

void RequestWorkers::stop() {
  std::lock_guard joining(stop_mutex_);  // a second caller waits for the first's joins
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& thread : threads_) thread.join();
  threads_.clear();
}

size_t RequestWorkers::queued_bytes() const {
  std::lock_guard lock(mutex_);
  return queued_bytes_;
}

void RequestWorkers::run() {
  while (true) {
    Task task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and everything queued has run
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_bytes_ -= task.bytes;
    }
    // The work answers its own request; whatever escapes it must not end
    // the thread that serves everyone else's.
    try {
      task.work();
    } catch (const std::exception& e) {
      spdlog::error("request worker: a task threw: {}", e.what());
    } catch (...) {
      spdlog::error("request worker: a task threw a non-exception");
    }
  }
}

}  // namespace baton::router
