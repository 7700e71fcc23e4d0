// kernels/cpu/gemm_bf16_amx.h — linear() for BF16 weights on CPUs with AMX
// (Intel Sapphire Rapids and later): prefill, and decode batches from
// kAmxMinRows rows (linear.h). TDPBF16PS multiplies a 16 x 32 tile of BF16
// weights by a 32 x 16 tile of x in pairs, the work of 256 VDPBF16PS in one
// instruction.
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

// How x meets the tiles: rounded to the nearest BF16 (ties to even) once,
// as the VDPBF16PS GEMM takes it (prefill), or split into three BF16 parts
// whose sum is x exactly (but for parts below 2^-126, which AMX flushes to
// 0), each multiplied into sums of its own that are added at the
// end: the products are then F32's, as the GEMV's, for three times the
// multiplies. Batches of a few rows (decode steps, which the GEMV takes
// elsewhere) take the split: rounding x moved the test models'
// log-probabilities by up to 0.03-0.09 against the GEMV's and transformers'
// F32 references, two parts (16 bits of x) by 2e-4.
enum class AmxX { kRounded, kSplit };
inline int64_t amx_x_parts(AmxX form) { return form == AmxX::kSplit ? 3 : 1; }

// Packed x: panels of 16 rows (rows past m zero), each all of a row's
// column pairs padded to whole tiles (pairs past the last column zero):
// panel p, pair k, row r at [(p * amx_x_pairs(cols) + k) * 16 + r], as
// pack_bf16_panels lays out weights (gemm_bf16_avx512.h). Split, rows
// 16q.. have their parts in panels 3q (hi), 3q + 1 and 3q + 2.
inline int64_t amx_x_pairs(int64_t cols) { return (cols + 31) / 32 * 16; }
// Panels of 16 rows of x: what pack_x_for_amx shares out.
inline int64_t amx_x_row_panels(int64_t m) { return (m + kAmxTileRows - 1) / kAmxTileRows; }
inline int64_t amx_packed_x_size(int64_t m, int64_t cols, AmxX form) {
  return amx_x_row_panels(m) * amx_x_parts(form) * amx_x_pairs(cols) * kAmxTileRows;
}

// Packs the rows of panels [panel_begin, panel_end) (of amx_x_row_panels(m))
// of x [m, cols] (F32) into xp in `form`, as above. Call only when
// cpu_has_avx512_bf16().
void pack_x_for_amx(const float* x, int64_t m, int64_t cols, int64_t panel_begin, int64_t panel_end,
                    AmxX form, uint32_t* xp);

// out[i, r] = x[i, :] · w[r, :] + bias[r] for i < m and r in [row_begin,
// row_end): x packed by pack_x_for_amx in `form` (all its panels); w BF16;
// out [m, w.rows]; bias [w.rows] or null. Call only when use_amx_bf16();
// the calling thread's tiles are configured on entry and released on
// return.
void gemm_bf16_rows_amx(const uint32_t* xp, int64_t m, AmxX form, const WeightView& w,
                        const float* bias, int64_t row_begin, int64_t row_end, float* out);

#endif

}  // namespace baton::kernels::cpu
