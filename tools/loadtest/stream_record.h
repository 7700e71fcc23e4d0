// tools/loadtest/stream_record.h — turns one streamed response into a
// RequestRecord: its chunks' arrival times, the usage chunk's token counts,
// the router's `served_by`, and any error.
//
// Timing, from the client side:
//   TTFT  the first chunk that carries a choice (Baton sends it when the first
//         token is generated, even if its text is held back, e.g. half of a
//         UTF-8 character)
//   E2EL  the last chunk that carries a choice
//   ITL   the gaps between chunks, split over the tokens each chunk carries
// Token counts come from the usage chunk (the request asks for it); without
// one, each chunk counts as one token. The router sends one chunk per update
// from the decode node — normally one token — but it holds back text that
// could still become a stop string or an incomplete UTF-8 character, and the
// chunk that releases it carries several tokens. A client cannot see how many,
// so `spread_itl` estimates it: every chunk after the first carries at least
// one token, and the tokens left over are credited to chunks in proportion to
// their text beyond one byte (one byte is one token for the byte tokenizer).
// A gap split over n tokens counts as n gaps of gap / n. `vllm bench serve`
// instead records one gap per chunk; the two agree when each chunk is a token.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "tools/loadtest/serving_stats.h"

namespace baton::loadtest {

using Clock = std::chrono::steady_clock;

// Inter-token gaps for `output_tokens` tokens that arrived in chunks at
// `chunk_times` (seconds, nondecreasing); `chunk_bytes[i]` is the text length
// of chunk i. The first chunk holds the first token. Empty when fewer than two
// chunks or tokens.
std::vector<double> spread_itl(const std::vector<double>& chunk_times,
                               const std::vector<size_t>& chunk_bytes, int64_t output_tokens);

// Splits an SSE byte stream into the payloads of its `data:` events.
class SseSplitter {
 public:
  void feed(std::string_view bytes, const std::function<void(std::string_view)>& on_payload);

 private:
  std::string pending_;
};

class StreamRecorder {
 public:
  // `sent` is when the request left; `prompt_len` the client's own count,
  // used only when the response carries no usage.
  StreamRecorder(Clock::time_point sent, int64_t prompt_len);

  // One event's payload (a JSON chunk, or "[DONE]") that arrived at `at`.
  void on_event(std::string_view payload, Clock::time_point at);
  void fail(std::string error);
  bool done() const { return done_ || !error_.empty(); }

  // The request's record; a failure if the stream ended without [DONE],
  // without any token, or with an error.
  RequestRecord finish() const;

 private:
  Clock::time_point sent_;
  int64_t prompt_len_;
  std::vector<double> chunk_times_;  // seconds since sent_
  std::vector<size_t> chunk_bytes_;
  int64_t usage_prompt_tokens_ = -1, usage_completion_tokens_ = -1;
  std::string prefill_node_, decode_node_;
  std::string error_;
  bool done_ = false;
};

}  // namespace baton::loadtest
