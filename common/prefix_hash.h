// common/prefix_hash.h — the keys under which the prefix cache finds full KV
// blocks (engine/block_manager.h), and the router's prefix-aware policy
// follows prompts: a chain of hashes, each block's covering its own tokens
// and, through its parent's, every token before it, so a block is found only
// at the same place after the same tokens.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace baton {

// The parent of a sequence's first block.
inline constexpr uint64_t kNoParent = 0x6261746f6e4b5621ull;

// The hash of a block of `tokens` that follows the block hashed `parent`.
uint64_t prefix_block_hash(uint64_t parent, std::span<const int32_t> tokens);

// The chain of the first `max_blocks` full blocks of `tokens` (fewer if the
// tokens run out).
std::vector<uint64_t> prefix_block_hashes(std::span<const int32_t> tokens, int32_t block_size,
                                          int32_t max_blocks);

}  // namespace baton
