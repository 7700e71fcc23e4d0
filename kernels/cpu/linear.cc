#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <mutex>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemv.h"

namespace baton::kernels::cpu {
namespace {

// Rows of W per GEMV work chunk, a multiple of the GEMV row block.
constexpr int64_t kGemvMinRowsPerChunk = 64;
// Bytes of F32 scratch one converted half-precision weight tile may take:
// large enough for sgemm to run near its peak, small enough to stay in L2/L3.
constexpr int64_t kTileBytes = 1 << 20;
constexpr int64_t kMinTileRows = 16;
constexpr int64_t kMaxTileRows = 256;
// Fewer multiply-adds than this are not worth waking the pool for.
constexpr int64_t kMinParallelMacs = 1 << 15;

void init_blas_once() {
  static std::once_flag once;
  // BLAS runs single-threaded inside our pool: one owner of the cores.
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// out[:, r0:r1] = x · W[r0:r1]ᵀ + bias for a slice of W's rows, through sgemm.
void sgemm_rows(const float* x, int64_t m, const WeightView& w, const float* bias, int64_t r0,
                int64_t r1, float* out) {
  const int64_t cols = w.cols;
  if (w.dtype == DType::kF32) {
    const float* w32 = static_cast<const float*>(w.data) + r0 * cols;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(r1 - r0), int(cols), 1.0f, x,
                int(cols), w32, int(cols), 0.0f, out + r0, int(w.rows));
  } else {
    int64_t tile_rows = kTileBytes / (cols * int64_t(sizeof(float)));
    tile_rows = std::clamp(tile_rows / kMinTileRows * kMinTileRows, kMinTileRows, kMaxTileRows);
    thread_local std::vector<float> scratch;  // [tile_rows, cols]
    scratch.resize(size_t(tile_rows * cols));
    const size_t elem = dtype_size(w.dtype);
    for (int64_t t0 = r0; t0 < r1; t0 += tile_rows) {
      int64_t n = std::min(tile_rows, r1 - t0);
      convert_to_f32(static_cast<const char*>(w.data) + size_t(t0 * cols) * elem, w.dtype, n * cols,
                     scratch.data());
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(cols), 1.0f, x,
                  int(cols), scratch.data(), int(cols), 0.0f, out + t0, int(w.rows));
    }
  }
  if (bias) {
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + i * w.rows;
      for (int64_t r = r0; r < r1; ++r) o[r] += bias[r];
    }
  }
}

}  // namespace

void linear(ThreadPool& pool, const float* x, int64_t m, const WeightView& w, const float* bias,
            float* out) {
  if (m <= 0 || w.rows <= 0) return;
  if (w.cols <= 0) {
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < w.rows; ++r) out[i * w.rows + r] = bias ? bias[r] : 0.0f;
    return;
  }
  const int64_t macs_per_row = m * w.cols;
  const int64_t min_rows = std::max<int64_t>(1, kMinParallelMacs / macs_per_row);
  if (m <= kGemvMaxBatch) {
    parallel_chunks(pool, w.rows, std::max(kGemvMinRowsPerChunk, min_rows),
                    [&](int64_t r0, int64_t r1, int) { gemv_rows(x, m, w, bias, r0, r1, out); });
    return;
  }
  init_blas_once();
  parallel_chunks(pool, w.rows, std::max(kMinTileRows, min_rows),
                  [&](int64_t r0, int64_t r1, int) { sgemm_rows(x, m, w, bias, r0, r1, out); });
}

void embedding(ThreadPool& pool, const WeightView& table, const int32_t* ids, int64_t n,
               float* out) {
  const int64_t cols = table.cols;
  const size_t row_bytes = size_t(cols) * dtype_size(table.dtype);
  parallel_chunks(pool, n, std::max<int64_t>(1, kMinParallelMacs / std::max<int64_t>(1, cols)),
                  [&](int64_t i0, int64_t i1, int) {
                    for (int64_t i = i0; i < i1; ++i) {
                      const char* row =
                          static_cast<const char*>(table.data) + size_t(ids[i]) * row_bytes;
                      convert_to_f32(row, table.dtype, cols, out + i * cols);
                    }
                  });
}

}  // namespace baton::kernels::cpu
