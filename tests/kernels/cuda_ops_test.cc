// The CUDA backend's ops (cuBLASLt GEMMs, FlashInfer's norms, rotary
// embedding, SiLU-and-mul, KV append and paged attention, Baton's row gather)
// against the double-precision references, over ragged and shuffled block
// tables, GQA groups 1, 3, 4, 8 and MQA, head dims 64 and 128, contexts that
// cross block boundaries and prefill chunks on top of cached context.
// Inputs are drawn fresh each run and rounded to BF16 before the reference
// sees them, so the tolerance covers only the kernels' own rounding; outputs
// start poisoned with NaN, so an element never written fails.
//
// Runs where a CUDA device is; elsewhere every test skips on the declared
// check that the machine shows no NVIDIA GPU (tests/cuda_device_check.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "common/dtype.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/llama_ops.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/stream.h"
#include "tests/cuda_device_check.h"
#include "tests/kernels/reference.h"
#include "tests/kernels/test_util.h"

namespace baton::kernels::cuda {
namespace {

using testing::fresh_seed;
using testing::random_floats;

// Values as BF16 holds them: what the device reads, and the reference sees.
std::vector<float> bf16_rounded(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

std::vector<bf16_t> to_bf16(const std::vector<float>& v) {
  std::vector<bf16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = float_to_bf16(v[i]);
  return out;
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& v) {
  auto b = DeviceBuffer::allocate(std::max<size_t>(v.size(), 1) * sizeof(T));
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_TRUE(b->copy_from_host(v.data(), v.size() * sizeof(T)).is_ok());
  return std::move(b).value();
}

// A device buffer of n BF16 values, all NaN.
DeviceBuffer poisoned_bf16(size_t n) { return upload(to_bf16(std::vector<float>(n, NAN))); }

std::vector<float> download_bf16(const DeviceBuffer& b, size_t n) {
  std::vector<bf16_t> raw(n);
  EXPECT_TRUE(synchronize().is_ok());
  EXPECT_TRUE(b.copy_to_host(raw.data(), n * sizeof(bf16_t)).is_ok());
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = bf16_to_float(raw[i]);
  return out;
}

// |got - want| within a few BF16 ulps of the larger magnitude.
void expect_close_bf16(const std::vector<float>& got, const std::vector<double>& want,
                       double relative, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << what << " element " << i << " not written";
    ASSERT_NEAR(got[i], want[i], relative * (1.0 + std::fabs(want[i]))) << what << " element " << i;
  }
}

class CudaOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    BATON_SKIP_WITHOUT_NVIDIA_GPU();
    seed_ = fresh_seed();
    rng_.seed(seed_);
    auto stream = Stream::create();
    ASSERT_TRUE(stream.is_ok()) << stream.status().to_string();
    stream_ = std::move(stream).value();
  }
  void* s() const { return stream_.handle(); }

  uint64_t seed_ = 0;
  std::mt19937_64 rng_;
  Stream stream_;
};

