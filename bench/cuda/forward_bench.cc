// bench/cuda/forward_bench.cc — the CUDA engine on a GPU, each result beside
// the device's own ceiling:
//
//  * decode steps of Llama 3 8B's shape (random BF16 weights, --layers of its
//    32), batch 1 / 8 / 64 at context 1k / 4k: step time against the time to
//    read the weights a step reads plus the KV it attends to at the measured
//    device-to-device copy bandwidth (goal: batch 1 within 1.15x of it);
//  * paged attention alone (FlashInfer's decode kernel through Baton's pool):
//    KV GB/s against the copy bandwidth (goal: 85% at batch >= 16, ctx >= 4k);
//  * prefill of 2048 tokens: tokens/s, and its matmul FLOP rate against
//    cuBLASLt's measured BF16 rate on the model's largest GEMM (goal: 60%).
//
// Prints Markdown tables; exits 2 without a device.
//
//   bench_cuda_forward [--layers N] [--budget-ms MS]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/block_manager.h"
#include "engine/checkpoint.h"
#include "engine/cuda_forward.h"
#include "engine/make_model.h"
#include "engine/model.h"
#include "kernels/cuda/device.h"
#include "kernels/cuda/gemm.h"
#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/stream.h"

using namespace baton;
namespace kc = baton::kernels::cuda;
using Clock = std::chrono::steady_clock;

