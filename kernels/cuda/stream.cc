#include "kernels/cuda/stream.h"

#include <cuda_runtime.h>

#include <string>
#include <utility>

#include "kernels/cuda/cuda_status.h"

namespace baton::kernels::cuda {

Status use_device(int index) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    count = 0;
  }
  if (index < 0 || index >= count) {
    return invalid_argument("this machine has " + std::to_string(count) + " CUDA device" +
                            (count == 1 ? "" : "s"));
  }
  BATON_CUDA_RETURN_IF_ERROR(cudaSetDevice(index));
  return Status::ok();
}

Result<Stream> Stream::create() {
  Stream s;
  cudaStream_t handle = nullptr;
  BATON_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&handle, cudaStreamNonBlocking));
  s.stream_ = handle;
  return Result<Stream>(std::move(s));
}

Stream::Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)) {}

Stream& Stream::operator=(Stream&& other) noexcept {
  if (this != &other) {
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    stream_ = std::exchange(other.stream_, nullptr);
  }
  return *this;
}

Stream::~Stream() {
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

Status Stream::synchronize() const {
  BATON_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

Status Stream::copy_to_device(void* dst, const void* src, size_t bytes) const {
  BATON_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

Status Stream::copy_to_host(void* dst, const void* src, size_t bytes) const {
  BATON_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

Status Stream::copy_on_device(void* dst, const void* src, size_t bytes) const {
  BATON_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                             static_cast<cudaStream_t>(stream_)));
  return Status::ok();
}

Result<Event> Event::create() {
  Event e;
  cudaEvent_t handle = nullptr;
  BATON_CUDA_RETURN_IF_ERROR(cudaEventCreate(&handle));
  e.event_ = handle;
  return Result<Event>(std::move(e));
}

Event::Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

Event& Event::operator=(Event&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Event::~Event() {
  if (event_ != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

Status Event::record(const Stream& stream) {
  BATON_CUDA_RETURN_IF_ERROR(cudaEventRecord(static_cast<cudaEvent_t>(event_),
                                             static_cast<cudaStream_t>(stream.handle())));
  return Status::ok();
}

Status Event::synchronize() const {
  BATON_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  return Status::ok();
}

Result<float> Event::elapsed_ms_since(const Event& start) const {
  float ms = 0;
  BATON_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start.event_),
                                                  static_cast<cudaEvent_t>(event_)));
  return ms;
}

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes) {
  PinnedBuffer b;
  if (cudaError_t e = cudaMallocHost(&b.data_, bytes); e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, "cudaMallocHost", __FILE__, __LINE__);
  }
  b.bytes_ = bytes;
  return Result<PinnedBuffer>(std::move(b));
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cudaFreeHost(data_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (data_ != nullptr) cudaFreeHost(data_);
}

}  // namespace baton::kernels::cuda
