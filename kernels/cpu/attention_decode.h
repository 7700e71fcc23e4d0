// kernels/cpu/attention_decode.h — decode attention over one partition of a
// sequence's keys, for all its KV heads and the few query rows of a decode
// step, in two passes: every score of the partition first, one softmax over
// them, then the weighted sum of V. The AVX2 half-precision passes take the
// partition in runs of four blocks instead, each run's scores, an
// online-softmax step and its V rows in turn, so that K and V of the same
// blocks are read together.
//
// Why not the block-at-a-time online softmax of attention_block.h: with
// 16-token blocks and one query row, that kernel spends as long on per-block
// bookkeeping (max, rescale, exp of short rows) as on the dot products.
// Here the softmax runs once per partition (256 keys) over contiguous score
// rows, and the K tiles of a block feed every query head of their group.
// Block tables scatter blocks over the pool where no hardware prefetcher can
// follow, so the kernel prefetches its own reads as one paced stream, and
// the caller names where the next partition it will run starts, so the
// stream runs on into it instead of leaving memory idle at the seam.
#pragma once

#include <cstdint>

#include "kernels/cpu/attention.h"

namespace baton::kernels::cpu {

// The softmax state of a partition's query vectors, in the order attention.cc
// numbers them: vector i is KV head i / per_head, row (i % per_head) / group,
// group member i % group, with per_head = rows * group and group =
// num_heads / num_kv_heads.
struct PartitionState {
  float* row_max = nullptr;  // [n_q]; -inf for a vector that sees no key here
  float* row_sum = nullptr;  // [n_q]
  float* acc = nullptr;      // [n_q, head_dim], unnormalised
};

// True when attend_decode_partition serves this layout (AVX2, head_dim a
// multiple of 16 and block_size of 8; any dtype, the 8-bit formats' codes
// read in place); otherwise the caller uses the block-at-a-time kernel.
bool decode_partition_supported(const KvLayout& layout);

// True when attend_decode_partition takes this layout on its 512-bit
// passes: the CPU has AVX-512 (and for int8 KV VNNI, which its score pass
// takes) and head_dim fills their chunks. Otherwise it takes the AVX2
// passes.
bool decode_partition_avx512(const KvLayout& layout);
// E4M3 KV's 512-bit score pass: on VDPBF16PS against BF16 queries where
// the CPU has AVX-512 BF16 and VBMI and prefers VDPBF16PS (AMD,
// cpu_features.h; decode_scores_fp8.h), else widened to F32 for FMAs
// against the F32 queries (decode_scores_e4m3_fma.h).
bool e4m3_scores_on_fmas();

// Attends every query row of sequence `seq` (at most a few) over its keys
// [key_begin, key_end); key_begin is a multiple of the block size and
// key_end <= context_lens[seq]. Row j sits at position
// context_len - q_len + j and sees keys up to it. Writes n_q = q_len *
// num_heads vectors of `state`. `then`, when not null, is the first block
// (in this layer) of the partition the caller will likely run next: its K
// part is prefetched, never read.
void attend_decode_partition(const PagedAttentionParams& p, int32_t seq, int32_t key_begin,
                             int32_t key_end, const PartitionState& state,
                             const void* then = nullptr);

// The first block of keys [key_begin, ...) of `seq` in this layer: what to
// pass as `then` for that partition.
const void* decode_partition_start(const PagedAttentionParams& p, int32_t seq, int32_t key_begin);

}  // namespace baton::kernels::cpu