namespace {

bool check(const Status& s, const char* what) {
  if (s.is_ok()) return true;
  std::fprintf(stderr, "%s: %s\n", what, s.to_string().c_str());
  return false;
}

// Milliseconds per call of `f` (which must leave the device idle when it
// returns), over about `budget_ms` after a warm-up.
template <typename F>
double ms_per_call(double budget_ms, F&& f) {
  for (int i = 0; i < 3; ++i) f();
  auto t0 = Clock::now();
  int n = 0;
  double ms = 0;
  do {
    f();
    ++n;
    ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  } while (ms < budget_ms || n < 5);
  return ms / n;
}

// Device-to-device copy of 1 GiB: bytes read and written per second.
double copy_gbs(double budget_ms) {
  const size_t bytes = size_t(1) << 30;
  auto src = kc::DeviceBuffer::allocate(bytes), dst = kc::DeviceBuffer::allocate(bytes);
  if (!src.is_ok() || !dst.is_ok()) return 0;
  cudaMemset(src->data(), 1, bytes);
  double ms = ms_per_call(
      budget_ms, [&] { cudaMemcpy(dst->data(), src->data(), bytes, cudaMemcpyDeviceToDevice); });
  return 2.0 * double(bytes) / (ms * 1e6);
}

// cuBLASLt's BF16 rate (TFLOP/s) on an [m, k] x [k, n] GEMM.
double gemm_tflops(int64_t m, int64_t n, int64_t k, double budget_ms) {
  auto gemm = kc::Gemm::create();
  auto x = kc::DeviceBuffer::allocate(size_t(m * k) * 2),
       w = kc::DeviceBuffer::allocate(size_t(n * k) * 2),
       out = kc::DeviceBuffer::allocate(size_t(m * n) * 2);
  auto stream = kc::Stream::create();
  if (!gemm.is_ok() || !x.is_ok() || !w.is_ok() || !out.is_ok() || !stream.is_ok()) return 0;
  cudaMemset(x->data(), 0, size_t(m * k) * 2);
  cudaMemset(w->data(), 0, size_t(n * k) * 2);
  Status status;
  double ms = ms_per_call(budget_ms, [&] {
    status =
        (*gemm)->run({.x = x->data(), .w = w->data(), .out = out->data(), .m = m, .n = n, .k = k},
                     stream->handle());
    (void)stream->synchronize();
  });
  if (!check(status, "gemm")) return 0;
  return 2.0 * double(m) * double(n) * double(k) / (ms * 1e9);
}

struct Model {
  engine::ModelConfig config;
  std::unique_ptr<engine::Checkpoint> checkpoint;
  std::unique_ptr<engine::LlamaModel> model;
};

bool load_model(int32_t layers, const std::filesystem::path& dir, Model& m) {
  auto config = engine::model_preset("llama3-8b");
  if (!check(config.status(), "preset")) return false;
  config->num_layers = layers;
  std::fprintf(stderr, "writing a %d-layer llama3-8b-shaped BF16 checkpoint to %s\n", layers,
               dir.c_str());
  if (!check(engine::make_random_checkpoint(*config, dir, {.seed = 1, .dtype = DType::kBF16}),
             "make model"))
    return false;
  auto checkpoint = engine::Checkpoint::open(dir);
  if (!check(checkpoint.status(), "open")) return false;
  m.checkpoint = std::move(checkpoint).value();
  auto backend = engine::make_cuda_forward(0, *m.checkpoint);
  if (!check(backend.status(), "CUDA backend")) return false;
  m.config = m.checkpoint->config();
  m.model = std::make_unique<engine::LlamaModel>(*m.checkpoint, std::move(backend).value());
  return true;
}

// Bytes of weights one step reads: every layer's matrices and the lm_head
// (the embedding table only by the rows of the step's tokens).
double step_weight_bytes(const engine::ModelConfig& c) {
  const double h = c.hidden_size, q = double(c.num_heads) * c.head_dim,
               kv = double(c.num_kv_heads) * c.head_dim, f = c.intermediate_size;
  const double layer = h * (q + 2 * kv) + q * h + 3 * h * f;
  return 2.0 * (c.num_layers * layer + double(c.vocab_size) * h);
}

// Sequences of `ctx` tokens each (batch of them) in adjacent runs of a
// shuffled pool; one step of one new token each, at position ctx - 1.
double decode_step_ms(Model& m, engine::KvPool& pool, int32_t batch, int32_t ctx,
                      double budget_ms) {
  const int32_t bs = pool.layout().block_size;
  engine::BlockManager manager(pool.layout().num_blocks);
  std::vector<engine::BlockTable> tables(static_cast<size_t>(batch), engine::BlockTable(bs));
  std::vector<int32_t> tokens(size_t(batch), 5);
  engine::StepPlan plan;
  for (int32_t b = 0; b < batch; ++b) {
    if (!check(tables[size_t(b)].reserve(manager, ctx), "reserve")) return 0;
    tables[size_t(b)].commit(ctx - 1);
    plan.sequences.push_back({.token_ids = std::span<const int32_t>(&tokens[size_t(b)], 1),
                              .start_position = ctx - 1,
                              .block_table = &tables[size_t(b)],
                              .wants_logits = true});
  }
  std::vector<float> logits;
  Status status;
  double ms = ms_per_call(budget_ms, [&] { status = m.model->forward(plan, pool, &logits); });
  return check(status, "decode step") ? ms : 0;
}

double prefill_ms(Model& m, engine::KvPool& pool, int32_t tokens, double budget_ms) {
  engine::BlockManager manager(pool.layout().num_blocks);
  engine::BlockTable table(pool.layout().block_size);
  if (!check(table.reserve(manager, tokens), "reserve")) return 0;
  std::vector<int32_t> ids(static_cast<size_t>(tokens));
  for (int32_t i = 0; i < tokens; ++i) ids[size_t(i)] = 3 + i % 1000;
  engine::StepPlan plan{
      {{.token_ids = ids, .start_position = 0, .block_table = &table, .wants_logits = true}}};
  std::vector<float> logits;
  Status status;
  double ms = ms_per_call(budget_ms, [&] { status = m.model->forward(plan, pool, &logits); });
  return check(status, "prefill") ? ms : 0;
}

// FlashInfer's decode attention alone over one layer of a shuffled pool.
double attention_gbs(const engine::ModelConfig& c, int32_t batch, int32_t ctx, double budget_ms) {
  const int32_t bs = 16, blocks_per_seq = (ctx + bs - 1) / bs;
  KvLayout layout{.num_layers = 1,
                  .num_blocks = batch * blocks_per_seq,
                  .block_size = bs,
                  .num_kv_heads = c.num_kv_heads,
                  .head_dim = c.head_dim,
                  .dtype = DType::kBF16,
                  .key_order = KeyOrder::kTokenMajor};
  auto pool = kc::DeviceBuffer::allocate(layout.total_bytes());
  const size_t q_bytes = size_t(batch) * c.num_heads * c.head_dim * 2;
  auto q = kc::DeviceBuffer::allocate(q_bytes), out = kc::DeviceBuffer::allocate(q_bytes);
  // No windows: the rate of reading every key of the context.
  auto attention = kc::PagedAttention::create({.num_heads = c.num_heads,
                                               .num_kv_heads = c.num_kv_heads,
                                               .head_dim = c.head_dim,
                                               .block_size = bs,
                                               .layer_windows = {}});
  auto stream = kc::Stream::create();
  if (!pool.is_ok() || !q.is_ok() || !out.is_ok() || !attention.is_ok() || !stream.is_ok())
    return 0;
  cudaMemset(pool->data(), 0, layout.total_bytes());
  cudaMemset(q->data(), 0, q_bytes);
  std::vector<int32_t> ids(size_t(layout.num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), std::mt19937(7));
  std::vector<int32_t> query_start(size_t(batch) + 1), lens(size_t(batch), ctx);
  std::iota(query_start.begin(), query_start.end(), 0);
  kernels::PagedAttentionParams p;
  p.q = q->data();
  p.out = out->data();
  p.qo_dtype = DType::kBF16;
  p.kv_pool = pool->data();
  p.layout = layout;
  p.num_heads = c.num_heads;
  p.num_seqs = batch;
  p.query_start = query_start.data();
  p.context_lens = lens.data();
  p.block_tables = ids.data();
  p.block_table_stride = blocks_per_seq;
  p.scale = 1.0f / std::sqrt(float(c.head_dim));
  if (!check((*attention)->plan(p, stream->handle()), "plan")) return 0;
  Status status;
  double ms = ms_per_call(budget_ms, [&] {
    status = (*attention)->run(p, stream->handle());
    (void)stream->synchronize();
  });
  if (!check(status, "attention")) return 0;
  return double(batch) * ctx * layout.bytes_per_token() / (ms * 1e6);
}

}  // namespace

