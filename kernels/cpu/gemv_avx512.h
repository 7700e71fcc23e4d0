// kernels/cpu/gemv_avx512.h — the batched GEMV of gemv.h (m = 2 ..
// kGemvMaxBatchAvx512 rows of x) with 512-bit FMAs.
//
// At batch 8 the AVX2 GEMV is bound by its FMAs, not by memory (BF16: 43% of
// the read passes on an Intel Xeon, bench/results/2026-12-02-whole-model-xeon.md),
// so twice the lanes
// per FMA are worth having there. It applies four weight rows to four x
// rows per pass (16 accumulators): each weight vector feeds four FMAs and
// each x vector four. Batch 1 stays on the AVX2 kernel: a 512-bit one made
// whole decode steps no faster (the same file).
#pragma once

#include <cstdint>

#include "kernels/cpu/linear.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__) || defined(__i386__)

// As gemv_rows for 2 <= m <= kGemvMaxBatchAvx512. Call only when use_avx512().
void gemv_rows_avx512(const float* x, int64_t m, const WeightView& w, const float* bias,
                      int64_t row_begin, int64_t row_end, float* out);

#endif

}  // namespace baton::kernels::cpu
