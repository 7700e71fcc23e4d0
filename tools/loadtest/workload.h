// tools/loadtest/workload.h — the requests a `baton bench` run sends: seeded
// random and shared-prefix token-id prompts, or ShareGPT conversations, and
// the JSON bodies that carry them to the router.
//
// Random and prefix prompts are token-id lists (`"prompt": [ids]`) of the
// drawn length, ids drawn uniformly from [kFirstPlainTokenId, vocab_size):
// the byte tokenizer of Baton's made models reserves ids 0-2 for pad, bos and
// eos and maps 3..258 to bytes, so the default vocabulary of 259 suits every
// Baton model. The chat endpoint takes text only, so there a random prompt is
// lowercase letters, one per requested token (one byte is one token for the
// byte tokenizer; the chat template adds a few).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/tokenizer.h"
#include "tools/loadtest/sharegpt.h"

namespace baton::loadtest {

inline constexpr int32_t kFirstPlainTokenId = engine::ByteTokenizer::kByteOffset;
inline constexpr int32_t kDefaultVocabSize = engine::ByteTokenizer::kMinVocab;

struct BenchRequest {
  std::vector<int32_t> prompt_ids{};  // a token-id prompt, or
  std::string prompt_text{};          // a text prompt (ShareGPT; random prompts for chat)
  int64_t prompt_len = 0;             // exact for id prompts, bytes for text
  int64_t output_len = 0;             // max_tokens (with ignore_eos: the output length)
};

// Lengths are uniform integers in [len · (1 - range_ratio), len · (1 + range_ratio)]
// (at least 1), as `vllm bench serve --random-range-ratio` draws them.
// With `prefix_len`, every prompt starts with the same `prefix_len` random
// tokens, then its own ranged ones (`vllm bench serve --random-prefix-len`).
struct RandomWorkload {
  int64_t input_len = 1024;
  int64_t output_len = 128;
  double range_ratio = 0.0;  // in [0, 1)
  int64_t prefix_len = 0;
};

// `num_prefixes` groups of requests; each prompt is its group's shared prefix
// followed by its own random suffix. Groups are shuffled together.
struct PrefixWorkload {
  int64_t prefix_len = 256;
  int64_t suffix_len = 256;
  int64_t output_len = 128;
  int64_t num_prefixes = 10;
};

struct WorkloadOptions {
  int32_t vocab_size = kDefaultVocabSize;  // ids < vocab_size
  bool text_prompts = false;               // the chat endpoint: prompts as text
  uint64_t seed = 0;
};

Result<std::vector<BenchRequest>> random_requests(int64_t num_requests,
                                                  const RandomWorkload& workload,
                                                  const WorkloadOptions& options);
Result<std::vector<BenchRequest>> prefix_requests(int64_t num_requests,
                                                  const PrefixWorkload& workload,
                                                  const WorkloadOptions& options);
// `num_requests` conversations in a seeded shuffled order (reused from the
// start when the file holds fewer). Output length: `output_len` when > 0,
// else the reply's length in bytes (tokens of the byte tokenizer).
Result<std::vector<BenchRequest>> sharegpt_requests(int64_t num_requests,
                                                    const std::vector<Conversation>& conversations,
                                                    int64_t output_len, uint64_t seed);

// `--shard i/N`: this host sends requests i, i + N, i + 2N, ... of the one
// seeded list, at their times in the whole schedule.
struct Shard {
  int64_t index = 0;
  int64_t count = 1;
};
Result<Shard> parse_shard(const std::string& text);
std::vector<size_t> shard_indices(size_t num_requests, const Shard& shard);

enum class Endpoint { kCompletions, kChatCompletions };
Result<Endpoint> parse_endpoint(const std::string& path);
const char* endpoint_path(Endpoint endpoint);

struct SamplingOptions {
  double temperature = 0.0;
  bool ignore_eos = true;
};

// The streamed request body, asking for usage in the stream.
nlohmann::json request_body(const BenchRequest& request, Endpoint endpoint,
                            const std::string& model, const SamplingOptions& sampling);

}  // namespace baton::loadtest
