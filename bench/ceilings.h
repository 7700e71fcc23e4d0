// bench/ceilings.h — the machine's own limits, measured once per process, that
// every benchmark prints beside its result: memory bandwidth for memory-bound
// kernels, sgemm rate for compute-bound ones.
#pragma once

#include <functional>
#include <utility>

#include "kernels/cpu/thread_pool.h"

namespace baton::bench {

// The process-wide pool benchmarks run kernels on: one thread per hardware
// thread unless set_bench_threads() chose otherwise before its first use.
kernels::cpu::ThreadPool& bench_pool();
void set_bench_threads(int threads);

struct MemoryBandwidth {
  double read_gbs;   // sum of one array: bytes read / s
  double copy_gbs;   // b = a: (read + written bytes) / s, STREAM convention
  double triad_gbs;  // a = b + s * c: STREAM convention
  // The highest of the three: the ceiling a kernel's bytes/s is compared with.
  double best_gbs() const;
};

// STREAM-like kernels over arrays far larger than the last-level cache, run on
// all cores through bench_pool(); best of several passes. Cached after the first call.
const MemoryBandwidth& measure_memory_bandwidth();
inline double measure_memory_bandwidth_gbs() { return measure_memory_bandwidth().best_gbs(); }

// One pass of the read kernel over an array of its own (96 MiB, in 2 MiB pages
// unless --huge_pages=0) on every pool thread: GB/s. A benchmark that
// alternates passes with its own steps and takes the mean of both compares
// them under the same load: this machine's bandwidth drifts by 10-30% from
// one minute to the next, which a ceiling taken once at start cannot follow.
double read_pass_gbs();

// One sgemm of the ceiling's shape on every pool thread at once: GFLOP/s.
double sgemm_pass_gflops();

// Passes of a ceiling (read_pass_gbs, sgemm_pass_gflops) interleaved with a
// benchmark's own timed iterations: one after the first iteration, then one
// after every kEverySeconds of iteration time, so they sample the same
// minutes as the iterations at a bounded cost.
class InterleavedCeiling {
 public:
  static constexpr double kEverySeconds = 0.05;
  explicit InterleavedCeiling(std::function<double()> pass) : pass_(std::move(pass)) {}
  // Call after each timed iteration, outside its timing, with its duration.
  void after_iteration(double iteration_seconds);
  // Work of a pass / mean pass time (every pass does the same work): the
  // ceiling for the iterations around the passes; 0 before any pass.
  double rate() const { return passes_ > 0 ? double(passes_) / inverse_rates_ : 0.0; }
  // `work` (bytes or FLOPs, in the passes' unit times 1e9) done in `seconds`
  // against rate(); 0 when either is missing.
  double ratio(double work, double seconds) const {
    return seconds > 0 && rate() > 0 ? work / seconds / 1e9 / rate() : 0.0;
  }

 private:
  std::function<double()> pass_;
  double since_last_pass_ = kEverySeconds;
  int passes_ = 0;
  double inverse_rates_ = 0.0;
};

struct SgemmRate {
  double single_thread_gflops;  // one cblas_sgemm on one core
  double pool_gflops;           // one single-threaded sgemm per pool thread at once
  int threads;
};

// OpenBLAS sgemm (single-threaded, as linear() uses it) on a prefill-like shape,
// alone and concurrently on every pool thread. Cached after the first call.
const SgemmRate& measure_sgemm();
inline double measure_sgemm_gflops() { return measure_sgemm().pool_gflops; }

}  // namespace baton::bench
