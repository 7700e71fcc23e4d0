#include "kernels/cpu/convert.h"

#include <cstring>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::kernels::cpu {
namespace {

#if BATON_HAVE_X86
BATON_AVX2 void convert_half_avx2(const uint16_t* src, bool is_bf16, int64_t n, float* dst) {
  int64_t i = 0;
  if (is_bf16) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, avx2::load8_bf16(src + i));
    for (; i < n; ++i) dst[i] = bf16_to_float(bf16_t{src[i]});
  } else {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, avx2::load8_f16(src + i));
    for (; i < n; ++i) dst[i] = f16_to_float(f16_t{src[i]});
  }
}
#endif

}  // namespace

const std::array<float, 256>& e4m3_values() {
  static const std::array<float, 256> values = [] {
    std::array<float, 256> v{};
    for (int code = 0; code < 256; ++code) v[size_t(code)] = fp8_e4m3_to_float(uint8_t(code));
    return v;
  }();
  return values;
}

void convert_to_f32(const void* src, DType type, int64_t n, float* dst) {
  if (n <= 0) return;
  if (type == DType::kF32) {
    std::memcpy(dst, src, size_t(n) * sizeof(float));
    return;
  }
#if BATON_HAVE_X86
  if (use_avx2() && (type == DType::kF16 || type == DType::kBF16)) {
    convert_half_avx2(static_cast<const uint16_t*>(src), type == DType::kBF16, n, dst);
    return;
  }
#endif
  for (int64_t i = 0; i < n; ++i) dst[i] = load_as_float(src, type, size_t(i));
}

}  // namespace baton::kernels::cpu
