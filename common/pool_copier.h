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
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "common/kv_layout.h"
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

// Byte ranges of `blocks` (distinct ids, any order) in layers
// [layer_begin, layer_end) of a pool laid out as `layout`: ids sorted, runs
// of adjacent ids one range per layer, ranges that meet across a layer
// boundary joined. What a staged pool copies to or from its device.
std::vector<PoolCopier::Range> block_byte_ranges(const KvLayout& layout,
                                                 std::span<const int32_t> blocks,
                                                 int32_t layer_begin, int32_t layer_end);

// The copier of a pool in host memory (`bytes` at `pool`): plain memcpy,
// every range checked against the pool. A CPU node stages its pool through it
// where it is asked to take the path a device pool takes (tests of that path
// on machines without a GPU); pin() is refused, as there is no device.
std::unique_ptr<PoolCopier> make_host_pool_copier(void* pool, size_t bytes);

}  // namespace baton
