// partition_ab — two versions of the decode partition kernel
// (attention_decode.cc), timed against each other in one process.
//
// On a shared machine the speed of a core moves by tens of percent within
// minutes, so two programs run one after the other compare their moments
// more than their code. Here the two kernels run alternately on the same
// inputs, one short trial each, thousands of times, swapping which goes
// first every trial; the minimum and the 10th percentile of each side are
// then taken under the same conditions. The minima of two copies of the
// same source agreed to within 1.5% (BF16 in cache) to 6% (F32), 3% from
// memory (bench/partition_ab.sh builds two versions).
//
// One thread, smollm2-135m's attention by default (9 query heads, 3 KV
// heads, head_dim 64; --heads, --kv-heads and --head-dim give others),
// 16-token blocks (--block-size); --avx512 0 runs the AVX2 passes on an
// AVX-512 machine. In cache, one sequence's blocks are read
// again every trial (256 tokens: 192 KiB in BF16, in L2). With --cold, each
// trial reads another of 16 sequences whose blocks lie at random in 256 MiB,
// so every trial comes from memory.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "common/kv_layout.h"
#include "kernels/cpu/attention_decode.h"
#include "kernels/cpu/cpu_features.h"

namespace baton::kernels::cpu {
void attend_decode_partition_a(const PagedAttentionParams&, int32_t, int32_t, int32_t,
                               const PartitionState&, const void*);
void attend_decode_partition_b(const PagedAttentionParams&, int32_t, int32_t, int32_t,
                               const PartitionState&, const void*);
bool decode_partition_supported_a(const KvLayout&);
bool decode_partition_supported_b(const KvLayout&);
const void* decode_partition_start_a(const PagedAttentionParams&, int32_t, int32_t);
const void* decode_partition_start_b(const PagedAttentionParams&, int32_t, int32_t);
}  // namespace baton::kernels::cpu

