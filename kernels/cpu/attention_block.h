// kernels/cpu/attention_block.h — the inner step of paged attention: one KV
// block applied to a set of query vectors with an online softmax.
//
// The caller (attention.cc) walks a sequence's block table and hands each block
// here, in place or converted to F32; the query vectors are the query heads of one
// GQA group for one or more query rows, so each K/V vector is loaded once for
// the whole group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

#include "common/dtype.h"

namespace baton::kernels::cpu {

// Score of a masked key and running max of a row that has seen no key yet.
inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct AttentionBlockArgs {
  const float* q = nullptr;  // [n_q, head_dim], already multiplied by the scale
  int32_t n_q = 0;
  int32_t head_dim = 0;
  // The block's K and V tiles of kv_dtype: K with its keys side by side as
  // the pool stores them (common/kv_layout.h), dimension group c of key t at
  // element c * k_group_stride + t * g (g = key_group_of(kv_dtype)); V as rows,
  // [keys][head_dim]. Scores may read keys up to keys_padded (masked
  // afterwards), so they must be addressable; V rows are read up to
  // max(visible) only. Pass F16 or BF16 only when attend_block_reads_pool()
  // says so, else F32.
  const void* k = nullptr;
  size_t k_group_stride = 0;
  const void* v = nullptr;
  DType kv_dtype = DType::kF32;
  int32_t keys_padded = 0;           // rows of k/v and the scores stride; a multiple of 8
  const int32_t* visible = nullptr;  // [n_q]: query i sees keys [0, visible[i]) of this block
  // [n_q] or null: under a sliding window, query i does not see keys
  // [0, hidden[i]) of this block either.
  const int32_t* hidden = nullptr;
  float* scores = nullptr;  // scratch [n_q, keys_padded]
  float* alpha = nullptr;   // scratch [n_q]
  // Running online-softmax state, updated in place:
  float* row_max = nullptr;  // [n_q], -inf before the first block
  float* row_sum = nullptr;  // [n_q], 0 before the first block
  float* acc = nullptr;      // [n_q, head_dim], unnormalised output
};

// Keys [0, hidden) of a row of scores fall before a sliding window: they
// become -inf, which the softmaxes here turn into 0 (the scalar one) or
// about 1e-38 (the vector exps clamp their input at -87). Returns the
// count of keys from the row's start the softmax must take: `visible`, or 0
// when the row sees none of [0, visible) (a softmax over nothing but -inf
// would give NaN).
inline int32_t mask_before_window(float* s, int32_t hidden, int32_t visible) {
  if (hidden <= 0) return visible;
  if (hidden >= visible) return 0;
  for (int32_t t = 0; t < hidden; ++t) s[t] = kNegInf;
  return visible;
}

// Applies one block. Uses AVX2 when enabled and head_dim % 8 == 0.
void attend_block(const AttentionBlockArgs& a);

// True when attend_block can read a pool's K and V tiles of `kv_dtype` in
// place for this shape; otherwise the caller converts them to F32 first
// (always for the quantized formats).
bool attend_block_reads_pool(int32_t head_dim, int32_t block_size, DType kv_dtype);

#if defined(__x86_64__) || defined(__i386__)
// One online-softmax step over a row of scores s[0, keys) (keys a multiple of
// 8): keys at or past `visible` get probability 0; s becomes exp(s - max) with
// the running max and sum updated. Returns the factor the row's earlier
// accumulation must be scaled by. AVX2: call only when use_avx2().
float softmax_update_avx2(float* s, int32_t visible, int32_t keys, float* row_max, float* row_sum);
#endif

}  // namespace baton::kernels::cpu
