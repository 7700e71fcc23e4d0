// kernels/cpu/gemm_bf16_amx.h — the large-batch (prefill) half of linear()
// for BF16 weights on CPUs with AMX (Intel Sapphire Rapids and later):
// TDPBF16PS multiplies a 16 x 32 tile of BF16 weights by a 32 x 16 tile of
// x in pairs, the work of 256 VDPBF16PS in one instruction.
//
// The weights are AMX's first operand, read in place: a weight tile is 16
// rows of 32 consecutive BF16 values, as the checkpoint stores them. x is
// the second operand, which AMX wants pair-interleaved; x is rounded to BF16
// (as for the VDPBF16PS GEMM, gemm_bf16_avx512.h) and packed once per call,
// where packing the weights would cost a pass over all of them per call.
// The output tiles are then out transposed, turned around in registers on
// their way to out. Sums are F32 as on the other BF16 path, in another
// order, with subnormal inputs and outputs flushed to zero.
#pragma once

#include <cstdint>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/linear.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__)

// Packed x: panels of 16 rows (rows past m zero), each all of a row's
// column pairs padded to whole tiles (pairs past the last column zero):
// panel p, pair k, row r at [(p * amx_x_pairs(cols) + k) * 16 + r], as
// pack_bf16_panels lays out weights (gemm_bf16_avx512.h).
inline int64_t amx_x_pairs(int64_t cols) { return (cols + 31) / 32 * 16; }
inline int64_t amx_x_panels(int64_t m) { return (m + kAmxTileRows - 1) / kAmxTileRows; }
inline int64_t amx_packed_x_size(int64_t m, int64_t cols) {
  return amx_x_panels(m) * amx_x_pairs(cols) * kAmxTileRows;
}

// Packs panels [panel_begin, panel_end) of x [m, cols] (F32), each value
// rounded to the nearest BF16 (ties to even), into xp as above. Call only
// when cpu_has_avx512_bf16().
void pack_x_for_amx(const float* x, int64_t m, int64_t cols, int64_t panel_begin, int64_t panel_end,
                    uint32_t* xp);

// out[i, r] = x[i, :] · w[r, :] + bias[r] for i < m and r in [row_begin,
// row_end): x packed by pack_x_for_amx (all its panels); w BF16; out
// [m, w.rows]; bias [w.rows] or null. Call only when use_amx_bf16(); the
// calling thread's tiles are configured on entry and released on return.
void gemm_bf16_rows_amx(const uint32_t* xp, int64_t m, const WeightView& w, const float* bias,
                        int64_t row_begin, int64_t row_end, float* out);

#endif

}  // namespace baton::kernels::cpu
