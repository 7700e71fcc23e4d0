// engine/cuda_forward.h — the CUDA backend: the forward pass on one device,
// built only where nvcc and FlashInfer's headers were found.
//
// Weights are uploaded once as BF16 (F32 and F16 checkpoints converted), with
// q/k/v and gate/up each concatenated into one matrix so a layer runs four
// cuBLASLt GEMMs. Activations are BF16, the residual stream included (as
// transformers runs a BF16 model); norms are taken in F32 (FlashInfer's
// fused add-and-norm), logits come out of the lm_head GEMM as F32. The KV
// pool is BF16 in device memory, token-major (FlashInfer's paged layout).
// One stream; every step's inputs are staged in pinned memory and uploaded
// with one copy; buffers grow to the largest step and are then reused.
#pragma once

#include <memory>

#include "common/status.h"
#include "engine/checkpoint.h"
#include "engine/forward_backend.h"

namespace baton::engine {

// The backend of CUDA device `index`. A device the machine does not have is
// InvalidArgument naming it; a model the kernels do not serve (head_dim
// other than 64 or 128, hidden or FFN sizes not multiples of 8) is
// Unimplemented naming the field.
Result<std::unique_ptr<ForwardBackend>> make_cuda_forward(int32_t index,
                                                          const Checkpoint& checkpoint);

}  // namespace baton::engine
