#include "kernels/cpu/gemm_bf16_amx.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/gemm_bf16_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace baton::kernels::cpu {
namespace {

// Tile registers: the output block's C tiles are 2w + p for weight tile w
// (tiles 4-5) and x tile p (tiles 6-7). Two by two is the largest block
// eight tiles hold; it loads each tile for two TDPBF16PS.
constexpr int64_t kTileRowBytes = kAmxTileRowBytes;
// Column pairs in a weight tile's row, and rows (pairs) of an x tile.
constexpr int64_t kTilePairs = 16;
// Weight rows per block: two weight tiles.
constexpr int64_t kBlockRows = 2 * kAmxTileRows;
// Column pairs per pass at most: a block's weights (64 KiB at 512 pairs)
// stay in L1/L2 while every x tile of the pass (1 MiB for 512 rows of x)
// streams past them from L2. On a Xeon of the Emerald Rapids generation,
// passes of 512 ran 2-8% faster than 256 (fewer turns of the outputs
// through memory) and about as fast as 1024.
constexpr int64_t kMaxPassPairs = 512;

using Tile = float[kAmxTileRows][16];

// The tile intrinsics are asm statements that take addresses only: memory
// written through ordinary stores must be in place before a tile reads it.
inline void compiler_barrier() { asm volatile("" ::: "memory"); }

// Tile numbers must be literals in the asm; c is a constant after inlining.
BATON_AMX_INLINE void load_c(int c, const Tile& from) {
  switch (c) {
    case 0:
      _tile_loadd(0, &from[0][0], kTileRowBytes);
      break;
    case 1:
      _tile_loadd(1, &from[0][0], kTileRowBytes);
      break;
    case 2:
      _tile_loadd(2, &from[0][0], kTileRowBytes);
      break;
    default:
      _tile_loadd(3, &from[0][0], kTileRowBytes);
  }
}

BATON_AMX_INLINE void zero_c(int c) {
  switch (c) {
    case 0:
      _tile_zero(0);
      break;
    case 1:
      _tile_zero(1);
      break;
    case 2:
      _tile_zero(2);
      break;
    default:
      _tile_zero(3);
  }
}

BATON_AMX_INLINE void store_c(int c, Tile& to) {
  switch (c) {
    case 0:
      _tile_stored(0, &to[0][0], kTileRowBytes);
      break;
    case 1:
      _tile_stored(1, &to[0][0], kTileRowBytes);
      break;
    case 2:
      _tile_stored(2, &to[0][0], kTileRowBytes);
      break;
    default:
      _tile_stored(3, &to[0][0], kTileRowBytes);
  }
}

// C tiles += weight tiles (W of them, 16 rows each from w, row stride
// w_stride elements) times x tiles (P panels from x, x_panel_elements
// apart) over `pairs` column pairs, a multiple of 16.
template <int W, int P>
BATON_AMX_INLINE void multiply(const uint16_t* w, int64_t w_stride, const uint32_t* x,
                               int64_t x_panel_elements, int64_t pairs) {
  const int64_t w_stride_bytes = w_stride * int64_t(sizeof(uint16_t));
  const uint16_t* w1 = w + kAmxTileRows * w_stride;
  const uint32_t* x1 = x + x_panel_elements;
  for (int64_t k = 0; k < pairs; k += kTilePairs) {
    _tile_loadd(4, w + 2 * k, w_stride_bytes);
    if constexpr (W == 2) _tile_loadd(5, w1 + 2 * k, w_stride_bytes);
    _tile_loadd(6, x + k * kAmxTileRows, kTileRowBytes);
    if constexpr (P == 2) _tile_loadd(7, x1 + k * kAmxTileRows, kTileRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (P == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (W == 2) {
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (P == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// A C tile holds out transposed: tile[j][i] is out[i][j]. The piece of out
// at `at` (x rows `rows`, weight columns `columns` of it exist; the rest
// reads as 0) into `tile`:
BATON_AMX_INLINE void gather_transposed(const float* at, int64_t stride, int64_t rows,
                                        int64_t columns, Tile& tile) {
  __m512i r[16];
  const __mmask16 mask = avx512::first_lanes(int32_t(columns));
  for (int64_t i = 0; i < 16; ++i)
    r[i] = i < rows ? _mm512_castps_si512(_mm512_maskz_loadu_ps(mask, at + i * stride))
                    : _mm512_setzero_si512();
  avx512::transpose16x16(r);
  for (int64_t j = 0; j < 16; ++j) _mm512_store_si512(&tile[j][0], r[j]);
}

// ... and back, writing only what exists.
BATON_AMX_INLINE void scatter_transposed(const Tile& tile, float* at, int64_t stride, int64_t rows,
                                         int64_t columns) {
  __m512i r[16];
  for (int64_t j = 0; j < 16; ++j) r[j] = _mm512_load_si512(&tile[j][0]);
  avx512::transpose16x16(r);
  const __mmask16 mask = avx512::first_lanes(int32_t(columns));
  for (int64_t i = 0; i < rows; ++i)
    _mm512_mask_storeu_ps(at + i * stride, mask, _mm512_castsi512_ps(r[i]));
}

// One block of W weight tiles by P x tiles for one pass.
struct Block {
  const uint16_t* w = nullptr;  // the block's first weight row, at the pass's first pair
  int64_t w_stride = 0;         // elements
  const uint32_t* x = nullptr;  // the block's first x panel, at the pass's first pair
  int64_t x_panel_elements = 0;
  int64_t pairs = 0;
  int64_t weight_rows[2] = {};  // weight rows each weight tile covers that exist (0..16)
  int64_t x_rows[2] = {};       // x rows each x tile covers that exist (0..16)
  float* out = nullptr;         // out at the block's first x row and weight row
  int64_t out_stride = 0;       // elements
  bool first_pass = false;
  const Tile* bias = nullptr;  // a C tile of the bias per weight tile; null for none
};

// The sum of two C tiles, into the first.
BATON_AMX_INLINE void add_tile(Tile& to, const Tile& from) {
  for (int64_t j = 0; j < kAmxTileRows; ++j)
    _mm512_store_ps(&to[j][0],
                    _mm512_add_ps(_mm512_load_ps(&to[j][0]), _mm512_load_ps(&from[j][0])));
}

// Each C tile starts from the bias (first pass) or from what earlier passes
// wrote to out, and goes back to out.
template <int W, int P>
BATON_AMX void run_block(const Block& b, Tile (&staged)[4]) {
  auto at = [&](int wt, int p) {
    return b.out + p * kAmxTileRows * b.out_stride + wt * kAmxTileRows;
  };
  for (int wt = 0; wt < W; ++wt)
    for (int p = 0; p < P; ++p) {
      const int c = 2 * wt + p;
      if (!b.first_pass) {
        gather_transposed(at(wt, p), b.out_stride, b.x_rows[p], b.weight_rows[wt], staged[c]);
        compiler_barrier();
        load_c(c, staged[c]);
      } else if (b.bias) {
        load_c(c, b.bias[wt]);
      } else {
        zero_c(c);
      }
    }
  multiply<W, P>(b.w, b.w_stride, b.x, b.x_panel_elements, b.pairs);
  for (int wt = 0; wt < W; ++wt)
    for (int p = 0; p < P; ++p) {
      const int c = 2 * wt + p;
      store_c(c, staged[c]);
      scatter_transposed(staged[c], at(wt, p), b.out_stride, b.x_rows[p], b.weight_rows[wt]);
    }
}

// C tiles 0-2 += weight tile `wt` of the block times the three parts of
// one panel of x (AmxX::kSplit; tiles 4 and 5-7), over the block's pairs.
BATON_AMX_INLINE void multiply_parts(const uint16_t* w, int64_t w_stride, const uint32_t* x,
                                     int64_t x_panel_elements, int64_t pairs) {
  const int64_t w_stride_bytes = w_stride * int64_t(sizeof(uint16_t));
  const uint32_t* mid = x + x_panel_elements;
  const uint32_t* lo = x + 2 * x_panel_elements;
  for (int64_t k = 0; k < pairs; k += kTilePairs) {
    _tile_loadd(4, w + 2 * k, w_stride_bytes);
    _tile_loadd(5, x + k * kAmxTileRows, kTileRowBytes);
    _tile_loadd(6, mid + k * kAmxTileRows, kTileRowBytes);
    _tile_loadd(7, lo + k * kAmxTileRows, kTileRowBytes);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 4, 7);
  }
}

// One weight tile of the block by the three parts of one panel of x (the
// block's first x tile): the parts' sums are added, the smaller first, into
// one piece of out.
BATON_AMX void run_parts_block(const Block& b, int wt, Tile (&staged)[4]) {
  float* at = b.out + wt * kAmxTileRows;
  if (!b.first_pass) {
    gather_transposed(at, b.out_stride, b.x_rows[0], b.weight_rows[wt], staged[0]);
    compiler_barrier();
    load_c(0, staged[0]);
  } else if (b.bias) {
    load_c(0, b.bias[wt]);
  } else {
    zero_c(0);
  }
  zero_c(1);
  zero_c(2);
  multiply_parts(b.w + wt * kAmxTileRows * b.w_stride, b.w_stride, b.x, b.x_panel_elements,
                 b.pairs);
  store_c(0, staged[0]);
  store_c(1, staged[1]);
  store_c(2, staged[2]);
  add_tile(staged[1], staged[2]);
  add_tile(staged[0], staged[1]);
  scatter_transposed(staged[0], at, b.out_stride, b.x_rows[0], b.weight_rows[wt]);
}

// 16 BF16 values widened to F32 (exactly: a BF16 value is the top half of one).
BATON_AMX_INLINE __m512 widen(__m256bh h) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(__m256i(h)), 16));
}

// Rows [0, rows) of x [*, cols] split into three BF16 parts (AmxX::kSplit):
// hi = bf16(x), mid = bf16(x - hi), lo = x - hi - mid, each difference exact
// in F32, rows bf16_row_stride(cols) long and padded with 0. A value whose
// hi part is not finite keeps it alone: the others are 0, not the NaN of
// inf - inf.
BATON_AMX void split_rows_to_bf16(const float* x, int64_t cols, int64_t rows, uint16_t* hi,
                                  uint16_t* mid, uint16_t* lo) {
  const int64_t stride = bf16_row_stride(cols);
  const __m512 infinity = _mm512_set1_ps(__builtin_inff());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < stride; c += 16) {
      const __mmask16 in = avx512::first_lanes(int32_t(std::min<int64_t>(cols - c, 16)));
      const __mmask16 out = avx512::first_lanes(int32_t(std::min<int64_t>(stride - c, 16)));
      const __m512 v = _mm512_maskz_loadu_ps(in, x + i * cols + c);
      const __m256bh h = _mm512_cvtneps_pbh(v);
      const __m512 h32 = widen(h);
      const __mmask16 finite = _mm512_cmp_ps_mask(_mm512_abs_ps(h32), infinity, _CMP_LT_OQ);
      const __m512 rest = _mm512_maskz_sub_ps(finite, v, h32);
      const __m256bh m = _mm512_cvtneps_pbh(rest);
      const __m256bh l = _mm512_cvtneps_pbh(_mm512_sub_ps(rest, widen(m)));
      _mm256_mask_storeu_epi16(hi + i * stride + c, out, __m256i(h));
      _mm256_mask_storeu_epi16(mid + i * stride + c, out, __m256i(m));
      _mm256_mask_storeu_epi16(lo + i * stride + c, out, __m256i(l));
    }
}

}  // namespace

void pack_x_for_amx(const float* x, int64_t m, int64_t cols, int64_t panel_begin, int64_t panel_end,
                    AmxX form, uint32_t* xp) {
  const int64_t stride = bf16_row_stride(cols);
  const int64_t pairs = amx_x_pairs(cols);
  const int64_t panel_elements = pairs * kAmxTileRows;
  const int64_t parts = amx_x_parts(form);
  thread_local std::vector<uint16_t> rows_of[3];  // one panel's rows, a part each
  for (int64_t q = 0; q < parts; ++q) rows_of[q].resize(size_t(kAmxTileRows * stride));
  for (int64_t p = panel_begin; p < panel_end; ++p) {
    const int64_t first = p * kAmxTileRows;
    const int64_t rows = std::min(kAmxTileRows, m - first);
    const float* src = x + first * cols;
    if (form == AmxX::kSplit)
      split_rows_to_bf16(src, cols, rows, rows_of[0].data(), rows_of[1].data(), rows_of[2].data());
    else
      round_rows_to_bf16(src, cols, 0, rows, rows_of[0].data());
    for (int64_t q = 0; q < parts; ++q)
      pack_bf16_panels(WeightView{rows_of[q].data(), DType::kBF16, rows, stride}, 0, rows, 0, pairs,
                       xp + (p * parts + q) * panel_elements);
  }
}

BATON_AMX void gemm_bf16_rows_amx(const uint32_t* xp, int64_t m, AmxX form, const WeightView& w,
                                  const float* bias, int64_t row_begin, int64_t row_end,
                                  float* out) {
  if (m <= 0 || row_begin >= row_end) return;
  const int64_t x_pairs = amx_x_pairs(w.cols);
  const int64_t x_panels = amx_x_row_panels(m);
  const bool split = form == AmxX::kSplit;
  // Equal passes, each a whole number of tiles.
  const int64_t passes = (x_pairs + kMaxPassPairs - 1) / kMaxPassPairs;
  const int64_t pass_pairs =
      ((x_pairs + passes - 1) / passes + kTilePairs - 1) / kTilePairs * kTilePairs;
  const auto* weights = static_cast<const uint16_t*>(w.data);
  thread_local std::vector<uint16_t> staged_weights;  // [kBlockRows][pass pairs * 2]
  alignas(64) Tile bias_tiles[2];
  alignas(64) Tile staged[4];

  configure_amx_tiles();
  for (int64_t k0 = 0; k0 < x_pairs; k0 += pass_pairs) {
    const int64_t pairs = std::min(pass_pairs, x_pairs - k0);
    // The pass reads weight columns [2 k0, 2 (k0 + pairs)); past w.cols they
    // are padding, which the weights do not have.
    const bool columns_exist = 2 * (k0 + pairs) <= w.cols;
    for (int64_t r0 = row_begin; r0 < row_end; r0 += kBlockRows) {
      const int64_t rows = std::min(kBlockRows, row_end - r0);
      Block b{.x_panel_elements = x_pairs * kAmxTileRows,
              .pairs = pairs,
              .out_stride = w.rows,
              .first_pass = k0 == 0};
      for (int q = 0; q < 2; ++q)
        b.weight_rows[q] = std::clamp<int64_t>(rows - q * kAmxTileRows, 0, kAmxTileRows);
      const bool two_weight_tiles = rows > kAmxTileRows;
      // Whole tiles whose columns all exist are read in place (a block of 16
      // rows is one tile: pieces of the weights start at multiples of 16).
      if (columns_exist && rows == (two_weight_tiles ? 2 : 1) * kAmxTileRows) {
        b.w = weights + r0 * w.cols + 2 * k0;
        b.w_stride = w.cols;
      } else {
        // The block's rows and the pass's columns that exist, zero beyond.
        const int64_t stride = 2 * pairs;
        const int64_t first = 2 * k0;
        const int64_t count = std::clamp<int64_t>(w.cols - first, 0, stride);
        staged_weights.assign(size_t(kBlockRows * stride), 0);
        for (int64_t i = 0; i < rows; ++i)
          std::memcpy(staged_weights.data() + i * stride, weights + (r0 + i) * w.cols + first,
                      size_t(count) * sizeof(uint16_t));
        b.w = staged_weights.data();
        b.w_stride = stride;
      }
      if (b.first_pass && bias) {
        for (int q = 0; q < 2; ++q)
          for (int64_t j = 0; j < kAmxTileRows; ++j) {
            const float v = j < b.weight_rows[q] ? bias[r0 + q * kAmxTileRows + j] : 0.0f;
            for (int64_t i = 0; i < 16; ++i) bias_tiles[q][j][i] = v;
          }
        b.bias = bias_tiles;
      }
      compiler_barrier();  // the staged weights and bias tiles
      if (split) {
        for (int64_t p = 0; p < x_panels; ++p) {
          b.x = xp + 3 * p * b.x_panel_elements + k0 * kAmxTileRows;
          b.out = out + p * kAmxTileRows * w.rows + r0;
          b.x_rows[0] = std::min(kAmxTileRows, m - p * kAmxTileRows);
          run_parts_block(b, 0, staged);
          if (two_weight_tiles) run_parts_block(b, 1, staged);
        }
        continue;
      }
      for (int64_t p = 0; p < x_panels; p += 2) {
        b.x = xp + p * b.x_panel_elements + k0 * kAmxTileRows;
        b.out = out + p * kAmxTileRows * w.rows + r0;
        for (int q = 0; q < 2; ++q)
          b.x_rows[q] = std::clamp<int64_t>(m - (p + q) * kAmxTileRows, 0, kAmxTileRows);
        const bool two_x_tiles = x_panels - p >= 2;
        if (two_weight_tiles && two_x_tiles)
          run_block<2, 2>(b, staged);
        else if (two_weight_tiles)
          run_block<2, 1>(b, staged);
        else if (two_x_tiles)
          run_block<1, 2>(b, staged);
        else
          run_block<1, 1>(b, staged);
      }
    }
  }
  release_amx_tiles();
}

}  // namespace baton::kernels::cpu

#endif
