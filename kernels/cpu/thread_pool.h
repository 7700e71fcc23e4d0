// kernels/cpu/thread_pool.h — the one owner of the CPU cores.
//
// Every CPU kernel that parallelises does it through this pool. BLAS is kept
// single-threaded (openblas_set_num_threads(1)) and called from inside the
// pool's workers on disjoint slices, so two thread pools never fight over the
// same cores.
//
// The pool's threads run with subnormal floats flushed to zero (MXCSR's FTZ
// and DAZ; the caller's own setting is restored when parallel_for returns).
// An Intel core takes a microcode assist for every multiply that makes or
// reads a subnormal: decode attention over K and V whose products came out
// subnormal ran ten times slower (PERFORMANCE.md, "The machine"). Real data
// gets there too: a softmax's probabilities go down to exp(-87), about
// 1.6e-38, whose products with V are subnormal. Values below 2^-126 are
// negligible beside the sums they enter.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace baton::kernels::cpu {

class ThreadPool {
 public:
  // num_threads <= 0 means one per hardware thread. The calling thread takes
  // part in every parallel_for, so `size() - 1` workers are spawned.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return num_threads_; }

  // Splits [0, n) into at most size() contiguous chunks and runs
  // fn(begin, end, thread_index) on each, returning when all are done.
  // thread_index (< size(), 0 = the caller) names the thread running the
  // chunk; chunks are claimed by whichever thread is free first, so one thread
  // may run several chunks, never two at once. Not reentrant: fn must not
  // call parallel_for on the same pool.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t, int)>& fn);

 private:
  void worker_loop(int thread_index);
  // Claims and runs chunks of generation `generation` until none are left.
  void run_chunks(uint32_t generation, int thread_index);

  int num_threads_;
  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable work_ready_;
  std::condition_variable work_done_;
  const std::function<void(int64_t, int64_t, int)>* job_ = nullptr;
  int64_t job_size_ = 0;
  // Chunks are claimed, not assigned: [generation:32 | chunks:16 | next:16].
  // Whoever is running takes the next chunk, so a worker the OS has not
  // scheduled yet never holds up the caller (it finds nothing left to do).
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> chunks_done_{0};
  bool stopping_ = false;
};

}  // namespace baton::kernels::cpu
