#include "kernels/cpu/gemm_bf16_avx512.h"

#if defined(__x86_64__) || defined(__i386__)
#include <algorithm>
#include <vector>

#include "kernels/cpu/simd_avx512.h"

namespace baton::kernels::cpu {
namespace {

// A pair of BF16 values read as one 32-bit element (the x rows are written
// as 16-bit elements).
typedef uint32_t __attribute__((may_alias)) bf16_pair;

// Weight rows per panel: one 512-bit register holds a column pair of 16 rows.
constexpr int64_t kPanelRows = kBf16PanelRows;
// x rows and weight panels per register tile: 4 x 4 F32 accumulators, each
// weight load feeding 4 VDPBF16PS and each x pair broadcast 4. On an AMD
// EPYC (Zen 4), one thread, m = 512, rows in tiles of 192: 4 x 4 ran at
// 0.93-0.96 of oneDNN 2.6's BF16 matmul, as did 8 x 3 and 6 x 4 (0.90-0.96);
// 12 x 2 spilled accumulators.
constexpr int kTileRows = 4;
constexpr int kTilePanels = 4;
// Column pairs per pass at most: the tile's panels (64 KiB at 256 pairs)
// are read from L1/L2 while every row of x goes by. Passes of 128 pairs
// ran 3% slower, from writing and reading out once more.
constexpr int64_t kMaxPassPairs = 256;

}  // namespace

// 16 rows x 16 pairs at a time are loaded and transposed in registers.
BATON_AVX512_BF16 void pack_bf16_panels(const WeightView& w, int64_t row_begin, int64_t row_end,
                                        int64_t pair_begin, int64_t pairs, uint32_t* dst) {
  const auto* base = static_cast<const uint16_t*>(w.data);
  const int64_t panels = (row_end - row_begin + kPanelRows - 1) / kPanelRows;
  for (int64_t p = 0; p < panels; ++p) {
    uint32_t* panel = dst + p * pairs * kPanelRows;
    const int64_t first_row = row_begin + p * kPanelRows;
    const int64_t rows = std::min(kPanelRows, row_end - first_row);
    for (int64_t k = 0; k < pairs; k += 16) {
      const int64_t column = 2 * (pair_begin + k);
      // BF16 elements of each row in this block: an odd last column pairs with 0.
      const int64_t elements =
          std::clamp<int64_t>(std::min(2 * (pairs - k), w.cols - column), 0, 32);
      const __mmask32 mask = elements == 32 ? ~__mmask32(0) : (__mmask32(1) << elements) - 1;
      __m512i r[16];
      for (int64_t j = 0; j < kPanelRows; ++j)
        r[j] = j < rows ? _mm512_maskz_loadu_epi16(mask, base + (first_row + j) * w.cols + column)
                        : _mm512_setzero_si512();
      avx512::transpose16x16(r);
      const int64_t block_pairs = std::min<int64_t>(16, pairs - k);
      for (int64_t c = 0; c < block_pairs; ++c)
        _mm512_storeu_si512(panel + (k + c) * kPanelRows, r[c]);
    }
  }
}

namespace {

// out rows [0, R) x panel columns [0, 16P) (the first `columns` of them
// exist) of one register tile, over `pairs` column pairs: x pairs from xb
// (row stride x_pairs), weights from P consecutive panels of `pairs` pairs
// each. The first pass stores (plus bias), later ones add.
template <int R, int P>
BATON_AVX512_BF16 void tile(const bf16_pair* xb, int64_t x_pairs, const uint32_t* panels,
                            int64_t pairs, int64_t columns, bool first_pass, const float* bias,
                            float* out, int64_t out_stride) {
  __m512 acc[R][P];
  for (int i = 0; i < R; ++i)
    for (int p = 0; p < P; ++p) acc[i][p] = _mm512_setzero_ps();
  for (int64_t k = 0; k < pairs; ++k) {
    __m512bh wv[P];
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p)
      wv[p] = (__m512bh)_mm512_loadu_si512(panels + (p * pairs + k) * kPanelRows);
#pragma GCC unroll 8
    for (int i = 0; i < R; ++i) {
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(int32_t(xb[i * x_pairs + k]));
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) acc[i][p] = _mm512_dpbf16_ps(acc[i][p], xv, wv[p]);
    }
  }
  for (int p = 0; p < P; ++p) {
    const int64_t left = columns - p * kPanelRows;
    const __mmask16 mask =
        left >= kPanelRows ? __mmask16(0xffff) : __mmask16((1u << std::max<int64_t>(left, 0)) - 1);
    if (mask == 0) break;
    const __m512 b = bias && first_pass ? _mm512_maskz_loadu_ps(mask, bias + p * kPanelRows)
                                        : _mm512_setzero_ps();
    for (int i = 0; i < R; ++i) {
      float* o = out + i * out_stride + p * kPanelRows;
      const __m512 prior = first_pass ? b : _mm512_maskz_loadu_ps(mask, o);
      _mm512_mask_storeu_ps(o, mask, _mm512_add_ps(acc[i][p], prior));
    }
  }
}

