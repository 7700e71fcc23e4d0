// kernels/cpu/convert.h — bulk F16/BF16/F32 -> F32 conversion (AVX2 when the
// CPU has it). Used for weight tiles fed to sgemm, embedding rows and KV tiles.
#pragma once

#include <array>
#include <cstdint>

#include "common/dtype.h"

namespace baton::kernels::cpu {

// dst[i] = src[i] as float, for i < n. src holds n elements of type `type`
// (of a quantized format: the codes, unscaled).
void convert_to_f32(const void* src, DType type, int64_t n, float* dst);

// Every E4M3 code's value (fp8_e4m3_to_float), by code.
const std::array<float, 256>& e4m3_values();

}  // namespace baton::kernels::cpu
