#include "router/node_output_check.h"

#include <algorithm>

namespace baton::router {
namespace {

// Each entry holds at most `alternatives` (id, value) pairs, paired.
Status check_entries(const std::vector<control::TokenLogprobs>& logprobs, int32_t alternatives,
                     const char* what) {
  for (const control::TokenLogprobs& entry : logprobs) {
    if (entry.top_ids.size() != entry.top_logprobs.size()) {
      return internal_error(std::string(what) + ": " + std::to_string(entry.top_ids.size()) +
                            " alternatives with " + std::to_string(entry.top_logprobs.size()) +
                            " values");
    }
    if (entry.top_ids.size() > size_t(std::max(alternatives, 0))) {
      return internal_error(std::string(what) + ": " + std::to_string(entry.top_ids.size()) +
                            " alternatives where " + std::to_string(std::max(alternatives, 0)) +
                            " were asked for");
    }
  }
  return Status::ok();
}

}  // namespace

Status check_output_logprobs(const control::SamplingSpec& asked,
                             const std::vector<control::TokenLogprobs>& logprobs, size_t tokens) {
  if (logprobs.empty()) return Status::ok();
  if (asked.logprobs <= 0) return internal_error("log-probabilities the request did not ask for");
  if (logprobs.size() > tokens) {
    return internal_error("log-probabilities of " + std::to_string(logprobs.size()) +
                          " tokens with " + std::to_string(tokens) + " tokens");
  }
  return check_entries(logprobs, asked.logprobs, "log-probabilities");
}

Status check_prompt_logprobs(const control::SamplingSpec& asked,
                             const std::vector<control::TokenLogprobs>& logprobs,
                             size_t prompt_tokens) {
  if (logprobs.empty()) return Status::ok();
  if (asked.prompt_logprobs < 0)
    return internal_error("prompt log-probabilities the request did not ask for");
  if (logprobs.size() >= std::max<size_t>(prompt_tokens, 1)) {
    return internal_error("log-probabilities of " + std::to_string(logprobs.size()) +
                          " prompt tokens after the first of " + std::to_string(prompt_tokens));
  }
  return check_entries(logprobs, asked.prompt_logprobs, "prompt log-probabilities");
}

Status check_node_logprobs(const std::string& from, const control::SamplingSpec& asked,
                           size_t prompt_tokens,
                           const std::vector<control::TokenLogprobs>& prompt_logprobs,
                           const std::vector<control::TokenLogprobs>& logprobs, size_t tokens) {
  Status within = check_prompt_logprobs(asked, prompt_logprobs, prompt_tokens);
  if (within.is_ok()) within = check_output_logprobs(asked, logprobs, tokens);
  if (within.is_ok()) return within;
  return internal_error("node " + from + " sent " + within.message());
}

}  // namespace baton::router
