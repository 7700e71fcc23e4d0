// Host code only (the runtime API, no kernels): built by the C++20 host
// compiler, as common/pool_copier.h's std::span needs.
#include "kernels/cuda/pool_copier.h"

#include <cuda_runtime_api.h>

#include <array>
#include <atomic>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_status.h"

namespace baton::kernels::cuda {
namespace {

class CudaPoolCopier final : public PoolCopier {
 public:
  CudaPoolCopier(uint8_t* pool, size_t bytes, int device)
      : pool_(pool),
        bytes_(bytes),
        device_(device),
        name_("cuda device " + std::to_string(device)) {}

  ~CudaPoolCopier() override {
    // Best effort on the way out: nothing to report to.
    (void)on_device([&] {
      if (pinned_ != nullptr) cudaHostUnregister(pinned_);
      for (Lanes* lanes : {&out_, &in_}) {
        for (Lane& lane : *lanes) {
          if (lane.stream != nullptr) cudaStreamDestroy(lane.stream);
        }
      }
      return Status::ok();
    });
  }

  Status init() {
    return on_device([&]() -> Status {
      for (Lanes* lanes : {&out_, &in_}) {
        for (Lane& lane : *lanes) {
          BATON_CUDA_RETURN_IF_ERROR(
              cudaStreamCreateWithFlags(&lane.stream, cudaStreamNonBlocking));
        }
      }
      return Status::ok();
    });
  }

  Status to_host(void* host, std::span<const Range> ranges) override {
    return copy(out_, ranges, [&](const Range& r) {
      return std::pair<void*, const void*>(static_cast<uint8_t*>(host) + r.host_offset,
                                           pool_ + r.offset);
    });
  }

  Status to_device(const void* host, std::span<const Range> ranges) override {
    return copy(in_, ranges, [&](const Range& r) {
      return std::pair<void*, const void*>(pool_ + r.offset,
                                           static_cast<const uint8_t*>(host) + r.host_offset);
    });
  }

  Status pin(void* host, size_t bytes) override {
    if (host_bytes_ != 0) return invalid_argument("this copier was given its host memory already");
    // Whether or not it gets pinned, copies stay inside it from here on.
    host_bytes_ = bytes;
    return on_device([&]() -> Status {
      const cudaError_t e = cudaHostRegister(host, bytes, cudaHostRegisterPortable);
      // Pinned already (by a UCX with CUDA support, say): page-locked all
      // the same, and not this copier's to unregister.
      if (e == cudaErrorHostMemoryAlreadyRegistered) {
        (void)cudaGetLastError();
        host_pinned_ = true;
        return Status::ok();
      }
      BATON_RETURN_IF_ERROR(cuda_status(e, "cudaHostRegister", __FILE__, __LINE__));
      pinned_ = host;
      host_pinned_ = true;
      return Status::ok();
    });
  }

  const char* name() const override { return name_.c_str(); }

 private:
  // One batch of copies at a time on its own stream. A direction has a few,
  // so that callers on different threads (a prefill's per-layer copy-out,
  // the SSD tier's write-out, the transfer engine's copy-in) do not wait
  // for each other's batches: streams run on the device's copy engines side
  // by side.
  struct Lane {
    std::mutex mutex;
    cudaStream_t stream = nullptr;
    // The batch's pointers and sizes, kept to save allocations.
    std::vector<void*> dsts;
    std::vector<const void*> srcs;
    std::vector<size_t> sizes;
  };
  static constexpr size_t kLanesPerDirection = 4;
  using Lanes = std::array<Lane, kLanesPerDirection>;

  // A free lane of `lanes`, locked into `lock`; where every lane is busy,
  // the calling thread's own (by its id), waited for.
  static Lane& take_lane(Lanes& lanes, std::unique_lock<std::mutex>& lock) {
    for (Lane& lane : lanes) {
      std::unique_lock attempt(lane.mutex, std::try_to_lock);
      if (attempt.owns_lock()) {
        lock = std::move(attempt);
        return lane;
      }
    }
    Lane& own = lanes[std::hash<std::thread::id>{}(std::this_thread::get_id()) % lanes.size()];
    lock = std::unique_lock(own.mutex);
    return own;
  }

