// kernels/cuda/device.h — the CUDA backend's host-side entry points.
//
// Plain C++ (no CUDA headers), so code built by the host compiler — tests,
// the engine — can call the backend. Implemented in kernels/cuda/*.cu, built
// only when nvcc is found.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/kv_layout.h"
#include "common/status.h"
#include "kernels/attention_params.h"

namespace baton::kernels::cuda {

// Devices visible to this process; 0 when there is no driver or no device
// (a capability check, never an error).
int device_count();
// Why device_count() found none: CUDA's error name and text, or "" when it
// found some.
std::string device_count_error();

// The current device's memory, as cudaMemGetInfo reports it.
struct DeviceMemory {
  size_t free_bytes = 0;
  size_t total_bytes = 0;
};
Result<DeviceMemory> device_memory();

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
  // Synchronous copies (the data has landed when they return); `offset`
  // bytes into this buffer.
  Status copy_from_host(const void* src, size_t bytes, size_t offset = 0);
  // Synchronous too, on the legacy stream: callers synchronize the streams
  // that wrote the buffer first.
  Status copy_to_host(void* dst, size_t bytes) const;
  // Every byte zero, synchronously.
  Status zero();

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

// Decode attention over a pool in the CPU backend's key order
// (KeyOrder::kGrouped), one query row per sequence: q and out F32, every
// pointer a device pointer; query_start is not read. num_heads at most 8 per
// KV head.

// Launches on `stream` (a cudaStream_t; null = the default stream) and
// returns launch errors; unsupported shapes are InvalidArgument.
Status paged_decode_attention(const PagedAttentionParams& params, void* stream);
Status synchronize();

}  // namespace baton::kernels::cuda
