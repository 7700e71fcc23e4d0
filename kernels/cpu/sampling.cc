#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace baton::kernels::cpu {
namespace {

// Orders token ids by logit, highest first, ties to the lower id. NaN logits
// sort last so they can never be chosen ahead of a real number.
struct ByLogitDesc {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    float la = logits[a], lb = logits[b];
    bool na = std::isnan(la), nb = std::isnan(lb);
    if (na != nb) return nb;
    if (!na && la != lb) return la > lb;
    return a < b;
  }
};

int32_t argmax(const float* logits, int32_t vocab) {
  int32_t best = 0;
  for (int32_t i = 1; i < vocab; ++i)
    if (ByLogitDesc{logits}(i, best)) best = i;
  return best;
}

// A uniform double in [0, 1) from the top 53 bits of one draw: defined by us,
// not by the standard library, so every platform draws the same numbers.
double uniform01(SamplerRng& rng) { return double(rng() >> 11) * 0x1.0p-53; }

double log_sum_exp(const float* logits, int32_t vocab, float max_logit) {
  double sum = 0.0;
  for (int32_t i = 0; i < vocab; ++i) sum += std::exp(double(logits[i]) - double(max_logit));
  return double(max_logit) + std::log(sum);
}

}  // namespace

int32_t sample_token(const float* logits, int32_t vocab, const SamplingParams& params,
                     SamplerRng& rng) {
  if (vocab <= 0) return 0;
  if (params.temperature <= 0.0f || params.top_k == 1) return argmax(logits, vocab);

  // Candidates in the order their probabilities are accumulated. With no cut
  // at all, id order suffices; any cut needs them sorted by probability.
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) ids[size_t(i)] = i;
  size_t kept = size_t(vocab);
  const bool top_k_cut = params.top_k > 0 && params.top_k < vocab;
  const bool top_p_cut = params.top_p < 1.0f;
  const bool min_p_cut = params.min_p > 0.0f;
  if (top_k_cut) {
    kept = size_t(params.top_k);
    std::partial_sort(ids.begin(), ids.begin() + std::ptrdiff_t(kept), ids.end(),
                      ByLogitDesc{logits});
  } else if (top_p_cut || min_p_cut) {
    std::sort(ids.begin(), ids.end(), ByLogitDesc{logits});
  }

  const double inv_t = 1.0 / double(params.temperature);
  double max_scaled = -std::numeric_limits<double>::infinity();
  for (size_t j = 0; j < kept; ++j) {
    double l = double(logits[ids[j]]);
    if (!std::isnan(l)) max_scaled = std::max(max_scaled, l * inv_t);
  }
  if (!std::isfinite(max_scaled)) return argmax(logits, vocab);
  std::vector<double> weights(kept);
  double total = 0.0;
  for (size_t j = 0; j < kept; ++j) {
    double l = double(logits[ids[j]]);
    double wgt = std::isnan(l) ? 0.0 : std::exp(l * inv_t - max_scaled);
    weights[j] = wgt;
    total += wgt;
  }
  // min_p before top_p, as vLLM cuts (after top-k, which keeps the
  // likeliest token, so the order of those two does not matter).
  if (min_p_cut) {
    // Sorted, so the likeliest token (weight exp(0) = 1 at most) is first:
    // keep the prefix at least min_p of its probability.
    const double floor = double(params.min_p) * weights[0];
    size_t n = 1;
    while (n < kept && weights[n] >= floor) ++n;
    kept = n;
    total = 0.0;
    for (size_t j = 0; j < kept; ++j) total += weights[j];
  }
  if (top_p_cut) {
    // Smallest prefix (by probability, descending) whose mass reaches top_p.
    const double threshold = double(params.top_p) * total;
    double mass = 0.0;
    size_t n = 0;
    while (n < kept) {
      mass += weights[n++];
      if (mass >= threshold) break;
    }
    kept = std::max<size_t>(n, 1);
    total = 0.0;
    for (size_t j = 0; j < kept; ++j) total += weights[j];
  }

  const double target = uniform01(rng) * total;
  double cumulative = 0.0;
  size_t last_positive = 0;
  for (size_t j = 0; j < kept; ++j) {
    if (weights[j] <= 0.0) continue;
    last_positive = j;
    cumulative += weights[j];
    if (target < cumulative) return ids[j];
  }
  return ids[last_positive];  // rounding left target at the very top
}

void adjust_logits(float* logits, int32_t vocab, const LogitsAdjustments& adj,
                   const std::vector<int32_t>& banned, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& output) {
  if (adj.repetition_penalty != 1.0f) {
    std::vector<bool> seen(size_t(vocab), false);
    for (const auto* tokens : {&prompt, &output}) {
      for (int32_t t : *tokens) {
        if (t < 0 || t >= vocab || seen[size_t(t)]) continue;
        seen[size_t(t)] = true;
        float& l = logits[t];
        l = l > 0 ? l / adj.repetition_penalty : l * adj.repetition_penalty;
      }
    }
  }
  if (adj.frequency_penalty != 0.0f || adj.presence_penalty != 0.0f) {
    std::vector<int32_t> counts(size_t(vocab), 0);
    for (int32_t t : output) {
      if (t >= 0 && t < vocab) ++counts[size_t(t)];
    }
    for (int32_t t = 0; t < vocab; ++t) {
      const int32_t n = counts[size_t(t)];
      if (n > 0) logits[t] -= adj.frequency_penalty * float(n) + adj.presence_penalty;
    }
  }
  for (const auto& [id, bias] : adj.logit_bias) {
    if (id >= 0 && id < vocab) logits[id] += bias;
  }
  for (int32_t id : banned) {
    if (id >= 0 && id < vocab) logits[id] = -std::numeric_limits<float>::infinity();
  }
}

float token_logprob(const float* logits, int32_t vocab, int32_t id) {
  float max_logit = logits[argmax(logits, vocab)];
  return float(double(logits[id]) - log_sum_exp(logits, vocab, max_logit));
}

std::vector<TokenLogprob> top_logprobs(const float* logits, int32_t vocab, int32_t n) {
  n = std::clamp(n, 0, std::max(vocab, 0));
  std::vector<TokenLogprob> result;
  if (n == 0) return result;
  std::vector<int32_t> ids(static_cast<size_t>(vocab));
  for (int32_t i = 0; i < vocab; ++i) ids[size_t(i)] = i;
  std::partial_sort(ids.begin(), ids.begin() + n, ids.end(), ByLogitDesc{logits});
  const double lse = log_sum_exp(logits, vocab, logits[ids[0]]);
  result.reserve(size_t(n));
  for (int32_t j = 0; j < n; ++j)
    result.push_back({ids[size_t(j)], float(double(logits[ids[size_t(j)]]) - lse)});
  return result;
}

}  // namespace baton::kernels::cpu
