#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/device.h"

namespace baton::kernels::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return count;
}

std::string device_count_error() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e == cudaSuccess) return count > 0 ? "" : "no device";
  (void)cudaGetLastError();
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

Result<DeviceMemory> device_memory() {
  DeviceMemory memory;
  BATON_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&memory.free_bytes, &memory.total_bytes));
  return memory;
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  DeviceBuffer buffer;
  if (cudaError_t e = cudaMalloc(&buffer.data_, bytes); e != cudaSuccess) {
    // Out of memory is the caller's to handle: it must not surface again at
    // the next launch's cudaGetLastError.
    (void)cudaGetLastError();
    return cuda_status(e, "cudaMalloc", __FILE__, __LINE__);
  }
  buffer.bytes_ = bytes;
  return Result<DeviceBuffer>(std::move(buffer));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFree(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cudaFree(data_);
}

Status DeviceBuffer::copy_from_host(const void* src, size_t bytes, size_t offset) {
  if (offset > bytes_ || bytes > bytes_ - offset) {
    return invalid_argument("copy past the end of the device buffer");
  }
  BATON_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(static_cast<char*>(data_) + offset, src, bytes, cudaMemcpyHostToDevice));
  // From pageable memory cudaMemcpy may return before the DMA lands, and
  // kernels on non-blocking streams do not wait for the legacy stream.
  BATON_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::ok();
}

Status DeviceBuffer::zero() {
  if (bytes_ == 0) return Status::ok();
  BATON_CUDA_RETURN_IF_ERROR(cudaMemset(data_, 0, bytes_));
  BATON_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::ok();
}

Status DeviceBuffer::copy_to_host(void* dst, size_t bytes) const {
  if (bytes > bytes_) return invalid_argument("copy larger than the device buffer");
  BATON_CUDA_RETURN_IF_ERROR(cudaMemcpy(dst, data_, bytes, cudaMemcpyDeviceToHost));
  return Status::ok();
}

Status synchronize() {
  BATON_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return Status::ok();
}

}  // namespace baton::kernels::cuda
