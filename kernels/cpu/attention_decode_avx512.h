// kernels/cpu/attention_decode_avx512.h — the V pass of BF16 decode
// attention (attention_decode.cc) with AVX-512 BF16 dot products.
//
// VDPBF16PS multiplies pairs of BF16 values and adds both products to one
// F32 lane: twice the multiplies per instruction of an F32 FMA, with V used
// as stored, no widening to F32.
//
// Precision: a probability rounded to BF16 would be off by up to 2^-9 of
// itself, and the output by as much. So each is split as p = hi + lo, two
// BF16 values whose sum holds 16 significant bits (within 2^-17 of p), and
// both halves are multiplied: twice the dot products, the same multiplies
// per instruction as an F32 FMA, and still no conversion of V.
//
// The pair runs along the keys: a lane takes v[t][c] p[t] + v[t+1][c]
// p[t+1], so the rows of two keys are interleaved (one unpack per 32 columns
// of each) and the probabilities of the two keys are broadcast as one 32-bit
// pair.
//
// It runs where VDPBF16PS is preferred (use_avx512_bf16(): AMD's cores issue
// it faster than their 512-bit FMAs), with the AVX2 score pass
// (key_tile_scores.h). Elsewhere AVX-512 machines run both passes with F32
// FMAs (decode_tiles_avx512.h): an Intel Xeon issues a quarter as many
// VDPBF16PS as FMAs, and this pass took 1.6 times as long there. A
// VDPBF16PS score pass (16 keys' BF16 pairs against a broadcast query pair)
// is not written: it would need the query split in two halves as well.
#pragma once

#include <cstdint>

#include "kernels/cpu/prefetch_stream.h"

namespace baton::kernels::cpu {

// Columns one dot product of the V pass spans: a 512-bit register of V pairs.
inline constexpr int32_t kPvAvx512Columns = 32;
// The most query vectors one tile call of the V pass serves.
inline constexpr int32_t kAvx512MaxQueries = 3;

// Where column j (0..31) of a 32-column chunk sits among the chunk's
// accumulators: the unpacks take columns 0-3 of each 128-bit lane into the
// first register and 4-7 into the second.
constexpr int32_t pv_avx512_slot(int32_t j) { return (j % 8 >= 4 ? 16 : 0) + (j / 8) * 4 + j % 4; }

#if defined(__x86_64__) || defined(__i386__)

// One score row of a partition, s[0, visible), through a softmax relative
// to its own max, written as two BF16 halves of the probabilities for the
// V pass: hi[t] + lo[t] = exp(s[t] - max) to 16 significant bits for
// t < visible, 0 for t in [visible, n). *row_max = that max (-inf when
// visible is 0) and *row_sum = the sum of the F32 probabilities. Call only
// when use_avx512_bf16().
void softmax_split_bf16(const float* s, int32_t visible, int32_t n, float* row_max, float* row_sum,
                        uint16_t* hi, uint16_t* lo);

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
