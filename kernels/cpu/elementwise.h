// kernels/cpu/elementwise.h — norms, rotary embedding, activations, residuals.
// All activations are F32. Shapes are in the comments; nothing is allocated.
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace baton::kernels::cpu {

// out[r, :] = x[r, :] / sqrt(mean(x[r, :]²) + eps) * weight.  x, out: [rows, dim]; weight: [dim].
// out may alias x.
void rms_norm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t dim,
              float eps, float* out);

// Rotary embedding in Hugging Face's rotate_half form, in place:
//   x[t, h, i]        = x_i cos(p θ_i) - x_{i+d/2} sin(p θ_i)
//   x[t, h, i + d/2]  = x_{i+d/2} cos(p θ_i) + x_i sin(p θ_i),   i < d/2
// x: [tokens, heads, head_dim]; positions: [tokens]; inv_freq: [head_dim / 2] (θ_i).
void apply_rope(ThreadPool& pool, float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                int64_t head_dim, const float* inv_freq);

// out[i] = silu(gate[i]) * up[i] over n elements. out may alias gate.
void silu_and_mul(ThreadPool& pool, const float* gate, const float* up, int64_t n, float* out);

// x[i] += y[i] over n elements.
void add_in_place(ThreadPool& pool, float* x, const float* y, int64_t n);

// x[i] *= s for i < n.
void scale_in_place(ThreadPool& pool, float* x, float s, int64_t n);

}  // namespace baton::kernels::cpu
