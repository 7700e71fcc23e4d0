#include "kernels/cpu/elementwise.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/parallel.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {
// Elements below which an elementwise kernel runs on the calling thread only:
// waking a worker costs more than the work.
constexpr int64_t kMinParallelElements = 1 << 14;

float silu_times(float g, float u) { return g / (1.0f + std::exp(-g)) * u; }

#if BATON_HAVE_X86
// Eight at a time with the vector exp: libm's scalar expf made SiLU a few
// percent of a whole prefill.
BATON_AVX2 void silu_and_mul_avx2(const float* gate, const float* up, int64_t i0, int64_t i1,
                                  float* out) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 sigmoid_denominator =
        _mm256_add_ps(one, avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), g)));
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(_mm256_div_ps(g, sigmoid_denominator), _mm256_loadu_ps(up + i)));
  }
  for (; i < i1; ++i) out[i] = silu_times(gate[i], up[i]);
}
#endif
}  // namespace

void rms_norm(ThreadPool& pool, const float* x, const float* weight, int64_t rows, int64_t dim,
              float eps, float* out) {
  parallel_chunks(pool, rows,
                  std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, dim)),
                  [&](int64_t r0, int64_t r1, int) {
                    for (int64_t r = r0; r < r1; ++r) {
                      const float* xr = x + r * dim;
                      float* o = out + r * dim;
                      // Double keeps the mean exact enough for long rows; the
                      // scale is then rounded to float, as HF's float32 rsqrt.
                      double sum_sq = 0.0;
                      for (int64_t i = 0; i < dim; ++i) sum_sq += double(xr[i]) * double(xr[i]);
                      float inv = float(1.0 / std::sqrt(sum_sq / double(dim) + double(eps)));
                      for (int64_t i = 0; i < dim; ++i) o[i] = (xr[i] * inv) * weight[i];
                    }
                  });
}

void apply_rope(ThreadPool& pool, float* x, const int32_t* positions, int64_t tokens, int64_t heads,
                int64_t head_dim, const float* inv_freq) {
  const int64_t half = head_dim / 2;
  parallel_chunks(
      pool, tokens,
      std::max<int64_t>(1, kMinParallelElements / std::max<int64_t>(1, heads * head_dim)),
      [&](int64_t t0, int64_t t1, int) {
        thread_local std::vector<float> cos_sin;  // [2, half]
        cos_sin.resize(size_t(2 * half));
        float* cs = cos_sin.data();
        float* sn = cs + half;
        for (int64_t t = t0; t < t1; ++t) {
          // The angle is rounded to float as HF computes it (float32
          // position times float32 inv_freq); cos/sin of it are exact.
          const float pos = float(positions[t]);
          for (int64_t i = 0; i < half; ++i) {
            float angle = pos * inv_freq[i];
            cs[i] = float(std::cos(double(angle)));
            sn[i] = float(std::sin(double(angle)));
          }
          for (int64_t h = 0; h < heads; ++h) {
            float* v = x + (t * heads + h) * head_dim;
            for (int64_t i = 0; i < half; ++i) {
              float a = v[i];
              float b = v[i + half];
              v[i] = a * cs[i] - b * sn[i];
              v[i + half] = b * cs[i] + a * sn[i];
            }
          }
        }
      });
}

void silu_and_mul(ThreadPool& pool, const float* gate, const float* up, int64_t n, float* out) {
  parallel_chunks(pool, n, kMinParallelElements, [&](int64_t i0, int64_t i1, int) {
#if BATON_HAVE_X86
    if (use_avx2()) {
      silu_and_mul_avx2(gate, up, i0, i1, out);
      return;
    }
#endif
    for (int64_t i = i0; i < i1; ++i) out[i] = silu_times(gate[i], up[i]);
  });
}

void add_in_place(ThreadPool& pool, float* x, const float* y, int64_t n) {
  parallel_chunks(pool, n, kMinParallelElements, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) x[i] += y[i];
  });
}

void scale_in_place(ThreadPool& pool, float* x, float s, int64_t n) {
  parallel_chunks(pool, n, kMinParallelElements, [&](int64_t i0, int64_t i1, int) {
    for (int64_t i = i0; i < i1; ++i) x[i] *= s;
  });
}

}  // namespace baton::kernels::cpu
