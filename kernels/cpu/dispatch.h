// kernels/cpu/dispatch.h — from run-time values to the template arguments
// the SIMD kernels are instantiated for: a KV or weight dtype, and how many
// query vectors one call serves.
#pragma once

#include <cstdint>
#include <utility>

#include "common/check.h"
#include "common/dtype.h"

namespace baton::kernels::cpu {

// Calls f.template operator()<T>() for the dtype t.
template <typename F>
void with_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kF32:
      return f.template operator()<DType::kF32>();
    case DType::kF16:
      return f.template operator()<DType::kF16>();
    case DType::kBF16:
      return f.template operator()<DType::kBF16>();
    case DType::kI8:
    case DType::kFP8E4M3:
      break;
  }
  // The 8-bit KV formats are dequantized with their scales before any
  // kernel that dispatches here (attention.cc's load_tile).
  BATON_CHECK(!"with_dtype: no kernel reads quantized codes");
}

// with_dtype, and the 8-bit KV formats too: for the kernels that read
// their codes (the scales are the caller's to apply).
template <typename F>
void with_kv_dtype(DType t, F&& f) {
  switch (t) {
    case DType::kI8:
      return f.template operator()<DType::kI8>();
    case DType::kFP8E4M3:
      return f.template operator()<DType::kFP8E4M3>();
    default:
      return with_dtype(t, std::forward<F>(f));
  }
}

// Calls f.template operator()<R>() for R = n, 1..kMax (kMax at most 4);
// n outside that range is taken as 1.
template <int kMax, typename F>
void with_queries(int32_t n, F&& f) {
  static_assert(kMax >= 1 && kMax <= 4);
  if constexpr (kMax >= 4)
    if (n == 4) return f.template operator()<4>();
  if constexpr (kMax >= 3)
    if (n == 3) return f.template operator()<3>();
  if constexpr (kMax >= 2)
    if (n == 2) return f.template operator()<2>();
  return f.template operator()<1>();
}

}  // namespace baton::kernels::cpu
