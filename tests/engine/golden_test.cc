// Golden logits from Hugging Face transformers: tiny random checkpoints saved
// by transformers' own classes (tests/golden/make_golden.py), with the
// log-probabilities transformers computed for a fixed token sequence.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/engine.h"
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

class GoldenTest : public ::testing::TestWithParam<std::filesystem::path> {};

TEST(Golden, AllCheckpointsPresent) {
  // Four architectures/features, each in F32 and BF16.
  EXPECT_EQ(golden_dirs().size(), 8u);
}

TEST_P(GoldenTest, LogprobsAndGreedyMatchTransformers) {
  const auto dir = GetParam();
  std::ifstream in(dir / "golden.json");
  auto golden = nlohmann::json::parse(in);
  const auto tokens = golden["token_ids"].get<std::vector<int32_t>>();
  const auto expected = golden["log_probs"].get<std::vector<std::vector<double>>>();
  ASSERT_EQ(expected.size(), tokens.size());

  EngineConfig config;
  config.threads = 2;
  config.block_size = 4;
  config.kv_cache_blocks = 64;
  config.kv_dtype = DType::kF32;
  auto created = Engine::create(dir, config);
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

INSTANTIATE_TEST_SUITE_P(Transformers, GoldenTest, ::testing::ValuesIn(golden_dirs()),
                         [](const auto& info) {
                           std::string name = info.param.parent_path().filename().string() + "_" +
                                              info.param.filename().string();
                           return name;
                         });

}  // namespace
}  // namespace baton::engine
