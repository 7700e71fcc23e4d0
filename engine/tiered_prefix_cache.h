// engine/tiered_prefix_cache.h — the prefix cache over its two tiers: the
// KV pool's registered blocks (BlockManager) and the SSD store below them.
//
// A full block's key is its tokens and the hash of every token before it
// (common/prefix_hash.h). Blocks a sequence computed are registered under
// their keys; a later sequence whose tokens start the same way shares them
// instead of computing them. When the pool evicts a registered block, the
// SSD tier saves it; a prompt whose next blocks are no longer in the pool
// but are on SSD gets them read back into fresh pool blocks, asynchronously,
// while the scheduler keeps computing the running sequences.
//
// The scheduler asks it to match a prefix (share_prefix), to start restores
// (start_restore for a queued sequence, start_remote_restore for a decode
// node's reservation) and to land the restores that finished (land). It
// keeps the restores in flight, who waits on them, and the hit counters;
// the per-sequence state it reads and writes is the prefix-cache part of
// Sequence (registered_blocks, block_hashes and the ssd_* fields). The
// scheduler keeps the queues and decides who runs.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "common/pool_copier.h"
#include "engine/block_manager.h"
#include "engine/kv_pool.h"
#include "engine/sequence.h"
#include "engine/ssd_kv_store.h"
#include "engine/ssd_staging.h"

namespace baton::engine {

// Bounce slots of a staged pool's SSD tier (engine/ssd_staging.h): as many
// as the store has I/Os in flight.
struct SsdStagingSlots {
  int32_t load = SsdKvStore::kIoDepth;
  int32_t save = SsdKvStore::kIoDepth;
};

struct PrefixCacheCounters {
  int64_t query_tokens = 0;    // prompt tokens looked up at first admission or reservation
  int64_t hit_tokens = 0;      // of those, found cached and not computed
  int64_t ssd_hit_tokens = 0;  // of the hits, read back from the SSD tier
};

class TieredPrefixCache {
 public:
  // `enabled` false: nothing is ever shared or registered (every verb is a
  // no-op), and no SSD tier can be attached.
  TieredPrefixCache(BlockManager& blocks, KvPool& kv, bool enabled);
  // The SSD store goes first: it waits out its reads and verifies them in
  // the memory they read into, a staged pool's slots, which go after.
  ~TieredPrefixCache();
  TieredPrefixCache(const TieredPrefixCache&) = delete;
  TieredPrefixCache& operator=(const TieredPrefixCache&) = delete;

  // The second tier: blocks evicted from the pool are saved there from now on.
  // With `staging`, the pool is one the store cannot read in place (a
  // device's): blocks pass through `slots` host slots (at most the pool's
  // blocks of each kind), copied out before a save and in once a load has
  // landed and been verified. A restore of more blocks than there are load
  // slots reads them a piece at a time.
  Status attach_ssd_store(std::unique_ptr<SsdKvStore> store,
                          std::unique_ptr<PoolCopier> staging = nullptr,
                          SsdStagingSlots slots = {});
  const SsdKvStore* ssd_store() const { return ssd_.get(); }

  // Match. For a sequence with no blocks and nothing computed: shares the
  // cached blocks its tokens start with (all but the last token, whose
  // logits a step needs) and marks their tokens computed. Blocks a restore
  // brought back are among them. With a sliding `window` (> 0) on every
  // layer, a prefix counts as cached wherever the blocks its window reaches
  // are, those before them skipped (BlockTable::skip): the blocks behind a
  // window are given back first as a sequence runs, and so evicted first.
  void share_prefix(Sequence& sequence, int32_t window = 0);
  // Registers the sequence's blocks that are full once its first `computed`
  // tokens are, so that later sequences share them.
  void register_full_blocks(Sequence& sequence, int32_t computed);
  // The leading blocks of a sequence's prompt (one with nothing computed or
  // held) that a reservation would find cached now: in the pool, then on
  // the SSD tier or being read there by a restore. Changes nothing but the
  // sequence's own hashes.
  struct CachedPrefix {
    int32_t in_pool = 0;
    int32_t on_ssd = 0;  // after those in the pool
  };
  // `window` as for share_prefix.
  CachedPrefix cached_prefix_blocks(Sequence& sequence, int32_t window = 0);
  // Counts a sequence's lookup (at its first admission or reservation).
  void count_lookup(const Sequence& sequence);
  // Takes back what count_lookup counted, for a reservation withdrawn to be
  // made again. Meant for the same pass of the engine's thread as the
  // count, so no report ever shows the counters going down.
  void uncount_lookup(const Sequence& sequence);

  // Restores for a queued sequence with no blocks: when the SSD tier holds
  // blocks that continue its cached prefix, starts reading them into fresh
  // pool blocks (as many as leave room for a chunk of `budget` tokens after
  // them), or waits on another restore that reads them already; then the
  // sequence is ssd_restoring and true is returned. Once land() has landed
  // the reads, share_prefix finds the blocks cached. The pool blocks of the
  // prefix before them are held meanwhile, so they stay cached.
  // With a `window` (as for share_prefix), the blocks read are those the
  // window of the furthest run the pool and the tier hold together reads
  // and the pool lacks, none before them; none where the pool alone
  // reaches as far.
  bool start_restore(Sequence& sequence, int32_t budget, int32_t window = 0);
  // For a reservation after share_prefix: the blocks the SSD tier holds
  // after the shared prefix are read into fresh blocks of the sequence's
  // table (or shared from another restore reading them), counted as cached
  // (the prefill node does not send them). Blocks the reads fail to bring
  // back are reported by land() in ssd_lost_from.
  void start_remote_restore(Sequence& sequence);
  // Restores in flight (an aborted sequence's too: a step must land them).
  bool restoring() const { return !restores_.empty(); }
  // False when the SSD tier reads as a restore starts (a staged pool's
  // later pieces are read as land() starts them).
  bool loads_are_asynchronous() const { return ssd_ && ssd_->loads_are_asynchronous(); }

