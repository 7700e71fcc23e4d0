// Continuous batching: a batch generated together equals each sequence
// generated alone, whatever the token budget, chunking or preemption.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <set>

#include "common/prefix_hash.h"
#include "engine/checkpoint.h"
#include "engine/engine.h"
#include "engine/make_model.h"
#include "kernels/cpu/cpu_features.h"
#include "tests/engine/greedy_options.h"
#include "tests/engine/io_uring_probe.h"
#include "tests/engine/reference_model.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

using testing::kernel_offers_io_uring;

// The host-memory copier of a pool, counting what it copies and where on
// the host: the SSD tier's staging must stay within its few slots.
class CountingCopier final : public PoolCopier {
 public:
  explicit CountingCopier(KvPool& pool)
      : inner_(make_host_pool_copier(pool.data(), pool.bytes())) {}
  Status to_host(void* host, std::span<const Range> ranges) override {
    count(ranges, out_bytes);
    return inner_->to_host(host, ranges);
  }
  Status to_device(const void* host, std::span<const Range> ranges) override {
    if (before_copy_in) before_copy_in();
    ++calls_in;
    if (fail_in) return internal_error("injected copy-in failure");
    count(ranges, in_bytes);
    ++copies_in;
    return inner_->to_device(host, ranges);
  }
  Status pin(void* host, size_t bytes) override { return inner_->pin(host, bytes); }
  const char* name() const override { return "counting copier"; }

  uint64_t out_bytes = 0, in_bytes = 0;
  int64_t calls_in = 0;   // calls of to_device, failed ones too
  int64_t copies_in = 0;  // calls of to_device that copied
  uint64_t host_end = 0;  // past the last host byte any copy touched
  bool fail_in = false;
  std::function<void()> before_copy_in;  // called first by each to_device

 private:
  void count(std::span<const Range> ranges, uint64_t& bytes) {
    for (const Range& r : ranges) {
      bytes += r.bytes;
      host_end = std::max<uint64_t>(host_end, r.host_offset + r.bytes);
    }
  }
  std::unique_ptr<PoolCopier> inner_;
};

class SchedulerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    model_dir_ = testing::make_preset_model(dir_, "tiny", DType::kF32, seed_);
  }

  std::unique_ptr<Engine> make_engine(int32_t blocks, int32_t block_size, int32_t budget,
                                      int32_t max_seqs = 64, bool prefix_caching = true,
                                      uint64_t ssd_bytes = 0) {
    EngineConfig config;
    config.enable_prefix_caching = prefix_caching;
    if (ssd_bytes > 0) {
      config.ssd_cache_dir = dir_.path().string();
      config.ssd_cache_bytes = ssd_bytes;
    }
    config.threads = 2;
    config.kv_cache_blocks = blocks;
    config.block_size = block_size;
    config.max_num_batched_tokens = budget;
    config.max_num_seqs = max_seqs;
    auto engine = Engine::create(model_dir_, config);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    return std::move(engine).value();
  }

  // n prompts that start with one shared prefix (min_prefix to 45 tokens)
  // and go on with 0-9 tokens of their own.
  std::vector<std::vector<int32_t>> prompts_sharing_a_prefix(int n, int32_t min_prefix = 1) {
    std::uniform_int_distribution<int32_t> prefix_len(min_prefix, 45), own_len(0, 9), id(3, 511);
    std::vector<int32_t> prefix(size_t(prefix_len(rng_)));
    for (auto& t : prefix) t = id(rng_);
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(n), prefix);
    for (auto& p : prompts)
      for (int32_t k = own_len(rng_); k > 0; --k) p.push_back(id(rng_));
    return prompts;
  }

  // Each prompt's output generated alone, with no prefix cache.
  std::vector<std::vector<int32_t>> alone_uncached(const std::vector<std::vector<int32_t>>& prompts,
                                                   const GenerationOptions& options) {
    std::vector<std::vector<int32_t>> alone;
    for (const auto& p : prompts) {
      auto engine = make_engine(64, 16, 2048, 64, /*prefix_caching=*/false);
      alone.push_back(generate(*engine, {p}, options)[0]);
    }
    return alone;
  }

  struct TightTotals {
    int64_t preemptions = 0;
    int64_t prefix_hit_tokens = 0;
    int64_t prefix_ssd_hit_tokens = 0;
  };
  // `rounds` engines of random pool sizes (just above what the longest
  // sequence alone needs), block sizes, budgets and batch limits, each
  // generating the prompts `passes` times: every output must equal `alone`.
  TightTotals run_tight_rounds(const std::vector<std::vector<int32_t>>& prompts,
                               const GenerationOptions& options,
                               const std::vector<std::vector<int32_t>>& alone, int rounds,
                               int passes, uint64_t ssd_bytes = 0,
                               std::optional<SsdStagingSlots> staged = std::nullopt) {
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    const auto tokens = int32_t(longest) + options.max_tokens;
    std::uniform_int_distribution<int> pick_block(0, 2), pick_budget(1, 24), pick_seqs(1, 6);
    TightTotals totals;
    for (int round = 0; round < rounds; ++round) {
      const int32_t block_size = 2 << pick_block(rng_);  // 2, 4 or 8
      const int32_t blocks = (tokens + block_size - 1) / block_size + int32_t(rng_() % 8);
      const int32_t budget = pick_budget(rng_);
      const int32_t max_seqs = pick_seqs(rng_);
      SCOPED_TRACE("round " + std::to_string(round) + ": blocks " + std::to_string(blocks) + " x " +
                   std::to_string(block_size) + ", budget " + std::to_string(budget) +
                   ", max_seqs " + std::to_string(max_seqs));
      auto engine = make_engine(blocks, block_size, budget, max_seqs, true, staged ? 0 : ssd_bytes);
      if (staged) attach_staged_ssd(*engine, ssd_bytes, SsdIo::kIoUring, *staged);
      for (int pass = 0; pass < passes; ++pass) {
        EXPECT_EQ(generate(*engine, prompts, options), alone);
        if (::testing::Test::HasFailure()) return totals;
      }
      totals.preemptions += engine->scheduler().stats().preemptions;
      totals.prefix_hit_tokens += engine->scheduler().stats().prefix_hit_tokens;
      totals.prefix_ssd_hit_tokens += engine->scheduler().stats().prefix_ssd_hit_tokens;
    }
    return totals;
  }

  // An SSD tier of `bytes` for the engine's pool, reached as a device's is,
  // through `slots` staging slots; returns the copier that it copies with.
  CountingCopier* attach_staged_ssd(Engine& engine, uint64_t bytes, SsdIo io,
                                    SsdStagingSlots slots) {
    auto store = SsdKvStore::create(dir_.path(), bytes, engine.kv_pool().layout(), io);
    EXPECT_TRUE(store.is_ok()) << store.status().to_string();
    if (!store.is_ok()) return nullptr;
    auto copier = std::make_unique<CountingCopier>(engine.kv_pool());
    CountingCopier* counts = copier.get();
    const Status attached =
        engine.scheduler().attach_ssd_store(std::move(store).value(), std::move(copier), slots);
    EXPECT_TRUE(attached.is_ok()) << attached.to_string();
    return counts;
  }

  std::vector<std::vector<int32_t>> prompts_of_at_least(int count, size_t n) {
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < count; ++i) prompts.push_back(random_prompt_of_at_least(n));
    return prompts;
  }

  // An engine whose pool holds the longest sequence and one block more,
  // running one sequence at a time, with an SSD tier of 64 MiB.
  std::unique_ptr<Engine> one_sequence_engine_with_ssd(
      const std::vector<std::vector<int32_t>>& prompts, const GenerationOptions& options,
      int32_t block_size) {
    size_t longest = 0;
    for (const auto& p : prompts) longest = std::max(longest, p.size());
    const auto tokens = int32_t(longest) + options.max_tokens;
    return make_engine((tokens + block_size - 1) / block_size + 1, block_size, 2048,
                       /*max_seqs=*/1, true, uint64_t(64) << 20);
  }

  std::vector<int32_t> random_prompt_of_exactly(size_t n) {
    auto prompt = random_prompt_of_at_least(n);
    prompt.resize(n);
    return prompt;
  }

  // Generates `prompt`, then a prompt that needs every block of the pool:
  // the first one's blocks go to the SSD tier.
  void push_to_ssd(Engine& engine, const std::vector<int32_t>& prompt) {
    generate(engine, {prompt}, testing::greedy(1));
    const KvLayout& layout = engine.kv_pool().layout();
    generate(engine, {random_prompt_of_exactly(size_t(layout.num_blocks * layout.block_size - 1))},
             testing::greedy(1));
  }

  // A 40-token prompt p whose blocks are on SSD, w (p and 4 more tokens) and
  // an unrelated 21-token r, with what r and w generate alone, on an engine
  // of 40 4-token blocks.
  struct RestoreCase {
    std::vector<int32_t> p, w, r;
    std::vector<std::vector<int32_t>> alone;
    std::unique_ptr<Engine> engine;
  };
  RestoreCase restore_case(int32_t max_tokens) {
    RestoreCase c;
    c.p = random_prompt_of_exactly(40);
    c.w = extended(c.p, 4);
    c.r = random_prompt_of_exactly(21);
    c.alone = alone_uncached({c.r, c.w}, testing::greedy(max_tokens));
    c.engine = make_engine(40, 4, 2048, 8, true, uint64_t(64) << 20);
    push_to_ssd(*c.engine, c.p);
    return c;
  }

  // Steps until no work is left; the outputs of the sequences that finish,
  // in the order they were added.
  static std::vector<std::vector<int32_t>> outputs_of_the_rest(Scheduler& s) {
    std::vector<std::unique_ptr<Sequence>> done;
    while (s.has_work()) {
      EXPECT_TRUE(s.step(nullptr).is_ok());
      for (auto& seq : s.take_finished()) done.push_back(std::move(seq));
    }
    std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
    std::vector<std::vector<int32_t>> outputs;
    for (const auto& seq : done) outputs.push_back(seq->output);
    return outputs;
  }

  // `prompt` and `more` random tokens after it.
  std::vector<int32_t> extended(std::vector<int32_t> prompt, int more) {
    for (int i = 0; i < more; ++i) prompt.push_back(int32_t(3 + rng_() % 500));
    return prompt;
  }

  std::vector<int32_t> random_prompt_of_at_least(size_t n) {
    auto prompt = random_prompts(1)[0];
    prompt.resize(std::max(prompt.size(), n), 7);
    return prompt;
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

// The premise of every "equals alone" comparison: outputs depend on their
// prompts, so a batch that mixed up sequences' KV would not match. (A model
// whose greedy outputs were the same for every prompt would pass them all.)
void expect_outputs_depend_on_prompts(const std::vector<std::vector<int32_t>>& alone) {
  const std::set<std::vector<int32_t>> distinct(alone.begin(), alone.end());
  EXPECT_GE(distinct.size() * 2, alone.size()) << "most prompts generate the same tokens";
}

TEST_F(SchedulerTest, BatchEqualsAloneUnderChunkingAndPreemption) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto prompts = random_prompts(8);
  // The tight pool below (16 blocks of 4) takes the first two prompts'
  // 24 tokens together, but not their answers' 12 more each: one of them
  // must be preempted, whatever the other prompts' drawn lengths.
  for (auto* p : {&prompts[0], &prompts[1]}) {
    p->resize(24);
    for (auto& t : *p) t = std::uniform_int_distribution<int32_t>(3, 511)(rng_);
  }
  auto options = greedy(12);
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    auto engine = make_engine(64, 16, 2048);
    alone.push_back(generate(*engine, {p}, options)[0]);
    ASSERT_EQ(alone.back().size(), 12u);
  }
  expect_outputs_depend_on_prompts(alone);
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
  expect_outputs_depend_on_prompts(alone);
  EXPECT_GT(run_tight_rounds(prompts, options, alone, 30, 1).preemptions, 0)
      << "no round exercised preemption";
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
  const auto want = generate(*a, prompts, o);
  // Batched in the reverse order, each request draws from its own stream
  // as before (one stream for the batch would hand the draws out in the
  // other order). The arithmetic stays the same, row for row: a prefill in
  // chunks or other blocks would change the logits' last bits, and a draw
  // by a boundary of the distribution would then take the next token.
  auto b = make_engine(128, 16, 2048);
  std::vector<std::vector<int32_t>> reversed(prompts.rbegin(), prompts.rend());
  auto got = generate(*b, reversed, o);
  std::reverse(got.begin(), got.end());
  EXPECT_EQ(got, want);
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

