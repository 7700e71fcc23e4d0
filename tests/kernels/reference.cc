#include "tests/kernels/reference.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace baton::kernels::reference {

std::vector<double> linear(const std::vector<float>& x, int64_t m, const std::vector<double>& w,
                           int64_t rows, int64_t cols, const float* bias) {
  std::vector<double> out(static_cast<size_t>(m * rows));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t r = 0; r < rows; ++r) {
      double sum = bias ? double(bias[r]) : 0.0;
      for (int64_t c = 0; c < cols; ++c)
        sum += double(x[size_t(i * cols + c)]) * w[size_t(r * cols + c)];
      out[size_t(i * rows + r)] = sum;
    }
  return out;
}

std::vector<double> rms_norm(const std::vector<float>& x, const std::vector<float>& weight,
                             int64_t rows, int64_t dim, double eps) {
  std::vector<double> out(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0.0;
    for (int64_t i = 0; i < dim; ++i) ss += double(x[size_t(r * dim + i)]) * x[size_t(r * dim + i)];
    const double inv = 1.0 / std::sqrt(ss / double(dim) + eps);
    for (int64_t i = 0; i < dim; ++i)
      out[size_t(r * dim + i)] = double(x[size_t(r * dim + i)]) * inv * double(weight[size_t(i)]);
  }
  return out;
}

std::vector<double> rope(const std::vector<float>& x, const std::vector<int32_t>& positions,
                         int64_t heads, int64_t head_dim, const std::vector<float>& inv_freq) {
  std::vector<double> out(x.size());
  const int64_t half = head_dim / 2;
  for (size_t t = 0; t < positions.size(); ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const size_t base = (t * size_t(heads) + size_t(h)) * size_t(head_dim);
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(positions[t]) * inv_freq[size_t(i)];
        const double c = std::cos(double(angle)), s = std::sin(double(angle));
        const double a = x[base + size_t(i)], b = x[base + size_t(i + half)];
        out[base + size_t(i)] = a * c - b * s;
        out[base + size_t(i + half)] = b * c + a * s;
      }
    }
  return out;
}

std::vector<double> silu_and_mul(const std::vector<float>& gate, const std::vector<float>& up) {
  std::vector<double> out(gate.size());
  for (size_t i = 0; i < gate.size(); ++i) {
    const double g = gate[i];
    out[i] = g / (1.0 + std::exp(-g)) * double(up[i]);
  }
  return out;
}

std::vector<double> attention(const std::vector<float>& q, int64_t q_len,
                              const std::vector<double>& k, const std::vector<double>& v,
                              int64_t ctx, int64_t num_heads, int64_t num_kv_heads,
                              int64_t head_dim, double scale, int64_t window) {
  std::vector<double> out(static_cast<size_t>(q_len * num_heads * head_dim), 0.0);
  const int64_t group = num_heads / num_kv_heads;
  for (int64_t h = 0; h < num_heads; ++h) {
    const int64_t kvh = h / group;
    // Full [q_len, ctx] score matrix, masked causally.
    std::vector<double> scores(static_cast<size_t>(q_len * ctx),
                               -std::numeric_limits<double>::infinity());
    for (int64_t j = 0; j < q_len; ++j) {
      const int64_t pos = ctx - q_len + j;
      for (int64_t t = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0; t <= pos; ++t) {
        double dot = 0.0;
        for (int64_t c = 0; c < head_dim; ++c)
          dot += double(q[size_t((j * num_heads + h) * head_dim + c)]) *
                 k[size_t((t * num_kv_heads + kvh) * head_dim + c)];
        scores[size_t(j * ctx + t)] = dot * scale;
      }
    }
    for (int64_t j = 0; j < q_len; ++j) {
      double* row = scores.data() + j * ctx;
      const double mx = *std::max_element(row, row + ctx);
      double sum = 0.0;
      for (int64_t t = 0; t < ctx; ++t) {
        row[t] = std::exp(row[t] - mx);
        sum += row[t];
      }
      for (int64_t t = 0; t < ctx; ++t) {
        const double p = row[t] / sum;
        for (int64_t c = 0; c < head_dim; ++c)
          out[size_t((j * num_heads + h) * head_dim + c)] +=
              p * v[size_t((t * num_kv_heads + kvh) * head_dim + c)];
      }
    }
  }
  return out;
}

std::vector<double> log_softmax(const float* logits, int64_t n) {
  double mx = -std::numeric_limits<double>::infinity();
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, double(logits[i]));
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += std::exp(double(logits[i]) - mx);
  const double lse = mx + std::log(sum);
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[size_t(i)] = double(logits[i]) - lse;
  return out;
}

}  // namespace baton::kernels::reference
