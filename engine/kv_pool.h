// engine/kv_pool.h — the memory of a paged KV cache.
//
// One page-aligned anonymous mapping holding every layer's K and V blocks,
// laid out as common/kv_layout.h describes. Page alignment and a single
// region matter beyond this process: the transfer engine registers the whole
// pool once and peers write straight into its blocks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/kv_layout.h"
#include "common/status.h"

namespace baton::engine {

class KvPool {
 public:
  static Result<KvPool> create(const KvLayout& layout);
  // A pool in memory someone else owns (the transfer engine, when UCX
  // allocates it to share it with same-host peers); it must hold
  // layout.total_bytes() and outlive every use of the pool.
  static KvPool adopt(const KvLayout& layout, void* data);
  // A pool in device memory, handed to `release` when the pool goes. Only
  // the device's kernels can read it: the host's CPU never touches it.
  static KvPool adopt_device(const KvLayout& layout, void* data,
                             std::function<void(void*)> release);
  KvPool(KvPool&& other) noexcept;
  KvPool& operator=(KvPool&& other) noexcept;
  KvPool(const KvPool&) = delete;
  KvPool& operator=(const KvPool&) = delete;
  ~KvPool();

  const KvLayout& layout() const { return layout_; }
  void* data() { return data_; }
  const void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  bool on_device() const { return static_cast<bool>(release_device_); }

 private:
  KvPool(const KvLayout& layout, void* data, size_t bytes, bool owned)
      : layout_(layout), data_(data), bytes_(bytes), owned_(owned) {}
  void release();

  KvLayout layout_;
  void* data_ = nullptr;
  size_t bytes_ = 0;
  bool owned_ = true;                          // unmapped by release()
  std::function<void(void*)> release_device_;  // set for device pools
};

// How many blocks of `geometry` (num_blocks ignored) fit in `budget_bytes`.
int64_t kv_blocks_for_bytes(const KvLayout& geometry, uint64_t budget_bytes);

}  // namespace baton::engine
