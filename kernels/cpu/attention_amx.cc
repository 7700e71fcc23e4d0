#include "kernels/cpu/attention_amx.h"

#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/simd_avx512.h"
#endif

namespace baton::kernels::cpu {

bool attention_takes_amx(const KvLayout& layout, int32_t q_len) {
  const bool format = layout.dtype == DType::kBF16 || is_quantized(layout.dtype);
  return q_len >= kAmxAttentionMinRows && format && layout.key_order == KeyOrder::kGrouped &&
         layout.head_dim % 32 == 0 && layout.block_size % 16 == 0 && use_amx_bf16();
}

#if defined(__x86_64__)
namespace {

// Keys per chunk: two tiles' depth of key pairs in the V product, so each
// of its output tiles takes two multiplies per store.
constexpr int32_t kChunkKeys = 128;
// Keys of one score tile's columns (a K tile's 16 keys), and of one V tile's
// depth (16 pairs).
constexpr int32_t kTileKeys = 16;
constexpr int32_t kDepthKeys = 32;
constexpr int32_t kTileRows = int32_t(kAmxTileRows);
// Query vectors per block of tiles: two tiles' rows.
constexpr int32_t kBlockRows = 2 * kTileRows;

struct Scratch {
  std::vector<uint16_t> q;    // [n_pad, d] BF16 queries, rows past n_q zero
  std::vector<float> scores;  // [n_pad, kChunkKeys]
  std::vector<uint16_t> p;    // [n_pad, kChunkKeys] BF16 probabilities, rows past n_q zero
  std::vector<uint16_t> v;    // [kChunkKeys / 2 key pairs, d, 2]: the chunk's V rows interleaved
  std::vector<float> pv;      // [n_pad, d]: the chunk's outputs
  std::vector<float> alpha;   // [n_q]
  std::vector<float> sums;    // [n_q, 16]: partial sums of each row's probabilities
  std::vector<int32_t> visible, hidden;  // [rows]: of the chunk's keys
  // 8-bit caches: the chunk's K tiles and V rows, dequantized and rounded
  // to BF16, as a BF16 pool with blocks of 16 keys would hold them.
  std::vector<uint16_t> k8, v8;
};

// The tile intrinsics are asm statements that take addresses only: memory
// written through ordinary stores must be in place before a tile reads it.
inline void compiler_barrier() { asm volatile("" ::: "memory"); }

// n F32 values times `scale`, rounded to BF16 (n a multiple of 32).
BATON_AMX_INLINE void scaled_to_bf16(const float* src, float scale, int32_t n, uint16_t* dst) {
  const __m512 s = _mm512_set1_ps(scale);
  for (int32_t e = 0; e < n; e += 32) {
    const __m512 lo = _mm512_mul_ps(_mm512_loadu_ps(src + e), s);
    const __m512 hi = _mm512_mul_ps(_mm512_loadu_ps(src + e + 16), s);
    _mm512_storeu_si512(dst + e, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// exp(x) for x <= 0 over 16 lanes, within 6e-5 of it (relative; 5.6e-5 at
// most over [-87, 0], the polynomial evaluated in double): 2^f for
// the fraction f in [-1/2, 1/2] of x log2(e) by its Taylor polynomial of
// degree 4, scaled by 2^n (VSCALEFPS). Half the work of exp16_nonpositive,
// whose 1e-7 would be lost in the probabilities' rounding to BF16 (2^-9).
BATON_AMX_INLINE __m512 exp16_for_bf16(__m512 x) {
  const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(exp_poly::kMinInput)),
                                 _mm512_set1_ps(exp_poly::kLog2e));
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 y = _mm512_set1_ps(0.009618129f);                 // ln(2)^4 / 4!
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.05550411f));  // ln(2)^3 / 3!
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.2402265f));   // ln(2)^2 / 2!
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.6931472f));   // ln(2)
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(y, n);
}