// engine.cpu_bf16_dot: an engine made with it set turns the process's
// VDPBF16PS passes off, or on wherever the CPU has them (the preference is
// checked on its own too, so a CPU without them still tells).
TEST_F(SchedulerTest, CpuBf16DotChoosesTheDotProductPasses) {
  struct RestoreBf16 {
    ~RestoreBf16() {
      kernels::cpu::set_avx512_bf16_preferred(kernels::cpu::cpu_prefers_avx512_bf16());
    }
  } restore;
  for (const bool dot : {false, true, false}) {
    EngineConfig config;
    config.threads = 1;
    config.kv_cache_blocks = 8;
    config.cpu_bf16_dot = dot;
    auto engine = Engine::create(model_dir_, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    EXPECT_EQ(kernels::cpu::avx512_bf16_preferred(), dot);
    EXPECT_EQ(kernels::cpu::use_avx512_bf16(),
              dot && kernels::cpu::use_avx512() && kernels::cpu::cpu_has_avx512_bf16());
  }
}

// Each sequence's first token carries the seconds it waited to be
// scheduled and then took to that token; later tokens carry none. With one
// sequence at a time, the second waits at least as long as the first took
// to prefill (it is scheduled only once the first has finished).
TEST_F(SchedulerTest, FirstTokensCarryQueueAndPrefillSeconds) {
  auto engine = make_engine(64, 16, 2048, /*max_seqs=*/1);
  Scheduler& s = engine->scheduler();
  const auto prompts = random_prompts(2);
  GenerationOptions o = greedy(4);
  o.ignore_eos = true;
  auto first = s.add(prompts[0], o);
  auto second = s.add(prompts[1], o);
  ASSERT_TRUE(first.is_ok() && second.is_ok());
  std::map<int64_t, std::vector<StepOutput>> outputs;
  while (s.has_work()) {
    std::vector<StepOutput> step;
    ASSERT_TRUE(s.step(&step).is_ok());
    for (const StepOutput& out : step) outputs[out.sequence_id].push_back(out);
  }
  for (int64_t id : {*first, *second}) {
    ASSERT_EQ(outputs[id].size(), 4u);
    EXPECT_GE(outputs[id][0].queue_seconds, 0.0);
    EXPECT_GT(outputs[id][0].prefill_seconds, 0.0);
    for (size_t t = 1; t < 4; ++t) {
      EXPECT_EQ(outputs[id][t].queue_seconds, -1.0);
      EXPECT_EQ(outputs[id][t].prefill_seconds, -1.0);
    }
  }
  EXPECT_GE(outputs[*second][0].queue_seconds, outputs[*first][0].prefill_seconds);
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
  // Sampling values no distribution has, NaN among them, each named.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<std::pair<std::function<void(GenerationOptions&)>, std::string>> bad = {
      {[&](GenerationOptions& o) { o.sampling.temperature = nan; }, "temperature"},
      {[&](GenerationOptions& o) { o.sampling.temperature = inf; }, "temperature"},
      {[&](GenerationOptions& o) { o.sampling.temperature = -0.5f; }, "temperature"},
      {[&](GenerationOptions& o) { o.sampling.top_p = nan; }, "top_p"},
      {[&](GenerationOptions& o) { o.sampling.min_p = nan; }, "min_p"},
      {[&](GenerationOptions& o) { o.sampling.min_p = 1.5f; }, "min_p"},
      {[&](GenerationOptions& o) { o.adjustments.repetition_penalty = nan; }, "repetition_penalty"},
      {[&](GenerationOptions& o) { o.adjustments.repetition_penalty = 0; }, "repetition_penalty"},
      {[&](GenerationOptions& o) { o.adjustments.presence_penalty = nan; }, "presence_penalty"},
      {[&](GenerationOptions& o) { o.adjustments.frequency_penalty = -inf; }, "frequency_penalty"},
      {[&](GenerationOptions& o) {
         o.adjustments.logit_bias = {{3, nan}};
       },
       "logit_bias"}};
  for (const auto& [spoil, named] : bad) {
    GenerationOptions options = greedy(4);
    spoil(options);
    auto refused = s.add({1, 2}, options);
    ASSERT_FALSE(refused.is_ok()) << named;
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find(named), std::string::npos)
        << refused.status().message();
  }
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

