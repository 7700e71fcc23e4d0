// common/dtype.h — element types of weights and KV caches, and the scalar
// conversions between them. Vectorised conversions live in kernels/.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include "common/host_device.h"

namespace baton {

// kI8 and kFP8E4M3 are KV cache formats only: 8-bit codes that mean
// something only with the scale stored beside them (common/kv_layout.h).
// Weights and activations are F32, F16 or BF16.
enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kFP8E4M3 };
inline constexpr DType kLastDType = DType::kFP8E4M3;

BATON_HOST_DEVICE constexpr size_t dtype_size(DType t) {
  return t == DType::kF32 ? 4 : (t == DType::kF16 || t == DType::kBF16) ? 2 : 1;
}
// True for the 8-bit KV formats, whose elements are codes times a scale.
BATON_HOST_DEVICE constexpr bool is_quantized(DType t) {
  return t == DType::kI8 || t == DType::kFP8E4M3;
}
// The largest magnitude a code of a quantized format holds: a row's scale
// maps its largest element onto it.
BATON_HOST_DEVICE constexpr float quantized_max(DType t) {
  return t == DType::kI8 ? 127.0f : 448.0f;
}

// Lower-case names as Baton's CLI and configs spell them: "f32", "f16",
// "bf16", "int8", "fp8_e4m3".
std::string_view dtype_name(DType t);
// A weight or activation type: f32, f16 or bf16 (and their long names).
std::optional<DType> parse_dtype(std::string_view name);
// A KV cache format: those of parse_dtype, int8 and fp8_e4m3 (or fp8).
std::optional<DType> parse_kv_dtype(std::string_view name);
// Safetensors spells them "F32", "F16", "BF16".
std::string_view dtype_safetensors_name(DType t);
std::optional<DType> parse_safetensors_dtype(std::string_view name);

// Raw 16-bit storage types, so the compiler never converts them implicitly.
struct bf16_t {
  uint16_t bits;
};
struct f16_t {
  uint16_t bits;
};

inline float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  return bits;
}

inline float bf16_to_float(bf16_t v) { return bits_to_float(uint32_t(v.bits) << 16); }

// Round to nearest even, as PyTorch does; NaN stays NaN.
inline bf16_t float_to_bf16(float f) {
  uint32_t bits = float_to_bits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_t{uint16_t((bits >> 16) | 0x40)};
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return bf16_t{uint16_t((bits + rounding) >> 16)};
}

// IEEE half <-> float, exact for every half value including subnormals.
inline float f16_to_float(f16_t v) {
  uint32_t sign = uint32_t(v.bits & 0x8000u) << 16;
  uint32_t exponent = (v.bits >> 10) & 0x1fu;
  uint32_t mantissa = v.bits & 0x3ffu;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      bits = sign | uint32_t(127 - 15 - e) << 23 | (mantissa & 0x3ffu) << 13;
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | mantissa << 13;
  } else {
    bits = sign | (exponent + 127 - 15) << 23 | mantissa << 13;
  }
  return bits_to_float(bits);
}

// Round to nearest even; overflow goes to infinity.
inline f16_t float_to_f16(float f) {
  uint32_t bits = float_to_bits(f);
  uint16_t sign = uint16_t((bits >> 16) & 0x8000u);
  uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return f16_t{uint16_t(sign | 0x7e00u)};   // NaN
  if (abs_bits >= 0x477ff000u) return f16_t{uint16_t(sign | 0x7c00u)};  // rounds to inf
  if (abs_bits < 0x38800000u) {  // result is subnormal or zero
    // Add 0.5 (as a float) so the FPU does the round-to-nearest-even for us.
    float shifted = bits_to_float(abs_bits) + 0.5f;
    return f16_t{uint16_t(sign | (float_to_bits(shifted) - 0x3f000000u))};
  }
  uint32_t mantissa_odd = (abs_bits >> 13) & 1u;
  abs_bits += 0xc8000fffu + mantissa_odd;  // rebias exponent and round
  return f16_t{uint16_t(sign | (abs_bits >> 13))};
}

