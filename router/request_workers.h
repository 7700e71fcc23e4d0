// router/request_workers.h — the threads that do a request's CPU work away
// from the threads that must stay responsive: a request's parsing, chat
// template and tokenising off the HTTP and ZeroMQ front ends' threads (an
// 8 MB prompt takes a fraction of a second to tokenise), and a finished
// request's JSON reply off the dispatcher's thread (a reply with many
// choices and log-probabilities takes seconds to build).
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace baton::router {

class RequestWorkers {
 public:
  enum class Admission { kQueued, kFull, kStopped };

  // `max_queued_bytes` bounds the requests waiting for a thread.
  RequestWorkers(int32_t threads, size_t max_queued_bytes);
  ~RequestWorkers();
  RequestWorkers(const RequestWorkers&) = delete;
  RequestWorkers& operator=(const RequestWorkers&) = delete;

  // Queues a request's work, charged `bytes` until a thread takes it: kFull,
  // and nothing queued, when that would pass the bound (unless no request
  // waits: one of any admitted size always gets in); kStopped after stop().
  Admission try_post(size_t bytes, std::function<void()> work);
  // Queues work owed to an admitted request (its reply), run before any
  // request waiting; once stopped, runs it on the calling thread.
  void post(std::function<void()> work);
  // Runs everything queued, then joins the threads. Idempotent.
  void stop();

  // Nothing queued and nothing running.
  bool idle() const;
  size_t queued_bytes() const;

 private:
  struct Task {
    size_t bytes = 0;
    std::function<void()> work;
  };
  void run();

  const size_t max_queued_bytes_;
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Task> replies_;   // served first
  std::deque<Task> requests_;  // bounded by queued_bytes_
  size_t queued_bytes_ = 0;
  int32_t running_ = 0;
  bool stopping_ = false;
  std::mutex stop_mutex_;
  std::vector<std::thread> threads_;  // stop() only, under stop_mutex_
};

}  // namespace baton::router
