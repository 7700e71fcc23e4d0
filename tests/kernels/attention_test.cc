// Paged attention and store_kv against the dense double reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <sstream>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/decode_scores_vnni.h"
#include "tests/kernels/reference.h"
#include "tests/kernels/test_util.h"

namespace baton::kernels::cpu {
namespace {

using testing::fresh_seed;
using testing::random_floats;
using testing::round_trip;

struct SeqSpec {
  int32_t context_len;
  int32_t query_len;  // 1: decode row; more: a prefill chunk over context_len - query_len earlier
                      // tokens
};

struct Case {
  int32_t num_heads;
  int32_t num_kv_heads;
  int32_t head_dim;
  int32_t block_size;
  std::vector<SeqSpec> seqs;
  int32_t window = 0;  // > 0: sliding-window attention
};

// The instruction sets a case runs with: AMX tiles for BF16 prefill rows,
// AVX-512 with BF16's V pass on VDPBF16PS, AVX-512 with F32 FMAs, AVX2, or
// the portable scalar code.
// kAvx512Foundation: AVX-512 F, BW and VL alone, as on a Skylake-X.
enum class Isa { kAmx, kAvx512Bf16, kAvx512, kAvx512Foundation, kAvx2, kScalar };

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kAmx:
      return "amx";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Foundation:
      return "avx512 without extensions";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kScalar:
      break;
  }
  return "scalar";
}

std::string describe(const Case& c, DType dt, Isa isa) {
  std::ostringstream os;
  os << "heads=" << c.num_heads << " kv_heads=" << c.num_kv_heads << " head_dim=" << c.head_dim
     << " block=" << c.block_size << " window=" << c.window << " dtype=" << dtype_name(dt)
     << " isa=" << isa_name(isa) << " seqs=";
  for (auto& s : c.seqs) os << "(" << s.context_len << "," << s.query_len << ")";
  return os.str();
}

