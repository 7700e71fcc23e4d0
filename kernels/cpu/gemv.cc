#include "kernels/cpu/gemv.h"

#include <algorithm>

#include "common/check.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemv_avx512.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {

// Portable fallback: one weight row at a time, every x row against it.
void gemv_rows_scalar(const float* x, int64_t m, const WeightView& w, const float* bias,
                      int64_t row_begin, int64_t row_end, float* out) {
  const int64_t cols = w.cols;
  for (int64_t r = row_begin; r < row_end; ++r) {
    float acc[kGemvMaxBatch] = {};
    const size_t base = size_t(r) * size_t(cols);
    for (int64_t k = 0; k < cols; ++k) {
      float wk = load_as_float(w.data, w.dtype, base + size_t(k));
      for (int64_t i = 0; i < m; ++i) acc[i] += wk * x[i * cols + k];
    }
    for (int64_t i = 0; i < m; ++i) out[i * w.rows + r] = acc[i] + (bias ? bias[r] : 0.0f);
  }
}

#if BATON_HAVE_X86

template <DType T>
BATON_AVX2_INLINE __m256 load_w8(const void* base, size_t offset) {
  if constexpr (T == DType::kF32) {
    return avx2::load8(static_cast<const float*>(base) + offset);
  } else if constexpr (T == DType::kBF16) {
    return avx2::load8_bf16(static_cast<const uint16_t*>(base) + offset);
  } else {
    return avx2::load8_f16(static_cast<const uint16_t*>(base) + offset);
  }
}

template <DType T>
constexpr int64_t sizeof_dtype() {
  return T == DType::kF32 ? 4 : 2;
}

// Columns per pass: R weight rows of this many columns stay in L1 while every
// x row is applied to them, so m > 1 does not re-read weights from memory.
constexpr int64_t kColumnChunk = 512;

// Rows [r0, r0 + R) of W against all m rows of x. The next `next_rows` rows
// (the next block, up to R) are prefetched a line at a time as the passes
// over pairs of x rows read the same columns of these, each pass taking its
// share of the lines: the core keeps only a couple of dozen misses in flight,
// and a whole block's lines requested at once (72 for four 576-column BF16
// rows) stall it until memory has answered most of them, so memory time and
// compute time add up instead of overlapping. They are prefetched into L2,
// not L1: L1 already holds the x rows (28 KiB for 8 rows of 896) and this
// block's chunk, and the next block's lines there evicted them (8 rows:
// +15% from memory, measured alternating with L1 prefetches).
template <DType T, int R>
BATON_AVX2 void gemv_block_avx2(const float* x, int64_t m, const WeightView& w, const float* bias,
                                int64_t r0, int next_rows, float* out) {
  const int64_t cols = w.cols;
  const int64_t cols8 = cols & ~int64_t{7};
  __m256 acc[kGemvMaxBatch][R];
  for (int64_t i = 0; i < m; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm256_setzero_ps();
  size_t row_offset[R];
  for (int r = 0; r < R; ++r) row_offset[r] = size_t(r0 + r) * size_t(cols);
  const size_t row_bytes = size_t(cols) * sizeof_dtype<T>();
  const char* next_block = static_cast<const char*>(w.data) + size_t(r0 + R) * row_bytes;
  constexpr int64_t kColumnsPerLine = kCacheLine / sizeof_dtype<T>();

  for (int64_t kc = 0; kc < cols8; kc += kColumnChunk) {
    const int64_t kend = kc + kColumnChunk < cols8 ? kc + kColumnChunk : cols8;
    int64_t i = 0;
    // Two x rows per pass: each converted weight vector feeds two FMAs, and
    // 2 x R independent accumulators keep the FMA units busy.
    for (; i + 2 <= m; i += 2) {
      const float* x0 = x + i * cols;
      const float* x1 = x0 + cols;
      __m256 a0[R], a1[R];
      for (int r = 0; r < R; ++r) a0[r] = acc[i][r], a1[r] = acc[i + 1][r];
      // Pass i / 2 of the m / 2 pair passes takes every (m / 2)-th line.
      const int64_t passes = m / 2, pass = i / 2;
      int64_t line_phase = (kc / kColumnsPerLine) % passes;  // of the line at k
      for (int64_t k = kc; k < kend; k += 8) {
        if (k % kColumnsPerLine == 0) {
          if (line_phase == pass)
            for (int r = 0; r < next_rows; ++r)
              __builtin_prefetch(next_block + r * row_bytes + size_t(k) * sizeof_dtype<T>(), 0, 2);
          if (++line_phase == passes) line_phase = 0;
        }
        const __m256 xv0 = _mm256_loadu_ps(x0 + k);
        const __m256 xv1 = _mm256_loadu_ps(x1 + k);
        for (int r = 0; r < R; ++r) {
          const __m256 wv = load_w8<T>(w.data, row_offset[r] + size_t(k));
          a0[r] = _mm256_fmadd_ps(wv, xv0, a0[r]);
          a1[r] = _mm256_fmadd_ps(wv, xv1, a1[r]);
        }
      }
      for (int r = 0; r < R; ++r) acc[i][r] = a0[r], acc[i + 1][r] = a1[r];
    }
    for (; i < m; ++i) {
      const float* xi = x + i * cols;
      __m256 a[R];
      for (int r = 0; r < R; ++r) a[r] = acc[i][r];
      for (int64_t k = kc; k < kend; k += 8) {
        __m256 xv = _mm256_loadu_ps(xi + k);
        for (int r = 0; r < R; ++r)
          a[r] = _mm256_fmadd_ps(load_w8<T>(w.data, row_offset[r] + size_t(k)), xv, a[r]);
      }
      for (int r = 0; r < R; ++r) acc[i][r] = a[r];
    }
  }
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * cols;
    for (int r = 0; r < R; ++r) {
      float sum = avx2::hsum(acc[i][r]);
      for (int64_t k = cols8; k < cols; ++k)
        sum += load_as_float(w.data, T, row_offset[r] + size_t(k)) * xi[k];
      out[i * w.rows + r0 + r] = sum + (bias ? bias[r0 + r] : 0.0f);
    }
  }
}

