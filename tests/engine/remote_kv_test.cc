// Disaggregated serving through the scheduler: a request prefilled on one
// engine and decoded on another (KV copied between their pools) produces
// exactly what one engine produces; reserved blocks are never scheduled or
// preempted; retained blocks stay used until released; the layer observer
// sees each layer's K/V stored before the next layer writes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <span>
#include <tuple>

#include "common/prefix_hash.h"
#include "engine/engine.h"
#include "engine/make_model.h"
#include "engine/scheduler.h"
#include "tests/engine/greedy_options.h"
#include "tests/engine/temp_model.h"

namespace baton::engine {
namespace {

void copy_kv(const KvPool& from, const std::vector<int32_t>& src, KvPool& to,
             const std::vector<int32_t>& dst, size_t n);

class RemoteKvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    seed_ = std::random_device{}();
    rng_.seed(seed_);
    model_dir_ = testing::make_preset_model(dir_, "tiny", DType::kF32, seed_);
  }

  std::unique_ptr<Engine> make_engine(int32_t blocks, int32_t block_size, int32_t budget,
                                      const std::filesystem::path& model_dir = {},
                                      bool ssd_tier = false) {
    EngineConfig config;
    if (ssd_tier) config.ssd_cache_dir = dir_.path().string();
    config.threads = 2;
    config.kv_cache_blocks = blocks;
    config.block_size = block_size;
    config.max_num_batched_tokens = budget;
    config.kv_dtype = kv_dtype_;
    config.enable_prefix_caching = prefix_caching_;
    if (max_num_seqs_ > 0) config.max_num_seqs = max_num_seqs_;
    auto engine = Engine::create(model_dir.empty() ? model_dir_ : model_dir, config);
    EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
    return std::move(engine).value();
  }

  std::optional<DType> kv_dtype_;  // engine.kv_dtype of make_engine; unset: auto
  int32_t max_num_seqs_ = 0;       // engine.max_num_seqs of make_engine; 0: its default
  bool prefix_caching_ = true;     // engine.enable_prefix_caching of make_engine

  std::vector<int32_t> random_prompt(int32_t min_len, int32_t max_len) {
    std::uniform_int_distribution<int32_t> len(min_len, max_len), id(3, 511);
    std::vector<int32_t> p(size_t(len(rng_)));
    for (auto& t : p) t = id(rng_);
    return p;
  }

  // For the prefix cache: `earlier`, 20-40 tokens, and `prompt`, whose first
  // 17 tokens are earlier's (four 4-token blocks in common) and the rest its
  // own.
  void prompts_sharing_four_blocks(std::vector<int32_t>& earlier, std::vector<int32_t>& prompt) {
    earlier = random_prompt(20, 40);
    prompt.assign(earlier.begin(), earlier.begin() + 17);
    const std::vector<int32_t> own = random_prompt(3, 12);
    prompt.insert(prompt.end(), own.begin(), own.end());
  }

  // Flips a payload byte of the tier's slot holding block `j` of `prompt`
  // (found by the key hash in the slots' headers).
  static void damage_stored_block(const SsdKvStore& store, const std::vector<int32_t>& prompt,
                                  int32_t block_size, int32_t j) {
    uint64_t hash = kNoParent;
    for (int32_t b = 0; b <= j; ++b) {
      hash = prefix_block_hash(
          hash, std::span(prompt).subspan(size_t(b * block_size), size_t(block_size)));
    }
    std::fstream f(store.path(), std::ios::in | std::ios::out | std::ios::binary);
    ASSERT_TRUE(f.good());
    constexpr std::streamoff kHashOffset = 32, kHeaderBytes = 4096;
    for (int64_t slot = 0; slot < store.stats().capacity_blocks; ++slot) {
      const auto at = std::streamoff(uint64_t(slot) * store.slot_bytes());
      uint64_t stored = 0;
      f.seekg(at + kHashOffset);
      if (!f.read(reinterpret_cast<char*>(&stored), sizeof(stored))) break;
      if (stored != hash) continue;
      char c = 0;
      f.seekg(at + kHeaderBytes + 5);
      f.read(&c, 1);
      c = char(c ^ 0x5a);
      f.seekp(at + kHeaderBytes + 5);
      f.write(&c, 1);
      return;
    }
    FAIL() << "no slot holds block " << j;
  }

  // An earlier prompt and a prompt sharing its first four 4-token blocks
  // (prompts_sharing_four_blocks), and the prompt run whole (run_whole).
  struct SharedPrefixCase {
    std::vector<int32_t> earlier, prompt;
    std::unique_ptr<Sequence> want;
  };
  SharedPrefixCase shared_prefix_case(const GenerationOptions& o) {
    SharedPrefixCase c;
    prompts_sharing_four_blocks(c.earlier, c.prompt);
    c.want = run_whole(c.prompt, o);
    return c;
  }

  // A prefill node's run of the prompt (max_tokens 1, blocks retained).
  struct Prefilled {
    std::unique_ptr<Engine> engine;
    std::unique_ptr<Sequence> done;
  };
  Prefilled prefill_node_run(const std::vector<int32_t>& prompt, const GenerationOptions& o,
                             int32_t block_size) {
    Prefilled p{make_engine(128, block_size, 2048), nullptr};
    p.done = prefill_on(*p.engine, prompt, o);
    return p;
  }
  // `prefill_node` runs `prompt` as a prefill node does (max_tokens 1), keeping
  // the blocks from `retained_from` on; its finished sequence, null (a failed
  // expectation) if there is none.
  static std::unique_ptr<Sequence> prefill_on(Engine& prefill_node,
                                              const std::vector<int32_t>& prompt,
                                              const GenerationOptions& o,
                                              int32_t retained_from = 0) {
    GenerationOptions prefill = o;
    prefill.max_tokens = 1;
    prefill.retain_blocks = true;
    prefill.retained_from_block = retained_from;
    EXPECT_TRUE(prefill_node.scheduler().add(prompt, prefill).is_ok());
    auto done = prefill_node.run_to_completion();
    EXPECT_TRUE(done.is_ok() && done->size() == 1);
    if (!done.is_ok() || done->size() != 1) return nullptr;
    return std::move((*done)[0]);
  }

  // The prefill node `prefill` computes `prompt` for the decode node's
  // reservation `awaiting`; the blocks the reservation lacks (after those
  // cached and those its windows let go) are copied into their blocks, as
  // the transfer would, and the reservation is activated. False (a failed
  // expectation) where either step fails.
  static bool send_what_it_lacks(Engine& prefill, Engine& decode, const Sequence& awaiting,
                                 const std::vector<int32_t>& prompt, const GenerationOptions& o) {
    const int32_t first = std::max(awaiting.registered_blocks, awaiting.block_table.num_released());
    const std::unique_ptr<Sequence> done = prefill_on(prefill, prompt, o, first);
    if (done == nullptr) return false;
    const auto& src = done->block_table.blocks();
    const auto& dst = awaiting.block_table.blocks();
    copy_kv(prefill.kv_pool(), std::vector<int32_t>(src.begin() + first, src.end()),
            decode.kv_pool(), std::vector<int32_t>(dst.begin() + first, dst.end()),
            dst.size() - size_t(first));
    const Status activated = decode.scheduler()
                                 .activate_remote(awaiting.id, done->output[0], done->rng.draws(),
                                                  &done->output_logprobs.at(0))
                                 .status();
    EXPECT_TRUE(activated.is_ok()) << activated.to_string();
    prefill.scheduler().release_blocks(*done);
    return activated.is_ok();
  }

  // A decode node that served `earlier` itself: its blocks are cached in the
  // pool (64 blocks) or, `through_ssd`, in the SSD tier, after a long
  // prompt that took every block of a 16-block pool evicted them there.
  std::unique_ptr<Engine> decode_node_that_served(const std::vector<int32_t>& earlier,
                                                  int32_t block_size, bool through_ssd) {
    auto c = make_engine(through_ssd ? 16 : 64, block_size, 2048, {}, through_ssd);
    EXPECT_TRUE(c->scheduler().add(earlier, testing::greedy(2)).is_ok());
    EXPECT_TRUE(c->run_to_completion().is_ok());
    if (through_ssd) {
      EXPECT_TRUE(c->scheduler().add(random_prompt(61, 61), testing::greedy(1)).is_ok());
      EXPECT_TRUE(c->run_to_completion().is_ok());
    }
    return c;
  }

  // Qwen2's shape (whose config can give every layer a window) with a
  // `window`-token sliding window on every layer, fresh random weights.
  std::filesystem::path make_windowed_model(int32_t window) {
    auto config = model_preset("tiny-qwen2");
    EXPECT_TRUE(config.is_ok());
    config->layer_windows.assign(size_t(config->num_layers), window);
    return testing::make_model(dir_, *config, "windowed", DType::kF32, seed_);
  }

  // The prompt run whole on one fresh engine of 4-token blocks (of
  // `model_dir`; empty: the fixture's model).
  std::unique_ptr<Sequence> run_whole(const std::vector<int32_t>& prompt,
                                      const GenerationOptions& options,
                                      const std::filesystem::path& model_dir = {}) {
    auto engine = make_engine(128, 4, 2048, model_dir);
    EXPECT_TRUE(engine->scheduler().add(prompt, options).is_ok());
    auto done = engine->run_to_completion();
    EXPECT_TRUE(done.is_ok() && done->size() == 1);
    return done.is_ok() && done->size() == 1 ? std::move((*done)[0]) : nullptr;
  }

  uint32_t seed_ = 0;
  std::mt19937 rng_;
  testing::TempDir dir_;
  std::filesystem::path model_dir_;
};

using testing::greedy;

