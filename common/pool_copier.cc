// common/pool_copier.cc — the host-memory PoolCopier.
#include "common/pool_copier.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "common/check.h"

namespace baton {
namespace {

class HostMemoryCopier final : public PoolCopier {
 public:
  HostMemoryCopier(uint8_t* pool, size_t bytes) : pool_(pool), bytes_(bytes) {}

  Status to_host(void* host, std::span<const Range> ranges) override {
    BATON_RETURN_IF_ERROR(check_copy_ranges(ranges, bytes_, host_bytes_));
    for (const Range& r : ranges)
      std::memcpy(static_cast<uint8_t*>(host) + r.host_offset, pool_ + r.offset, r.bytes);
    return Status::ok();
  }

  Status to_device(const void* host, std::span<const Range> ranges) override {
    BATON_RETURN_IF_ERROR(check_copy_ranges(ranges, bytes_, host_bytes_));
    for (const Range& r : ranges)
      std::memcpy(pool_ + r.offset, static_cast<const uint8_t*>(host) + r.host_offset, r.bytes);
    return Status::ok();
  }

  // Nothing to pin for, but the host memory's size is known from here on:
  // a copy past it is refused.
  Status pin(void*, size_t bytes) override {
    host_bytes_ = bytes;
    return unimplemented("a pool in host memory has no device to pin host memory for");
  }

  const char* name() const override { return "host memory"; }

 private:
  uint8_t* const pool_;
  const size_t bytes_;
  size_t host_bytes_ = 0;  // told by pin(); 0: not yet
};

}  // namespace

Status check_copy_ranges(std::span<const PoolCopier::Range> ranges, size_t pool_bytes,
                         size_t host_bytes) {
  for (const PoolCopier::Range& r : ranges) {
    if (r.offset > pool_bytes || r.bytes > pool_bytes - r.offset) {
      return out_of_range("copy of " + std::to_string(r.bytes) + " bytes at " +
                          std::to_string(r.offset) + " outside the pool of " +
                          std::to_string(pool_bytes));
    }
    if (host_bytes != 0 && (r.host_offset > host_bytes || r.bytes > host_bytes - r.host_offset)) {
      return out_of_range("copy of " + std::to_string(r.bytes) + " bytes at host offset " +
                          std::to_string(r.host_offset) + " outside the " +
                          std::to_string(host_bytes) + " host bytes");
    }
  }
  return Status::ok();
}

std::vector<PoolCopier::Range> block_byte_ranges(const KvLayout& pool,
                                                 std::span<const int32_t> blocks,
                                                 const KvLayout& host,
                                                 std::span<const int32_t> slots,
                                                 int32_t layer_begin, int32_t layer_end) {
  BATON_CHECK(blocks.size() == slots.size());
  std::vector<std::pair<int32_t, int32_t>> pairs;
  pairs.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) pairs.emplace_back(blocks[i], slots[i]);
  std::sort(pairs.begin(), pairs.end());
  const size_t block_bytes = pool.block_bytes();
  std::vector<PoolCopier::Range> ranges;
  for (int32_t layer = layer_begin; layer < layer_end; ++layer) {
    for (const auto& [block, slot] : pairs) {
      const size_t offset = pool.block_byte_offset(layer, block);
      const size_t host_offset = host.block_byte_offset(layer, slot);
      // Adjacent on both sides (a run of blocks into a run of slots): one copy.
      if (!ranges.empty() && ranges.back().offset + ranges.back().bytes == offset &&
          ranges.back().host_offset + ranges.back().bytes == host_offset) {
        ranges.back().bytes += block_bytes;
      } else {
        ranges.push_back({.offset = offset, .bytes = block_bytes, .host_offset = host_offset});
      }
    }
  }
  return ranges;
}

std::unique_ptr<PoolCopier> make_host_pool_copier(void* pool, size_t bytes) {
  return std::make_unique<HostMemoryCopier>(static_cast<uint8_t*>(pool), bytes);
}

}  // namespace baton
