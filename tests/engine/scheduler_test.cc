// Continuous batching: a batch generated together equals each sequence
// generated alone, whatever the token budget, chunking or preemption.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    model_dir_ = testing::make_preset_model(dir_, "tiny", DType::kF32, seed_);
  }

  std::unique_ptr<Engine> make_engine(int32_t blocks, int32_t block_size, int32_t budget,
                                      int32_t max_seqs = 64) {
    EngineConfig config;
    config.threads = 2;
    config.kv_cache_blocks = blocks;
    config.block_size = block_size;
    config.max_num_batched_tokens = budget;
    config.max_num_seqs = max_seqs;
    auto engine = Engine::create(model_dir_, config);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    return std::move(engine).value();
  }

  std::vector<std::vector<int32_t>> random_prompts(int n) {
    std::uniform_int_distribution<int32_t> len(1, 40), id(3, 511);
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n));
    for (auto& p : prompts) {
      p.resize(size_t(len(rng_)));
      for (auto& t : p) t = id(rng_);
    }
    return prompts;
  }

  // Output ids of each prompt, generated together in one engine.
  std::vector<std::vector<int32_t>> generate(Engine& engine,
                                             const std::vector<std::vector<int32_t>>& prompts,
                                             const GenerationOptions& options) {
    for (const auto& p : prompts) EXPECT_TRUE(engine.scheduler().add(p, options).is_ok());
    auto done = engine.run_to_completion();
    EXPECT_TRUE(done.is_ok()) << done.status().to_string();
    std::vector<std::vector<int32_t>> outputs;
    for (auto& seq : *done) outputs.push_back(seq->output);
    auto stats = engine.scheduler().stats();
    EXPECT_EQ(stats.free_blocks, stats.total_blocks) << "blocks leaked";
    return outputs;
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  testing::TempDir dir_;
  std::filesystem::path model_dir_;
};

GenerationOptions greedy(int32_t max_tokens) {
  GenerationOptions o;
  o.sampling.temperature = 0;
  o.max_tokens = max_tokens;
  o.ignore_eos = true;
  return o;
}

TEST_F(SchedulerTest, BatchEqualsAloneUnderChunkingAndPreemption) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto prompts = random_prompts(8);
  auto options = greedy(12);
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    auto engine = make_engine(64, 16, 2048);
    alone.push_back(generate(*engine, {p}, options)[0]);
    ASSERT_EQ(alone.back().size(), 12u);
  }
  // Roomy pool, big budget: all prompts prefilled in one step.
  auto roomy = make_engine(256, 16, 2048);
  EXPECT_EQ(generate(*roomy, prompts, options), alone);
  // Tiny budget: prompts chunked across steps, decodes interleaved with prefills.
  auto chunked = make_engine(256, 4, 7);
  EXPECT_EQ(generate(*chunked, prompts, options), alone);
  // A pool too small for everyone at once: admission waits and running
  // sequences preempt each other (recompute), yet outputs are unchanged.
  auto tight = make_engine(16, 4, 64);
  EXPECT_EQ(generate(*tight, prompts, options), alone);
  EXPECT_GT(tight->scheduler().stats().preemptions, 0);
}

TEST_F(SchedulerTest, SameSeedSameSamples) {
  auto prompts = random_prompts(3);
  GenerationOptions o;
  o.sampling = {.temperature = 1.0f, .top_k = 50, .top_p = 0.9f};
  o.max_tokens = 10;
  o.ignore_eos = true;
  o.seed = 1234;
  auto a = make_engine(128, 16, 2048);
  auto b = make_engine(128, 4, 5);  // different batching, same per-request streams
  EXPECT_EQ(generate(*a, prompts, o), generate(*b, prompts, o));
  // A hot temperature flattens the distribution: another seed must diverge.
  o.sampling = {.temperature = 5.0f, .top_k = 0, .top_p = 1.0f};
  auto c = make_engine(128, 16, 2048);
  auto first = generate(*c, prompts, o);
  o.seed = 99;
  EXPECT_NE(generate(*c, prompts, o), first);
}

TEST_F(SchedulerTest, StopTokensAndLimits) {
  auto engine = make_engine(64, 16, 2048);
  auto prompt = random_prompts(1)[0];
  auto free_run = generate(*engine, {prompt}, greedy(8))[0];
  ASSERT_EQ(free_run.size(), 8u);
  // Stopping on the 4th generated token ends the sequence right there.
  GenerationOptions o = greedy(8);
  o.stop_token_ids = {free_run[3]};
  auto id = engine->scheduler().add(prompt, o);
  ASSERT_TRUE(id.is_ok());
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok());
  const auto& seq = *(*done)[0];
  auto first = std::find(free_run.begin(), free_run.end(), free_run[3]) - free_run.begin();
  EXPECT_EQ(seq.output, std::vector<int32_t>(free_run.begin(), free_run.begin() + first + 1));
  EXPECT_EQ(seq.finish_reason, FinishReason::kStop);
}

TEST_F(SchedulerTest, RejectsBadRequestsAndAbortFreesBlocks) {
  auto engine = make_engine(8, 4, 2048);
  auto& s = engine->scheduler();
  EXPECT_EQ(s.add({}, greedy(4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.add({1, 512}, greedy(4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.add({1, 2}, greedy(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.add(std::vector<int32_t>(40, 5), greedy(4)).status().code(),
            StatusCode::kResourceExhausted);  // 41 tokens need 11 blocks of 4; pool has 8
  EXPECT_EQ(s.add(std::vector<int32_t>(2048, 5), greedy(4)).status().code(),
            StatusCode::kInvalidArgument);  // at the model's maximum context
  auto id = s.add({5, 6, 7, 8, 9}, greedy(100));
  ASSERT_TRUE(id.is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  EXPECT_LT(s.stats().free_blocks, s.stats().total_blocks);
  EXPECT_TRUE(s.abort(*id));
  EXPECT_FALSE(s.abort(*id));
  EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks);
  auto finished = s.take_finished();
  ASSERT_EQ(finished.size(), 1u);
  EXPECT_EQ(finished[0]->finish_reason, FinishReason::kAborted);
  EXPECT_FALSE(s.has_work());
}

}  // namespace
}  // namespace baton::engine
