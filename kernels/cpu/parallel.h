// kernels/cpu/parallel.h — loop helpers over ThreadPool that every kernel uses:
// small problems stay on the calling thread, large ones are split statically
// (equal work per element) or claimed dynamically (uneven or preemptible work).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {

// Runs f(begin, end, thread_index) over [0, n) in at most pool.size() chunks of
// at least min_chunk elements; small problems run inline on the caller, which
// avoids waking workers for a few microseconds of work.
template <typename F>
void parallel_chunks(ThreadPool& pool, int64_t n, int64_t min_chunk, F&& f) {
  if (n <= 0) return;
  const int64_t chunks =
      std::min<int64_t>(pool.size(), std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk)));
  if (chunks <= 1) {
    f(int64_t{0}, n, 0);
    return;
  }
  pool.parallel_for(chunks,
                    [&](int64_t c0, int64_t c1, int t) { f(n * c0 / chunks, n * c1 / chunks, t); });
}

// Threads that share n elements when each should get `min_share` of them on
// average; when that is fewer than two, f(0, n, 0) has run inline on the
// caller (nothing, for n <= 0) and the answer is 0: nothing left to share.
template <typename F>
int64_t threads_sharing_or_run_inline(ThreadPool& pool, int64_t n, int64_t min_share, F& f) {
  if (n <= 0) return 0;
  const int64_t sharing = std::min<int64_t>(pool.size(), n / std::max<int64_t>(1, min_share));
  if (sharing > 1) return sharing;
  f(int64_t{0}, n, 0);
  return 0;
}

// Runs f(begin, end, thread_index) over [0, n) in pieces of about `grain`
// elements (whole groups of `align`) that running threads claim one by one: a
// thread that starts late or is preempted (other processes share the cores)
// takes fewer pieces instead of holding everyone up with a fixed half of the
// work. Each thread is given at least `min_share` elements, or none: too
// little work runs inline on the caller. The pieces are equal and, unless
// there are fewer groups, as many as a multiple of the threads that share the
// work, so threads running alike finish together: 576 rows in pieces of 64
// would leave one of two threads 5/9 of the work, 192 rows in one piece of
// 256 all of it.
template <typename F>
void parallel_dynamic(ThreadPool& pool, int64_t n, int64_t grain, int64_t align, int64_t min_share,
                      F&& f) {
  const int64_t sharing = threads_sharing_or_run_inline(pool, n, min_share, f);
  if (sharing == 0) return;
  align = std::max<int64_t>(1, align);
  grain = std::max<int64_t>(1, grain);
  const int64_t groups = (n + align - 1) / align;
  const int64_t pieces = std::min(groups, ((n - 1) / grain + sharing) / sharing * sharing);
  auto bound = [&](int64_t piece) { return std::min(n, groups * piece / pieces * align); };
  std::atomic<int64_t> next{0};
  pool.parallel_for(std::min(sharing, pieces), [&](int64_t, int64_t, int t) {
    for (int64_t piece; (piece = next.fetch_add(1, std::memory_order_relaxed)) < pieces;)
      f(bound(piece), bound(piece + 1), t);
  });
}

// Runs f(begin, end, thread_index) over [0, n) in pieces that shrink as the
// work runs out (guided scheduling): each claim takes a 1/(2 x threads) share
// of what is left, between `min_piece` and `max_piece` elements (whole
// groups of `align`). Long pieces early keep streams long; short ones at the
// end leave the thread that finishes first waiting for at most a short piece
// of the other's. Threads share the work only if each has `min_share`
// elements on average; too little work runs inline on the caller.
template <typename F>
void parallel_guided(ThreadPool& pool, int64_t n, int64_t min_piece, int64_t max_piece,
                     int64_t align, int64_t min_share, F&& f) {
  const int64_t sharing = threads_sharing_or_run_inline(pool, n, min_share, f);
  if (sharing == 0) return;
  align = std::max<int64_t>(1, align);
  auto round_up = [&](int64_t x) { return (x + align - 1) / align * align; };
  min_piece = round_up(std::max<int64_t>(1, min_piece));
  max_piece = std::max(min_piece, round_up(max_piece));
  std::atomic<int64_t> next{0};
  pool.parallel_for(sharing, [&](int64_t, int64_t, int t) {
    int64_t begin = next.load(std::memory_order_relaxed);
    while (begin < n) {
      const int64_t piece = std::clamp(round_up((n - begin) / (2 * sharing)), min_piece, max_piece);
      const int64_t end = std::min(n, begin + piece);
      if (!next.compare_exchange_weak(begin, end, std::memory_order_relaxed)) continue;
      f(begin, end, t);
      begin = next.load(std::memory_order_relaxed);
    }
  });
}

}  // namespace baton::kernels::cpu