// The transfer, simulated: every layer of the first `n` blocks of `src`
// copied byte for byte into the blocks `dst` (pools may differ in size).
void copy_kv(const KvPool& from, const std::vector<int32_t>& src, KvPool& to,
             const std::vector<int32_t>& dst, size_t n) {
  const KvLayout& a = from.layout();
  const KvLayout& b = to.layout();
  ASSERT_TRUE(a.same_geometry(b));
  ASSERT_GE(src.size(), n);
  ASSERT_GE(dst.size(), n);
  for (int32_t layer = 0; layer < a.num_layers; ++layer) {
    for (size_t i = 0; i < n; ++i) {
      std::memcpy(static_cast<char*>(to.data()) + b.block_byte_offset(layer, dst[i]),
                  static_cast<const char*>(from.data()) + a.block_byte_offset(layer, src[i]),
                  a.block_bytes());
    }
  }
}

// Log-probs agree up to rounding: how a step is batched and chunked changes
// the summation order in attention (short query runs are split over keys like
// decode rows), so the last bits may differ. KV that is wrong or missing moves
// them by far more.
constexpr float kLogprobTolerance = 1e-4f;

void expect_same_logprobs(const OutputLogprobs& got, const OutputLogprobs& want) {
  EXPECT_EQ(got.id, want.id);
  EXPECT_NEAR(got.logprob, want.logprob, kLogprobTolerance);
  ASSERT_EQ(got.top.size(), want.top.size());
  for (size_t i = 0; i < got.top.size(); ++i) {
    EXPECT_EQ(got.top[i].id, want.top[i].id);
    EXPECT_NEAR(got.top[i].logprob, want.top[i].logprob, kLogprobTolerance);
  }
}

// A decode node's tokens and their log-probs (the first token's come from
// the prefill node) against one engine's.
void expect_same_decode(const Sequence& got, const Sequence& want) {
  EXPECT_EQ(got.output, want.output);
  ASSERT_EQ(got.output_logprobs.size(), want.output_logprobs.size());
  for (size_t j = 1; j < got.output_logprobs.size(); ++j) {
    SCOPED_TRACE("output token " + std::to_string(j));
    expect_same_logprobs(got.output_logprobs[j], want.output_logprobs[j]);
  }
}

// Runs the decode node to completion: `n` sequences, each decoding what
// `want` did, and every block free afterwards.
void expect_all_decode_as(Engine& decode_node, size_t n, const Sequence& want) {
  auto decoded = decode_node.run_to_completion();
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  ASSERT_EQ(decoded->size(), n);
  for (const auto& seq : *decoded) expect_same_decode(*seq, want);
  const SchedulerStats stats = decode_node.scheduler().stats();
  EXPECT_EQ(stats.free_blocks, stats.total_blocks);
}

// Engine A runs each request whole (the reference). Engine B is the prefill
// node: max_tokens 1, blocks retained. Engine C is the decode node: it
// reserves blocks, receives B's prompt KV, is activated with B's first token
// and generator draws, and decodes the rest. C's tokens must equal A's
// exactly, and its log-probs, which would show any fault in the KV, up to
// rounding. B prefills long prompts in chunks unless prefill_budget says
// otherwise.
void check_handoff(const GenerationOptions& options, uint64_t draws_per_token,
                   const std::vector<std::vector<int32_t>>& prompts,
                   const std::function<std::unique_ptr<Engine>(int32_t, int32_t, int32_t)>& make,
                   int32_t prefill_budget = 16) {
  const int32_t block_size = 8;
  auto a = make(128, block_size, 2048);
  for (const auto& p : prompts) ASSERT_TRUE(a->scheduler().add(p, options).is_ok());
  auto reference = a->run_to_completion();
  ASSERT_TRUE(reference.is_ok()) << reference.status().to_string();
  ASSERT_EQ(reference->size(), prompts.size());

  // Prefill node: by default a small budget, so long prompts are prefilled
  // in chunks.
  auto b = make(96, block_size, prefill_budget);
  GenerationOptions prefill = options;
  prefill.max_tokens = 1;
  prefill.retain_blocks = true;
  for (const auto& p : prompts) ASSERT_TRUE(b->scheduler().add(p, prefill).is_ok());
  auto prefilled = b->run_to_completion();
  ASSERT_TRUE(prefilled.is_ok()) << prefilled.status().to_string();
  ASSERT_EQ(prefilled->size(), prompts.size());
  EXPECT_LT(b->scheduler().stats().free_blocks, b->scheduler().stats().total_blocks)
      << "retained blocks must stay in use";

  // Decode node: a different pool size; a placeholder reservation taken first
  // and aborted after, so C's block ids differ from B's.
  auto c = make(48, block_size, 2048);
  Scheduler& cs = c->scheduler();
  auto placeholder = cs.reserve_remote(std::vector<int32_t>(20, 9), options);
  ASSERT_TRUE(placeholder.is_ok()) << placeholder.status().to_string();
  std::vector<int64_t> ids(prompts.size());
  for (size_t i = prompts.size(); i-- > 0;) {  // reverse order: other block ids again
    auto id = cs.reserve_remote(prompts[i], options);
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    ids[i] = *id;
  }
  ASSERT_TRUE(cs.abort(*placeholder));
  // A control request: reserved and activated like the others but never
  // given its KV. Its log-probs must differ, or the comparison proves nothing.
  auto control = cs.reserve_remote(prompts[0], options);
  ASSERT_TRUE(control.is_ok());
  EXPECT_FALSE(cs.has_work()) << "awaiting sequences need no steps";
  EXPECT_EQ(cs.stats().awaiting, int32_t(prompts.size()) + 1);
  EXPECT_EQ(cs.stats().running, 0);

  for (size_t i = 0; i < prompts.size(); ++i) {
    const Sequence& done = *(*prefilled)[i];
    ASSERT_EQ(done.output.size(), 1u);
    EXPECT_EQ(done.finish_reason, FinishReason::kLength);
    EXPECT_EQ(done.rng.draws(), draws_per_token);
    const Sequence* awaiting = cs.find(ids[i]);
    ASSERT_NE(awaiting, nullptr);
    EXPECT_TRUE(awaiting->awaiting_kv);
    const size_t n = size_t(awaiting->block_table.blocks_needed(int32_t(prompts[i].size())));
    ASSERT_EQ(awaiting->block_table.blocks().size(), n);
    copy_kv(b->kv_pool(), done.block_table.blocks(), c->kv_pool(), awaiting->block_table.blocks(),
            n);
    auto first = cs.activate_remote(ids[i], done.output[0], done.rng.draws());
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    EXPECT_EQ(first->sequence_id, ids[i]);
    EXPECT_EQ(first->token, done.output[0]);
    EXPECT_EQ(first->finish_reason, FinishReason::kNone);
    EXPECT_FALSE(cs.find(ids[i])->awaiting_kv);
  }
  const Sequence& first_prefilled = *(*prefilled)[0];
  ASSERT_TRUE(
      cs.activate_remote(*control, first_prefilled.output[0], first_prefilled.rng.draws()).is_ok());
  EXPECT_EQ(cs.stats().awaiting, 0);
  EXPECT_TRUE(cs.has_work());

  auto decoded = c->run_to_completion();
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  std::map<int64_t, const Sequence*> by_id;
  for (const auto& seq : *decoded) by_id[seq->id] = seq.get();
  for (size_t i = 0; i < prompts.size(); ++i) {
    SCOPED_TRACE("prompt " + std::to_string(i) + " of " + std::to_string(prompts[i].size()) +
                 " tokens");
    const Sequence& want = *(*reference)[i];
    const Sequence& got = *by_id.at(ids[i]);
    EXPECT_EQ(got.output, want.output);
    EXPECT_EQ(got.finish_reason, want.finish_reason);
    EXPECT_EQ(got.rng.draws(), want.rng.draws());
    // The first token's log-probs stay with the prefill node.
    {
      SCOPED_TRACE("first token, on the prefill node");
      expect_same_logprobs((*prefilled)[i]->output_logprobs.at(0), want.output_logprobs.at(0));
    }
    ASSERT_EQ(got.output_logprobs.size(), want.output_logprobs.size());
    EXPECT_EQ(got.output_logprobs[0].id, got.output[0]);
    EXPECT_TRUE(std::isnan(got.output_logprobs[0].logprob));
    for (size_t j = 1; j < got.output_logprobs.size(); ++j) {
      SCOPED_TRACE("output token " + std::to_string(j));
      expect_same_logprobs(got.output_logprobs[j], want.output_logprobs[j]);
    }
  }
  // The control must be told apart: some token or top token differs, or a
  // log-prob is off by well over the rounding tolerance.
  const Sequence& uncopied = *by_id.at(*control);
  const Sequence& control_want = *(*reference)[0];
  ASSERT_EQ(uncopied.output_logprobs.size(), control_want.output_logprobs.size());
  bool told_apart = uncopied.output != control_want.output;
  float largest_difference = 0;
  for (size_t j = 1; j < uncopied.output_logprobs.size(); ++j) {
    const auto& got = uncopied.output_logprobs[j];
    const auto& want = control_want.output_logprobs[j];
    for (size_t k = 0; k < got.top.size(); ++k) {
      told_apart = told_apart || got.top[k].id != want.top[k].id;
      largest_difference =
          std::max(largest_difference, std::abs(got.top[k].logprob - want.top[k].logprob));
    }
  }
  EXPECT_TRUE(told_apart || largest_difference > 10 * kLogprobTolerance)
      << "largest log-prob difference " << largest_difference
      << "decoding without the prompt's KV gave the reference's log-probs";
  EXPECT_EQ(cs.stats().free_blocks, cs.stats().total_blocks);

  // The prefill node frees the blocks once "the transfer" is done.
  for (auto& seq : *prefilled) b->scheduler().release_blocks(*seq);
  EXPECT_EQ(b->scheduler().stats().free_blocks, b->scheduler().stats().total_blocks);
}

TEST_F(RemoteKvTest, GreedyHandoffEqualsOneEngine) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  GenerationOptions o = greedy(10);
  o.logprobs = 3;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(1, 40));
  prompts.push_back(random_prompt(16, 16));  // exactly two blocks: decode needs a new one
  check_handoff(o, 0, prompts, [&](int32_t blocks, int32_t block_size, int32_t budget) {
    return make_engine(blocks, block_size, budget);
  });
}

