// kv_transfer/serial_worker.h — one thread that runs posted jobs in order.
//
// The staged receive path copies verified blocks into the device pool here,
// so the progress thread keeps the wire moving while a copy runs.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace baton::kv_transfer {

class SerialWorker {
 public:
  SerialWorker() : thread_([this] { run(); }) {}
  ~SerialWorker() { stop(); }
  SerialWorker(const SerialWorker&) = delete;
  SerialWorker& operator=(const SerialWorker&) = delete;

  // After stop() the job runs on the caller's thread instead.
  void post(std::function<void()> job) {
    {
      std::lock_guard lock(mutex_);
      if (!stopping_) {
        jobs_.push_back(std::move(job));
        job = nullptr;
      }
    }
    if (job) {
      job();
      return;
    }
    wake_.notify_one();
  }

  // Runs every job already posted, then ends the thread. Later calls do nothing.
  void stop() {
    {
      std::lock_guard lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void run() {
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stopping, and nothing left
      std::function<void()> job = std::move(jobs_.front());
      jobs_.pop_front();
      lock.unlock();
      job();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;
  bool stopping_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace baton::kv_transfer
