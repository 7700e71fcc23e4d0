// engine/block_manager.h — who owns which KV block.
//
// Blocks are reference counted because the prefix cache shares full blocks
// between sequences. A BlockTable is one sequence's ordered list of block ids
// plus its token count; growing it may fail with ResourceExhausted, which the
// scheduler handles (wait or preempt) — it is never fatal.
//
// The prefix cache: a full block whose K/V is written can be registered
// under its BlockKey (the tokens of its sequence up to its end, as a chain of
// hashes). A later sequence that starts with the same tokens shares it
// instead of computing it again. A registered block nobody holds any more
// keeps its K/V and stays findable, but counts as free: it is reused, least
// recently released first, only once no never-registered block is left.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace baton::engine {

// A full block's place in the prefix cache: `hash` covers every token of the
// sequence up to the block's end (common/prefix_hash.h), `parent` the tokens before
// the block (kNoParent for a first block), `tokens` the block's own. A match
// compares all three: a wrong share would need two different prefixes whose
// 64-bit parent hashes collide, followed by the same block of tokens.
struct BlockKey {
  uint64_t hash;
  uint64_t parent;
  std::span<const int32_t> tokens;
};

// The same block: its hash, and what the hash stands for (a 64-bit hash
// alone can collide, by chance or by a client's design).
inline bool same_key(const BlockKey& a, const BlockKey& b) {
  return a.hash == b.hash && a.parent == b.parent && std::ranges::equal(a.tokens, b.tokens);
}

class BlockManager {
 public:
  explicit BlockManager(int32_t num_blocks);

  int32_t num_blocks() const { return int32_t(ref_counts_.size()); }
  // Blocks no sequence holds, registered ones among them.
  int32_t num_free() const { return int32_t(free_list_.size() + evictable_.size()); }
  // Registered blocks, held or not.
  int32_t num_cached() const { return int32_t(by_hash_.size()); }
  int32_t ref_count(int32_t block) const { return ref_counts_.at(size_t(block)); }

  // n blocks with reference count 1, or ResourceExhausted (nothing taken):
  // the n lowest never-registered free ids, then registered ones nobody
  // holds, least recently released first (they leave the cache); all in
  // ascending order.
  Result<std::vector<int32_t>> allocate(int32_t n);
  // Another owner for a block in use, or a registered free one (prefix
  // sharing: it is no longer free).
  void add_ref(int32_t block);
  // Drops one reference per id; a block with none left becomes free.
  void release(const std::vector<int32_t>& blocks);

  // Registers a full block in use, whose K/V is written (or is being, by
  // the step being scheduled: see Scheduler::schedule), under `key`. A
  // block already registered, or a key another block holds, changes nothing
  // (the block is then freed as an unregistered one).
  void register_block(int32_t block, const BlockKey& key);
  // The registered block with exactly this key, held or free.
  std::optional<int32_t> find(const BlockKey& key) const;
  bool registered(int32_t block) const { return !registered_.at(size_t(block)).tokens.empty(); }

  // Told by allocate() of the registered blocks it takes out of the cache
  // for new owners, before they are handed out: their keys and K/V are still
  // intact (the SSD tier saves them then). Empty: nobody is told.
  using EvictionHook =
      std::function<void(std::span<const BlockKey> keys, std::span<const int32_t> blocks)>;
  void set_eviction_hook(EvictionHook hook) { eviction_hook_ = std::move(hook); }

 private:
  struct Registration {
    uint64_t hash = 0;
    uint64_t parent = 0;
    std::vector<int32_t> tokens;
    std::list<int32_t>::iterator evictable;  // its place there while free
  };
  // Takes one block off the free lists for a new owner; an evicted one is
  // added to `evicted`, its registration kept until the hook has seen it.
  int32_t take_free_block(std::vector<int32_t>& evicted);
  // Tells the hook of the evicted blocks and forgets their registrations.
  void finish_eviction(const std::vector<int32_t>& evicted);

  std::vector<int32_t> ref_counts_;
  // Registrations by block (empty tokens: none) and by hash.
  std::vector<Registration> registered_;
  std::unordered_map<uint64_t, int32_t> by_hash_;
  // Registered blocks nobody holds, least recently released first.
  std::list<int32_t> evictable_;
  // A min-heap of the free ids. Lowest first keeps a sequence's blocks in
  // runs of adjacent ids, and so of adjacent memory, wherever the pool is not
  // fragmented: a prompt's blocks are taken at once (a decode node reserves
  // all of a transferred prompt's), and freed sequences leave runs behind.
  // Decode attention then reads K and V as long streams instead of scattered
  // pieces of a few KiB, and a KV transfer moves one range per run
  // (kv_transfer/block_runs.h). A recently freed block is no warmer in cache
  // than any other: one block spans every layer, megabytes apart.
  std::vector<int32_t> free_list_;
  EvictionHook eviction_hook_;
};

// One sequence's blocks in token order.
class BlockTable {
 public:
  explicit BlockTable(int32_t block_size) : block_size_(block_size) {}

  int32_t block_size() const { return block_size_; }
  int32_t num_tokens() const { return num_tokens_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Blocks needed to hold `tokens` tokens in total.
  int32_t blocks_needed(int32_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  // Makes room for `n` more tokens, allocating blocks as needed; on
  // ResourceExhausted nothing changed.
  Status reserve(BlockManager& manager, int32_t n);
  // Appends a full block another sequence computed (the prefix cache's):
  // one more reference to it, and block_size more tokens. The table must
  // hold whole blocks only.
  void share(BlockManager& manager, int32_t block);
  // Records that `n` reserved slots now hold tokens.
  void commit(int32_t n);
  // Keeps the first `blocks` blocks, full, and returns the rest.
  void truncate(BlockManager& manager, int32_t blocks);
  // Slot (block_id * block_size + offset) of token position `pos`.
  int32_t slot_of(int32_t pos) const {
    return blocks_[size_t(pos / block_size_)] * block_size_ + pos % block_size_;
  }
  // Returns every block to the manager; the table is empty afterwards.
  void release(BlockManager& manager);
  // Sliding windows: returns the blocks wholly before token `first_needed`,
  // which no query will read again. Their ids stay in blocks() to keep
  // positions and blocks aligned, but name blocks that may now be someone
  // else's: only the first num_released() are so.
  void release_before(BlockManager& manager, int32_t first_needed);
  int32_t num_released() const { return num_released_; }
  // Sliding windows: `n` more leading blocks that no query will read and
  // that were never held (a remote prompt's, before its windows), as if
  // written and released: their tokens count, and their id is
  // kSkippedBlock, a block that may be anyone's, as a released block's
  // stale id is (a kernel that read it anyway stays inside the pool).
  // Every block the table has must be released.
  void skip(int32_t n);
  static constexpr int32_t kSkippedBlock = 0;

 private:
  int32_t block_size_;
  int32_t num_tokens_ = 0;
  std::vector<int32_t> blocks_;
  int32_t num_released_ = 0;  // leading blocks already returned (release_before)
};

}  // namespace baton::engine