TEST_F(CudaOpsTest, GemmMatchesReferenceWithAndWithoutBias) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto gemm = Gemm::create();
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  for (const auto& [m, n, k] : {std::tuple{1, 64, 64}, std::tuple{7, 200, 136},
                                std::tuple{64, 96, 320}, std::tuple{130, 1024, 64}}) {
    for (bool with_bias : {false, true}) {
      for (DType out_dtype : {DType::kBF16, DType::kF32}) {
        if (with_bias && out_dtype == DType::kF32) continue;  // refused; checked below
        SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " +
                     std::to_string(k));
        auto x = bf16_rounded(random_floats(rng_, size_t(m) * k));
        auto w = bf16_rounded(random_floats(rng_, size_t(n) * k));
        auto bias = bf16_rounded(random_floats(rng_, size_t(n)));
        std::vector<double> w_d(w.begin(), w.end());
        auto want = reference::linear(x, m, w_d, n, k, with_bias ? bias.data() : nullptr);
        auto dx = upload(to_bf16(x)), dw = upload(to_bf16(w)), db = upload(to_bf16(bias));
        auto out = out_dtype == DType::kF32 ? upload(std::vector<float>(size_t(m) * n, NAN))
                                            : poisoned_bf16(size_t(m) * n);
        ASSERT_TRUE((*gemm)
                        ->run({.x = dx.data(),
                               .w = dw.data(),
                               .bias = with_bias ? db.data() : nullptr,
                               .out = out.data(),
                               .m = m,
                               .n = n,
                               .k = k,
                               .dtype = DType::kBF16,
                               .out_dtype = out_dtype},
                              s())
                        .is_ok());
        ASSERT_TRUE(stream_.synchronize().is_ok());
        std::vector<float> got(size_t(m) * n);
        if (out_dtype == DType::kF32) {
          ASSERT_TRUE(out.copy_to_host(got.data(), got.size() * 4).is_ok());
          // F32 accumulation of BF16 products: only summation order differs.
          for (size_t i = 0; i < got.size(); ++i)
            ASSERT_NEAR(got[i], want[i], 1e-4 * std::sqrt(double(k)) * (1 + std::fabs(want[i])));
        } else {
          expect_close_bf16(download_bf16(out, got.size()), want, 8e-3, "gemm");
        }
      }
    }
  }
  // A BF16 bias with an F32 output is refused, not read as F32.
  int dummy = 0;
  EXPECT_EQ((*gemm)
                ->run({.x = &dummy,
                       .w = &dummy,
                       .bias = &dummy,
                       .out = &dummy,
                       .m = 1,
                       .n = 8,
                       .k = 8,
                       .dtype = DType::kBF16,
                       .out_dtype = DType::kF32},
                      s())
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CudaOpsTest, RmsNormAndFusedAddMatchReference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t rows = 37, dim = 576;
  auto x = bf16_rounded(random_floats(rng_, size_t(rows * dim), -3, 3));
  auto residual = bf16_rounded(random_floats(rng_, size_t(rows * dim), -3, 3));
  auto weight = bf16_rounded(random_floats(rng_, size_t(dim), 0.5f, 1.5f));
  const float eps = 1e-5f;
  auto dx = upload(to_bf16(x)), dw = upload(to_bf16(weight)), dr = upload(to_bf16(residual));
  auto out = poisoned_bf16(size_t(rows * dim));
  ASSERT_TRUE(rms_norm_bf16(dx.data(), dw.data(), rows, dim, eps, out.data(), s()).is_ok());
  ASSERT_TRUE(stream_.synchronize().is_ok());
  expect_close_bf16(download_bf16(out, x.size()), reference::rms_norm(x, weight, rows, dim, eps),
                    8e-3, "rms_norm");

  // residual += x (rounded to BF16, as it is stored); x = norm(x + residual).
  ASSERT_TRUE(add_rms_norm_bf16(dx.data(), dr.data(), dw.data(), rows, dim, eps, s()).is_ok());
  ASSERT_TRUE(stream_.synchronize().is_ok());
  std::vector<float> sum(x.size());
  std::vector<double> sum_d(x.size());
  for (size_t i = 0; i < x.size(); ++i) sum[i] = x[i] + residual[i];
  for (size_t i = 0; i < x.size(); ++i) sum_d[i] = bf16_to_float(float_to_bf16(sum[i]));
  expect_close_bf16(download_bf16(dr, x.size()), sum_d, 1e-6, "new residual");
  expect_close_bf16(download_bf16(dx, x.size()), reference::rms_norm(sum, weight, rows, dim, eps),
                    8e-3, "fused norm");
}

// Qwen3's q/k norms: every head of every token normalized in place where
// the fused q/k/v projection left it, nothing between the heads touched.
TEST_F(CudaOpsTest, HeadRmsNormNormalizesEachHeadInPlace) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const int32_t head_dim : {64, 128}) {
    const int64_t tokens = 13;
    const int32_t heads = 5;
    const int64_t stride = int64_t(heads + 3) * head_dim;  // other columns after the heads
    auto x = bf16_rounded(random_floats(rng_, size_t(tokens * stride), -3, 3));
    auto weight = bf16_rounded(random_floats(rng_, size_t(head_dim), 0.5f, 1.5f));
    const float eps = 1e-6f;
    auto dx = upload(to_bf16(x)), dw = upload(to_bf16(weight));
    ASSERT_TRUE(head_rms_norm_bf16(dx.data(), dw.data(), tokens, heads, head_dim, stride, eps, s())
                    .is_ok());
    ASSERT_TRUE(stream_.synchronize().is_ok());
    const std::vector<float> got = download_bf16(dx, x.size());
    std::vector<double> want(x.begin(), x.end());
    for (int64_t t = 0; t < tokens; ++t) {
      const std::vector<float> rows(x.begin() + t * stride,
                                    x.begin() + t * stride + int64_t(heads) * head_dim);
      const std::vector<double> normed = reference::rms_norm(rows, weight, heads, head_dim, eps);
      std::copy(normed.begin(), normed.end(), want.begin() + t * stride);
    }
    expect_close_bf16(got, want, 8e-3, "head_rms_norm head_dim " + std::to_string(head_dim));
  }
}

