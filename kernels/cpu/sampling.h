// kernels/cpu/sampling.h — turning logits into a token.
//
// Reproducible: the same logits, parameters and seed give the same token on
// every machine (no hash-order or thread-order dependence).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace baton::kernels::cpu {

struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy (argmax; ties go to the lowest id)
  int32_t top_k = 0;         // 0 or negative: no top-k cut
  float top_p = 1.0f;        // 1: no nucleus cut
};

// The per-request random state; seed it from the request's seed.
using SamplerRng = std::mt19937_64;

// Samples one token id from logits [vocab]. Applies temperature, then top-k,
// then top-p over the remaining tokens sorted by probability.
int32_t sample_token(const float* logits, int32_t vocab, const SamplingParams& params,
                     SamplerRng& rng);

struct TokenLogprob {
  int32_t id;
  float logprob;
};

// log_softmax(logits)[id], computed stably.
float token_logprob(const float* logits, int32_t vocab, int32_t id);

// The n most likely tokens with their log-probabilities, most likely first
// (ties: lower id first).
std::vector<TokenLogprob> top_logprobs(const float* logits, int32_t vocab, int32_t n);

}  // namespace baton::kernels::cpu