namespace {

using namespace baton;
using namespace baton::kernels::cpu;

constexpr int32_t kColdSequences = 16;
constexpr size_t kColdBytes = size_t(256) << 20;

struct Side {
  decltype(&attend_decode_partition_a) attend = nullptr;
  decltype(&decode_partition_start_a) start = nullptr;
  std::vector<float> row_max, row_sum, acc;
  std::vector<double> micros;
};

// One sequence of ctx tokens, attended partition by partition the way
// paged_attention does for one thread (each partition told where the next
// one starts).
void attend_sequence(Side& side, const PagedAttentionParams& p, int32_t ctx) {
  const PartitionState state{side.row_max.data(), side.row_sum.data(), side.acc.data()};
  // Partitions start on a block, as paged_attention cuts them.
  const int32_t bs = p.layout.block_size;
  const int32_t partition = (kDecodePartitionTokens + bs - 1) / bs * bs;
  for (int32_t k0 = 0; k0 < ctx; k0 += partition) {
    const int32_t k1 = std::min(ctx, k0 + partition);
    const void* then = k1 < ctx ? side.start(p, 0, k1) : nullptr;
    side.attend(p, 0, k0, k1, state, then);
  }
}

// f-th quantile of sorted values.
double percentile(const std::vector<double>& sorted, double f) {
  return sorted[size_t(f * double(sorted.size() - 1))];
}

// Largest difference between the two sides' unnormalised outputs, relative
// to their size: a check that both compute the same thing.
double max_relative_difference(const Side& a, const Side& b) {
  double worst = 0.0;
  for (size_t i = 0; i < a.acc.size(); ++i)
    worst = std::max(worst, std::abs(double(a.acc[i]) - b.acc[i]) / (std::abs(a.acc[i]) + 1e-3));
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Times two versions of the decode partition kernel against each other"};
  int32_t ctx = 256;
  std::string dtype_name = "bf16";
  int trials = 2000;
  bool cold = false;
  int32_t heads = 9, kv_heads = 3, head_dim = 64, block_size = 16;
  app.add_option("--ctx", ctx, "tokens of context")->check(CLI::Range(1, 1 << 20));
  app.add_option("--dtype", dtype_name, "KV dtype")
      ->check(CLI::IsMember({"f32", "f16", "bf16", "int8", "fp8_e4m3"}));
  app.add_option("--trials", trials, "trials per side")->check(CLI::Range(10, 1000000));
  app.add_flag("--cold", cold, "read every trial's KV from memory");
  app.add_option("--heads", heads, "query heads")->check(CLI::Range(1, 256));
  app.add_option("--kv-heads", kv_heads, "KV heads (dividing --heads)")->check(CLI::Range(1, 256));
  app.add_option("--head-dim", head_dim, "head_dim")->check(CLI::Range(16, 512));
  app.add_option("--block-size", block_size, "tokens per KV block")->check(CLI::Range(1, 1024));
  bool avx512 = true;
  app.add_option("--avx512", avx512, "0: the AVX2 passes even where AVX-512 is present");
  CLI11_PARSE(app, argc, argv);
  set_avx512_enabled(avx512);
  if (heads % kv_heads != 0) {
    std::fprintf(stderr, "partition_ab: --kv-heads %d does not divide --heads %d\n", kv_heads,
                 heads);
    return 2;
  }

  KvLayout layout;
  layout.num_layers = 1;
  layout.block_size = block_size;
  layout.num_kv_heads = kv_heads;
  layout.head_dim = head_dim;
  layout.dtype = parse_kv_dtype(dtype_name).value();
  if (!decode_partition_supported_a(layout) || !decode_partition_supported_b(layout)) {
    std::fprintf(stderr,
                 "partition_ab: no decode partition kernel runs this shape here (it needs AVX2, "
                 "head_dim a multiple of 16 and block_size of 8)\n");
    return 2;
  }
  const int32_t blocks = (ctx + block_size - 1) / block_size;
  const int32_t sequences = cold ? kColdSequences : 1;
  layout.num_blocks =
      cold ? std::max(int32_t(kColdBytes / layout.block_bytes()), blocks) : 2 * blocks;

  // Values in [-1, 1) in every dtype: random bits would give NaNs and
  // infinities, whose arithmetic can run at other speeds.
  std::mt19937 rng(std::random_device{}());
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<char> pool(layout.total_bytes());
  // The 8-bit formats: codes of such values and scales of 1/qmax, the
  // scales written over the codes' random bytes where they lie.
  const float range = is_quantized(layout.dtype) ? quantized_max(layout.dtype) : 1.0f;
  for (size_t i = 0; i < layout.total_elements(); ++i)
    store_from_float(pool.data(), layout.dtype, i, uniform(rng) * range);
  if (is_quantized(layout.dtype)) {
    const float scale = 1.0f / range;
    for (int32_t b = 0; b < layout.num_blocks; ++b)
      for (KvPart part : {KvPart::kKey, KvPart::kValue})
        for (int32_t h = 0; h < kv_heads; ++h)
          for (int32_t t = 0; t < block_size; ++t)
            std::memcpy(pool.data() + layout.scale_byte_offset(0, b, part, h, t), &scale,
                        sizeof(scale));
  }
  std::vector<int32_t> tables(size_t(blocks) * sequences);
  std::vector<int32_t> ids(size_t(layout.num_blocks));
  for (int32_t s = 0; s < sequences; ++s) {
    // Distinct blocks per sequence, in shuffled order.
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
    std::shuffle(ids.begin(), ids.end(), rng);
    std::copy_n(ids.begin(), blocks, tables.begin() + size_t(s) * blocks);
  }
  std::vector<float> q(size_t(heads) * head_dim);
  for (float& x : q) x = uniform(rng);
  int32_t query_start[2] = {0, 1};
  PagedAttentionParams p;
  p.q = q.data();
  p.kv_pool = pool.data();
  p.layout = layout;
  p.num_heads = heads;
  p.num_seqs = 1;
  p.query_start = query_start;
  p.context_lens = &ctx;
  p.block_tables = tables.data();
  p.block_table_stride = blocks;
  p.scale = 1.0f / std::sqrt(float(head_dim));

  Side sides[2];
  sides[0].attend = attend_decode_partition_a;
  sides[0].start = decode_partition_start_a;
  sides[1].attend = attend_decode_partition_b;
  sides[1].start = decode_partition_start_b;
  for (Side& side : sides) {
    side.row_max.assign(size_t(heads), 0.0f);
    side.row_sum.assign(size_t(heads), 0.0f);
    side.acc.assign(size_t(heads) * head_dim, 0.0f);
  }
  // Outputs compared once, on the same sequence, before timing.
  for (Side& side : sides) attend_sequence(side, p, ctx);
  const double difference = max_relative_difference(sides[0], sides[1]);

  // Short contexts repeat within a trial so that a trial lasts some 50 µs.
  const int repeats = cold ? 1 : std::max(1, 4096 / ctx);
  for (int t = 0; t < trials; ++t)
    for (int k = 0; k < 2; ++k) {
      Side& side = sides[k ^ (t & 1)];
      if (cold) p.block_tables = tables.data() + size_t((2 * t + k) % sequences) * blocks;
      const auto t0 = std::chrono::steady_clock::now();
      for (int r = 0; r < repeats; ++r) attend_sequence(side, p, ctx);
      side.micros.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() /
          repeats);
    }

  for (Side& side : sides) std::sort(side.micros.begin(), side.micros.end());
  const double kv_bytes = double(ctx) * 2 * kv_heads * head_dim * double(layout.element_bytes());
  std::printf("ctx %d, %s, %s, %d trials a side; outputs differ by at most %.2g (relative)\n", ctx,
              dtype_name.c_str(), cold ? "from memory" : "in cache", trials, difference);
  std::printf("%-4s %10s %10s %10s %12s\n", "", "min µs", "p10 µs", "median µs", "best KV GB/s");
  for (int k = 0; k < 2; ++k) {
    const auto& m = sides[k].micros;
    std::printf("%-4s %10.2f %10.2f %10.2f %12.1f\n", k == 0 ? "A" : "B", percentile(m, 0),
                percentile(m, 0.1), percentile(m, 0.5), kv_bytes / percentile(m, 0) / 1e3);
  }
  std::printf("B/A  %10.3f %10.3f %10.3f\n",
              percentile(sides[1].micros, 0) / percentile(sides[0].micros, 0),
              percentile(sides[1].micros, 0.1) / percentile(sides[0].micros, 0.1),
              percentile(sides[1].micros, 0.5) / percentile(sides[0].micros, 0.5));
  // Versions that order their sums differently differ by rounding; more
  // than this, and B computes something else than A.
  constexpr double kMaxDifference = 1e-3;
  if (difference > kMaxDifference) {
    std::fprintf(stderr, "partition_ab: the outputs differ by %.2g, more than %.0e\n", difference,
                 kMaxDifference);
    return 1;
  }
  return 0;
}
