// Paged GQA attention on the CPU.
//
// Work is planned as a list of items, each one (sequence, run of KV heads, run
// of query rows, run of keys): the query vectors of an item are all the query
// heads of each KV head's group for those rows, so K and V are read once per
// group.
//  * Prefill rows are tiled by kQueryVectorsPerTile / group rows (more where
//    the block is converted first or the tiles of attention_amx.h take the
//    sequence), one KV head per item; the key run is the causal prefix [0,
//    last row's position].
//  * Decode rows (and very short query runs) take all KV heads of a block in
//    one item, so each block is read as one contiguous run of memory (per
//    head, a tile is only 2-4 KiB), and run the two-pass partition kernel of
//    attention_decode.h where it applies. A context longer than kDecodePartitionTokens is
//    split over the keys (flash-decoding), so a single long sequence still
//    keeps every core busy; partial softmax states are merged in a second
//    pass. The partition size is fixed, so results do not depend on the
//    batch or the thread count.
// Items run with dynamic scheduling (largest first) since their costs differ.
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/check.h"
#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/attention_block.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/parallel.h"

namespace baton::kernels::cpu {
namespace {

// Query vectors (rows x group heads) per prefill tile: enough to amortise the
// conversion of each K/V block, few enough that the accumulators stay in L1.
constexpr int32_t kQueryVectorsPerTile = 32;
// The same where each K/V block is converted for the tile (the 8-bit
// formats, dequantized): a sequence's blocks are converted once per tile of
// its rows, and a conversion costs more than the tile's pass over the
// block, so the tiles are larger (the accumulators then live in L2).
constexpr int32_t kQueryVectorsPerConvertedTile = 256;
// The same on AMX tiles (attention_amx.h): each chunk of keys is interleaved
// for the tiles once per item, and the tiles take 16 query vectors at a time.
constexpr int32_t kQueryVectorsPerAmxTile = 128;
// Query runs up to this many rows are split over keys like decode rows.
constexpr int32_t kMaxSplitRows = 4;
// Block sizes the engine accepts (engine.block_size is a power of two up
// to 256): the most rows a dequantized tile holds.
constexpr int32_t kMaxDequantizedKeys = 256;

struct WorkItem {
  int32_t seq;
  int32_t kv_begin;  // KV heads [kv_begin, kv_end)
  int32_t kv_end;
  int32_t row_begin;  // rows of the sequence, relative to query_start[seq]
  int32_t row_end;
  int32_t key_begin;  // a multiple of block_size
  int32_t key_end;
  int64_t partial_offset;  // floats into the partial buffer, or -1: write `out` directly
  int64_t cost;
  bool decode = false;  // all rows (at most kMaxSplitRows) and all KV heads of the sequence
};

// Items whose partial results merge into the output of one sequence's rows.
struct MergeGroup {
  int32_t seq;
  int32_t num_rows;
  int32_t first_item;  // items [first_item, first_item + num_parts) in plan order
  int32_t num_parts;
};

struct Scratch {
  std::vector<float> q, k, v, scores, alpha, row_max, row_sum, acc;
  std::vector<int32_t> visible, hidden;
};

int32_t round_up(int32_t x, int32_t m) { return (x + m - 1) / m * m; }

// Blocks are scattered over the pool, so the hardware prefetcher cannot
// foresee the next one: without help every block starts with a full DRAM
// latency. We ask for the item's K and V runs this many blocks ahead.
constexpr int32_t kPrefetchBlocksAhead = 4;

void prefetch_block(const PagedAttentionParams& p, int32_t block, int32_t kv_begin,
                    int32_t kv_end) {
  const KvLayout& L = p.layout;
  const size_t run_bytes = size_t(kv_end - kv_begin) * L.head_tile_elements() * L.element_bytes();
  for (KvPart part : {KvPart::kKey, KvPart::kValue}) {
    const char* run = static_cast<const char*>(p.kv_pool) +
                      L.head_tile_offset(p.layer, block, part, kv_begin) * L.element_bytes();
    for (size_t off = 0; off < run_bytes; off += kCacheLine) __builtin_prefetch(run + off, 0, 3);
  }
}

// The scale of each of the `keys` rows of a quantized block's (part, head)
// tile, into scales[0, keys).
void load_row_scales(const PagedAttentionParams& p, int32_t block, KvPart part, int32_t kv_head,
                     int32_t keys, float* scales) {
  const char* src = static_cast<const char*>(p.kv_pool) +
                    p.layout.scale_byte_offset(p.layer, block, part, kv_head, 0);
  std::memcpy(scales, src, size_t(keys) * sizeof(float));
}

// One block's K or V tile of `keys` tokens, as attend_block will read it
// (AttentionBlockArgs): in place, in the pool's dtype, where attend_block
// reads the pool; otherwise converted (quantized rows: dequantized) to F32
// in `buffer`, K with one dimension per group ([head_dim][keys_padded],
// *k_group_stride = keys_padded) and V as rows ([keys_padded][head_dim]),
// zero past `keys` (pool slots past the context may hold anything, NaN
// included).
// k_group_stride is set for K only (null for V).
const void* load_tile(const PagedAttentionParams& p, int32_t block, KvPart part, int32_t kv_head,
                      int32_t keys, int32_t keys_padded, float* buffer, DType* dtype,
                      size_t* k_group_stride) {
  const KvLayout& L = p.layout;
  const size_t offset = L.head_tile_offset(p.layer, block, part, kv_head);
  const char* src = static_cast<const char*>(p.kv_pool) + offset * L.element_bytes();
  const int32_t d = L.head_dim;
  if (attend_block_reads_pool(d, L.block_size, L.dtype)) {
    *dtype = L.dtype;
    if (k_group_stride) *k_group_stride = L.key_group_stride();
    return src;
  }
  *dtype = DType::kF32;
  const bool quantized = is_quantized(L.dtype);
  BATON_CHECK(!quantized || keys <= kMaxDequantizedKeys);
  float scales[kMaxDequantizedKeys];
  if (quantized) load_row_scales(p, block, part, kv_head, keys, scales);
  if (part == KvPart::kValue) {
    convert_to_f32(src, L.dtype, int64_t(keys) * d, buffer);
    if (quantized) {
      for (int32_t t = 0; t < keys; ++t)
        for (int32_t c = 0; c < d; ++c) buffer[size_t(t) * d + size_t(c)] *= scales[t];
    }
    std::fill(buffer + size_t(keys) * d, buffer + size_t(keys_padded) * d, 0.0f);
    return buffer;
  }
  const int32_t g = L.key_group();
  if (quantized) {
    // A group's g dimensions of each key side by side: one pass per group,
    // each code looked up (E4M3) or widened (int8) once, times its scale.
    const float* values = L.dtype == DType::kFP8E4M3 ? e4m3_values().data() : nullptr;
    for (int32_t c0 = 0; c0 < d; c0 += g) {
      const auto* codes = reinterpret_cast<const uint8_t*>(src) + L.key_dim_offset(c0);
      for (int32_t t = 0; t < keys; ++t)
        for (int32_t e = 0; e < g && c0 + e < d; ++e) {
          const uint8_t code = codes[size_t(t) * size_t(g) + size_t(e)];
          buffer[size_t(c0 + e) * keys_padded + size_t(t)] =
              (values ? values[code] : float(int8_t(code))) * scales[t];
        }
    }
    for (int32_t c = 0; c < d; ++c) {
      float* row = buffer + size_t(c) * keys_padded;
      std::fill(row + keys, row + keys_padded, 0.0f);
    }
    *k_group_stride = size_t(keys_padded);
    return buffer;
  }
  for (int32_t c = 0; c < d; ++c) {
    float* row = buffer + size_t(c) * keys_padded;
    const size_t dim = L.key_dim_offset(c);
    for (int32_t t = 0; t < keys; ++t)
      row[t] = load_as_float(src, L.dtype, dim + size_t(t) * size_t(g));
    std::fill(row + keys, row + keys_padded, 0.0f);
  }
  *k_group_stride = size_t(keys_padded);
  return buffer;
}

// Query vector i of an item with `rows` rows is, with per_head = rows * group:
// KV head kv_begin + i / per_head, row (i % per_head) / group, query head
// (kv_begin + i / per_head) * group + i % group. Returns its slot in `out`.
float* output_vector(const PagedAttentionParams& p, int32_t first_row, int32_t rows,
                     int32_t kv_begin, int32_t i) {
  const int32_t group = p.num_heads / p.layout.num_kv_heads;
  const int32_t per_head = rows * group;
  const int32_t h = kv_begin + i / per_head;
  const int32_t r = (i % per_head) / group;
  const int32_t g = i % group;
  return static_cast<float*>(p.out) +
         (size_t(first_row + r) * p.num_heads + size_t(h * group + g)) * p.layout.head_dim;
}

// The block-at-a-time kernel: any item, any layout.
void attend_item_tiled(const PagedAttentionParams& p, const WorkItem& item, Scratch& sc) {
  const KvLayout& L = p.layout;
  const int32_t d = L.head_dim;
  const int32_t bs = L.block_size;
  const int32_t group = p.num_heads / L.num_kv_heads;
  const int32_t rows = item.row_end - item.row_begin;
  const int32_t per_head = rows * group;
  const int32_t n_q = per_head * (item.kv_end - item.kv_begin);
  const int32_t q_len = p.query_start[item.seq + 1] - p.query_start[item.seq];
  const int32_t ctx = p.context_lens[item.seq];
  const int32_t first_row = p.query_start[item.seq] + item.row_begin;
  const int32_t keys_padded_max = round_up(bs, 8);

  sc.q.resize(size_t(n_q) * d);
  sc.acc.assign(size_t(n_q) * d, 0.0f);
  sc.row_max.assign(size_t(n_q), kNegInf);
  sc.row_sum.assign(size_t(n_q), 0.0f);
  sc.alpha.resize(size_t(n_q));
  sc.visible.resize(size_t(per_head));
  sc.hidden.resize(size_t(per_head));
  sc.scores.resize(size_t(per_head) * keys_padded_max);
  sc.k.resize(size_t(keys_padded_max) * d);
  sc.v.resize(size_t(keys_padded_max) * d);

  for (int32_t h = item.kv_begin; h < item.kv_end; ++h)
    for (int32_t r = 0; r < rows; ++r) {
      // The group's query heads of one row are adjacent in q.
      const float* src = static_cast<const float*>(p.q) +
                         (size_t(first_row + r) * p.num_heads + size_t(h) * group) * d;
      float* dst = sc.q.data() + (size_t(h - item.kv_begin) * per_head + size_t(r) * group) * d;
      for (int32_t c = 0; c < group * d; ++c) dst[c] = src[c] * p.scale;
    }
  const int32_t* table = p.block_tables + size_t(item.seq) * p.block_table_stride;
  const int32_t first_block = item.key_begin / bs;
  const int32_t end_block = (item.key_end + bs - 1) / bs;
  for (int32_t b = first_block; b < std::min(end_block, first_block + kPrefetchBlocksAhead); ++b)
    prefetch_block(p, table[b], item.kv_begin, item.kv_end);
  for (int32_t kb = item.key_begin; kb < item.key_end; kb += bs) {
    if (kb / bs + kPrefetchBlocksAhead < end_block)
      prefetch_block(p, table[kb / bs + kPrefetchBlocksAhead], item.kv_begin, item.kv_end);
    const int32_t keys = std::min(bs, item.key_end - kb);
    const int32_t keys_padded = round_up(keys, 8);
    const int32_t block = table[kb / bs];
    for (int32_t r = 0; r < rows; ++r) {
      // Row r sits at position ctx - q_len + row; it sees keys up to itself
      // (and under a sliding window, none before its window).
      const int32_t pos = ctx - q_len + item.row_begin + r;
      const int32_t visible = std::clamp(pos + 1 - kb, 0, keys);
      const int32_t hidden = std::clamp(first_seen_key(pos, p.window) - kb, 0, keys);
      for (int32_t g = 0; g < group; ++g) {
        sc.visible[size_t(r) * group + g] = visible;
        sc.hidden[size_t(r) * group + g] = hidden;
      }
    }
    for (int32_t h = item.kv_begin; h < item.kv_end; ++h) {
      const size_t first = size_t(h - item.kv_begin) * per_head;
      AttentionBlockArgs a;
      a.q = sc.q.data() + first * d;
      a.n_q = per_head;
      a.head_dim = d;
      DType k_dtype, v_dtype;
      a.k = load_tile(p, block, KvPart::kKey, h, keys, keys_padded, sc.k.data(), &k_dtype,
                      &a.k_group_stride);
      a.v =
          load_tile(p, block, KvPart::kValue, h, keys, keys_padded, sc.v.data(), &v_dtype, nullptr);
      a.kv_dtype = k_dtype;  // both tiles take the same branch of load_tile
      a.keys_padded = keys_padded;
      a.visible = sc.visible.data();
      a.hidden = p.window > 0 ? sc.hidden.data() : nullptr;
      a.scores = sc.scores.data();
      a.alpha = sc.alpha.data() + first;
      a.row_max = sc.row_max.data() + first;
      a.row_sum = sc.row_sum.data() + first;
      a.acc = sc.acc.data() + first * d;
      attend_block(a);
    }
  }
}

// True when a prefill item runs on AMX tiles (one KV head, as the plan
// makes them).
bool takes_amx(const PagedAttentionParams& p, const WorkItem& item) {
  return !item.decode && item.kv_end - item.kv_begin == 1 &&
         attention_takes_amx(p.layout, p.query_start[item.seq + 1] - p.query_start[item.seq]);
}

// Runs one item; `following` is the item this thread will most likely run
// next (where the decode kernel's prefetching ends), or null.
void run_item(const PagedAttentionParams& p, const WorkItem& item, const WorkItem* following,
              float* partials, Scratch& sc) {
  const int32_t d = p.layout.head_dim;
  const int32_t rows = item.row_end - item.row_begin;
  const int32_t n_q = rows * (p.num_heads / p.layout.num_kv_heads) * (item.kv_end - item.kv_begin);
  const int32_t first_row = p.query_start[item.seq] + item.row_begin;
  if (item.decode && decode_partition_supported(p.layout)) {
    sc.row_max.resize(size_t(n_q));
    sc.row_sum.resize(size_t(n_q));
    sc.acc.resize(size_t(n_q) * d);
    const void* then = following && following->decode
                           ? decode_partition_start(p, following->seq, following->key_begin)
                           : nullptr;
    attend_decode_partition(p, item.seq, item.key_begin, item.key_end,
                            {sc.row_max.data(), sc.row_sum.data(), sc.acc.data()}, then);
  } else if (takes_amx(p, item)) {
#if defined(__x86_64__)
    sc.row_max.resize(size_t(n_q));
    sc.row_sum.resize(size_t(n_q));
    sc.acc.resize(size_t(n_q) * d);
    attend_rows_amx(p, item.seq, item.kv_begin, item.row_begin, item.row_end, item.key_begin,
                    item.key_end, {sc.row_max.data(), sc.row_sum.data(), sc.acc.data()});
#endif
  } else {
    attend_item_tiled(p, item, sc);
  }

  if (item.partial_offset < 0) {
    for (int32_t i = 0; i < n_q; ++i) {
      float* dst = output_vector(p, first_row, rows, item.kv_begin, i);
      const float inv = sc.row_sum[i] > 0.0f ? 1.0f / sc.row_sum[i] : 0.0f;
      const float* acc = sc.acc.data() + size_t(i) * d;
      for (int32_t c = 0; c < d; ++c) dst[c] = acc[c] * inv;
    }
  } else {
    // Partial layout: [n_q] maxima, [n_q] sums, [n_q, head_dim] accumulators.
    float* dst = partials + item.partial_offset;
    std::copy(sc.row_max.begin(), sc.row_max.end(), dst);
    std::copy(sc.row_sum.begin(), sc.row_sum.end(), dst + n_q);
    std::copy(sc.acc.begin(), sc.acc.end(), dst + 2 * n_q);
  }
}

// Combines the partitions' softmax states: out = Σ e^(m_p - M) acc_p / Σ e^(m_p - M) l_p.
// Every part of a group covers the same heads and rows (all KV heads, all rows).
void merge_group(const PagedAttentionParams& p, const MergeGroup& mg,
                 const std::vector<WorkItem>& items, const float* partials) {
  const int32_t d = p.layout.head_dim;
  const int32_t n_q = mg.num_rows * p.num_heads;
  const int32_t first_row = p.query_start[mg.seq];
  for (int32_t i = 0; i < n_q; ++i) {
    float global_max = kNegInf;
    for (int32_t j = 0; j < mg.num_parts; ++j)
      global_max = std::max(global_max, partials[items[mg.first_item + j].partial_offset + i]);
    float* dst = output_vector(p, first_row, mg.num_rows, 0, i);
    std::fill(dst, dst + d, 0.0f);
    if (global_max == kNegInf) continue;
    float total = 0.0f;
    for (int32_t j = 0; j < mg.num_parts; ++j) {
      const float* part = partials + items[mg.first_item + j].partial_offset;
      if (part[i] == kNegInf) continue;
      const float w = std::exp(part[i] - global_max);
      total += w * part[n_q + i];
      const float* acc = part + 2 * n_q + size_t(i) * d;
      for (int32_t c = 0; c < d; ++c) dst[c] += w * acc[c];
    }
    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
    for (int32_t c = 0; c < d; ++c) dst[c] *= inv;
  }
}

}  // namespace

RowScale row_scale(DType dtype, const float* row, int32_t n) {
  if (!is_quantized(dtype)) return {1.0f, 1.0f};
  float amax = 0.0f;
  bool nan = false;
  for (int32_t c = 0; c < n; ++c) {
    amax = std::max(amax, std::abs(row[c]));
    nan = nan || std::isnan(row[c]);
  }
  // A row with a NaN reads back as NaN, as it would unquantized (its codes
  // are 0, its scale NaN). A row too small for its inverse to be finite
  // (below about 1e-36) stores as a zero row: zero codes, scale 0.
  if (nan) return {std::numeric_limits<float>::quiet_NaN(), 0.0f};
  const float qmax = quantized_max(dtype);
  const float inverse = amax > 0.0f ? qmax / amax : 0.0f;
  if (!std::isfinite(inverse) || inverse == 0.0f) return {0.0f, 0.0f};
  return {amax / qmax, inverse};
}

void store_kv(ThreadPool& pool, const KvLayout& layout, void* kv_pool, int32_t layer,
              const float* k, const float* v, const int32_t* slot_mapping, int64_t num_tokens) {
  const int32_t heads = layout.num_kv_heads;
  const int32_t d = layout.head_dim;
  const int64_t per_token = int64_t(heads) * d;
  parallel_chunks(
      pool, num_tokens, std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(1, per_token)),
      [&](int64_t t0, int64_t t1, int) {
        for (int64_t t = t0; t < t1; ++t) {
          const int32_t slot = slot_mapping[t];
          if (slot < 0) continue;  // padding token: nothing to store
          const int32_t block = slot / layout.block_size;
          const int32_t offset = slot % layout.block_size;
          for (int32_t h = 0; h < heads; ++h) {
            const float* ks = k + t * per_token + int64_t(h) * d;
            const float* vs = v + t * per_token + int64_t(h) * d;
            // The key goes out one group per row of the K tile; the value
            // as one row. A quantized row goes out as codes of row / scale,
            // its scale beside the block's tiles.
            const RowScale k_scale = row_scale(layout.dtype, ks, d);
            const RowScale v_scale = row_scale(layout.dtype, vs, d);
            if (is_quantized(layout.dtype)) {
              char* base = static_cast<char*>(kv_pool);
              std::memcpy(base + layout.scale_byte_offset(layer, block, KvPart::kKey, h, offset),
                          &k_scale.scale, sizeof(float));
              std::memcpy(base + layout.scale_byte_offset(layer, block, KvPart::kValue, h, offset),
                          &v_scale.scale, sizeof(float));
            }
            const size_t ko = layout.key_offset(layer, block, h, offset, 0);
            const size_t vo = layout.value_offset(layer, block, h, offset);
            for (int32_t c = 0; c < d; ++c) {
              store_from_float(kv_pool, layout.dtype, ko + layout.key_dim_offset(c),
                               ks[c] * k_scale.inverse);
              store_from_float(kv_pool, layout.dtype, vo + size_t(c), vs[c] * v_scale.inverse);
            }
          }
        }
      });
}

