// Sampling: greedy ties, cut-offs, determinism, empirical distribution, logprobs.
#include "kernels/cpu/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <concepts>
#include <numeric>
#include <random>
#include <set>

#include "tests/kernels/reference.h"
#include "tests/kernels/test_util.h"

namespace baton::kernels::cpu {
namespace {

using testing::fresh_seed;
using testing::random_floats;

int32_t naive_argmax(const std::vector<float>& l) {
  int32_t best = 0;
  for (int32_t i = 1; i < int32_t(l.size()); ++i)
    if (l[size_t(i)] > l[size_t(best)]) best = i;
  return best;
}

TEST(SamplingTest, GreedyPicksArgmaxLowestIdOnTies) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 data(seed);
  SamplerRng rng(1);
  SamplingParams greedy{0.0f, 0, 1.0f};
  std::vector<float> l = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f};
  EXPECT_EQ(sample_token(l.data(), 5, greedy, rng), 1);
  std::vector<float> flat(100, 0.25f);
  EXPECT_EQ(sample_token(flat.data(), 100, greedy, rng), 0);
  for (int trial = 0; trial < 20; ++trial) {
    auto x = random_floats(data, 1000, -10.0f, 10.0f);
    EXPECT_EQ(sample_token(x.data(), 1000, greedy, rng), naive_argmax(x));
  }
}

TEST(SamplingTest, TopKOneAndTinyTopPAreGreedy) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 data(seed);
  SamplerRng rng(seed);
  for (int trial = 0; trial < 50; ++trial) {
    auto x = random_floats(data, 500, -3.0f, 3.0f);
    const int32_t want = naive_argmax(x);
    EXPECT_EQ(sample_token(x.data(), 500, SamplingParams{1.5f, 1, 1.0f}, rng), want);
    EXPECT_EQ(sample_token(x.data(), 500, SamplingParams{1.5f, 0, 1e-6f}, rng), want);
    EXPECT_EQ(sample_token(x.data(), 500, SamplingParams{0.7f, 50, 1e-6f}, rng), want);
  }
}

static_assert(std::uniform_random_bit_generator<SamplerRng>);

// SamplerRng is std::mt19937_64 plus a draw count; recreated from the seed and
// advanced by the count, it continues the same stream (how a decode node takes
// over a request's sampling from the prefill node).
TEST(SamplingTest, SamplerRngCountsDrawsAndResumesFromTheSeed) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 reference(seed);
  SamplerRng rng(seed);
  EXPECT_EQ(rng.draws(), 0u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(rng(), reference());
  EXPECT_EQ(rng.draws(), 1000u);

  std::mt19937_64 data(seed);
  auto x = random_floats(data, 300, -2.0f, 2.0f);
  const SamplingParams params{0.9f, 0, 0.95f};
  SamplerRng whole(seed);
  std::vector<int32_t> expected;
  for (int i = 0; i < 50; ++i) expected.push_back(sample_token(x.data(), 300, params, whole));
  EXPECT_EQ(whole.draws(), 50u);  // one uniform draw per sampled token

  SamplerRng first_node(seed);
  std::vector<int32_t> split;
  for (int i = 0; i < 7; ++i) split.push_back(sample_token(x.data(), 300, params, first_node));
  SamplerRng second_node(seed);
  second_node.discard(first_node.draws());
  EXPECT_EQ(second_node.draws(), 7u);
  for (int i = 7; i < 50; ++i) split.push_back(sample_token(x.data(), 300, params, second_node));
  EXPECT_EQ(split, expected);
  EXPECT_EQ(second_node.draws(), whole.draws());
}

TEST(SamplingTest, SameSeedSameSequence) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 data(seed);
  auto x = random_floats(data, 300, -2.0f, 2.0f);
  for (SamplingParams params : {SamplingParams{1.0f, 0, 1.0f}, SamplingParams{0.8f, 40, 0.9f},
                                SamplingParams{1.3f, 0, 0.5f}}) {
    SamplerRng a(seed), b(seed);
    std::vector<int32_t> sa, sb;
    for (int i = 0; i < 200; ++i) {
      sa.push_back(sample_token(x.data(), 300, params, a));
      sb.push_back(sample_token(x.data(), 300, params, b));
    }
    EXPECT_EQ(sa, sb);
    EXPECT_GT(std::set<int32_t>(sa.begin(), sa.end()).size(), 1u);  // it does sample
  }
}

