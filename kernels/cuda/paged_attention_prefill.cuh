// kernels/cuda/paged_attention_prefill.cuh — causal paged prefill for one
// head_dim, every CTA tile FlashInfer's plan may choose (16, 64, 128 below
// head_dim 256); each head_dim is instantiated in a .cu of its own.
#pragma once

#include <flashinfer/attention/prefill.cuh>

#include "kernels/cuda/flashinfer_attention.cuh"

namespace baton::kernels::cuda::fi {

template <uint32_t HEAD_DIM, uint32_t CTA_TILE_Q>
cudaError_t prefill_run_tile(PrefillParams& params, T* tmp_v, float* tmp_s, cudaStream_t stream) {
  return flashinfer::BatchPrefillWithPagedKVCacheDispatched<
      /*SAME_KV_STRIDES=*/true, CTA_TILE_Q, HEAD_DIM, HEAD_DIM, flashinfer::PosEncodingMode::kNone,
      /*USE_FP16_QK_REDUCTION=*/false, flashinfer::MaskMode::kCausal, Variant, PrefillParams>(
      params, tmp_v, tmp_s, /*enable_pdl=*/false, stream);
}

template <uint32_t HEAD_DIM>
cudaError_t prefill_run(uint32_t cta_tile_q, PrefillParams& params, T* tmp_v, float* tmp_s,
                        cudaStream_t stream) {
  switch (cta_tile_q) {
    case 16:
      return prefill_run_tile<HEAD_DIM, 16>(params, tmp_v, tmp_s, stream);
    case 64:
      return prefill_run_tile<HEAD_DIM, 64>(params, tmp_v, tmp_s, stream);
    case 128:
      return prefill_run_tile<HEAD_DIM, 128>(params, tmp_v, tmp_s, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace baton::kernels::cuda::fi