// With 8-bit KV the blocks carry their rows' scales: the handoff, which
// copies whole blocks, decodes exactly what one engine with the same KV
// format does (a copy without the scales would read NaN or garbage). The
// prefill node runs the prompts in the same step as the reference: in
// chunks, its K rows would differ in their last bits, which can move an
// 8-bit code by a step (about 3e-4 in a log-prob).
TEST_F(RemoteKvTest, QuantizedKvHandoffEqualsOneEngine) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  for (DType kv : {DType::kI8, DType::kFP8E4M3}) {
    SCOPED_TRACE(std::string(dtype_name(kv)));
    kv_dtype_ = kv;
    GenerationOptions o = greedy(10);
    o.logprobs = 3;
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 3; ++i) prompts.push_back(random_prompt(1, 40));
    prompts.push_back(random_prompt(16, 16));
    check_handoff(
        o, 0, prompts,
        [&](int32_t blocks, int32_t block_size, int32_t budget) {
          return make_engine(blocks, block_size, budget);
        },
        2048);
  }
}

// A sampled token depends on every logit, through their order and their
// running sum: a prefill in chunks, whose K rows differ from the reference's
// in their last bits, can move a draw that lands by a boundary to the next
// token, and the outputs part there. So the prefill node runs the prompts in
// one step, as the reference does, and the decode node reads the reference's
// very KV; chunked prefills are the greedy test's.
TEST_F(RemoteKvTest, SeededSamplingHandoffEqualsOneEngine) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  GenerationOptions o;
  o.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f};
  o.seed = seed_;
  o.max_tokens = 10;
  o.ignore_eos = true;
  o.logprobs = 2;
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(1, 40));
  check_handoff(
      o, 1, prompts,
      [&](int32_t blocks, int32_t block_size, int32_t budget) {
        return make_engine(blocks, block_size, budget);
      },
      2048);
}

// The blocks a reservation leaves for the other node to write: those after
// its cached prefix and the blocks its windows let go (as the decode node
// tells the prefill node).
int32_t blocks_to_write(const Sequence& reserved) {
  const int32_t cached = reserved.registered_blocks;
  const int32_t skipped = std::max(0, reserved.block_table.num_released() - cached);
  return int32_t(reserved.block_table.blocks().size()) - cached - skipped;
}

// Reserves `prompt` on the decode node's scheduler `cs` as
// blocks_to_receive, asked first, predicts: the blocks the reservation
// leaves for the prefill node to write (the staging slots it would need).
// The awaiting sequence; null (a failed expectation) if refused.
const Sequence* reserve_as_predicted(Scheduler& cs, const std::vector<int32_t>& prompt,
                                     const GenerationOptions& o) {
  const int32_t predicted = cs.blocks_to_receive(prompt, o);
  auto id = cs.reserve_remote(prompt, o);
  EXPECT_TRUE(id.is_ok()) << id.status().to_string();
  if (!id.is_ok()) return nullptr;
  const Sequence* awaiting = cs.find(*id);
  EXPECT_NE(awaiting, nullptr);
  if (awaiting != nullptr) EXPECT_EQ(predicted, blocks_to_write(*awaiting));
  return awaiting;
}

// A reservation withdrawn to be made again (the decode node waits for
// staging slots) counts its prefix lookup once: withdrawn, the counters
// are as before it; made again, they count it as the first did; and the
// blocks it held are free.
TEST_F(RemoteKvTest, AWithdrawnReservationCountsItsLookupOnce) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::vector<int32_t> earlier, prompt;
  prompts_sharing_four_blocks(earlier, prompt);
  auto c = make_engine(64, 4, 2048);
  Scheduler& cs = c->scheduler();
  ASSERT_TRUE(cs.add(earlier, greedy(1)).is_ok());
  ASSERT_TRUE(c->run_to_completion().is_ok());
  const SchedulerStats before = cs.stats();
  auto first = cs.reserve_remote(prompt, greedy(4));
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  const SchedulerStats reserved = cs.stats();
  EXPECT_EQ(reserved.prefix_query_tokens - before.prefix_query_tokens, int64_t(prompt.size()));
  EXPECT_EQ(reserved.prefix_hit_tokens - before.prefix_hit_tokens, 16);
  EXPECT_TRUE(cs.withdraw_reservation(*first));
  const SchedulerStats withdrawn = cs.stats();
  EXPECT_EQ(withdrawn.prefix_query_tokens, before.prefix_query_tokens);
  EXPECT_EQ(withdrawn.prefix_hit_tokens, before.prefix_hit_tokens);
  EXPECT_EQ(withdrawn.free_blocks, withdrawn.total_blocks);
  EXPECT_FALSE(cs.withdraw_reservation(*first)) << "withdrawn twice";
  auto again = cs.reserve_remote(prompt, greedy(4));
  ASSERT_TRUE(again.is_ok()) << again.status().to_string();
  EXPECT_EQ(cs.stats().prefix_query_tokens, reserved.prefix_query_tokens);
  EXPECT_EQ(cs.stats().prefix_hit_tokens, reserved.prefix_hit_tokens);
  EXPECT_TRUE(cs.abort(*again));
}

// A decode node whose prefix cache holds the start of a prompt shares those
// blocks at reservation: only the blocks after them receive KV, yet it
// decodes what one engine does. Had it not shared them, they would hold
// nothing and the output would differ.
TEST_F(RemoteKvTest, CachedPrefixIsSharedAndOnlyTheRestReceived) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int32_t block_size = 4;
  GenerationOptions o = greedy(8);
  o.logprobs = 3;
  const SharedPrefixCase sp = shared_prefix_case(o);
  ASSERT_NE(sp.want, nullptr);
  const std::vector<int32_t>&earlier = sp.earlier, &prompt = sp.prompt;

  Prefilled prefilled = prefill_node_run(prompt, o, block_size);
  ASSERT_NE(prefilled.done, nullptr);
  const Sequence& done = *prefilled.done;

  // The decode node served the earlier prompt itself: its blocks are cached,
  // in the pool, or (the second time) in the SSD tier, after a long prompt
  // that took every block of a 16-block pool evicted them there. The third
  // time the tier's copy of block 2 is damaged: the tier brings back blocks
  // 0 and 1, and the decode node computes the prompt from block 2 on itself
  // (the prefill node, told 4 blocks were cached, sent only the rest).
  for (const int where : {0, 1, 2}) {
    const bool through_ssd = where > 0, damaged = where == 2;
    SCOPED_TRACE(where == 0 ? "in the pool"
                 : damaged  ? "through a damaged SSD tier"
                            : "through the SSD tier");
    auto c = decode_node_that_served(earlier, block_size, through_ssd);
    Scheduler& cs = c->scheduler();
    if (damaged) damage_stored_block(*cs.ssd_store(), prompt, block_size, 2);
    const SchedulerStats before = cs.stats();
    const int32_t predicted = cs.blocks_to_receive(prompt, o);
    auto id = cs.reserve_remote(prompt, o);
    ASSERT_TRUE(id.is_ok()) << id.status().to_string();
    const SchedulerStats reserved = cs.stats();  // what a report then shows
    const Sequence* awaiting = cs.find(*id);
    ASSERT_NE(awaiting, nullptr);
    const int32_t cached = awaiting->registered_blocks;
    EXPECT_EQ(cached, 4);
    EXPECT_EQ(predicted, blocks_to_write(*awaiting)) << "the staging slots it would need";
    // The tier's blocks are read while the prefill node computes the rest.
    EXPECT_EQ(cs.stats().restoring, through_ssd ? 1 : 0);
    const auto& dst = awaiting->block_table.blocks();
    const auto& src = done.block_table.blocks();
    ASSERT_EQ(int32_t(dst.size()), awaiting->block_table.blocks_needed(int32_t(prompt.size())));
    copy_kv(prefilled.engine->kv_pool(), std::vector<int32_t>(src.begin() + cached, src.end()),
            c->kv_pool(), std::vector<int32_t>(dst.begin() + cached, dst.end()),
            dst.size() - size_t(cached));
    ASSERT_TRUE(cs.activate_remote(*id, done.output[0], done.rng.draws()).is_ok());
    EXPECT_EQ(cs.stats().restoring, 0);
    const int32_t found = damaged ? 2 : cached;
    EXPECT_EQ(cs.stats().prefix_hit_tokens - before.prefix_hit_tokens, int64_t(found) * block_size);
    EXPECT_EQ(cs.stats().prefix_ssd_hit_tokens - before.prefix_ssd_hit_tokens,
              through_ssd ? int64_t(found) * block_size : 0);
    // Counters, never lower than a report showed: the tier's blocks count
    // once they have landed.
    EXPECT_GE(cs.stats().prefix_hit_tokens, reserved.prefix_hit_tokens);
    EXPECT_GE(cs.stats().prefix_ssd_hit_tokens, reserved.prefix_ssd_hit_tokens);
    if (through_ssd) {
      EXPECT_EQ(cs.ssd_store()->stats().dropped_blocks, damaged ? 1 : 0);
    }
    expect_all_decode_as(*c, 1, *sp.want);
  }
  prefilled.engine->scheduler().release_blocks(*prefilled.done);
}