// Builds a pool with shuffled, non-contiguous block tables, stores every
// sequence's K/V through store_kv, runs paged_attention and compares each
// sequence with the reference on the dequantised K/V. Returns how many
// sequences took AMX tiles.
int run_case(const Case& c, DType dtype, Isa isa, uint64_t seed) {
  SCOPED_TRACE(describe(c, dtype, isa) + " seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  // Every path out, a failed assertion's too, leaves the best ISA selected
  // for the tests that follow.
  struct RestoreIsa {
    ~RestoreIsa() {
      set_simd_enabled(true);
      set_avx512_enabled(true);
      set_avx512_bf16_preferred(cpu_prefers_avx512_bf16());
      set_amx_enabled(max_cpu_isa() >= MaxCpuIsa::kAmx);
      set_avx512_extensions_enabled(true);
    }
  } restore;
  const bool avx512 = isa == Isa::kAvx512 || isa == Isa::kAvx512Bf16 || isa == Isa::kAmx ||
                      isa == Isa::kAvx512Foundation;
  set_simd_enabled(isa != Isa::kScalar);
  set_avx512_enabled(avx512);
  set_avx512_extensions_enabled(isa != Isa::kAvx512Foundation);
  set_avx512_bf16_preferred(isa == Isa::kAvx512Bf16);
  set_amx_enabled(isa == Isa::kAmx);
  int amx_seqs = 0;
  const bool runs_on_isa = use_avx512() == avx512 &&
                           use_avx512_bf16() == (isa == Isa::kAvx512Bf16) &&
                           use_amx_bf16() == (isa == Isa::kAmx);
  EXPECT_TRUE(runs_on_isa) << "the case would not run on " << isa_name(isa);
  if (!runs_on_isa) return 0;
  ThreadPool pool(2);

  const int32_t num_seqs = int32_t(c.seqs.size());
  KvLayout layout;
  layout.num_layers = 2;
  layout.block_size = c.block_size;
  layout.num_kv_heads = c.num_kv_heads;
  layout.head_dim = c.head_dim;
  layout.dtype = dtype;
  int32_t max_blocks = 0, total_blocks = 0, total_rows = 0;
  for (auto& s : c.seqs) {
    const int32_t nb = (s.context_len + c.block_size - 1) / c.block_size;
    max_blocks = std::max(max_blocks, nb);
    total_blocks += nb;
    total_rows += s.query_len;
  }
  layout.num_blocks = total_blocks + 5;  // spare blocks nobody owns
  const int32_t layer = 1;
  // Every byte 0xff: NaN in f32, f16 and bf16, and a NaN scale for the
  // 8-bit formats (whose 0xff codes read as finite -1 and -1.875), so a
  // read of an unwritten slot shows.
  std::vector<uint8_t> kv_pool(layout.total_bytes(), 0xff);

  std::vector<int32_t> ids(static_cast<size_t>(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  const int32_t stride = max_blocks + 1;
  std::vector<int32_t> block_tables(static_cast<size_t>(num_seqs * stride), -1);
  std::vector<int32_t> query_start(static_cast<size_t>(num_seqs + 1), 0),
      context_lens(static_cast<size_t>(num_seqs));
  size_t next_id = 0;
  const int32_t kv_width = c.num_kv_heads * c.head_dim;
  std::vector<std::vector<float>> k_of(static_cast<size_t>(num_seqs)),
      v_of(static_cast<size_t>(num_seqs));
  for (int32_t s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = c.seqs[size_t(s)];
    const int32_t nb = (spec.context_len + c.block_size - 1) / c.block_size;
    for (int32_t b = 0; b < nb; ++b) block_tables[size_t(s * stride + b)] = ids[next_id++];
    query_start[size_t(s + 1)] = query_start[size_t(s)] + spec.query_len;
    context_lens[size_t(s)] = spec.context_len;
    k_of[size_t(s)] = random_floats(rng, size_t(spec.context_len) * kv_width);
    v_of[size_t(s)] = random_floats(rng, size_t(spec.context_len) * kv_width, -2.0f, 2.0f);
    std::vector<int32_t> slots(static_cast<size_t>(spec.context_len));
    for (int32_t t = 0; t < spec.context_len; ++t)
      slots[size_t(t)] =
          block_tables[size_t(s * stride + t / c.block_size)] * c.block_size + t % c.block_size;
    store_kv(pool, layout, kv_pool.data(), layer, k_of[size_t(s)].data(), v_of[size_t(s)].data(),
             slots.data(), spec.context_len);
  }

  const size_t q_width = size_t(c.num_heads) * c.head_dim;
  // Larger queries make the softmax peaky, so a wrong weight cannot hide.
  std::vector<float> q = random_floats(rng, size_t(total_rows) * q_width, -3.0f, 3.0f);
  std::vector<float> out(q.size(), testing::kNaN);

  PagedAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.kv_pool = kv_pool.data();
  p.layout = layout;
  p.layer = layer;
  p.num_heads = c.num_heads;
  p.num_seqs = num_seqs;
  p.query_start = query_start.data();
  p.context_lens = context_lens.data();
  p.block_tables = block_tables.data();
  p.block_table_stride = stride;
  p.scale = 1.0f / std::sqrt(float(c.head_dim));
  p.window = c.window;
  if (isa == Isa::kAvx512Foundation && c.head_dim % 32 == 0) {
    // E4M3 keeps the 512-bit passes (its score pass on FMAs); int8 has
    // no VNNI there and takes the AVX2 passes.
    if (dtype == DType::kFP8E4M3) {
      EXPECT_TRUE(decode_partition_avx512(layout));
      EXPECT_TRUE(e4m3_scores_on_fmas());
    }
    if (dtype == DType::kI8) {
      EXPECT_FALSE(decode_partition_avx512(layout));
    }
  }
  paged_attention(pool, p);

  for (int32_t s = 0; s < num_seqs; ++s) {
    const SeqSpec& spec = c.seqs[size_t(s)];
    const bool amx = attention_takes_amx(layout, spec.query_len);
    // The reference follows the kernel's path below, so the paths are
    // pinned here as specified: the tiles only from 33 rows; 8-bit queries
    // (int8 codes, BF16) only for decode rows, at most 4 of a sequence.
    if (amx) {
      EXPECT_GE(spec.query_len, 33) << "seq " << s;
      EXPECT_FALSE(attention_takes_amx(layout, 32));
    }
    EXPECT_TRUE(spec.query_len <= 4 || decode_query_format(layout, spec.query_len) == DType::kF32)
        << "seq " << s << ": " << spec.query_len << " rows";
    EXPECT_EQ(decode_query_format(layout, 5), DType::kF32);
    std::vector<double> k = testing::stored_rows(k_of[size_t(s)], c.head_dim, dtype);
    std::vector<double> v = testing::stored_rows(v_of[size_t(s)], c.head_dim, dtype);
    if (amx && is_quantized(dtype)) {
      // On AMX tiles 8-bit K and V are dequantized (in F32) and rounded to
      // BF16 first.
      for (std::vector<double>* rows : {&k, &v})
        *rows = testing::stored_rows(std::vector<float>(rows->begin(), rows->end()), c.head_dim,
                                     DType::kBF16);
    }
    double v_max = 0.0;
    for (double x : v) v_max = std::max(v_max, std::abs(x));
    std::vector<float> qs(q.begin() + std::ptrdiff_t(query_start[size_t(s)] * q_width),
                          q.begin() + std::ptrdiff_t(query_start[size_t(s + 1)] * q_width));
    // Where the kernel scores int8 or BF16 queries, the reference takes
    // them too. On AMX tiles the queries and the probabilities are BF16.
    amx_seqs += amx;
    const DType query_format = amx ? DType::kBF16 : decode_query_format(layout, spec.query_len);
    if (query_format != DType::kF32) {
      for (size_t v = 0; v < qs.size(); v += size_t(c.head_dim)) {
        std::vector<float> scaled(size_t(c.head_dim));
        for (int32_t e = 0; e < c.head_dim; ++e) scaled[size_t(e)] = qs[v + size_t(e)] * p.scale;
        const std::vector<double> stored = testing::stored_rows(scaled, c.head_dim, query_format);
        for (int32_t e = 0; e < c.head_dim; ++e)
          qs[v + size_t(e)] = float(stored[size_t(e)] / double(p.scale));
      }
    }
    std::vector<double> ref =
        reference::attention(qs, spec.query_len, k, v, spec.context_len, c.num_heads,
                             c.num_kv_heads, c.head_dim, double(p.scale), c.window);
    // Probabilities rounded to BF16 (each within 2^-9 of itself, the sum
    // of them too) move an output by at most 2 * 2^-9 of the largest |v|.
    const double tol = (amx ? 2.0 * std::ldexp(1.0, -9) * 1.01 : 1e-4) * v_max;
    int failures = 0;
    for (size_t i = 0; i < ref.size() && failures < 5; ++i) {
      const float got = out[query_start[size_t(s)] * q_width + i];
      if (!(std::abs(double(got) - ref[i]) <= tol)) {
        ++failures;
        ADD_FAILURE() << "seq " << s << " row " << i / q_width << " head "
                      << (i % q_width) / size_t(c.head_dim) << " dim " << i % size_t(c.head_dim)
                      << ": got " << got << " want " << ref[i];
      }
    }
  }
  return amx_seqs;
}

// Mixed batches: decode rows (short and split-K long contexts), fresh
// prefills, and prefill chunks on top of earlier context.
const std::vector<SeqSpec> kMixed = {{1, 1}, {17, 1}, {1000, 1}, {40, 40}, {100, 37}, {16, 16}};
const std::vector<SeqSpec> kRagged = {{15, 1}, {16, 1}, {17, 1}, {100, 1}, {1, 1}, {33, 2}};
// {1025, 3}: the last partition holds one key, which the first two rows do
// not see.
const std::vector<SeqSpec> kLongDecode = {{1500, 1}, {1037, 3}, {1025, 3}};
const std::vector<SeqSpec> kChunked = {{300, 130}, {129, 129}, {64, 5}};

std::vector<Case> cases() {
  std::vector<Case> all;
  const std::vector<std::pair<int32_t, int32_t>> heads = {{4, 4}, {4, 2}, {9, 3},
                                                          {8, 2}, {7, 1}, {16, 2}};
  int i = 0;
  for (auto [h, kvh] : heads)
    for (int32_t d : {64, 128}) {
      // Rotate the sequence mixes so every head shape meets several of them
      // without running every combination.
      const std::vector<SeqSpec>* mixes[] = {&kMixed, &kRagged, &kLongDecode, &kChunked};
      all.push_back({h, kvh, d, 16, *mixes[i % 4]});
      all.push_back({h, kvh, d, 16, *mixes[(i + 1) % 4]});
      ++i;
    }
  // Block sizes that are not 16 or not a multiple of 8 (padded tiles). 32
  // and 24 run the decode partition kernel with other tiles (24: partitions
  // of 264 keys); 5 converts tiles for the tiled kernel.
  all.push_back({8, 2, 64, 8, kMixed});
  all.push_back({6, 2, 64, 5, kRagged});
  all.push_back({9, 3, 64, 32, kLongDecode});
  all.push_back({8, 2, 128, 24, kRagged});
  // head_dim % 16 != 0: decode rows fall back from the partition kernel to the tiled one.
  all.push_back({4, 1, 40, 32, kChunked});
  // head_dim 96: the AVX-512 V pass ends with a one-chunk pass after a two-chunk one.
  all.push_back({6, 2, 96, 16, kLongDecode});
  all.push_back({4, 4, 96, 16, kRagged});
  // Sliding windows: shorter than a block (rows see keys of one or two
  // blocks), not a multiple of the block size, longer than a decode
  // partition; over decode rows, long split contexts, prefill tiles whose
  // rows' windows start in different blocks, and padded tiles.
  all.push_back({8, 2, 64, 16, kMixed, 7});
  all.push_back({9, 3, 64, 16, kLongDecode, 300});
  all.push_back({4, 1, 128, 16, kChunked, 40});
  all.push_back({6, 2, 64, 5, kRagged, 9});
  all.push_back({8, 2, 64, 32, kLongDecode, 1});
  all.push_back({4, 4, 64, 16, kLongDecode, 1024});
  // Prefill over blocks of 32 and 64 keys (AMX K tiles of 16 keys from a
  // block's start and its middle, chunks across blocks), under a window too.
  all.push_back({8, 2, 64, 32, kChunked});
  all.push_back({4, 2, 128, 64, kMixed});
  all.push_back({9, 3, 64, 32, kChunked, 50});
  return all;
}

class PagedAttentionTest : public ::testing::TestWithParam<DType> {};

TEST_P(PagedAttentionTest, MatchesReferenceAvx2) {
  if (!cpu_has_avx2_fma_f16c()) GTEST_SKIP() << "this CPU has no AVX2/FMA/F16C";
  const uint64_t seed = fresh_seed();
  for (const Case& c : cases()) run_case(c, GetParam(), Isa::kAvx2, seed);
}

TEST_P(PagedAttentionTest, MatchesReferenceAvx512) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 F, BW and VL";
  const uint64_t seed = fresh_seed();
  for (const Case& c : cases()) run_case(c, GetParam(), Isa::kAvx512, seed);
}

// AVX-512 F, BW and VL alone (Skylake-X): every path such a CPU takes.
TEST_P(PagedAttentionTest, MatchesReferenceAvx512WithoutExtensions) {
  if (!cpu_has_avx512()) GTEST_SKIP() << "this CPU has no AVX-512 F, BW and VL";
  const uint64_t seed = fresh_seed();
  for (const Case& c : cases()) run_case(c, GetParam(), Isa::kAvx512Foundation, seed);
}

// BF16's V pass and E4M3's score pass on VDPBF16PS (where it is preferred;
// MatchesReferenceAvx512 runs their F32 FMA passes).
TEST_P(PagedAttentionTest, MatchesReferenceAvx512Bf16) {
  if (GetParam() != DType::kBF16 && GetParam() != DType::kFP8E4M3)
    GTEST_SKIP() << "only BF16 and E4M3 have VDPBF16PS passes: MatchesReferenceAvx512 covers this "
                    "dtype";
  if (!cpu_has_avx512_bf16()) GTEST_SKIP() << "this CPU has no AVX-512 BF16";
  const uint64_t seed = fresh_seed();
  for (const Case& c : cases()) run_case(c, GetParam(), Isa::kAvx512Bf16, seed);
}

// BF16 and 8-bit prefill rows on AMX tiles; the rest of each batch as on
// AVX-512.
TEST_P(PagedAttentionTest, MatchesReferenceAmx) {
  if (GetParam() == DType::kF32 || GetParam() == DType::kF16)
    GTEST_SKIP() << "F32 and F16 caches are not read on AMX tiles: MatchesReferenceAvx512 covers "
                    "them";
  if (!cpu_has_amx_bf16()) GTEST_SKIP() << "this CPU (or its kernel) gives no AMX BF16 tiles";
  const uint64_t seed = fresh_seed();
  int amx_seqs = 0;
  for (const Case& c : cases()) amx_seqs += run_case(c, GetParam(), Isa::kAmx, seed);
  EXPECT_GT(amx_seqs, 20) << "too few sequences took the tiles";
}

TEST_P(PagedAttentionTest, MatchesReferenceScalar) {
  const uint64_t seed = fresh_seed();
  const std::vector<Case> all = cases();
  // The scalar path is slow: a few shapes cover it.
  for (size_t i = 0; i < all.size(); i += 5) run_case(all[i], GetParam(), Isa::kScalar, seed);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, PagedAttentionTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16, DType::kI8,
                                           DType::kFP8E4M3),
                         [](const auto& info) { return std::string(dtype_name(info.param)); });

// `tokens` distinct slots of the pool in random order, the sixth -1 (a
// padding token, which stores nothing).
std::vector<int32_t> scattered_slots(const KvLayout& layout, int32_t tokens, std::mt19937_64& rng) {
  std::vector<int32_t> slots(static_cast<size_t>(layout.num_blocks * layout.block_size));
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(size_t(tokens));
  slots[5] = -1;
  return slots;
}

// Quantized: each token's K and V row of each head holds its codes and,
// beside the block's tiles, its scale, as the reference recomputes them;
// every other byte of the pool stays as it was.
TEST(StoreKvTest, QuantizedRowsKeepTheirScalesBesideTheBlock) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (DType dt : {DType::kI8, DType::kFP8E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    KvLayout layout{3, 11, 16, 3, 64, dt};
    std::vector<uint8_t> kv_pool(layout.total_bytes(), 0xa5);
    const std::vector<uint8_t> untouched = kv_pool;
    const int32_t tokens = 37;
    const std::vector<int32_t> slots = scattered_slots(layout, tokens, rng);
    const int32_t d = layout.head_dim;
    const size_t width = size_t(layout.num_kv_heads) * d;
    auto k = random_floats(rng, tokens * width, -3.0f, 3.0f),
         v = random_floats(rng, tokens * width);
    std::fill(k.begin() + 2 * std::ptrdiff_t(width), k.begin() + 2 * std::ptrdiff_t(width) + d,
              0.0f);  // a zero row: scale 0, codes 0
    store_kv(pool, layout, kv_pool.data(), 2, k.data(), v.data(), slots.data(), tokens);
    const std::vector<double> k_want = testing::stored_rows(k, d, dt);
    const std::vector<double> v_want = testing::stored_rows(v, d, dt);
    std::vector<bool> written(kv_pool.size(), false);
    auto scale_at = [&](KvPart part, int32_t block, int32_t h, int32_t off) {
      const size_t at = layout.scale_byte_offset(2, block, part, h, off);
      for (size_t i = at; i < at + 4; ++i) written[i] = true;
      float scale;
      std::memcpy(&scale, kv_pool.data() + at, 4);
      return double(scale);
    };
    for (int32_t t = 0; t < tokens; ++t) {
      if (slots[size_t(t)] < 0) continue;
      const int32_t block = slots[size_t(t)] / 16, off = slots[size_t(t)] % 16;
      for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
        const double k_scale = scale_at(KvPart::kKey, block, h, off);
        const double v_scale = scale_at(KvPart::kValue, block, h, off);
        for (int32_t c = 0; c < d; ++c) {
          const size_t i = size_t(t) * width + size_t(h) * d + size_t(c);
          const size_t ko = layout.key_offset(2, block, h, off, c);
          const size_t vo = layout.value_offset(2, block, h, off) + size_t(c);
          written[ko] = written[vo] = true;
          ASSERT_EQ(load_as_float(kv_pool.data(), dt, ko) * k_scale, k_want[i]) << "key " << i;
          ASSERT_EQ(load_as_float(kv_pool.data(), dt, vo) * v_scale, v_want[i]) << "value " << i;
        }
      }
    }
    for (size_t i = 0; i < kv_pool.size(); ++i) {
      if (!written[i]) {
        ASSERT_EQ(kv_pool[i], untouched[i]) << "byte " << i;
      }
    }
  }
}

