// Norms, RoPE, SiLU-and-mul and residual adds against the double reference.
#include <gtest/gtest.h>

#include <cmath>

#include "kernels/cpu/elementwise.h"
#include "tests/kernels/reference.h"
#include "tests/kernels/test_util.h"

namespace baton::kernels::cpu {
namespace {

using testing::fresh_seed;
using testing::random_floats;

void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel) {
  ASSERT_EQ(got.size(), want.size());
  double scale = 0.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  int failures = 0;
  for (size_t i = 0; i < got.size() && failures < 5; ++i)
    if (!(std::abs(double(got[i]) - want[i]) <= rel * scale)) {
      ++failures;
      ADD_FAILURE() << "element " << i << ": got " << got[i] << " want " << want[i];
    }
}

TEST(RmsNormTest, MatchesReferenceAndMayAlias) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (auto [rows, dim] : {std::pair<int64_t, int64_t>{1, 576}, {7, 4096}, {300, 64}, {3, 1}}) {
    SCOPED_TRACE("rows=" + std::to_string(rows) + " dim=" + std::to_string(dim));
    auto x = random_floats(rng, size_t(rows * dim), -4.0f, 4.0f);
    const auto weight = random_floats(rng, size_t(dim), 0.5f, 1.5f);
    const auto ref = reference::rms_norm(x, weight, rows, dim, 1e-5);
    std::vector<float> out(x.size(), testing::kNaN);
    rms_norm(pool, x.data(), weight.data(), rows, dim, 1e-5f, out.data());
    expect_close(out, ref, 1e-6);
    rms_norm(pool, x.data(), weight.data(), rows, dim, 1e-5f, x.data());  // in place
    expect_close(x, ref, 1e-6);
  }
}

TEST(RopeTest, RotateHalfMatchesReference) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (int64_t head_dim : {64, 128}) {
    const int64_t tokens = 37, heads = 5;
    std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
    for (int64_t i = 0; i < head_dim / 2; ++i)
      inv_freq[size_t(i)] = float(1.0 / std::pow(500000.0, double(2 * i) / double(head_dim)));
    std::vector<int32_t> positions(tokens);
    std::uniform_int_distribution<int32_t> pos(0, 40000);
    for (auto& p : positions) p = pos(rng);
    positions[0] = 0;
    auto x = random_floats(rng, size_t(tokens * heads * head_dim));
    const auto ref = reference::rope(x, positions, heads, head_dim, inv_freq);
    apply_rope(pool, x.data(), positions.data(), tokens, heads, head_dim, inv_freq.data());
    expect_close(x, ref, 1e-6);
  }
}

TEST(SiluAndMulTest, MatchesReferenceAndMayAlias) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (int64_t n : {1, 17, 4864, 100000}) {
    auto gate = random_floats(rng, size_t(n), -8.0f, 8.0f);
    const auto up = random_floats(rng, size_t(n), -2.0f, 2.0f);
    const auto ref = reference::silu_and_mul(gate, up);
    std::vector<float> out(static_cast<size_t>(n), testing::kNaN);
    silu_and_mul(pool, gate.data(), up.data(), n, out.data());
    expect_close(out, ref, 1e-6);
    silu_and_mul(pool, gate.data(), up.data(), n, gate.data());
    expect_close(gate, ref, 1e-6);
  }
}

// Gates far out, where exp(-g) under- or overflows a float, each element
// against its own magnitude.
TEST(SiluAndMulTest, FarTailsStayFinite) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  auto gate = random_floats(rng, 1001, -200.0f, 200.0f);
  const auto up = random_floats(rng, gate.size(), -2.0f, 2.0f);
  const auto ref = reference::silu_and_mul(gate, up);
  std::vector<float> out(gate.size(), testing::kNaN);
  silu_and_mul(pool, gate.data(), up.data(), int64_t(gate.size()), out.data());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_LE(std::abs(double(out[i]) - ref[i]), 1e-6 * std::max(1.0, std::abs(ref[i])))
        << "gate " << gate[i] << " up " << up[i] << ": got " << out[i] << " want " << ref[i];
  }
}

TEST(AddInPlaceTest, AddsEveryElement) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (int64_t n : {0, 1, 5, 100001}) {
    auto x = random_floats(rng, size_t(n));
    const auto y = random_floats(rng, size_t(n));
    std::vector<double> want(static_cast<size_t>(n));
    for (size_t i = 0; i < want.size(); ++i) want[i] = double(x[i]) + double(y[i]);
    add_in_place(pool, x.data(), y.data(), n);
    if (n > 0) expect_close(x, want, 1e-7);
  }
}

}  // namespace
}  // namespace baton::kernels::cpu
