// common/pool_copier.h — moves byte ranges between a KV pool the transport
// cannot register (a GPU's, when UCX has no CUDA support) and a host mirror
// of it with the same layout.
//
// The transfer engine stages such a pool through the mirror: it registers the
// mirror, has the source ranges copied out before they are sent and the
// destination ranges copied in once they have landed and been verified (the
// fallback vLLM's NIXL connector takes with a CPU transfer buffer). The
// backend that owns the device implements it (kernels/cuda/pool_copier.h);
// common/ only declares it, so kv_transfer needs no device headers.
#pragma once

#include <cstddef>
#include <span>

#include "common/status.h"

namespace baton {

class PoolCopier {
 public:
  struct Range {
    size_t offset = 0;  // bytes from the start of the pool (and of the mirror)
    size_t bytes = 0;
  };

  virtual ~PoolCopier() = default;

  // The device pool's ranges into `mirror` at the same offsets; returns once
  // they are there. May be called from any thread.
  virtual Status to_host(void* mirror, std::span<const Range> ranges) = 0;
  // `mirror`'s ranges into the device pool; returns once they are there. May
  // be called from any thread, concurrently with to_host.
  virtual Status to_device(const void* mirror, std::span<const Range> ranges) = 0;
  // Page-locks the mirror for the device's DMA (cudaHostRegister) until the
  // copier is destroyed, which must happen before the mirror is unmapped. An
  // error leaves it pageable: copies still work, slower.
  virtual Status pin(void* mirror, size_t bytes) = 0;
  // For logs: "cuda device 0", "host memory".
  virtual const char* name() const = 0;
};

}  // namespace baton
