#include <flashinfer/attention/decode.cuh>

#include "kernels/cuda/flashinfer_attention.cuh"

namespace baton::kernels::cuda::fi {
namespace {

constexpr auto kNoRope = flashinfer::PosEncodingMode::kNone;

template <uint32_t GROUP, uint32_t HEAD_DIM>
cudaError_t plan_for(void* float_ws, size_t float_bytes, void* int_ws, void* pinned_ws,
                     size_t int_bytes, flashinfer::DecodePlanInfo& info, Id* page_indptr_h,
                     uint32_t batch, uint32_t num_heads, uint32_t page_size, cudaStream_t stream) {
  auto estimate =
      flashinfer::BatchDecodeWithPagedKVCacheWorkEstimationDispatched<GROUP, HEAD_DIM, kNoRope,
                                                                      Variant, DecodeParams>;
  return flashinfer::DecodePlan<HEAD_DIM, kNoRope, Variant, DecodeParams>(
      float_ws, float_bytes, int_ws, pinned_ws, int_bytes, info, page_indptr_h, batch, num_heads,
      page_size, /*enable_cuda_graph=*/false, stream, estimate);
}

template <uint32_t HEAD_DIM>
cudaError_t plan_for_head_dim(int group, void* float_ws, size_t float_bytes, void* int_ws,
                              void* pinned_ws, size_t int_bytes, flashinfer::DecodePlanInfo& info,
                              Id* page_indptr_h, uint32_t batch, uint32_t num_heads,
                              uint32_t page_size, cudaStream_t stream) {
  cudaError_t status = cudaErrorInvalidValue;
  DISPATCH_GQA_GROUP_SIZE(group, GROUP, {
    status = plan_for<GROUP, HEAD_DIM>(float_ws, float_bytes, int_ws, pinned_ws, int_bytes, info,
                                       page_indptr_h, batch, num_heads, page_size, stream);
  });
  return status;
}

}  // namespace

cudaError_t decode_plan(int head_dim, int group, void* float_ws, size_t float_bytes, void* int_ws,
                        void* pinned_ws, size_t int_bytes, flashinfer::DecodePlanInfo& info,
                        Id* page_indptr_h, uint32_t batch, uint32_t num_heads, uint32_t page_size,
                        cudaStream_t stream) {
  if (head_dim == 64) {
    return plan_for_head_dim<64>(group, float_ws, float_bytes, int_ws, pinned_ws, int_bytes, info,
                                 page_indptr_h, batch, num_heads, page_size, stream);
  }
  if (head_dim == 128) {
    return plan_for_head_dim<128>(group, float_ws, float_bytes, int_ws, pinned_ws, int_bytes, info,
                                  page_indptr_h, batch, num_heads, page_size, stream);
  }
  return cudaErrorInvalidValue;
}

cudaError_t decode_run(int head_dim, DecodeParams& params, T* tmp_v, float* tmp_s,
                       cudaStream_t stream) {
  if (head_dim == 64) {
    return flashinfer::BatchDecodeWithPagedKVCacheDispatched<64, kNoRope, Variant>(
        params, tmp_v, tmp_s, /*enable_pdl=*/false, stream);
  }
  if (head_dim == 128) {
    return flashinfer::BatchDecodeWithPagedKVCacheDispatched<128, kNoRope, Variant>(
        params, tmp_v, tmp_s, /*enable_pdl=*/false, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace baton::kernels::cuda::fi
