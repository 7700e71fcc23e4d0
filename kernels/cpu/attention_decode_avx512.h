// kernels/cpu/attention_decode_avx512.h — the score and V passes of BF16
// decode attention (attention_decode.cc) with AVX-512 BF16 dot products.
//
// VDPBF16PS multiplies pairs of BF16 values and adds both products to one
// F32 lane: twice the multiplies per instruction of an F32 FMA, with K and V
// used as stored, no widening to F32.
//
// Precision: a query or probability rounded to BF16 would be off by up to
// 2^-9 of itself, and a score or the output by as much (scores then go
// through exp). So each is split as x = hi + lo, two BF16 values whose sum
// holds 16 significant bits (within 2^-17 of x), and both halves are
// multiplied: twice the dot products, the same multiplies per instruction as
// an F32 FMA, and still no conversion of K or V.
//
// Scores: a lane pairs two dimensions of one key, so a key's dot product is
// spread over lanes and must be summed across them. Each register holds 16
// dimensions of two keys (one per 256-bit half) against the query's 16
// dimensions repeated in both halves: a key's sum then spans 8 lanes, not 16,
// and one reduction serves eight keys.
//
// V: the pair runs along the keys: a lane takes v[t][c] p[t] + v[t+1][c]
// p[t+1], so the rows of two keys are interleaved (one unpack per 32 columns
// of each) and the probabilities of the two keys are broadcast as one 32-bit
// pair.
#pragma once

#include <cstdint>

#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

// Dimensions of one key in a register of the score pass: head_dim must be a
// multiple.
inline constexpr int32_t kScoresAvx512Dims = 16;
// Columns one dot product of the V pass spans: a 512-bit register of V pairs.
inline constexpr int32_t kPvAvx512Columns = 32;
// The most query vectors one tile call of either pass serves.
inline constexpr int32_t kAvx512MaxQueries = 3;

// Where column j (0..31) of a 32-column chunk sits among the chunk's
// accumulators: the unpacks take columns 0-3 of each 128-bit lane into the
// first register and 4-7 into the second.
constexpr int32_t pv_avx512_slot(int32_t j) { return (j % 8 >= 4 ? 16 : 0) + (j / 8) * 4 + j % 4; }

#if defined(__x86_64__) || defined(__i386__)

// dst[c + j] = src[c + pv_avx512_slot(j)] for each chunk c of 32 columns of
// `rows` rows of d columns (d a multiple of kPvAvx512Columns): accumulators
// of tile_pv_bf16_avx512 back to column order. Call only when
// use_avx512_bf16().
void pv_avx512_to_column_order(const float* src, int32_t rows, int32_t d, float* dst);

// One score row of a partition, s[0, visible), through a softmax relative
// to its own max, written as two BF16 halves of the probabilities for the
// V pass: hi[t] + lo[t] = exp(s[t] - max) to 16 significant bits for
// t < visible, 0 for t in [visible, n). *row_max = that max (-inf when
// visible is 0) and *row_sum = the sum of the F32 probabilities. Call only
// when use_avx512_bf16().
void softmax_split_bf16(const float* s, int32_t visible, int32_t n, float* row_max, float* row_sum,
                        uint16_t* hi, uint16_t* lo);

// A query vector (d floats, d a multiple of kScoresAvx512Dims) split the same
// way, each 16-dimension chunk written twice in a row (the two halves
// of a register): 2 d values each for hi and lo.
void split_query_bf16(const float* q, int32_t d, uint16_t* hi, uint16_t* lo);

// s[r * s_stride + t] = q_r · k_t for `queries` (1..kAvx512MaxQueries) query
// vectors r, given by split_query_bf16's halves at q_hi/q_lo + r * 2 d, and
// keys t in [0, n) of one K tile ([n][d] BF16). Only the n keys asked for are
// read. Call only when use_avx512_bf16().
void tile_scores_bf16_avx512(int32_t queries, const uint16_t* q_hi, const uint16_t* q_lo, int32_t d,
                             const void* k, int32_t n, float* s, int32_t s_stride,
                             PrefetchStream& stream);

// acc_r[c] += Σ_t p_r[t] v[t][c] for `queries` (1..kAvx512MaxQueries)
// query vectors r and keys t in [0, n) of one V tile ([n][d] BF16, d a
// multiple of kPvAvx512Columns). p_r is given by its halves p_hi/p_lo at
// r * p_stride; they are read up to index n (one past a tile of odd n), which
// must be addressable and finite. acc_r is at acc + r * d in pv_avx512_slot
// order within each chunk of 32 columns. Call only when use_avx512_bf16().
void tile_pv_bf16_avx512(int32_t queries, const uint16_t* p_hi, const uint16_t* p_lo,
                         int32_t p_stride, const void* v, int32_t d, int32_t n, float* acc,
                         PrefetchStream& stream);

#endif

}  // namespace baton::kernels::cpu
