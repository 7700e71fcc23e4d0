#include "engine/tiered_prefix_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <limits>
#include <optional>

#include "common/check.h"
#include "common/prefix_hash.h"
#include "engine/window_budget.h"

namespace baton::engine {
namespace {

// Gives back the blocks of a chain (in chain order) last block first, as
// BlockTable::release does: cached blocks are evicted in the order they
// were given back, so the chain's tail goes before its head, whose loss
// would leave every later block unreachable.
void release_tail_first(BlockManager& blocks, std::vector<int32_t> chain) {
  std::reverse(chain.begin(), chain.end());
  blocks.release(chain);
}

}  // namespace

TieredPrefixCache::TieredPrefixCache(BlockManager& blocks, KvPool& kv, bool enabled)
    : blocks_(blocks), kv_(kv), enabled_(enabled) {}

TieredPrefixCache::~TieredPrefixCache() {
  if (ssd_ != nullptr) blocks_.set_eviction_hook({});
  ssd_.reset();
}

Status TieredPrefixCache::attach_ssd_store(std::unique_ptr<SsdKvStore> store,
                                           std::unique_ptr<PoolCopier> staging,
                                           SsdStagingSlots slots) {
  BATON_CHECK(enabled_);
  if (staging != nullptr) {
    const int32_t most = kv_.layout().num_blocks;
    BATON_ASSIGN_OR_RETURN(
        staging_, SsdStaging::create(kv_.layout(), std::move(staging), std::min(slots.load, most),
                                     std::min(slots.save, most)));
  }
  ssd_ = std::move(store);
  blocks_.set_eviction_hook(
      [this](std::span<const BlockKey> keys, std::span<const int32_t> blocks) {
        save_evicted(keys, blocks);
      });
  return Status::ok();
}

void TieredPrefixCache::save_evicted(std::span<const BlockKey> keys,
                                     std::span<const int32_t> blocks) {
  if (staging_ == nullptr) {
    ssd_->save(keys, pool_memory(), blocks);
    return;
  }
  // Blocks stored already (restored ones, evicted again) are not copied out.
  std::vector<BlockKey> new_keys;
  std::vector<int32_t> new_blocks;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (ssd_->contains(keys[i])) {
      ssd_->touch(keys.subspan(i, 1));
    } else {
      new_keys.push_back(keys[i]);
      new_blocks.push_back(blocks[i]);
    }
  }
  const std::span<const int32_t> slots = staging_->save_slots();
  for (size_t at = 0; at < new_blocks.size(); at += slots.size()) {
    const size_t n = std::min(slots.size(), new_blocks.size() - at);
    const std::span<const int32_t> batch = std::span(new_blocks).subspan(at, n);
    // A block that cannot be copied out is not saved: it is only lost from
    // the cache, as a failed write would lose it.
    if (const Status copied = staging_->copy_out(batch, slots.first(n)); !copied.is_ok()) {
      spdlog::warn("ssd cache: copying {} blocks out of {}: {}", n, staging_->copier_name(),
                   copied.message());
      continue;
    }
    ssd_->save(std::span(new_keys).subspan(at, n), staging_->memory(), slots.first(n));
  }
}

BlockKey TieredPrefixCache::block_key(Sequence& seq, int32_t j) {
  const int32_t bs = seq.block_table.block_size();
  thread_local std::vector<int32_t> tokens;
  tokens.resize(size_t(bs));
  while (int32_t(seq.block_hashes.size()) <= j) {
    const auto k = int32_t(seq.block_hashes.size());
    for (int32_t t = 0; t < bs; ++t) tokens[size_t(t)] = seq.token_at(k * bs + t);
    const uint64_t parent = k == 0 ? kNoParent : seq.block_hashes.back();
    seq.block_hashes.push_back(prefix_block_hash(parent, tokens));
  }
  for (int32_t t = 0; t < bs; ++t) tokens[size_t(t)] = seq.token_at(j * bs + t);
  return BlockKey{.hash = seq.block_hashes[size_t(j)],
                  .parent = j == 0 ? kNoParent : seq.block_hashes[size_t(j) - 1],
                  .tokens = tokens};
}

TieredPrefixCache::PoolRun TieredPrefixCache::furthest_run(
    Sequence& seq, int32_t window, const std::function<bool(const BlockKey&)>& cached) {
  const int32_t bs = seq.block_table.block_size();
  const int32_t shareable = (seq.num_tokens() - 1) / bs;
  PoolRun best;
  // Where the present run of cached blocks starts.
  int32_t run_start = 0;
  for (int32_t j = 0; j < shareable; ++j) {
    if (!cached(block_key(seq, j))) {
      if (window <= 0) break;  // the chain from the first block ends here
      run_start = j + 1;
      continue;
    }
    // A key names the hash of every token before its block, so a block
    // found means the whole prefix before it matched. Continuing at
    // (j + 1) * bs, the next query reads the blocks from this one on.
    const int32_t first_needed = first_block_in_window((j + 1) * bs, window, bs);
    if (run_start <= first_needed) best = {.first = first_needed, .end = j + 1};
  }
  return best;
}

