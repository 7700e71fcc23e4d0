#include "common/kv_layout.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace baton {
namespace {

// Every (layer, block, part, head, slot, dim) maps to a distinct element and
// the mapping covers the pool exactly; blocks are contiguous per layer.
TEST(KvLayout, OffsetsAreABijection) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kFP8E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvLayout layout{.num_layers = 3,
                    .num_blocks = 5,
                    .block_size = 4,
                    .num_kv_heads = 2,
                    .head_dim = 8,
                    .dtype = dtype};
    std::vector<int> hits(layout.total_elements(), 0);
    for (int l = 0; l < layout.num_layers; ++l)
      for (int b = 0; b < layout.num_blocks; ++b)
        for (KvPart p : {KvPart::kKey, KvPart::kValue})
          for (int h = 0; h < layout.num_kv_heads; ++h)
            for (int s = 0; s < layout.block_size; ++s)
              for (int d = 0; d < layout.head_dim; ++d) {
                const size_t off = p == KvPart::kKey ? layout.key_offset(l, b, h, s, d)
                                                     : layout.value_offset(l, b, h, s) + d;
                ASSERT_LT(off, hits.size());
                ++hits[off];
                // The element lies inside its (layer, block, part, head) tile.
                const size_t tile = layout.head_tile_offset(l, b, p, h);
                EXPECT_GE(off, tile);
                EXPECT_LT(off, tile + layout.head_tile_elements());
              }
    // A quantized block ends with the scales of its rows, each four bytes
    // inside its own block.
    if (is_quantized(dtype)) {
      for (int l = 0; l < layout.num_layers; ++l)
        for (int b = 0; b < layout.num_blocks; ++b)
          for (KvPart p : {KvPart::kKey, KvPart::kValue})
            for (int h = 0; h < layout.num_kv_heads; ++h)
              for (int s = 0; s < layout.block_size; ++s) {
                const size_t off = layout.scale_byte_offset(l, b, p, h, s);
                ASSERT_LE(off + 4, hits.size());
                EXPECT_GE(off, layout.block_byte_offset(l, b));
                EXPECT_LE(off + 4, layout.block_byte_offset(l, b) + layout.block_bytes());
                for (size_t i = off; i < off + 4; ++i) ++hits[i];
              }
    }
    for (int h : hits) ASSERT_EQ(h, 1);
    EXPECT_EQ(layout.total_bytes(), layout.total_elements() * dtype_size(dtype));
    EXPECT_EQ(layout.block_offset(1, 3) + layout.block_elements(), layout.block_offset(1, 4));
    // Per token: K and V of 2 heads x 8 dims in 3 layers, and a float
    // scale per row when quantized.
    const size_t scales = is_quantized(dtype) ? size_t(3 * 2 * 2) * 4 : 0;
    EXPECT_EQ(layout.bytes_per_token(), size_t(3 * 2 * 2 * 8) * dtype_size(dtype) + scales);
  }
}

// K tiles keep the keys of a block side by side, a BF16 pair or one F32 or
// F16 dimension of each at a time: the same dimensions of consecutive keys
// are one group apart.
TEST(KvLayout, KeysLieSideBySide) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kI8, DType::kFP8E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvLayout layout{.num_layers = 2,
                    .num_blocks = 3,
                    .block_size = 16,
                    .num_kv_heads = 3,
                    .head_dim = 64,
                    .dtype = dtype};
    const int32_t g = layout.key_group();
    // A BF16 pair (VDPBF16PS; E4M3 codes become BF16), four int8 codes
    // (VPDPBUSD), else one.
    EXPECT_EQ(g, dtype == DType::kBF16 || dtype == DType::kFP8E4M3 ? 2
                 : dtype == DType::kI8                             ? 4
                                                                   : 1);
    const size_t tile = layout.head_tile_offset(1, 2, KvPart::kKey, 1);
    EXPECT_EQ(layout.key_offset(1, 2, 1, 0, 0), tile);
    for (int s = 0; s + 1 < layout.block_size; ++s)
      for (int d = 0; d < layout.head_dim; ++d) {
        EXPECT_EQ(layout.key_offset(1, 2, 1, s + 1, d), layout.key_offset(1, 2, 1, s, d) + g);
        if (d % g + 1 < g) {
          EXPECT_EQ(layout.key_offset(1, 2, 1, s, d + 1), layout.key_offset(1, 2, 1, s, d) + 1);
        } else if (d + 1 < layout.head_dim) {
          EXPECT_EQ(layout.key_offset(1, 2, 1, s, d + 1),
                    layout.key_offset(1, 2, 1, s, d + 1 - g) + layout.key_group_stride());
        }
      }
    // V rows stay token-major.
    EXPECT_EQ(layout.value_offset(1, 2, 1, 5),
              layout.head_tile_offset(1, 2, KvPart::kValue, 1) + 5 * 64);
  }
}

// The GPU kernels' order: each key a whole row, exactly like V, and the
// block's byte range unchanged (the transfer and SSD tier move blocks whole).
TEST(KvLayout, TokenMajorKeysAreRowsLikeValues) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(std::string(dtype_name(dtype)));
    KvLayout grouped{.num_layers = 2,
                     .num_blocks = 3,
                     .block_size = 16,
                     .num_kv_heads = 3,
                     .head_dim = 64,
                     .dtype = dtype};
    KvLayout rows = grouped;
    rows.key_order = KeyOrder::kTokenMajor;
    EXPECT_EQ(rows.key_group(), 64);
    EXPECT_FALSE(rows.same_geometry(grouped));
    EXPECT_EQ(rows.block_bytes(), grouped.block_bytes());
    EXPECT_EQ(rows.block_byte_offset(1, 2), grouped.block_byte_offset(1, 2));
    for (int s = 0; s < rows.block_size; ++s)
      for (int d = 0; d < rows.head_dim; ++d) {
        EXPECT_EQ(rows.key_offset(1, 2, 1, s, d),
                  rows.head_tile_offset(1, 2, KvPart::kKey, 1) + size_t(s) * 64 + size_t(d));
        EXPECT_EQ(rows.key_offset(1, 2, 1, s, d) - rows.head_tile_offset(1, 2, KvPart::kKey, 1),
                  rows.value_offset(1, 2, 1, s) - rows.head_tile_offset(1, 2, KvPart::kValue, 1) +
                      size_t(d));
      }
  }
}

}  // namespace
}  // namespace baton
