// kernels/cpu/sampling.h — turning logits into a token.
//
// Reproducible: the same logits, parameters and seed give the same token on
// every machine (no hash-order or thread-order dependence).
#pragma once

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

namespace baton::kernels::cpu {

struct SamplingParams {
  float temperature = 1.0f;  // 0 means greedy (argmax; ties go to the lowest id)
  int32_t top_k = 0;         // 0 or negative: no top-k cut
  float top_p = 1.0f;        // 1: no nucleus cut
  // Tokens whose probability (after temperature) is below min_p times the
  // likeliest token's are cut; 0: no cut.
  float min_p = 0.0f;
};

// What changes the logits before sampling, as vLLM applies it: the
// repetition penalty over prompt and output tokens (a positive logit divided
// by it, a negative one multiplied), then frequency and presence penalties
// over output tokens (subtracting frequency x count + presence), then the
// logit bias, then -inf for the banned tokens (while fewer than min_tokens
// are out, the end-of-sequence and stop tokens).
struct LogitsAdjustments {
  float repetition_penalty = 1.0f;
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;
  bool any() const {
    return repetition_penalty != 1.0f || frequency_penalty != 0.0f || presence_penalty != 0.0f ||
           !logit_bias.empty();
  }
};

// Applies `adj` and `banned` to logits [vocab] in place; `prompt` and
// `output` are the sequence's tokens so far (ids outside the vocabulary are
// ignored).
void adjust_logits(float* logits, int32_t vocab, const LogitsAdjustments& adj,
                   const std::vector<int32_t>& banned, const std::vector<int32_t>& prompt,
                   const std::vector<int32_t>& output);

// The per-request random state; seed it from the request's seed. A
// std::mt19937_64 that counts its draws, so another node can recreate it from
// the seed and skip the draws already made (`discard(draws())`): seeded
// sampling split across a prefill and a decode node equals sampling on one.
class SamplerRng {
 public:
  using result_type = std::mt19937_64::result_type;

  explicit SamplerRng(uint64_t seed) : engine_(seed) {}

  static constexpr result_type min() { return std::mt19937_64::min(); }
  static constexpr result_type max() { return std::mt19937_64::max(); }
  result_type operator()() {
    ++draws_;
    return engine_();
  }
  // Draws made since seeding, those skipped by discard() included.
  uint64_t draws() const { return draws_; }
  // Skips n draws, as if they had been made.
  void discard(uint64_t n) {
    engine_.discard(n);
    draws_ += n;
  }

 private:
  std::mt19937_64 engine_;
  uint64_t draws_ = 0;
};

// Samples one token id from logits [vocab]. Applies temperature, then top-k,
// min_p and top-p (vLLM's order) over the tokens sorted by probability.
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
