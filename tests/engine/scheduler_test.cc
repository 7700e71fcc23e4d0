// Continuous batching: a batch generated together equals each sequence
// generated alone, whatever the token budget, chunking or preemption.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <random>

#include "engine/engine.h"
#include "tests/engine/greedy_options.h"
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

using testing::greedy;

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

// Random pool sizes, block sizes, budgets and batch limits: tight pools
// preempt during chunked prefill while other sequences decode. Outputs must
// equal each prompt generated alone and every block must come back.
TEST_F(SchedulerTest, RandomTightConfigurationsMatchAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto prompts = random_prompts(6);
  auto options = greedy(10);
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    auto engine = make_engine(64, 16, 2048);
    alone.push_back(generate(*engine, {p}, options)[0]);
  }
  std::uniform_int_distribution<int> pick_block(0, 2), pick_budget(1, 24), pick_seqs(1, 6);
  int64_t preemptions = 0;
  for (int round = 0; round < 30; ++round) {
    const int32_t block_size = 2 << pick_block(rng_);  // 2, 4 or 8
    // Just enough blocks for the longest sequence alone (prompt <= 40, +10 out).
    const int32_t min_blocks = (50 + block_size - 1) / block_size;
    const int32_t blocks = min_blocks + int32_t(rng_() % 8);
    const int32_t budget = pick_budget(rng_);
    const int32_t max_seqs = pick_seqs(rng_);
    SCOPED_TRACE("round " + std::to_string(round) + ": blocks " + std::to_string(blocks) + " x " +
                 std::to_string(block_size) + ", budget " + std::to_string(budget) + ", max_seqs " +
                 std::to_string(max_seqs));
    auto engine = make_engine(blocks, block_size, budget, max_seqs);
    ASSERT_EQ(generate(*engine, prompts, options), alone);
    preemptions += engine->scheduler().stats().preemptions;
  }
  EXPECT_GT(preemptions, 0) << "no round exercised preemption";
}

// A sequence that would outgrow the whole pool ends with "length" at the
// pool's capacity instead of preempting itself forever.
TEST_F(SchedulerTest, SequenceLongerThanThePoolEndsAtItsCapacity) {
  auto engine = make_engine(/*blocks=*/2, /*block_size=*/4, /*budget=*/3);
  EXPECT_EQ(engine->scheduler().max_model_len(), 8);
  ASSERT_TRUE(engine->scheduler().add({5, 6, 7}, greedy(100)).is_ok());
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  const auto& seq = *(*done)[0];
  EXPECT_EQ(seq.finish_reason, FinishReason::kLength);
  EXPECT_EQ(seq.num_tokens(), 8);
  EXPECT_EQ(engine->scheduler().stats().free_blocks, 2);
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
  // The pool holds 8 x 4 = 32 tokens: that is the context limit here.
  auto too_long = s.add(std::vector<int32_t>(32, 5), greedy(4));
  EXPECT_EQ(too_long.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(too_long.status().message().find("maximum context length is 32"), std::string::npos)
      << too_long.status().message();
  auto longest = s.add(std::vector<int32_t>(31, 5), greedy(4));
  ASSERT_TRUE(longest.is_ok());
  EXPECT_TRUE(s.abort(*longest));  // aborted while waiting
  EXPECT_EQ(s.take_finished().size(), 1u);
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
