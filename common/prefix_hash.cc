#include "common/prefix_hash.h"

#include <xxhash.h>

#include <algorithm>

namespace baton {

uint64_t prefix_block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // The parent's hash seeds the block's: XXH3 mixes the seed into every
  // lane, so equal tokens after different prefixes hash apart.
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                          int32_t max_blocks) {
  std::vector<uint64_t> chain;
  if (block_size <= 0) return chain;
  const auto blocks =
      std::min<size_t>(size_t(std::max(max_blocks, 0)), tokens.size() / size_t(block_size));
  chain.reserve(blocks);
  uint64_t parent = kNoParent;
  for (size_t j = 0; j < blocks; ++j) {
    parent = prefix_block_hash(parent, tokens.subspan(j * size_t(block_size), size_t(block_size)));
    chain.push_back(parent);
  }
  return chain;
}

}  // namespace baton