DType decode_query_format(const KvLayout& layout, int32_t q_len) {
  if (!is_quantized(layout.dtype) || q_len > kMaxSplitRows || !decode_partition_supported(layout))
    return DType::kF32;
  if (layout.dtype == DType::kI8) return DType::kI8;  // AVX2 and VNNI alike
  return decode_partition_avx512(layout) && !e4m3_scores_on_fmas() ? DType::kBF16 : DType::kF32;
}

void paged_attention(ThreadPool& pool, const PagedAttentionParams& p) {
  const KvLayout& L = p.layout;
  if (p.num_seqs <= 0 || L.num_kv_heads <= 0 || p.num_heads <= 0) return;
  const int32_t group = p.num_heads / L.num_kv_heads;
  const int32_t bs = L.block_size;
  const int32_t d = L.head_dim;
  const int32_t tile_vectors = attend_block_reads_pool(d, bs, L.dtype)
                                   ? kQueryVectorsPerTile
                                   : kQueryVectorsPerConvertedTile;
  const int32_t partition = round_up(kDecodePartitionTokens, bs);

  std::vector<WorkItem> items;
  std::vector<MergeGroup> merges;
  int64_t partial_floats = 0;
  for (int32_t s = 0; s < p.num_seqs; ++s) {
    const int32_t q_len = p.query_start[s + 1] - p.query_start[s];
    const int32_t ctx = p.context_lens[s];
    if (q_len <= 0) continue;
    // Keys before the first row's window are never read: the key runs
    // start at the block that holds its first key.
    const int32_t first_block_key = first_seen_key(ctx - q_len, p.window) / bs * bs;
    if (q_len <= kMaxSplitRows) {
      const int32_t n_q = q_len * p.num_heads;
      if (ctx - first_block_key <= partition) {
        items.push_back({s, 0, L.num_kv_heads, 0, q_len, first_block_key, std::max(ctx, 0), -1,
                         int64_t(n_q) * std::max(ctx - first_block_key, 1), true});
        continue;
      }
      MergeGroup mg{s, q_len, int32_t(items.size()), 0};
      for (int32_t k0 = first_block_key; k0 < ctx; k0 += partition) {
        const int32_t k1 = std::min(ctx, k0 + partition);
        items.push_back({s, 0, L.num_kv_heads, 0, q_len, k0, k1, partial_floats,
                         int64_t(n_q) * (k1 - k0), true});
        partial_floats += int64_t(n_q) * (d + 2);
        ++mg.num_parts;
      }
      merges.push_back(mg);
      continue;
    }
    const int32_t rows_per_tile = std::max(
        1, (attention_takes_amx(L, q_len) ? kQueryVectorsPerAmxTile : tile_vectors) / group);
    for (int32_t r0 = 0; r0 < q_len; r0 += rows_per_tile) {
      const int32_t r1 = std::min(q_len, r0 + rows_per_tile);
      const int32_t key_end = std::clamp(ctx - q_len + r1, 0, ctx);
      const int32_t key_begin = first_seen_key(ctx - q_len + r0, p.window) / bs * bs;
      for (int32_t h = 0; h < L.num_kv_heads; ++h)
        items.push_back({s, h, h + 1, r0, r1, key_begin, key_end, -1,
                         int64_t(r1 - r0) * group * std::max(key_end - key_begin, 1)});
    }
  }
  if (items.empty()) return;

  thread_local std::vector<float> partials;
  partials.resize(size_t(partial_floats));
  // Largest first, so the last items to start are the short ones.
  std::vector<int32_t> order(items.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = int32_t(i);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return items[a].cost > items[b].cost; });
  std::atomic<size_t> next{0};
  float* partial_data = partials.data();
  const int64_t workers = std::min<int64_t>(pool.size(), int64_t(items.size()));
  pool.parallel_for(workers, [&](int64_t, int64_t, int) {
    thread_local Scratch scratch;
    // The decode kernel prefetches where the item after this one starts: the
    // next unclaimed one, which this thread will most likely take on two
    // cores (with more, whichever finishes first; a wrong guess costs one K
    // part of prefetching). Claiming it now would make that certain, but with
    // few items (a 513-token context is 256 + 256 + 1 tokens) the first
    // thread would take both large ones and leave the other the single token.
    for (size_t i; (i = next.fetch_add(1, std::memory_order_relaxed)) < order.size();) {
      const size_t likely_next = next.load(std::memory_order_relaxed);
      run_item(p, items[order[i]],
               likely_next < order.size() ? &items[order[likely_next]] : nullptr, partial_data,
               scratch);
    }
  });
  if (!merges.empty()) {
    parallel_chunks(pool, int64_t(merges.size()), 4, [&](int64_t m0, int64_t m1, int) {
      for (int64_t m = m0; m < m1; ++m) merge_group(p, merges[m], items, partial_data);
    });
  }
}

}  // namespace baton::kernels::cpu
