// How far 8-bit KV caches move a model's log-probs against a BF16 one
// (engine/kv_drift.h), on a checkpoint or a preset's shape with random
// weights:
//
//   kv_drift --preset llama3-8b --layers 2 [--positions 1000] [--seed S]
//   kv_drift --model DIR [--kv int8 fp8_e4m3 f32]
//
// One random token sequence goes through an engine with a BF16 KV cache
// and one per format given, a first block as one prefill step and the rest
// one token per step. Prints a markdown table: over the positions, the mean
// and max |Δ log p| of the token the BF16 cache ranks first, and how often
// the first-ranked token changed. F32 KV is in the default list as the
// scale: what BF16's own rounding of K and V moves.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine.h"
#include "engine/kv_drift.h"
#include "engine/make_model.h"
#include "kernels/cpu/blas_setup.h"

namespace baton::bench {
namespace {

constexpr int32_t kBlockSize = 16;

int run(int argc, char** argv) {
  CLI::App app{"KV formats' drift of log-probs against a BF16 KV cache"};
  std::string model, preset;
  int32_t layers = 0, positions = 1000, threads = 0;
  uint64_t seed = std::random_device{}();
  std::vector<std::string> formats = {"int8", "fp8_e4m3", "f32"};
  app.add_option("--model", model, "checkpoint directory");
  app.add_option("--preset", preset, "a make-model preset, random weights (BF16)");
  app.add_option("--layers", layers, "with --preset: this many layers of its shape")
      ->check(CLI::Range(1, 1024));
  app.add_option("--positions", positions, "tokens of the sequence")
      ->check(CLI::Range(17, 1 << 20));
  app.add_option("--kv", formats, "KV formats against BF16");
  app.add_option("--threads", threads, "engine threads (0: every core)");
  app.add_option("--seed", seed, "of the tokens (and of the preset's weights)");
  CLI11_PARSE(app, argc, argv);
  if (model.empty() == preset.empty()) {
    std::fprintf(stderr, "kv_drift: give --model or --preset\n");
    return 2;
  }
  std::filesystem::path dir = model;
  std::string name = model;
  if (!preset.empty()) {
    auto config = engine::model_preset(preset);
    if (!config.is_ok()) {
      std::fprintf(stderr, "kv_drift: %s\n", config.status().to_string().c_str());
      return 2;
    }
    if (layers > 0) config->num_layers = layers;
    name = preset + " shape, " + std::to_string(config->num_layers) + " layers, random weights";
    dir = std::filesystem::temp_directory_path() /
          ("baton-kv-drift-" + preset + "-" + std::to_string(config->num_layers) + "-" +
           std::to_string(seed));
    engine::MakeModelOptions options;
    options.dtype = DType::kBF16;
    options.seed = seed;
    if (Status made = engine::make_random_checkpoint(*config, dir, options); !made.is_ok()) {
      std::fprintf(stderr, "kv_drift: %s\n", made.to_string().c_str());
      return 1;
    }
  }
  auto engine_for = [&](DType kv) -> std::unique_ptr<engine::Engine> {
    engine::EngineConfig config;
    config.threads = threads;
    config.block_size = kBlockSize;
    config.kv_cache_blocks = (positions + kBlockSize - 1) / kBlockSize;
    config.kv_dtype = kv;
    // The engines share the mapped checkpoint instead of a copy each.
    config.huge_page_weights = false;
    auto created = engine::Engine::create(dir, config);
    if (!created.is_ok()) {
      std::fprintf(stderr, "kv_drift: %s\n", created.status().to_string().c_str());
      std::exit(1);
    }
    return std::move(created).value();
  };
  auto reference = engine_for(DType::kBF16);
  std::vector<std::unique_ptr<engine::Engine>> owned;
  std::vector<engine::Engine*> candidates;
  for (const std::string& f : formats) {
    const auto kv = parse_kv_dtype(f);
    if (!kv) {
      std::fprintf(stderr, "kv_drift: unknown KV format '%s'\n", f.c_str());
      return 2;
    }
    owned.push_back(engine_for(*kv));
    candidates.push_back(owned.back().get());
  }
  std::mt19937 rng{uint32_t(seed)};
  std::uniform_int_distribution<int32_t> id(3, reference->model_config().vocab_size - 1);
  std::vector<int32_t> tokens(static_cast<size_t>(positions));
  for (int32_t& t : tokens) t = id(rng);
  auto drift = engine::measure_kv_drift(*reference, candidates, tokens, kBlockSize);
  if (!preset.empty()) std::filesystem::remove_all(dir);
  if (!drift.is_ok()) {
    std::fprintf(stderr, "kv_drift: %s\n", drift.status().to_string().c_str());
    return 1;
  }
  std::printf("%s; seed %llu\n\n", name.c_str(), (unsigned long long)seed);
  std::printf("| KV | positions | mean abs dlogp | max abs dlogp | over %.1f | greedy changed |\n",
              engine::kFarDlogprob);
  std::printf("|---|---|---|---|---|---|\n");
  for (size_t i = 0; i < formats.size(); ++i) {
    const engine::KvDrift& d = (*drift)[i];
    std::printf("| %s | %lld | %.4f | %.4f | %.3f%% | %.2f%% |\n", formats[i].c_str(),
                (long long)d.positions, d.mean_abs(), d.max_abs, 100.0 * d.far_rate(),
                100.0 * d.change_rate());
  }
  return 0;
}

}  // namespace
}  // namespace baton::bench

int main(int argc, char** argv) {
  baton::kernels::cpu::setup_blas();  // first: see blas_setup.h
  return baton::bench::run(argc, argv);
}
