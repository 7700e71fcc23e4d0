// kernels/cuda/gemm.h — dense layers on the device through cuBLASLt:
// out[m, n] = x[m, k] · w[n, k]ᵀ (+ bias[n]), half-precision inputs, F32
// accumulation, output in the input dtype or F32 (logits).
//
// Plain C++ (no CUDA headers). Each shape's algorithm is asked of cuBLASLt's
// heuristic once and kept, so a warm engine only launches.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/dtype.h"
#include "common/status.h"

namespace baton::kernels::cuda {

struct GemmArgs {
  const void* x = nullptr;     // [m, k] row-major, `dtype`
  const void* w = nullptr;     // [n, k] row-major, `dtype` (a Hugging Face Linear weight)
  const void* bias = nullptr;  // [n], `dtype`, or null; only with out_dtype == dtype
  void* out = nullptr;         // [m, n] row-major, `out_dtype`
  int64_t m = 0, n = 0, k = 0;
  DType dtype = DType::kBF16;      // BF16 or F16
  DType out_dtype = DType::kBF16;  // `dtype` or F32
  float alpha = 1.0f;              // out = alpha · x·wᵀ (+ bias, not scaled)
};

class Gemm {
 public:
  // A cuBLASLt handle on the current device, with `workspace_bytes` of
  // device workspace for its kernels.
  static Result<std::unique_ptr<Gemm>> create(size_t workspace_bytes = size_t(32) << 20);
  virtual ~Gemm() = default;
  // Launches on `stream` (a cudaStream_t). m == 0 does nothing.
  virtual Status run(const GemmArgs& args, void* stream) = 0;
};

}  // namespace baton::kernels::cuda
