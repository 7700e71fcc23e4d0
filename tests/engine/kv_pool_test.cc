#include "engine/kv_pool.h"

#include <gtest/gtest.h>

#include <climits>

#include <string>

namespace baton::engine {
namespace {

KvLayout small_layout(int32_t head_dim, DType dtype) {
  return KvLayout{.num_layers = 2,
                  .num_blocks = 3,
                  .block_size = 16,
                  .num_kv_heads = 2,
                  .head_dim = head_dim,
                  .dtype = dtype};
}

// BF16 keeps a pair of each key's dimensions together in its K tiles, so a
// head_dim that pairs do not fill is refused by name; F32 and F16 keep one
// dimension at a time and take any head_dim.
TEST(KvPool, RefusesAHeadDimTheKeyGroupsDoNotFill) {
  auto odd_bf16 = KvPool::create(small_layout(7, DType::kBF16));
  ASSERT_FALSE(odd_bf16.is_ok());
  const std::string message(odd_bf16.status().message());
  EXPECT_NE(message.find("head_dim 7"), std::string::npos) << message;
  EXPECT_NE(message.find("bf16"), std::string::npos) << message;
  for (DType dtype : {DType::kF32, DType::kF16}) {
    auto pool = KvPool::create(small_layout(7, dtype));
    ASSERT_TRUE(pool.is_ok()) << pool.status().message();
  }
  EXPECT_TRUE(KvPool::create(small_layout(8, DType::kBF16)).is_ok());
}

TEST(KvPool, RefusesNonPositiveDimensions) {
  for (int32_t KvLayout::*field :
       {&KvLayout::num_layers, &KvLayout::num_blocks, &KvLayout::block_size,
        &KvLayout::num_kv_heads, &KvLayout::head_dim}) {
    for (int32_t bad : {0, -1, INT32_MIN}) {
      KvLayout layout = small_layout(8, DType::kF32);
      layout.*field = bad;
      auto pool = KvPool::create(layout);
      ASSERT_FALSE(pool.is_ok()) << bad;
      EXPECT_EQ(pool.status().code(), StatusCode::kInvalidArgument);
    }
  }
  EXPECT_TRUE(KvPool::create(small_layout(8, DType::kF32)).is_ok());
}

}  // namespace
}  // namespace baton::engine