// Prompts after one that started the same way share its full blocks, and
// generate what they generate computed from scratch.
TEST_F(SchedulerTest, SharedPrefixesGenerateWhatRecomputingThemDoes) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto prompts = prompts_sharing_a_prefix(6);
  prompts.push_back(prompts[1]);  // the same prompt again
  const auto options = greedy(12);
  const auto alone = alone_uncached(prompts, options);
  for (int32_t block_size : {4, 16}) {
    SCOPED_TRACE("block size " + std::to_string(block_size));
    auto engine = make_engine(256, block_size, 2048);
    EXPECT_EQ(generate(*engine, {prompts[0]}, options)[0], alone[0]);
    const SchedulerStats first = engine->scheduler().stats();
    EXPECT_EQ(first.prefix_hit_tokens, 0);
    // The first sequence's computed tokens (the last sampled one never is),
    // and the blocks they fill.
    std::vector<int32_t> cached = prompts[0];
    cached.insert(cached.end(), alone[0].begin(), alone[0].end() - 1);
    const auto cached_blocks = int32_t(cached.size()) / block_size;
    EXPECT_EQ(first.cached_blocks, cached_blocks);
    // Admitted together in one step, every prompt shares the leading blocks
    // it has in common (up to its last token) with the first sequence, or
    // with a prompt admitted before it in this step, whose blocks this step
    // fills (all of them: the budget takes every prompt whole).
    struct Source {
      std::vector<int32_t> tokens;
      int32_t full_blocks;
    };
    std::vector<Source> sources = {{cached, cached_blocks}};
    int64_t expected_hits = 0, expected_queries = first.prefix_query_tokens;
    std::vector<int32_t> expected_cached;  // each sequence's own count
    for (const auto& p : prompts) {
      int32_t best = 0;
      for (const Source& source : sources) {
        const int32_t shareable =
            std::min((int32_t(p.size()) - 1) / block_size, source.full_blocks);
        int32_t j = 0;
        while (j < shareable &&
               std::equal(p.begin() + j * block_size, p.begin() + (j + 1) * block_size,
                          source.tokens.begin() + j * block_size))
          ++j;
        best = std::max(best, j);
      }
      expected_hits += int64_t(best) * block_size;
      expected_cached.push_back(best * block_size);
      expected_queries += int64_t(p.size());
      sources.push_back({p, int32_t(p.size()) / block_size});
    }
    for (const auto& p : prompts) ASSERT_TRUE(engine->scheduler().add(p, options).is_ok());
    auto done = engine->run_to_completion();
    ASSERT_TRUE(done.is_ok()) << done.status().to_string();
    ASSERT_EQ(done->size(), prompts.size());
    for (size_t i = 0; i < prompts.size(); ++i) {
      EXPECT_EQ((*done)[i]->output, alone[i]) << "prompt " << i;
      // What usage.prompt_tokens_details.cached_tokens reports.
      EXPECT_EQ((*done)[i]->cached_prompt_tokens, expected_cached[i]) << "prompt " << i;
    }
    const SchedulerStats after = engine->scheduler().stats();
    EXPECT_EQ(after.free_blocks, after.total_blocks) << "blocks leaked";
    EXPECT_EQ(after.prefix_hit_tokens, expected_hits);
    EXPECT_EQ(after.prefix_query_tokens, expected_queries);
    if (prompts[0].size() > size_t(block_size)) {
      EXPECT_GT(after.prefix_hit_tokens, 0);
    }
  }
}

// A prompt admitted in the step where a running sequence's chunk fills the
// blocks it starts with shares them: with a 16-token budget, A (40 tokens)
// takes three steps, and B (A and 5 more) is admitted in the third, beside
// A's last 8 tokens, and shares all 10 of A's blocks, the two filled then
// among them.
TEST_F(SchedulerTest, AdmissionSharesBlocksARunningChunkFillsInTheSameStep) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<int32_t> a = random_prompt_of_exactly(40);
  const std::vector<int32_t> b = extended(a, 5);
  const auto options = greedy(4);
  const auto alone = alone_uncached({a, b}, options);
  auto engine = make_engine(64, 4, /*budget=*/16);
  EXPECT_EQ(generate(*engine, {a, b}, options), alone);
  EXPECT_EQ(engine->scheduler().stats().prefix_hit_tokens, 40);
}

// Pools too small to keep everything: cached blocks give way to new ones,
// sequences are preempted and readmitted (sharing what is still cached), and
// outputs still equal each prompt generated alone without a cache.
TEST_F(SchedulerTest, TightPoolsWithSharedPrefixesMatchAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  // A prefix past two blocks of the largest size drawn (8): shorter ones
  // (the seed 4106256961 drew 2 tokens) leave no full block to share, and
  // the hits this test expects cannot happen.
  auto prompts = prompts_sharing_a_prefix(6, /*min_prefix=*/17);
  const auto options = greedy(10);
  const auto alone = alone_uncached(prompts, options);
  // Twice per engine: the second time from a warm cache.
  const TightTotals totals = run_tight_rounds(prompts, options, alone, 20, 2);
  const int64_t hits = totals.prefix_hit_tokens, preemptions = totals.preemptions;
  EXPECT_GT(hits, 0);
  EXPECT_GT(preemptions, 0) << "no round exercised preemption";
}

TEST_F(SchedulerTest, PrefixCachingOffSharesNothing) {
  auto prompt = random_prompt_of_at_least(20);
  auto engine = make_engine(64, 4, 2048, 64, /*prefix_caching=*/false);
  const auto first = generate(*engine, {prompt}, greedy(6));
  EXPECT_EQ(generate(*engine, {prompt}, greedy(6)), first);
  const SchedulerStats stats = engine->scheduler().stats();
  EXPECT_EQ(stats.prefix_hit_tokens, 0);
  EXPECT_EQ(stats.prefix_query_tokens, 0);
  EXPECT_EQ(stats.cached_blocks, 0);
}

