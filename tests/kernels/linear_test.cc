// linear() and embedding() against the double reference on dequantised weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

#include "kernels/cpu/blas_setup.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/linear.h"
#include "tests/kernels/reference.h"
#include "tests/kernels/test_util.h"

namespace baton::kernels::cpu {
namespace {

using testing::fresh_seed;
using testing::random_floats;

struct Shape {
  int64_t rows, cols;
};

// True when linear() multiplies BF16 weights by x rounded to BF16 at some
// batch: on AMX tiles (gemm_bf16_amx.h) or with VDPBF16PS
// (gemm_bf16_avx512.h).
bool bf16_gemm_in_use() { return use_amx_bf16() || use_avx512_bf16(); }

// x as linear() multiplies it: rounded to BF16 where a BF16 GEMM takes the
// call, as given everywhere else.
std::vector<float> x_as_multiplied(std::vector<float> x, int64_t m, DType weights) {
  if (linear_rounds_x_to_bf16(m, weights))
    for (float& v : x) v = float(testing::round_trip(v, DType::kBF16));
  return x;
}

void check_linear(ThreadPool& pool, std::mt19937_64& rng, int64_t m, Shape shape, DType dt,
                  bool with_bias) {
  std::ostringstream os;
  os << "m=" << m << " rows=" << shape.rows << " cols=" << shape.cols << " dtype=" << dtype_name(dt)
     << " bias=" << with_bias << " simd=" << use_avx2() << " avx512=" << use_avx512()
     << " avx512_bf16=" << use_avx512_bf16() << " amx=" << use_amx_bf16();
  SCOPED_TRACE(os.str());
  const auto w_f = random_floats(rng, size_t(shape.rows * shape.cols));
  const auto w_bytes = testing::encode(w_f, dt);
  std::vector<double> w(w_f.size());
  for (size_t i = 0; i < w.size(); ++i) w[i] = load_as_float(w_bytes.data(), dt, i);
  const auto given_x = random_floats(rng, size_t(m * shape.cols), -2.0f, 2.0f);
  const auto bias = random_floats(rng, size_t(shape.rows));
  std::vector<float> out(static_cast<size_t>(m * shape.rows), testing::kNaN);
  WeightView view{w_bytes.data(), dt, shape.rows, shape.cols};
  linear(pool, given_x.data(), m, view, with_bias ? bias.data() : nullptr, out.data());
  const auto x = x_as_multiplied(given_x, m, dt);
  const auto ref =
      reference::linear(x, m, w, shape.rows, shape.cols, with_bias ? bias.data() : nullptr);
  int failures = 0;
  for (int64_t i = 0; i < m && failures < 5; ++i)
    for (int64_t r = 0; r < shape.rows && failures < 5; ++r) {
      // Float accumulation error grows with the magnitude of the terms summed.
      double magnitude = with_bias ? std::abs(bias[size_t(r)]) : 0.0;
      for (int64_t c = 0; c < shape.cols; ++c)
        magnitude += std::abs(x[size_t(i * shape.cols + c)] * w[size_t(r * shape.cols + c)]);
      const double got = out[size_t(i * shape.rows + r)];
      const double want = ref[size_t(i * shape.rows + r)];
      if (!(std::abs(got - want) <= 1e-5 * magnitude + 1e-6)) {
        ++failures;
        ADD_FAILURE() << "out[" << i << "," << r << "] = " << got << ", want " << want;
      }
    }
}

// The kernels a case runs: AMX tiles (the BF16 GEMM on them), AVX-512 with
// BF16 products (the BF16 GEMM), AVX-512 (batched GEMV), AVX2, or portable
// code.
enum class Isa { kAmx, kAvx512Bf16, kAvx512, kAvx2, kScalar };

class LinearTest : public ::testing::TestWithParam<Isa> {};

TEST_P(LinearTest, MatchesReferenceOverShapesDtypesAndBatches) {
  const Isa isa = GetParam();
  if (isa == Isa::kAmx && !cpu_has_amx_bf16())
    GTEST_SKIP() << "this CPU (or its kernel) gives no AMX BF16 tiles";
  if (isa == Isa::kAvx512Bf16 && !cpu_has_avx512_bf16())
    GTEST_SKIP() << "this CPU has no AVX512_BF16";
  if (isa == Isa::kAvx512 && !cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512";
  if (isa == Isa::kAvx2 && !cpu_has_avx2_fma_f16c()) GTEST_SKIP() << "this CPU has no AVX2";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  struct RestoreIsa {
    ~RestoreIsa() {
      set_simd_enabled(true);
      set_avx512_enabled(true);
      set_avx512_bf16_preferred(cpu_prefers_avx512_bf16());
      set_amx_enabled(max_cpu_isa() >= MaxCpuIsa::kAmx);
    }
  } restore;
  set_simd_enabled(isa != Isa::kScalar);
  set_avx512_enabled(isa == Isa::kAmx || isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16);
  set_avx512_bf16_preferred(isa == Isa::kAvx512Bf16);
  set_amx_enabled(isa == Isa::kAmx);
  ASSERT_EQ(use_avx512(), isa == Isa::kAmx || isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16);
  ASSERT_EQ(use_avx512_bf16(), isa == Isa::kAvx512Bf16);
  ASSERT_EQ(use_amx_bf16(), isa == Isa::kAmx);
  ThreadPool pool(2);
  // Odd columns, rows past whole 16-row panels, columns past whole 32-column
  // tiles (129, 67, 17, 1040), weights of an odd number of 16-row panels, and
  // for AMX several column passes (1040, 1056) with weights read in place
  // (whole tiles of rows: 256, 48 and 64 rows in pieces of 16 or 32) or
  // staged (the rest).
  const Shape shapes[] = {{67, 129}, {129, 67}, {256, 512}, {5, 8},     {1, 1},
                          {300, 17}, {9, 1040}, {48, 544},  {33, 1056}, {64, 1056}};
  for (int64_t m : {1, 2, 3, 8, 9, 16, 17, 32, 33, 35, 64, 200})
    for (Shape s : shapes)
      for (DType dt : {DType::kF32, DType::kF16, DType::kBF16})
        for (bool bias : {false, true}) check_linear(pool, rng, m, s, dt, bias);
}

INSTANTIATE_TEST_SUITE_P(Isas, LinearTest,
                         ::testing::Values(Isa::kAmx, Isa::kAvx512Bf16, Isa::kAvx512, Isa::kAvx2,
                                           Isa::kScalar),
                         [](const auto& info) {
                           return info.param == Isa::kAmx          ? "amx"
                                  : info.param == Isa::kAvx512Bf16 ? "avx512_bf16"
                                  : info.param == Isa::kAvx512     ? "avx512"
                                  : info.param == Isa::kAvx2       ? "avx2"
                                                                   : "scalar";
                         });

// Decode batches of BF16 weights on AMX tiles take x in three BF16 parts
// (gemm_bf16_amx.h, AmxX::kSplit) so that the products are F32's. On
// values whose every product and partial sum F32 holds exactly (x of 19
// significant bits, weights small integers, 8 columns) the outputs must be
// exact: a part dropped or taken twice is off by up to 2^-9 of x. An
// infinite x stays infinite (its other parts are 0, not inf - inf).
TEST(LinearTest, AmxDecodeBatchesMultiplyWithF32Products) {
  if (!use_amx_bf16()) GTEST_SKIP() << "this CPU (or its kernel) gives no AMX BF16 tiles";
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> unit(-7, 7), fine(-127, 127), small(-3, 3);
  ThreadPool pool(2);
  const int64_t rows = 48, cols = 8;
  for (int64_t m : {kAmxMinRows, kAmxMinRows + 1, gemv_max_batch() - 1, gemv_max_batch()}) {
    SCOPED_TRACE("m=" + std::to_string(m));
    ASSERT_FALSE(linear_rounds_x_to_bf16(m, DType::kBF16));
    std::vector<float> x(size_t(m * cols));
    for (float& v : x) v = float(unit(rng)) + float(fine(rng)) / 256 + float(fine(rng)) / 65536;
    std::vector<float> w_f(size_t(rows * cols));
    for (float& v : w_f) v = float(small(rng));
    const auto w = testing::encode(w_f, DType::kBF16);
    x[0] = std::numeric_limits<float>::infinity();  // row 0 meets weight rows of any sign
    std::vector<float> out(size_t(m * rows), testing::kNaN);
    linear(pool, x.data(), m, WeightView{w.data(), DType::kBF16, rows, cols}, nullptr, out.data());
    for (int64_t i = 0; i < m; ++i)
      for (int64_t r = 0; r < rows; ++r) {
        double want = 0;
        for (int64_t c = 0; c < cols; ++c)
          want += double(x[size_t(i * cols + c)]) * double(w_f[size_t(r * cols + c)]);
        const float got = out[size_t(i * rows + r)];
        if (std::isnan(want)) {  // inf times a zero weight
          EXPECT_TRUE(std::isnan(got)) << "out[" << i << "," << r << "]";
        } else {
          EXPECT_EQ(double(got), want) << "out[" << i << "," << r << "]";
        }
      }
  }
}

TEST(LinearTest, PoolSizesGiveTheSameAnswer) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const auto w_f = random_floats(rng, 1000 * 96);
  const auto w = testing::encode(w_f, DType::kBF16);
  WeightView view{w.data(), DType::kBF16, 1000, 96};
  // The GEMV path (small m) and the BF16 GEMM compute each output with one
  // thread and one summation order, so the pool size cannot change them.
  // (sgemm's blocking may depend on the slice width, so large m on that
  // path is only checked against the reference.)
  std::vector<int64_t> batches = {1, 5};
  if (bf16_gemm_in_use()) batches.push_back(gemv_max_batch() + 67);
  for (int64_t m : batches) {
    const auto x = random_floats(rng, size_t(m * 96));
    // NaN where nothing was written: unequal to itself, so a row that
    // neither pool size writes fails the comparison too.
    std::vector<float> a(static_cast<size_t>(m * 1000), testing::kNaN), b(a.size(), testing::kNaN);
    ThreadPool one(1), three(3);
    linear(one, x.data(), m, view, nullptr, a.data());
    linear(three, x.data(), m, view, nullptr, b.data());
    EXPECT_EQ(a, b) << "m=" << m;
    EXPECT_TRUE(std::ranges::all_of(a, [](float v) { return std::isfinite(v); })) << "m=" << m;
  }
}

// Several weights sharing one x (q/k/v, gate/up) in one call: every output
// matches the reference, and on the GEMV path (one thread and one summation
// order per output row) exactly what a call per weight gives.
TEST(LinearTest, GroupedOutputsMatchOneCallPerWeight) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(3);
  // Wide enough that even m = 1 is shared out over the threads (narrower
  // rows run inline), with a tail of columns past the last whole vector.
  const int64_t cols = 259;
  // Row counts that are not multiples of the GEMV row block, so pieces
  // straddle the boundaries between weights.
  const int64_t rows[] = {197, 61, 3, 130};
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16})
    for (int64_t m : {1, 3, 16, 17, 70}) {
      SCOPED_TRACE("m=" + std::to_string(m) + " dtype=" + std::string(dtype_name(dt)));
      const auto x = random_floats(rng, size_t(m * cols), -2.0f, 2.0f);
      std::vector<std::vector<uint8_t>> weights;
      std::vector<std::vector<float>> biases, grouped, single;
      std::vector<LinearOutput> outputs;
      for (size_t j = 0; j < std::size(rows); ++j) {
        weights.push_back(testing::encode(random_floats(rng, size_t(rows[j] * cols)), dt));
        biases.push_back(random_floats(rng, size_t(rows[j])));
        grouped.emplace_back(size_t(m * rows[j]), testing::kNaN);
        single.emplace_back(size_t(m * rows[j]), testing::kNaN);
      }
      for (size_t j = 0; j < std::size(rows); ++j) {
        const WeightView view{weights[j].data(), dt, rows[j], cols};
        const float* bias = j % 2 == 0 ? biases[j].data() : nullptr;  // some with, some without
        outputs.push_back({view, bias, grouped[j].data()});
        linear(pool, x.data(), m, view, bias, single[j].data());
      }
      linear(pool, x.data(), m, outputs);
      for (size_t j = 0; j < std::size(rows); ++j) {
        std::vector<double> w(size_t(rows[j] * cols));
        for (size_t i = 0; i < w.size(); ++i) w[i] = load_as_float(weights[j].data(), dt, i);
        const auto ref =
            reference::linear(x_as_multiplied(x, m, dt), m, w, rows[j], cols, outputs[j].bias);
        for (size_t i = 0; i < ref.size(); ++i)
          ASSERT_NEAR(grouped[j][i], ref[i], 1e-4 * (1 + std::abs(ref[i])))
              << "output " << j << " element " << i;
        if (m <= 16) {
          EXPECT_EQ(grouped[j], single[j]) << "output " << j;
        }
      }
    }
}

