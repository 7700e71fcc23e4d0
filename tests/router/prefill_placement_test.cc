#include "router/prefill_placement.h"

#include <gtest/gtest.h>

#include <optional>
#include <random>

namespace baton::router {
namespace {

using P = PrefillPlacement;

struct Case {
  const char* what;
  PrefillPlacementRule rule;
  int64_t prompt_tokens;
  std::optional<int64_t> least_prefill_queue;
  int64_t decode_queue;
  P expected;
};

TEST(PrefillPlacement, FollowsTheRule) {
  const PrefillPlacementRule always{32, 0}, limited{32, 256};
  const Case cases[] = {
      {"short prompt", always, 31, 0, 0, P::kShortPrompt},
      {"short prompt, no prefill node", always, 31, std::nullopt, 0, P::kShortPrompt},
      {"at the minimum", always, 32, 0, 0, P::kPrefillNode},
      {"no prefill node up", always, 1000, std::nullopt, 0, P::kNoPrefillNode},
      {"no limit, deep queue", always, 1000, int64_t(1) << 30, 0, P::kPrefillNode},
      {"under the limit", limited, 1000, 255, 0, P::kPrefillNode},
      {"at the limit", limited, 1000, 256, 0, P::kPrefillQueuesFull},
      {"at the limit, decode node has some", limited, 1000, 256, 255, P::kPrefillQueuesFull},
      {"both at the limit", limited, 1000, 256, 256, P::kPrefillNode},
      {"both past the limit", limited, 1000, 5000, 300, P::kPrefillNode},
      {"short beats the limit", limited, 8, 5000, 0, P::kShortPrompt},
      {"everything remote", {0, 0}, 0, 0, 0, P::kPrefillNode},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(place_prefill(c.rule, c.prompt_tokens, c.least_prefill_queue, c.decode_queue),
              c.expected)
        << c.what;
  }
}

// Over random queues, against the rule as its header states it.
TEST(PrefillPlacement, RandomQueuesAgreeWithTheStatedRule) {
  std::mt19937_64 rng{std::random_device{}()};
  for (int i = 0; i < 10000; ++i) {
    const PrefillPlacementRule rule{int32_t(rng() % 64), int64_t(rng() % 3 == 0 ? 0 : rng() % 512)};
    const int64_t prompt = int64_t(rng() % 128);
    const std::optional<int64_t> prefill_queue =
        rng() % 8 == 0 ? std::nullopt : std::optional<int64_t>(int64_t(rng() % 1024));
    const int64_t decode_queue = int64_t(rng() % 1024);
    P expected = P::kPrefillNode;
    if (prompt < rule.min_remote_prefill_tokens) {
      expected = P::kShortPrompt;
    } else if (!prefill_queue) {
      expected = P::kNoPrefillNode;
    } else if (rule.max_prefill_queue_tokens > 0 &&
               *prefill_queue >= rule.max_prefill_queue_tokens &&
               decode_queue < rule.max_prefill_queue_tokens) {
      expected = P::kPrefillQueuesFull;
    }
    ASSERT_EQ(place_prefill(rule, prompt, prefill_queue, decode_queue), expected)
        << "prompt " << prompt << ", prefill queue " << prefill_queue.value_or(-1)
        << ", decode queue " << decode_queue << ", limit " << rule.max_prefill_queue_tokens;
  }
}

TEST(PrefillPlacement, EveryPlacementHasItsOwnName) {
  for (P a : kAllPrefillPlacements) {
    EXPECT_NE(placement_name(a), "unknown");
    for (P b : kAllPrefillPlacements) {
      if (a != b) EXPECT_NE(placement_name(a), placement_name(b));
    }
  }
}

}  // namespace
}  // namespace baton::router
