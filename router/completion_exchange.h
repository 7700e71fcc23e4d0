// router/completion_exchange.h — one client request's journey through the core.
//
// A completion request becomes one generation per choice (prompts x n). The
// exchange submits them to the RouterCore, turns their token updates into text
// (incrementally, router/incremental_text.h, holding back an incomplete UTF-8
// sequence and a possible stop-string prefix while streaming), applies stop
// strings (the text ends before the match, the generation is cancelled), and
// answers the client: one JSON body, or SSE chunks, a usage chunk when asked,
// and `data: [DONE]`. An error before anything was sent is an HTTP error;
// after the stream started it is an SSE error event, then [DONE]. If the
// client goes away, every generation still running is cancelled (the nodes
// free their blocks). Updates arrive on the core thread, the disconnect on an
// io thread: one mutex orders them. A whole JSON reply is built on a request
// worker, once the exchange is done and nothing changes its choices again.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer.h"
#include "router/http_server.h"
#include "router/metrics.h"
#include "router/openai_response.h"
#include "router/request_workers.h"
#include "router/router_core.h"
#include "router/stop_strings.h"

namespace baton::router {

struct ExchangeSpec {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;     // "cmpl-..." / "chatcmpl-..."
  std::string model;  // served model name
  int64_t created = 0;
  bool stream = false;
  bool include_usage = false;
  std::vector<std::string> stop;
  int64_t prompt_tokens = 0;  // each prompt counted once, whatever n is
  // Choices returned per prompt, of best_of generated (the generations of
  // prompt p are [p best_of, (p + 1) best_of)): the n of highest cumulative
  // log-probability, in that order.
  int32_t n = 1;
  int32_t best_of = 1;
  bool logprobs = false;       // the client asked for them
  int32_t top_logprobs = 0;    // alternatives shown per token (the nodes may send more)
  bool tokens_as_ids = false;  // log-probs name tokens "token_id:ID" (not their text)
  // echo: each prompt's text, put before its choices' (empty: no echo).
  std::vector<std::string> echoes;
  // When the front end handed the request on: TTFT and end-to-end latency
  // count the wait for a request worker and the tokenising.
  std::chrono::steady_clock::time_point arrival = std::chrono::steady_clock::now();
};

class CompletionExchange : public std::enable_shared_from_this<CompletionExchange> {
 public:
  CompletionExchange(ExchangeSpec spec, std::shared_ptr<HttpResponder> responder, RouterCore& core,
                     const engine::Tokenizer* tokenizer, RouterMetrics& metrics,
                     RequestWorkers& workers);

  // Submits one generation per choice, in choice order; answers the client
  // with 503/429 (and cancels what was submitted) if the core refuses one.
  void start(std::vector<GenerationRequest> choices);

 private:
  struct ChoiceState {
    uint64_t request_id = 0;
    bool submitted = false;
    std::vector<int32_t> tokens;
    std::vector<int32_t> lead;  // the prompt's last tokens, read before the output
    // echo with logprobs: the prompt, and its tokens' log-probabilities
    // after the first (they come with the first token).
    std::vector<int32_t> prompt;
    std::vector<control::TokenLogprobs> prompt_logprobs;
    std::vector<control::TokenLogprobs> logprobs;  // one per token, when asked for
    std::string text;          // text of tokens[0, decoded), cut at a stop string once one matched
    size_t decoded = 0;        // tokens turned into `text`
    size_t logprobs_sent = 0;  // streaming: tokens whose log-probabilities are out
    size_t logprobs_text_offset = 0;             // completions' text_offset after those tokens
    size_t emitted = 0;                          // bytes of text already streamed
    std::optional<StopStrings::Scan> stop_scan;  // where `text` stands against spec_.stop
    // A streamed echo with log-probabilities: the prompt's part of the first
    // chunk's, built on a worker (null once sent).
    std::optional<nlohmann::json> prompt_part;
    bool building_prompt_part = false;
    bool finished = false;
    FinishReason finish_reason = FinishReason::kNone;
    std::chrono::steady_clock::time_point first_token;
    std::chrono::steady_clock::time_point last_token;
    double prefill_seconds = -1;  // on the node that computed the prompt; -1: unknown
    int64_t prompt_tokens = 0;
    int64_t cached_tokens = 0;  // of prompt_tokens, those the computing node's cache held
    int64_t max_tokens = 0;     // what the choice asked for: a node never sends more
    int64_t min_tokens = 0;     // stop strings count only in the text of tokens past these
    // Bytes of text before the update that took the output past min_tokens
    // (vLLM's boundary too): a stop string must end past them. -1: not yet
    // known.
    int64_t stops_from = -1;
    // Tokens whose log-probabilities have arrived (those come with the token).
    size_t scored() const { return std::min(tokens.size(), logprobs.size()); }
    bool got_token = false;
    bool sent_chunk = false;
    std::string decode_node;   // who served it, reported as `served_by`
    std::string prefill_node;  // streaming: the first chunk (chat: with the role) is out
  };

