#include "common/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

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

// Every tie between two adjacent finite codes below `last` (and the
// negatives) goes to the even code, and the floats just either side of it
// to the nearer code: random floats almost never fall on a tie (a BF16 tie
// is one float in 2^16).
template <typename Half, typename ToFloat, typename FromFloat>
void expect_ties_to_even(uint32_t last, ToFloat to_float, FromFloat from_float) {
  for (uint32_t c = 0; c < last; ++c) {
    const float a = to_float(Half{uint16_t(c)}), b = to_float(Half{uint16_t(c + 1)});
    // Exact (one bit past the code's mantissa); in double, as a + b may
    // pass float's range.
    const auto mid = float(0.5 * (double(a) + double(b)));
    ASSERT_TRUE(a < mid && mid < b) << "code " << c;
    const auto even = uint16_t(c % 2 == 0 ? c : c + 1);
    for (const uint16_t sign : {uint16_t(0), uint16_t(0x8000)}) {
      const float s = sign != 0 ? -1.0f : 1.0f;
      ASSERT_EQ(from_float(s * mid).bits, even | sign) << "the tie after code " << c;
      ASSERT_EQ(from_float(s * std::nextafter(mid, a)).bits, c | sign)
          << "below the tie after " << c;
      ASSERT_EQ(from_float(s * std::nextafter(mid, b)).bits, (c + 1) | sign)
          << "above the tie after " << c;
    }
  }
}

TEST(DType, NamesRoundTrip) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_EQ(parse_dtype(dtype_name(t)), t);
    EXPECT_EQ(parse_safetensors_dtype(dtype_safetensors_name(t)), t);
  }
  EXPECT_FALSE(parse_dtype("f64").has_value());
  EXPECT_FALSE(parse_safetensors_dtype("I8").has_value());
  // The 8-bit formats are KV formats only: never a weight type.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kFP8E4M3})
    EXPECT_EQ(parse_kv_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_kv_dtype("fp8"), DType::kFP8E4M3);
  EXPECT_FALSE(parse_dtype("int8").has_value());
  EXPECT_FALSE(parse_dtype("fp8_e4m3").has_value());
  EXPECT_FALSE(parse_kv_dtype("fp8_e5m2").has_value());
  EXPECT_EQ(dtype_size(DType::kI8), 1u);
  EXPECT_EQ(dtype_size(DType::kFP8E4M3), 1u);
}

// E4M3 as OCP defines it, from its bit fields: bias 7, subnormals at
// exponent 0, 0x7f/0xff NaN and no infinity.
TEST(DType, Fp8E4m3DecodeMatchesLdexp) {
  for (uint32_t code = 0; code < 256; ++code) {
    const uint32_t e = (code >> 3) & 0xf, m = code & 0x7;
    const double sign = (code & 0x80) ? -1.0 : 1.0;
    const float got = fp8_e4m3_to_float(uint8_t(code));
    if (e == 15 && m == 7) {
      EXPECT_TRUE(std::isnan(got)) << code;
      continue;
    }
    const double want = e == 0 ? sign * std::ldexp(double(m), -9)
                               : sign * std::ldexp(1.0 + double(m) / 8.0, int(e) - 7);
    ASSERT_EQ(double(got), want) << "code " << code;
  }
  EXPECT_EQ(fp8_e4m3_to_float(0x7e), 448.0f);
}

// Encoding is the nearest code by exhaustive search (ties to the even
// code), magnitudes past 448 saturate, NaN stays NaN: over random values
// of every binade, and the exact codes and the midpoints between them.
TEST(DType, Fp8E4m3EncodeIsNearestEvenAndSaturates) {
  auto nearest = [](float x) {
    int best = 0;
    double best_err = INFINITY;
    for (int code = 0; code < 0x7f; ++code) {
      const double err = std::fabs(double(fp8_e4m3_to_float(uint8_t(code))) - std::fabs(x));
      if (err < best_err || (err == best_err && (code & 1) == 0)) {
        best_err = err;
        best = code;
      }
    }
    return uint8_t(best | (std::signbit(x) ? 0x80 : 0));
  };
  std::vector<float> xs;
  for (int code = 0; code < 0x7e; ++code) {
    const float a = fp8_e4m3_to_float(uint8_t(code)), b = fp8_e4m3_to_float(uint8_t(code + 1));
    xs.insert(xs.end(),
              {a, -a, 0.5f * (a + b), -0.5f * (a + b), std::nextafter(0.5f * (a + b), b)});
  }
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> mag(-12.0f, 8.9f);
  for (int i = 0; i < 2000; ++i) xs.push_back(std::exp2(mag(rng)) * (rng() & 1 ? 1.0f : -1.0f));
  for (float x : xs) {
    if (std::fabs(x) > 448.0f) continue;
    ASSERT_EQ(float_to_fp8_e4m3(x), nearest(x)) << "x = " << x;
  }
  EXPECT_EQ(float_to_fp8_e4m3(460.0f), 0x7e);
  EXPECT_EQ(float_to_fp8_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_fp8_e4m3(INFINITY), 0x7e);
  EXPECT_TRUE(std::isnan(fp8_e4m3_to_float(float_to_fp8_e4m3(NAN))));
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
  expect_ties_to_even<f16_t>(0x7bff, f16_to_float, float_to_f16);  // subnormals too
  EXPECT_EQ(float_to_f16(65520.0f).bits, 0x7c00);  // the tie past the largest: infinity (even)
  EXPECT_EQ(float_to_f16(std::nextafter(65520.0f, 0.0f)).bits, 0x7bff);
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
  expect_ties_to_even<bf16_t>(0x7f7f, bf16_to_float, float_to_bf16);  // subnormals too
  // The tie past the largest finite BF16 goes to infinity (even), as
  // PyTorch rounds; just below it, to the largest.
  const float past_largest = bits_to_float(0x7f7f8000u);
  EXPECT_EQ(float_to_bf16(past_largest).bits, 0x7f80);
  EXPECT_EQ(float_to_bf16(-past_largest).bits, 0xff80);
  EXPECT_EQ(float_to_bf16(std::nextafter(past_largest, 0.0f)).bits, 0x7f7f);
  EXPECT_EQ(float_to_bf16(INFINITY).bits, 0x7f80);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(-NAN))));
  // A NaN whose payload sits only in the low bits stays a NaN, not infinity.
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(bits_to_float(0x7f800001u)))));
}

TEST(DType, LoadStoreEveryType) {
  float buffer[4] = {};
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kI8, DType::kFP8E4M3}) {
    store_from_float(buffer, t, 3, 1.5f);
    // int8 codes round to nearest even.
    EXPECT_EQ(load_as_float(buffer, t, 3), t == DType::kI8 ? 2.0f : 1.5f) << dtype_name(t);
  }
  // int8 codes saturate symmetrically: -128 is never written.
  store_from_float(buffer, DType::kI8, 0, -300.0f);
  EXPECT_EQ(load_as_float(buffer, DType::kI8, 0), -127.0f);
  store_from_float(buffer, DType::kI8, 0, 2.5f);
  EXPECT_EQ(load_as_float(buffer, DType::kI8, 0), 2.0f);
}

}  // namespace
}  // namespace baton
