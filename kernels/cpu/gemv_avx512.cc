#include "kernels/cpu/gemv_avx512.h"

#if defined(__x86_64__) || defined(__i386__)
#include <algorithm>

#include "kernels/cpu/dispatch.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/simd_avx512.h"

namespace baton::kernels::cpu {
namespace {

// Columns per step: one 512-bit register of F32.
constexpr int64_t kStep = 16;
// Columns per chunk: the block's R weight rows of this many columns stay in
// L1 while every x row is applied to them (as gemv.cc's AVX2 kernel).
constexpr int64_t kColumnChunk = 512;

// What one block's passes share.
template <int R>
struct Block {
  const float* x;
  int64_t cols;
  const void* w;
  size_t row_offset[R];  // element offset of each weight row
  const char* next;      // the next block's first row, prefetched during the first pass
  size_t row_bytes;
  int next_rows;
};

// x rows [i, i + P) against the block's R weight rows over columns [kc,
// kend), into acc. The first pass over a chunk (prefetch) also asks for the
// same columns of the next block's rows, a line per line it reads, into L2:
// paced by the reads, never a burst (see gemv.cc).
template <DType T, int R, int P>
BATON_AVX512_INLINE void gemv_pass(const Block<R>& b, int64_t i, int64_t kc, int64_t kend,
                                   bool prefetch, __m512 (&acc)[kGemvMaxBatchAvx512][R]) {
  constexpr int64_t kColumnsPerLine = 64 / int64_t(dtype_size(T));
  __m512 a[P][R];
  for (int p = 0; p < P; ++p)
    for (int r = 0; r < R; ++r) a[p][r] = acc[i + p][r];
  for (int64_t k = kc; k < kend; k += kStep) {
    if (prefetch && k % kColumnsPerLine == 0)
      for (int r = 0; r < b.next_rows; ++r)
        __builtin_prefetch(b.next + size_t(r) * b.row_bytes + size_t(k) * dtype_size(T), 0, 2);
    __m512 xv[P];
    for (int p = 0; p < P; ++p) xv[p] = _mm512_loadu_ps(b.x + (i + p) * b.cols + k);
    for (int r = 0; r < R; ++r) {
      const __m512 wv = avx512::load16<T>(b.w, b.row_offset[r] + size_t(k));
      for (int p = 0; p < P; ++p) a[p][r] = _mm512_fmadd_ps(wv, xv[p], a[p][r]);
    }
  }
  for (int p = 0; p < P; ++p)
    for (int r = 0; r < R; ++r) acc[i + p][r] = a[p][r];
}

// Rows [r0, r0 + R) of W against all m rows of x; the next `next_rows`
// rows are prefetched.
template <DType T, int R>
BATON_AVX512 void gemv_block(const float* x, int64_t m, const WeightView& w, const float* bias,
                             int64_t r0, int next_rows, float* out) {
  const int64_t cols = w.cols;
  const int64_t cols16 = cols / kStep * kStep;
  Block<R> b{x, cols, w.data, {}, nullptr, size_t(cols) * dtype_size(T), next_rows};
  for (int r = 0; r < R; ++r) b.row_offset[r] = size_t(r0 + r) * size_t(cols);
  b.next = static_cast<const char*>(w.data) + size_t(r0 + R) * b.row_bytes;
  __m512 acc[kGemvMaxBatchAvx512][R];
  for (int64_t i = 0; i < m; ++i)
    for (int r = 0; r < R; ++r) acc[i][r] = _mm512_setzero_ps();
  for (int64_t kc = 0; kc < cols16; kc += kColumnChunk) {
    const int64_t kend = std::min(kc + kColumnChunk, cols16);
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) gemv_pass<T, R, 4>(b, i, kc, kend, i == 0, acc);
    for (; i + 2 <= m; i += 2) gemv_pass<T, R, 2>(b, i, kc, kend, i == 0, acc);
    for (; i < m; ++i) gemv_pass<T, R, 1>(b, i, kc, kend, i == 0, acc);
  }
  for (int64_t i = 0; i < m; ++i) {
    const float* xi = x + i * cols;
    for (int r = 0; r < R; ++r) {
      float sum = _mm512_reduce_add_ps(acc[i][r]);
      for (int64_t k = cols16; k < cols; ++k)
        sum += load_as_float(w.data, T, b.row_offset[r] + size_t(k)) * xi[k];
      out[i * w.rows + r0 + r] = sum + (bias ? bias[r0 + r] : 0.0f);
    }
  }
}

template <DType T>
BATON_AVX512 void gemv_rows_t(const float* x, int64_t m, const WeightView& w, const float* bias,
                              int64_t row_begin, int64_t row_end, float* out) {
  for_each_row_block(row_begin, row_end, [&]<int R>(int64_t r, int next_rows) {
    gemv_block<T, R>(x, m, w, bias, r, next_rows, out);
  });
}

}  // namespace

void gemv_rows_avx512(const float* x, int64_t m, const WeightView& w, const float* bias,
                      int64_t row_begin, int64_t row_end, float* out) {
  with_dtype(w.dtype, [&]<DType T>() { gemv_rows_t<T>(x, m, w, bias, row_begin, row_end, out); });
}

}  // namespace baton::kernels::cpu

#endif