// Two reservations of one prompt whose cached prefix is on SSD, the second
// made while the first's reads are in flight: the second shares the blocks
// being read instead of reading them again, and both decode what one engine
// does. With the tier's copy of block 2 damaged, both compute the prompt
// from block 2 on themselves.
TEST_F(RemoteKvTest, TwoReservationsOfAPrefixOnSsdReadItOnce) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int32_t block_size = 4;
  GenerationOptions o = greedy(6);
  o.logprobs = 2;
  const SharedPrefixCase sp = shared_prefix_case(o);
  ASSERT_NE(sp.want, nullptr);
  const std::vector<int32_t>&earlier = sp.earlier, &prompt = sp.prompt;
  Prefilled prefilled = prefill_node_run(prompt, o, block_size);
  ASSERT_NE(prefilled.done, nullptr);
  const Sequence& done = *prefilled.done;
  const auto& src = done.block_table.blocks();

  for (const bool damaged : {false, true}) {
    SCOPED_TRACE(damaged ? "block 2 damaged" : "intact");
    auto c = decode_node_that_served(earlier, block_size, /*through_ssd=*/true);
    Scheduler& cs = c->scheduler();
    if (damaged) damage_stored_block(*cs.ssd_store(), prompt, block_size, 2);
    const int64_t loaded = cs.ssd_store()->stats().loaded_blocks;
    std::vector<int64_t> ids;
    for (int i = 0; i < 2; ++i) {
      const int32_t predicted = cs.blocks_to_receive(prompt, o);  // the second: a read in flight
      auto id = cs.reserve_remote(prompt, o);
      ASSERT_TRUE(id.is_ok()) << id.status().to_string();
      const Sequence* awaiting = cs.find(*id);
      ASSERT_EQ(awaiting->registered_blocks, 4) << "reservation " << i;
      EXPECT_EQ(predicted, blocks_to_write(*awaiting)) << "reservation " << i;
      const auto& dst = awaiting->block_table.blocks();
      copy_kv(prefilled.engine->kv_pool(), std::vector<int32_t>(src.begin() + 4, src.end()),
              c->kv_pool(), std::vector<int32_t>(dst.begin() + 4, dst.end()), dst.size() - 4);
      ids.push_back(*id);
    }
    EXPECT_EQ(cs.stats().restoring, 2);
    const auto& first_blocks = cs.find(ids[0])->block_table.blocks();
    const auto& second_blocks = cs.find(ids[1])->block_table.blocks();
    EXPECT_TRUE(std::equal(first_blocks.begin(), first_blocks.begin() + 4, second_blocks.begin()))
        << "the second shares the blocks being read";
    for (const int64_t id : ids)
      ASSERT_TRUE(cs.activate_remote(id, done.output[0], done.rng.draws()).is_ok());
    EXPECT_EQ(cs.ssd_store()->stats().loaded_blocks - loaded, damaged ? 2 : 4) << "read once";
    expect_all_decode_as(*c, 2, *sp.want);
  }
  prefilled.engine->scheduler().release_blocks(*prefilled.done);
}

// A reservation that fails for room after joining a restore in flight
// leaves the restore naming it. Its id must not go to a later reservation,
// which the restore's landing would settle as its own: here as having lost
// the prefix from the damaged block on, so that it would compute a prompt
// it does not have from there (a check failure for a short one).
TEST_F(RemoteKvTest, AFailedReservationsIdIsNeverReused) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int32_t block_size = 4;
  std::vector<int32_t> earlier, prompt;
  prompts_sharing_four_blocks(earlier, prompt);
  auto c = decode_node_that_served(earlier, block_size, /*through_ssd=*/true);
  Scheduler& cs = c->scheduler();
  damage_stored_block(*cs.ssd_store(), prompt, block_size, 2);
  auto first = cs.reserve_remote(prompt, greedy(4));
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  ASSERT_EQ(cs.stats().restoring, 1);
  // The same four blocks first, then more than the pool has left.
  std::vector<int32_t> longer = prompt;
  const auto missing = int32_t(63 - prompt.size());
  const std::vector<int32_t> more = random_prompt(missing, missing);
  longer.insert(longer.end(), more.begin(), more.end());
  const auto failed = cs.reserve_remote(longer, greedy(1));
  ASSERT_EQ(failed.status().code(), StatusCode::kResourceExhausted) << failed.status().to_string();
  const std::vector<int32_t> short_prompt = random_prompt(6, 6);
  auto next = cs.reserve_remote(short_prompt, greedy(4));
  ASSERT_TRUE(next.is_ok()) << next.status().to_string();
  // The first one's activation waits for the restore to land.
  ASSERT_TRUE(cs.activate_remote(*first, 5, 0).is_ok());
  const Sequence* later = cs.find(*next);
  ASSERT_NE(later, nullptr);
  EXPECT_EQ(later->ssd_lost_from, -1) << "settled by a restore it never joined";
  EXPECT_EQ(later->ssd_restored_blocks, 0);
  if (HasFailure()) return;
  ASSERT_TRUE(cs.activate_remote(*next, 5, 0).is_ok());
  auto done = c->run_to_completion();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  EXPECT_EQ(done->size(), 2u);
}

// A prefill node whose prefix cache holds the start of a prompt computes
// only the rest, and the blocks it sends (shared cached ones among them)
// hold the whole prompt's KV: the decode node decodes what one engine does.
TEST_F(RemoteKvTest, PrefillNodeSharesItsCachedPrefixAndSendsItAll) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  const int32_t block_size = 4;
  GenerationOptions o = greedy(8);
  o.logprobs = 3;
  const SharedPrefixCase sp = shared_prefix_case(o);
  ASSERT_NE(sp.want, nullptr);
  const std::vector<int32_t>&earlier = sp.earlier, &prompt = sp.prompt;

  auto b = make_engine(128, block_size, 2048);  // the prefill node
  Scheduler& bs = b->scheduler();
  GenerationOptions prefill = o;
  prefill.max_tokens = 1;
  prefill.retain_blocks = true;
  ASSERT_TRUE(bs.add(earlier, prefill).is_ok());
  auto first = b->run_to_completion();
  ASSERT_TRUE(first.is_ok());
  bs.release_blocks(*(*first)[0]);  // "transferred"
  ASSERT_TRUE(bs.add(prompt, prefill).is_ok());
  const int64_t hits_before = bs.stats().prefix_hit_tokens;
  auto prefilled = b->run_to_completion();
  ASSERT_TRUE(prefilled.is_ok()) << prefilled.status().to_string();
  EXPECT_EQ(bs.stats().prefix_hit_tokens - hits_before, 4 * block_size);
  EXPECT_EQ(b->scheduler().last_step().prompt_tokens, int64_t(prompt.size()) - 4 * block_size)
      << "only the uncached tokens are computed";
  const Sequence& done = *(*prefilled)[0];

  auto c = make_engine(64, block_size, 2048);  // the decode node, cold
  Scheduler& cs = c->scheduler();
  auto id = cs.reserve_remote(prompt, o);
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  const Sequence* awaiting = cs.find(*id);
  ASSERT_EQ(awaiting->registered_blocks, 0);
  copy_kv(b->kv_pool(), done.block_table.blocks(), c->kv_pool(), awaiting->block_table.blocks(),
          awaiting->block_table.blocks().size());
  ASSERT_TRUE(cs.activate_remote(*id, done.output[0], done.rng.draws()).is_ok());
  auto decoded = c->run_to_completion();
  ASSERT_TRUE(decoded.is_ok()) << decoded.status().to_string();
  EXPECT_EQ(done.output[0], sp.want->output[0]);
  {
    SCOPED_TRACE("first token, on the prefill node");
    expect_same_logprobs(done.output_logprobs.at(0), sp.want->output_logprobs.at(0));
  }
  expect_same_decode(*(*decoded)[0], *sp.want);
  bs.release_blocks(*(*prefilled)[0]);
  EXPECT_EQ(bs.stats().free_blocks, bs.stats().total_blocks);
}

// A windowed handoff's transfer: every block of the decode node's pool but
// those `awaiting` holds past its `skipped` ones is poisoned with NaNs (a
// kernel that read one would spoil every log-prob after it), then the
// prefill node's blocks past the same point are copied into those.
void send_the_unskipped_blocks(Engine& prefill, const Sequence& done, Engine& decode,
                               const Sequence& awaiting, int32_t skipped) {
  const KvLayout& layout = decode.kv_pool().layout();
  const std::vector<int32_t>& held = awaiting.block_table.blocks();
  for (int32_t block = 0; block < layout.num_blocks; ++block) {
    if (std::find(held.begin() + skipped, held.end(), block) != held.end()) continue;
    for (int32_t layer = 0; layer < layout.num_layers; ++layer)
      std::memset(
          static_cast<char*>(decode.kv_pool().data()) + layout.block_byte_offset(layer, block),
          0xff, layout.block_bytes());
  }
  const std::vector<int32_t> src(done.block_table.blocks().begin() + skipped,
                                 done.block_table.blocks().end());
  const std::vector<int32_t> dst(held.begin() + skipped, held.end());
  copy_kv(prefill.kv_pool(), src, decode.kv_pool(), dst, dst.size());
}

