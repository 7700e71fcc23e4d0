// kernels/cuda/llama_ops.h — the CUDA backend's elementwise and gather ops
// of a Llama-family layer, BF16 activations. Norms, rotary embedding and
// SiLU-and-mul are FlashInfer's kernels; the row gather and the scale are
// Baton's own (no library has them without a framework).
//
// Plain C++ (no CUDA headers). Every pointer is a device pointer, `stream`
// a cudaStream_t; each call returns launch errors.
#pragma once

#include <cstdint>

#include "common/status.h"

namespace baton::kernels::cuda {

// out[i, :] = table[rows[i], :] for i < n; table [*, cols] row-major BF16,
// rows int32 (validated by the caller), out [n, cols] BF16. Embedding
// lookups, and the rows whose logits are wanted.
Status gather_rows_bf16(const void* table, int64_t cols, const int32_t* rows, int64_t n, void* out,
                        void* stream);

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight, rows of `dim`
// BF16 (dim a multiple of 8, rows 16-byte aligned).
Status rms_norm_bf16(const void* x, const void* weight, int64_t rows, int64_t dim, float eps,
                     void* out, void* stream);

// residual += x; x = rms_norm(residual) * weight, both in place; the norm is
// taken of the F32 sum, before it is rounded to BF16.
Status add_rms_norm_bf16(void* x, void* residual, const void* weight, int64_t rows, int64_t dim,
                         float eps, void* stream);

// Each head of x normalized in place: for t < tokens, h < heads, the row
// x[t * token_stride + h * head_dim, +head_dim) = rms_norm(row) * weight
// (BF16, head_dim a multiple of 8). Qwen3's q and k norms, read where the
// projection wrote them.
Status head_rms_norm_bf16(void* x, const void* weight, int64_t tokens, int32_t heads,
                          int32_t head_dim, int64_t token_stride, float eps, void* stream);

// Rotary embedding in Hugging Face's rotate_half form at each token's
// position, from a cos/sin table [max_positions, head_dim] F32 (each row
// cos θ_i p for i < head_dim/2, then sin θ_i p). Reads q and k at
// q + t * q_stride (heads of head_dim side by side), writes the rotated q
// into q_out [tokens, num_heads, head_dim] and k in place. head_dim 64 or 128.
struct RopeArgs {
  const void* q = nullptr;
  int64_t q_stride = 0;  // elements between tokens
  void* q_out = nullptr;
  void* k = nullptr;
  int64_t k_stride = 0;
  const int32_t* positions = nullptr;  // [tokens]
  const float* cos_sin = nullptr;
  int64_t tokens = 0;
  int32_t num_heads = 0, num_kv_heads = 0, head_dim = 0;
};
Status rope_bf16(const RopeArgs& args, void* stream);

// out[t, i] = silu(gate_up[t, i]) * gate_up[t, d + i]: gate_up [tokens, 2d]
// (the gate and up projections side by side), out [tokens, d], d a multiple of 8.
Status silu_and_mul_bf16(const void* gate_up, int64_t tokens, int64_t d, void* out, void* stream);

// x[i] = bf16(x[i] * factor) for n BF16 values, in place: Granite's
// embedding and residual multipliers, rounded as transformers rounds a BF16
// product.
Status scale_bf16(void* x, int64_t n, float factor, void* stream);

// dst[i] = bf16(src[i]) for n F32 values on the device (weights converted once).
Status f32_to_bf16(const float* src, int64_t n, void* dst, void* stream);

}  // namespace baton::kernels::cuda