TEST_F(CudaOpsTest, RopeRotatesQueriesOutOfPlaceAndKeysInPlace) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (int32_t head_dim : {64, 128}) {
    const int32_t heads = 6, kv_heads = 2, tokens = 29, max_pos = 4096;
    const int64_t stride = int64_t(heads + 2 * kv_heads) * head_dim;  // a fused q|k|v row
    std::vector<float> inv_freq(size_t(head_dim / 2));
    for (int32_t i = 0; i < head_dim / 2; ++i)
      inv_freq[size_t(i)] = float(std::pow(500000.0, -2.0 * i / head_dim));
    std::vector<float> table(size_t(max_pos) * head_dim);
    for (int32_t p = 0; p < max_pos; ++p)
      for (int32_t i = 0; i < head_dim / 2; ++i) {
        const double angle = double(float(p) * inv_freq[size_t(i)]);
        table[size_t(p) * head_dim + size_t(i)] = float(std::cos(angle));
        table[size_t(p) * head_dim + size_t(head_dim / 2 + i)] = float(std::sin(angle));
      }
    std::vector<int32_t> positions(static_cast<size_t>(tokens));
    std::uniform_int_distribution<int32_t> pos(0, max_pos - 1);
    for (auto& p : positions) p = pos(rng_);
    auto fused = bf16_rounded(random_floats(rng_, size_t(tokens * stride)));
    auto d_fused = upload(to_bf16(fused)), d_table = upload(table), d_pos = upload(positions);
    auto q_out = poisoned_bf16(size_t(tokens) * heads * head_dim);
    auto* base = static_cast<bf16_t*>(d_fused.data());
    ASSERT_TRUE(rope_bf16({.q = base,
                           .q_stride = stride,
                           .q_out = q_out.data(),
                           .k = base + int64_t(heads) * head_dim,
                           .k_stride = stride,
                           .positions = static_cast<const int32_t*>(d_pos.data()),
                           .cos_sin = static_cast<const float*>(d_table.data()),
                           .tokens = tokens,
                           .num_heads = heads,
                           .num_kv_heads = kv_heads,
                           .head_dim = head_dim},
                          s())
                    .is_ok());
    ASSERT_TRUE(stream_.synchronize().is_ok());
    std::vector<float> q, k;
    for (int32_t t = 0; t < tokens; ++t) {
      auto row = fused.begin() + ptrdiff_t(t * stride);
      q.insert(q.end(), row, row + heads * head_dim);
      k.insert(k.end(), row + heads * head_dim, row + (heads + kv_heads) * head_dim);
    }
    expect_close_bf16(download_bf16(q_out, q.size()),
                      reference::rope(q, positions, heads, head_dim, inv_freq), 8e-3, "q");
    auto after = download_bf16(d_fused, fused.size());
    auto want_k = reference::rope(k, positions, kv_heads, head_dim, inv_freq);
    for (int32_t t = 0; t < tokens; ++t)
      for (int64_t c = 0; c < stride; ++c) {
        const float got = after[size_t(t * stride + c)];
        const int64_t k_col = c - int64_t(heads) * head_dim;
        if (k_col >= 0 && k_col < int64_t(kv_heads) * head_dim) {
          const double w = want_k[size_t(t) * size_t(kv_heads * head_dim) + size_t(k_col)];
          ASSERT_NEAR(got, w, 8e-3 * (1 + std::fabs(w))) << "k of token " << t;
        } else {
          ASSERT_EQ(got, fused[size_t(t * stride + c)]) << "q or v changed in place";
        }
      }
  }
}