  using SequenceLookup = std::function<Sequence*(int64_t id)>;
  // Registers the blocks of the restores whose reads landed (`wait`: waits
  // for one first, if none has) and settles the sequences involved, as
  // `find` returns them (queued or awaiting ones; null: gone). Returns the
  // queued sequences whose own restores landed, in the order they landed.
  std::vector<int64_t> land(bool wait, const SequenceLookup& find);

  const PrefixCacheCounters& counters() const { return counters_; }

 private:
  // What count_lookup counts for a sequence as it stands.
  PrefixCacheCounters lookup_counts(const Sequence& sequence) const;
  // An asynchronous restore in flight: the pool blocks of the prefix before
  // it are held (so they stay cached until it lands), the fresh ones are
  // being read. A staged pool's restore reads a piece of its keys at a time
  // into staging slots.
  struct Restore {
    int64_t sequence_id = 0;
    int64_t load = -1;           // the load in flight; -1: waiting for staging slots
    int32_t landed = 0;          // keys [0, landed) are in their fresh blocks
    int32_t reading = 0;         // keys [landed, landed + reading) are being read
    std::vector<int32_t> slots;  // a staged pool's: the slots they are read into
    // A staged pool's: the store slots of its keys, kept from saves until it
    // is over (its later pieces are read after saves may have run).
    std::vector<int64_t> pinned;
    std::vector<int32_t> held;
    std::vector<int32_t> fresh;
    std::vector<int32_t> tokens;  // the keys' tokens
    std::vector<BlockKey> keys;
    std::vector<int64_t> waiters;  // queued sequences that need these blocks too
    // Reservations that share some of the fresh blocks in their tables:
    // keys [first_key, first_key + blocks) are their blocks [first_block, ...).
    struct Sharer {
      int64_t sequence_id;
      int32_t first_key, blocks, first_block;
    };
    std::vector<Sharer> sharers;
  };

  // The key of the sequence's full block j (its tokens are a buffer that
  // the next call reuses).
  static BlockKey block_key(Sequence& sequence, int32_t j);
  // The pool's cached blocks [first, end) of the sequence's prompt that it
  // would continue from: without a window (0), the chain from its first
  // block; with one, the run ending furthest whose last block's window
  // reaches none of the blocks before `first`.
  struct PoolRun {
    int32_t first = 0, end = 0;
  };
  PoolRun pool_run(Sequence& sequence, int32_t window);
  // The same run, of the blocks `cached` says are there.
  PoolRun furthest_run(Sequence& sequence, int32_t window,
                       const std::function<bool(const BlockKey&)>& cached);
  // start_restore with a window.
  bool start_window_restore(Sequence& sequence, int32_t budget, int32_t window);
  // The sequence's full blocks first.. (up to end, exclusive) that the SSD
  // tier holds, copied into `tokens` and `keys`, as many as leave room in
  // the pool for the chunk of at most `budget` tokens that follows them.
  void keys_to_restore(Sequence& sequence, int32_t first, int32_t end, int32_t budget,
                       std::vector<int32_t>& tokens, std::vector<BlockKey>& keys);
  // The restore in flight reading the block of this key, and the key's
  // index in it; null if none is.
  std::pair<Restore*, int32_t> restore_reading(const BlockKey& key);
  // Where the store reads and writes an unstaged pool's blocks.
  BlockMemory pool_memory() const { return BlockMemory::of_pool(kv_.layout(), kv_.data()); }
  // The eviction hook: evicted registered blocks to the SSD tier (a staged
  // pool's through its save slots, those not stored already).
  void save_evicted(std::span<const BlockKey> keys, std::span<const int32_t> blocks);
  // Allocates fresh blocks for the restore's keys and starts reading them;
  // false (nothing taken) if there are none or no blocks for them.
  bool start_reading(Restore& restore);
  // A staged pool's restore: reads its next keys into as many free staging
  // slots as there are (false: none are).
  bool start_piece(Restore& restore);
  // A restore's load landed with `restored` of its keys read and verified:
  // a staged pool's are copied in. True when the restore is over (every
  // key in, or one failed).
  bool settle_load(Restore& restore, int32_t restored);
  // A restore that is over: its blocks registered or freed, its sequences
  // settled (and queued owners added to `landed_owners`).
  void finish(Restore& restore, const SequenceLookup& find, std::vector<int64_t>& landed_owners);
  // start_remote_restore when another restore reads the blocks that
  // continue the sequence's prefix: shares them instead. True if it did.
  bool share_remote_restore(Sequence& sequence);
  // A reservation's `blocks` blocks from `first` on are being read: cached.
  static void count_remote_restore(Sequence& sequence, int32_t first, int32_t blocks);
  // A reservation's restore landed with `restored` of its `blocks` blocks
  // (its blocks from `first_block` on): the rest count as lost.
  void settle_remote_restore(Sequence& sequence, int32_t first_block, int32_t blocks,
                             int32_t restored);

  BlockManager& blocks_;
  KvPool& kv_;
  bool enabled_;
  std::unique_ptr<SsdKvStore> ssd_;
  // A staged pool's slots (attach_ssd_store); the store reads and writes them.
  std::unique_ptr<SsdStaging> staging_;
  std::vector<Restore> restores_;
  PrefixCacheCounters counters_;
};

}  // namespace baton::engine
