// Paged decode attention over the KV cache: bytes of K/V read per second and
// the ratio to the measured memory bandwidth.
#include <benchmark/benchmark.h>

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "bench/amx_ceiling.h"
#include "bench/ceilings.h"
#include "bench/huge_buffer.h"
#include "bench/manual_time.h"
#include "bench/normal_fill.h"
#include "bench/stats.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_amx.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/prefetch_stream.h"
#include "kernels/cpu/simd_avx2.h"

namespace baton::bench {
namespace {

using kernels::cpu::PagedAttentionParams;

// SmolLM2-135M attention: 9 query heads, 3 KV heads, head_dim 64.
constexpr int32_t kHeads = 9, kKvHeads = 3, kHeadDim = 64, kBlockSize = 16;
// Layers are rotated between iterations until this many bytes are touched, so
// the KV cache of small cases is not served from the last-level cache (a real
// model reads a different layer's cache in every attention call).
constexpr size_t kColdBytes = size_t(256) << 20;

// Reads partitions [b, e) (each the block addresses of one partition) the
// way the decode kernel's two passes walk them: every block's K part, then
// every V part, behind the kernel's own prefetch stream (one part ahead,
// ending with the next partition's first K part; the fused AVX2 runs read
// K and V of four blocks at a time instead). Returns a lane of the sum.
BATON_AVX2 float read_partitions(const std::vector<std::vector<const char*>>& partitions, int64_t b,
                                 int64_t e, size_t part_bytes) {
  __m256 acc = _mm256_setzero_ps();
  std::vector<const char*> regions;
  for (int64_t i = b; i < e; ++i) {
    const auto& blocks = partitions[size_t(i)];
    regions.clear();
    kernels::cpu::PrefetchStream::k_then_v(blocks.data(), int32_t(blocks.size()), part_bytes,
                                           i + 1 < e ? partitions[size_t(i + 1)][0] : nullptr,
                                           regions);
    kernels::cpu::PrefetchStream prefetch(regions.data(), int32_t(regions.size()), part_bytes);
    prefetch.prime(1);
    for (size_t v = 0; v < 2; ++v)
      for (const char* block : blocks)
        for (size_t o = 0; o < part_bytes; o += kernels::cpu::kCacheLine) {
          prefetch.consumed(kernels::cpu::kCacheLine);
          const float* line = reinterpret_cast<const float*>(block + v * part_bytes + o);
          acc = _mm256_add_ps(acc, _mm256_add_ps(_mm256_loadu_ps(line), _mm256_loadu_ps(line + 8)));
        }
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, acc);
  return lanes[0];
}

// GB/s of a plain read of one layer's K and V in the decode kernel's
// two-pass order and with its prefetching (read_partitions), per 256-token partition, the
// partitions shared out over the pool's threads: what the memory system gives
// for the kernel's reads with no arithmetic in the way.
double scattered_read_gbs(const PagedAttentionParams& p, int32_t batch, int32_t blocks_per_seq) {
  if (!kernels::cpu::use_avx2()) return 0.0;  // no ceiling: the ratio reads 0
  const KvLayout& L = p.layout;
  const size_t part_bytes = L.part_elements() * L.element_bytes();
  // Blocks per partition, as paged_attention cuts them.
  const int32_t kPartitionBlocks =
      (kernels::cpu::kDecodePartitionTokens + L.block_size - 1) / L.block_size;
  const auto* pool_bytes = static_cast<const char*>(p.kv_pool);
  std::vector<std::vector<const char*>> partitions;
  for (int32_t s = 0; s < batch; ++s)
    for (int32_t first = 0; first < blocks_per_seq; first += kPartitionBlocks) {
      auto& blocks = partitions.emplace_back();
      for (int32_t j = first; j < std::min(blocks_per_seq, first + kPartitionBlocks); ++j)
        blocks.push_back(
            pool_bytes +
            L.block_byte_offset(p.layer, p.block_tables[size_t(s) * p.block_table_stride + j]));
    }
  auto& pool = bench_pool();
  std::vector<float> sums(size_t(pool.size()), 0.0f);
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(int64_t(partitions.size()), [&](int64_t b, int64_t e, int t) {
    sums[size_t(t)] += read_partitions(partitions, b, e, part_bytes);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  benchmark::DoNotOptimize(sums.data());
  return double(batch) * blocks_per_seq * 2 * double(part_bytes) / seconds / 1e9;
}

void BM_PagedDecodeAttention(benchmark::State& state) {
  const int32_t ctx = int32_t(state.range(0));
  const int32_t batch = int32_t(state.range(1));
  const DType dtype = state.range(2) == 0 ? DType::kF32 : DType::kBF16;
  const bool cold = state.range(3) != 0;
  const bool scattered = state.range(4) != 0;
  const int32_t block_size = int32_t(state.range(5));
  const double bandwidth = measure_memory_bandwidth_gbs();

  const int32_t blocks_per_seq = (ctx + block_size - 1) / block_size;
  KvLayout layout;
  layout.block_size = block_size;
  layout.num_kv_heads = kKvHeads;
  layout.head_dim = kHeadDim;
  layout.dtype = dtype;
  layout.num_blocks = blocks_per_seq * batch;
  layout.num_layers = 1;
  const size_t layer_bytes = layout.layer_elements() * layout.element_bytes();
  layout.num_layers = cold ? int32_t(std::clamp<size_t>(kColdBytes / layer_bytes, 1, 64)) : 1;
  HugeBuffer kv_pool(layout.total_bytes());
  fill_normal(kv_pool.data(), dtype, layout.total_elements(), 42);
  std::mt19937_64 rng(42);

  std::vector<int32_t> ids(static_cast<size_t>(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  // Scattered: every block somewhere else, as in a pool fragmented by churn.
  // Otherwise each sequence's blocks are adjacent, as BlockManager hands them
  // out (lowest free ids first) where the pool is not fragmented.
  if (scattered) std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> query_start(static_cast<size_t>(batch) + 1),
      context_lens(size_t(batch), ctx);
  for (int32_t s = 0; s <= batch; ++s) query_start[size_t(s)] = s;
  std::vector<float> q(static_cast<size_t>(batch) * kHeads * kHeadDim), out(q.size());
  std::normal_distribution<float> normal;
  for (auto& x : q) x = normal(rng);

  PagedAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.kv_pool = kv_pool.data();
  p.layout = layout;
  p.num_heads = kHeads;
  p.num_seqs = batch;
  p.query_start = query_start.data();
  p.context_lens = context_lens.data();
  p.block_tables = ids.data();
  p.block_table_stride = blocks_per_seq;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  auto& pool = bench_pool();
  int32_t layer = 0;
  InterleavedCeiling ceiling(read_pass_gbs);
  // Reads a layer half the pool away from the one just used, so neither this
  // pass nor the next iteration finds the other's data in cache.
  InterleavedCeiling scattered_ceiling([&] {
    PagedAttentionParams other = p;
    other.layer = (p.layer + layout.num_layers / 2) % layout.num_layers;
    return scattered_read_gbs(other, batch, blocks_per_seq);
  });
  double seconds = 0;
  for (auto _ : state) {
    p.layer = layer;
    layer = (layer + 1) % layout.num_layers;
    const double took =
        time_iteration(state, seconds, [&] { kernels::cpu::paged_attention(pool, p); });
    benchmark::DoNotOptimize(out.data());
    // Cache-resident runs compare with nothing: a read pass would evict them.
    if (cold) {
      ceiling.after_iteration(took);
      scattered_ceiling.after_iteration(took);
    }
  }
  const double kv_bytes = double(batch) * ctx * 2 * kKvHeads * kHeadDim * layout.element_bytes();
  state.counters["KV_GBps"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // Read passes between the iterations (the ratio's ceiling), and the best of
  // the STREAM kernels taken once at start.
  if (cold) state.counters["bw_ceiling_GBps"] = ceiling.rate();
  state.counters["start_ceiling_GBps"] = bandwidth;
  if (cold) state.counters["ratio"] = ceiling.ratio(kv_bytes * double(state.iterations()), seconds);
  // The same reads with no arithmetic: how much of the gap to the read
  // passes the kernel's pattern of reads alone costs.
  if (cold) {
    state.counters["scattered_read_GBps"] = scattered_ceiling.rate();
    state.counters["ratio_to_scattered_read"] =
        scattered_ceiling.ratio(kv_bytes * double(state.iterations()), seconds);
  }
  state.counters["KV_bytes_MiB"] = kv_bytes / (1 << 20);
  state.SetLabel(std::string(dtype_name(dtype)) + (scattered ? " scattered" : " adjacent"));
}

void DecodeArgs(benchmark::internal::Benchmark* b) {
  for (int scattered : {1, 0})
    for (int dtype : {0, 1})
      for (int batch : {1, 16})
        for (int ctx : {1024, 4096, 16384}) b->Args({ctx, batch, dtype, 1, scattered, kBlockSize});
  // Cache-resident KV (one layer reused): the kernel's compute rate alone,
  // from L2/L3 (1k tokens) and from L2 (256 tokens: 192 KiB in BF16; with
  // --threads=1, one core's arithmetic with no memory in the way).
  for (int dtype : {0, 1})
    for (int ctx : {1024, 256}) b->Args({ctx, 1, dtype, 0, 1, kBlockSize});
  // 32-token blocks, BF16, scattered: half as many regions for the same
  // bytes (bench/results/2026-12-02-k-tiles-keys-side-by-side.md, "Block size").
  for (int batch : {1, 16})
    for (int ctx : {4096, 16384}) b->Args({ctx, batch, 1, 1, 1, 32});
  b->ArgNames({"ctx", "batch", "bf16", "cold", "scattered", "block"});
  b->UseManualTime()->ComputeStatistics("min", min_of)->ComputeStatistics("max", max_of);
}
BENCHMARK(BM_PagedDecodeAttention)->Apply(DecodeArgs);

// Causal prefill of one sequence (context = q_len, no earlier chunks): the
// attention FLOPs (QK and PV, causal half) per second, against sgemm passes
// (the F32 FMA kernels' ceiling) and, where a BF16 cache's prefill runs on
// AMX tiles, the tiles' peak, both measured between the calls.
void BM_PagedPrefillAttention(benchmark::State& state) {
  const int32_t q_len = int32_t(state.range(0));
  constexpr DType kDtypes[] = {DType::kF32, DType::kBF16, DType::kI8, DType::kFP8E4M3};
  const DType dtype = kDtypes[state.range(1)];
  const int32_t blocks = (q_len + kBlockSize - 1) / kBlockSize;
  KvLayout layout;
  layout.num_layers = 1;
  layout.num_blocks = blocks;
  layout.block_size = kBlockSize;
  layout.num_kv_heads = kKvHeads;
  layout.head_dim = kHeadDim;
  layout.dtype = dtype;
  HugeBuffer kv_pool(layout.total_bytes());
  std::mt19937_64 rng(42);
  std::vector<int32_t> ids(static_cast<size_t>(blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  {
    // Stored as the engine stores them (8-bit formats with their scales).
    std::vector<float> k(size_t(q_len) * kKvHeads * kHeadDim), v(k.size());
    fill_normal(k.data(), DType::kF32, k.size(), 42);
    fill_normal(v.data(), DType::kF32, v.size(), 43);
    std::vector<int32_t> slots(static_cast<size_t>(q_len));
    for (int32_t t = 0; t < q_len; ++t)
      slots[size_t(t)] = ids[size_t(t / kBlockSize)] * kBlockSize + t % kBlockSize;
    kernels::cpu::store_kv(bench_pool(), layout, kv_pool.data(), 0, k.data(), v.data(),
                           slots.data(), q_len);
  }
  std::vector<int32_t> query_start = {0, q_len}, context_lens = {q_len};
  std::vector<float> q(static_cast<size_t>(q_len) * kHeads * kHeadDim), out(q.size());
  std::normal_distribution<float> normal;
  for (auto& x : q) x = normal(rng);
  PagedAttentionParams p;
  p.q = q.data();
  p.out = out.data();
  p.kv_pool = kv_pool.data();
  p.layout = layout;
  p.num_heads = kHeads;
  p.num_seqs = 1;
  p.query_start = query_start.data();
  p.context_lens = context_lens.data();
  p.block_tables = ids.data();
  p.block_table_stride = blocks;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  const bool amx = kernels::cpu::attention_takes_amx(layout, q_len);
  InterleavedCeiling sgemm(sgemm_pass_gflops);
  InterleavedCeiling amx_peak(amx_bf16_pass_gflops);
  double seconds = 0;
  for (auto _ : state) {
    const double took =
        time_iteration(state, seconds, [&] { kernels::cpu::paged_attention(bench_pool(), p); });
    benchmark::DoNotOptimize(out.data());
    sgemm.after_iteration(took);
    if (amx) amx_peak.after_iteration(took);
  }
  // Causal: about q_len^2 / 2 (query, key) pairs, 2 x head_dim FMAs each per head.
  const double flops = double(q_len) * (q_len + 1) / 2 * kHeads * kHeadDim * 4;
  const double work = flops * double(state.iterations());
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["sgemm_ceiling_GFLOPs"] = sgemm.rate();
  state.counters["ratio"] = sgemm.ratio(work, seconds);
  if (amx) {
    state.counters["amx_peak_GFLOPs"] = amx_peak.rate();
    state.counters["of_amx_peak"] = amx_peak.ratio(work, seconds);
  }
  state.SetLabel(std::string(dtype_name(dtype)) + (amx ? " amx" : ""));
}
BENCHMARK(BM_PagedPrefillAttention)
    ->ArgNames({"q_len", "dtype"})  // f32, bf16, int8, fp8_e4m3
    ->Args({512, 0})
    ->Args({512, 1})
    ->Args({2048, 1})
    ->Args({2048, 2})
    ->Args({2048, 3})
    ->UseManualTime()
    ->ComputeStatistics("min", min_of)
    ->ComputeStatistics("max", max_of);

}  // namespace
}  // namespace baton::bench