  // Queues the copies on d's stream: one call for the batch where the
  // runtime has cudaMemcpyBatchAsync (CUDA 13's signature) and the host
  // memory is pinned, which spares a transfer of scattered blocks a call per
  // block and layer; else one call each.
  Status enqueue(Lane& d) {
#if CUDART_VERSION >= 13000
    if (host_pinned_ && batch_works_.load(std::memory_order_relaxed)) {
      cudaMemcpyAttributes attrs{};
      attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      size_t first = 0;
      const cudaError_t e = cudaMemcpyBatchAsync(d.dsts.data(), d.srcs.data(), d.sizes.data(),
                                                 d.sizes.size(), &attrs, &first, 1, d.stream);
      if (e != cudaErrorInvalidValue && e != cudaErrorNotSupported)
        return cuda_status(e, "cudaMemcpyBatchAsync", __FILE__, __LINE__);
      // A driver or platform that refuses the batch: a call per range from
      // now on. The copies are idempotent, so any it queued may run again.
      (void)cudaGetLastError();
      batch_works_.store(false, std::memory_order_relaxed);
    }
#endif
    for (size_t i = 0; i < d.sizes.size(); ++i) {
      BATON_RETURN_IF_ERROR(cuda_status(
          cudaMemcpyAsync(d.dsts[i], d.srcs[i], d.sizes[i], cudaMemcpyDefault, d.stream),
          "cudaMemcpyAsync", __FILE__, __LINE__));
    }
    return Status::ok();
  }

  // `ends(r)`: where range r goes to and comes from.
  template <typename Ends>
  Status copy(Lanes& lanes, std::span<const Range> ranges, Ends ends) {
    BATON_RETURN_IF_ERROR(check_copy_ranges(ranges, bytes_, host_bytes_));
    if (ranges.empty()) return Status::ok();
    std::unique_lock<std::mutex> lock;
    Lane& d = take_lane(lanes, lock);
    d.dsts.clear();
    d.srcs.clear();
    d.sizes.clear();
    for (const Range& r : ranges) {
      const auto [to, from] = ends(r);
      d.dsts.push_back(to);
      d.srcs.push_back(from);
      d.sizes.push_back(r.bytes);
    }
    return on_device([&] {
      Status enqueued = enqueue(d);
      // Wait even after a failed enqueue: the copies already queued must not
      // write host memory or the pool once we have returned.
      Status synced =
          cuda_status(cudaStreamSynchronize(d.stream), "cudaStreamSynchronize", __FILE__, __LINE__);
      return enqueued.is_ok() ? synced : enqueued;
    });
  }

  // Runs `body` with the pool's device current on the calling thread, and
  // leaves it current: the copies run on a prefill's compute thread (whose
  // device is the pool's) and on the transfer engine's copy threads (which
  // have none of their own). Switching back would, on a thread that never
  // chose a device, create a context on device 0 (CUDA 12+) that a process
  // serving from another GPU does not want. An error is also taken out of the
  // thread's last-error slot, so a failure the engine tolerates (pinning) or
  // reports (a copy) does not surface at the caller's next kernel launch.
  template <typename Body>
  Status on_device(Body body) {
    int current = -1;
    Status s = cuda_status(cudaGetDevice(&current), "cudaGetDevice", __FILE__, __LINE__);
    if (s.is_ok() && current != device_) {
      s = cuda_status(cudaSetDevice(device_), "cudaSetDevice", __FILE__, __LINE__);
    }
    if (s.is_ok()) s = body();
    if (!s.is_ok()) (void)cudaGetLastError();
    return s;
  }

  uint8_t* const pool_;
  const size_t bytes_;
  const int device_;
  const std::string name_;
  size_t host_bytes_ = 0;     // the host memory pin() was given; 0: none yet
  void* pinned_ = nullptr;    // registered by this copier (unregistered with it)
  bool host_pinned_ = false;  // page-locked, by this copier or before it
  std::atomic<bool> batch_works_{true};
  Lanes out_, in_;
};

}  // namespace

Result<std::unique_ptr<PoolCopier>> make_pool_copier(void* device_pool, size_t bytes) {
  if (device_pool == nullptr || bytes == 0) {
    return invalid_argument("make_pool_copier needs a device pool");
  }
  cudaPointerAttributes attr{};
  if (cudaError_t e = cudaPointerGetAttributes(&attr, device_pool); e != cudaSuccess) {
    (void)cudaGetLastError();
    return cuda_status(e, "cudaPointerGetAttributes", __FILE__, __LINE__);
  }
  if (attr.type != cudaMemoryTypeDevice) {
    return invalid_argument("make_pool_copier: the pool is not device memory");
  }
  auto copier =
      std::make_unique<CudaPoolCopier>(static_cast<uint8_t*>(device_pool), bytes, attr.device);
  BATON_RETURN_IF_ERROR(copier->init());
  return std::unique_ptr<PoolCopier>(std::move(copier));
}

}  // namespace baton::kernels::cuda
