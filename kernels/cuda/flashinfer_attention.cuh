// kernels/cuda/flashinfer_attention.cuh — the FlashInfer instantiations Baton
// serves (BF16, head_dim 64 and 128, causal softmax attention with an
// optional sliding window), each family in a .cu of its own so they compile
// in parallel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <flashinfer/attention/default_decode_params.cuh>
#include <flashinfer/attention/default_prefill_params.cuh>
#include <flashinfer/attention/scheduler.cuh>
#include <flashinfer/attention/variants.cuh>

namespace baton::kernels::cuda::fi {

using T = __nv_bfloat16;
using Id = int32_t;
// One variant for layers with and without windows: a window_left of -1
// masks nothing, and a second set of instantiations would double the build.
using Variant = flashinfer::DefaultAttention</*custom_mask=*/false, /*sliding_window=*/true,
                                             /*logits_soft_cap=*/false, /*alibi=*/false>;
using DecodeParams = flashinfer::BatchDecodeParams<T, T, T, Id>;
using PrefillParams = flashinfer::BatchPrefillPagedParams<T, T, T, Id>;

// GQA group sizes FlashInfer's decode kernel is built for.
inline bool decode_supports_group(int group) {
  return group == 1 || group == 2 || group == 3 || group == 4 || group == 6 || group == 8 ||
         group == 16;
}

// paged_attention_decode.cu. Both throw flashinfer::Error on what they refuse.
cudaError_t decode_plan(int head_dim, int group, void* float_ws, size_t float_bytes, void* int_ws,
                        void* pinned_ws, size_t int_bytes, flashinfer::DecodePlanInfo& info,
                        Id* page_indptr_h, uint32_t batch, uint32_t num_heads, uint32_t page_size,
                        cudaStream_t stream);
cudaError_t decode_run(int head_dim, DecodeParams& params, T* tmp_v, float* tmp_s,
                       cudaStream_t stream);

// paged_attention_prefill_hd{64,128}.cu: causal, the CTA tile the plan chose.
cudaError_t prefill_run_hd64(uint32_t cta_tile_q, PrefillParams& params, T* tmp_v, float* tmp_s,
                             cudaStream_t stream);
cudaError_t prefill_run_hd128(uint32_t cta_tile_q, PrefillParams& params, T* tmp_v, float* tmp_s,
                              cudaStream_t stream);

}  // namespace baton::kernels::cuda::fi