// Sliding windows on every layer: the decode node gives back at once the
// prompt's leading blocks that its first step's window does not reach, and
// only the rest travel. What it decodes is one engine's. The free blocks are
// poisoned with NaNs before the KV lands, so a kernel that read a block
// given back would spoil every log-prob after it. The blocks given back
// never held the prompt's KV: none of them joins the prefix cache. The
// prefill node keeps only what it sends: without prefix caching, a block it
// gives back while computing the prompt in chunks is the next one a later
// chunk writes (lowest id first), so giving back one it sends would spoil
// the decode.
TEST_F(RemoteKvTest, AWindowedPromptTravelsOnlyWhatTheWindowReads) {
  constexpr int32_t kWindow = 11, kBlock = 4;
  const auto windowed = make_windowed_model(kWindow);
  const std::vector<int32_t> prompt = random_prompt(44, 60);  // 11 to 15 blocks
  GenerationOptions o = greedy(20);
  o.ignore_eos = true;
  o.logprobs = 2;
  const std::unique_ptr<Sequence> whole = run_whole(prompt, o, windowed);
  ASSERT_NE(whole, nullptr);

  auto c = make_engine(64, kBlock, 2048, windowed);  // the decode node
  Scheduler& cs = c->scheduler();
  const Sequence* awaiting = reserve_as_predicted(cs, prompt, o);
  ASSERT_NE(awaiting, nullptr);
  const int64_t id = awaiting->id;
  const auto len = int32_t(prompt.size());
  // The first decode step, at position len, reads from len - kWindow + 1.
  const int32_t skipped = (len - kWindow + 1) / kBlock;
  ASSERT_GT(skipped, 0);
  EXPECT_EQ(awaiting->block_table.num_released(), skipped);
  const int32_t needed = awaiting->block_table.blocks_needed(len);
  const int32_t sent = needed - skipped;
  EXPECT_EQ(cs.stats().total_blocks - cs.stats().free_blocks, sent);

  prefix_caching_ = false;
  auto b = make_engine(16, kBlock, 16, windowed);  // the prefill node, in chunks
  prefix_caching_ = true;
  const std::unique_ptr<Sequence> prefilled = prefill_on(*b, prompt, o, skipped);
  ASSERT_NE(prefilled, nullptr);
  const Sequence& done = *prefilled;
  EXPECT_EQ(done.block_table.num_released(), skipped);
  EXPECT_EQ(b->scheduler().stats().total_blocks - b->scheduler().stats().free_blocks, sent)
      << "the prefill node holds what it sends";
  // Chunks of 16 tokens and the 10 positions before each: at most 8 blocks.
  EXPECT_LE(b->scheduler().stats().peak_used_blocks, 8);

  send_the_unskipped_blocks(*b, done, *c, *awaiting, skipped);
  ASSERT_TRUE(cs.activate_remote(id, done.output[0], done.rng.draws(), &done.output_logprobs.at(0))
                  .is_ok());
  expect_all_decode_as(*c, 1, *whole);
  b->scheduler().release_blocks(*prefilled);
  EXPECT_EQ(b->scheduler().stats().free_blocks, b->scheduler().stats().total_blocks);
  // For a decode node that skips none (its prefix on SSD is read into every
  // block), the prefill node keeps every block.
  const std::unique_ptr<Sequence> sends_all = prefill_on(*b, prompt, o, /*retained_from=*/0);
  ASSERT_NE(sends_all, nullptr);
  EXPECT_EQ(sends_all->block_table.num_released(), 0);
  EXPECT_EQ(b->scheduler().stats().total_blocks - b->scheduler().stats().free_blocks, needed);
  b->scheduler().release_blocks(*sends_all);

  // The prompt again: what it finds cached (the blocks its window reads,
  // registered as they landed, where they reach its own window) holds the
  // prompt's KV, never a block given back or skipped before it held any
  // (every block no transfer wrote was poisoned above).
  const Sequence* again = reserve_as_predicted(cs, prompt, o);
  ASSERT_NE(again, nullptr);
  ASSERT_TRUE(send_what_it_lacks(*b, *c, *again, prompt, o));
  expect_all_decode_as(*c, 1, *whole);
}

// A windowed prompt several times longer than either pool: the decode node
// reserves only the blocks its first step's windows reach (never the whole
// prompt's, not for a moment; the others are skipped, holding no block),
// the prefill node computes it in chunks keeping only what it sends, and
// the decode, which runs on far past the pool, is one engine's.
TEST_F(RemoteKvTest, AWindowedPromptLongerThanBothPoolsEqualsOneEngine) {
  constexpr int32_t kWindow = 11, kBlock = 4, kChunk = 16;
  const auto windowed = make_windowed_model(kWindow);
  // The window and a step: (10 + 16 + 3) / 4 + 1 = 8 blocks; two spare.
  constexpr int32_t kPoolBlocks = 10;
  const std::vector<int32_t> prompt = random_prompt(100, 140);  // 25 to 35 blocks
  GenerationOptions o = greedy(60);
  o.ignore_eos = true;
  o.logprobs = 2;
  const std::unique_ptr<Sequence> whole = run_whole(prompt, o, windowed);
  ASSERT_NE(whole, nullptr);

  prefix_caching_ = false;
  auto c = make_engine(kPoolBlocks, kBlock, kChunk, windowed);  // the decode node
  Scheduler& cs = c->scheduler();
  ASSERT_GT(cs.max_model_len(), int32_t(prompt.size()) + o.max_tokens);
  const Sequence* awaiting = reserve_as_predicted(cs, prompt, o);
  ASSERT_NE(awaiting, nullptr);
  const int64_t id = awaiting->id;
  const auto len = int32_t(prompt.size());
  const int32_t skipped = (len - kWindow + 1) / kBlock;
  EXPECT_EQ(awaiting->block_table.num_released(), skipped);
  const int32_t sent = awaiting->block_table.blocks_needed(len) - skipped;
  EXPECT_EQ(cs.stats().total_blocks - cs.stats().free_blocks, sent);
  EXPECT_LE(cs.stats().peak_used_blocks, sent) << "the whole prompt was reserved for a moment";
  for (int32_t j = 0; j < skipped; ++j)
    EXPECT_EQ(awaiting->block_table.blocks()[size_t(j)], BlockTable::kSkippedBlock);

  auto b = make_engine(kPoolBlocks, kBlock, kChunk, windowed);  // the prefill node
  prefix_caching_ = true;
  const std::unique_ptr<Sequence> prefilled = prefill_on(*b, prompt, o, skipped);
  ASSERT_NE(prefilled, nullptr);
  const Sequence& done = *prefilled;
  EXPECT_EQ(done.block_table.num_released(), skipped);
  // The prefill node's chunks of 16 and the 10 positions before each: 8.
  EXPECT_LE(b->scheduler().stats().peak_used_blocks, 8);

  send_the_unskipped_blocks(*b, done, *c, *awaiting, skipped);
  ASSERT_TRUE(cs.activate_remote(id, done.output[0], done.rng.draws(), &done.output_logprobs.at(0))
                  .is_ok());
  expect_all_decode_as(*c, 1, *whole);
  EXPECT_LE(cs.stats().peak_used_blocks, 8) << "decoding holds its window and a step";
  b->scheduler().release_blocks(*prefilled);
}

// A decode node whose pool is nearly all one cached chain (a prompt it
// computed itself) reserves a long windowed prompt that extends it: the
// shared blocks behind the windows go back before the blocks it needs are
// counted, so the reservation does not wait forever for blocks no one else
// will give back.
TEST_F(RemoteKvTest, AWindowedReservationOverACachedChainFillingThePoolGoesOn) {
  constexpr int32_t kWindow = 11, kBlock = 4, kChunk = 16, kPoolBlocks = 10;
  const auto windowed = make_windowed_model(kWindow);
  auto c = make_engine(kPoolBlocks, kBlock, kChunk, windowed);
  Scheduler& cs = c->scheduler();
  std::vector<int32_t> prompt = random_prompt(36, 37);  // 9 blocks, computed here
  ASSERT_TRUE(cs.add(prompt, greedy(1)).is_ok());
  ASSERT_TRUE(c->run_to_completion().is_ok());
  const std::vector<int32_t> more = random_prompt(100, 101);
  prompt.insert(prompt.end(), more.begin(), more.end());
  const auto len = int32_t(prompt.size());
  const int32_t first_kept = (len - kWindow + 1) / kBlock;
  auto id = cs.reserve_remote(prompt, greedy(4));
  ASSERT_TRUE(id.is_ok()) << id.status().to_string();
  const Sequence* awaiting = cs.find(*id);
  EXPECT_EQ(awaiting->block_table.num_released(), first_kept);
  EXPECT_EQ(awaiting->registered_blocks, 9) << "the cached chain was found";
  EXPECT_EQ(cs.stats().total_blocks - cs.stats().free_blocks,
            awaiting->block_table.blocks_needed(len) - first_kept);
  cs.abort(*id);
  EXPECT_EQ(cs.stats().free_blocks, cs.stats().total_blocks);
}