// The tile for R = rows (1..kTileRows) and P panels.
template <int P, typename... Args>
BATON_AVX512_BF16 void tile_rows(int rows, Args... args) {
  static_assert(kTileRows == 4, "a case for every row count");
  switch (rows) {
    case 4:
      return tile<4, P>(args...);
    case 3:
      return tile<3, P>(args...);
    case 2:
      return tile<2, P>(args...);
    default:
      return tile<1, P>(args...);
  }
}

}  // namespace

BATON_AVX512_BF16 void round_rows_to_bf16(const float* x, int64_t cols, int64_t row_begin,
                                          int64_t row_end, uint16_t* dst) {
  const int64_t stride = bf16_row_stride(cols);
  for (int64_t i = row_begin; i < row_end; ++i) {
    const float* src = x + i * cols;
    uint16_t* d = dst + i * stride;
    for (int64_t c = 0; c < stride; c += 32) {
      const int64_t left = cols - c;
      const __mmask16 lo =
          left >= 16 ? __mmask16(0xffff) : __mmask16((1u << std::clamp<int64_t>(left, 0, 16)) - 1);
      const __mmask16 hi = left >= 32
                               ? __mmask16(0xffff)
                               : __mmask16((1u << std::clamp<int64_t>(left - 16, 0, 16)) - 1);
      const __m512bh v = _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps(hi, src + c + 16),
                                             _mm512_maskz_loadu_ps(lo, src + c));
      const int64_t out_left = std::min<int64_t>(32, stride - c);
      const __mmask32 store =
          out_left >= 32 ? __mmask32(0xffffffff) : __mmask32((1u << out_left) - 1);
      _mm512_mask_storeu_epi16(d + c, store, (__m512i)v);
    }
  }
}

BATON_AVX512_BF16 void gemm_bf16_rows_avx512(const uint16_t* xb, int64_t m, const WeightView& w,
                                             const float* bias, int64_t row_begin, int64_t row_end,
                                             float* out) {
  if (m <= 0 || row_begin >= row_end) return;
  const int64_t x_pairs = bf16_row_stride(w.cols) / 2;
  const auto* x32 = reinterpret_cast<const bf16_pair*>(xb);
  const int64_t panels = (row_end - row_begin + kPanelRows - 1) / kPanelRows;
  // Equal passes: 288 pairs as 144 + 144, not 256 + a short 32.
  const int64_t passes = std::max<int64_t>(1, (x_pairs + kMaxPassPairs - 1) / kMaxPassPairs);
  const int64_t pass_pairs = (x_pairs + passes - 1) / passes;
  thread_local std::vector<uint32_t> packed;  // [panels][pass pairs][16]
  packed.resize(size_t(panels * pass_pairs * kPanelRows));
  for (int64_t pass = 0; pass < passes; ++pass) {
    const int64_t k0 = pass * pass_pairs;
    const int64_t pairs = std::clamp<int64_t>(x_pairs - k0, 0, pass_pairs);
    pack_bf16_panels(w, row_begin, row_end, k0, pairs, packed.data());
    for (int64_t p = 0; p < panels; p += kTilePanels) {
      const int64_t column = p * kPanelRows;
      const float* tile_bias = bias && pass == 0 ? bias + row_begin + column : nullptr;
      auto run = [&]<int P>() {
        for (int64_t i = 0; i < m; i += kTileRows)
          tile_rows<P>(int(std::min<int64_t>(kTileRows, m - i)), x32 + i * x_pairs + k0, x_pairs,
                       packed.data() + p * pairs * kPanelRows, pairs, row_end - row_begin - column,
                       pass == 0, tile_bias, out + i * w.rows + row_begin + column, w.rows);
      };
      static_assert(kTilePanels == 4, "a case for every panel count");
      switch (std::min<int64_t>(kTilePanels, panels - p)) {
        case 4:
          run.template operator()<4>();
          break;
        case 3:
          run.template operator()<3>();
          break;
        case 2:
          run.template operator()<2>();
          break;
        default:
          run.template operator()<1>();
      }
    }
  }
}

}  // namespace baton::kernels::cpu

#endif