// One query vector's online-softmax step over a chunk's kChunkKeys scores s, of
// which keys [hidden, visible) are seen: writes their probabilities
// relative to the new running max, rounded to BF16, to p (0 elsewhere);
// updates row_max and the 16 partial sums of the row's probabilities
// (before rounding, as flash attention sums them); returns the factor the
// earlier outputs shrink by.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"  // the _mm512_reduce_* macros
BATON_AMX_INLINE float softmax_chunk(const float* s, int32_t hidden, int32_t visible,
                                     float* row_max, float* sums, uint16_t* p) {
  constexpr int kVectors = kChunkKeys / 16;
  if (hidden >= visible) {
    for (int j = 0; j < kVectors; j += 2) _mm512_storeu_si512(p + 16 * j, _mm512_setzero_si512());
    return 1.0f;
  }
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  __mmask16 mask[kVectors];
  __m512 x[kVectors];
  __m512 block_max = neg_inf;
  for (int j = 0; j < kVectors; ++j) {
    mask[j] =
        __mmask16(avx512::first_lanes(visible - 16 * j) & ~avx512::first_lanes(hidden - 16 * j));
    x[j] = _mm512_mask_loadu_ps(neg_inf, mask[j], s + 16 * j);
    block_max = _mm512_max_ps(block_max, x[j]);
  }
  const float new_max = std::max(*row_max, _mm512_reduce_max_ps(block_max));
  // Once the running max settles (most chunks), skip the exp.
  const float alpha = new_max == *row_max ? 1.0f : std::exp(*row_max - new_max);
  const __m512 vmax = _mm512_set1_ps(new_max);
  __m512 sum = _mm512_mul_ps(_mm512_loadu_ps(sums), _mm512_set1_ps(alpha));
  for (int j = 0; j < kVectors; j += 2) {
    const __m512 p0 = _mm512_maskz_mov_ps(mask[j], exp16_for_bf16(_mm512_sub_ps(x[j], vmax)));
    const __m512 p1 =
        _mm512_maskz_mov_ps(mask[j + 1], exp16_for_bf16(_mm512_sub_ps(x[j + 1], vmax)));
    _mm512_storeu_si512(p + 16 * j, (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    sum = _mm512_add_ps(sum, _mm512_add_ps(p0, p1));
  }
  _mm512_storeu_ps(sums, sum);
  *row_max = new_max;
  return alpha;
}
#pragma GCC diagnostic pop

// The V rows of keys [0, keys) (rows[t]: key t's d BF16 values) as AMX's
// second operand, `pairs` pairs of keys: pair r, element e at v[(r * d + e)
// * 2 + (t % 2)]; keys from `keys` on read as 0 (pool slots past the
// context may hold NaN, which a zero probability would still spread).
BATON_AMX_INLINE void interleave_v(const uint16_t* const* rows, int32_t keys, int32_t pairs,
                                   int32_t d, uint16_t* v) {
  // Element j of the result: a[j / 2] for even j, b[j / 2] for odd (lo);
  // the same from element 16 on (hi).
  alignas(64) static constexpr uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                   37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                   11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                   53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                   27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo_index = _mm512_load_si512(kLo), hi_index = _mm512_load_si512(kHi);
  const __m512i zero = _mm512_setzero_si512();
  for (int32_t r = 0; r < pairs; ++r) {
    uint16_t* out = v + size_t(r) * 2 * d;
    const int32_t t = 2 * r;
    if (t >= keys) {
      for (int32_t e = 0; e < 2 * d; e += 32) _mm512_storeu_si512(out + e, zero);
      continue;
    }
    for (int32_t e = 0; e < d; e += 32) {
      const __m512i a = _mm512_loadu_si512(rows[t] + e);
      const __m512i b = t + 1 < keys ? _mm512_loadu_si512(rows[t + 1] + e) : zero;
      _mm512_storeu_si512(out + 2 * e, _mm512_permutex2var_epi16(a, lo_index, b));
      _mm512_storeu_si512(out + 2 * e + 32, _mm512_permutex2var_epi16(a, hi_index, b));
    }
  }
}

// 16 floats from `at`, which may be unaligned (8-bit blocks' scales).
BATON_AMX_INLINE __m512 load_scales(const char* at) { return _mm512_loadu_ps(at); }

// 16 E4M3 codes' values (e4m3_values()) as floats.
BATON_AMX_INLINE __m512 e4m3_16(const uint8_t* codes) {
  const __m512i index =
      _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes)));
  return _mm512_i32gather_ps(index, e4m3_values().data(), 4);
}

// 16 int8 codes as floats.
BATON_AMX_INLINE __m512 int8_16(const int8_t* codes) {
  return _mm512_cvtepi32_ps(
      _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes))));
}