// Rows at the edges of float: one too small for its inverse scale to be
// finite stores as a zero row (not NaN codes), one with a NaN reads back
// as NaN (its scale), as it would unquantized.
TEST(StoreKvTest, QuantizedRowsTooSmallOrNanStayDefined) {
  ThreadPool pool(2);
  for (DType dt : {DType::kI8, DType::kFP8E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(dt)));
    KvLayout layout{1, 2, 16, 1, 16, dt};
    std::vector<uint8_t> kv_pool(layout.total_bytes(), 0x5a);
    std::vector<float> k(2 * 16, 1e-38f), v(2 * 16, 0.5f);
    k[3] = 0.0f;
    v[16 + 7] = testing::kNaN;
    const std::vector<int32_t> slots = {0, 1};
    store_kv(pool, layout, kv_pool.data(), 0, k.data(), v.data(), slots.data(), 2);
    auto scale_of = [&](KvPart part, int32_t slot) {
      float scale;
      std::memcpy(&scale, kv_pool.data() + layout.scale_byte_offset(0, 0, part, 0, slot), 4);
      return scale;
    };
    for (int32_t slot = 0; slot < 2; ++slot) {
      EXPECT_EQ(scale_of(KvPart::kKey, slot), 0.0f);
      for (int32_t c = 0; c < 16; ++c)
        EXPECT_EQ(load_as_float(kv_pool.data(), dt, layout.key_offset(0, 0, 0, slot, c)), 0.0f);
    }
    EXPECT_EQ(scale_of(KvPart::kValue, 0), 0.5f / quantized_max(dt));
    EXPECT_TRUE(std::isnan(scale_of(KvPart::kValue, 1)));
  }
}

