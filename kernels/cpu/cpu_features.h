// kernels/cpu/cpu_features.h — run-time choice between the AVX2 kernels and
// their portable scalar twins, plus a few parallel-loop helpers.
#pragma once

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {

// True when the CPU has AVX2, FMA and F16C (checked once).
bool cpu_has_avx2_fma_f16c();

// True when the AVX2 paths are to be used: the CPU has them and they were not
// switched off with set_simd_enabled(false) (tests use that to cover the
// scalar fallback on AVX2 machines).
bool use_avx2();
void set_simd_enabled(bool enabled);

// Runs f(begin, end, thread_index) over [0, n) in at most pool.size() chunks of
// at least min_chunk elements; small problems run inline on the caller, which
// avoids waking workers for a few microseconds of work.
template <typename F>
void parallel_chunks(ThreadPool& pool, int64_t n, int64_t min_chunk, F&& f) {
  if (n <= 0) return;
  int64_t chunks =
      std::min<int64_t>(pool.size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
  if (chunks <= 1) {
    f(int64_t{0}, n, 0);
    return;
  }
  pool.parallel_for(chunks,
                    [&](int64_t c0, int64_t c1, int t) { f(n * c0 / chunks, n * c1 / chunks, t); });
}

}  // namespace baton::kernels::cpu