TieredPrefixCache::PoolRun TieredPrefixCache::pool_run(Sequence& seq, int32_t window) {
  return furthest_run(seq, window,
                      [this](const BlockKey& key) { return blocks_.find(key).has_value(); });
}

void TieredPrefixCache::share_prefix(Sequence& seq, int32_t window) {
  if (!enabled_ || seq.num_computed != 0 || !seq.block_table.blocks().empty()) return;
  const int32_t bs = seq.block_table.block_size();
  const PoolRun run = pool_run(seq, window);
  seq.block_table.skip(run.first);
  for (int32_t j = run.first; j < run.end; ++j)
    seq.block_table.share(blocks_, *blocks_.find(block_key(seq, j)));
  // What an asynchronous restore brought back was found above, in the pool.
  seq.ssd_restored_blocks = std::clamp(run.end - seq.ssd_first_block, 0, seq.ssd_landed_blocks);
  seq.num_computed = run.end * bs;
  seq.registered_blocks = run.end;
}

void TieredPrefixCache::register_full_blocks(Sequence& seq, int32_t computed) {
  if (!enabled_) return;
  // Blocks given back or skipped before they were registered (a remote
  // prompt's, behind its windows) hold no KV to share; the ones after them
  // do. Only a windowed match (share_prefix), which needs no block before a
  // window, finds those past such a gap.
  const int32_t from = std::max(seq.registered_blocks, seq.block_table.num_released());
  const int32_t full = computed / seq.block_table.block_size();
  for (int32_t j = from; j < full; ++j)
    blocks_.register_block(seq.block_table.blocks()[size_t(j)], block_key(seq, j));
  seq.registered_blocks = std::max(seq.registered_blocks, full);
}

TieredPrefixCache::CachedPrefix TieredPrefixCache::cached_prefix_blocks(Sequence& seq,
                                                                        int32_t window) {
  CachedPrefix cached;
  if (!enabled_) return cached;
  const int32_t shareable = (seq.num_tokens() - 1) / seq.block_table.block_size();
  int32_t j = pool_run(seq, window).end;
  cached.in_pool = j;
  while (ssd_ && j < shareable) {
    const BlockKey key = block_key(seq, j);
    if (!ssd_->contains(key) && restore_reading(key).first == nullptr) break;
    ++j;
  }
  cached.on_ssd = j - cached.in_pool;
  return cached;
}

PrefixCacheCounters TieredPrefixCache::lookup_counts(const Sequence& seq) const {
  // A sequence's prompt is counted once: readmissions after a preemption
  // find their own blocks, which says nothing about prompts sharing.
  if (!enabled_ || seq.num_preemptions > 0) return {};
  const int32_t bs = seq.block_table.block_size();
  const auto prompt = int64_t(seq.prompt.size());
  // A reservation's blocks still being read from the tier (a sequence
  // admitted here is counted only once its reads have landed) count once
  // they land (settle_remote_restore): counted now, a read that failed
  // would take them back, and a counter must never go down.
  const int64_t reading = seq.ssd_restoring ? int64_t(seq.ssd_restored_blocks) * bs : 0;
  return {.query_tokens = prompt,
          .hit_tokens = std::min<int64_t>(prompt, seq.num_computed) - reading,
          .ssd_hit_tokens = int64_t(seq.ssd_restored_blocks) * bs - reading};
}

void TieredPrefixCache::count_lookup(const Sequence& seq) {
  const PrefixCacheCounters c = lookup_counts(seq);
  counters_.query_tokens += c.query_tokens;
  counters_.hit_tokens += c.hit_tokens;
  counters_.ssd_hit_tokens += c.ssd_hit_tokens;
}

void TieredPrefixCache::uncount_lookup(const Sequence& seq) {
  const PrefixCacheCounters c = lookup_counts(seq);
  counters_.query_tokens -= c.query_tokens;
  counters_.hit_tokens -= c.hit_tokens;
  counters_.ssd_hit_tokens -= c.ssd_hit_tokens;
}