TEST(EmbeddingTest, CopiesRowsAsFloat) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    const int64_t vocab = 50, dim = 37;
    const auto table_f = random_floats(rng, size_t(vocab * dim));
    const auto table = testing::encode(table_f, dt);
    std::vector<int32_t> ids = {3, 0, 49, 3, 17};
    std::vector<float> out(ids.size() * dim, testing::kNaN);
    embedding(pool, WeightView{table.data(), dt, vocab, dim}, ids.data(), int64_t(ids.size()),
              out.data());
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t c = 0; c < dim; ++c)
        EXPECT_EQ(out[i * dim + size_t(c)],
                  load_as_float(table.data(), dt, size_t(ids[i] * dim + c)));
  }
}

// OpenBLAS takes a CPU model it does not know for a Prescott; setup_blas()
// must leave it running kernels with the vector units the CPU has.
TEST(BlasSetupTest, RunsKernelsWithTheCpusVectorUnits) {
  if (!cpu_has_avx2_fma_f16c()) GTEST_SKIP() << "this CPU has no AVX2/FMA";
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr)
    GTEST_SKIP() << "OPENBLAS_CORETYPE is set: the user chose the kernels";
  setup_blas();
  const std::string core = blas_core_name();
  const bool avx2_kernels = core == "Haswell" || core == "Zen" || core == "SkylakeX" ||
                            core == "Cooperlake" || core == "SapphireRapids" || core == "Excavator";
  EXPECT_TRUE(avx2_kernels) << "OpenBLAS runs its " << core << " kernels on an AVX2 CPU";
  if (cpu_has_avx512()) {
    EXPECT_NE(core, "Haswell") << "an AVX-512 CPU runs AVX2 kernels";
  }
}

}  // namespace
}  // namespace baton::kernels::cpu
