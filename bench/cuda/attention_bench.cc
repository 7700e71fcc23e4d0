// bench/cuda/attention_bench.cc — the CUDA paged decode attention
// (kernels/cuda/device.h) on a GPU: KV bytes read per second beside the
// device's own ceiling, a device-to-device copy of 1 GiB (bytes read and
// written per second), and the ratio. Llama 3 8B's attention shape (32 query
// heads, 8 KV heads, head_dim 128), block tables shuffled, layers rotated so
// the KV is read from HBM and not the L2. Prints a Markdown table.
//
//   bench_cuda_attention [--iters-ms MS]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "common/kv_layout.h"
#include "kernels/cuda/device.h"

using namespace baton;
using namespace baton::kernels::cuda;
using baton::kernels::PagedAttentionParams;

namespace {

constexpr int32_t kHeads = 32, kKvHeads = 8, kHeadDim = 128, kBlockSize = 16;
// Layers rotate until this many bytes are read (at most 64 layers: at least
// 256 MiB), far past the 50-60 MB L2.
constexpr size_t kColdBytes = size_t(1) << 30;
// The largest pool a case may allocate.
constexpr size_t kMaxPoolBytes = size_t(24) << 30;

bool check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
  return false;
}
bool check(const Status& s, const char* what) {
  if (s.is_ok()) return true;
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return false;
}

// Milliseconds of `n` runs of `f` on the default stream, timed by events.
template <typename F>
double time_ms(int n, F&& f) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start);
  for (int i = 0; i < n; ++i) f(i);
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

// Runs `f` enough times to fill about `budget_ms`; returns ms per run.
template <typename F>
double ms_per_run(double budget_ms, F&& f) {
  for (int i = 0; i < 3; ++i) f(i);  // warm-up
  double probe = time_ms(10, f) / 10;
  int n = std::max(10, int(budget_ms / std::max(probe, 1e-3)));
  return time_ms(n, f) / n;
}

// Device-to-device copy of 1 GiB: (read + written) bytes per second.
double copy_ceiling_gbs(double budget_ms) {
  const size_t bytes = size_t(1) << 30;
  auto src = DeviceBuffer::allocate(bytes);
  auto dst = DeviceBuffer::allocate(bytes);
  if (!src.is_ok() || !dst.is_ok()) return 0;
  cudaMemset(src->data(), 1, bytes);
  double ms = ms_per_run(budget_ms, [&](int) {
    cudaMemcpyAsync(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice);
  });
  return 2.0 * double(bytes) / (ms * 1e6);
}

struct Row {
  std::string dtype;
  int32_t batch, ctx;
  double kv_mib, us, gbs;
};

