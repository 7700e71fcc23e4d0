#include "bench/ceilings.h"

#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <vector>

#include "bench/huge_buffer.h"
#include "kernels/cpu/blas_setup.h"

namespace baton::bench {
namespace {

using Clock = std::chrono::steady_clock;

// 96 MiB per array: three times a 32 MiB L3, so every pass goes to DRAM.
constexpr size_t kStreamFloats = size_t(96) << 18;
constexpr int kStreamPasses = 6;
// A prefill-like sgemm: 512 tokens x 1024 inputs x 1024 outputs.
constexpr int kGemmM = 512, kGemmN = 1024, kGemmK = 1024;
constexpr int kGemmRepeats = 6;

// Sum of n floats with AVX2 when available and four independent accumulators,
// so the loop is limited by the memory system, not by add latency. Every line
// is prefetched 4 KiB ahead into L2, as the batch-1 GEMV streams its weights:
// on the Intel Xeon that stream read faster than this loop without them, so
// without them the ceiling would sit below what a kernel reaches.
__attribute__((target("avx2"))) double sum_floats_avx2(const float* p, size_t n) {
  constexpr size_t kAheadFloats = 4096 / sizeof(float);
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(),
                 _mm256_setzero_ps()};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    __builtin_prefetch(p + i + kAheadFloats, 0, 2);
    __builtin_prefetch(p + i + 16 + kAheadFloats, 0, 2);
    for (int j = 0; j < 4; ++j) s[j] = _mm256_add_ps(s[j], _mm256_loadu_ps(p + i + 8 * j));
  }
  float lanes[8];
  _mm256_storeu_ps(lanes, _mm256_add_ps(_mm256_add_ps(s[0], s[1]), _mm256_add_ps(s[2], s[3])));
  double total = 0.0;
  for (float v : lanes) total += v;
  for (; i < n; ++i) total += p[i];
  return total;
}

double sum_floats(const float* p, size_t n) {
  if (__builtin_cpu_supports("avx2")) return sum_floats_avx2(p, n);
  double total = 0.0;
  for (size_t i = 0; i < n; ++i) total += p[i];
  return total;
}

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Seconds of one pass of fn on all pool threads, each over its chunk.
template <typename F>
double pass_seconds(kernels::cpu::ThreadPool& pool, size_t n, F&& fn) {
  auto t0 = Clock::now();
  pool.parallel_for(int64_t(n), [&](int64_t b, int64_t e, int t) { fn(size_t(b), size_t(e), t); });
  return seconds_since(t0);
}

// Best of kStreamPasses calls of `timed_pass` (seconds).
template <typename F>
double best_of_passes(F&& timed_pass) {
  double best = 1e30;
  for (int pass = 0; pass < kStreamPasses; ++pass) best = std::min(best, timed_pass());
  return best;
}

// Seconds of one read of p[0, n) (a sum, so nothing is optimised away) on
// all pool threads.
double read_seconds(kernels::cpu::ThreadPool& pool, const float* p, size_t n) {
  std::vector<double> sums(static_cast<size_t>(pool.size()), 0.0);
  const double seconds = pass_seconds(pool, n, [&](size_t lo, size_t hi, int t) {
    sums[size_t(t)] += sum_floats(p + lo, hi - lo);
  });
  volatile double sink = sums[0];
  (void)sink;
  return seconds;
}

}  // namespace

namespace {
int g_bench_threads = 0;
}  // namespace

void set_bench_threads(int threads) { g_bench_threads = threads; }

kernels::cpu::ThreadPool& bench_pool() {
  static kernels::cpu::ThreadPool pool(g_bench_threads);
  return pool;
}

double MemoryBandwidth::best_gbs() const { return std::max({read_gbs, copy_gbs, triad_gbs}); }

const MemoryBandwidth& measure_memory_bandwidth() {
  static const MemoryBandwidth result = [] {
    auto& pool = bench_pool();
    const size_t n = kStreamFloats;
    // In 2 MiB pages unless --huge_pages=0, as the weights and KV pools the
    // kernels stream from are: 2 MiB pages read 13-27% faster here, and the
    // ceiling is the best this machine does.
    HugeBuffer a_buffer(n * sizeof(float)), b_buffer(n * sizeof(float)),
        c_buffer(n * sizeof(float));
    auto* a = reinterpret_cast<float*>(a_buffer.data());
    auto* b = reinterpret_cast<float*>(b_buffer.data());
    auto* c = reinterpret_cast<float*>(c_buffer.data());
    if (a == nullptr || b == nullptr || c == nullptr) {
      std::fprintf(stderr, "cannot map the bandwidth test's arrays\n");
      std::exit(1);
    }
    // First touch from the threads that will use each chunk.
    pool.parallel_for(int64_t(n), [&](int64_t lo, int64_t hi, int) {
      for (int64_t i = lo; i < hi; ++i)
        a[size_t(i)] = 1.0f, b[size_t(i)] = 2.0f, c[size_t(i)] = 0.5f;
    });
    const double read_s = best_of_passes([&] { return read_seconds(pool, a, n); });
    const double copy_s = best_of_passes([&] {
      return pass_seconds(pool, n,
                          [&](size_t lo, size_t hi, int) { std::copy(a + lo, a + hi, b + lo); });
    });
    const float scalar = 3.0f;
    const double triad_s = best_of_passes([&] {
      return pass_seconds(pool, n, [&](size_t lo, size_t hi, int) {
        for (size_t i = lo; i < hi; ++i) a[i] = b[i] + scalar * c[i];
      });
    });
    const double bytes = double(n) * sizeof(float);
    MemoryBandwidth bw{bytes / read_s / 1e9, 2 * bytes / copy_s / 1e9, 3 * bytes / triad_s / 1e9};
    std::fprintf(stderr,
                 "ceiling: memory bandwidth read %.1f GB/s, copy %.1f GB/s, triad %.1f GB/s "
                 "(%d threads, %zu MiB arrays)\n",
                 bw.read_gbs, bw.copy_gbs, bw.triad_gbs, pool.size(), n * sizeof(float) >> 20);
    return bw;
  }();
  return result;
}

