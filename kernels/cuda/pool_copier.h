// kernels/cuda/pool_copier.h — a KV pool in device memory copied to and from
// host memory (common/pool_copier.h): the transfer engine's host slots when
// UCX has no CUDA support, as Debian's does not, and the SSD tier's bounce
// slots.
//
// Plain C++ like device.h, so the node and the transfer tests need no CUDA
// headers.
#pragma once

#include <cstddef>
#include <memory>

#include "common/pool_copier.h"
#include "common/status.h"

namespace baton::kernels::cuda {

// Copies for the pool at `device_pool` (`bytes` long, on the current device).
// Each direction has a stream of its own, so a sender's copy-out and a
// receiver's copy-in overlap; every range is checked against the pool. A
// copy makes the pool's device current on the thread that asks for it.
Result<std::unique_ptr<PoolCopier>> make_pool_copier(void* device_pool, size_t bytes);

}  // namespace baton::kernels::cuda