// Query vectors become int8 codes (plus 128, four to a word) as KV rows
// do: the same codes and scales as the reference recomputes, on every ISA,
// zero and tiny vectors included.
TEST(QueryCodesTest, QueriesQuantizeAsKvRowsDo) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  constexpr int32_t kVectors = 9, kDim = 64;
  std::vector<float> q = random_floats(rng, size_t(kVectors) * kDim, -5.0f, 5.0f);
  std::fill(q.begin() + kDim, q.begin() + 2 * kDim, 0.0f);
  std::fill(q.begin() + 2 * kDim, q.begin() + 3 * kDim, 1e-38f);
  q[size_t(7) * kDim + 9] = testing::kNaN;  // these two score NaN, as in F32
  q[size_t(8) * kDim + 40] = -INFINITY;
  for (const bool avx512 : {true, false}) {
    SCOPED_TRACE(avx512 ? "avx512" : "scalar");
    set_avx512_enabled(avx512);
    std::vector<uint32_t> words(size_t(kVectors) * kDim / 4, 0xdeadbeef);
    std::vector<float> scales(kVectors, testing::kNaN);
    quantize_queries(q.data(), kVectors, kDim, words.data(), scales.data());
    set_avx512_enabled(true);
    const std::vector<double> want = testing::stored_rows(q, kDim, DType::kI8);
    for (int32_t i = 7; i < kVectors; ++i) {
      EXPECT_TRUE(std::isnan(scales[size_t(i)])) << "vector " << i;
      for (int32_t w = 0; w < kDim / 4; ++w)
        EXPECT_EQ(words[size_t(i) * kDim / 4 + size_t(w)], 0x80808080u) << "vector " << i;
    }
    for (int32_t i = 0; i < 7; ++i) {
      const uint8_t* codes = reinterpret_cast<const uint8_t*>(words.data() + size_t(i) * kDim / 4);
      for (int32_t c = 0; c < kDim; ++c) {
        const double got = double(int32_t(codes[c]) - 128) * double(scales[size_t(i)]);
        ASSERT_EQ(got, want[size_t(i) * kDim + size_t(c)]) << "vector " << i << " dim " << c;
      }
    }
  }
}