void TieredPrefixCache::keys_to_restore(Sequence& seq, int32_t first, int32_t end, int32_t budget,
                                        std::vector<int32_t>& tokens, std::vector<BlockKey>& keys) {
  // The keys' tokens, copied: block_key() reuses one buffer.
  const int32_t bs = seq.block_table.block_size();
  for (int32_t j = first; j < end; ++j) {
    const BlockKey key = block_key(seq, j);
    if (!ssd_->contains(key)) break;
    keys.push_back(key);
    tokens.insert(tokens.end(), key.tokens.begin(), key.tokens.end());
  }
  // As many as leave room for the blocks of the chunk after them: a restore
  // that took every free block would only make the admission fail.
  auto fits = [&](int32_t k) {
    const int32_t after = (first + k) * bs;
    const int32_t chunk = std::min(seq.num_tokens() - after, budget);
    const int32_t chunk_blocks = seq.block_table.blocks_needed(after + chunk) - (first + k);
    return k + chunk_blocks <= blocks_.num_free();
  };
  auto k = int32_t(keys.size());
  while (k > 0 && !fits(k)) --k;
  keys.resize(size_t(k));
  for (size_t i = 0; i < keys.size(); ++i) {
    keys[i].tokens = std::span<const int32_t>(tokens).subspan(i * size_t(bs), size_t(bs));
  }
}

bool TieredPrefixCache::start_restore(Sequence& seq, int32_t budget, int32_t window) {
  if (!ssd_ || seq.ssd_restoring || seq.ssd_restore_failed || seq.num_computed != 0 ||
      !seq.block_table.blocks().empty())
    return false;
  if (window > 0) return start_window_restore(seq, budget, window);
  const int32_t shareable = (seq.num_tokens() - 1) / seq.block_table.block_size();
  Restore restore;
  restore.sequence_id = seq.id;
  // The cached prefix in the pool is held, not shared: the sequence holds no
  // blocks while it waits, and these must not be evicted before it is
  // admitted (the restored blocks continue them).
  int32_t j = 0;
  for (; j < shareable; ++j) {
    const std::optional<int32_t> block = blocks_.find(block_key(seq, j));
    if (!block) break;
    blocks_.add_ref(*block);
    restore.held.push_back(*block);
  }
  if (j < shareable) {
    // A block another sequence's restore is reading: wait for that one
    // rather than read it twice (a burst of requests sharing a prompt).
    if (const auto [other, key] = restore_reading(block_key(seq, j)); other != nullptr) {
      release_tail_first(blocks_, restore.held);
      other->waiters.push_back(seq.id);
      seq.ssd_restoring = true;
      return true;
    }
    keys_to_restore(seq, j, shareable, budget, restore.tokens, restore.keys);
  }
  if (!start_reading(restore)) {
    release_tail_first(blocks_, restore.held);
    return false;
  }
  seq.ssd_restoring = true;
  if (seq.ssd_landed_blocks == 0) seq.ssd_first_block = j;
  restores_.push_back(std::move(restore));
  return true;
}

bool TieredPrefixCache::start_window_restore(Sequence& seq, int32_t budget, int32_t window) {
  const int32_t bs = seq.block_table.block_size();
  // The run the pool and the tier hold together that ends furthest with
  // every block its window reads.
  const PoolRun best = furthest_run(seq, window, [this](const BlockKey& key) {
    return blocks_.find(key).has_value() || ssd_->contains(key);
  });
  if (best.end <= pool_run(seq, window).end) return false;  // the pool alone reaches as far
  Restore restore;
  restore.sequence_id = seq.id;
  // Of the blocks the window reads, the pool's are held until the others
  // land; those are read, none before them.
  for (int32_t j = best.first; j < best.end; ++j) {
    const BlockKey key = block_key(seq, j);
    if (const std::optional<int32_t> block = blocks_.find(key)) {
      blocks_.add_ref(*block);
      restore.held.push_back(*block);
      continue;
    }
    if (const auto [other, at] = restore_reading(key); other != nullptr) {
      // Another sequence's restore reads it: wait for that one.
      release_tail_first(blocks_, restore.held);
      other->waiters.push_back(seq.id);
      seq.ssd_restoring = true;
      return true;
    }
    restore.keys.push_back(key);
    restore.tokens.insert(restore.tokens.end(), key.tokens.begin(), key.tokens.end());
  }
  // Only with room for the chunk after them: a restore that took the blocks
  // the chunk needs would only make the admission fail.
  const int32_t after = best.end * bs;
  const int32_t chunk_blocks =
      seq.block_table.blocks_needed(after + std::min(seq.num_tokens() - after, budget)) - best.end;
  if (int32_t(restore.keys.size()) + chunk_blocks > blocks_.num_free()) restore.keys.clear();
  for (size_t i = 0; i < restore.keys.size(); ++i)
    restore.keys[i].tokens =
        std::span<const int32_t>(restore.tokens).subspan(i * size_t(bs), size_t(bs));
  if (!start_reading(restore)) {
    release_tail_first(blocks_, restore.held);
    return false;
  }
  seq.ssd_restoring = true;
  if (seq.ssd_landed_blocks == 0) seq.ssd_first_block = best.first;
  restores_.push_back(std::move(restore));
  return true;
}