// A prefill node's sequences keep their blocks for the transfer out, and
// share and register like any other: one after a plain run of its prompt
// computes only the last block's tokens, into blocks of its own, while the
// rest are the cached ones, held until released.
TEST_F(SchedulerTest, RetainedSequencesShareAndRegisterToo) {
  auto prompt = random_prompt_of_at_least(20);
  auto engine = make_engine(64, 4, 2048);
  auto& s = engine->scheduler();
  generate(*engine, {prompt}, greedy(2));
  const SchedulerStats cached = s.stats();
  ASSERT_GT(cached.cached_blocks, 0);
  GenerationOptions retained = greedy(1);
  retained.retain_blocks = true;
  ASSERT_TRUE(s.add(prompt, retained).is_ok());
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  ASSERT_EQ(done->size(), 1u);
  const auto shared = int32_t(prompt.size() - 1) / 4;
  EXPECT_EQ(s.stats().prefix_hit_tokens - cached.prefix_hit_tokens, int64_t(shared) * 4);
  const auto& blocks = (*done)[0]->block_table.blocks();
  ASSERT_EQ(blocks.size(), (prompt.size() + 3) / 4);
  for (size_t j = 0; j < blocks.size(); ++j) {
    SCOPED_TRACE("block " + std::to_string(j));
    EXPECT_EQ(s.block_manager().ref_count(blocks[j]), 1);
    // Shared ones are registered. A full last block it computed (a prompt
    // that ends on a block boundary) is not: the plain run's copy of it
    // holds its key.
    EXPECT_EQ(s.block_manager().registered(blocks[j]), int32_t(j) < shared);
  }
  // Retained: held, not free, until released.
  EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks - int32_t(blocks.size()));
  s.release_blocks(*(*done)[0]);
  EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks);
}

// The SSD tier: a pool that holds one sequence at a time evicts each
// prompt's blocks for the next one's; they go to SSD, and the second pass
// reads every shareable block of every prompt back from there or finds it
// in the pool. Outputs equal recomputing everything.
TEST_F(SchedulerTest, SsdTierBringsBackEvictedPrefixes) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const auto prompts = prompts_of_at_least(5, 30);
  const auto options = greedy(6);
  const auto alone = alone_uncached(prompts, options);
  const int32_t block_size = 4;
  auto engine = one_sequence_engine_with_ssd(prompts, options, block_size);
  ASSERT_NE(engine->scheduler().ssd_store(), nullptr);
  EXPECT_EQ(generate(*engine, prompts, options), alone);
  const SchedulerStats first = engine->scheduler().stats();
  EXPECT_GT(engine->scheduler().ssd_store()->stats().saved_blocks, 0);
  EXPECT_EQ(generate(*engine, prompts, options), alone);
  const SchedulerStats second = engine->scheduler().stats();
  int64_t shareable = 0;
  for (const auto& p : prompts) shareable += int64_t(p.size() - 1) / block_size * block_size;
  EXPECT_EQ(second.prefix_hit_tokens - first.prefix_hit_tokens, shareable);
  EXPECT_GT(second.prefix_ssd_hit_tokens - first.prefix_ssd_hit_tokens, shareable / 2);
  EXPECT_EQ(engine->scheduler().ssd_store()->stats().dropped_blocks, 0);
}

// Pools too small for the work, preemption included, with an SSD tier of
// random size (down to a single slot): outputs still equal each prompt
// generated alone without any cache.
TEST_F(SchedulerTest, TightPoolsWithAnSsdTierMatchAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto prompts = prompts_sharing_a_prefix(6);
  for (int i = 0; i < 2; ++i) prompts.push_back(random_prompt_of_at_least(24));
  const auto options = greedy(8);
  const auto alone = alone_uncached(prompts, options);
  TightTotals totals;
  for (uint64_t slots : {1, 3, 1000}) {
    SCOPED_TRACE(std::to_string(slots) + " SSD slots at most");
    // Slots of the tiny model: a 4 KiB header and 2 layers of at most 8 tokens.
    const TightTotals t = run_tight_rounds(prompts, options, alone, 6, 2, slots * 8192 + 4096);
    totals.prefix_ssd_hit_tokens += t.prefix_ssd_hit_tokens;
    totals.preemptions += t.preemptions;
  }
  EXPECT_GT(totals.prefix_ssd_hit_tokens, 0);
  EXPECT_GT(totals.preemptions, 0) << "no round exercised preemption";
}

// A forward pass that fails (here: a pool of another geometry than the
// model's) may leave blocks registered at scheduling unwritten, so the
// scheduler refuses every later step with the same error.
TEST_F(SchedulerTest, AFailedStepFailsEveryLaterOne) {
  auto engine = make_engine(64, 4, 2048);
  KvLayout layout = engine->kv_pool().layout();
  layout.head_dim *= 2;
  auto pool = KvPool::create(layout);
  ASSERT_TRUE(pool.is_ok()) << pool.status().to_string();
  Scheduler scheduler(engine->model(), *pool, SchedulerConfig{});
  const std::vector<int32_t> prompt = random_prompt_of_at_least(20);
  ASSERT_TRUE(scheduler.add(prompt, greedy(4)).is_ok());
  const Status first = scheduler.step(nullptr);
  ASSERT_FALSE(first.is_ok());
  EXPECT_NE(first.message().find("geometry"), std::string::npos) << first.to_string();
  ASSERT_TRUE(scheduler.add(random_prompt_of_at_least(20), greedy(4)).is_ok());
  const Status second = scheduler.step(nullptr);
  EXPECT_EQ(second.code(), first.code());
  EXPECT_EQ(second.message(), first.message());
  // The failed step was the last to schedule anything: the second one ran
  // nothing, not both prompts.
  EXPECT_EQ(scheduler.last_step().prompt_tokens, int64_t(prompt.size()));
}

// A restore from the SSD tier leaves room for the chunk after it: with a
// running sequence holding most of a 20-block pool and an 8-token budget, a
// prompt whose 10 leading blocks are on SSD is admitted beside it with part
// of them, instead of restoring into every free block and then failing to
// reserve its chunk, step after step, until the running one ends. The
// tier reads with preadv here, so the restore lands in the step that starts
// it: with io_uring, whether the room is still there when it lands depends
// on how many steps the running one takes meanwhile.
TEST_F(SchedulerTest, SsdRestoreLeavesRoomForItsChunk) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<int32_t> p = random_prompt_of_exactly(40);
  const std::vector<int32_t> w = extended(p, 4);
  const std::vector<int32_t> r = random_prompt_of_exactly(44);
  const auto alone = alone_uncached({r, w}, greedy(12));
  auto engine = make_engine(20, 4, /*budget=*/8, 4, true);
  Scheduler& s = engine->scheduler();
  auto store = SsdKvStore::create(dir_.path(), uint64_t(64) << 20, engine->kv_pool().layout(),
                                  SsdIo::kPlain);
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  ASSERT_TRUE(s.attach_ssd_store(std::move(store).value()).is_ok());
  push_to_ssd(*engine, p);
  ASSERT_TRUE(
      s.ssd_store()->contains(BlockKey{.hash = prefix_block_hash(kNoParent, std::span(p).first(4)),
                                       .parent = kNoParent,
                                       .tokens = std::span(p).first(4)}));
  ASSERT_TRUE(s.add(r, greedy(12)).is_ok());
  ASSERT_TRUE(s.add(w, greedy(12)).is_ok());
  bool together = false;
  std::vector<std::unique_ptr<Sequence>> done;
  while (s.has_work()) {
    ASSERT_TRUE(s.step(nullptr).is_ok());
    together |= s.stats().running == 2;
    for (auto& seq : s.take_finished()) done.push_back(std::move(seq));
  }
  EXPECT_TRUE(together) << "the SSD prompt waited for the running one to end";
  EXPECT_GT(s.stats().prefix_ssd_hit_tokens, 0);
  ASSERT_EQ(done.size(), 2u);
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  EXPECT_EQ(done[0]->output, alone[0]);
  EXPECT_EQ(done[1]->output, alone[1]);
}