TEST_F(CudaOpsTest, SiluAndMulAndRowGather) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int64_t tokens = 19, d = 1536;
  auto gate_up = bf16_rounded(random_floats(rng_, size_t(tokens * 2 * d), -4, 4));
  std::vector<float> gate, up;
  for (int64_t t = 0; t < tokens; ++t) {
    auto row = gate_up.begin() + ptrdiff_t(t * 2 * d);
    gate.insert(gate.end(), row, row + d);
    up.insert(up.end(), row + d, row + 2 * d);
  }
  auto d_in = upload(to_bf16(gate_up));
  auto out = poisoned_bf16(size_t(tokens * d));
  ASSERT_TRUE(silu_and_mul_bf16(d_in.data(), tokens, d, out.data(), s()).is_ok());
  ASSERT_TRUE(stream_.synchronize().is_ok());
  expect_close_bf16(download_bf16(out, size_t(tokens * d)), reference::silu_and_mul(gate, up), 8e-3,
                    "silu_and_mul");

  // Rows in any order, repeated: copied exactly.
  for (int64_t cols : {int64_t(576), int64_t(60)}) {
    auto table = bf16_rounded(random_floats(rng_, size_t(50 * cols)));
    std::vector<int32_t> rows = {49, 0, 7, 7, 23, 1};
    auto d_table = upload(to_bf16(table)), d_rows = upload(rows);
    auto gathered = poisoned_bf16(rows.size() * size_t(cols));
    ASSERT_TRUE(gather_rows_bf16(d_table.data(), cols, static_cast<const int32_t*>(d_rows.data()),
                                 int64_t(rows.size()), gathered.data(), s())
                    .is_ok());
    auto got = download_bf16(gathered, rows.size() * size_t(cols));
    for (size_t i = 0; i < rows.size(); ++i)
      for (int64_t c = 0; c < cols; ++c)
        ASSERT_EQ(got[i * size_t(cols) + size_t(c)], table[size_t(rows[i] * cols + c)]);
  }
}

TEST_F(CudaOpsTest, ScaleRoundsEachProductToBf16InPlace) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // Sizes past one block of threads and past the grid's cap, and a factor
  // whose products need rounding (Granite's multipliers are such).
  for (int64_t n : {int64_t(7), int64_t(1000), int64_t(5'000'000)}) {
    const float factor = std::uniform_real_distribution<float>(1.5f, 13.0f)(rng_);
    auto x = bf16_rounded(random_floats(rng_, size_t(n), -8, 8));
    auto d_x = upload(to_bf16(x));
    ASSERT_TRUE(scale_bf16(d_x.data(), n, factor, s()).is_ok());
    ASSERT_TRUE(stream_.synchronize().is_ok());
    auto got = download_bf16(d_x, size_t(n));
    size_t moved = 0;
    for (size_t i = 0; i < size_t(n); ++i) {
      ASSERT_EQ(got[i], bf16_to_float(float_to_bf16(x[i] * factor)))
          << "element " << i << " of " << n << ", factor " << factor;
      moved += got[i] != x[i];
    }
    EXPECT_GT(moved, size_t(n) / 2) << "the values were not scaled";
  }
}

struct AttentionShape {
  int32_t num_heads, num_kv_heads, head_dim;
};

class CudaPagedAttentionTest : public ::testing::TestWithParam<AttentionShape> {
 protected:
  void SetUp() override { BATON_SKIP_WITHOUT_NVIDIA_GPU(); }
};

// One PagedAttention and its stream, kept across steps as the engine keeps
// them: each plan reuses (or grows) the workspaces of the one before.
struct AttentionOnDevice {
  std::unique_ptr<PagedAttention> attention;
  Stream stream;
};

// `windows`: per layer, the sliding window (0: none); empty, no layer has one.
AttentionOnDevice make_attention(const AttentionShape& shape, int32_t block_size,
                                 std::vector<int32_t> windows = {}) {
  auto attention = PagedAttention::create({.num_heads = shape.num_heads,
                                           .num_kv_heads = shape.num_kv_heads,
                                           .head_dim = shape.head_dim,
                                           .block_size = block_size,
                                           .layer_windows = std::move(windows)});
  EXPECT_TRUE(attention.is_ok()) << attention.status().to_string();
  auto stream = Stream::create();
  EXPECT_TRUE(stream.is_ok()) << stream.status().to_string();
  return {attention.is_ok() ? std::move(attention).value() : nullptr,
          stream.is_ok() ? std::move(stream).value() : Stream()};
}