void TieredPrefixCache::start_remote_restore(Sequence& seq) {
  const int32_t bs = seq.block_table.block_size();
  const int32_t first = seq.num_computed / bs, shareable = (seq.num_tokens() - 1) / bs;
  if (!ssd_ || first >= shareable || share_remote_restore(seq)) return;
  Restore restore;
  restore.sequence_id = seq.id;
  // Only as many as leave room for the rest of the prompt.
  keys_to_restore(seq, first, shareable, std::numeric_limits<int32_t>::max(), restore.tokens,
                  restore.keys);
  if (!start_reading(restore)) return;
  // The table's own references; the restore keeps the allocation's until
  // its reads land, so an abort meanwhile cannot free blocks being written.
  for (const int32_t block : restore.fresh) seq.block_table.share(blocks_, block);
  count_remote_restore(seq, first, int32_t(restore.fresh.size()));
  restores_.push_back(std::move(restore));
}

std::pair<TieredPrefixCache::Restore*, int32_t> TieredPrefixCache::restore_reading(
    const BlockKey& wanted) {
  for (Restore& restore : restores_) {
    const auto key =
        std::ranges::find_if(restore.keys, [&](const BlockKey& k) { return same_key(k, wanted); });
    if (key != restore.keys.end()) return {&restore, int32_t(key - restore.keys.begin())};
  }
  return {nullptr, 0};
}

bool TieredPrefixCache::start_reading(Restore& restore) {
  if (restore.keys.empty()) return false;
  // Marked most recently used first: the blocks the allocation below evicts
  // from the pool are saved to the SSD tier, which must not make room for
  // them by dropping these.
  ssd_->touch(restore.keys);
  auto fresh = blocks_.allocate(int32_t(restore.keys.size()));
  if (!fresh.is_ok()) return false;
  restore.fresh = std::move(fresh).value();
  if (staging_ != nullptr) {
    restore.pinned = ssd_->pin(restore.keys);
    // No free slots: it starts once a load in flight gives some back.
    start_piece(restore);
    return true;
  }
  restore.reading = int32_t(restore.keys.size());
  restore.load = ssd_->start_load(restore.keys, pool_memory(), restore.fresh);
  return true;
}

bool TieredPrefixCache::start_piece(Restore& restore) {
  const int32_t n =
      std::min(int32_t(restore.keys.size()) - restore.landed, staging_->free_load_slots());
  if (n <= 0) return false;
  restore.slots = staging_->take_load_slots(n);
  restore.reading = n;
  restore.load =
      ssd_->start_load(std::span(restore.keys).subspan(size_t(restore.landed), size_t(n)),
                       staging_->memory(), restore.slots);
  return true;
}

bool TieredPrefixCache::share_remote_restore(Sequence& seq) {
  const int32_t bs = seq.block_table.block_size();
  const int32_t first = seq.num_computed / bs, shareable = (seq.num_tokens() - 1) / bs;
  const auto [other, first_key] = restore_reading(block_key(seq, first));
  if (other == nullptr) return false;
  // As far as its keys go on being the sequence's.
  int32_t n = 0;
  while (first + n < shareable && first_key + n < int32_t(other->keys.size()) &&
         same_key(other->keys[size_t(first_key + n)], block_key(seq, first + n)))
    ++n;
  for (int32_t i = 0; i < n; ++i)
    seq.block_table.share(blocks_, other->fresh[size_t(first_key + i)]);
  other->sharers.push_back({seq.id, first_key, n, first});
  count_remote_restore(seq, first, n);
  return true;
}

void TieredPrefixCache::count_remote_restore(Sequence& seq, int32_t first, int32_t blocks) {
  seq.ssd_restoring = true;
  seq.ssd_first_block = first;
  seq.ssd_restored_blocks = blocks;
  seq.num_computed = (first + blocks) * seq.block_table.block_size();
  seq.registered_blocks = first + blocks;  // registered when the reads land
}

