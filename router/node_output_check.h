// router/node_output_check.h — what a node sends for a request is held to
// what the request asked of it: log-probabilities only where asked, with no
// more alternatives than asked. A node that sends more is broken or
// hostile, and the router would otherwise keep all of it (up to the
// decoder's 1024 alternatives a token) until the reply is built.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/control_messages.h"
#include "common/status.h"

namespace baton::router {

// Output log-probabilities of `tokens` new tokens, under `asked`.
Status check_output_logprobs(const control::SamplingSpec& asked,
                             const std::vector<control::TokenLogprobs>& logprobs, size_t tokens);
// A prompt's log-probabilities (one per token after the first), under `asked`.
Status check_prompt_logprobs(const control::SamplingSpec& asked,
                             const std::vector<control::TokenLogprobs>& logprobs,
                             size_t prompt_tokens);
// Both, for a message from node `from` (its error names the node).
Status check_node_logprobs(const std::string& from, const control::SamplingSpec& asked,
                           size_t prompt_tokens,
                           const std::vector<control::TokenLogprobs>& prompt_logprobs,
                           const std::vector<control::TokenLogprobs>& logprobs, size_t tokens);

}  // namespace baton::router