// Keys [slot, slot + 16) of an 8-bit K tile (common/kv_layout.h; `scales`:
// their 16 scales) dequantized to BF16 as a BF16 tile of 16 keys holds them:
// pair c of key t at out[(c * 16 + t) * 2].
BATON_AMX_INLINE void stage_k_tile(const KvLayout& L, const uint8_t* tile, int32_t slot,
                                   const char* scales, uint16_t* out) {
  const int32_t d = L.head_dim;
  const size_t stride = L.key_group_stride();
  const __m512 s = load_scales(scales);
  if (L.dtype == DType::kFP8E4M3) {
    // Groups are pairs: a row of 16 keys' pairs is 32 codes, key-major.
    const __m512i lo_keys = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
    const __m512i hi_keys = _mm512_add_epi32(lo_keys, _mm512_set1_epi32(8));
    const __m512 s_lo = _mm512_permutexvar_ps(lo_keys, s), s_hi = _mm512_permutexvar_ps(hi_keys, s);
    for (int32_t c = 0; c < d / 2; ++c) {
      const uint8_t* codes = tile + size_t(c) * stride + size_t(slot) * 2;
      const __m512 lo = _mm512_mul_ps(e4m3_16(codes), s_lo);
      const __m512 hi = _mm512_mul_ps(e4m3_16(codes + 16), s_hi);
      _mm512_storeu_si512(out + size_t(c) * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
    return;
  }
  // int8: groups of 4 dimensions, 16 keys' groups 64 codes, key-major; as
  // 32-bit units of BF16 pairs, unit 2t + h is key t's pair h.
  __m512 s4[4];
  for (int q = 0; q < 4; ++q) {
    alignas(64) int32_t keys[16];
    for (int l = 0; l < 16; ++l) keys[l] = 4 * q + l / 4;
    s4[q] = _mm512_permutexvar_ps(_mm512_load_si512(keys), s);
  }
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
  for (int32_t g = 0; g < d / 4; ++g) {
    const auto* codes =
        reinterpret_cast<const int8_t*>(tile + size_t(g) * stride + size_t(slot) * 4);
    const __m512i keys0_7 = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(int8_16(codes + 16), s4[1]),
                                                         _mm512_mul_ps(int8_16(codes), s4[0]));
    const __m512i keys8_15 = (__m512i)_mm512_cvtne2ps_pbh(
        _mm512_mul_ps(int8_16(codes + 48), s4[3]), _mm512_mul_ps(int8_16(codes + 32), s4[2]));
    _mm512_storeu_si512(out + size_t(2 * g) * 32,
                        _mm512_permutex2var_epi32(keys0_7, even, keys8_15));
    _mm512_storeu_si512(out + size_t(2 * g + 1) * 32,
                        _mm512_permutex2var_epi32(keys0_7, odd, keys8_15));
  }
}

// One 8-bit V row of d codes times its scale, rounded to BF16.
BATON_AMX_INLINE void stage_v_row(DType dtype, const uint8_t* codes, const char* scale, int32_t d,
                                  uint16_t* out) {
  float value;
  std::memcpy(&value, scale, sizeof(value));
  const __m512 s = _mm512_set1_ps(value);
  for (int32_t e = 0; e < d; e += 32) {
    __m512 lo, hi;
    if (dtype == DType::kFP8E4M3) {
      lo = e4m3_16(codes + e);
      hi = e4m3_16(codes + e + 16);
    } else {
      lo = int8_16(reinterpret_cast<const int8_t*>(codes + e));
      hi = int8_16(reinterpret_cast<const int8_t*>(codes + e + 16));
    }
    _mm512_storeu_si512(out + e,
                        (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(hi, s), _mm512_mul_ps(lo, s)));
  }
}

// acc_i = acc_i * alpha_i + pv_i over n vectors of d floats.
BATON_AMX_INLINE void rescale_add(float* acc, const float* alpha, const float* pv, int32_t n,
                                  int32_t d) {
  for (int32_t i = 0; i < n; ++i) {
    float* a = acc + size_t(i) * d;
    const float* x = pv + size_t(i) * d;
    const __m512 s = _mm512_set1_ps(alpha[i]);
    for (int32_t e = 0; e < d; e += 16)
      _mm512_storeu_ps(a + e, _mm512_fmadd_ps(_mm512_loadu_ps(a + e), s, _mm512_loadu_ps(x + e)));
  }
}

// Tiles, as the BF16 GEMM's blocks (gemm_bf16_amx.cc): four outputs 0-3 for
// two tiles of query vectors (A operands 4-5) by two of keys or dimensions
// (B operands 6-7), so each loaded tile serves two multiplies.
BATON_AMX_INLINE void zero_block() {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
}

BATON_AMX_INLINE void multiply_block(const void* a0, const void* a1, int64_t a_stride,
                                     const void* b0, const void* b1, int64_t b_stride) {
  _tile_loadd(4, a0, a_stride);
  _tile_loadd(6, b0, b_stride);
  _tile_dpbf16ps(0, 4, 6);
  _tile_loadd(7, b1, b_stride);
  _tile_dpbf16ps(1, 4, 7);
  _tile_loadd(5, a1, a_stride);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}

// Output tile (row r, column c of the block) to `at` + r * row_step + c * column_step.
BATON_AMX_INLINE void store_block(float* at, size_t row_step, size_t column_step, int64_t stride) {
  _tile_stored(0, at, stride);
  _tile_stored(1, at + column_step, stride);
  _tile_stored(2, at + row_step, stride);
  _tile_stored(3, at + row_step + column_step, stride);
}

}  // namespace

