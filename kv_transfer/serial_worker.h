// kv_transfer/serial_worker.h — one thread that runs posted jobs in order,
// and a few of them that run one lane's jobs in order each.
//
// A staged pool's copies run here: copies out of the device pool off the
// caller's thread, copies into it off the progress thread, so the wire
// keeps moving while a copy runs.
#pragma once

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

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

// `lanes` SerialWorkers: jobs posted to one lane run in order, jobs of
// different lanes side by side. A transfer keeps to one lane, so its
// layers are copied in the order they were handed over while another
// transfer's copies need not wait behind them (a device copier serves
// several copies at once: kernels/cuda/pool_copier.h).
class LaneWorkers {
 public:
  explicit LaneWorkers(size_t lanes) {
    for (size_t i = 0; i < std::max<size_t>(lanes, 1); ++i)
      workers_.push_back(std::make_unique<SerialWorker>());
  }

  size_t lanes() const { return workers_.size(); }
  // After stop() the job runs on the caller's thread instead.
  void post(size_t lane, std::function<void()> job) {
    workers_[lane % workers_.size()]->post(std::move(job));
  }
  // Runs every job already posted on every lane, then ends the threads.
  void stop() {
    for (auto& worker : workers_) worker->stop();
  }

 private:
  std::vector<std::unique_ptr<SerialWorker>> workers_;
};

}  // namespace baton::kv_transfer
