// The CUDA decode attention against the double-precision reference. Runs on a
// machine with a CUDA device; elsewhere every test skips on the declared
// check that the machine shows no NVIDIA GPU (tests/cuda_device_check.h),
// never by catching a failure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/dtype.h"
#include "kernels/cuda/device.h"
#include "tests/cuda_device_check.h"
#include "tests/kernels/reference.h"

namespace baton::kernels::cuda {
namespace {

struct Shape {
  int32_t num_heads, num_kv_heads, head_dim;
  DType dtype;
};

class CudaDecodeAttentionTest : public ::testing::TestWithParam<Shape> {
 protected:
  void SetUp() override { BATON_SKIP_WITHOUT_NVIDIA_GPU(); }
};

TEST_P(CudaDecodeAttentionTest, MatchesReferenceOverRaggedShuffledContexts) {
  const Shape shape = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::vector<int32_t> context_lens = {1, 15, 16, 17, 100, 1000, 333};
  const int32_t num_seqs = int32_t(context_lens.size());
  KvLayout layout{.num_layers = 2,
                  .num_blocks = 0,
                  .block_size = 16,
                  .num_kv_heads = shape.num_kv_heads,
                  .head_dim = shape.head_dim,
                  .dtype = shape.dtype};
  int32_t stride = 0, total_blocks = 0;
  for (int32_t len : context_lens) {
    stride = std::max(stride, (len + 15) / 16);
    total_blocks += (len + 15) / 16;
  }
  layout.num_blocks = total_blocks + 3;  // a few blocks nobody owns
  // Block ids handed out in shuffled order: tables are non-contiguous.
  std::vector<int32_t> ids(size_t(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> tables(size_t(num_seqs) * size_t(stride), -1);
  size_t next = 0;
  for (int32_t s = 0; s < num_seqs; ++s)
    for (int32_t b = 0; b < (context_lens[size_t(s)] + 15) / 16; ++b)
      tables[size_t(s) * size_t(stride) + size_t(b)] = ids[next++];

  std::vector<uint8_t> pool(layout.total_bytes());
  for (size_t i = 0; i < layout.total_elements(); ++i)
    store_from_float(pool.data(), layout.dtype, i, normal(rng));
  std::vector<float> q(size_t(num_seqs) * size_t(shape.num_heads) * size_t(shape.head_dim));
  for (auto& x : q) x = normal(rng);
  const float scale = 1.0f / std::sqrt(float(shape.head_dim));
  const int32_t layer = 1;

  auto d_pool = DeviceBuffer::allocate(pool.size());
  auto d_q = DeviceBuffer::allocate(q.size() * sizeof(float));
  auto d_out = DeviceBuffer::allocate(q.size() * sizeof(float));
  auto d_lens = DeviceBuffer::allocate(context_lens.size() * sizeof(int32_t));
  auto d_tables = DeviceBuffer::allocate(tables.size() * sizeof(int32_t));
  for (auto* b : {&d_pool, &d_q, &d_out, &d_lens, &d_tables})
    ASSERT_TRUE(b->is_ok()) << b->status().to_string();
  ASSERT_TRUE(d_pool->copy_from_host(pool.data(), pool.size()).is_ok());
  ASSERT_TRUE(d_q->copy_from_host(q.data(), q.size() * sizeof(float)).is_ok());
  ASSERT_TRUE(
      d_lens->copy_from_host(context_lens.data(), context_lens.size() * sizeof(int32_t)).is_ok());
  ASSERT_TRUE(d_tables->copy_from_host(tables.data(), tables.size() * sizeof(int32_t)).is_ok());
  std::vector<float> out(q.size(), NAN);  // poison: an unwritten element fails
  ASSERT_TRUE(d_out->copy_from_host(out.data(), out.size() * sizeof(float)).is_ok());

  PagedAttentionParams params;
  params.q = static_cast<const float*>(d_q->data());
  params.out = static_cast<float*>(d_out->data());
  params.kv_pool = d_pool->data();
  params.layout = layout;
  params.layer = layer;
  params.num_heads = shape.num_heads;
  params.num_seqs = num_seqs;
  params.context_lens = static_cast<const int32_t*>(d_lens->data());
  params.block_tables = static_cast<const int32_t*>(d_tables->data());
  params.block_table_stride = stride;
  params.scale = scale;
  ASSERT_TRUE(paged_decode_attention(params, nullptr).is_ok());
  ASSERT_TRUE(synchronize().is_ok());
  ASSERT_TRUE(d_out->copy_to_host(out.data(), out.size() * sizeof(float)).is_ok());

  const size_t row = size_t(shape.num_heads) * size_t(shape.head_dim);
  for (int32_t s = 0; s < num_seqs; ++s) {
    const int32_t ctx = context_lens[size_t(s)];
    // Contiguous, dequantised K/V of this sequence for the reference.
    std::vector<double> k(size_t(ctx) * size_t(shape.num_kv_heads) * size_t(shape.head_dim));
    std::vector<double> v(k.size());
    for (int32_t t = 0; t < ctx; ++t)
      for (int32_t h = 0; h < shape.num_kv_heads; ++h)
        for (int32_t d = 0; d < shape.head_dim; ++d) {
          int32_t block = tables[size_t(s) * size_t(stride) + size_t(t / 16)];
          size_t dst =
              (size_t(t) * size_t(shape.num_kv_heads) + size_t(h)) * size_t(shape.head_dim) +
              size_t(d);
          k[dst] = load_as_float(pool.data(), layout.dtype,
                                 layout.key_offset(layer, block, h, t % 16, d));
          v[dst] = load_as_float(pool.data(), layout.dtype,
                                 layout.value_offset(layer, block, h, t % 16) + size_t(d));
        }
    std::vector<float> q_row(q.begin() + ptrdiff_t(size_t(s) * row),
                             q.begin() + ptrdiff_t(size_t(s + 1) * row));
    auto want = reference::attention(q_row, 1, k, v, ctx, shape.num_heads, shape.num_kv_heads,
                                     shape.head_dim, scale);
    for (size_t i = 0; i < row; ++i) {
      ASSERT_NEAR(out[size_t(s) * row + i], want[i], 2e-4 * (1.0 + std::fabs(want[i])))
          << "sequence " << s << " element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, CudaDecodeAttentionTest,
    ::testing::Values(Shape{8, 8, 64, DType::kF32}, Shape{8, 4, 128, DType::kF32},
                      Shape{12, 4, 64, DType::kBF16}, Shape{16, 4, 128, DType::kF16},
                      Shape{14, 2, 64, DType::kBF16}, Shape{32, 4, 128, DType::kBF16},
                      Shape{8, 1, 128, DType::kF32}),
    [](const auto& info) {
      const Shape& s = info.param;
      return std::string("h") + std::to_string(s.num_heads) + "_kv" +
             std::to_string(s.num_kv_heads) + "_d" + std::to_string(s.head_dim) + "_" +
             std::string(dtype_name(s.dtype));
    });

TEST(CudaBackend, ReportsUnsupportedShapes) {
  BATON_SKIP_WITHOUT_NVIDIA_GPU();
  PagedAttentionParams params;
  params.num_seqs = 1;
  params.num_heads = 18;
  params.layout.num_kv_heads = 2;  // 9 query heads per KV head: over the limit
  params.layout.head_dim = 64;
  EXPECT_EQ(paged_decode_attention(params, nullptr).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace baton::kernels::cuda