// Sequences of (query rows, context) in one step, planned once and then run
// for `layers` layers in turn, as the engine runs a step: each layer's K/V
// appended through append_kv, then every query row checked against the
// reference over the sequence's whole context as it should be (the earlier
// context as it was before the step, this step's rows as given), and the
// pool read back to hold exactly that, nothing else changed.
//
// With `windows` (per layer, as make_attention was given them) each row is
// checked against the reference over its window. Where every layer has one,
// the table's blocks wholly behind each sequence's first row's widest window
// name a block of NaN instead, as blocks the engine gave back may hold
// anything: an output that read one is NaN and fails.
void check_step(AttentionOnDevice& on_device, const AttentionShape& shape, int32_t bs,
                const std::vector<std::pair<int32_t, int32_t>>& seqs, bool expect_decode_kernel,
                std::mt19937_64& rng, int32_t layers = 1,
                const std::vector<int32_t>& windows = {}) {
  ASSERT_NE(on_device.attention, nullptr);
  auto window_of = [&](int32_t layer) { return windows.empty() ? 0 : windows[size_t(layer)]; };
  int32_t widest = 0;  // 0: some layer attends to everything
  if (!windows.empty()) {
    ASSERT_EQ(windows.size(), size_t(layers) + 1) << "a window for each layer, 0 included";
    if (*std::min_element(windows.begin(), windows.end()) > 0)
      widest = *std::max_element(windows.begin(), windows.end());
  }
  KvLayout layout{.num_layers = layers + 1,
                  .num_blocks = 0,
                  .block_size = bs,
                  .num_kv_heads = shape.num_kv_heads,
                  .head_dim = shape.head_dim,
                  .dtype = DType::kBF16,
                  .key_order = KeyOrder::kTokenMajor};
  int32_t stride = 1, total_blocks = 0, tokens = 0;
  for (auto [q_len, ctx] : seqs) {
    stride = std::max(stride, (ctx + bs - 1) / bs);
    total_blocks += (ctx + bs - 1) / bs;
    tokens += q_len;
  }
  layout.num_blocks = total_blocks + 5;
  std::vector<int32_t> ids(size_t(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int32_t given_back = ids.back();  // one of the five spare blocks: NaN
  std::vector<int32_t> tables(seqs.size() * size_t(stride), -1), query_start = {0}, lens;
  // Per sequence, the tokens before its first row's widest window.
  std::vector<int32_t> behind(seqs.size(), 0);
  size_t next = 0, blocks_given_back = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    const auto [q_len, ctx] = seqs[s];
    if (widest > 0) behind[s] = std::max(0, ctx - q_len - widest + 1);
    for (int32_t b = 0; b < (ctx + bs - 1) / bs; ++b) {
      const bool gone = (b + 1) * bs <= behind[s];
      tables[s * size_t(stride) + size_t(b)] = gone ? given_back : ids[next++];
      blocks_given_back += gone;
    }
    query_start.push_back(query_start.back() + q_len);
    lens.push_back(ctx);
  }
  if (widest > 0) {
    EXPECT_GT(blocks_given_back, 0u) << "no block was behind every window";
  }
  // The earlier context is already in the pool (random); this step's rows
  // are appended by the kernel.
  auto pool_values = bf16_rounded(random_floats(rng, layout.total_elements(), -2, 2));
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    const size_t at = layout.block_offset(layer, given_back);
    std::fill_n(pool_values.begin() + ptrdiff_t(at), layout.block_elements(), NAN);
  }
  auto same = [](float a, float b) { return a == b || (std::isnan(a) && std::isnan(b)); };
  auto d_pool = upload(to_bf16(pool_values));
  const int64_t kv_width = int64_t(shape.num_kv_heads) * shape.head_dim;
  const int64_t row = 2 * kv_width;  // k then v of one token side by side
  void* stream = on_device.stream.handle();

  PagedAttentionParams p;
  p.qo_dtype = DType::kBF16;
  p.kv_pool = d_pool.data();
  p.layout = layout;
  p.num_heads = shape.num_heads;
  p.num_seqs = int32_t(seqs.size());
  p.query_start = query_start.data();
  p.context_lens = lens.data();
  p.block_tables = tables.data();
  p.block_table_stride = stride;
  p.scale = 1.0f / std::sqrt(float(shape.head_dim));
  ASSERT_TRUE(on_device.attention->plan(p, stream).is_ok());
  EXPECT_EQ(on_device.attention->planned_decode(), expect_decode_kernel);
  // Layers from 1 on: layer 0 stays as it was, and must.
  for (int32_t layer = 1; layer <= layers; ++layer) {
    SCOPED_TRACE("layer " + std::to_string(layer));
    auto new_kv = bf16_rounded(random_floats(rng, size_t(tokens * row), -2, 2));
    // Queries up to 3 in magnitude make the softmax peaky, so that keys
    // left out or attended twice move the outputs past the tolerance.
    auto q = bf16_rounded(random_floats(
        rng, size_t(tokens) * size_t(shape.num_heads) * size_t(shape.head_dim), -3, 3));
    auto d_new = upload(to_bf16(new_kv)), d_q = upload(to_bf16(q));
    auto out = poisoned_bf16(q.size());
    p.q = d_q.data();
    p.out = out.data();
    p.layer = layer;
    p.window = window_of(layer);
    auto* kv_base = static_cast<bf16_t*>(d_new.data());
    ASSERT_TRUE(
        on_device.attention
            ->append_kv(layout, d_pool.data(), layer, kv_base, kv_base + kv_width, row, stream)
            .is_ok());
    ASSERT_TRUE(on_device.attention->run(p, stream).is_ok());
    ASSERT_TRUE(on_device.stream.synchronize().is_ok());
    auto got = download_bf16(out, q.size());
    auto pool_after = download_bf16(d_pool, pool_values.size());

    const size_t q_row = size_t(shape.num_heads) * size_t(shape.head_dim);
    int32_t token = 0;
    for (size_t s = 0; s < seqs.size(); ++s) {
      const auto [q_len, ctx] = seqs[s];
      std::vector<double> k(size_t(ctx) * size_t(kv_width)), v(k.size());
      // Keys behind every window stay 0 here: the reference reads none.
      for (int32_t t = (behind[s] / bs) * bs; t < ctx; ++t) {
        const int32_t block = tables[s * size_t(stride) + size_t(t / bs)];
        const int32_t j = t - (ctx - q_len);  // this step's row j, if >= 0
        for (int32_t h = 0; h < shape.num_kv_heads; ++h)
          for (int32_t d = 0; d < shape.head_dim; ++d) {
            const size_t dst = size_t(t) * size_t(kv_width) + size_t(h * shape.head_dim + d);
            const size_t k_at = layout.key_offset(layer, block, h, t % bs, d);
            const size_t v_at = layout.value_offset(layer, block, h, t % bs) + size_t(d);
            if (j >= 0) {
              const size_t src = size_t(token + j) * size_t(row) + size_t(h * shape.head_dim + d);
              pool_values[k_at] = new_kv[src];
              pool_values[v_at] = new_kv[src + size_t(kv_width)];
            }
            k[dst] = pool_values[k_at];
            v[dst] = pool_values[v_at];
            ASSERT_TRUE(same(pool_after[k_at], pool_values[k_at]))
                << "sequence " << s << (j >= 0 ? " new" : " earlier") << " key of token " << t;
            ASSERT_TRUE(same(pool_after[v_at], pool_values[v_at]))
                << "sequence " << s << (j >= 0 ? " new" : " earlier") << " value of token " << t;
          }
      }
      std::vector<float> q_rows(q.begin() + ptrdiff_t(size_t(token) * q_row),
                                q.begin() + ptrdiff_t(size_t(token + q_len) * q_row));
      auto want = reference::attention(q_rows, q_len, k, v, ctx, shape.num_heads,
                                       shape.num_kv_heads, shape.head_dim, p.scale, p.window);
      std::vector<float> got_rows(got.begin() + ptrdiff_t(size_t(token) * q_row),
                                  got.begin() + ptrdiff_t(size_t(token + q_len) * q_row));
      expect_close_bf16(got_rows, want, 1.5e-2, "sequence " + std::to_string(s));
      token += q_len;
    }
    // Nothing but this step's slots of the layers run so far changed
    // (pool_values holds those slots' new rows by now).
    size_t changed = 0;
    for (size_t i = 0; i < pool_values.size(); ++i) changed += !same(pool_after[i], pool_values[i]);
    EXPECT_EQ(changed, 0u) << "elements of the pool written outside this step's slots";
  }
}

