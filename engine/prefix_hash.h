// engine/prefix_hash.h — the keys under which the prefix cache finds full KV
// blocks (block_manager.h): a chain of hashes, each block's covering its own
// tokens and, through its parent's, every token before it, so a block is
// found only at the same place after the same tokens.
#pragma once

#include <cstdint>
#include <span>

namespace baton::engine {

// The parent of a sequence's first block.
inline constexpr uint64_t kNoParent = 0x6261746f6e4b5621ull;

// The hash of a block of `tokens` that follows the block hashed `parent`.
uint64_t prefix_block_hash(uint64_t parent, std::span<const int32_t> tokens);

}  // namespace baton::engine
