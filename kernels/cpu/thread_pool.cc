#include "kernels/cpu/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define BATON_CPU_RELAX() _mm_pause()
#else
#define BATON_CPU_RELAX() std::this_thread::yield()
#endif

namespace baton::kernels::cpu {
namespace {
// About 20-50 µs of pause instructions: long enough to catch the next kernel of
// the same step, short enough not to steal a core from anyone for long.
constexpr int kSpinIterations = 4000;
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = num_threads;
  workers_.reserve(size_t(num_threads_ - 1));
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_ready_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunk(int thread_index) {
  if (thread_index >= job_chunks_) return;
  int64_t begin = job_size_ * thread_index / job_chunks_;
  int64_t end = job_size_ * (thread_index + 1) / job_chunks_;
  if (begin < end) (*job_)(begin, end, thread_index);
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    job_chunks_ = std::min<int64_t>(n, num_threads_);
    pending_.store(num_threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
  }
  work_ready_.notify_all();
  run_chunk(0);
  for (int i = 0; i < kSpinIterations; ++i) {
    if (pending_.load(std::memory_order_acquire) == 0) return;
    BATON_CPU_RELAX();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [this] { return pending_.load(std::memory_order_acquire) == 0; });
}

void ThreadPool::worker_loop(int thread_index) {
  uint64_t seen = 0;
  for (;;) {
    bool ready = false;
    for (int i = 0; i < kSpinIterations; ++i) {
      if (generation_.load(std::memory_order_acquire) != seen) {
        ready = true;
        break;
      }
      BATON_CPU_RELAX();
    }
    if (!ready) {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    }
    {
      // Taking the lock orders our reads of job_ after the producer's writes
      // even when we saw the new generation while spinning.
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      seen = generation_.load(std::memory_order_acquire);
    }
    run_chunk(thread_index);
    if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard<std::mutex> lock(mutex_);
      work_done_.notify_one();
    }
  }
}

}  // namespace baton::kernels::cpu
