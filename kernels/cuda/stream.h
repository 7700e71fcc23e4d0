// kernels/cuda/stream.h — a CUDA stream, events on it and pinned host
// memory, owned and checked. Plain C++ (no CUDA headers), like device.h.
#pragma once

#include <cstddef>

#include "common/status.h"

namespace baton::kernels::cuda {

// Makes device `index` current on the calling thread; an index the machine
// does not have is InvalidArgument naming it and the count.
Status use_device(int index);

class Stream {
 public:
  static Result<Stream> create();  // on the current device, non-blocking
  Stream() = default;
  Stream(Stream&& other) noexcept;
  Stream& operator=(Stream&& other) noexcept;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  ~Stream();

  void* handle() const { return stream_; }  // a cudaStream_t
  Status synchronize() const;
  Status copy_to_device(void* dst, const void* src, size_t bytes) const;  // async
  Status copy_to_host(void* dst, const void* src, size_t bytes) const;    // async
  Status copy_on_device(void* dst, const void* src, size_t bytes) const;  // async

 private:
  void* stream_ = nullptr;
};

// Marks a point in a stream's work; synchronize() waits for it.
class Event {
 public:
  static Result<Event> create();
  Event() = default;
  Event(Event&& other) noexcept;
  Event& operator=(Event&& other) noexcept;
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  ~Event();

  Status record(const Stream& stream);
  Status synchronize() const;
  // Milliseconds between `start` and this event (both recorded and completed).
  Result<float> elapsed_ms_since(const Event& start) const;

 private:
  void* event_ = nullptr;
};

// Page-locked host memory: the only host memory asynchronous copies leave
// asynchronous.
class PinnedBuffer {
 public:
  static Result<PinnedBuffer> allocate(size_t bytes);
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace baton::kernels::cuda