// Expected probabilities of each token after temperature, top-k and top-p,
// computed independently in double.
std::vector<double> expected_probs(const std::vector<float>& logits, SamplingParams p) {
  const int32_t n = int32_t(logits.size());
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[size_t(a)] > logits[size_t(b)]; });
  int32_t kept = (p.top_k > 0 && p.top_k < n) ? p.top_k : n;
  std::vector<double> w(static_cast<size_t>(n), 0.0);
  double total = 0.0;
  for (int32_t j = 0; j < kept; ++j) {
    w[size_t(order[size_t(j)])] =
        std::exp(double(logits[size_t(order[size_t(j)])]) / p.temperature);
    total += w[size_t(order[size_t(j)])];
  }
  if (p.min_p > 0.0f) {  // relative to the likeliest token, before top_p (vLLM's order)
    const double floor = double(p.min_p) * w[size_t(order[0])];
    for (int32_t j = 0; j < kept; ++j) {
      if (w[size_t(order[size_t(j)])] < floor) w[size_t(order[size_t(j)])] = 0.0;
    }
    total = 0.0;
    for (double v : w) total += v;
  }
  if (p.top_p < 1.0f) {
    double mass = 0.0;
    int32_t j = 0;
    while (j < kept) {
      mass += w[size_t(order[size_t(j++)])] / total;
      if (mass >= p.top_p) break;
    }
    for (int32_t r = j; r < kept; ++r) w[size_t(order[size_t(r)])] = 0.0;
    total = 0.0;
    for (double v : w) total += v;
  }
  for (double& v : w) v /= total;
  return w;
}

TEST(SamplingTest, EmpiricalFrequenciesMatchProbabilities) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 data(seed);
  const std::vector<float> logits = random_floats(data, 20, -2.0f, 2.0f);
  for (SamplingParams params :
       {SamplingParams{1.0f, 0, 1.0f}, SamplingParams{0.6f, 0, 1.0f}, SamplingParams{1.5f, 8, 1.0f},
        SamplingParams{1.0f, 0, 0.7f}, SamplingParams{0.9f, 10, 0.8f},
        SamplingParams{1.0f, 0, 1.0f, 0.2f}, SamplingParams{0.8f, 12, 0.9f, 0.05f}}) {
    SCOPED_TRACE("t=" + std::to_string(params.temperature) + " k=" + std::to_string(params.top_k) +
                 " p=" + std::to_string(params.top_p) + " min_p=" + std::to_string(params.min_p));
    const auto probs = expected_probs(logits, params);
    SamplerRng rng(data());
    const int draws = 100000;
    std::vector<int> counts(logits.size(), 0);
    for (int i = 0; i < draws; ++i) counts[size_t(sample_token(logits.data(), 20, params, rng))]++;
    double chi2 = 0.0;
    int dof = -1;
    for (size_t i = 0; i < probs.size(); ++i) {
      if (probs[i] == 0.0) {
        EXPECT_EQ(counts[i], 0) << "token " << i << " was cut and must never be drawn";
        continue;
      }
      const double e = probs[i] * draws;
      chi2 += (counts[i] - e) * (counts[i] - e) / e;
      ++dof;
    }
    // Far above the 99.9th percentile of chi-square with <= 19 degrees of
    // freedom (43.8), yet a wrong temperature or cut is in the thousands.
    EXPECT_LT(chi2, 60.0) << "dof " << dof;
  }
}