TEST_F(RemoteKvTest, ReserveRemoteAllOrNothingAndAbortFreesBlocks) {
  auto engine = make_engine(/*blocks=*/8, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  // Validation as add().
  EXPECT_EQ(s.reserve_remote({}, greedy(4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.reserve_remote({1, 512}, greedy(4)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.reserve_remote(std::vector<int32_t>(32, 5), greedy(4)).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(s.reserve_remote({1, 2}, greedy(0)).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.stats().free_blocks, 8);

  auto first = s.reserve_remote(std::vector<int32_t>(20, 5), greedy(4));  // 5 blocks
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(s.stats().free_blocks, 3);
  EXPECT_EQ(s.stats().peak_used_blocks, 5);
  auto short_of_blocks = s.reserve_remote(std::vector<int32_t>(17, 5), greedy(4));  // 5 blocks
  EXPECT_EQ(short_of_blocks.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(short_of_blocks.status().message().find("needs 5 blocks; 3 of 8 are free"),
            std::string::npos)
      << short_of_blocks.status().message();
  EXPECT_EQ(s.stats().free_blocks, 3) << "a failed reservation must take nothing";
  EXPECT_EQ(s.stats().awaiting, 1);

  // Awaiting sequences are not work: a step does nothing.
  EXPECT_FALSE(s.has_work());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  EXPECT_EQ(s.last_step().prompt_tokens + s.last_step().generated_tokens, 0);

  // A queued request whose blocks the reservation holds waits: steps do
  // nothing (OK), and run_to_completion says why instead of spinning.
  auto queued = s.add(std::vector<int32_t>(16, 7), greedy(2));  // 4 blocks
  ASSERT_TRUE(queued.is_ok());
  EXPECT_EQ(s.stats().waiting_tokens, 16);
  ASSERT_TRUE(s.step(nullptr).is_ok());
  EXPECT_EQ(s.stats().waiting, 1);
  auto blocked = engine->run_to_completion();
  EXPECT_EQ(blocked.status().code(), StatusCode::kResourceExhausted);

  // A reservation that would fit does not overtake it: first come, first
  // served, so a stream of small ones cannot starve a waiting sequence.
  auto overtaking = s.reserve_remote(std::vector<int32_t>(12, 5), greedy(4));  // 3 blocks
  EXPECT_EQ(overtaking.status().code(), StatusCode::kResourceExhausted)
      << overtaking.status().to_string();
  EXPECT_EQ(s.stats().free_blocks, 3);
  EXPECT_EQ(s.stats().awaiting, 1);
  ASSERT_NE(s.find(*first), nullptr);
  EXPECT_TRUE(s.find(*first)->awaiting_kv);

  // Aborting an awaiting sequence frees its blocks.
  EXPECT_TRUE(s.abort(*first));
  EXPECT_FALSE(s.abort(*first));
  EXPECT_EQ(s.find(*first), nullptr);
  EXPECT_EQ(s.stats().awaiting, 0);
  EXPECT_EQ(s.stats().free_blocks, 8);
  auto aborted = s.take_finished();
  ASSERT_EQ(aborted.size(), 1u);
  for (const auto& seq : aborted) {
    EXPECT_EQ(seq->finish_reason, FinishReason::kAborted);
    EXPECT_TRUE(seq->block_table.blocks().empty());
  }
  EXPECT_EQ(s.activate_remote(*first, 5, 0).status().code(), StatusCode::kNotFound);

  // The queued request can run now.
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  ASSERT_EQ(done->size(), 1u);
  EXPECT_EQ((*done)[0]->output.size(), 2u);
  EXPECT_EQ(s.stats().free_blocks, 8);
}

// Reserved sequences count against max_num_seqs from their reservation
// on: activations never grow the batch past it, and a sequence waiting
// here is admitted only while the running and awaiting ones leave room.
TEST_F(RemoteKvTest, ReservationsCountAgainstMaxNumSeqs) {
  max_num_seqs_ = 2;
  auto engine = make_engine(/*blocks=*/32, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  auto a = s.reserve_remote({1, 2, 3, 4, 5}, greedy(3));
  auto b = s.reserve_remote({6, 7, 8, 9, 10}, greedy(8));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  auto c = s.reserve_remote({11, 12, 13}, greedy(8));
  EXPECT_EQ(c.status().code(), StatusCode::kResourceExhausted) << c.status().to_string();
  // A local one waits while both await their KV, and after they run.
  auto local = s.add({14, 15, 16}, greedy(2));
  ASSERT_TRUE(local.is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  EXPECT_EQ(s.stats().waiting, 1);
  ASSERT_TRUE(s.activate_remote(*a, 5, 0).is_ok());
  ASSERT_TRUE(s.activate_remote(*b, 5, 0).is_ok());
  // Until a finishes (in a step, after that step's admission): the local
  // one waits, and when a's place frees up a reservation does not take it.
  while (s.stats().running == 2) {
    ASSERT_TRUE(s.step(nullptr).is_ok());
    EXPECT_LE(s.stats().running, 2);
  }
  EXPECT_EQ(s.stats().waiting, 1);
  auto overtaking = s.reserve_remote({17, 18, 19}, greedy(8));
  EXPECT_EQ(overtaking.status().code(), StatusCode::kResourceExhausted)
      << "a reservation took the place a waiting sequence was left for";
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  EXPECT_EQ(done->size(), 3u);
}

TEST_F(RemoteKvTest, ActivateErrors) {
  auto engine = make_engine(16, 4, 2048);
  Scheduler& s = engine->scheduler();
  EXPECT_EQ(s.activate_remote(12345, 5, 0).status().code(), StatusCode::kNotFound);
  auto queued = s.add({5, 6, 7}, greedy(3));
  ASSERT_TRUE(queued.is_ok());
  EXPECT_EQ(s.activate_remote(*queued, 5, 0).status().code(), StatusCode::kInvalidArgument);
  auto remote = s.reserve_remote({5, 6, 7}, greedy(3));
  ASSERT_TRUE(remote.is_ok());
  // A token outside the vocabulary leaves the sequence awaiting.
  EXPECT_EQ(s.activate_remote(*remote, 512, 0).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.activate_remote(*remote, -1, 0).status().code(), StatusCode::kInvalidArgument);
  // So does a count of random draws no token takes: skipping 2^64 draws
  // would hold the node forever.
  auto draws = s.activate_remote(*remote, 5, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(draws.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(draws.status().message().find("random draws"), std::string::npos)
      << draws.status().message();
  ASSERT_NE(s.find(*remote), nullptr);
  EXPECT_TRUE(s.find(*remote)->awaiting_kv);
  ASSERT_TRUE(s.activate_remote(*remote, 8, 0).is_ok());
  // Running now: not awaiting any more.
  EXPECT_EQ(s.activate_remote(*remote, 8, 0).status().code(), StatusCode::kInvalidArgument);
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok());
  ASSERT_EQ(done->size(), 2u);
  EXPECT_EQ((*done)[1]->output.size(), 3u);
  EXPECT_EQ((*done)[1]->output[0], 8);
  // Finished: unknown.
  EXPECT_EQ(s.find(*remote), nullptr);
  EXPECT_EQ(s.activate_remote(*remote, 8, 0).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks);
}

// Activation registers the prompt's full blocks at once: a reservation of
// the same prompt right after it shares them (before any decode step), and
// so does one after a request that its first token finished.
TEST_F(RemoteKvTest, ActivatedPromptsAreCachedAtOnce) {
  auto engine = make_engine(/*blocks=*/32, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  for (const int32_t max_tokens : {8, 1}) {
    SCOPED_TRACE("max_tokens " + std::to_string(max_tokens));
    const std::vector<int32_t> prompt = random_prompt(13, 30);
    auto first = s.reserve_remote(prompt, greedy(max_tokens));
    ASSERT_TRUE(first.is_ok()) << first.status().to_string();
    ASSERT_TRUE(s.activate_remote(*first, 40, 0).is_ok());
    auto second = s.reserve_remote(prompt, greedy(max_tokens));
    ASSERT_TRUE(second.is_ok()) << second.status().to_string();
    const Sequence* awaiting = s.find(*second);
    ASSERT_NE(awaiting, nullptr);
    EXPECT_EQ(awaiting->registered_blocks, int32_t(prompt.size() - 1) / 4);
    EXPECT_TRUE(s.abort(*second));
    ASSERT_TRUE(engine->run_to_completion().is_ok());
    s.take_finished();
    EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks);
  }
}

// The first token goes through the same finish rules as a sampled one.
TEST_F(RemoteKvTest, FirstTokenCanFinishTheSequence) {
  auto engine = make_engine(/*blocks=*/8, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  const int32_t eos = engine->model_config().eos_token_ids.at(0);
  auto activate = [&](std::vector<int32_t> prompt, const GenerationOptions& o, int32_t token) {
    auto id = s.reserve_remote(std::move(prompt), o);
    EXPECT_TRUE(id.is_ok()) << id.status().to_string();
    auto out = s.activate_remote(*id, token, 0);
    EXPECT_TRUE(out.is_ok()) << out.status().to_string();
    return out.is_ok() ? out->finish_reason : FinishReason::kAborted;
  };
  auto expect_handed_over = [&](FinishReason reason, std::vector<int32_t> output) {
    auto finished = s.take_finished();
    ASSERT_EQ(finished.size(), 1u);
    EXPECT_EQ(finished[0]->finish_reason, reason);
    EXPECT_EQ(finished[0]->output, output);
    EXPECT_EQ(s.stats().running, 0);
    EXPECT_EQ(s.stats().free_blocks, s.stats().total_blocks);
  };

  GenerationOptions stop = greedy(8);
  stop.stop_token_ids = {77, 78};
  EXPECT_EQ(activate({5, 6, 7}, stop, 78), FinishReason::kStop);
  expect_handed_over(FinishReason::kStop, {78});

  GenerationOptions with_eos = greedy(8);
  with_eos.ignore_eos = false;
  EXPECT_EQ(activate({5, 6, 7}, with_eos, eos), FinishReason::kStop);
  expect_handed_over(FinishReason::kStop, {eos});

  EXPECT_EQ(activate({5, 6, 7}, greedy(1), 40), FinishReason::kLength);
  expect_handed_over(FinishReason::kLength, {40});

  // The pool holds 32 tokens, so max_model_len is 32: a 31-token prompt
  // plus the first token reaches it.
  EXPECT_EQ(activate(std::vector<int32_t>(31, 5), greedy(8), 40), FinishReason::kLength);
  expect_handed_over(FinishReason::kLength, {40});

  // EOS ignored: the sequence runs on.
  GenerationOptions ignoring = greedy(3);
  EXPECT_EQ(activate({5, 6, 7}, ignoring, eos), FinishReason::kNone);
  EXPECT_TRUE(s.take_finished().empty());
  EXPECT_EQ(s.stats().running, 1);
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok());
  ASSERT_EQ(done->size(), 1u);
  EXPECT_EQ((*done)[0]->output.size(), 3u);
  EXPECT_EQ((*done)[0]->output[0], eos);
}

// Running sequences preempt each other under block pressure, but never an
// awaiting one: its block table and the bytes a remote node put there stay
// untouched, and the others still produce what they produce alone.
TEST_F(RemoteKvTest, AwaitingSequencesAreNeverPreempted) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 4; ++i) prompts.push_back(random_prompt(8, 8));
  const GenerationOptions options = greedy(12);  // 20 tokens: 5 blocks of 4 each
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    auto engine = make_engine(64, 4, 2048);
    ASSERT_TRUE(engine->scheduler().add(p, options).is_ok());
    auto done = engine->run_to_completion();
    ASSERT_TRUE(done.is_ok());
    alone.push_back((*done)[0]->output);
  }

  auto engine = make_engine(/*blocks=*/16, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  auto remote = s.reserve_remote(random_prompt(20, 20), options);  // 5 blocks
  ASSERT_TRUE(remote.is_ok());
  const std::vector<int32_t> reserved = s.find(*remote)->block_table.blocks();
  ASSERT_EQ(reserved.size(), 5u);
  // "Received" bytes in every layer of the reserved blocks.
  const KvLayout& layout = engine->kv_pool().layout();
  auto* pool = static_cast<unsigned char*>(engine->kv_pool().data());
  auto pattern = [&](int32_t layer, int32_t block, size_t i) {
    return static_cast<unsigned char>((size_t(layer) * 131 + size_t(block) * 31 + i) % 251);
  };
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (int32_t block : reserved) {
      for (size_t i = 0; i < layout.block_bytes(); ++i) {
        pool[layout.block_byte_offset(layer, block) + i] = pattern(layer, block, i);
      }
    }
  }

  for (const auto& p : prompts) ASSERT_TRUE(s.add(p, options).is_ok());
  std::vector<std::unique_ptr<Sequence>> done;
  int steps = 0;
  while (s.has_work()) {
    ASSERT_LT(++steps, 1000);
    ASSERT_TRUE(s.step(nullptr).is_ok());
    for (auto& seq : s.take_finished()) done.push_back(std::move(seq));
    const Sequence* awaiting = s.find(*remote);
    ASSERT_NE(awaiting, nullptr);
    ASSERT_TRUE(awaiting->awaiting_kv);
    ASSERT_EQ(awaiting->block_table.blocks(), reserved);
    EXPECT_EQ(s.stats().awaiting, 1);
  }
  EXPECT_GT(s.stats().preemptions, 0) << "the pool was meant to be too small";
  ASSERT_EQ(done.size(), prompts.size());
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a->id < b->id; });
  for (size_t i = 0; i < done.size(); ++i) EXPECT_EQ(done[i]->output, alone[i]);
  for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (int32_t block : reserved) {
      for (size_t i = 0; i < layout.block_bytes(); ++i) {
        ASSERT_EQ(pool[layout.block_byte_offset(layer, block) + i], pattern(layer, block, i))
            << "layer " << layer << " block " << block << " byte " << i;
      }
    }
  }
  EXPECT_EQ(s.stats().free_blocks, 16 - 5);
  EXPECT_TRUE(s.abort(*remote));
  EXPECT_EQ(s.stats().free_blocks, 16);
}

// A prefill node's finished sequences keep their blocks until their KV is
// sent. A prompt those blocks leave no room for waits for them (it used to
// fail the step, and the node exited), and runs once they are released.
TEST_F(RemoteKvTest, APromptWaitsForBlocksRetainedForTransfers) {
  auto engine = make_engine(/*blocks=*/8, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  GenerationOptions keep = greedy(1);
  keep.retain_blocks = true;
  ASSERT_TRUE(s.add(random_prompt(20, 20), keep).is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  auto finished = s.take_finished();
  ASSERT_EQ(finished.size(), 1u);
  ASSERT_EQ(finished[0]->block_table.blocks().size(), 5u);  // 20 tokens, kept
  auto waiting = s.add(random_prompt(20, 20), keep);
  ASSERT_TRUE(waiting.is_ok());
  for (int i = 0; i < 3; ++i) {
    Status step = s.step(nullptr);
    ASSERT_TRUE(step.is_ok()) << step.to_string();
    EXPECT_EQ(s.last_step().prompt_tokens, 0);
  }
  s.release_blocks(*finished[0]);
  ASSERT_TRUE(s.step(nullptr).is_ok());
  EXPECT_EQ(s.last_step().prompt_tokens, 20);
  auto second = s.take_finished();
  ASSERT_EQ(second.size(), 1u);
  s.release_blocks(*second[0]);
  EXPECT_EQ(s.stats().free_blocks, 8);
}

TEST_F(RemoteKvTest, RetainedBlocksStayUsedUntilReleased) {
  auto engine = make_engine(/*blocks=*/32, /*block_size=*/4, /*budget=*/2048);
  Scheduler& s = engine->scheduler();
  GenerationOptions keep = greedy(5);
  keep.retain_blocks = true;
  auto kept = s.add(random_prompt(10, 10), keep);
  auto freed = s.add(random_prompt(10, 10), greedy(5));
  auto aborted = s.add(random_prompt(10, 10), keep);
  ASSERT_TRUE(kept.is_ok() && freed.is_ok() && aborted.is_ok());
  ASSERT_TRUE(s.step(nullptr).is_ok());
  // Abort frees blocks even of a retain_blocks sequence.
  EXPECT_TRUE(s.abort(*aborted));
  auto done = engine->run_to_completion();
  ASSERT_TRUE(done.is_ok()) << done.status().to_string();
  ASSERT_EQ(done->size(), 3u);
  Sequence& retained = *(*done)[0];
  EXPECT_EQ(retained.output.size(), 5u);
  // The prompt and all but the last output token were computed: 14 tokens.
  EXPECT_EQ(retained.block_table.blocks().size(), 4u);
  EXPECT_TRUE((*done)[1]->block_table.blocks().empty());
  EXPECT_TRUE((*done)[2]->block_table.blocks().empty());
  EXPECT_EQ(s.stats().free_blocks, 32 - 4);
  EXPECT_FALSE(s.has_work());

  s.release_blocks(retained);
  EXPECT_TRUE(retained.block_table.blocks().empty());
  EXPECT_EQ(s.stats().free_blocks, 32);
  s.release_blocks(retained);  // nothing left: no-op
  EXPECT_EQ(s.stats().free_blocks, 32);
}

TEST_F(RemoteKvTest, WaitingTokensCountUncomputedPromptTokens) {
  auto engine = make_engine(/*blocks=*/32, /*block_size=*/4, /*budget=*/8);
  Scheduler& s = engine->scheduler();
  ASSERT_TRUE(s.add(random_prompt(5, 5), greedy(2)).is_ok());
  ASSERT_TRUE(s.add(random_prompt(7, 7), greedy(2)).is_ok());
  ASSERT_TRUE(s.reserve_remote(random_prompt(9, 9), greedy(2)).is_ok());  // not counted
  EXPECT_EQ(s.stats().waiting, 2);
  EXPECT_EQ(s.stats().waiting_tokens, 12);
  ASSERT_TRUE(s.step(nullptr).is_ok());  // 5 + 3 of 7
  EXPECT_EQ(s.stats().waiting, 0);
  EXPECT_EQ(s.stats().waiting_tokens, 4);
  ASSERT_TRUE(s.step(nullptr).is_ok());  // a decode, then the last 4
  EXPECT_EQ(s.stats().waiting_tokens, 0);
}

// The layer observer, on a 4-layer model whose pool starts out full of a
// sentinel: when layer l is reported, K and V of layer l are stored for every
// token of the step, and layer l + 1 has not written any of them yet.
TEST_F(RemoteKvTest, LayerObserverSeesEachLayerStoredBeforeTheNext) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  auto config = model_preset("tiny");
  ASSERT_TRUE(config.is_ok());
  config->num_layers = 4;
  const auto deep_dir = dir_.path() / "tiny-4-layers";
  MakeModelOptions make;
  make.seed = seed_;
  ASSERT_TRUE(make_random_checkpoint(*config, deep_dir, make).is_ok());
  auto engine = make_engine(/*blocks=*/32, /*block_size=*/4, /*budget=*/7, deep_dir);
  Scheduler& s = engine->scheduler();
  const KvLayout& layout = engine->kv_pool().layout();
  ASSERT_EQ(layout.num_layers, 4);
  ASSERT_EQ(layout.dtype, DType::kF32);
  auto* pool = static_cast<float*>(engine->kv_pool().data());
  constexpr uint32_t kSentinelBits = 0x7f7f7f7fu;  // a finite float no layer produces
  float sentinel;
  std::memcpy(&sentinel, &kSentinelBits, sizeof(sentinel));
  std::fill(pool, pool + layout.total_elements(), sentinel);

  // K and V of one token of one layer, all KV heads.
  auto token_kv = [&](int32_t layer, const Sequence& seq, int32_t pos) {
    const int32_t slot = seq.block_table.slot_of(pos);
    const int32_t block = slot / layout.block_size, offset = slot % layout.block_size;
    std::vector<float> values;
    for (int32_t h = 0; h < layout.num_kv_heads; ++h)
      for (int32_t c = 0; c < layout.head_dim; ++c)
        values.push_back(pool[layout.key_offset(layer, block, h, offset, c)]);
    for (int32_t h = 0; h < layout.num_kv_heads; ++h) {
      const float* v = pool + layout.value_offset(layer, block, h, offset);
      values.insert(values.end(), v, v + layout.head_dim);
    }
    return values;
  };
  auto is_sentinel = [&](const std::vector<float>& values) {
    return std::all_of(values.begin(), values.end(), [&](float v) {
      uint32_t bits;
      std::memcpy(&bits, &v, sizeof(bits));
      return bits == kSentinelBits;
    });
  };

  struct Call {
    int32_t layer;
    std::vector<StepSequenceInfo> step;
  };
  std::vector<Call> calls;
  // (layer, sequence, position) -> K/V seen when the layer was reported.
  std::map<std::tuple<int32_t, int64_t, int32_t>, std::vector<float>> seen;
  s.set_layer_observer([&](int32_t layer, std::span<const StepSequenceInfo> step) {
    calls.push_back({layer, std::vector<StepSequenceInfo>(step.begin(), step.end())});
    for (const auto& info : step) {
      const Sequence* seq = s.find(info.sequence_id);
      ASSERT_NE(seq, nullptr);
      for (int32_t pos = info.start_position; pos < info.start_position + info.num_tokens; ++pos) {
        auto values = token_kv(layer, *seq, pos);
        EXPECT_FALSE(std::any_of(values.begin(), values.end(),
                                 [&](float v) {
                                   uint32_t bits;
                                   std::memcpy(&bits, &v, sizeof(bits));
                                   return bits == kSentinelBits;
                                 }))
            << "layer " << layer << " position " << pos << " not stored yet";
        seen[{layer, info.sequence_id, pos}] = values;
        if (layer + 1 < layout.num_layers) {
          EXPECT_TRUE(is_sentinel(token_kv(layer + 1, *seq, pos)))
              << "layer " << layer + 1 << " position " << pos << " written before layer " << layer
              << " was reported";
        }
      }
    }
  });

  auto a = s.add(random_prompt(10, 10), greedy(3));
  auto b = s.add(random_prompt(6, 6), greedy(3));
  ASSERT_TRUE(a.is_ok() && b.is_ok());
  // Budget 7: what each step computes, per the batching rules.
  using Info = std::vector<std::tuple<int64_t, int32_t, int32_t>>;
  const std::vector<Info> expected = {
      {{*a, 0, 7}},               // a's first chunk fills the budget
      {{*a, 7, 3}, {*b, 0, 4}},   // a's last chunk, b admitted with what is left
      {{*a, 10, 1}, {*b, 4, 2}},  // a decodes first, then b's last chunk
      {{*a, 11, 1}, {*b, 6, 1}},  // both decode; a finishes
      {{*b, 7, 1}},               // b finishes
  };
  std::vector<std::unique_ptr<Sequence>> done;
  for (size_t step = 0; step < expected.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    ASSERT_TRUE(s.has_work());
    calls.clear();
    ASSERT_TRUE(s.step(nullptr).is_ok());
    ASSERT_EQ(calls.size(), size_t(layout.num_layers));
    for (int32_t layer = 0; layer < layout.num_layers; ++layer) {
      const Call& call = calls[size_t(layer)];
      EXPECT_EQ(call.layer, layer);
      Info got;
      for (const auto& info : call.step) {
        got.emplace_back(info.sequence_id, info.start_position, info.num_tokens);
      }
      EXPECT_EQ(got, expected[step]);
    }
    // What each layer reported is what the pool holds after the step.
    for (const auto& [key, values] : seen) {
      const auto& [layer, id, pos] = key;
      const Sequence* seq = s.find(id);
      if (seq == nullptr) continue;  // finished: its blocks are free
      EXPECT_EQ(token_kv(layer, *seq, pos), values) << "layer " << layer << " position " << pos;
    }
    for (auto& seq : s.take_finished()) done.push_back(std::move(seq));
  }
  EXPECT_FALSE(s.has_work());
  EXPECT_EQ(done.size(), 2u);
  EXPECT_EQ(seen.size(), size_t(layout.num_layers) * (12 + 8));

  // A filter that turns a step down: its layers are not reported, and the
  // step runs as without an observer; one that takes it: every layer is.
  int asked = 0;
  s.set_layer_observer(
      [&](int32_t layer, std::span<const StepSequenceInfo> step) {
        calls.push_back({layer, std::vector<StepSequenceInfo>(step.begin(), step.end())});
      },
      [&](std::span<const StepSequenceInfo> step) {
        ++asked;
        EXPECT_FALSE(step.empty());
        return asked % 2 == 0;  // every other step
      });
  calls.clear();
  ASSERT_TRUE(s.add(random_prompt(3, 3), greedy(4)).is_ok());
  for (int step = 1; s.has_work(); ++step) {
    const size_t before = calls.size();
    ASSERT_TRUE(s.step(nullptr).is_ok());
    EXPECT_EQ(calls.size() - before, step % 2 == 0 ? size_t(layout.num_layers) : 0u)
        << "step " << step;
  }
  EXPECT_GE(asked, 4);
  for (auto& seq : s.take_finished()) done.push_back(std::move(seq));

  // Removed: steps run without it.
  s.set_layer_observer({});
  calls.clear();
  ASSERT_TRUE(s.add(random_prompt(3, 3), greedy(2)).is_ok());
  ASSERT_TRUE(engine->run_to_completion().is_ok());
  EXPECT_TRUE(calls.empty());
}

// A decode node whose cached copy of a windowed prompt lost its first
// blocks (a windowed sequence gives them back first, so they are evicted
// first) still counts the prompt's prefix cached as far as its windows'
// blocks are: the prefill node is asked for what comes after it alone, and
// the decode equals one engine's.
TEST_F(RemoteKvTest, AWindowedPrefixWhoseFirstBlocksWereEvictedIsNotSentAgain) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  constexpr int32_t kWindow = 11, kBlock = 4;
  const auto windowed = make_windowed_model(kWindow);
  // The decode node computes 44 tokens itself (blocks 0-10 cached, given
  // back from the first on), then 36 others, which take its 5 blocks never
  // used and evict the 4 given back first.
  auto c = make_engine(16, kBlock, 8, windowed);
  Scheduler& cs = c->scheduler();
  const std::vector<int32_t> earlier = random_prompt(44, 44);
  for (const auto& tokens : {earlier, random_prompt(36, 36)}) {
    ASSERT_TRUE(cs.add(tokens, greedy(1)).is_ok());
    ASSERT_TRUE(c->run_to_completion().is_ok());
  }
  std::vector<int32_t> prompt = earlier;
  const std::vector<int32_t> own = random_prompt(8, 8);
  prompt.insert(prompt.end(), own.begin(), own.end());
  GenerationOptions o = greedy(20);
  o.ignore_eos = true;
  o.logprobs = 2;
  const std::unique_ptr<Sequence> whole = run_whole(prompt, o, windowed);
  ASSERT_NE(whole, nullptr);

  const SchedulerStats before = cs.stats();
  const Sequence* awaiting = reserve_as_predicted(cs, prompt, o);
  ASSERT_NE(awaiting, nullptr);
  const int64_t id = awaiting->id;
  // Blocks 0-10 count as cached; 52 tokens need blocks 0-12; the first
  // decode step (at 52) reads from position 42, block 10, on.
  const int32_t cached = awaiting->registered_blocks;
  EXPECT_EQ(cached, 11);
  EXPECT_EQ(blocks_to_write(*awaiting), 2);
  EXPECT_EQ(cs.stats().prefix_hit_tokens - before.prefix_hit_tokens, 44);
  EXPECT_EQ(cs.stats().total_blocks - cs.stats().free_blocks, 3);

  auto b = make_engine(64, kBlock, 16, windowed);  // the prefill node
  const std::unique_ptr<Sequence> done = prefill_on(*b, prompt, o, cached);
  ASSERT_NE(done, nullptr);
  const auto& src = done->block_table.blocks();
  const auto& dst = awaiting->block_table.blocks();
  ASSERT_EQ(dst.size(), src.size());
  copy_kv(b->kv_pool(), std::vector<int32_t>(src.begin() + cached, src.end()), c->kv_pool(),
          std::vector<int32_t>(dst.begin() + cached, dst.end()), dst.size() - size_t(cached));
  ASSERT_TRUE(
      cs.activate_remote(id, done->output[0], done->rng.draws(), &done->output_logprobs.at(0))
          .is_ok());
  expect_all_decode_as(*c, 1, *whole);
  b->scheduler().release_blocks(*done);
}

// A decode node registers a windowed remote prompt's blocks after the ones
// its windows let it skip, and the blocks its decode fills: a follow-up
// (the prompt, the first answer tokens, a new turn) finds all it needs of
// them, is sent only its own blocks, and decodes as one engine.
TEST_F(RemoteKvTest, AFollowUpOfAWindowedRemotePromptSharesWhatItsWindowReads) {
  SCOPED_TRACE("seed " + std::to_string(seed_));
  constexpr int32_t kWindow = 11, kBlock = 4;
  const auto windowed = make_windowed_model(kWindow);
  auto b = make_engine(64, kBlock, 16, windowed);    // the prefill node
  auto c = make_engine(64, kBlock, 2048, windowed);  // the decode node
  Scheduler& cs = c->scheduler();
  // Reserves `prompt` on the decode node, sends it the blocks it lacks
  // from the prefill node's run, and decodes; the decoded sequence.
  auto serve = [&](const std::vector<int32_t>& prompt, const GenerationOptions& o,
                   int32_t expect_cached) -> std::unique_ptr<Sequence> {
    const Sequence* awaiting = reserve_as_predicted(cs, prompt, o);
    if (awaiting == nullptr) return nullptr;
    EXPECT_EQ(awaiting->registered_blocks, expect_cached);
    if (!send_what_it_lacks(*b, *c, *awaiting, prompt, o)) return nullptr;
    auto decoded = c->run_to_completion();
    EXPECT_TRUE(decoded.is_ok() && decoded->size() == 1);
    if (!decoded.is_ok() || decoded->size() != 1) return nullptr;
    return std::move((*decoded)[0]);
  };
  GenerationOptions o = greedy(6);
  o.ignore_eos = true;
  o.logprobs = 2;
  // 48 tokens: the first decode step reads from position 38, block 9, on;
  // blocks 0-8 are skipped, 9-11 sent.
  const std::vector<int32_t> prompt = random_prompt(48, 48);
  const std::unique_ptr<Sequence> first = serve(prompt, o, 0);
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->output, run_whole(prompt, o, windowed)->output);

  // The follow-up: blocks 0-12 are its prompt's and the first answer's
  // first 4 tokens (block 12, filled by the decode); its next query, at 52,
  // reads blocks 10-12.
  std::vector<int32_t> follow_up = prompt;
  follow_up.insert(follow_up.end(), first->output.begin(), first->output.begin() + 4);
  const std::vector<int32_t> turn = random_prompt(8, 8);
  follow_up.insert(follow_up.end(), turn.begin(), turn.end());
  const SchedulerStats before = cs.stats();
  const std::unique_ptr<Sequence> second = serve(follow_up, o, 13);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(cs.stats().prefix_hit_tokens - before.prefix_hit_tokens, 52);
  const std::unique_ptr<Sequence> whole = run_whole(follow_up, o, windowed);
  ASSERT_NE(whole, nullptr);
  expect_same_decode(*second, *whole);
  EXPECT_EQ(cs.stats().free_blocks, cs.stats().total_blocks);
}

}  // namespace
}  // namespace baton::engine