double read_pass_gbs() {
  auto& pool = bench_pool();
  const size_t n = kStreamFloats;
  static const float* p = [&] {
    static HugeBuffer buffer(n * sizeof(float));
    auto* data = reinterpret_cast<float*>(buffer.data());
    if (data == nullptr) {
      std::fprintf(stderr, "cannot map the read pass's array\n");
      std::exit(1);
    }
    // First touch from the threads that will read each chunk.
    pool.parallel_for(int64_t(n),
                      [&](int64_t lo, int64_t hi, int) { std::fill(data + lo, data + hi, 1.0f); });
    return data;
  }();
  return double(n) * sizeof(float) / read_seconds(pool, p, n) / 1e9;
}

void InterleavedCeiling::after_iteration(double iteration_seconds) {
  since_last_pass_ += iteration_seconds;
  if (since_last_pass_ < kEverySeconds) return;
  since_last_pass_ = 0;
  inverse_rates_ += 1.0 / pass_();
  ++passes_;
}

namespace {

struct SgemmBuffers {
  std::vector<float> a, b, c;
};

// One set per pool thread, each for a single-threaded sgemm: OpenBLAS is set
// to one thread here, as linear() runs it inside the pool.
std::vector<SgemmBuffers> make_sgemm_buffers(int threads) {
  kernels::cpu::setup_blas();
  std::vector<SgemmBuffers> buf(static_cast<size_t>(threads));
  for (auto& bf : buf) {
    bf.a.assign(size_t(kGemmM) * kGemmK, 0.5f);
    bf.b.assign(size_t(kGemmN) * kGemmK, 0.25f);
    bf.c.assign(size_t(kGemmM) * kGemmN, 0.0f);
  }
  return buf;
}

void run_sgemm(SgemmBuffers& bf) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kGemmM, kGemmN, kGemmK, 1.0f, bf.a.data(),
              kGemmK, bf.b.data(), kGemmK, 0.0f, bf.c.data(), kGemmN);
}

constexpr double kSgemmFlops = 2.0 * kGemmM * kGemmN * kGemmK;

// One sgemm per set of buffers, all at once on the pool: seconds.
double pool_sgemm_seconds(kernels::cpu::ThreadPool& pool, std::vector<SgemmBuffers>& buf) {
  const auto t0 = Clock::now();
  pool.parallel_for(int64_t(buf.size()), [&](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) run_sgemm(buf[size_t(i)]);
  });
  return seconds_since(t0);
}

}  // namespace

double sgemm_pass_gflops() {
  auto& pool = bench_pool();
  static std::vector<SgemmBuffers> buf = make_sgemm_buffers(pool.size());
  return double(buf.size()) * kSgemmFlops / pool_sgemm_seconds(pool, buf) / 1e9;
}

const SgemmRate& measure_sgemm() {
  static const SgemmRate result = [] {
    auto& pool = bench_pool();
    const int threads = pool.size();
    std::vector<SgemmBuffers> buf = make_sgemm_buffers(threads);
    run_sgemm(buf[0]);  // warm up
    double single = 1e30;
    for (int r = 0; r < kGemmRepeats; ++r) {
      auto t0 = Clock::now();
      run_sgemm(buf[0]);
      single = std::min(single, seconds_since(t0));
    }
    double all = 1e30;
    for (int r = 0; r < kGemmRepeats; ++r) all = std::min(all, pool_sgemm_seconds(pool, buf));
    SgemmRate rate{kSgemmFlops / single / 1e9, threads * kSgemmFlops / all / 1e9, threads};
    std::fprintf(stderr,
                 "ceiling: sgemm %dx%dx%d single thread %.1f GFLOP/s, %d threads concurrently "
                 "%.1f GFLOP/s\n",
                 kGemmM, kGemmN, kGemmK, rate.single_thread_gflops, threads, rate.pool_gflops);
    return rate;
  }();
  return result;
}

}  // namespace baton::bench
