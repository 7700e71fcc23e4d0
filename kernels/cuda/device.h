// kernels/cuda/device.h — the CUDA backend's host-side entry points.
//
// Plain C++ (no CUDA headers), so code built by the host compiler — tests,
// the engine — can call the backend. Implemented in kernels/cuda/*.cu, built
// only when nvcc is found.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/kv_layout.h"
#include "common/status.h"

namespace baton::kernels::cuda {

// Devices visible to this process; 0 when there is no driver or no device
// (a capability check, never an error).
int device_count();

// Owned device memory; freed on destruction.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(size_t bytes);
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Status copy_from_host(const void* src, size_t bytes);
  Status copy_to_host(void* dst, size_t bytes) const;

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Decode attention: one query row per sequence, over the paged pool in device
// memory (the same KvLayout as the CPU backend). All pointers are device
// pointers.
struct DecodeAttentionParams {
  const float* q = nullptr;       // [num_seqs, num_heads, head_dim]
  float* out = nullptr;           // [num_seqs, num_heads, head_dim]
  const void* kv_pool = nullptr;  // laid out as `layout`
  KvLayout layout;
  int32_t layer = 0;
  int32_t num_heads = 0;  // a multiple of layout.num_kv_heads, at most 8x
  int32_t num_seqs = 0;
  const int32_t* context_lens = nullptr;  // [num_seqs], each >= 1
  const int32_t* block_tables = nullptr;  // [num_seqs, block_table_stride]
  int32_t block_table_stride = 0;
  float scale = 1.0f;
};

// Launches on `stream` (a cudaStream_t; null = the default stream) and
// returns launch errors; unsupported shapes are InvalidArgument.
Status paged_decode_attention(const DecodeAttentionParams& params, void* stream);
Status synchronize();

}  // namespace baton::kernels::cuda
