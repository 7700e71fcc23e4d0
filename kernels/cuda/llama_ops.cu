#include "kernels/cuda/llama_ops.h"

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <flashinfer/activation.cuh>
#include <flashinfer/norm.cuh>
#include <flashinfer/pos_enc.cuh>
#include <string>

#include "kernels/cuda/cuda_status.h"

namespace baton::kernels::cuda {
namespace {

using bf16 = __nv_bfloat16;

__device__ __forceinline__ float silu(const float& v) { return v / (1.0f + __expf(-v)); }

// One block per output row; 16-byte copies where the row allows them.
__global__ void gather_rows_kernel(const bf16* __restrict__ table, int64_t cols,
                                   const int32_t* __restrict__ rows, bf16* __restrict__ out) {
  const int64_t i = blockIdx.x;
  const bf16* src = table + int64_t(rows[i]) * cols;
  bf16* dst = out + i * cols;
  if (cols % 8 == 0) {
    const auto* s = reinterpret_cast<const uint4*>(src);
    auto* d = reinterpret_cast<uint4*>(dst);
    for (int64_t c = threadIdx.x; c < cols / 8; c += blockDim.x) d[c] = s[c];
  } else {
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c];
  }
}

__global__ void scale_kernel(bf16* __restrict__ x, int64_t n, float factor) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    x[i] = __float2bfloat16_rn(__bfloat162float(x[i]) * factor);
  }
}

__global__ void f32_to_bf16_kernel(const float* __restrict__ src, int64_t n,
                                   bf16* __restrict__ dst) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

Status checked(cudaError_t launched, const char* what) {
  if (launched != cudaSuccess) return cuda_status(launched, what, __FILE__, __LINE__);
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status gather_rows_bf16(const void* table, int64_t cols, const int32_t* rows, int64_t n, void* out,
                        void* stream) {
  if (n == 0) return Status::ok();
  gather_rows_kernel<<<unsigned(n), 128, 0, static_cast<cudaStream_t>(stream)>>>(
      static_cast<const bf16*>(table), cols, rows, static_cast<bf16*>(out));
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

Status rms_norm_bf16(const void* x, const void* weight, int64_t rows, int64_t dim, float eps,
                     void* out, void* stream) {
  if (rows == 0) return Status::ok();
  if (dim % 8 != 0) return invalid_argument("CUDA RMSNorm needs a dim that is a multiple of 8");
  return checked(flashinfer::norm::RMSNorm<bf16>(
                     const_cast<bf16*>(static_cast<const bf16*>(x)),
                     const_cast<bf16*>(static_cast<const bf16*>(weight)), static_cast<bf16*>(out),
                     uint32_t(rows), uint32_t(dim), uint32_t(dim), uint32_t(dim), eps,
                     /*enable_pdl=*/false, static_cast<cudaStream_t>(stream)),
                 "flashinfer::norm::RMSNorm");
}

Status add_rms_norm_bf16(void* x, void* residual, const void* weight, int64_t rows, int64_t dim,
                         float eps, void* stream) {
  if (rows == 0) return Status::ok();
  if (dim % 8 != 0) return invalid_argument("CUDA RMSNorm needs a dim that is a multiple of 8");
  return checked(flashinfer::norm::FusedAddRMSNorm<bf16>(
                     static_cast<bf16*>(x), static_cast<bf16*>(residual),
                     const_cast<bf16*>(static_cast<const bf16*>(weight)), uint32_t(rows),
                     uint32_t(dim), uint32_t(dim), uint32_t(dim), eps, /*enable_pdl=*/false,
                     static_cast<cudaStream_t>(stream)),
                 "flashinfer::norm::FusedAddRMSNorm");
}

Status head_rms_norm_bf16(void* x, const void* weight, int64_t tokens, int32_t heads,
                          int32_t head_dim, int64_t token_stride, float eps, void* stream) {
  if (tokens == 0) return Status::ok();
  if (head_dim % 8 != 0) {
    return invalid_argument("CUDA head RMSNorm needs a head_dim that is a multiple of 8");
  }
  // In place, though QKRMSNorm declares input and output __restrict__: each
  // thread reads an element before it writes that same element, and no
  // thread reads another's.
  auto* data = static_cast<bf16*>(x);
  return checked(flashinfer::norm::QKRMSNorm<bf16>(
                     data, const_cast<bf16*>(static_cast<const bf16*>(weight)), data,
                     uint32_t(tokens), uint32_t(heads), uint32_t(head_dim), uint32_t(token_stride),
                     uint32_t(head_dim), uint32_t(token_stride), uint32_t(head_dim), eps,
                     /*enable_pdl=*/false, static_cast<cudaStream_t>(stream)),
                 "flashinfer::norm::QKRMSNorm");
}

Status rope_bf16(const RopeArgs& a, void* stream) {
  if (a.tokens == 0) return Status::ok();
  if (a.head_dim != 64 && a.head_dim != 128) {
    return invalid_argument("CUDA rotary embedding supports head_dim 64 and 128, not " +
                            std::to_string(a.head_dim));
  }
  auto* q = const_cast<bf16*>(static_cast<const bf16*>(a.q));
  auto* k = static_cast<bf16*>(a.k);
  const size_t d = size_t(a.head_dim);
  return checked(
      flashinfer::BatchQKApplyRotaryPosIdsCosSinCache<bf16, int32_t>(
          q, k, static_cast<bf16*>(a.q_out), k, const_cast<float*>(a.cos_sin),
          const_cast<int32_t*>(a.positions), uint32_t(a.tokens), uint32_t(a.num_heads),
          uint32_t(a.num_kv_heads), uint32_t(a.head_dim), uint32_t(a.head_dim), size_t(a.q_stride),
          d, size_t(a.k_stride), d, size_t(a.num_heads) * d, d, size_t(a.k_stride), d,
          /*interleave=*/false, static_cast<cudaStream_t>(stream)),
      "flashinfer::BatchQKApplyRotaryPosIdsCosSinCache");
}

Status silu_and_mul_bf16(const void* gate_up, int64_t tokens, int64_t d, void* out, void* stream) {
  if (tokens == 0) return Status::ok();
  // The kernel has no tail loop: 8 (16 bytes) must divide d.
  if (d % 8 != 0) return invalid_argument("CUDA SiLU-and-mul needs d a multiple of 8");
  constexpr uint32_t kVec = 8;
  const unsigned threads = unsigned(std::min<int64_t>(d / kVec, 256));
  flashinfer::activation::act_and_mul_kernel<bf16, silu, kVec>
      <<<unsigned(tokens), threads, 0, static_cast<cudaStream_t>(stream)>>>(
          static_cast<bf16*>(out), static_cast<const bf16*>(gate_up), int(d));
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

Status scale_bf16(void* x, int64_t n, float factor, void* stream) {
  if (n == 0) return Status::ok();
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 4096));
  scale_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(static_cast<bf16*>(x), n,
                                                                      factor);
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

Status f32_to_bf16(const float* src, int64_t n, void* dst, void* stream) {
  if (n == 0) return Status::ok();
  const unsigned blocks = unsigned(std::min<int64_t>((n + 255) / 256, 4096));
  f32_to_bf16_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
      src, n, static_cast<bf16*>(dst));
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace baton::kernels::cuda
