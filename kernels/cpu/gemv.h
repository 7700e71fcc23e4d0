// kernels/cpu/gemv.h — the small-batch (decode) half of linear(): every row of
// W is streamed from memory once and applied to all m rows of x.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace baton::kernels::cpu {

// Largest m the GEMV path takes; bigger batches go to sgemm. Up to here
// streaming W once beats converting it to F32 for sgemm (measured at m = 16:
// several times faster for BF16 weights).
inline constexpr int64_t kGemvMaxBatch = 16;
// The same for the 512-bit kernel (gemv_avx512.h), which at m = 32 beats
// converting half-precision weights for sgemm (decode steps of batch 32:
// 1.05-1.48x the tokens/s on the Intel Xeon) and at m = 64 does not
// (0.81-1.08).
inline constexpr int64_t kGemvMaxBatchAvx512 = 32;

// The largest m gemv_rows takes with the kernels this CPU runs.
int64_t gemv_max_batch();

// Weight rows the batched GEMV reads side by side (each x load serves them
// all); row ranges that start on a multiple of it keep every block whole.
inline constexpr int64_t kGemvRowBlock = 4;

// Calls block.template operator()<R>(r, next_rows) for the blocks of
// kGemvRowBlock rows of [row_begin, row_end) (R = kGemvRowBlock), then for
// each row left (R = 1): rows [r, r + R), with the next next_rows rows (the
// next block) to be prefetched as they are read.
template <typename F>
void for_each_row_block(int64_t row_begin, int64_t row_end, F&& block) {
  int64_t r = row_begin;
  for (; r + kGemvRowBlock <= row_end; r += kGemvRowBlock) {
    const int64_t next = row_end - r - kGemvRowBlock;
    block.template operator()<kGemvRowBlock>(r, int(next < kGemvRowBlock ? next : kGemvRowBlock));
  }
  for (; r < row_end; ++r) block.template operator()<1>(r, 0);
}

// out[i, r] = x[i, :] · w[r, :] + bias[r] for i < m (m <= gemv_max_batch()) and
// r in [row_begin, row_end). x: [m, w.cols]; out: [m, w.rows]; bias: [w.rows] or null.
void gemv_rows(const float* x, int64_t m, const WeightView& w, const float* bias, int64_t row_begin,
               int64_t row_end, float* out);

}  // namespace baton::kernels::cpu
