#include "common/kv_layout.h"

#include <gtest/gtest.h>

#include <set>
#include <vector>

namespace baton {
namespace {

// Every (layer, block, part, head, slot, dim) maps to a distinct element and
// the mapping covers the pool exactly; blocks are contiguous per layer.
TEST(KvLayout, OffsetsAreABijection) {
  KvLayout layout{.num_layers = 3,
                  .num_blocks = 5,
                  .block_size = 4,
                  .num_kv_heads = 2,
                  .head_dim = 8,
                  .dtype = DType::kBF16};
  std::vector<int> hits(layout.total_elements(), 0);
  for (int l = 0; l < layout.num_layers; ++l)
    for (int b = 0; b < layout.num_blocks; ++b)
      for (KvPart p : {KvPart::kKey, KvPart::kValue})
        for (int h = 0; h < layout.num_kv_heads; ++h)
          for (int s = 0; s < layout.block_size; ++s)
            for (int d = 0; d < layout.head_dim; ++d) {
              size_t off = layout.element_offset(l, b, p, h, s) + d;
              ASSERT_LT(off, hits.size());
              ++hits[off];
              // The element lies inside its (layer, block) byte range.
              EXPECT_GE(off, layout.block_offset(l, b));
              EXPECT_LT(off, layout.block_offset(l, b) + layout.block_elements());
            }
  for (int h : hits) ASSERT_EQ(h, 1);
  EXPECT_EQ(layout.total_bytes(), layout.total_elements() * 2);
  EXPECT_EQ(layout.block_offset(1, 3) + layout.block_elements(), layout.block_offset(1, 4));
  EXPECT_EQ(layout.bytes_per_token(), size_t(3 * 2 * 2 * 8 * 2));
}

}  // namespace
}  // namespace baton