bool run_case(DType dtype, int32_t batch, int32_t ctx, double budget_ms, Row& row) {
  KvLayout layout{.num_layers = 1,
                  .num_blocks = batch * ((ctx + kBlockSize - 1) / kBlockSize),
                  .block_size = kBlockSize,
                  .num_kv_heads = kKvHeads,
                  .head_dim = kHeadDim,
                  .dtype = dtype};
  const size_t layer_bytes = layout.layer_elements() * layout.element_bytes();
  if (layer_bytes > kMaxPoolBytes) {
    std::fprintf(stderr, "case %d x %d: one layer exceeds %zu GiB\n", batch, ctx,
                 kMaxPoolBytes >> 30);
    return false;
  }
  layout.num_layers = int32_t(std::clamp<size_t>(kColdBytes / layer_bytes, 1, 64));
  layout.num_layers = int32_t(std::min<size_t>(layout.num_layers, kMaxPoolBytes / layer_bytes));
  auto pool = DeviceBuffer::allocate(layout.total_bytes());
  if (!check(pool.status(), "KV pool")) return false;
  // 0x3c in every byte: small finite values in each dtype.
  if (!check(cudaMemset(pool->data(), 0x3c, layout.total_bytes()), "fill")) return false;

  std::mt19937_64 rng(7);
  std::vector<int32_t> ids(size_t(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  std::vector<int32_t> lens(size_t(batch), ctx);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(size_t(batch) * kHeads * kHeadDim);
  for (float& x : q) x = normal(rng);
  auto d_q = DeviceBuffer::allocate(q.size() * sizeof(float));
  auto d_out = DeviceBuffer::allocate(q.size() * sizeof(float));
  auto d_lens = DeviceBuffer::allocate(lens.size() * sizeof(int32_t));
  auto d_table = DeviceBuffer::allocate(ids.size() * sizeof(int32_t));
  if (!d_q.is_ok() || !d_out.is_ok() || !d_lens.is_ok() || !d_table.is_ok()) return false;
  if (!check(d_q->copy_from_host(q.data(), q.size() * sizeof(float)), "q") ||
      !check(d_lens->copy_from_host(lens.data(), lens.size() * sizeof(int32_t)), "lens") ||
      !check(d_table->copy_from_host(ids.data(), ids.size() * sizeof(int32_t)), "tables"))
    return false;

  PagedAttentionParams p;
  p.q = static_cast<const float*>(d_q->data());
  p.out = static_cast<float*>(d_out->data());
  p.kv_pool = pool->data();
  p.layout = layout;
  p.num_heads = kHeads;
  p.num_seqs = batch;
  p.context_lens = static_cast<const int32_t*>(d_lens->data());
  p.block_tables = static_cast<const int32_t*>(d_table->data());
  p.block_table_stride = layout.num_blocks / batch;
  p.scale = 1.0f / std::sqrt(float(kHeadDim));
  Status launched;
  double ms = ms_per_run(budget_ms, [&](int i) {
    p.layer = i % layout.num_layers;
    if (launched.is_ok()) launched = paged_decode_attention(p, nullptr);
  });
  if (!check(launched, "paged_decode_attention") || !check(cudaDeviceSynchronize(), "sync"))
    return false;
  const double kv_bytes =
      double(batch) * ctx * 2.0 * kKvHeads * kHeadDim * double(layout.element_bytes());
  row = {std::string(dtype_name(dtype)), batch,    ctx,
         kv_bytes / (1 << 20),           ms * 1e3, kv_bytes / (ms * 1e6)};
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  double budget_ms = 200;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::string(argv[i]) != "--iters-ms") continue;
    char* end = nullptr;
    budget_ms = std::strtod(argv[i + 1], &end);
    if (end == argv[i + 1] || *end != '\0' || budget_ms <= 0) {
      std::fprintf(stderr, "bench_cuda_attention: --iters-ms takes a positive number\n");
      return 2;
    }
  }
  if (device_count() == 0) {
    std::fprintf(stderr, "bench_cuda_attention: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double ceiling = copy_ceiling_gbs(budget_ms);
  std::printf("device: %s, %d SMs; ceiling: device-to-device copy %.0f GB/s (read + written)\n\n",
              prop.name, prop.multiProcessorCount, ceiling);
  std::printf("| KV dtype | batch | context | KV MiB per call | us per call | KV GB/s | ratio |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  int failed = 0;
  for (DType dtype : {DType::kBF16, DType::kF32}) {
    for (int32_t batch : {1, 16, 64}) {
      for (int32_t ctx : {1024, 4096, 16384}) {
        Row r;
        if (!run_case(dtype, batch, ctx, budget_ms, r)) {
          ++failed;
          continue;
        }
        std::printf("| %s | %d | %d | %.1f | %.1f | %.0f | ", r.dtype.c_str(), r.batch, r.ctx,
                    r.kv_mib, r.us, r.gbs);
        if (ceiling > 0) {
          std::printf("%.0f%% |\n", 100.0 * r.gbs / ceiling);
        } else {
          std::printf("— |\n");
        }
      }
    }
  }
  if (ceiling <= 0) ++failed;
  return failed == 0 ? 0 : 1;
}
