#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace baton {
namespace {

// Independent reference: the nearest representable value by exhaustive search
// over all 65536 half bit patterns (ties to even mantissa).
template <typename Half, typename ToFloat>
uint16_t nearest_by_search(float x, ToFloat to_float) {
  uint16_t best = 0;
  double best_err = INFINITY;
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    float v = to_float(Half{uint16_t(bits)});
    if (std::isnan(v)) continue;
    double err = std::fabs(double(v) - double(x));
    if (err < best_err || (err == best_err && (bits & 1) == 0 && (best & 1) == 1)) {
      best_err = err;
      best = uint16_t(bits);
    }
  }
  return best;
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_safetensors_dtype(dtype_safetensors_name(t)), t);
  }
  EXPECT_FALSE(parse_dtype("f64").has_value());
  EXPECT_FALSE(parse_safetensors_dtype("I8").has_value());
}

TEST(DType, F16DecodeMatchesLdexp) {
  for (uint32_t bits = 0; bits < 65536; ++bits) {
    uint32_t e = (bits >> 10) & 0x1f, m = bits & 0x3ff;
    double sign = (bits & 0x8000) ? -1.0 : 1.0;
    float got = f16_to_float(f16_t{uint16_t(bits)});
    if (e == 31) {
      EXPECT_TRUE(m ? std::isnan(got) : std::isinf(got)) << bits;
      continue;
    }
    double want = e == 0 ? sign * std::ldexp(double(m), -24)
                         : sign * std::ldexp(1.0 + double(m) / 1024.0, int(e) - 15);
    ASSERT_EQ(double(got), want) << "bits " << bits;
  }
}

TEST(DType, F16EncodeIsNearestEven) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> mag(-18.0f, 16.5f);
  for (int i = 0; i < 300; ++i) {
    float x = std::exp2(mag(rng)) * (rng() & 1 ? 1.0f : -1.0f);
    if (std::fabs(x) >= 65520.0f) continue;  // rounds to infinity, checked below
    uint16_t want = nearest_by_search<f16_t>(x, f16_to_float);
    ASSERT_EQ(float_to_f16(x).bits, want) << "x = " << x;
  }
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);
  EXPECT_EQ(float_to_f16(-1e6f).bits, 0xfc00);
  EXPECT_TRUE(std::isnan(f16_to_float(float_to_f16(NAN))));
}

TEST(DType, Bf16EncodeIsNearestEven) {
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> mag(-30.0f, 30.0f);
  for (int i = 0; i < 300; ++i) {
    float x = std::exp2(mag(rng)) * (rng() & 1 ? 1.0f : -1.0f);
    uint16_t want = nearest_by_search<bf16_t>(x, bf16_to_float);
    ASSERT_EQ(float_to_bf16(x).bits, want) << "x = " << x;
  }
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(DType, LoadStoreEveryType) {
  float buffer[4] = {};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    store_from_float(buffer, t, 3, 1.5f);
    EXPECT_EQ(load_as_float(buffer, t, 3), 1.5f) << dtype_name(t);
  }
}

}  // namespace
}  // namespace baton
