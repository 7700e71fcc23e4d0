// common/pool_copier.h — moves byte ranges between a KV pool the CPU cannot
// reach in place (a GPU's) and host memory.
//
// The transfer engine stages such a pool through registered host slots of
// the pool's block geometry (when UCX has no CUDA support): a transfer's
// source blocks are copied out into slots before they are sent and its
// destination blocks copied in from slots once they have landed and been
// verified (the fallback vLLM's NIXL connector takes with a CPU transfer
// buffer). The SSD tier moves blocks through bounce slots of its own. The
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
    size_t offset = 0;  // bytes from the start of the pool
    size_t bytes = 0;
    size_t host_offset = 0;  // bytes from the start of the host memory
  };

  virtual ~PoolCopier() = default;

  // Each range of the device pool to `host` + its host_offset; returns once
  // they are there. May be called from any thread.
  virtual Status to_host(void* host, std::span<const Range> ranges) = 0;
  // The reverse: `host` + host_offset to each range of the device pool;
  // returns once they are there. May be called from any thread, concurrently
  // with to_host.
  virtual Status to_device(const void* host, std::span<const Range> ranges) = 0;
  // Page-locks host memory for the device's DMA (cudaHostRegister) until the
  // copier is destroyed, which must happen before that memory is unmapped.
  // One region per copier. An error leaves it pageable: copies still work,
  // slower.
  virtual Status pin(void* host, size_t bytes) = 0;
  // For logs: "cuda device 0", "host memory".
  virtual const char* name() const = 0;
};

// The byte ranges between `blocks` of a pool laid out as `pool` and `slots`
// of host memory laid out as `host` (blocks[i] and slots[i]; the same
// geometry but for the number of blocks) in layers [layer_begin,
// layer_end): pairs sorted by block, runs adjacent on both sides one range
// per layer, ranges that meet across a layer boundary on both sides joined.
// What a staged pool copies to or from its device.
std::vector<PoolCopier::Range> block_byte_ranges(const KvLayout& pool,
                                                 std::span<const int32_t> blocks,
                                                 const KvLayout& host,
                                                 std::span<const int32_t> slots,
                                                 int32_t layer_begin, int32_t layer_end);

// OutOfRange naming the first of `ranges` that is not inside the pool's
// `pool_bytes` or, where `host_bytes` is not 0, the host memory's.
Status check_copy_ranges(std::span<const PoolCopier::Range> ranges, size_t pool_bytes,
                         size_t host_bytes);

// The copier of a pool in host memory (`bytes` at `pool`): plain memcpy,
// every range checked against the pool (and against the host memory, once
// pin() has named it). A CPU node stages its pool through it where it is
// asked to take the path a device pool takes (tests of that path on
// machines without a GPU); pin() is refused, as there is no device.
std::unique_ptr<PoolCopier> make_host_pool_copier(void* pool, size_t bytes);

}  // namespace baton
