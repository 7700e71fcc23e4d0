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
// A few tens of µs of pause instructions: long enough to catch the next kernel
// of the same step, short enough not to keep a core from anyone for long.
constexpr int kSpinIterations = 4000;
constexpr int kMaxThreads = 0xffff;  // chunk counts must fit 16 bits of claim_

uint32_t generation_of(uint64_t claim) { return uint32_t(claim >> 32); }
uint32_t chunks_of(uint64_t claim) { return uint32_t(claim >> 16) & 0xffffu; }
uint32_t next_of(uint64_t claim) { return uint32_t(claim) & 0xffffu; }

#if defined(__x86_64__) || defined(__i386__)
// MXCSR's flush-to-zero (results) and denormals-are-zero (inputs) bits.
constexpr unsigned kFlushSubnormals = 0x8040;

// Flushes subnormals on this thread while it lives, then restores the
// thread's own setting.
class FlushSubnormals {
 public:
  FlushSubnormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | kFlushSubnormals); }
  ~FlushSubnormals() { _mm_setcsr(saved_); }
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_;
};
#else
struct FlushSubnormals {};
#endif
}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  if (num_threads <= 0) num_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  num_threads_ = std::min(num_threads, kMaxThreads);
  workers_.reserve(size_t(num_threads_ - 1));
  for (int t = 1; t < num_threads_; ++t) workers_.emplace_back([this, t] { worker_loop(t); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    const uint32_t generation = generation_of(claim_.load()) + 1;
    claim_.store(uint64_t(generation) << 32, std::memory_order_release);
  }
  work_ready_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunks(uint32_t generation, int thread_index) {
  uint64_t claim = claim_.load(std::memory_order_acquire);
  for (;;) {
    if (generation_of(claim) != generation || next_of(claim) >= chunks_of(claim)) return;
    if (!claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire))
      continue;
    // Our claim keeps the job alive: parallel_for cannot return before this
    // chunk is counted done, so job_ and job_size_ are stable here.
    const int64_t chunks = chunks_of(claim), index = next_of(claim);
    const int64_t begin = job_size_ * index / chunks;
    const int64_t end = job_size_ * (index + 1) / chunks;
    (*job_)(begin, end, thread_index);
    if (chunks_done_.fetch_add(1, std::memory_order_acq_rel) + 1 == chunks) {
      std::lock_guard<std::mutex> lock(mutex_);
      work_done_.notify_one();
    }
    claim = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn) {
  if (n <= 0) return;
  const FlushSubnormals flush;
  if (num_threads_ == 1 || n == 1) {
    fn(0, n, 0);
    return;
  }
  const int chunks = int(std::min<int64_t>(n, num_threads_));
  uint32_t generation;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_size_ = n;
    chunks_done_.store(0, std::memory_order_relaxed);
    generation = generation_of(claim_.load(std::memory_order_relaxed)) + 1;
    claim_.store(uint64_t(generation) << 32 | uint64_t(chunks) << 16, std::memory_order_release);
  }
  work_ready_.notify_all();
  run_chunks(generation, 0);
  for (int i = 0; i < kSpinIterations; ++i) {
    if (chunks_done_.load(std::memory_order_acquire) == chunks) return;
    BATON_CPU_RELAX();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return chunks_done_.load(std::memory_order_acquire) == chunks; });
}

void ThreadPool::worker_loop(int thread_index) {
  const FlushSubnormals flush;
  uint32_t seen = 0;
  for (;;) {
    bool ready = false;
    for (int i = 0; i < kSpinIterations && !ready; ++i) {
      ready = generation_of(claim_.load(std::memory_order_acquire)) != seen;
      if (!ready) BATON_CPU_RELAX();
    }
    if (!ready) {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] {
        return generation_of(claim_.load(std::memory_order_acquire)) != seen || stopping_;
      });
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
    }
    seen = generation_of(claim_.load(std::memory_order_acquire));
    run_chunks(seen, thread_index);
  }
}

}  // namespace baton::kernels::cpu
