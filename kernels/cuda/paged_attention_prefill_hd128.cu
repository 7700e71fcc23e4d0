#include "kernels/cuda/paged_attention_prefill.cuh"

namespace baton::kernels::cuda::fi {

cudaError_t prefill_run_hd128(uint32_t cta_tile_q, PrefillParams& params, T* tmp_v, float* tmp_s,
                              cudaStream_t stream) {
  return prefill_run<128>(cta_tile_q, params, tmp_v, tmp_s, stream);
}

}  // namespace baton::kernels::cuda::fi