int main(int argc, char** argv) {
  int32_t layers = 4;
  double budget_ms = 300;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--layers") == 0) layers = std::atoi(argv[i + 1]);
    if (std::strcmp(argv[i], "--budget-ms") == 0) budget_ms = std::atof(argv[i + 1]);
  }
  if (kc::device_count() == 0) {
    std::fprintf(stderr, "bench_cuda_forward: no CUDA device\n");
    return 2;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  const double copy = copy_gbs(budget_ms);
  std::printf("Device: %s. Device-to-device copy: %.0f GB/s (read + written).\n\n", prop.name,
              copy);

  const auto dir = std::filesystem::temp_directory_path() /
                   ("baton-bench-llama3-" + std::to_string(layers) + "l");
  std::filesystem::remove_all(dir);
  Model m;
  if (!load_model(layers, dir, m)) return 1;
  const int64_t budget_blocks = int64_t(64) * 4096 / 16 + 64;
  auto pool = m.model->backend().allocate_kv_pool(
      m.model->kv_layout(int32_t(budget_blocks), 16, DType::kBF16));
  if (!check(pool.status(), "KV pool")) return 1;

  std::printf("Decode step, llama3-8b shape, %d of 32 layers, BF16:\n\n", layers);
  std::printf("| batch | context | step ms | floor ms | step / floor |\n|---|---|---|---|---|\n");
  const double weights = step_weight_bytes(m.config);
  for (int32_t batch : {1, 8, 64}) {
    for (int32_t ctx : {1024, 4096}) {
      const double ms = decode_step_ms(m, *pool, batch, ctx, budget_ms);
      const double kv = double(batch) * ctx * pool->layout().bytes_per_token();
      const double floor_ms = (weights + kv) / (copy * 1e6);
      std::printf("| %d | %d | %.3f | %.3f | %.2f |\n", batch, ctx, ms, floor_ms,
                  floor_ms > 0 ? ms / floor_ms : 0.0);
    }
  }

  std::printf("\nPaged decode attention alone (one layer, 32/8 heads, head_dim 128):\n\n");
  std::printf("| batch | context | KV GB/s | copy GB/s | ratio |\n|---|---|---|---|---|\n");
  for (int32_t batch : {16, 64}) {
    for (int32_t ctx : {4096, 16384}) {
      const double gbs = attention_gbs(m.config, batch, ctx, budget_ms);
      std::printf("| %d | %d | %.0f | %.0f | %.2f |\n", batch, ctx, gbs, copy, gbs / copy);
    }
  }

  const int32_t tokens = 2048;
  const double ms = prefill_ms(m, *pool, tokens, budget_ms);
  const auto& c = m.config;
  const double matmul_params =
      step_weight_bytes(c) / 2 - double(c.vocab_size) * c.hidden_size;  // lm_head: one row
  const double flops =
      2.0 * matmul_params * tokens + 2.0 * double(c.vocab_size) * c.hidden_size +
      2.0 * 2.0 * c.num_layers * double(tokens) * tokens / 2 * c.num_heads * c.head_dim;
  const double tflops = ms > 0 ? flops / (ms * 1e9) : 0;
  const double ceiling = gemm_tflops(tokens, c.intermediate_size, c.hidden_size, budget_ms);
  std::printf(
      "\nPrefill of %d tokens: %.1f ms, %.0f tokens/s, %.1f TFLOP/s against cuBLASLt's "
      "%.1f TFLOP/s (%d x %d x %d BF16): %.2f\n",
      tokens, ms, ms > 0 ? tokens / (ms / 1e3) : 0.0, tflops, ceiling, tokens, c.intermediate_size,
      c.hidden_size, ceiling > 0 ? tflops / ceiling : 0.0);
  std::filesystem::remove_all(dir);
  return 0;
}