// A pool the SSD tier reaches through a copier (a device's), on the CPU:
// blocks go out through staging slots before they are saved and come back
// into the pool once their reads land. Skipping either copy leaves the
// restored blocks without their K/V, so the outputs would differ.
TEST_F(SchedulerTest, SsdTierOfAStagedPoolCopiesBlocksOutAndBackIn) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const bool fail_in : {false, true}) {
    SCOPED_TRACE(fail_in ? "copies in fail" : "copies succeed");
    const std::vector<int32_t> p = random_prompt_of_exactly(40);
    const std::vector<std::vector<int32_t>> prompts = {extended(p, 4), extended(p, 3)};
    const auto alone = alone_uncached(prompts, greedy(6));
    auto engine = make_engine(40, 4, 2048, 8, true);
    CountingCopier* counts =
        attach_staged_ssd(*engine, uint64_t(64) << 20, SsdIo::kPlain, SsdStagingSlots{});
    ASSERT_NE(counts, nullptr);
    counts->fail_in = fail_in;
    Scheduler& s = engine->scheduler();
    push_to_ssd(*engine, p);
    const KvLayout& layout = engine->kv_pool().layout();
    const uint64_t block_bytes = layout.block_bytes() * uint64_t(layout.num_layers);
    EXPECT_GE(counts->out_bytes, 10 * block_bytes) << "p's ten blocks went out";
    EXPECT_EQ(counts->out_bytes % block_bytes, 0u);
    EXPECT_EQ(generate(*engine, prompts, greedy(6)), alone);
    if (fail_in) {
      EXPECT_GT(counts->calls_in, 0) << "no copy in was tried: the failure was never met";
      EXPECT_EQ(s.stats().prefix_ssd_hit_tokens, 0) << "blocks that did not come in are no hits";
    } else {
      EXPECT_EQ(counts->in_bytes, 10 * block_bytes) << "p's ten blocks came back, once";
      EXPECT_EQ(s.stats().prefix_ssd_hit_tokens, 40);
    }
  }
}

// Fewer staging slots than a restore has blocks: it reads a piece at a time,
// each into the slots the last one gave back, and the copies never reach
// past the slots (host memory stays bounded however large the pool is).
// Blocks saved in more batches than there are save slots all come back.
TEST_F(SchedulerTest, AStagedRestoreLargerThanItsSlotsComesInPieces) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const SsdIo io : {SsdIo::kPlain, SsdIo::kIoUring}) {
    for (const SsdStagingSlots slots : {SsdStagingSlots{1, 1}, SsdStagingSlots{3, 2},
                                        SsdStagingSlots{4, 64}, SsdStagingSlots{64, 64}}) {
      SCOPED_TRACE(std::string(io == SsdIo::kPlain ? "preadv" : "io_uring") + ", " +
                   std::to_string(slots.load) + " load and " + std::to_string(slots.save) +
                   " save slots");
      const std::vector<int32_t> p = random_prompt_of_exactly(40);
      const std::vector<std::vector<int32_t>> prompts = {extended(p, 4), extended(p, 3)};
      const auto alone = alone_uncached(prompts, greedy(6));
      auto engine = make_engine(40, 4, 2048, 8, true);
      CountingCopier* counts = attach_staged_ssd(*engine, uint64_t(64) << 20, io, slots);
      ASSERT_NE(counts, nullptr);
      if (io == SsdIo::kIoUring && kernel_offers_io_uring()) {
        ASSERT_TRUE(engine->scheduler().ssd_store()->loads_are_asynchronous());
      }
      push_to_ssd(*engine, p);
      EXPECT_EQ(generate(*engine, prompts, greedy(6)), alone);
      const KvLayout& layout = engine->kv_pool().layout();
      const uint64_t block_bytes = layout.block_bytes() * uint64_t(layout.num_layers);
      EXPECT_EQ(counts->in_bytes, 10 * block_bytes) << "p's ten blocks came back, once";
      EXPECT_EQ(engine->scheduler().stats().prefix_ssd_hit_tokens, 40);
      const int32_t load = std::min(slots.load, layout.num_blocks);
      const int32_t save = std::min(slots.save, layout.num_blocks);
      EXPECT_EQ(counts->copies_in, (10 + load - 1) / load) << "one copy in per piece";
      EXPECT_LE(counts->host_end, uint64_t(load + save) * block_bytes)
          << "a copy reached past the staging slots";
    }
  }
}

// Two prompts whose prefixes are on SSD, admitted in one step, with one
// load slot: with io_uring the second restore starts while the first holds
// the slot, and waits for it (with preadv each lands as it starts). Both
// come back whole, a block at a time.
TEST_F(SchedulerTest, StagedRestoresWaitForEachOthersSlots) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (const SsdIo io : {SsdIo::kPlain, SsdIo::kIoUring}) {
    SCOPED_TRACE(io == SsdIo::kPlain ? "preadv" : "io_uring");
    const std::vector<int32_t> p = random_prompt_of_exactly(40), q = random_prompt_of_exactly(40);
    const std::vector<std::vector<int32_t>> prompts = {extended(p, 4), extended(q, 3)};
    const auto alone = alone_uncached(prompts, greedy(6));
    auto engine = make_engine(40, 4, 2048, 8, true);
    CountingCopier* counts =
        attach_staged_ssd(*engine, uint64_t(64) << 20, io, SsdStagingSlots{1, 2});
    ASSERT_NE(counts, nullptr);
    const bool asynchronous = io == SsdIo::kIoUring && kernel_offers_io_uring();
    if (asynchronous) {
      ASSERT_TRUE(engine->scheduler().ssd_store()->loads_are_asynchronous());
    }
    push_to_ssd(*engine, p);
    push_to_ssd(*engine, q);
    Scheduler& s = engine->scheduler();
    for (const auto& prompt : prompts) ASSERT_TRUE(s.add(prompt, greedy(6)).is_ok());
    // How many restores were under way when a piece was copied in.
    int32_t most_restoring = 0;
    counts->before_copy_in = [&] {
      most_restoring = std::max(most_restoring, s.stats().restoring);
    };
    auto done = engine->run_to_completion();
    ASSERT_TRUE(done.is_ok()) << done.status().to_string();
    ASSERT_EQ(done->size(), 2u);
    std::sort(done->begin(), done->end(),
              [](const auto& a, const auto& b) { return a->id < b->id; });
    EXPECT_EQ((*done)[0]->output, alone[0]);
    EXPECT_EQ((*done)[1]->output, alone[1]);
    EXPECT_EQ(s.stats().prefix_ssd_hit_tokens, 80) << "both prefixes came back whole";
    EXPECT_EQ(counts->copies_in, 20) << "a piece of one block at a time";
    if (asynchronous) {
      EXPECT_EQ(most_restoring, 2) << "the second restore never waited";
    }
  }
}