// adjust_logits against a naive double-precision rendering of vLLM's rules,
// over random logits, prompts and outputs (tokens repeated, some out of the
// vocabulary), every adjustment alone and together.
TEST(AdjustLogitsTest, MatchesNaiveRules) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  const int32_t vocab = 97;
  for (int round = 0; round < 200; ++round) {
    const std::vector<float> logits = random_floats(rng, size_t(vocab), -6.0f, 6.0f);
    std::vector<int32_t> prompt(rng() % 30), output(rng() % 30);
    for (auto& t : prompt) t = int32_t(rng() % (vocab + 5)) - 2;
    for (auto& t : output) t = int32_t(rng() % 40);  // repeats likely
    LogitsAdjustments adj;
    std::vector<int32_t> banned;
    const int which = int(rng() % 5);
    if (which == 0 || which == 4) adj.repetition_penalty = 0.5f + float(rng() % 150) / 100.0f;
    if (which == 1 || which == 4) adj.frequency_penalty = float(int(rng() % 400) - 200) / 100.0f;
    if (which == 2 || which == 4) adj.presence_penalty = float(int(rng() % 400) - 200) / 100.0f;
    if (which == 3 || which == 4) {
      for (int b = 0; b < 5; ++b) {
        adj.logit_bias.emplace_back(int32_t(rng() % vocab), float(int(rng() % 200) - 100));
      }
      banned = {int32_t(rng() % vocab), int32_t(rng() % vocab)};
    }
    std::vector<double> want(logits.begin(), logits.end());
    for (int32_t t = 0; t < vocab; ++t) {
      const bool in_prompt = std::count(prompt.begin(), prompt.end(), t) > 0;
      const auto count = std::count(output.begin(), output.end(), t);
      double& l = want[size_t(t)];
      if (in_prompt || count > 0) {
        l = l > 0 ? l / adj.repetition_penalty : l * adj.repetition_penalty;
      }
      l -= double(adj.frequency_penalty) * double(count) +
           (count > 0 ? double(adj.presence_penalty) : 0.0);
      for (const auto& [id, bias] : adj.logit_bias) {
        if (id == t) l += bias;
      }
      if (std::count(banned.begin(), banned.end(), t) > 0) {
        l = -std::numeric_limits<double>::infinity();
      }
    }
    std::vector<float> got = logits;
    adjust_logits(got.data(), vocab, adj, banned, prompt, output);
    for (int32_t t = 0; t < vocab; ++t) {
      if (std::isinf(want[size_t(t)])) {
        EXPECT_TRUE(std::isinf(got[size_t(t)]) && got[size_t(t)] < 0) << t;
      } else {
        EXPECT_NEAR(got[size_t(t)], want[size_t(t)], 1e-4 * (1 + std::fabs(want[size_t(t)])))
            << "round " << round << " token " << t;
      }
    }
  }
}

// Log-probabilities of `x` against double log-softmax: the ids asked for
// and the top five, in order.
void expect_logprobs_match(const std::vector<float>& x) {
  const auto ref = reference::log_softmax(x.data(), int64_t(x.size()));
  const auto tolerance = [&](int32_t id) {
    return 1e-6 * std::max(1.0, std::abs(ref[size_t(id)]));
  };
  for (int32_t id : {0, 7, 100, int32_t(x.size()) - 1})
    EXPECT_NEAR(token_logprob(x.data(), int32_t(x.size()), id), ref[size_t(id)], tolerance(id))
        << "token " << id;
  const auto top = top_logprobs(x.data(), int32_t(x.size()), 5);
  ASSERT_EQ(top.size(), 5u);
  std::vector<int32_t> order(x.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
  for (size_t i = 0; i < 5; ++i) {
    EXPECT_EQ(top[i].id, order[i]);
    EXPECT_NEAR(top[i].logprob, ref[size_t(order[i])], tolerance(order[i]));
  }
}

TEST(LogprobTest, MatchesDoubleLogSoftmax) {
  const uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed=" + std::to_string(seed));
  std::mt19937_64 data(seed);
  // Spread so that the normaliser is the sum of thousands of terms: its log
  // is about log(49152 / 20) = 7.8 above the largest logit.
  auto x = random_floats(data, 49152, -10.0f, 10.0f);
  {
    SCOPED_TRACE("random logits");
    expect_logprobs_match(x);
  }
  // Large logits must not overflow, and several of them share the mass:
  // a normaliser taken from the largest alone is off by log(1 + e^-0.5 + e^-2).
  x[7] = 300.0f;
  x[100] = 299.5f;
  x[4242] = 298.0f;
  {
    SCOPED_TRACE("three logits near 300");
    expect_logprobs_match(x);
  }
  // Ties keep the lower id first.
  std::vector<float> tied = {1.0f, 2.0f, 2.0f, 0.0f};
  const auto want = reference::log_softmax(tied.data(), 4);
  const auto t = top_logprobs(tied.data(), 4, 10);
  ASSERT_EQ(t.size(), 4u);
  const int32_t order[] = {1, 2, 0, 3};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(t[i].id, order[i]);
    EXPECT_NEAR(t[i].logprob, want[size_t(order[i])], 1e-6);
  }
}

}  // namespace
}  // namespace baton::kernels::cpu