// OCP FP8 E4M3 ("e4m3fn": no infinities, 0x7f and 0xff are NaN), the code
// of torch.float8_e4m3fn: bias 7, largest magnitude 448, subnormals 2^-9 apart.
inline float fp8_e4m3_to_float(uint8_t code) {
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t exponent = (code >> 3) & 0xfu;
  const uint32_t mantissa = code & 0x7u;
  if (exponent == 0xfu && mantissa == 0x7u) return bits_to_float(sign | 0x7fc00000u);
  if (exponent == 0) {  // zero or subnormal: mantissa x 2^-9, exact in float
    return bits_to_float(sign | float_to_bits(float(mantissa) * (1.0f / 512.0f)));
  }
  return bits_to_float(sign | (exponent + 127 - 7) << 23 | mantissa << 20);
}

// Round to nearest even; magnitudes past 448 saturate to 448 (a scaled KV
// row never exceeds it; saturation keeps rounding error out of NaN); NaN
// stays NaN.
inline uint8_t float_to_fp8_e4m3(float f) {
  const uint32_t bits = float_to_bits(f);
  const uint8_t sign = uint8_t((bits >> 24) & 0x80u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return uint8_t(sign | 0x7fu);
  if (abs_bits >= 0x43e00000u) return uint8_t(sign | 0x7eu);  // >= 448
  if (abs_bits < 0x3c800000u) {  // below 2^-6: a subnormal step of 2^-9
    // Adding 2^14, whose mantissa steps are 2^-9, leaves the rounded step
    // count in the low mantissa bits: the FPU rounds to nearest even for us.
    const float shifted = bits_to_float(abs_bits) + 16384.0f;
    return uint8_t(sign | (float_to_bits(shifted) - 0x46800000u));
  }
  // Rebias the exponent (127 -> 7) and round the mantissa to 3 bits; a carry
  // moves into the exponent, as it should.
  uint32_t code = ((abs_bits >> 23) - 120) << 3 | ((abs_bits >> 20) & 0x7u);
  const uint32_t rest = abs_bits & 0xfffffu;
  if (rest > 0x80000u || (rest == 0x80000u && (code & 1u))) ++code;
  return uint8_t(sign | std::min<uint32_t>(code, 0x7eu));
}

// Reads element `i` of a buffer of type `t` as float. A quantized format
// reads the code alone, without its scale.
inline float load_as_float(const void* data, DType t, size_t i) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[i];
    case DType::kF16:
      return f16_to_float(static_cast<const f16_t*>(data)[i]);
    case DType::kBF16:
      return bf16_to_float(static_cast<const bf16_t*>(data)[i]);
    case DType::kI8:
      return float(static_cast<const int8_t*>(data)[i]);
    case DType::kFP8E4M3:
      return fp8_e4m3_to_float(static_cast<const uint8_t*>(data)[i]);
  }
  return 0.0f;
}

// Writes `value` as element `i` of a buffer of type `t`.
inline void store_from_float(void* data, DType t, size_t i, float value) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[i] = value;
      break;
    case DType::kF16:
      static_cast<f16_t*>(data)[i] = float_to_f16(value);
      break;
    case DType::kBF16:
      static_cast<bf16_t*>(data)[i] = float_to_bf16(value);
      break;
    case DType::kI8:  // value: an already scaled code; NaN stores 0
      static_cast<int8_t*>(data)[i] =
          std::isnan(value) ? int8_t(0)
                            : int8_t(std::clamp(std::nearbyint(value), -127.0f, 127.0f));
      break;
    case DType::kFP8E4M3:
      static_cast<uint8_t*>(data)[i] = float_to_fp8_e4m3(value);
      break;
  }
}

}  // namespace baton
