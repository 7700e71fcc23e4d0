// kernels/cpu/gemm_bf16_avx512.h — the large-batch (prefill) half of linear()
// for BF16 weights on CPUs with AVX512_BF16: x is rounded to BF16 once and
// multiplied with VDPBF16PS (two BF16 products summed into each F32 lane),
// twice the multiply-adds of an F32 FMA per instruction and no F32 copy of
// the weights. Rounding x to BF16 is what llama.cpp and oneDNN do for BF16
// weights too; the outputs then differ from the F32 path by about 2^-9 of
// the magnitudes summed.
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__) || defined(__i386__)

// Elements of one BF16 row of x: cols rounded up to a whole pair (the odd
// column's partner is 0).
inline int64_t bf16_row_stride(int64_t cols) { return (cols + 1) / 2 * 2; }

// dst[i, c] = x[i, c] rounded to the nearest BF16 (ties to even), for rows
// [row_begin, row_end) of x [*, cols]; dst rows are bf16_row_stride(cols)
// long and padded with 0. Call only when cpu_has_avx512_bf16().
void round_rows_to_bf16(const float* x, int64_t cols, int64_t row_begin, int64_t row_end,
                        uint16_t* dst);

// Weight rows per packed panel.
inline constexpr int64_t kBf16PanelRows = 16;

// Column pairs [pair_begin, pair_begin + pairs) of BF16 weight rows
// [row_begin, row_end), panel by panel: dst[p][k][r] is pair k of row
// 16p + r as one 32-bit element (the even column in its low half), 0 past
// row_end and past the last column. This is the pair-interleaved layout
// both VDPBF16PS and AMX's TDPBF16PS read (16 rows of a pair in 64 bytes).
// dst holds panels x pairs x 16 elements. Call only when cpu_has_avx512_bf16().
void pack_bf16_panels(const WeightView& w, int64_t row_begin, int64_t row_end, int64_t pair_begin,
                      int64_t pairs, uint32_t* dst);

// out[i, r] = xb[i, :] · w[r, :] + bias[r] for i < m and r in [row_begin,
// row_end): xb as round_rows_to_bf16 wrote it for all m rows; w BF16;
// out [m, w.rows]; bias [w.rows] or null. Call only when cpu_has_avx512_bf16().
void gemm_bf16_rows_avx512(const uint16_t* xb, int64_t m, const WeightView& w, const float* bias,
                           int64_t row_begin, int64_t row_end, float* out);

#endif

}  // namespace baton::kernels::cpu