// Whether the decode kernel serves a step of single rows for this shape:
// it is built for these GQA groups, and others take the prefill kernel.
bool decode_kernel_serves(const AttentionShape& shape) {
  const int32_t group = shape.num_heads / shape.num_kv_heads;
  return group == 1 || group == 2 || group == 3 || group == 4 || group == 6 || group == 8 ||
         group == 16;
}

TEST_P(CudaPagedAttentionTest, DecodeStepsMatchReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  AttentionOnDevice on_device = make_attention(GetParam(), 16);
  // One row each; contexts at, below and past block boundaries, one long
  // enough for the kernel to split it (split-KV, its partials merged).
  check_step(on_device, GetParam(), 16,
             {{1, 1}, {1, 15}, {1, 16}, {1, 17}, {1, 100}, {1, 3000}, {1, 333}},
             decode_kernel_serves(GetParam()), rng);
}

TEST_P(CudaPagedAttentionTest, ShortDecodeStepsMatchReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  AttentionOnDevice on_device = make_attention(GetParam(), 16);
  // Contexts too short to split: the kernel writes the outputs itself,
  // the path most decode steps of short prompts take.
  check_step(on_device, GetParam(), 16, {{1, 1}, {1, 17}, {1, 100}},
             decode_kernel_serves(GetParam()), rng);
  // Many sequences: enough work without splitting any.
  std::vector<std::pair<int32_t, int32_t>> many;
  for (int32_t s = 0; s < 300; ++s) many.push_back({1, 1 + int32_t(rng() % 120)});
  check_step(on_device, GetParam(), 16, many, decode_kernel_serves(GetParam()), rng);
}

