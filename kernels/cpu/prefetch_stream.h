// kernels/cpu/prefetch_stream.h — the software prefetch stream of the decode
// attention kernels (attention_decode.cc and its AVX-512 passes), which
// follows a partition's scattered blocks in the order the kernel reads them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace baton::kernels::cpu {

// Prefetches a partition's memory in the order the kernel reads it, a fixed
// distance ahead of the reads and paced to them: a few lines per step of the
// inner loops, as many as the step consumes. The memory is a list of regions
// of equal size, read one after the other: the K parts of a partition's
// blocks, then their V parts (which follow the K parts in each block); or
// K tiles of single heads in the order a kernel takes them, then their V
// tiles; or a run's K tiles, then its V tiles, run after run. A core here
// can keep only a couple of dozen misses in flight, so its share of the
// memory bandwidth depends on misses being outstanding all the time.
// Prefetching the whole partition during the score pass left the core with
// nothing in flight during the softmax and V passes, and a burst of hundreds
// of prefetches stalls the arithmetic until memory has answered most of
// them; either way memory time and compute time add up instead of
// overlapping.
class PrefetchStream {
 public:
  // `count` regions of region_bytes each, at regions[0..count); the caller
  // keeps the list alive while the stream runs.
  PrefetchStream(const char* const* regions, int32_t count, size_t region_bytes)
      : regions_(regions), count_(count), region_bytes_(region_bytes) {}

  // Appends to `out` the K regions k[0..n), then their V regions (v_offset
  // further on each), then `then` if not null: the next partition's start,
  // where the thread will read next.
  static void k_then_v(const char* const* k, int32_t n, size_t v_offset, const char* then,
                       std::vector<const char*>& out) {
    out.insert(out.end(), k, k + n);
    for (int32_t i = 0; i < n; ++i) out.push_back(k[i] + v_offset);
    if (then) out.push_back(then);
  }

  // Issues the first `regions` regions at once: nothing is in flight yet.
  void prime(int32_t regions) {
    const size_t lines = size_t(regions) * (region_bytes_ / kCacheLine);
    for (size_t i = 0; i < lines && next_line(); ++i) {
    }
  }
  // Each tile is read by `readers` groups of queries, so a read of n bytes
  // consumes n / readers bytes of the stream.
  void set_readers(int32_t readers) { line_credit_ = kCacheLine * size_t(std::max(readers, 1)); }
  // Called as the kernel reads: keeps the stream as far ahead as it was.
  [[gnu::always_inline]] void consumed(size_t bytes) {
    for (credit_ += bytes; credit_ >= line_credit_; credit_ -= line_credit_)
      if (!next_line()) {
        credit_ = 0;
        return;
      }
  }

 private:
  // Prefetches the stream's next cache line; false once it is exhausted.
  [[gnu::always_inline]] bool next_line() {
    if (next_ == end_) {
      if (region_ == count_) return false;
      next_ = regions_[region_++];
      end_ = next_ + region_bytes_;
    }
    __builtin_prefetch(next_, 0, 2);
    next_ += kCacheLine;
    return true;
  }

  const char* const* regions_;
  int32_t count_;
  size_t region_bytes_;
  int32_t region_ = 0;  // next region to start
  const char* next_ = nullptr;
  const char* end_ = nullptr;
  size_t line_credit_ = kCacheLine;  // bytes x readers per prefetched line
  size_t credit_ = 0;
};

}  // namespace baton::kernels::cpu