// How far ahead of the batch-1 weight stream to prefetch, into L2: the
// hardware prefetcher alone leaves rows short of bandwidth. On the Intel
// Xeon, 4 KiB ahead into L2 read BF16 rows 1.06-1.20x as fast as 1 KiB ahead
// into L1 (the distance did most of it: into L1 at 4 KiB was 0.91-0.99 of
// into L2), 8 KiB no faster (0.93-0.99), and F32 rows, which the AMD
// machines read no faster with prefetches, 1.17-1.24x as fast as without.
constexpr int64_t kPrefetchBytes = 4096;

// Batch 1: one row at a time with four accumulators along the row, so the
// weights are read as a single linear stream (rows are adjacent in memory),
// which the hardware prefetcher follows best; x stays in L1.
template <DType T>
BATON_AVX2 void gemv_batch1_avx2(const float* x, const WeightView& w, const float* bias,
                                 int64_t row_begin, int64_t row_end, float* out) {
  const int64_t cols = w.cols;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const size_t base = size_t(r) * size_t(cols);
    __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
    __m256 a2 = _mm256_setzero_ps(), a3 = _mm256_setzero_ps();
    const char* row = static_cast<const char*>(w.data) + base * sizeof_dtype<T>();
    int64_t k = 0;
    for (; k + 32 <= cols; k += 32) {
      // 32 elements are one cache line of half weights, two of F32; stay
      // kPrefetchBytes ahead.
      for (int64_t line = 0; line < 32 * sizeof_dtype<T>(); line += int64_t(kCacheLine))
        __builtin_prefetch(row + (k * sizeof_dtype<T>() + line) + kPrefetchBytes, 0, 2);
      a0 = _mm256_fmadd_ps(load_w8<T>(w.data, base + size_t(k)), _mm256_loadu_ps(x + k), a0);
      a1 =
          _mm256_fmadd_ps(load_w8<T>(w.data, base + size_t(k + 8)), _mm256_loadu_ps(x + k + 8), a1);
      a2 = _mm256_fmadd_ps(load_w8<T>(w.data, base + size_t(k + 16)), _mm256_loadu_ps(x + k + 16),
                           a2);
      a3 = _mm256_fmadd_ps(load_w8<T>(w.data, base + size_t(k + 24)), _mm256_loadu_ps(x + k + 24),
                           a3);
    }
    for (; k + 8 <= cols; k += 8)
      a0 = _mm256_fmadd_ps(load_w8<T>(w.data, base + size_t(k)), _mm256_loadu_ps(x + k), a0);
    float sum = avx2::hsum(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
    for (; k < cols; ++k) sum += load_as_float(w.data, T, base + size_t(k)) * x[k];
    out[r] = sum + (bias ? bias[r] : 0.0f);
  }
}

template <DType T>
BATON_AVX2 void gemv_rows_avx2(const float* x, int64_t m, const WeightView& w, const float* bias,
                               int64_t row_begin, int64_t row_end, float* out) {
  if (m == 1) return gemv_batch1_avx2<T>(x, w, bias, row_begin, row_end, out);
  for_each_row_block(row_begin, row_end, [&]<int R>(int64_t r, int next_rows) {
    gemv_block_avx2<T, R>(x, m, w, bias, r, next_rows, out);
  });
}

#endif  // BATON_HAVE_X86

}  // namespace

int64_t gemv_max_batch() { return use_avx512() ? kGemvMaxBatchAvx512 : kGemvMaxBatch; }

void gemv_rows(const float* x, int64_t m, const WeightView& w, const float* bias, int64_t row_begin,
               int64_t row_end, float* out) {
  BATON_CHECK(m <= gemv_max_batch());  // the kernels' accumulators hold no more
#if BATON_HAVE_X86
  // Batches of two and more are bound by their FMAs: 512-bit ones where the
  // CPU has them (gemv_avx512.h).
  if (m > 1 && use_avx512()) return gemv_rows_avx512(x, m, w, bias, row_begin, row_end, out);
  if (use_avx2())
    return with_dtype(
        w.dtype, [&]<DType T>() { gemv_rows_avx2<T>(x, m, w, bias, row_begin, row_end, out); });
#endif
  gemv_rows_scalar(x, m, w, bias, row_begin, row_end, out);
}

}  // namespace baton::kernels::cpu