TEST_P(CudaPagedAttentionTest, PrefillChunksOverCachedContextMatchReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  AttentionOnDevice on_device = make_attention(GetParam(), 16);
  // Fresh prompts, chunks over cached context, and decode rows, in one step.
  check_step(on_device, GetParam(), 16,
             {{37, 37}, {20, 100}, {1, 64}, {130, 1000}, {16, 16}, {1, 5}},
             /*expect_decode_kernel=*/false, rng);
  // Short enough that the prefill kernel does not split the keys.
  check_step(on_device, GetParam(), 16, {{37, 37}, {20, 100}, {16, 16}, {1, 5}},
             /*expect_decode_kernel=*/false, rng);
}

TEST_P(CudaPagedAttentionTest, OneObjectServesStepAfterStepAndEveryLayer) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // As the engine runs it: one object, each step planned once for all its
  // layers, prefill and decode steps in turn, its workspaces growing with
  // a larger step and reused by smaller ones.
  for (int32_t block_size : {16, 64, 1}) {
    SCOPED_TRACE("block size " + std::to_string(block_size));
    AttentionOnDevice on_device = make_attention(GetParam(), block_size);
    check_step(on_device, GetParam(), block_size, {{1, 3}, {5, 9}}, false, rng, 2);
    check_step(on_device, GetParam(), block_size, {{1, 40}, {1, 7}},
               decode_kernel_serves(GetParam()), rng, 2);
    check_step(on_device, GetParam(), block_size, {{100, 300}, {64, 64}, {1, 2000}}, false, rng, 2);
    check_step(on_device, GetParam(), block_size, {{1, 900}, {1, 2}, {1, 65}},
               decode_kernel_serves(GetParam()), rng, 2);
  }
}