TEST(StoreKvTest, WritesEverySlotWhereTheLayoutSays) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 rng(seed);
  ThreadPool pool(2);
  for (DType dt : {DType::kF32, DType::kF16, DType::kBF16}) {
    KvLayout layout{3, 11, 16, 3, 64, dt};
    std::vector<uint8_t> kv_pool(layout.total_bytes(), 0);
    const int32_t tokens = 37;
    const std::vector<int32_t> slots = scattered_slots(layout, tokens, rng);
    const size_t width = size_t(layout.num_kv_heads) * layout.head_dim;
    auto k = random_floats(rng, tokens * width), v = random_floats(rng, tokens * width);
    store_kv(pool, layout, kv_pool.data(), 2, k.data(), v.data(), slots.data(), tokens);
    size_t nonzero_expected = 0;
    for (int32_t t = 0; t < tokens; ++t) {
      if (slots[size_t(t)] < 0) continue;
      const int32_t block = slots[size_t(t)] / 16, off = slots[size_t(t)] % 16;
      for (int32_t h = 0; h < layout.num_kv_heads; ++h)
        for (int32_t c = 0; c < layout.head_dim; ++c) {
          const size_t i = size_t(t) * width + size_t(h) * layout.head_dim + size_t(c);
          EXPECT_EQ(load_as_float(kv_pool.data(), dt, layout.key_offset(2, block, h, off, c)),
                    float(round_trip(k[i], dt)));
          EXPECT_EQ(load_as_float(kv_pool.data(), dt, layout.value_offset(2, block, h, off) + c),
                    float(round_trip(v[i], dt)));
          nonzero_expected += (k[i] != 0.0f) + (v[i] != 0.0f);
        }
    }
    // Nothing else in the pool was touched.
    size_t nonzero = 0;
    for (size_t i = 0; i < layout.total_elements(); ++i)
      nonzero += load_as_float(kv_pool.data(), dt, i) != 0.0f;
    EXPECT_EQ(nonzero, nonzero_expected);
  }
}

}  // namespace
}  // namespace baton::kernels::cpu
