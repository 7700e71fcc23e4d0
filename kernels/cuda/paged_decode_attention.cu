// kernels/cuda/paged_decode_attention.cu — GQA decode attention over the
// paged KV pool (common/kv_layout.h), one query row per sequence.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <string>
#include <type_traits>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"

namespace baton::kernels::cuda {
namespace {

constexpr int kWarpSize = 32;
constexpr int kWarps = 4;
constexpr int kMaxGroup = 8;          // query heads per KV head
constexpr int32_t kMaxGridY = 65535;  // sequences: the grid's y extent

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The DType a kernel instance reads.
template <typename KvT>
constexpr DType kDTypeOf = std::is_same_v<KvT, float>    ? DType::kF32
                           : std::is_same_v<KvT, __half> ? DType::kF16
                                                         : DType::kBF16;

// Grid: (num_kv_heads, num_seqs). Block: kWarps warps.
// Each block owns one (sequence, KV head) and every query head of its GQA
// group, so each K and V vector is read from memory once for the whole group.
// Warps stride over the context 32 keys at a time. For the scores a lane owns
// one key: K tiles keep the keys of a block side by side (kv_layout.h), so
// the warp's loads of one dimension group are adjacent words. For V a lane
// owns HEAD_DIM / 32 consecutive dimensions of each key's row, the keys'
// probabilities passed along the warp. Every warp keeps an online softmax
// (running max, sum, weighted V) per query head, updated once per 32 keys;
// the warps' partial results are merged through shared memory at the end.
template <typename KvT, int HEAD_DIM>
__global__ void __launch_bounds__(kWarps* kWarpSize)
    paged_decode_attention_kernel(PagedAttentionParams p) {
  constexpr int kPerLane = HEAD_DIM / kWarpSize;
  constexpr int G = key_group_of(kDTypeOf<KvT>);  // elements of a key side by side
  const int kv_head = blockIdx.x;
  const int seq = blockIdx.y;
  const int warp = threadIdx.x / kWarpSize;
  const int lane = threadIdx.x % kWarpSize;
  const int group = p.num_heads / p.layout.num_kv_heads;
  const int first_head = kv_head * group;
  const int context = p.context_lens[seq];
  const int block_size = p.layout.block_size;
  const size_t k_stride = p.layout.key_group_stride();
  const int32_t* table = p.block_tables + size_t(seq) * p.block_table_stride;
  const KvT* pool = static_cast<const KvT*>(p.kv_pool);

  __shared__ float q_shared[kMaxGroup][HEAD_DIM];  // pre-scaled queries of the group
  __shared__ float m_shared[kWarps][kMaxGroup];
  __shared__ float l_shared[kWarps][kMaxGroup];
  __shared__ float acc_shared[kWarps][kMaxGroup][HEAD_DIM];

  for (int i = threadIdx.x; i < group * HEAD_DIM; i += blockDim.x) {
    int g = i / HEAD_DIM, d = i % HEAD_DIM;
    q_shared[g][d] = static_cast<const float*>(
                         p.q)[(size_t(seq) * p.num_heads + first_head + g) * HEAD_DIM + d] *
                     p.scale;
  }
  __syncthreads();

  float m[kMaxGroup], l[kMaxGroup], acc[kMaxGroup][kPerLane];
#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    m[g] = -INFINITY;
    l[g] = 0.0f;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc[g][i] = 0.0f;
  }

  for (int base = warp * kWarpSize; base < context; base += kWarps * kWarpSize) {
    // Scores: this lane's key t against every query head of the group.
    const int t = base + lane;
    const bool valid = t < context;
    float score[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) score[g] = 0.0f;
    if (valid) {
      const size_t k_offset =
          p.layout.key_offset(p.layer, table[t / block_size], kv_head, t % block_size, 0);
#pragma unroll 4
      for (int c = 0; c < HEAD_DIM; c += G) {
        float k[G];
#pragma unroll
        for (int e = 0; e < G; ++e)
          k[e] = to_float(pool[k_offset + KvLayout::key_dim_offset(c + e, G, k_stride)]);
#pragma unroll
        for (int g = 0; g < kMaxGroup; ++g) {
          if (g >= group) break;
#pragma unroll
          for (int e = 0; e < G; ++e) score[g] += k[e] * q_shared[g][c + e];
        }
      }
    }
    // One online-softmax step per query head over the warp's 32 keys; keys
    // past the context weigh 0.
    float prob[kMaxGroup];
#pragma unroll
    for (int g = 0; g < kMaxGroup; ++g) {
      prob[g] = 0.0f;
      if (g >= group) continue;
      const float s = valid ? score[g] : -INFINITY;
      const float new_m = fmaxf(m[g], warp_max(s));  // finite: key `base` is valid
      const float correction = __expf(m[g] - new_m);
      prob[g] = valid ? __expf(s - new_m) : 0.0f;
      l[g] = l[g] * correction + warp_sum(prob[g]);
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) acc[g][i] *= correction;
      m[g] = new_m;
    }
    // V: every key of the 32 in turn (the bound is the same for the whole
    // warp), its probability taken from the lane that scored it.
    const int keys = min(kWarpSize, context - base);
    for (int j = 0; j < keys; ++j) {
      const int tj = base + j;
      const size_t v_offset =
          p.layout.value_offset(p.layer, table[tj / block_size], kv_head, tj % block_size);
      float v[kPerLane];
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) v[i] = to_float(pool[v_offset + lane * kPerLane + i]);
#pragma unroll
      for (int g = 0; g < kMaxGroup; ++g) {
        if (g >= group) break;
        const float pj = __shfl_sync(0xffffffffu, prob[g], j);
#pragma unroll
        for (int i = 0; i < kPerLane; ++i) acc[g][i] += pj * v[i];
      }
    }
  }

