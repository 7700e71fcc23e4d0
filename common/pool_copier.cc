// common/pool_copier.cc — the host-memory PoolCopier.
#include "common/pool_copier.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>

namespace baton {
namespace {

class HostMemoryCopier final : public PoolCopier {
 public:
  HostMemoryCopier(uint8_t* pool, size_t bytes) : pool_(pool), bytes_(bytes) {}

  Status to_host(void* host, std::span<const Range> ranges) override {
    BATON_RETURN_IF_ERROR(check(ranges));
    for (const Range& r : ranges)
      std::memcpy(static_cast<uint8_t*>(host) + r.host_offset, pool_ + r.offset, r.bytes);
    return Status::ok();
  }

  Status to_device(const void* host, std::span<const Range> ranges) override {
    BATON_RETURN_IF_ERROR(check(ranges));
    for (const Range& r : ranges)
      std::memcpy(pool_ + r.offset, static_cast<const uint8_t*>(host) + r.host_offset, r.bytes);
    return Status::ok();
  }

  Status pin(void*, size_t) override {
    return unimplemented("a pool in host memory has no device to pin its mirror for");
  }

  const char* name() const override { return "host memory"; }

 private:
  Status check(std::span<const Range> ranges) const {
    for (const Range& r : ranges) {
      if (r.offset > bytes_ || r.bytes > bytes_ - r.offset) {
        return out_of_range("copy of " + std::to_string(r.bytes) + " bytes at " +
                            std::to_string(r.offset) + " outside the pool of " +
                            std::to_string(bytes_));
      }
    }
    return Status::ok();
  }

  uint8_t* const pool_;
  const size_t bytes_;
};

}  // namespace

std::vector<PoolCopier::Range> block_byte_ranges(const KvLayout& layout,
                                                 std::span<const int32_t> blocks,
                                                 int32_t layer_begin, int32_t layer_end) {
  std::vector<int32_t> sorted(blocks.begin(), blocks.end());
  std::sort(sorted.begin(), sorted.end());
  std::vector<PoolCopier::Range> ranges;
  for (int32_t layer = layer_begin; layer < layer_end; ++layer) {
    for (int32_t block : sorted) {
      const size_t offset = layout.block_byte_offset(layer, block);
      if (!ranges.empty() && ranges.back().offset + ranges.back().bytes == offset) {
        ranges.back().bytes += layout.block_bytes();
      } else {
        ranges.push_back({.offset = offset, .bytes = layout.block_bytes(), .host_offset = offset});
      }
    }
  }
  return ranges;
}

std::unique_ptr<PoolCopier> make_host_pool_copier(void* pool, size_t bytes) {
  return std::make_unique<HostMemoryCopier>(static_cast<uint8_t*>(pool), bytes);
}

}  // namespace baton
