#include "tests/engine/reference_model.h"

#include <algorithm>
#include <cmath>

#include "common/dtype.h"

namespace baton::engine::testing {
namespace {

using Vec = std::vector<double>;

double weight_at(const kernels::cpu::WeightView& w, int64_t row, int64_t col) {
  return double(load_as_float(w.data, w.dtype, size_t(row * w.cols + col)));
}

// y = W x (+ b), W [rows, cols].
Vec matvec(const kernels::cpu::WeightView& w, const Vec& x, const std::vector<float>& bias) {
  Vec y(size_t(w.rows), 0.0);
  for (int64_t r = 0; r < w.rows; ++r) {
    double acc = bias.empty() ? 0.0 : double(bias[size_t(r)]);
    for (int64_t c = 0; c < w.cols; ++c) acc += weight_at(w, r, c) * x[size_t(c)];
    y[size_t(r)] = acc;
  }
  return y;
}

// x with every element rounded to `dtype` (through F32), as a kernel that
// multiplies in that dtype sees it.
Vec rounded_to(Vec x, DType dtype) {
  if (dtype == DType::kF32) return x;
  for (double& v : x) {
    uint16_t half;
    store_from_float(&half, dtype, 0, float(v));
    v = load_as_float(&half, dtype, 0);
  }
  return x;
}

Vec rms_norm(const Vec& x, const std::vector<float>& weight, double eps) {
  double mean_square = 0;
  for (double v : x) mean_square += v * v;
  mean_square /= double(x.size());
  double inv = 1.0 / std::sqrt(mean_square + eps);
  Vec y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = x[i] * inv * double(weight[i]);
  return y;
}

// RMSNorm of each head of x [heads * head_dim] (Qwen3's q and k norms).
void norm_heads(Vec& x, int heads, int head_dim, const std::vector<float>& weight, double eps) {
  for (int h = 0; h < heads; ++h) {
    const auto at = ptrdiff_t(h) * head_dim;
    const Vec head(x.begin() + at, x.begin() + at + head_dim);
    const Vec normed = rms_norm(head, weight, eps);
    std::copy(normed.begin(), normed.end(), x.begin() + at);
  }
}

// rotate_half RoPE on each head of x [heads * head_dim] at `pos`.
void rope(Vec& x, int heads, int head_dim, int pos, const std::vector<float>& inv_freq) {
  int half = head_dim / 2;
  for (int h = 0; h < heads; ++h) {
    double* v = x.data() + size_t(h) * size_t(head_dim);
    for (int i = 0; i < half; ++i) {
      double angle = double(pos) * double(inv_freq[size_t(i)]);
      double c = std::cos(angle), s = std::sin(angle);
      double a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

std::vector<double> log_softmax(const std::vector<double>& logits) {
  double max = -INFINITY;
  for (double v : logits) max = std::max(max, v);
  double sum = 0;
  for (double v : logits) sum += std::exp(v - max);
  double log_sum = max + std::log(sum);
  std::vector<double> out(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) out[i] = logits[i] - log_sum;
  return out;
}

std::vector<std::vector<double>> reference_logits(const Checkpoint& checkpoint,
                                                  const std::vector<int32_t>& tokens,
                                                  DType kv_dtype, DType projection_input_dtype) {
  const ModelConfig& c = checkpoint.config();
  // What the cache holds: each element rounded to the KV dtype, or for the
  // 8-bit formats each head's row quantized with its own scale (max|row| /
  // the format's largest code), as kernels/cpu/attention.h says.
  auto round_to_kv = [kv_dtype, row = c.head_dim](Vec& x) {
    for (size_t r = 0; r < x.size(); r += size_t(row)) {
      float scale = 1.0f, inverse = 1.0f;
      if (is_quantized(kv_dtype)) {
        float amax = 0.0f;
        for (int i = 0; i < row; ++i) amax = std::max(amax, std::fabs(float(x[r + size_t(i)])));
        scale = amax > 0.0f ? amax / quantized_max(kv_dtype) : 0.0f;
        inverse = amax > 0.0f ? quantized_max(kv_dtype) / amax : 0.0f;
        if (!std::isfinite(inverse)) scale = inverse = 0.0f;  // too small: a zero row
      }
      for (int i = 0; i < row; ++i) {
        double& e = x[r + size_t(i)];
        float stored[1];
        store_from_float(stored, kv_dtype, 0, float(e) * inverse);
        e = double(load_as_float(stored, kv_dtype, 0)) * double(scale);
      }
    }
  };
  const ModelWeights& w = checkpoint.weights();
  const int hd = c.head_dim, heads = c.num_heads, kv_heads = c.num_kv_heads;
  const int group = heads / kv_heads;
  const auto inv_freq = rope_inv_freq(c);
  const size_t n = tokens.size();

  std::vector<Vec> x(n, Vec(size_t(c.hidden_size)));
  for (size_t t = 0; t < n; ++t)
    for (int i = 0; i < c.hidden_size; ++i)
      x[t][size_t(i)] = weight_at(w.embed_tokens, tokens[t], i) * double(c.embedding_multiplier);
  // Granite's multiplier, else 1/sqrt(head_dim).
  const double score_scale =
      c.attention_multiplier ? double(*c.attention_multiplier) : 1.0 / std::sqrt(double(hd));
  const double residual = c.residual_multiplier;

  for (int layer = 0; layer < c.num_layers; ++layer) {
    const LayerWeights& lw = w.layers[size_t(layer)];
    std::vector<Vec> q(n), k(n), v(n);
    for (size_t t = 0; t < n; ++t) {
      const Vec projected =
          rounded_to(rms_norm(x[t], lw.input_norm, c.rms_norm_eps), projection_input_dtype);
      q[t] = matvec(lw.q_proj, projected, lw.q_bias);
      k[t] = matvec(lw.k_proj, projected, lw.k_bias);
      v[t] = matvec(lw.v_proj, projected, lw.v_bias);
      if (c.qk_norm) {
        norm_heads(q[t], heads, hd, lw.q_norm, c.rms_norm_eps);
        norm_heads(k[t], kv_heads, hd, lw.k_norm, c.rms_norm_eps);
      }
      if (c.uses_rope(layer)) {
        rope(q[t], heads, hd, int(t), inv_freq);
        rope(k[t], kv_heads, hd, int(t), inv_freq);
      }
      round_to_kv(k[t]);
      round_to_kv(v[t]);
    }
    for (size_t t = 0; t < n; ++t) {
      Vec attn(size_t(heads * hd), 0.0);
      for (int h = 0; h < heads; ++h) {
        int kvh = h / group;
        Vec scores(t + 1);
        double max = -INFINITY;
        // Under a sliding window, only the last `window` positions.
        const int window = c.window_of(layer);
        const size_t first = window > 0 && t + 1 > size_t(window) ? t + 1 - size_t(window) : 0;
        for (size_t s = 0; s < first; ++s) scores[s] = -INFINITY;
        for (size_t s = first; s <= t; ++s) {
          double dot = 0;
          for (int d = 0; d < hd; ++d) dot += q[t][size_t(h * hd + d)] * k[s][size_t(kvh * hd + d)];
          scores[s] = dot * score_scale;
          max = std::max(max, scores[s]);
        }
        double sum = 0;
        for (double& sc : scores) sum += (sc = std::exp(sc - max));
        for (size_t s = 0; s <= t; ++s)
          for (int d = 0; d < hd; ++d)
            attn[size_t(h * hd + d)] += scores[s] / sum * v[s][size_t(kvh * hd + d)];
      }
      Vec o = matvec(lw.o_proj, rounded_to(attn, projection_input_dtype), lw.o_bias);
      for (size_t i = 0; i < o.size(); ++i) x[t][i] += o[i] * residual;
    }
    for (size_t t = 0; t < n; ++t) {
      const Vec h = rounded_to(rms_norm(x[t], lw.post_attention_norm, c.rms_norm_eps),
                               projection_input_dtype);
      Vec gate = matvec(lw.gate_proj, h, {});
      Vec up = matvec(lw.up_proj, h, {});
      for (size_t i = 0; i < gate.size(); ++i)
        gate[i] = gate[i] / (1.0 + std::exp(-gate[i])) * up[i];
      Vec down = matvec(lw.down_proj, rounded_to(gate, projection_input_dtype), {});
      for (size_t i = 0; i < down.size(); ++i) x[t][i] += down[i] * residual;
    }
  }
  std::vector<Vec> logits(n);
  for (size_t t = 0; t < n; ++t) {
    logits[t] = matvec(w.lm_head, rms_norm(x[t], w.final_norm, c.rms_norm_eps), {});
    for (double& l : logits[t]) l /= double(c.logits_scaling);
  }
  return logits;
}

}  // namespace baton::engine::testing
