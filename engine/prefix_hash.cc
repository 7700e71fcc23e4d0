#include "engine/prefix_hash.h"

#include <xxhash.h>

namespace baton::engine {

uint64_t prefix_block_hash(uint64_t parent, std::span<const int32_t> tokens) {
  // The parent's hash seeds the block's: XXH3 mixes the seed into every
  // lane, so equal tokens after different prefixes hash apart.
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), parent);
}

}  // namespace baton::engine