// Pools too small for the work with a staged SSD tier of one to three slots
// of each kind: restores of several prompts wait for each other's slots, in
// pieces, while evictions save in batches. Outputs equal each prompt alone.
TEST_F(SchedulerTest, TightPoolsWithAStagedSsdTierMatchAlone) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto prompts = prompts_sharing_a_prefix(6, /*min_prefix=*/17);
  for (int i = 0; i < 3; ++i) prompts.push_back(random_prompt_of_at_least(24));
  const auto options = greedy(8);
  const auto alone = alone_uncached(prompts, options);
  std::uniform_int_distribution<int32_t> pick(1, 3);
  const SsdStagingSlots slots{pick(rng_), pick(rng_)};
  SCOPED_TRACE(std::to_string(slots.load) + " load and " + std::to_string(slots.save) +
               " save slots");
  const TightTotals t = run_tight_rounds(prompts, options, alone, 6, 2, uint64_t(64) << 20, slots);
  EXPECT_GT(t.prefix_ssd_hit_tokens, 0);
}

// A staged pool's SSD tier stopped while its reads are in flight: the store
// waits them out and verifies them in the staging slots, so the slots must
// still be mapped then (a host mirror was once unmapped first, and the
// verify faulted).
TEST_F(SchedulerTest, StagedSsdTierStopsWithReadsInFlight) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<int32_t> p = random_prompt_of_exactly(40);
  for (int trial = 0; trial < 5; ++trial) {
    auto engine = make_engine(40, 4, 2048, 8, true);
    Scheduler& s = engine->scheduler();
    const std::filesystem::path dir = dir_.path() / std::to_string(trial);
    std::filesystem::create_directories(dir);
    auto store =
        SsdKvStore::create(dir, uint64_t(64) << 20, engine->kv_pool().layout(), SsdIo::kIoUring);
    ASSERT_TRUE(store.is_ok()) << store.status().to_string();
    if (!kernel_offers_io_uring()) GTEST_SKIP() << "this kernel refuses io_uring_queue_init";
    ASSERT_TRUE(store.value()->loads_are_asynchronous())
        << "the kernel offers io_uring, but the SSD tier fell back to synchronous reads";
    ASSERT_TRUE(s.attach_ssd_store(std::move(store).value(),
                                   std::make_unique<CountingCopier>(engine->kv_pool()))
                    .is_ok());
    push_to_ssd(*engine, p);
    // A running sequence keeps the step from waiting for the reads.
    ASSERT_TRUE(s.add(random_prompt_of_exactly(21), greedy(8)).is_ok());
    ASSERT_TRUE(s.step(nullptr).is_ok());
    ASSERT_TRUE(s.add(extended(p, 4), greedy(4)).is_ok());
    ASSERT_TRUE(s.step(nullptr).is_ok());
    ASSERT_EQ(s.stats().restoring, 1) << "the prompt's blocks are being read";
    engine.reset();  // the reads still in flight, or landed and not yet verified
  }
}

// A burst of prompts that share a prefix the pool lost to the SSD tier:
// the first one's restore reads it, and the others wait for that read
// instead of reading the same blocks again. Outputs equal computing all.
TEST_F(SchedulerTest, ABurstSharingARestoredPrefixReadsItOnce) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<int32_t> p = random_prompt_of_exactly(40);
  std::vector<std::vector<int32_t>> burst;
  for (int i = 0; i < 4; ++i) burst.push_back(extended(p, 4));
  const auto alone = alone_uncached(burst, greedy(4));
  auto engine = make_engine(40, 4, 2048, 8, true, uint64_t(64) << 20);
  Scheduler& s = engine->scheduler();
  push_to_ssd(*engine, p);
  const int64_t loaded_before = s.ssd_store()->stats().loaded_blocks;
  const SchedulerStats before = s.stats();
  EXPECT_EQ(generate(*engine, burst, greedy(4)), alone);
  EXPECT_EQ(s.ssd_store()->stats().loaded_blocks - loaded_before, 10) << "p's blocks, read once";
  EXPECT_EQ(s.stats().prefix_ssd_hit_tokens - before.prefix_ssd_hit_tokens, 40);
  EXPECT_EQ(s.stats().prefix_hit_tokens - before.prefix_hit_tokens, 4 * 40);
}

// While the SSD tier reads a waiting prompt's blocks, the running
// sequences go on: the step that starts the restore runs their decode
// tokens and nothing of the prompt, which is admitted once its blocks
// landed. Outputs equal each prompt generated alone.
TEST_F(SchedulerTest, RunningSequencesComputeWhileARestoreIsRead) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  RestoreCase c = restore_case(8);
  Scheduler& s = c.engine->scheduler();
  if (!kernel_offers_io_uring()) GTEST_SKIP() << "this kernel refuses io_uring_queue_init";
  ASSERT_TRUE(s.ssd_store()->loads_are_asynchronous())
      << "the kernel offers io_uring, but the SSD tier fell back to synchronous reads";
  ASSERT_TRUE(s.add(c.r, greedy(8)).is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());  // r's prompt
  ASSERT_TRUE(s.add(c.w, greedy(8)).is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  EXPECT_EQ(s.last_step().generated_tokens, 1) << "r's decode token";
  EXPECT_EQ(s.last_step().prompt_tokens, 0) << "w waits for its blocks";
  EXPECT_EQ(s.stats().restoring, 1);
  EXPECT_EQ(outputs_of_the_rest(s), c.alone);
  EXPECT_EQ(s.stats().restoring, 0);
  EXPECT_EQ(s.stats().prefix_ssd_hit_tokens, 40);
}

// A prompt aborted while the SSD tier reads its blocks finishes at once;
// the blocks are freed when the reads land (a step lands them), and stay
// cached: the same prefix then comes from the pool without another read.
TEST_F(SchedulerTest, AbortedRestoreFreesItsBlocksWhenTheReadsLand) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const std::vector<int32_t> p = random_prompt_of_exactly(40);
  auto engine = make_engine(40, 4, 2048, 8, true, uint64_t(64) << 20);
  Scheduler& s = engine->scheduler();
  if (!kernel_offers_io_uring()) GTEST_SKIP() << "this kernel refuses io_uring_queue_init";
  ASSERT_TRUE(s.ssd_store()->loads_are_asynchronous())
      << "the kernel offers io_uring, but the SSD tier fell back to synchronous reads";
  push_to_ssd(*engine, p);
  // Its second token, in the step that starts the restore, ends it.
  ASSERT_TRUE(s.add(random_prompt_of_exactly(21), greedy(2)).is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  auto w = s.add(extended(p, 4), greedy(4));
  ASSERT_TRUE(w.is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  ASSERT_EQ(s.stats().restoring, 1);
  ASSERT_TRUE(s.abort(*w));
  EXPECT_EQ(s.stats().restoring, 0);
  bool aborted = false;
  while (s.has_work()) {
    ASSERT_TRUE(s.step(nullptr).is_ok());
    for (auto& seq : s.take_finished())
      aborted |= seq->id == *w && seq->finish_reason == FinishReason::kAborted;
  }
  for (auto& seq : s.take_finished())
    aborted |= seq->id == *w && seq->finish_reason == FinishReason::kAborted;
  EXPECT_TRUE(aborted);
  EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks) << "no block is held any more";
  const int64_t loaded = s.ssd_store()->stats().loaded_blocks;
  EXPECT_EQ(loaded, 10);
  const SchedulerStats before = s.stats();
  generate(*engine, {extended(p, 4)}, greedy(2));
  EXPECT_EQ(s.stats().prefix_hit_tokens - before.prefix_hit_tokens, 40);
  EXPECT_EQ(s.ssd_store()->stats().loaded_blocks, loaded) << "found in the pool";
}

