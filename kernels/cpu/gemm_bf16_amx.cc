#include "kernels/cpu/gemm_bf16_amx.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/gemm_bf16_avx512.h"

#define BATON_AMX                                                               \
  __attribute__((                                                               \
      target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma," \
             "f16c")))
#define BATON_AMX_INLINE                                                                   \
  __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma," \
                        "f16c"),                                                           \
                 always_inline)) inline

namespace baton::kernels::cpu {
namespace {

// Tile registers, each 16 rows of 64 bytes: the output block's C tiles are
// 2r + p for x tile r and weight panel p (0-3), x tiles 4-5, weight tiles
// 6-7. Two x tiles by two panels is the largest block eight tiles hold, and
// it loads each tile for two TDPBF16PS.
constexpr int64_t kTileRowBytes = kAmxTileRowBytes;
// Column pairs in one x tile's row, and rows of one weight tile.
constexpr int64_t kTilePairs = 16;
// Column pairs per pass at most: a block's two panels (32 KiB at 256 pairs)
// stay in L1 while every x tile of the pass streams past them from L2.
constexpr int64_t kMaxPassPairs = 256;

// The tile intrinsics are asm statements that take addresses only: memory
// written through ordinary stores must be in place before a tile reads it.
inline void compiler_barrier() { asm volatile("" ::: "memory"); }

// Tile numbers must be literals in the asm; c is a constant after inlining.
BATON_AMX_INLINE void load_c(int c, const float* from, int64_t stride_bytes) {
  switch (c) {
    case 0:
      _tile_loadd(0, from, stride_bytes);
      break;
    case 1:
      _tile_loadd(1, from, stride_bytes);
      break;
    case 2:
      _tile_loadd(2, from, stride_bytes);
      break;
    default:
      _tile_loadd(3, from, stride_bytes);
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

BATON_AMX_INLINE void store_c(int c, float* to, int64_t stride_bytes) {
  switch (c) {
    case 0:
      _tile_stored(0, to, stride_bytes);
      break;
    case 1:
      _tile_stored(1, to, stride_bytes);
      break;
    case 2:
      _tile_stored(2, to, stride_bytes);
      break;
    default:
      _tile_stored(3, to, stride_bytes);
  }
}

// C tiles += x tiles (R of them, 16 rows each from x) times weight tiles
// (P panels from `panels`, each panel_elements apart) over `pairs` column
// pairs, a multiple of 16.
template <int R, int P>
BATON_AMX_INLINE void multiply(const uint16_t* x, int64_t x_stride, const uint32_t* panels,
                               int64_t panel_elements, int64_t pairs) {
  const int64_t x_stride_bytes = x_stride * int64_t(sizeof(uint16_t));
  const uint16_t* x1 = x + kAmxTileRows * x_stride;
  const uint32_t* panel1 = panels + panel_elements;
  for (int64_t k = 0; k < pairs; k += kTilePairs) {
    _tile_loadd(4, x + 2 * k, x_stride_bytes);
    if constexpr (R == 2) _tile_loadd(5, x1 + 2 * k, x_stride_bytes);
    _tile_loadd(6, panels + k * kBf16PanelRows, kTileRowBytes);
    if constexpr (P == 2) _tile_loadd(7, panel1 + k * kBf16PanelRows, kTileRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    if constexpr (P == 2) _tile_dpbf16ps(1, 4, 7);
    if constexpr (R == 2) {
      _tile_dpbf16ps(2, 5, 6);
      if constexpr (P == 2) _tile_dpbf16ps(3, 5, 7);
    }
  }
}

// One block of R x tiles by P panels for one pass: each C tile starts from
// the bias (first pass) or what earlier passes wrote to out, and goes back
// to out. Tiles wholly inside out are loaded and stored in place; those at
// an edge go through `staged`, of which only the rows and columns that
// exist are copied.
struct Block {
  const uint16_t* x = nullptr;       // the block's first x row at the pass's first pair
  int64_t x_stride = 0;              // elements
  const uint32_t* panels = nullptr;  // the block's first panel, at the pass's first pair
  int64_t panel_elements = 0;
  int64_t pairs = 0;
  int64_t rows[2] = {};     // rows of out each x tile covers (0..16)
  int64_t columns[2] = {};  // columns of out each panel covers (0..16)
  float* out = nullptr;     // out at the block's first row and column
  int64_t out_stride = 0;   // elements
  bool first_pass = false;
  const float (*bias)[kAmxTileRows][16] = nullptr;  // a tile per panel, rows alike; null for none
};

template <int R, int P>
BATON_AMX void run_block(const Block& b, float (&staged)[4][kAmxTileRows][16]) {
  const int64_t out_stride_bytes = b.out_stride * int64_t(sizeof(float));
  auto whole = [&](int r, int p) { return b.rows[r] == kAmxTileRows && b.columns[p] == 16; };
  auto at = [&](int r, int p) { return b.out + r * kAmxTileRows * b.out_stride + p * 16; };
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      const int c = 2 * r + p;
      if (b.first_pass) {
        if (b.bias)
          load_c(c, &b.bias[p][0][0], kTileRowBytes);
        else
          zero_c(c);
      } else if (whole(r, p)) {
        load_c(c, at(r, p), out_stride_bytes);
      } else {
        for (int64_t i = 0; i < kAmxTileRows; ++i)
          for (int64_t j = 0; j < 16; ++j)
            staged[c][i][j] =
                i < b.rows[r] && j < b.columns[p] ? at(r, p)[i * b.out_stride + j] : 0.0f;
        compiler_barrier();
        load_c(c, &staged[c][0][0], kTileRowBytes);
      }
    }
  multiply<R, P>(b.x, b.x_stride, b.panels, b.panel_elements, b.pairs);
  for (int r = 0; r < R; ++r)
    for (int p = 0; p < P; ++p) {
      const int c = 2 * r + p;
      if (whole(r, p)) {
        store_c(c, at(r, p), out_stride_bytes);
        continue;
      }
      store_c(c, &staged[c][0][0], kTileRowBytes);
      for (int64_t i = 0; i < b.rows[r]; ++i)
        for (int64_t j = 0; j < b.columns[p]; ++j) at(r, p)[i * b.out_stride + j] = staged[c][i][j];
    }
}

}  // namespace

BATON_AMX void gemm_bf16_rows_amx(const uint16_t* xb, int64_t m, const WeightView& w,
                                  const float* bias, int64_t row_begin, int64_t row_end,
                                  float* out) {
  if (m <= 0 || row_begin >= row_end) return;
  const int64_t x_stride = amx_row_stride(w.cols);
  const int64_t x_pairs = x_stride / 2;  // a multiple of kTilePairs
  const int64_t x_rows = amx_padded_rows(m);
  const int64_t columns = row_end - row_begin;
  const int64_t panels = (columns + kBf16PanelRows - 1) / kBf16PanelRows;
  // Equal passes, each a whole number of tiles.
  const int64_t passes = (x_pairs + kMaxPassPairs - 1) / kMaxPassPairs;
  const int64_t pass_pairs =
      ((x_pairs + passes - 1) / passes + kTilePairs - 1) / kTilePairs * kTilePairs;
  thread_local std::vector<uint32_t> packed;  // [panels][pass pairs][16]
  packed.resize(size_t(panels * pass_pairs * kBf16PanelRows));
  alignas(64) float bias_tiles[2][kAmxTileRows][16];
  alignas(64) float staged[4][kAmxTileRows][16];

  configure_amx_tiles();
  for (int64_t k0 = 0; k0 < x_pairs; k0 += pass_pairs) {
    const int64_t pairs = std::min(pass_pairs, x_pairs - k0);
    const bool first_pass = k0 == 0;
    pack_bf16_panels(w, row_begin, row_end, k0, pairs, packed.data());
    const int64_t panel_elements = pairs * kBf16PanelRows;
    for (int64_t p = 0; p < panels; p += 2) {
      const int64_t column = p * kBf16PanelRows;
      Block b{.x_stride = x_stride,
              .panels = packed.data() + p * panel_elements,
              .panel_elements = panel_elements,
              .pairs = pairs,
              .out_stride = w.rows,
              .first_pass = first_pass,
              .bias = nullptr};
      for (int q = 0; q < 2; ++q)
        b.columns[q] = std::clamp<int64_t>(columns - column - q * 16, 0, 16);
      if (first_pass && bias) {
        for (int q = 0; q < 2; ++q)
          for (int64_t j = 0; j < 16; ++j) {
            const float v = j < b.columns[q] ? bias[row_begin + column + q * 16 + j] : 0.0f;
            for (int64_t i = 0; i < kAmxTileRows; ++i) bias_tiles[q][i][j] = v;
          }
        b.bias = bias_tiles;
      }
      compiler_barrier();  // the packed panels and bias tiles
      const bool two_panels = panels - p >= 2;
      for (int64_t i = 0; i < x_rows; i += 2 * kAmxTileRows) {
        b.x = xb + i * x_stride + 2 * k0;
        b.out = out + i * w.rows + row_begin + column;
        for (int r = 0; r < 2; ++r)
          b.rows[r] = std::clamp<int64_t>(m - i - r * kAmxTileRows, 0, kAmxTileRows);
        const bool two_tiles = x_rows - i >= 2 * kAmxTileRows;
        if (two_tiles && two_panels)
          run_block<2, 2>(b, staged);
        else if (two_tiles)
          run_block<2, 1>(b, staged);
        else if (two_panels)
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
