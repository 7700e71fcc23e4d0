// kernels/cpu/prefetch_stream.h — the software prefetch stream of the decode
// attention kernels (attention_decode.cc and its AVX-512 passes), which
// follows a partition's scattered blocks in the order the kernel reads them.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/cpu_features.h"

namespace baton::kernels::cpu {

// Prefetches a partition's memory in the order the kernel reads it (the K
// parts of its blocks, then their V parts, which follow the K parts in each
// block; or K tiles of single heads in the order a kernel takes them, then
// their V tiles), a fixed distance ahead of the reads and paced to them: a
// few lines per step of the inner loops, as many as the step consumes. A core here can
// keep only a couple of dozen misses in flight, so its share of the memory
// bandwidth depends on misses being outstanding all the time. Prefetching the
// whole partition during the score pass left the core with nothing in flight
// during the softmax and V passes, and a burst of hundreds of prefetches
// stalls the arithmetic until memory has answered most of them; either way
// memory time and compute time add up instead of overlapping.
class PrefetchStream {
 public:
  // `then`, if not null, is a block whose K part the stream ends with: where
  // the thread's next partition starts.
  PrefetchStream(const char* const* blocks, int32_t num_blocks, size_t part_bytes, const char* then)
      : PrefetchStream(blocks, num_blocks, part_bytes, part_bytes, then) {}
  // The same for `num_blocks` K regions of part_bytes each (tiles of one KV
  // head), whose V regions lie v_offset further on; `then` is prefetched for
  // part_bytes.
  PrefetchStream(const char* const* blocks, int32_t num_blocks, size_t part_bytes, size_t v_offset,
                 const char* then)
      : blocks_(blocks),
        num_blocks_(num_blocks),
        num_parts_(2 * num_blocks + (then ? 1 : 0)),
        part_bytes_(part_bytes),
        v_offset_(v_offset),
        then_(then) {}

  // Issues the first `parts` parts at once: nothing is in flight yet.
  void prime(int32_t parts) {
    const size_t lines = size_t(parts) * (part_bytes_ / kCacheLine);
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
      if (part_ == num_parts_) return false;
      if (part_ == 2 * num_blocks_)
        next_ = then_;
      else if (part_ < num_blocks_)
        next_ = blocks_[part_];
      else
        next_ = blocks_[part_ - num_blocks_] + v_offset_;
      end_ = next_ + part_bytes_;
      ++part_;
    }
    __builtin_prefetch(next_, 0, 2);
    next_ += kCacheLine;
    return true;
  }

  const char* const* blocks_;
  int32_t num_blocks_;
  int32_t num_parts_;
  size_t part_bytes_;
  size_t v_offset_;
  const char* then_;
  int32_t part_ = 0;  // next part to start: K of blocks 0..n-1, V of 0..n-1, then
  const char* next_ = nullptr;
  const char* end_ = nullptr;
  size_t line_credit_ = kCacheLine;  // bytes x readers per prefetched line
  size_t credit_ = 0;
};

}  // namespace baton::kernels::cpu
