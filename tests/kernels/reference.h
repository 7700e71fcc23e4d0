// tests/kernels/reference.h — plain double-precision reference implementations
// of every CPU kernel, written the obvious way (no tiling, no paging, full
// score matrices) so the optimised kernels have something independent to match.
#pragma once

#include <cstdint>
#include <vector>

namespace baton::kernels::reference {

// out[m, rows] = x[m, cols] · wᵀ + bias; w already dequantised, [rows, cols].
std::vector<double> linear(const std::vector<float>& x, int64_t m, const std::vector<double>& w,
                           int64_t rows, int64_t cols, const float* bias);

// Per row: x / sqrt(mean(x²) + eps) * weight.
std::vector<double> rms_norm(const std::vector<float>& x, const std::vector<float>& weight,
                             int64_t rows, int64_t dim, double eps);

// rotate_half RoPE. The angle is float32(position) * inv_freq rounded to float,
// exactly as Hugging Face forms it in float32; cos/sin and the rotation in double.
std::vector<double> rope(const std::vector<float>& x, const std::vector<int32_t>& positions,
                         int64_t heads, int64_t head_dim, const std::vector<float>& inv_freq);

std::vector<double> silu_and_mul(const std::vector<float>& gate, const std::vector<float>& up);

// Causal GQA attention of one sequence over contiguous K/V.
// q: [q_len, num_heads, head_dim]; k, v: [ctx, num_kv_heads, head_dim] (dequantised).
// Row j sits at position ctx - q_len + j and sees the keys up to it; with
// window > 0, only the last `window` of them. Returns [q_len, num_heads, head_dim].
std::vector<double> attention(const std::vector<float>& q, int64_t q_len,
                              const std::vector<double>& k, const std::vector<double>& v,
                              int64_t ctx, int64_t num_heads, int64_t num_kv_heads,
                              int64_t head_dim, double scale, int64_t window = 0);

// log_softmax over a vector of logits.
std::vector<double> log_softmax(const float* logits, int64_t n);

}  // namespace baton::kernels::reference
