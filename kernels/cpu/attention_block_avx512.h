// kernels/cpu/attention_block_avx512.h — the V step of prefill attention's
// block kernel (attention_block.h) with 512-bit FMAs.
//
// The block kernel keeps each query's output in element order from block to
// block, rescaled by the online softmax, so unlike decode's V pass this one
// widens half-precision V rows in order (VPMOVZXWD or VCVTPH2PS), 16
// elements a step.
#pragma once

#include <cstdint>

#include "common/dtype.h"

namespace baton::kernels::cpu {

#if defined(__x86_64__) || defined(__i386__)

// acc_r = acc_r * alpha[r] + Σ_t p_r[t] v_t for `queries` (1..4) query
// vectors r and keys t in [0, keys): p_r at p + r p_stride, v_t the t-th
// row of the V tile v ([keys][d] of dtype t), acc_r at acc + r d. d is a
// multiple of 16. Call only when use_avx512().
void block_pv_avx512(DType t, int32_t queries, const float* p, int32_t p_stride, const float* alpha,
                     const void* v, int32_t d, int32_t keys, float* acc);

#endif

}  // namespace baton::kernels::cpu
