// bench/model_bench.cc — whole-model decode steps and prefill on real model
// shapes (random weights), beside the machine's measured ceilings.
//
// Decode is memory-bound: its ceiling is the measured memory bandwidth (read
// passes run between the steps, one per 50 ms of steps, so both see the same
// machine), and the result is the effective bandwidth (weight bytes + KV
// bytes read per step) / step time. Prefill is compute-bound: its ceiling is
// the measured sgemm rate over all threads (again a pass between prefills).
//
//   ./build/bench/model_bench --benchmark_filter=Decode [--huge_pages=0] [--threads=N]
// Checkpoints are written on first use under $BATON_BENCH_MODELS (default
// ./models/bench). DecodeSamePool/llama3-8b-8layers runs only where
// --benchmark_filter names llama3: its checkpoint takes 5.2 GiB there, and
// 9.2 GiB of memory with its pool.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_flags.h"
#include "bench/ceilings.h"
#include "bench/huge_buffer.h"
#include "engine/checkpoint.h"
#include "engine/cpu_forward.h"
#include "engine/make_model.h"
#include "engine/model.h"
#include "kernels/cpu/blas_setup.h"

namespace baton::bench {
namespace {

constexpr int32_t kDecodeContext = 512;  // tokens already cached per sequence
constexpr int32_t kLongDecodeContext = 4096;
constexpr int32_t kBlockSize = 16;

struct LoadedModel {
  std::unique_ptr<engine::Checkpoint> checkpoint;
  std::unique_ptr<engine::LlamaModel> model;
};

// A preset's shape; "llama3-8b-8layers" is llama3-8b's cut to its first
// 8 layers (every layer the same shape), for shapes whose whole model and
// a pool beside it would not fit in memory.
Result<engine::ModelConfig> bench_model_config(const std::string& preset) {
  const size_t dash = preset.rfind('-');
  const std::string suffix = dash == std::string::npos ? "" : preset.substr(dash + 1);
  if (suffix.size() > 6 && suffix.ends_with("layers")) {
    const int32_t layers = std::atoi(suffix.c_str());
    BATON_ASSIGN_OR_RETURN(engine::ModelConfig config,
                           engine::model_preset(preset.substr(0, dash)));
    if (layers < 1 || layers > config.num_layers)
      return invalid_argument(preset + ": 1 to " + std::to_string(config.num_layers) + " layers");
    config.num_layers = layers;
    return config;
  }
  return engine::model_preset(preset);
}

LoadedModel& load(const std::string& preset, DType dtype) {
  static std::map<std::string, LoadedModel> cache;
  std::string key = preset + "-" + std::string(dtype_name(dtype));
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const char* root_env = std::getenv("BATON_BENCH_MODELS");
  std::filesystem::path dir = std::filesystem::path(root_env ? root_env : "models/bench") / key;
  if (!std::filesystem::exists(dir / "config.json")) {
    auto config = bench_model_config(preset);
    engine::MakeModelOptions options;
    options.dtype = dtype;
    options.seed = 7;
    Status s =
        config.is_ok() ? engine::make_random_checkpoint(*config, dir, options) : config.status();
    if (!s.is_ok()) {
      std::fprintf(stderr, "cannot make %s: %s\n", key.c_str(), s.to_string().c_str());
      std::exit(1);
    }
  }
  // As Engine::create does by default (engine.huge_page_weights).
  const bool huge_pages = HugeBuffer::use_huge_pages();
  engine::HugePageReport r;
  auto checkpoint =
      huge_pages ? engine::Checkpoint::open_in_huge_pages(dir, r) : engine::Checkpoint::open(dir);
  if (!checkpoint.is_ok()) {
    std::fprintf(stderr, "cannot open %s: %s\n", dir.c_str(),
                 checkpoint.status().to_string().c_str());
    std::exit(1);
  }
  if (huge_pages) {
    std::fprintf(stderr, "%s: %llu of %llu MiB of weights in 2 MiB pages%s%s%s\n", key.c_str(),
                 (unsigned long long)(r.huge_bytes >> 20),
                 (unsigned long long)(r.eligible_bytes >> 20), r.reread ? " (re-read)" : "",
                 r.note.empty() ? "" : ": ", r.note.c_str());
  }
  LoadedModel loaded;
  loaded.checkpoint = std::move(checkpoint).value();
  // The ceilings' pool: --threads sizes both.
  loaded.model = std::make_unique<engine::LlamaModel>(*loaded.checkpoint, bench_pool());
  return cache.emplace(key, std::move(loaded)).first->second;
}

struct StepTimes {
  double step_seconds = 1.0;  // mean wall time of one step
  double ceiling = 0.0;       // the ceiling's passes between the steps (0: none ran)
};

// Runs the step once per iteration, with passes of a ceiling (read_pass_gbs,
// sgemm_pass_gflops) between them (bench/ceilings.h: InterleavedCeiling), so
// the two see the same machine.
StepTimes timed_steps(benchmark::State& state, LoadedModel& m, const engine::StepPlan& plan,
                      engine::KvPool& kv, std::vector<float>& logits, double (*ceiling_pass)()) {
  using Clock = std::chrono::steady_clock;
  double total = 0;
  int64_t steps = 0;
  InterleavedCeiling ceiling(ceiling_pass);
  for (auto _ : state) {
    auto start = Clock::now();
    Status status = m.model->forward(plan, kv, &logits);
    const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
    total += seconds;
    ++steps;
    if (!status.is_ok()) state.SkipWithError(status.to_string().c_str());
    benchmark::DoNotOptimize(logits.data());
    ceiling.after_iteration(seconds);
  }
  if (steps == 0) return {};
  return {total / double(steps), ceiling.rate()};
}

// One decode step for `batch` sequences of `context` cached tokens each,
// KV in kv_dtype. Every iteration rewrites the same slot, so the context
// stays constant.
// With same_pool, the argument is a BF16 batch, and the batch is as many
// sequences as the pool that holds those in BF16 holds in kv_dtype.
void run_decode(benchmark::State& state, const std::string& preset, DType dtype, DType kv_dtype,
                int32_t context, bool same_pool = false) {
  LoadedModel& m = load(preset, dtype);
  const auto& config = m.model->config();
  int32_t batch = int32_t(state.range(0));
  if (same_pool) {
    const double bf16_bytes = double(m.model->kv_layout(1, kBlockSize, DType::kBF16).block_bytes());
    const double kv_bytes = double(m.model->kv_layout(1, kBlockSize, kv_dtype).block_bytes());
    batch = int32_t(double(batch) * bf16_bytes / kv_bytes);
  }
  const int32_t blocks_per_seq = (context + 1 + kBlockSize - 1) / kBlockSize;
  auto kv =
      engine::KvPool::create(m.model->kv_layout(batch * blocks_per_seq, kBlockSize, kv_dtype));
  if (!kv.is_ok()) {
    state.SkipWithError(kv.status().to_string().c_str());
    return;
  }
  // Touch every block so attention reads real memory, not the zero page
  // (0x3c: 1.05 in F16/BF16 pairs, 60 as int8, 1.5 as fp8 and a 0.0115
  // scale: finite everywhere).
  std::memset(kv->data(), 0x3c, kv->bytes());
  engine::BlockManager manager(batch * blocks_per_seq);
  std::vector<engine::BlockTable> tables(static_cast<size_t>(batch),
                                         engine::BlockTable(kBlockSize));
  std::vector<int32_t> tokens(static_cast<size_t>(batch));
  engine::StepPlan plan;
  for (int32_t s = 0; s < batch; ++s) {
    (void)tables[size_t(s)].reserve(manager, context + 1);
    tables[size_t(s)].commit(context);
    tokens[size_t(s)] = 3 + s;
    plan.sequences.push_back({.token_ids = std::span<const int32_t>(&tokens[size_t(s)], 1),
                              .start_position = context,
                              .block_table = &tables[size_t(s)],
                              .wants_logits = true});
  }
  std::vector<float> logits;
  const StepTimes times = timed_steps(state, m, plan, *kv, logits, read_pass_gbs);
  const double step_seconds = times.step_seconds;
  const double kv_bytes = double(batch) * (context + 1) * double(kv->layout().bytes_per_token());
  const double bytes_per_step = double(m.checkpoint->weight_bytes()) + kv_bytes;
  const double achieved = bytes_per_step / step_seconds / 1e9;
  state.counters["tok_per_s"] = double(batch) / step_seconds;
  state.counters["GB_per_s"] = achieved;
  // The read passes between steps, and the best of the STREAM kernels taken
  // once at start; the ratio is against the first.
  state.counters["ceiling_GB_per_s"] = times.ceiling;
  state.counters["start_ceiling_GB_per_s"] = measure_memory_bandwidth_gbs();
  state.counters["ratio"] = (times.ceiling > 0 ? achieved / times.ceiling : 0.0);
  state.counters["kv_bytes_per_token"] = double(kv->layout().bytes_per_token());
  state.counters["batch"] = batch;
  state.SetLabel(preset + " " + std::string(dtype_name(dtype)) + " kv " +
                 std::string(dtype_name(kv_dtype)) + " ctx " + std::to_string(context) + " (" +
                 std::to_string(config.num_layers) + " layers)");
}

// Prefill of one 512-token prompt from an empty cache, into a KV pool of the
// weights' dtype (what the engine's kv_dtype: auto gives).
void run_prefill(benchmark::State& state, const std::string& preset, DType dtype) {
  const int32_t length = int32_t(state.range(0));
  LoadedModel& m = load(preset, dtype);
  const auto& c = m.model->config();
  const int32_t blocks = (length + kBlockSize - 1) / kBlockSize;
  auto kv = engine::KvPool::create(m.model->kv_layout(blocks, kBlockSize, dtype));
  if (!kv.is_ok()) {
    state.SkipWithError(kv.status().to_string().c_str());
    return;
  }
  engine::BlockManager manager(blocks);
  engine::BlockTable table(kBlockSize);
  (void)table.reserve(manager, length);
  std::vector<int32_t> tokens(static_cast<size_t>(length));
  for (int32_t i = 0; i < length; ++i) tokens[size_t(i)] = 3 + (i * 7919) % (c.vocab_size - 3);
  engine::StepPlan plan{
      {{.token_ids = tokens, .start_position = 0, .block_table = &table, .wants_logits = true}}};
  std::vector<float> logits;
  // Where the time goes: the CPU backend's phase clock over the timed steps.
  engine::CpuStepProfile profile;
  auto* cpu = dynamic_cast<engine::CpuForward*>(&m.model->backend());
  if (cpu != nullptr) cpu->set_profile(&profile);
  const StepTimes times = timed_steps(state, m, plan, *kv, logits, sgemm_pass_gflops);
  if (cpu != nullptr) cpu->set_profile(nullptr);
  const double step_seconds = times.step_seconds;
  // 2 FLOPs per weight per token for the layer matmuls, the lm_head once,
  // plus causal attention (QKᵀ and PV: 2 · 2 · heads · head_dim per pair).
  const double hd = c.head_dim, h = c.hidden_size;
  const double layer_weights =
      h * hd * (c.num_heads * 2.0 + c.num_kv_heads * 2.0) + 3.0 * h * c.intermediate_size;
  const double pairs = double(length) * (length + 1) / 2.0;
  const double projection_flops =
      2.0 * layer_weights * c.num_layers * length + 2.0 * h * c.vocab_size;
  const double attention_flops = 4.0 * c.num_heads * hd * pairs * c.num_layers;
  const double flops = projection_flops + attention_flops;
  const double achieved = flops / step_seconds / 1e9;
  const double profiled = profile.projections_s + profile.attention_s + profile.other_s;
  if (cpu != nullptr && profiled > 0) {
    const double steps = double(state.iterations());
    // Each phase's share of the step and the rate it ran at.
    state.counters["gemm_share"] = profile.projections_s / profiled;
    state.counters["attention_share"] = profile.attention_s / profiled;
    state.counters["other_share"] = profile.other_s / profiled;
    state.counters["gemm_GFLOP_per_s"] = projection_flops * steps / profile.projections_s / 1e9;
    state.counters["attention_GFLOP_per_s"] = attention_flops * steps / profile.attention_s / 1e9;
  }
  state.counters["tok_per_s"] = double(length) / step_seconds;
  state.counters["GFLOP_per_s"] = achieved;
  // sgemm on every thread between the prefills (the ratio's ceiling), and the
  // best of six taken once at start.
  state.counters["ceiling_GFLOP_per_s"] = times.ceiling;
  state.counters["start_ceiling_GFLOP_per_s"] = measure_sgemm_gflops();
  state.counters["ratio"] = (times.ceiling > 0 ? achieved / times.ceiling : 0.0);
  state.SetLabel(preset + " " + std::string(dtype_name(dtype)));
}

void register_decode_same_pool(const std::string& preset) {
  for (DType kv : {DType::kBF16, DType::kI8, DType::kFP8E4M3}) {
    // The pool that holds 32 sequences in BF16, full: the batch an 8-bit
    // cache lets a decode node run.
    benchmark::RegisterBenchmark(
        ("DecodeSamePool/" + preset + "/kv_" + std::string(dtype_name(kv))).c_str(), run_decode,
        preset, DType::kBF16, kv, kLongDecodeContext, true)
        ->Arg(32)
        ->MinWarmUpTime(0.5)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
  }
}

// `large`: also Llama 3 8B's layers, 8 of its 32: 5.2 GiB of BF16 weights
// (embedding and LM head included) and a 4.0 GiB pool, where the whole
// model's 15 GiB beside its 16 GiB pool would not fit a small machine.
void register_all(bool large) {
  if (large) register_decode_same_pool("llama3-8b-8layers");
  for (const char* preset : {"smollm2-135m", "qwen2.5-0.5b"}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      std::string suffix = std::string(preset) + "/" + std::string(dtype_name(dtype));
      benchmark::RegisterBenchmark(("Decode/" + suffix).c_str(), run_decode, preset, dtype, dtype,
                                   kDecodeContext, false)
          ->Arg(1)
          ->Arg(8)
          ->Arg(16)
          ->Arg(32)
          ->Arg(64)
          // Steps before timing: the first touches the mapped weights, which
          // may have left the page cache (a 1 s first step was once the whole
          // measurement).
          ->MinWarmUpTime(0.5)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
      benchmark::RegisterBenchmark(("Prefill/" + suffix).c_str(), run_prefill, preset, dtype)
          ->Arg(512)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime()
          ->Iterations(3);
    }
    // Long contexts, where attention reads more bytes than the weights:
    // BF16 weights, the KV cache in each format.
    for (DType kv : {DType::kBF16, DType::kI8, DType::kFP8E4M3}) {
      const std::string name =
          "DecodeLongContext/" + std::string(preset) + "/kv_" + std::string(dtype_name(kv));
      benchmark::RegisterBenchmark(name.c_str(), run_decode, preset, DType::kBF16, kv,
                                   kLongDecodeContext, false)
          ->Arg(8)
          ->Arg(32)
          ->MinWarmUpTime(0.5)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
    register_decode_same_pool(preset);
  }
}

}  // namespace
}  // namespace baton::bench

int main(int argc, char** argv) {
  baton::kernels::cpu::setup_blas();  // first: see blas_setup.h
  baton::bench::take_bench_flags(&argc, argv);
  // Read before Initialize, which takes the flags out of argv.
  bool large = false;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    large = large || (arg.starts_with("--benchmark_filter") && arg.find("llama3") != arg.npos);
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  baton::bench::register_all(large);
  std::printf(
      "ceilings: memory bandwidth %.1f GB/s, sgemm %.1f GFLOP/s (all threads, OpenBLAS %s "
      "kernels)\n",
      baton::bench::measure_memory_bandwidth_gbs(), baton::bench::measure_sgemm_gflops(),
      baton::kernels::cpu::blas_core_name().c_str());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