void TieredPrefixCache::settle_remote_restore(Sequence& seq, int32_t first_block, int32_t blocks,
                                              int32_t restored) {
  seq.ssd_restoring = false;
  const int32_t landed = std::clamp(restored, 0, blocks);
  // Counted as they land (lookup_counts left them out).
  const int64_t landed_tokens = int64_t(landed) * seq.block_table.block_size();
  counters_.hit_tokens += landed_tokens;
  counters_.ssd_hit_tokens += landed_tokens;
  const int32_t lost = blocks - landed;
  if (lost == 0) return;
  seq.ssd_lost_from = first_block + blocks - lost;
  seq.ssd_restored_blocks -= lost;
}

bool TieredPrefixCache::settle_load(Restore& restore, int32_t restored) {
  restore.load = -1;
  const int32_t reading = std::exchange(restore.reading, 0);
  if (staging_ != nullptr) {
    // The verified blocks go from their slots into the pool; if that copy
    // fails, none of them counts as restored.
    const Status copied = staging_->copy_in(
        std::span(restore.slots).first(size_t(restored)),
        std::span(restore.fresh).subspan(size_t(restore.landed), size_t(restored)));
    staging_->give_back(restore.slots);
    restore.slots.clear();
    if (!copied.is_ok()) {
      spdlog::warn("ssd cache: copying {} blocks into {}: {}", restored, staging_->copier_name(),
                   copied.message());
      restored = 0;
    }
  }
  restore.landed += restored;
  return restored < reading || restore.landed == int32_t(restore.keys.size());
}

void TieredPrefixCache::finish(Restore& restore, const SequenceLookup& find,
                               std::vector<int64_t>& landed_owners) {
  const int32_t restored = restore.landed;
  ssd_->unpin(restore.pinned);
  // Registered and released, the restored blocks are cached and most
  // recently used: the sequence, admitted next, finds them with the
  // prefix before them. Blocks not restored are simply free again; an
  // aborted sequence's restored ones stay cached.
  for (int32_t i = 0; i < restored; ++i)
    blocks_.register_block(restore.fresh[size_t(i)], restore.keys[size_t(i)]);
  std::vector<int32_t> chain = restore.held;
  chain.insert(chain.end(), restore.fresh.begin(), restore.fresh.end());
  release_tail_first(blocks_, std::move(chain));
  if (Sequence* owner = find(restore.sequence_id)) {
    if (owner->awaiting_kv) {
      // A reservation's blocks that failed are not counted as hits.
      settle_remote_restore(*owner, owner->ssd_first_block, int32_t(restore.fresh.size()),
                            restored);
    } else {
      owner->ssd_restoring = false;
      owner->ssd_restore_failed |= restored < int32_t(restore.keys.size());
      owner->ssd_landed_blocks += restored;
      landed_owners.push_back(owner->id);
    }
  }
  for (const int64_t id : restore.waiters) {
    if (Sequence* waiter = find(id); waiter != nullptr && !waiter->awaiting_kv)
      waiter->ssd_restoring = false;
  }
  for (const Restore::Sharer& s : restore.sharers) {
    if (Sequence* sharer = find(s.sequence_id); sharer != nullptr && sharer->awaiting_kv)
      settle_remote_restore(*sharer, s.first_block, s.blocks, restored - s.first_key);
  }
}

std::vector<int64_t> TieredPrefixCache::land(bool wait, const SequenceLookup& find) {
  std::vector<int64_t> landed_owners;
  // A staged pool's pieces: each landed one gives its slots to the next
  // (of its restore or another waiting for slots), read without a wait
  // where the store reads as loads start.
  auto start_waiting_pieces = [&] {
    if (staging_ == nullptr) return;
    for (Restore& restore : restores_) {
      if (restore.load < 0 && !start_piece(restore)) return;
    }
  };
  start_waiting_pieces();
  for (bool wait_now = wait; !restores_.empty(); wait_now = false) {
    // A restore waits for slots only while loads in flight hold them all.
    BATON_CHECK(ssd_->loads_in_flight() > 0);
    const std::vector<SsdKvStore::LandedLoad> loads = ssd_->finish_loads(wait_now);
    if (loads.empty()) break;
    for (const SsdKvStore::LandedLoad& landed : loads) {
      const auto it =
          std::ranges::find_if(restores_, [&](const Restore& r) { return r.load == landed.id; });
      BATON_CHECK(it != restores_.end());
      if (!landed.result.problem.is_ok()) {
        spdlog::warn("ssd cache: {}; computing that block again", landed.result.problem.message());
      }
      if (!settle_load(*it, std::max(landed.result.restored, 0))) continue;
      finish(*it, find, landed_owners);
      restores_.erase(it);
    }
    // Only a staged pool's waiting pieces can start loads that land now.
    if (staging_ == nullptr) break;
    start_waiting_pieces();
  }
  return landed_owners;
}

}  // namespace baton::engine