TEST_F(SchedulerTest, SsdTierNeedsPrefixCachingAndADirectory) {
  EngineConfig config;
  config.ssd_cache_dir = dir_.path().string();
  config.enable_prefix_caching = false;
  auto off = Engine::create(model_dir_, config);
  ASSERT_FALSE(off.is_ok());
  EXPECT_NE(off.status().message().find("engine.enable_prefix_caching"), std::string::npos)
      << off.status().to_string();
  config.enable_prefix_caching = true;
  config.ssd_cache_dir = (dir_.path() / "missing").string();
  auto missing = Engine::create(model_dir_, config);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("missing is not a directory"), std::string::npos)
      << missing.status().to_string();
}

// Damage to every slot of the SSD tier's file: the first prompt, whose
// blocks the later ones evicted from the pool, finds its first block's slot
// damaged, drops it and computes the whole prompt again: nothing is shared,
// and its output stays right.
TEST_F(SchedulerTest, DamagedSsdTierIsComputedAgain) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const auto prompts = prompts_of_at_least(4, 30);
  const auto options = greedy(4);
  const auto alone = alone_uncached(prompts, options);
  // The three later prompts need more blocks than the pool holds.
  auto engine = one_sequence_engine_with_ssd(prompts, options, 4);
  EXPECT_EQ(generate(*engine, prompts, options), alone);
  const SsdKvStore& ssd = *engine->scheduler().ssd_store();
  const SsdKvStoreStats saved = ssd.stats();
  ASSERT_GT(saved.saved_blocks, 0);
  {
    std::fstream f(ssd.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (int64_t slot = 0; slot < saved.saved_blocks; ++slot) {
      // One byte of the payload, somewhere in its first 1 KiB (2 layers of
      // 4 tokens of the tiny model's F32 K/V).
      const auto at = std::streamoff(uint64_t(slot) * ssd.slot_bytes() + 4096 + rng_() % 1024);
      f.seekg(at);
      const int byte = f.get();
      f.seekp(at);
      f.put(char(byte ^ 0x5a));
    }
  }
  const SchedulerStats before = engine->scheduler().stats();
  EXPECT_EQ(generate(*engine, {prompts[0]}, options)[0], alone[0]);
  const SchedulerStats after = engine->scheduler().stats();
  EXPECT_EQ(after.prefix_hit_tokens, before.prefix_hit_tokens);
  EXPECT_EQ(after.prefix_ssd_hit_tokens, before.prefix_ssd_hit_tokens);
  EXPECT_EQ(ssd.stats().dropped_blocks, saved.dropped_blocks + 1);
  // Computed again and registered, it is found in the pool next time.
  EXPECT_EQ(generate(*engine, {prompts[0]}, options)[0], alone[0]);
  EXPECT_GT(engine->scheduler().stats().prefix_hit_tokens, after.prefix_hit_tokens);
}

// Sliding-window tests: a tiny Qwen2-shaped model of fresh random weights,
// every layer with a 9-token window (or none), 4-token blocks, 8-token steps.
class SlidingWindowTest : public ::testing::Test {
 protected:
  static constexpr int32_t kWindow = 9, kBlock = 4, kChunk = 8;
  // What one sequence holds at once: the window behind a step's first row
  // and the step's tokens, 5 blocks.
  static constexpr int32_t kPoolBlocks = (kWindow - 1 + kChunk + kBlock - 1) / kBlock + 1;

  void SetUp() override {
    auto preset = model_preset("tiny-qwen2");
    ASSERT_TRUE(preset.is_ok());
    config_ = *preset;
  }
  // The model, its every layer windowed or none.
  std::filesystem::path make(bool windowed) {
    ModelConfig c = config_;
    if (windowed) c.layer_windows.assign(size_t(c.num_layers), kWindow);
    return testing::make_model(dir_, c, windowed ? "windowed" : "full", DType::kF32, seed_);
  }
  // Two threads, `blocks` of kBlock tokens, steps of kChunk.
  static EngineConfig engine_config(int32_t blocks) {
    EngineConfig config;
    config.threads = 2;
    config.block_size = kBlock;
    config.kv_cache_blocks = blocks;
    config.max_num_batched_tokens = kChunk;
    return config;
  }
  // `prompt` run alone on `engine` to its end: `max_tokens` greedy tokens,
  // EOS ignored, each with its log-probability; null (a failed
  // expectation) if it did not finish.
  static std::unique_ptr<Sequence> generate_alone(Engine& engine,
                                                  const std::vector<int32_t>& prompt,
                                                  int32_t max_tokens) {
    GenerationOptions options = testing::greedy(max_tokens);
    options.ignore_eos = true;
    options.logprobs = 1;
    EXPECT_TRUE(engine.scheduler().add(prompt, options).is_ok());
    auto done = engine.run_to_completion();
    EXPECT_TRUE(done.is_ok() && done->size() == 1)
        << (done.is_ok() ? "not one sequence" : done.status().to_string());
    return done.is_ok() && done->size() == 1 ? std::move((*done)[0]) : nullptr;
  }
  std::vector<int32_t> random_tokens(size_t n) {
    std::uniform_int_distribution<int32_t> id(3, config_.vocab_size - 1);
    std::vector<int32_t> tokens(n);
    for (int32_t& t : tokens) t = id(rng_);
    return tokens;
  }

  const uint32_t seed_ = std::random_device{}();
  std::mt19937 rng_{seed_};
  testing::TempDir dir_;
  ModelConfig config_;
};

// Every token `seq` chose after `prompt` has the log-probability the double
// reference of `checkpoint` (its windows included) gives it.
void expect_logprobs_of_the_reference(const Checkpoint& checkpoint,
                                      const std::vector<int32_t>& prompt, const Sequence& seq) {
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), seq.output.begin(), seq.output.end() - 1);
  const auto reference = testing::reference_logits(checkpoint, tokens, DType::kF32);
  ASSERT_EQ(seq.output_logprobs.size(), seq.output.size());
  for (size_t i = 0; i < seq.output.size(); ++i) {
    const auto want = testing::log_softmax(reference[prompt.size() - 1 + i]);
    EXPECT_NEAR(seq.output_logprobs[i].logprob, want[size_t(seq.output[i])], 2e-4)
        << "output token " << i;
  }
}

// Sliding windows on every layer: a long generation gives back the blocks
// no window reads any more, so it holds a few at a time however long it
// runs, and every token it chose has the log-probability the double
// reference with the window gives it (prompt prefilled in chunks, output
// decoded). With prefix caching on, the blocks given back stay cached;
// off, the next block reserved is the one just given back (lowest id
// first), so giving one back too early overwrites what a window reads.
TEST_F(SlidingWindowTest, ALongGenerationHoldsOnlyItsWindowAndMatchesTheReference) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const auto path = make(/*windowed=*/true);
  EngineConfig engine_config = SlidingWindowTest::engine_config(64);
  const std::vector<int32_t> prompt = random_tokens(21);
  auto checkpoint = Checkpoint::open(path);
  ASSERT_TRUE(checkpoint.is_ok());
  for (const bool prefix_caching : {true, false}) {
    SCOPED_TRACE(prefix_caching ? "prefix caching on" : "prefix caching off");
    engine_config.enable_prefix_caching = prefix_caching;
    auto engine = Engine::create(path, engine_config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    const std::unique_ptr<Sequence> done = generate_alone(**engine, prompt, 150);
    ASSERT_NE(done, nullptr);
    const Sequence& seq = *done;
    ASSERT_EQ(seq.output.size(), 150u);
    // A step reads the window behind its first row and writes its own
    // tokens: at most (kWindow - 1 + kChunk) tokens over whole blocks, one
    // more where they straddle a boundary. Without giving blocks back, 43.
    const SchedulerStats stats = (*engine)->scheduler().stats();
    EXPECT_LE(stats.peak_used_blocks, (kWindow - 1 + kChunk + kBlock - 1) / kBlock + 1);
    EXPECT_EQ(stats.free_blocks, stats.total_blocks);

    expect_logprobs_of_the_reference(**checkpoint, prompt, seq);
  }
}

