#include "kernels/cpu/linear.h"

#include <cblas.h>

#include <algorithm>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemm_bf16_amx.h"
#include "kernels/cpu/gemm_bf16_avx512.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {
namespace {

// Rows of W per claimed GEMV piece: pieces shrink from kGemvMaxPiece (long
// streams for the prefetchers) to kGemvMinPiece as the rows run out, so the
// thread that finishes first waits for at most a short piece of the other's;
// about 120 projection calls of a smollm2 decode step each end in such a
// wait. Alternated step by step with equal 64-row pieces, this made every
// decode step of the model benchmark 0.6-5% faster. kGemvMinShare rows
// (~50-100 KB of weights) are the least worth handing a thread.
constexpr int64_t kGemvMinPiece = 16;
constexpr int64_t kGemvMaxPiece = 128;
constexpr int64_t kGemvMinShare = 64;
// Bytes of F32 scratch one converted half-precision weight tile should take:
// large enough for sgemm to run near its peak, small enough to stay in L2/L3.
constexpr int64_t kTileBytes = 1 << 20;
// sgemm packs x again for every call, so a tile needs enough rows to amortise
// that: with down_proj's 4864 inputs, kTileBytes alone gave 48-row tiles and
// 896x4864 ran at 61-71% of the sgemm rate; with up to 128 (parallel_dynamic
// evens them to 112 over two threads), 88-114%. The scratch then grows with
// the inputs: 7 MiB a thread for 14336.
constexpr int64_t kMinTileRows = 128;
constexpr int64_t kMaxTileRows = 256;
constexpr int64_t kTileRowStep = 16;
// Rows of W per BF16 GEMM tile, in whole panels of 16: the tile's x rows
// stream past each 64-row block of panels, so a tile needs only enough rows
// to share the work evenly over the threads.
constexpr int64_t kBf16TileRows = 192;
constexpr int64_t kBf16RowAlign = 16;
// Fewer multiply-adds than this are not worth waking the pool for.
constexpr int64_t kMinParallelMacs = 1 << 15;

// Rows of W per sgemm call: its F32 copy (for half weights) takes about
// kTileBytes, but never fewer than kMinTileRows rows. parallel_dynamic then
// evens the tiles out over the threads (a 192-row k_proj as one 256-row tile
// left one core idle).
int64_t sgemm_tile_rows(int64_t cols) {
  const int64_t rows = kTileBytes / (cols * int64_t(sizeof(float)));
  return std::clamp(rows / kTileRowStep * kTileRowStep, kMinTileRows, kMaxTileRows);
}

// out[:, r0:r1] = x · W[r0:r1]ᵀ + bias for one tile of W's rows, through sgemm.
void sgemm_rows(const float* x, int64_t m, const WeightView& w, const float* bias, int64_t r0,
                int64_t r1, float* out) {
  const int64_t cols = w.cols;
  const float* w32;
  if (w.dtype == DType::kF32) {
    w32 = static_cast<const float*>(w.data) + r0 * cols;
  } else {
    thread_local std::vector<float> scratch;  // [r1 - r0, cols]
    scratch.resize(size_t((r1 - r0) * cols));
    convert_to_f32(static_cast<const char*>(w.data) + size_t(r0 * cols) * dtype_size(w.dtype),
                   w.dtype, (r1 - r0) * cols, scratch.data());
    w32 = scratch.data();
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(r1 - r0), int(cols), 1.0f, x,
              int(cols), w32, int(cols), 0.0f, out + r0, int(w.rows));
  if (bias) {
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + i * w.rows;
      for (int64_t r = r0; r < r1; ++r) o[r] += bias[r];
    }
  }
}

// True when every weight is BF16 and the CPU multiplies BF16 pairs at a
// higher rate than F32: AMX tiles, or AVX512_BF16 where preferred (see
// cpu_features.h).
bool uses_bf16_gemm(std::span<const LinearOutput> outputs) {
#if defined(__x86_64__)
  if (!use_amx_bf16() && !use_avx512_bf16()) return false;
  return std::all_of(outputs.begin(), outputs.end(),
                     [](const LinearOutput& o) { return o.weight.dtype == DType::kBF16; });
#else
  (void)outputs;
  return false;
#endif
}