  void on_update(size_t choice, const GenerationUpdate& update);
  // on_update with the mutex held; true when the choice's prompt part is to
  // be built (build_prompt_part, on a worker).
  bool take_update(size_t index, const GenerationUpdate& update);
  void build_prompt_part(size_t index);
  // Streams what `visible` allows and counts the choice's end once it ended.
  void emit(size_t index, ChoiceState& choice, size_t visible);
  void on_client_gone();
  // Detokenises, applies stop strings; returns the bytes that may be shown now.
  size_t update_text(ChoiceState& choice);
  void stream_delta(size_t index, ChoiceState& choice, size_t visible);
  void finish_exchange();
  // The non-streamed reply, built and sent on a worker once done_ is set
  // (after which no update, disconnect or failure touches the choices).
  void send_reply(const Usage& usage);
  // With echo: the text of generation `index`'s prompt; else empty.
  std::string_view echo_of(size_t index) const;
  // The choices to return, in order: every one, or with best_of above n
  // each prompt's n of highest cumulative log-probability.
  std::vector<size_t> returned_choices() const;
  void fail(const Status& error);  // with the mutex held
  void cancel_running();           // with the mutex held
  std::string detokenize(const std::vector<int32_t>& tokens) const;
  // One token's text as valid UTF-8 (a lone byte of a multi-byte character
  // becomes U+FFFD, as the JSON output would make it), so equal keys of a
  // top_logprobs map compare equal here.
  std::string token_text(int32_t id) const;
  // How log-probs name token `id`, whose token_text is `text`: that text, or
  // "token_id:ID" where the request asked (return_tokens_as_token_ids).
  std::string token_name(int32_t id, const std::string& text) const;
  // How many of a token's alternatives the reply shows: what was asked
  // for (the nodes send at least one).
  size_t alternatives_shown(const control::TokenLogprobs& scored) const;
  // Completions' top_logprobs entry of token `id`: alternative text ->
  // log-probability, the token itself among them (as OpenAI and vLLM: up to
  // top_logprobs + 1 entries).
  nlohmann::json top_map(int32_t id, const control::TokenLogprobs& scored) const;
  // The choice's `logprobs` object in the endpoint's shape.
  // Tokens [begin, end) of the choice; `text_offset` is where token `begin`'s
  // text starts and comes back advanced past `end`'s (completions shape).
  nlohmann::json logprobs_json(const ChoiceState& choice, size_t begin, size_t end,
                               size_t& text_offset) const;
  // echo with logprobs (completions): the prompt's tokens in the logprobs
  // shape, the first with no log-probability (null), as OpenAI returns them.
  nlohmann::json prompt_part(const std::vector<int32_t>& prompt,
                             const std::vector<control::TokenLogprobs>& scored) const;
  // `logprobs` with `part` (prompt_part) put first.
  static nlohmann::json with_prompt_part(nlohmann::json part, nlohmann::json logprobs);

  ExchangeSpec spec_;
  std::shared_ptr<HttpResponder> responder_;
  RouterCore& core_;
  const engine::Tokenizer* tokenizer_;
  RouterMetrics& metrics_;
  RequestWorkers& workers_;
  std::chrono::steady_clock::time_point arrival_;
  StopStrings stops_;  // spec_.stop

  std::mutex mutex_;
  std::vector<ChoiceState> choices_;
  bool stream_started_ = false;
  bool done_ = false;  // the client has its answer (or is gone)
  size_t finished_count_ = 0;
};

// Bytes of `text` that form complete UTF-8 sequences (an incomplete sequence
// at the end is held back until its last byte arrives).
size_t complete_utf8_prefix(std::string_view text);

}  // namespace baton::router