// With a window on every layer a sequence holds the window and a step's
// tokens: a pool of a few blocks runs a context many times its size (its
// max_model_len is not capped at the pool), and every token chosen has the
// log-probability the double reference with the window gives it. A model
// without windows and the same pool is capped at the pool.
TEST_F(SlidingWindowTest, AContextManyTimesThePoolRunsInItsWindow) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  ASSERT_EQ(tokens_held_at_once(4096, kWindow, kChunk, kBlock), kPoolBlocks * kBlock);
  const auto unwindowed = make(/*windowed=*/false);
  const auto path = make(/*windowed=*/true);
  EngineConfig engine_config = SlidingWindowTest::engine_config(kPoolBlocks);
  engine_config.enable_prefix_caching = false;
  auto capped = Engine::create(unwindowed, engine_config);
  ASSERT_TRUE(capped.is_ok()) << capped.status().to_string();
  EXPECT_EQ((*capped)->scheduler().max_model_len(), kPoolBlocks * kBlock);

  auto engine = Engine::create(path, engine_config);
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  EXPECT_EQ((*engine)->scheduler().max_model_len(), config_.max_position_embeddings);
  // Three pools' worth, in chunks.
  const std::vector<int32_t> prompt = random_tokens(3 * kPoolBlocks * kBlock);
  const std::unique_ptr<Sequence> done = generate_alone(**engine, prompt, 100);
  ASSERT_NE(done, nullptr);
  const Sequence& seq = *done;
  ASSERT_EQ(seq.output.size(), 100u);
  EXPECT_EQ(seq.finish_reason, FinishReason::kLength);
  const SchedulerStats stats = (*engine)->scheduler().stats();
  EXPECT_LE(stats.peak_used_blocks, kPoolBlocks);
  EXPECT_EQ(stats.preemptions, 0);
  EXPECT_EQ(stats.free_blocks, stats.total_blocks);

  auto checkpoint = Checkpoint::open(path);
  ASSERT_TRUE(checkpoint.is_ok());
  expect_logprobs_of_the_reference(**checkpoint, prompt, seq);
}

// A follow-up whose cached prefix fills the whole pool: the blocks behind
// its windows go back as it is admitted, so it takes a chunk of what is
// free instead of waiting forever for blocks no one else will give back;
// it shares the prefix and chooses what the double reference gives.
TEST_F(SlidingWindowTest, AFollowUpWhosePrefixFillsThePoolGoesOn) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const auto path = make(/*windowed=*/true);
  auto engine = Engine::create(path, engine_config(kPoolBlocks));
  ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
  Scheduler& s = (*engine)->scheduler();
  const std::vector<int32_t> first = random_tokens(16);
  const std::unique_ptr<Sequence> done = generate_alone(**engine, first, 5);
  ASSERT_NE(done, nullptr);
  // 20 tokens computed: the pool's 5 blocks, all cached, none held.
  std::vector<int32_t> follow_up = first;
  const std::vector<int32_t>& out = done->output;
  follow_up.insert(follow_up.end(), out.begin(), out.begin() + 4);
  const std::vector<int32_t> more_tokens = random_tokens(10);
  follow_up.insert(follow_up.end(), more_tokens.begin(), more_tokens.end());
  const int64_t hits = s.stats().prefix_hit_tokens;
  const std::unique_ptr<Sequence> again = generate_alone(**engine, follow_up, 12);
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(s.stats().prefix_hit_tokens - hits, kPoolBlocks * kBlock);
  auto checkpoint = Checkpoint::open(path);
  ASSERT_TRUE(checkpoint.is_ok());
  expect_logprobs_of_the_reference(**checkpoint, follow_up, *again);
}

// A windowed sequence gives back its first blocks first, so the pool evicts
// them first: a follow-up whose prefix's leading blocks are gone (evicted,
// or saved to the SSD tier) still shares the blocks its windows reach, the
// ones before them skipped and not read back from the tier; where the tier
// holds the whole prefix, only the blocks its window reads come back. It
// chooses what the double reference gives.
TEST_F(SlidingWindowTest, AFollowUpSharesItsWindowWhenItsFirstBlocksWereEvicted) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const auto path = make(/*windowed=*/true);
  auto checkpoint = Checkpoint::open(path);
  ASSERT_TRUE(checkpoint.is_ok());
  struct Case {
    const char* name;
    bool ssd;
    size_t others;     // tokens computed after the prompt, evicting its blocks
    int64_t from_ssd;  // of the follow-up's 44 tokens found cached
  };
  // 44 tokens: blocks 0-10 cached, given back from the first one on as the
  // windows passed them. Then 36 other tokens take the 5 blocks never used
  // and evict the 4 given back first, blocks 0-3; or 64 evict all 11. The
  // follow-up's next query (at 44) reads blocks 9 and 10.
  for (const Case& c : {Case{"pool only", false, 36, 0}, Case{"SSD tier", true, 36, 0},
                        Case{"all on the SSD tier", true, 64, 8}}) {
    SCOPED_TRACE(c.name);
    EngineConfig config = engine_config(16);
    if (c.ssd) {
      config.ssd_cache_dir = dir_.path().string();
      config.ssd_cache_bytes = 1 << 20;
    }
    auto engine = Engine::create(path, config);
    ASSERT_TRUE(engine.is_ok()) << engine.status().to_string();
    Scheduler& s = (*engine)->scheduler();
    const std::vector<int32_t> prompt = random_tokens(44);
    for (const auto& tokens : {prompt, random_tokens(c.others)})
      ASSERT_NE(generate_alone(**engine, tokens, 1), nullptr);
    std::vector<int32_t> follow_up = prompt;
    const std::vector<int32_t> more_tokens = random_tokens(8);
    follow_up.insert(follow_up.end(), more_tokens.begin(), more_tokens.end());
    const SchedulerStats before = s.stats();
    const int64_t loaded = c.ssd ? s.ssd_store()->stats().loaded_blocks : 0;
    const std::unique_ptr<Sequence> again = generate_alone(**engine, follow_up, 6);
    ASSERT_NE(again, nullptr);
    const SchedulerStats after = s.stats();
    EXPECT_EQ(after.prefix_hit_tokens - before.prefix_hit_tokens, 44);
    EXPECT_EQ(after.prefix_ssd_hit_tokens - before.prefix_ssd_hit_tokens, c.from_ssd);
    if (c.ssd) {
      EXPECT_GT(s.ssd_store()->stats().saved_blocks, 0);
      EXPECT_EQ(s.ssd_store()->stats().loaded_blocks - loaded, c.from_ssd / kBlock);
    }
    EXPECT_EQ(after.free_blocks, after.total_blocks);
    expect_logprobs_of_the_reference(**checkpoint, follow_up, *again);
  }
}

}  // namespace
}  // namespace baton::engine