#pragma unroll
  for (int g = 0; g < kMaxGroup; ++g) {
    if (g >= group) break;
    if (lane == 0) {
      m_shared[warp][g] = m[g];
      l_shared[warp][g] = l[g];
    }
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) acc_shared[warp][g][lane * kPerLane + i] = acc[g][i];
  }
  __syncthreads();

  // Merge the warps: out = Σ_w acc_w e^{m_w - M} / Σ_w l_w e^{m_w - M}.
  for (int i = threadIdx.x; i < group * HEAD_DIM; i += blockDim.x) {
    const int g = i / HEAD_DIM, d = i % HEAD_DIM;
    float max_m = -INFINITY;
    for (int w = 0; w < kWarps; ++w) max_m = fmaxf(max_m, m_shared[w][g]);
    float sum = 0.0f, value = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (m_shared[w][g] == -INFINITY) continue;  // this warp saw no token
      const float factor = __expf(m_shared[w][g] - max_m);
      sum += l_shared[w][g] * factor;
      value += acc_shared[w][g][d] * factor;
    }
    static_cast<float*>(p.out)[(size_t(seq) * p.num_heads + first_head + g) * HEAD_DIM + d] =
        sum > 0.0f ? value / sum : 0.0f;
  }
}

template <typename KvT>
Status launch_for_dtype(const PagedAttentionParams& p, cudaStream_t stream) {
  if (p.num_seqs > kMaxGridY) {
    return invalid_argument("CUDA decode attention takes at most " + std::to_string(kMaxGridY) +
                            " sequences a launch, not " + std::to_string(p.num_seqs));
  }
  dim3 grid(unsigned(p.layout.num_kv_heads), unsigned(p.num_seqs));
  dim3 block(kWarps * kWarpSize);
  switch (p.layout.head_dim) {
    case 64:
      paged_decode_attention_kernel<KvT, 64><<<grid, block, 0, stream>>>(p);
      break;
    case 128:
      paged_decode_attention_kernel<KvT, 128><<<grid, block, 0, stream>>>(p);
      break;
    default:
      return invalid_argument("CUDA decode attention supports head_dim 64 and 128, not " +
                              std::to_string(p.layout.head_dim));
  }
  BATON_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return Status::ok();
}

}  // namespace

Status paged_decode_attention(const PagedAttentionParams& p, void* stream) {
  if (p.num_seqs <= 0) return Status::ok();
  if (p.qo_dtype != DType::kF32 || p.layout.key_order != KeyOrder::kGrouped) {
    return invalid_argument("CUDA decode attention reads F32 queries over grouped keys");
  }
  if (p.window > 0) return unimplemented("CUDA decode attention has no sliding window");
  if (p.layout.num_kv_heads <= 0 || p.num_heads % p.layout.num_kv_heads != 0 ||
      p.num_heads / p.layout.num_kv_heads > kMaxGroup) {
    return invalid_argument(
        "CUDA decode attention needs num_heads a multiple of num_kv_heads, "
        "at most " +
        std::to_string(kMaxGroup) + " per KV head");
  }
  auto s = static_cast<cudaStream_t>(stream);
  switch (p.layout.dtype) {
    case DType::kF32:
      return launch_for_dtype<float>(p, s);
    case DType::kF16:
      return launch_for_dtype<__half>(p, s);
    case DType::kBF16:
      return launch_for_dtype<__nv_bfloat16>(p, s);
    case DType::kI8:
    case DType::kFP8E4M3:
      break;
  }
  return unimplemented("CUDA decode attention does not read " +
                       std::string(dtype_name(p.layout.dtype)) + " KV");
}

}  // namespace baton::kernels::cuda
