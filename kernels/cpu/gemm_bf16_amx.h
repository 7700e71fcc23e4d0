// kernels/cpu/gemm_bf16_amx.h — the large-batch (prefill) half of linear()
// for BF16 weights on CPUs with AMX (Intel Sapphire Rapids and later): x
// rounded to BF16 as for the VDPBF16PS GEMM (gemm_bf16_avx512.h), the
// weights packed into the same pair-interleaved panels, and 16 x 16 blocks
// of the output accumulated in tile registers by TDPBF16PS, each of which
// does the work of 256 VDPBF16PS. The sums are F32 as on the other BF16
// path, in another order, with subnormal inputs and outputs flushed to zero.
#pragma once

#include <cstdint>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/linear.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__)

// Tiles are whole: the GEMM reads x in blocks of 16 rows and 32 columns, so
// its rows are amx_padded_rows(m) and each amx_row_stride(cols) elements
// long, padded with zeros (a pad of garbage could hold a NaN, which times a
// zero weight would still be a NaN).
inline int64_t amx_padded_rows(int64_t m) {
  return (m + kAmxTileRows - 1) / kAmxTileRows * kAmxTileRows;
}
inline int64_t amx_row_stride(int64_t cols) { return (cols + 31) / 32 * 32; }

// out[i, r] = xb[i, :] · w[r, :] + bias[r] for i < m and r in [row_begin,
// row_end): xb as above (round_rows_to_bf16 with amx_row_stride(w.cols),
// rows m to amx_padded_rows(m) zero); w BF16; out [m, w.rows]; bias
// [w.rows] or null. Call only when use_amx_bf16(); the calling thread's
// tiles are configured on entry and released on return.
void gemm_bf16_rows_amx(const uint16_t* xb, int64_t m, const WeightView& w, const float* bias,
                        int64_t row_begin, int64_t row_end, float* out);

#endif

}  // namespace baton::kernels::cpu
