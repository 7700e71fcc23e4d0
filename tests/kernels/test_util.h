// tests/kernels/test_util.h — seeding, random fills and dtype round trips
// shared by the kernel tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"

namespace baton::kernels::testing {

// A fresh seed per run (printed by the tests through SCOPED_TRACE) so every
// run explores new inputs and a failure can be replayed.
inline uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

inline std::vector<float> random_floats(std::mt19937_64& rng, size_t n, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Encodes floats as `type` (raw bytes) the way a checkpoint would hold them.
inline std::vector<uint8_t> encode(const std::vector<float>& values, DType type) {
  std::vector<uint8_t> bytes(values.size() * dtype_size(type));
  for (size_t i = 0; i < values.size(); ++i) store_from_float(bytes.data(), type, i, values[i]);
  return bytes;
}

// The value `type` actually stores for x.
inline double round_trip(float x, DType type) {
  float buf[1];
  store_from_float(buf, type, 0, x);
  return load_as_float(buf, type, 0);
}

// The values a KV pool of `type` holds for `values`, rows of `row` elements
// (one token's K or V of one KV head). A quantized row holds codes of
// value x (qmax / max|row|) and the scale max|row| / qmax, as the kernels'
// contract says (kernels/cpu/attention.h); this recomputes it apart from
// them, in float like them, and dequantizes in double.
inline std::vector<double> stored_rows(const std::vector<float>& values, int32_t row, DType type) {
  std::vector<double> out(values.size());
  for (size_t r = 0; r < values.size(); r += size_t(row)) {
    float amax = 0.0f;
    for (int32_t c = 0; c < row; ++c) amax = std::max(amax, std::fabs(values[r + size_t(c)]));
    const bool quantized = is_quantized(type);
    const float qmax = quantized_max(type);
    float scale = !quantized ? 1.0f : amax > 0.0f ? amax / qmax : 0.0f;
    float inverse = !quantized ? 1.0f : amax > 0.0f ? qmax / amax : 0.0f;
    if (!std::isfinite(inverse)) scale = inverse = 0.0f;  // too small: a zero row
    for (int32_t c = 0; c < row; ++c)
      out[r + size_t(c)] = round_trip(values[r + size_t(c)] * inverse, type) * double(scale);
  }
  return out;
}

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

}  // namespace baton::kernels::testing