TEST_P(CudaPagedAttentionTest, SlidingWindowsMatchReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Decode rows, a chunk longer than the window over cached context, a
  // fresh prompt, and one long enough for the kernels to split its keys.
  const std::vector<std::pair<int32_t, int32_t>> prefill = {{1, 200},    {40, 300}, {37, 37},
                                                            {130, 1000}, {1, 5},    {1, 3000}};
  const std::vector<std::pair<int32_t, int32_t>> decode = {
      {1, 1}, {1, 17}, {1, 100}, {1, 333}, {1, 3000}};
  const bool decode_kernel = decode_kernel_serves(GetParam());
  for (int32_t bs : {16, 1}) {
    SCOPED_TRACE("block size " + std::to_string(bs));
    // Mistral's: one window on every layer; blocks behind it given back.
    std::vector<int32_t> same = {50, 50, 50};
    AttentionOnDevice mistral = make_attention(GetParam(), bs, same);
    check_step(mistral, GetParam(), bs, prefill, false, rng, 2, same);
    check_step(mistral, GetParam(), bs, decode, decode_kernel, rng, 2, same);
    // Every layer windowed, some shorter than others: the widest decides
    // which blocks are given back, and no key split is planned.
    std::vector<int32_t> mixed = {64, 7, 64};
    AttentionOnDevice narrow = make_attention(GetParam(), bs, mixed);
    check_step(narrow, GetParam(), bs, prefill, false, rng, 2, mixed);
    check_step(narrow, GetParam(), bs, decode, decode_kernel, rng, 2, mixed);
    // Qwen2's max_window_layers: a layer attends to everything, so nothing
    // is given back and the windowed layer masks over the whole context.
    std::vector<int32_t> qwen2 = {0, 0, 33};
    AttentionOnDevice partial = make_attention(GetParam(), bs, qwen2);
    check_step(partial, GetParam(), bs, prefill, false, rng, 2, qwen2);
    check_step(partial, GetParam(), bs, decode, decode_kernel, rng, 2, qwen2);
  }
}

// A pool of four 16-token blocks of the shape, for the refusals below.
KvLayout four_block_pool(const AttentionShape& shape, int32_t layers) {
  return {.num_layers = layers,
          .num_blocks = 4,
          .block_size = 16,
          .num_kv_heads = shape.num_kv_heads,
          .head_dim = shape.head_dim,
          .dtype = DType::kBF16,
          .key_order = KeyOrder::kTokenMajor};
}

TEST_P(CudaPagedAttentionTest, RunRefusesAWindowItsShapeDoesNotHave) {
  AttentionOnDevice on_device = make_attention(GetParam(), 16, {0, 9});
  ASSERT_NE(on_device.attention, nullptr);
  PagedAttentionParams p;
  p.qo_dtype = DType::kBF16;
  p.layout = four_block_pool(GetParam(), 2);
  p.layer = 1;
  p.window = 10;
  EXPECT_EQ(on_device.attention->run(p, on_device.stream.handle()).code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(PagedAttention::create({.num_heads = GetParam().num_heads,
                                    .num_kv_heads = GetParam().num_kv_heads,
                                    .head_dim = GetParam().head_dim,
                                    .block_size = 16,
                                    .layer_windows = {4, -1}})
                .status()
                .code(),
            StatusCode::kInvalidArgument);
}

TEST_P(CudaPagedAttentionTest, PlanRefusesBlocksOutsideThePool) {
  AttentionOnDevice on_device = make_attention(GetParam(), 16);
  ASSERT_NE(on_device.attention, nullptr);
  KvLayout layout = four_block_pool(GetParam(), 1);
  std::vector<int32_t> query_start = {0, 1}, lens = {20};
  PagedAttentionParams p;
  p.layout = layout;
  p.num_heads = GetParam().num_heads;
  p.num_seqs = 1;
  p.query_start = query_start.data();
  p.context_lens = lens.data();
  p.block_table_stride = 2;
  for (std::vector<int32_t> table : {std::vector<int32_t>{0, 4}, std::vector<int32_t>{-1, 2}}) {
    p.block_tables = table.data();
    EXPECT_EQ(on_device.attention->plan(p, on_device.stream.handle()).code(),
              StatusCode::kInvalidArgument)
        << "blocks " << table[0] << ", " << table[1];
  }
  // Two blocks' worth of context in a table of one.
  std::vector<int32_t> table = {0, 1};
  p.block_tables = table.data();
  p.block_table_stride = 1;
  EXPECT_EQ(on_device.attention->plan(p, on_device.stream.handle()).code(),
            StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaPagedAttentionTest,
                         ::testing::Values(AttentionShape{8, 8, 64}, AttentionShape{12, 4, 64},
                                           AttentionShape{16, 4, 128}, AttentionShape{32, 4, 128},
                                           AttentionShape{8, 1, 128}, AttentionShape{9, 1, 64},
                                           AttentionShape{14, 2, 64}),
                         [](const auto& info) {
                           const AttentionShape& s = info.param;
                           return std::string("h") + std::to_string(s.num_heads) + "_kv" +
                                  std::to_string(s.num_kv_heads) + "_d" +
                                  std::to_string(s.head_dim);
                         });

}  // namespace
}  // namespace baton::kernels::cuda
