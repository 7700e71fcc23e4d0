// router/request_workers.cc — a fixed pool of threads over two queues.
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

RequestWorkers::Admission RequestWorkers::try_post(size_t bytes, std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    if (stopping_) return Admission::kStopped;
    if (!requests_.empty() && queued_bytes_ + bytes > max_queued_bytes_) return Admission::kFull;
    queued_bytes_ += bytes;
    requests_.push_back({bytes, std::move(work)});
  }
  wake_.notify_one();
  return Admission::kQueued;
}

void RequestWorkers::post(std::function<void()> work) {
  {
    std::lock_guard lock(mutex_);
    if (!stopping_) {
      replies_.push_back({0, std::move(work)});
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

bool RequestWorkers::idle() const {
  std::lock_guard lock(mutex_);
  return replies_.empty() && requests_.empty() && running_ == 0;
}

size_t RequestWorkers::queued_bytes() const {
  std::lock_guard lock(mutex_);
  return queued_bytes_;
}

void RequestWorkers::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stopping_ || !replies_.empty() || !requests_.empty(); });
    std::deque<Task>& queue = !replies_.empty() ? replies_ : requests_;
    if (queue.empty()) return;  // stopping, and everything queued has run
    Task task = std::move(queue.front());
    queue.pop_front();
    queued_bytes_ -= task.bytes;
    ++running_;
    lock.unlock();
    // The work answers its own request; whatever escapes it must not end
    // the thread that serves everyone else's.
    try {
      task.work();
    } catch (const std::exception& e) {
      spdlog::error("request worker: a task threw: {}", e.what());
    } catch (...) {
      spdlog::error("request worker: a task threw a non-exception");
    }
    task.work = nullptr;  // what it holds goes before the pool counts it done
    lock.lock();
    --running_;
  }
}

}  // namespace baton::router
