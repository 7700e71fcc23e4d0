// Golden logits from Hugging Face transformers: tiny random checkpoints saved
// by transformers' own classes (tests/golden/make_golden.py), with the
// log-probabilities transformers computed for a fixed token sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "engine/engine.h"
#include "engine/kv_drift.h"
#include "tests/engine/greedy_options.h"
#include "tests/engine/reference_model.h"

namespace baton::engine {
namespace {

constexpr double kMaxLogprobError = 1e-4;

std::vector<std::filesystem::path> golden_dirs() {
  std::vector<std::filesystem::path> dirs;
  std::filesystem::path root = std::filesystem::path(BATON_SOURCE_DIR) / "tests/golden/data";
  for (const auto& model : std::filesystem::directory_iterator(root))
    for (const auto& variant : std::filesystem::directory_iterator(model.path()))
      if (std::filesystem::exists(variant.path() / "golden.json")) dirs.push_back(variant.path());
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

// A checkpoint's token sequence and transformers' log-probabilities after
// each of its tokens.
struct Golden {
  nlohmann::json doc;
  std::vector<int32_t> tokens;
  std::vector<std::vector<double>> log_probs;
};
Golden read_golden(const std::filesystem::path& dir) {
  std::ifstream in(dir / "golden.json");
  Golden g{nlohmann::json::parse(in), {}, {}};
  g.tokens = g.doc["token_ids"].get<std::vector<int32_t>>();
  g.log_probs = g.doc["log_probs"].get<std::vector<std::vector<double>>>();
  return g;
}

// F32 KV in small blocks, as the golden comparisons run.
EngineConfig golden_engine_config() {
  EngineConfig config;
  config.threads = 2;
  config.block_size = 4;
  config.kv_cache_blocks = 64;
  config.kv_dtype = DType::kF32;
  return config;
}

class GoldenTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST(Golden, AllCheckpointsPresent) {
  // Ten architectures/features, each in F32 and BF16.
  EXPECT_EQ(golden_dirs().size(), 20u);
}

TEST_P(GoldenTest, LogprobsAndGreedyMatchTransformers) {
  const auto dir = GetParam();
  const Golden read = read_golden(dir);
  const nlohmann::json& golden = read.doc;
  const std::vector<int32_t>& tokens = read.tokens;
  const std::vector<std::vector<double>>& expected = read.log_probs;
  ASSERT_EQ(expected.size(), tokens.size());

  auto created = Engine::create(dir, golden_engine_config());
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Engine& engine = **created;
  const int32_t vocab = engine.model_config().vocab_size;
  ASSERT_EQ(size_t(vocab), expected[0].size());

  // Prefill the first 10 tokens in one step, then decode the rest one by one:
  // both attention paths and the cache are checked against transformers.
  BlockManager manager(64);
  BlockTable table(4);
  std::vector<float> logits;
  double worst = 0;
  int32_t pos = 0;
  while (pos < int32_t(tokens.size())) {
    int32_t n = pos == 0 ? 10 : 1;
    ASSERT_TRUE(table.reserve(manager, n).is_ok());
    StepPlan plan{{{.token_ids = std::span<const int32_t>(tokens.data() + pos, size_t(n)),
                    .start_position = pos,
                    .block_table = &table,
                    .wants_logits = true}}};
    ASSERT_TRUE(engine.model().forward(plan, engine.kv_pool(), &logits).is_ok());
    table.commit(n);
    pos += n;
    auto got = testing::log_softmax(std::vector<double>(logits.begin(), logits.end()));
    for (int32_t i = 0; i < vocab; ++i) {
      double err = std::fabs(got[size_t(i)] - expected[size_t(pos - 1)][size_t(i)]);
      ASSERT_FALSE(std::isnan(err));
      worst = std::max(worst, err);
    }
  }
  EXPECT_LT(worst, kMaxLogprobError) << dir;
  RecordProperty("max_logprob_error", std::to_string(worst));

  // Greedy generation through the scheduler equals transformers' generate().
  ASSERT_TRUE(engine.scheduler()
                  .add(golden["greedy_prompt"].get<std::vector<int32_t>>(),
                       testing::greedy(int32_t(golden["greedy_continuation"].size())))
                  .is_ok());
  auto done = engine.run_to_completion();
  ASSERT_TRUE(done.is_ok());
  EXPECT_EQ((*done)[0]->output, golden["greedy_continuation"].get<std::vector<int32_t>>());
}

// 8-bit KV against a BF16 KV cache on the golden checkpoints, over fresh
// random sequences as long as they take (the first 16 tokens prefilled,
// the rest decoded one at a time): at every position, the change in the
// log-probability of the BF16 cache's greedy token, and whether the greedy
// token changed. docs/PERFORMANCE.md records what these measured; the
// limits here hold them with a margin.
struct KvDriftLimits {
  DType kv;
  double mean;         // of |Δ log p| over all positions
  double far_rate;     // of positions where |Δ log p| > kFarDlogprob
  double change_rate;  // of positions whose greedy token changed
};

class KvDriftTest : public ::testing::TestWithParam<KvDriftLimits> {};

TEST_P(KvDriftTest, EightBitKvStaysCloseToBf16Kv) {
  const KvDriftLimits limits = GetParam();
  const uint32_t seed = std::random_device{}();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  auto engine_for = [](const std::filesystem::path& dir, DType kv) {
    EngineConfig config;
    config.threads = 2;
    config.block_size = 16;
    config.kv_cache_blocks = 32;
    config.kv_dtype = kv;
    auto created = Engine::create(dir, config);
    EXPECT_TRUE(created.is_ok()) << created.status().to_string();
    return std::move(created).value();
  };
  KvDrift drift;
  for (const auto& dir : golden_dirs()) {
    SCOPED_TRACE(dir.string());
    auto reference = engine_for(dir, DType::kBF16);
    auto quantized = engine_for(dir, limits.kv);
    ASSERT_EQ(reference->kv_pool().layout().dtype, DType::kBF16);
    ASSERT_EQ(quantized->kv_pool().layout().dtype, limits.kv);
    const auto& config = reference->model_config();
    std::uniform_int_distribution<int32_t> id(3, config.vocab_size - 1);
    std::vector<int32_t> tokens(size_t(config.max_position_embeddings) - 1);
    for (int32_t& t : tokens) t = id(rng);
    Engine* const candidates[] = {quantized.get()};
    auto measured = measure_kv_drift(*reference, candidates, tokens, /*first_step=*/16);
    ASSERT_TRUE(measured.is_ok()) << measured.status().to_string();
    drift.add(measured->front());
  }
  ASSERT_GE(drift.positions, 1000);
  RecordProperty("mean_abs_dlogprob", std::to_string(drift.mean_abs()));
  RecordProperty("max_abs_dlogprob", std::to_string(drift.max_abs));
  RecordProperty("far_dlogprob_rate", std::to_string(drift.far_rate()));
  RecordProperty("greedy_change_rate", std::to_string(drift.change_rate()));
  std::printf(
      "%s KV against bf16 KV over %lld positions: mean |dlogp| %.4f, max %.4f, over %.1f at "
      "%.3f%%, greedy changed at %.2f%%\n",
      std::string(dtype_name(limits.kv)).c_str(), (long long)drift.positions, drift.mean_abs(),
      drift.max_abs, kFarDlogprob, 100.0 * drift.far_rate(), 100.0 * drift.change_rate());
  // The most of thousands of positions is recorded, not bounded: one
  // position decides it, and E4M3's ranged 0.67-1.96 over 120 runs and
  // reached 3.09 once. The rate of far positions samples the same tail.
  EXPECT_LT(drift.mean_abs(), limits.mean);
  // And from below: a tenth of the bound is a quarter of the least mean
  // measured; a comparison of the BF16 cache with itself gives 0.
  EXPECT_GT(drift.mean_abs(), limits.mean / 10) << "the 8-bit cache changed nothing";
  EXPECT_LT(drift.far_rate(), limits.far_rate);
  EXPECT_LT(drift.change_rate(), limits.change_rate);
}

INSTANTIATE_TEST_SUITE_P(Formats, KvDriftTest,
                         // Measured (runs of 2880 positions, 1920 before the
                         // windowed checkpoints): int8 mean 0.011-0.012, max
                         // 0.09-0.20, greedy changed at 0.7-1.9%; E4M3 mean
                         // 0.052-0.060, max 0.46-1.38, 5.0-6.7%. F32 against BF16
                         // KV, for scale: mean 0.0046, max 0.06, 0.3-0.8%.
                         // With the Qwen3 and SmolLM3 ones (3840 positions):
                         // int8 mean 0.016-0.017, max 0.20-0.61, 1.0-2.2%;
                         // E4M3 0.061-0.070, 0.77-2.17, 6.0-7.5%. 120 runs
                         // of 4800 positions: int8 mean 0.013-0.015, over
                         // 0.5 at 0-0.021%, 0.9-1.9%; E4M3 0.051-0.059,
                         // 0.15-0.65%, 4.7-6.2%.
                         ::testing::Values(KvDriftLimits{DType::kI8, 0.03, 0.0025, 0.05},
                                           KvDriftLimits{DType::kFP8E4M3, 0.12, 0.015, 0.15}),
                         [](const auto& info) { return std::string(dtype_name(info.param.kv)); });

// Prompt log-probabilities (vLLM's prompt_logprobs, echo with logprobs):
// every prompt token after the first is scored as transformers scores it,
// with its top alternatives, over a chunked prefill; a second run of the
// same prompt, whose blocks the prefix cache then holds, scores them all
// again.
TEST_P(GoldenTest, PromptLogprobsMatchTransformers) {
  const auto dir = GetParam();
  const Golden read = read_golden(dir);
  const std::vector<int32_t>& tokens = read.tokens;
  const std::vector<std::vector<double>>& expected = read.log_probs;
  ASSERT_EQ(expected.size(), tokens.size());

  EngineConfig config = golden_engine_config();
  config.max_num_batched_tokens = 7;  // chunks that end mid-prompt and mid-block
  auto created = Engine::create(dir, config);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  Engine& engine = **created;
  constexpr int32_t kTop = 3;
  double worst = 0;
  for (int run = 0; run < 2; ++run) {
    SCOPED_TRACE(run == 0 ? "first run" : "prompt in the prefix cache");
    GenerationOptions options = testing::greedy(2);
    options.prompt_logprobs = kTop;
    ASSERT_TRUE(engine.scheduler().add(tokens, options).is_ok());
    auto done = engine.run_to_completion();
    ASSERT_TRUE(done.is_ok()) << done.status().to_string();
    const Sequence& seq = *(*done)[0];
    ASSERT_EQ(seq.prompt_logprobs.size(), tokens.size() - 1);
    for (size_t p = 1; p < tokens.size(); ++p) {
      const OutputLogprobs& scored = seq.prompt_logprobs[p - 1];
      const std::vector<double>& want = expected[p - 1];
      EXPECT_EQ(scored.id, tokens[p]) << "position " << p;
      worst = std::max(worst, std::fabs(scored.logprob - want[size_t(tokens[p])]));
      std::vector<double> sorted = want;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      ASSERT_EQ(scored.top.size(), size_t(kTop)) << "position " << p;
      for (int32_t k = 0; k < kTop; ++k) {
        const kernels::cpu::TokenLogprob& alt = scored.top[size_t(k)];
        worst = std::max(worst, std::fabs(alt.logprob - sorted[size_t(k)]));
        worst = std::max(worst, std::fabs(alt.logprob - want[size_t(alt.id)]));
      }
    }
  }
  EXPECT_LT(worst, kMaxLogprobError) << dir;
}

INSTANTIATE_TEST_SUITE_P(Transformers, GoldenTest, ::testing::ValuesIn(golden_dirs()),
                         [](const auto& info) {
                           std::string name = info.param.parent_path().filename().string() + "_" +
                                              info.param.filename().string();
                           return name;
                         });

}  // namespace
}  // namespace baton::engine
