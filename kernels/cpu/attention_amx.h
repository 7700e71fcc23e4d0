// kernels/cpu/attention_amx.h — prefill attention over a BF16 or 8-bit KV
// cache on AMX tiles (Intel Sapphire Rapids and later): the block kernel's
// online softmax (attention_block.h) with both products on TDPBF16PS.
//
// Keys go 32 at a time. The scores are queries (16 per tile, rounded to
// BF16 once) times K tiles read in place: the pool keeps a BF16 key's
// dimension pairs side by side and 16 keys of a pair adjacent
// (common/kv_layout.h), which is the layout AMX's second operand wants. The
// probabilities, rounded to BF16, times the chunk's V rows, interleaved in
// pairs of keys, give the chunk's outputs; they join the running sums in
// F32. Rounding queries and probabilities to BF16 is what GPU flash
// attention does, and the same step's GEMMs round x alike
// (linear_rounds_x_to_bf16 in linear.h), so a sequence takes this path only
// where they do: prefill runs of more than kAmxAttentionMinRows - 1 rows.
// An 8-bit cache's keys and values are dequantized (code times scale, in
// F32) and rounded to BF16 for the tiles, a chunk at a time.
#pragma once

#include <cstdint>

#include "kernels/attention_params.h"

namespace baton::kernels::cpu {

// Rows of one sequence in one step from which attention takes the tiles.
inline constexpr int32_t kAmxAttentionMinRows = 33;

// True when paged_attention takes the q_len rows of a sequence over
// `layout` on AMX tiles: the CPU has them (use_amx_bf16()), the cache is
// BF16, int8 or E4M3 with keys grouped, head_dim and block_size multiples of 32 and 16,
// and q_len at least kAmxAttentionMinRows.
bool attention_takes_amx(const KvLayout& layout, int32_t q_len);

// The online-softmax state of n_q query vectors: as attention.cc keeps it,
// updated in place (row_max -inf and the rest 0 before the first key).
struct SoftmaxState {
  float* row_max = nullptr;  // [n_q]
  float* row_sum = nullptr;  // [n_q]
  float* acc = nullptr;      // [n_q, head_dim], unnormalised output
};

#if defined(__x86_64__)

// Attends rows [row_begin, row_end) of sequence `seq` (relative to its
// first row this step) against its keys [key_begin, key_end) (key_begin a
// multiple of the block size) of KV head `kv_head`, causally and under the
// params' window. Query vector i of the state is row i / group, query head
// kv_head * group + i % group. Call only where attention_takes_amx() says
// so; the calling thread's tiles are configured on entry and released on
// return.
void attend_rows_amx(const PagedAttentionParams& p, int32_t seq, int32_t kv_head, int32_t row_begin,
                     int32_t row_end, int32_t key_begin, int32_t key_end, SoftmaxState state);

#endif

}  // namespace baton::kernels::cpu