// x rounded to BF16 once (rows, or AMX's packed panels, shared out over the
// pool), then tiles of the stacked weights' rows claimed as in the sgemm
// path.
template <typename ForEachWeight>
void bf16_gemm(ThreadPool& pool, const float* x, int64_t m, int64_t cols, int64_t rows,
               int64_t min_rows, ForEachWeight& for_each_weight) {
#if defined(__x86_64__)
  if (use_amx_bf16()) {
    // Decode batches (rows the GEMV would take) split x, standing in for its F32 x.
    const AmxX form = m <= gemv_max_batch() ? AmxX::kSplit : AmxX::kRounded;
    thread_local std::vector<uint32_t> xp;  // the caller's, read by every thread
    xp.resize(size_t(amx_packed_x_size(m, cols, form)));
    uint32_t* xp_data = xp.data();
    parallel_chunks(
        pool, amx_x_row_panels(m), std::max<int64_t>(1, kMinParallelMacs / (kAmxTileRows * cols)),
        [&](int64_t p0, int64_t p1, int) { pack_x_for_amx(x, m, cols, p0, p1, form, xp_data); });
    parallel_dynamic(pool, rows, kBf16TileRows, kBf16RowAlign, min_rows,
                     [&](int64_t r0, int64_t r1, int) {
                       for_each_weight(r0, r1, [&](const LinearOutput& o, int64_t b, int64_t e) {
                         gemm_bf16_rows_amx(xp_data, m, form, o.weight, o.bias, b, e, o.out);
                       });
                     });
    return;
  }
  thread_local std::vector<uint16_t> xb;  // the caller's, read by every thread
  xb.resize(size_t(m * bf16_row_stride(cols)));
  uint16_t* xb_data = xb.data();
  parallel_chunks(
      pool, m, std::max<int64_t>(1, kMinParallelMacs / cols),
      [&](int64_t i0, int64_t i1, int) { round_rows_to_bf16(x, cols, i0, i1, xb_data); });
  parallel_dynamic(pool, rows, kBf16TileRows, kBf16RowAlign, min_rows,
                   [&](int64_t r0, int64_t r1, int) {
                     for_each_weight(r0, r1, [&](const LinearOutput& o, int64_t b, int64_t e) {
                       gemm_bf16_rows_avx512(xb_data, m, o.weight, o.bias, b, e, o.out);
                     });
                   });
#else
  (void)pool, (void)x, (void)m, (void)cols, (void)rows, (void)min_rows, (void)for_each_weight;
#endif
}

}  // namespace

void linear(ThreadPool& pool, const float* x, int64_t m, const WeightView& w, const float* bias,
            float* out) {
  const LinearOutput output{.weight = w, .bias = bias, .out = out};
  linear(pool, x, m, std::span<const LinearOutput>(&output, 1));
}

void linear(ThreadPool& pool, const float* x, int64_t m, std::span<const LinearOutput> outputs) {
  if (m <= 0 || outputs.empty()) return;
  const int64_t cols = outputs.front().weight.cols;
  int64_t rows = 0;
  for (const LinearOutput& o : outputs) {
    BATON_CHECK(o.weight.rows == 0 || o.weight.cols == cols);  // one x feeds them all
    rows += o.weight.rows;
  }
  if (rows <= 0) return;
  if (cols <= 0) {
    for (const LinearOutput& o : outputs)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t r = 0; r < o.weight.rows; ++r)
          o.out[i * o.weight.rows + r] = o.bias ? o.bias[r] : 0.0f;
    return;
  }
  // The outputs' rows are numbered one after another, as if their weights
  // were stacked; a piece that straddles two weights runs as one call each.
  auto for_each_weight = [&](int64_t r0, int64_t r1, auto&& run) {
    int64_t first = 0;
    for (const LinearOutput& o : outputs) {
      const int64_t begin = std::max(r0, first), end = std::min(r1, first + o.weight.rows);
      if (begin < end) run(o, begin - first, end - first);
      first += o.weight.rows;
    }
  };
  const int64_t macs_per_row = m * cols;
  const int64_t min_rows = std::max<int64_t>(1, kMinParallelMacs / macs_per_row);
  const bool amx_rows = m >= kAmxMinRows && use_amx_bf16() && uses_bf16_gemm(outputs);
  if (m <= gemv_max_batch() && !amx_rows) {
    parallel_guided(pool, rows, kGemvMinPiece, kGemvMaxPiece, kGemvRowBlock,
                    std::max(kGemvMinShare, min_rows), [&](int64_t r0, int64_t r1, int) {
                      for_each_weight(r0, r1, [&](const LinearOutput& o, int64_t b, int64_t e) {
                        gemv_rows(x, m, o.weight, o.bias, b, e, o.out);
                      });
                    });
    return;
  }
  if (uses_bf16_gemm(outputs)) {
    bf16_gemm(pool, x, m, cols, rows, min_rows, for_each_weight);
    return;
  }
  setup_blas();
  // Tiles are claimed dynamically: sgemm speed per tile varies (edges, other
  // processes), and a late thread then simply takes fewer tiles.
  const int64_t tile_rows = std::max(sgemm_tile_rows(cols), min_rows);
  parallel_dynamic(pool, rows, tile_rows, /*align=*/1, min_rows, [&](int64_t r0, int64_t r1, int) {
    for_each_weight(r0, r1, [&](const LinearOutput& o, int64_t b, int64_t e) {
      sgemm_rows(x, m, o.weight, o.bias, b, e, o.out);
    });
  });
}

bool linear_takes_amx(int64_t m, DType weights) {
  return weights == DType::kBF16 && use_amx_bf16() && (m >= kAmxMinRows || m > gemv_max_batch());
}

bool linear_rounds_x_to_bf16(int64_t m, DType weights) {
  return weights == DType::kBF16 && (use_amx_bf16() || use_avx512_bf16()) && m > gemv_max_batch();
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
