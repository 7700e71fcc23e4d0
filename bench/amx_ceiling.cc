#include "bench/amx_ceiling.h"

#include <chrono>
#include <cstdint>

#include "bench/ceilings.h"
#include "kernels/cpu/amx_tiles.h"
#include "kernels/cpu/cpu_features.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace baton::bench {
namespace {

#if defined(__x86_64__)
// Enough tile operations per pass (about 1 ms on one core) that the start
// and the pool's wake-up are lost in it.
constexpr int64_t kIterations = 1 << 14;
constexpr double kFlopsPerTile = 2.0 * 16 * 16 * 32;

__attribute__((target("amx-tile,amx-bf16"))) void run_tiles() {
  alignas(64) static const uint16_t kZeros[16 * 32] = {};  // the values do not change the rate
  kernels::cpu::configure_amx_tiles();
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, kZeros, 64);
  _tile_loadd(5, kZeros, 64);
  _tile_loadd(6, kZeros, 64);
  _tile_loadd(7, kZeros, 64);
  for (int64_t i = 0; i < kIterations; ++i) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  kernels::cpu::release_amx_tiles();
}
#endif

}  // namespace

double amx_bf16_pass_gflops() {
#if defined(__x86_64__)
  if (!kernels::cpu::cpu_has_amx_bf16()) return 0.0;
  auto& pool = bench_pool();
  const auto t0 = std::chrono::steady_clock::now();
  pool.parallel_for(int64_t(pool.size()), [](int64_t b, int64_t e, int) {
    for (int64_t i = b; i < e; ++i) run_tiles();
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(pool.size()) * double(kIterations) * 4 * kFlopsPerTile / seconds / 1e9;
#else
  return 0.0;
#endif
}

}  // namespace baton::bench