BATON_AMX void attend_rows_amx(const PagedAttentionParams& p, int32_t seq, int32_t kv_head,
                               int32_t row_begin, int32_t row_end, int32_t key_begin,
                               int32_t key_end, SoftmaxState state) {
  const KvLayout& L = p.layout;
  const int32_t d = L.head_dim;
  const int32_t bs = L.block_size;
  const int32_t group = p.num_heads / L.num_kv_heads;
  const int32_t rows = row_end - row_begin;
  const int32_t n_q = rows * group;
  const int32_t n_pad = (n_q + kBlockRows - 1) / kBlockRows * kBlockRows;
  const int32_t q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int32_t first_position = p.context_lens[seq] - q_len + row_begin;
  const int32_t first_row = p.query_start[seq] + row_begin;
  const int32_t* table = p.block_tables + size_t(seq) * p.block_table_stride;
  const auto* pool = static_cast<const uint16_t*>(p.kv_pool);
  const auto* bytes = static_cast<const uint8_t*>(p.kv_pool);
  const bool quantized = is_quantized(L.dtype);
  // Elements between dimension pairs of a K tile: the pool's, or (8-bit
  // caches) the staged tiles' of 16 keys.
  const size_t k_stride = quantized ? size_t(2 * kTileKeys) : L.key_group_stride();
  const int64_t k_stride_bytes = int64_t(k_stride * sizeof(uint16_t));
  const int64_t q_stride_bytes = int64_t(d) * int64_t(sizeof(uint16_t));
  const int64_t v_stride_bytes = int64_t(2 * d) * int64_t(sizeof(uint16_t));
  const int64_t pv_stride_bytes = int64_t(d) * int64_t(sizeof(float));
  constexpr int64_t kScoreStrideBytes = kChunkKeys * sizeof(float);
  constexpr int64_t kProbabilityStrideBytes = kChunkKeys * sizeof(uint16_t);

  thread_local Scratch sc;
  sc.q.assign(size_t(n_pad) * d, 0);
  sc.scores.resize(size_t(n_pad) * kChunkKeys);
  sc.p.assign(size_t(n_pad) * kChunkKeys, 0);
  sc.v.resize(size_t(kChunkKeys) * d);
  sc.pv.resize(size_t(n_pad) * d);
  sc.alpha.resize(size_t(n_q));
  sc.sums.assign(size_t(n_q) * 16, 0.0f);
  sc.visible.resize(size_t(rows));
  sc.hidden.resize(size_t(rows));
  if (quantized) {
    sc.k8.resize(size_t(kChunkKeys) * d);
    sc.v8.resize(size_t(kChunkKeys) * d);
  }
  // A row's query heads of the group are adjacent in q.
  for (int32_t r = 0; r < rows; ++r)
    scaled_to_bf16(static_cast<const float*>(p.q) +
                       (size_t(first_row + r) * p.num_heads + size_t(kv_head) * group) * d,
                   p.scale, group * d, sc.q.data() + size_t(r) * group * d);
  std::fill(state.row_max, state.row_max + n_q, -std::numeric_limits<float>::infinity());
  std::fill(state.acc, state.acc + size_t(n_q) * d, 0.0f);

  configure_amx_tiles();
  for (int32_t kc = key_begin; kc < key_end; kc += kChunkKeys) {
    const int32_t keys = std::min(kChunkKeys, key_end - kc);
    int32_t max_visible = 0;
    for (int32_t r = 0; r < rows; ++r) {
      const int32_t position = first_position + r;
      const int32_t visible = std::clamp(position + 1 - kc, 0, keys);
      const int32_t hidden = std::clamp(first_seen_key(position, p.window) - kc, 0, keys);
      sc.visible[size_t(r)] = visible;
      sc.hidden[size_t(r)] = hidden;
      if (hidden < visible) max_visible = std::max(max_visible, visible);
    }
    if (max_visible == 0) continue;  // no row sees a key of this chunk

    // The K tiles of the keys any row sees, 16 keys each inside one block;
    // an odd count's last repeats the one before (its scores are never
    // read).
    const int32_t key_tiles = (max_visible + kTileKeys - 1) / kTileKeys;
    const uint16_t* k_tile[kChunkKeys / kTileKeys];
    for (int32_t j = 0; j < key_tiles + key_tiles % 2; ++j) {
      if (j == key_tiles) {
        k_tile[j] = k_tile[j - 1];
        continue;
      }
      const int32_t key = kc + j * kTileKeys;
      const int32_t block = table[key / bs];
      if (quantized) {
        uint16_t* staged = sc.k8.data() + size_t(j) * kTileKeys * d;
        stage_k_tile(L, bytes + L.head_tile_offset(p.layer, block, KvPart::kKey, kv_head), key % bs,
                     reinterpret_cast<const char*>(bytes) +
                         L.scale_byte_offset(p.layer, block, KvPart::kKey, kv_head, key % bs),
                     staged);
        k_tile[j] = staged;
        continue;
      }
      k_tile[j] =
          pool + L.head_tile_offset(p.layer, block, KvPart::kKey, kv_head) + size_t(key % bs) * 2;
    }
    const uint16_t* v_rows[kChunkKeys];
    for (int32_t t = 0; t < max_visible; ++t) {
      const int32_t key = kc + t;
      const int32_t block = table[key / bs];
      if (quantized) {
        uint16_t* staged = sc.v8.data() + size_t(t) * d;
        stage_v_row(L.dtype, bytes + L.value_offset(p.layer, block, kv_head, key % bs),
                    reinterpret_cast<const char*>(bytes) +
                        L.scale_byte_offset(p.layer, block, KvPart::kValue, kv_head, key % bs),
                    d, staged);
        v_rows[t] = staged;
        continue;
      }
      v_rows[t] = pool + L.value_offset(p.layer, block, kv_head, key % bs);
    }

    compiler_barrier();  // the queries and staged K tiles are in memory

    // Scores: 32 query vectors by 32 keys at a time.
    for (int32_t m = 0; m < n_pad; m += kBlockRows) {
      const uint16_t* q0 = sc.q.data() + size_t(m) * d;
      const uint16_t* q1 = q0 + size_t(kTileRows) * d;
      for (int32_t j = 0; j < key_tiles; j += 2) {
        zero_block();
        for (int32_t c = 0; c < d; c += 32) {
          const size_t pairs = size_t(c / 2) * k_stride;
          multiply_block(q0 + c, q1 + c, q_stride_bytes, k_tile[j] + pairs, k_tile[j + 1] + pairs,
                         k_stride_bytes);
        }
        store_block(sc.scores.data() + size_t(m) * kChunkKeys + size_t(j) * kTileKeys,
                    size_t(kTileRows) * kChunkKeys, kTileKeys, kScoreStrideBytes);
      }
    }
    compiler_barrier();
    for (int32_t i = 0; i < n_q; ++i) {
      const int32_t r = i / group;
      sc.alpha[size_t(i)] = softmax_chunk(
          sc.scores.data() + size_t(i) * kChunkKeys, sc.hidden[size_t(r)], sc.visible[size_t(r)],
          state.row_max + i, sc.sums.data() + size_t(i) * 16, sc.p.data() + size_t(i) * kChunkKeys);
    }
    // The chunk's outputs: 32 query vectors by 32 dimensions at a time, over
    // the 32-key depths that hold a seen key.
    const int32_t depths = (max_visible + kDepthKeys - 1) / kDepthKeys;
    interleave_v(v_rows, max_visible, depths * kDepthKeys / 2, d, sc.v.data());
    compiler_barrier();
    for (int32_t m = 0; m < n_pad; m += kBlockRows) {
      const uint16_t* p0 = sc.p.data() + size_t(m) * kChunkKeys;
      const uint16_t* p1 = p0 + size_t(kTileRows) * kChunkKeys;
      for (int32_t c = 0; c < d; c += 32) {
        zero_block();
        for (int32_t k = 0; k < depths; ++k) {
          const uint16_t* v = sc.v.data() + size_t(k) * (kDepthKeys / 2) * 2 * d + size_t(c) * 2;
          multiply_block(p0 + k * kDepthKeys, p1 + k * kDepthKeys, kProbabilityStrideBytes, v,
                         v + 32, v_stride_bytes);
        }
        store_block(sc.pv.data() + size_t(m) * d + c, size_t(kTileRows) * d, 16, pv_stride_bytes);
      }
    }
    compiler_barrier();
    rescale_add(state.acc, sc.alpha.data(), sc.pv.data(), n_q, d);
  }
  release_amx_tiles();
  for (int32_t i = 0; i < n_q; ++i)
    state.row_sum[i] = _mm512_reduce_add_ps(_mm512_loadu_ps(sc.sums.data() + size_t(i) * 16));
}

#endif

}  // namespace baton::kernels::cpu
