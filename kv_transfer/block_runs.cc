#include "kv_transfer/block_runs.h"

#include <xxhash.h>
#if defined(__x86_64__) || defined(__i386__)
// The library's own run-time choice of SSE2, AVX2 or AVX-512 code. Debian
// builds plain XXH3_64bits for baseline x86-64: about 8 GB/s here against
// 25-35 GB/s through the dispatcher, the difference between a checksum that
// costs a third of a TCP transfer and one that costs a tenth.
#include <xxh_x86dispatch.h>
#define BATON_XXH3_64 XXH3_64bits_dispatch
#else
#define BATON_XXH3_64 XXH3_64bits
#endif

#include <algorithm>
#include <string>
#include <unordered_set>

namespace baton::kv_transfer {

std::vector<BlockRun> merge_block_runs(std::span<const int32_t> src, std::span<const int32_t> dst) {
  std::vector<BlockRun> runs;
  for (size_t i = 0; i < src.size() && i < dst.size(); ++i) {
    if (!runs.empty()) {
      BlockRun& last = runs.back();
      if (src[i] == last.src_block + last.count && dst[i] == last.dst_block + last.count) {
        ++last.count;
        continue;
      }
    }
    runs.push_back(BlockRun{src[i], dst[i], 1, int32_t(i)});
  }
  return runs;
}

std::string geometry_difference(const KvLayout& a, const KvLayout& b) {
  auto differ = [](const char* what, const std::string& x, const std::string& y) {
    return std::string(what) + ": " + x + " against " + y;
  };
  auto order = [](KeyOrder o) {
    return std::string(o == KeyOrder::kTokenMajor ? "token-major (a GPU backend's pool)"
                                                  : "grouped (the CPU backend's pool)");
  };
  if (a.num_layers != b.num_layers)
    return differ("layers", std::to_string(a.num_layers), std::to_string(b.num_layers));
  if (a.block_size != b.block_size)
    return differ("block size", std::to_string(a.block_size), std::to_string(b.block_size));
  if (a.num_kv_heads != b.num_kv_heads)
    return differ("KV heads", std::to_string(a.num_kv_heads), std::to_string(b.num_kv_heads));
  if (a.head_dim != b.head_dim)
    return differ("head_dim", std::to_string(a.head_dim), std::to_string(b.head_dim));
  if (a.dtype != b.dtype)
    return differ("KV dtype", std::string(dtype_name(a.dtype)), std::string(dtype_name(b.dtype)));
  if (a.key_order != b.key_order)
    return differ("key order", order(a.key_order), order(b.key_order));
  return {};
}

Status validate_block_lists(std::span<const int32_t> src, const KvLayout& src_layout,
                            std::span<const int32_t> dst, const KvLayout& dst_layout) {
  if (src.empty()) return invalid_argument("empty block list");
  if (src.size() != dst.size()) {
    return invalid_argument("source has " + std::to_string(src.size()) + " blocks, destination " +
                            std::to_string(dst.size()));
  }
  if (!src_layout.same_geometry(dst_layout)) {
    return invalid_argument("source and destination pools differ in KV geometry (" +
                            geometry_difference(src_layout, dst_layout) + ")");
  }
  std::unordered_set<int32_t> seen;
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] < 0 || src[i] >= src_layout.num_blocks) {
      return out_of_range("source block " + std::to_string(src[i]) + " outside the pool");
    }
    if (dst[i] < 0 || dst[i] >= dst_layout.num_blocks) {
      return out_of_range("destination block " + std::to_string(dst[i]) + " outside the pool");
    }
    if (!seen.insert(dst[i]).second) {
      return invalid_argument("destination block " + std::to_string(dst[i]) + " repeated");
    }
  }
  return Status::ok();
}

uint64_t block_hash(const uint8_t* block, size_t bytes) { return BATON_XXH3_64(block, bytes); }

uint64_t BlockHashes::digest() const {
  return XXH3_64bits(hashes_.data(), hashes_.size() * sizeof(uint64_t));
}

uint64_t BlockHashes::layer_digest(int32_t layer) const {
  return XXH3_64bits(hashes_.data() + size_t(layer - layer_begin_) * num_pairs_,
                     num_pairs_ * sizeof(uint64_t));
}

}  // namespace baton::kv_transfer
