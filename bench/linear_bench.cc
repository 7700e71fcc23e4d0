// linear(): batch-1 GEMV (memory-bound: weight bytes/s vs bandwidth) and
// prefill m=512 (compute-bound: GFLOP/s vs the pool's sgemm rate).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <vector>

#include "bench/amx_ceiling.h"
#include "bench/ceilings.h"
#include "bench/huge_buffer.h"
#include "bench/manual_time.h"
#include "bench/normal_fill.h"
#include "bench/stats.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/gemv.h"
#include "kernels/cpu/linear.h"

namespace baton::bench {
namespace {

using kernels::cpu::WeightView;

// Weight copies are rotated until this many bytes are touched, so each GEMV
// streams its weights from DRAM as a decode step over a whole model does.
constexpr size_t kColdBytes = size_t(256) << 20;

DType dtype_arg(int64_t v) { return v == 0 ? DType::kF32 : v == 1 ? DType::kBF16 : DType::kF16; }

// In 2 MiB pages unless --huge_pages=0, as the engine maps a checkpoint.
struct Weights {
  std::unique_ptr<HugeBuffer> bytes;
  std::vector<WeightView> copies;
};

Weights make_weights(int64_t rows, int64_t cols, DType dtype, size_t min_total_bytes) {
  Weights w;
  const size_t one = size_t(rows * cols) * dtype_size(dtype);
  const size_t n = std::max<size_t>(1, (min_total_bytes + one - 1) / one);
  w.bytes = std::make_unique<HugeBuffer>(one * n);
  uint8_t* data = w.bytes->data();
  if (data == nullptr) {
    std::fprintf(stderr, "cannot map %zu bytes of weights\n", one * n);
    std::exit(1);
  }
  // Weights of a trained model's magnitude (random bytes would give subnormal products).
  fill_normal(data, dtype, size_t(rows * cols) * n, 7, 0.02f);
  for (size_t c = 0; c < n; ++c) w.copies.push_back({data + c * one, dtype, rows, cols});
  return w;
}

void BM_LinearGemv(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), m = state.range(3);
  const DType dtype = dtype_arg(state.range(2));
  const double bandwidth = measure_memory_bandwidth_gbs();
  Weights w = make_weights(rows, cols, dtype, kColdBytes);
  std::vector<float> x(static_cast<size_t>(m * cols), 0.5f), out(size_t(m * rows));
  auto& pool = bench_pool();
  size_t i = 0;
  InterleavedCeiling ceiling(read_pass_gbs);
  double seconds = 0;
  for (auto _ : state) {
    const double took = time_iteration(state, seconds, [&] {
      kernels::cpu::linear(pool, x.data(), m, w.copies[i], nullptr, out.data());
    });
    i = (i + 1) % w.copies.size();
    benchmark::DoNotOptimize(out.data());
    ceiling.after_iteration(took);
  }
  const double bytes = double(rows * cols) * dtype_size(dtype);
  state.counters["W_GBps"] =
      benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // Read passes between the iterations (the ratio's ceiling), and the best of
  // the STREAM kernels taken once at start.
  state.counters["bw_ceiling_GBps"] = ceiling.rate();
  state.counters["start_ceiling_GBps"] = bandwidth;
  state.counters["ratio"] = ceiling.ratio(bytes * double(state.iterations()), seconds);
  // Several rows of BF16 weights go to the AMX GEMM where the CPU has it.
  const bool amx = kernels::cpu::linear_takes_amx(m, dtype);
  state.SetLabel(std::string(dtype_name(dtype)) + (amx ? " amx" : ""));
}
BENCHMARK(BM_LinearGemv)
    ->ArgNames({"rows", "cols", "dtype", "m"})
    ->Args({4864, 896, 0, 1})
    ->Args({4864, 896, 1, 1})
    ->Args({4864, 896, 2, 1})
    ->Args({1536, 576, 0, 1})
    ->Args({1536, 576, 1, 1})
    ->Args({576, 576, 1, 1})  // smollm2's q_proj: 9 pieces of 64 rows before they were evened out
    ->Args({4864, 896, 1, 4})
    ->Args({4864, 896, 1, 8})
    ->Args({4864, 896, 1, 2})
    ->Args({4864, 896, 1, 16})
    ->Args({4864, 896, 1, 32})
    ->Args({1536, 576, 1, 2})
    ->Args({1536, 576, 1, 4})
    ->Args({1536, 576, 1, 8})
    ->Args({1536, 576, 1, 16})
    ->Args({1536, 576, 1, 32})
    ->Args({576, 576, 1, 16})
    ->UseManualTime()
    ->ComputeStatistics("min", min_of)
    ->ComputeStatistics("max", max_of);

void BM_LinearPrefill(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1), m = state.range(3);
  const DType dtype = dtype_arg(state.range(2));
  const SgemmRate& start_ceiling = measure_sgemm();
  Weights w = make_weights(rows, cols, dtype, 0);
  std::vector<float> x(static_cast<size_t>(m * cols), 0.5f), out(size_t(m * rows));
  auto& pool = bench_pool();
  InterleavedCeiling sgemm(sgemm_pass_gflops);
  // BF16 weights on AMX tiles are compared with the tiles' peak too.
  const bool amx = kernels::cpu::linear_takes_amx(m, dtype);
  InterleavedCeiling amx_peak(amx_bf16_pass_gflops);
  double seconds = 0;
  for (auto _ : state) {
    const double took = time_iteration(state, seconds, [&] {
      kernels::cpu::linear(pool, x.data(), m, w.copies[0], nullptr, out.data());
    });
    benchmark::DoNotOptimize(out.data());
    sgemm.after_iteration(took);
    if (amx) amx_peak.after_iteration(took);
  }
  const double flops = 2.0 * double(m * rows * cols);
  state.counters["GFLOPs"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  // sgemm passes between the calls (the ratio's ceiling), and the best of six
  // taken once at start.
  state.counters["sgemm_ceiling_GFLOPs"] = sgemm.rate();
  state.counters["start_sgemm_ceiling_GFLOPs"] = start_ceiling.pool_gflops;
  state.counters["ratio"] = sgemm.ratio(flops * double(state.iterations()), seconds);
  if (amx) {
    state.counters["amx_peak_GFLOPs"] = amx_peak.rate();
    state.counters["of_amx_peak"] = amx_peak.ratio(flops * double(state.iterations()), seconds);
  }
  state.SetLabel(std::string(dtype_name(dtype)) + (amx ? " amx" : ""));
}
BENCHMARK(BM_LinearPrefill)
    ->ArgNames({"rows", "cols", "dtype", "m"})
    ->Args({4864, 896, 0, 512})
    ->Args({4864, 896, 1, 512})
    ->Args({896, 4864, 1, 512})
    ->Args({1536, 576, 0, 512})
    ->Args({1536, 576, 1, 512})
    ->Args({576, 576, 1, 512})  // smollm2's q_proj and k_proj: uneven tiles before
    ->Args({192, 576, 1, 512})
    ->Args({4864, 896, 1, 16})
    ->UseManualTime()
    ->ComputeStatistics("min", min_of)
    ->ComputeStatistics("max", max_of);

void BM_Ceilings(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(measure_memory_bandwidth_gbs());
  const MemoryBandwidth& bw = measure_memory_bandwidth();
  const SgemmRate& g = measure_sgemm();
  state.counters["read_GBps"] = bw.read_gbs;
  state.counters["copy_GBps"] = bw.copy_gbs;
  state.counters["triad_GBps"] = bw.triad_gbs;
  state.counters["sgemm_1t_GFLOPs"] = g.single_thread_gflops;
  state.counters["sgemm_pool_GFLOPs"] = g.pool_gflops;
}
BENCHMARK(BM_Ceilings)->Iterations(1);

void BM_ThreadPoolDispatch(benchmark::State& state) {
  auto& pool = bench_pool();
  for (auto _ : state) pool.parallel_for(pool.size(), [](int64_t, int64_t, int) {});
}
BENCHMARK(BM_ThreadPoolDispatch)
    ->UseRealTime()
    ->ComputeStatistics("min", min_of)
    ->ComputeStatistics("max", max_of);

}  // namespace
}  // namespace baton::bench
