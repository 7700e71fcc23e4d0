#include "tools/loadtest/workload.h"

#include <cmath>
#include <numeric>
#include <random>

namespace baton::loadtest {
namespace {

// Uniform integer in [lo, hi] from raw bits, so every platform draws the same
// list (std::uniform_int_distribution is implementation-defined).
int64_t uniform_int(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  return lo + int64_t(rng() % uint64_t(hi - lo + 1));
}

template <typename T>
void shuffle(std::vector<T>& items, std::mt19937_64& rng) {
  for (size_t i = items.size(); i > 1; --i) std::swap(items[i - 1], items[rng() % i]);
}

Status check_vocab(const WorkloadOptions& options) {
  if (options.vocab_size <= kFirstPlainTokenId) {
    return invalid_argument("--vocab-size must be above " + std::to_string(kFirstPlainTokenId) +
                            ", got " + std::to_string(options.vocab_size));
  }
  return Status::ok();
}

Status check_positive(int64_t value, const char* flag) {
  if (value < 1) return invalid_argument(std::string(flag) + " must be at least 1");
  return Status::ok();
}

// The bench holds every prompt, and its request's JSON, in memory before
// the first is sent: a prompt longer than any model's context, or a run of
// more tokens than that memory should hold, is a mistyped flag.
constexpr double kMaxPromptTokens = double(1 << 24);
constexpr double kMaxRunTokens = double(1 << 28);

Status check_run_size(int64_t num_requests, double longest_prompt, double shared_tokens,
                      const char* length_flags) {
  if (longest_prompt > kMaxPromptTokens) {
    return invalid_argument(std::string(length_flags) + " make prompts of up to " +
                            std::to_string(int64_t(longest_prompt)) + " tokens, over the " +
                            std::to_string(int64_t(kMaxPromptTokens)) + " a prompt may have");
  }
  const double total = double(num_requests) * longest_prompt + shared_tokens;
  if (total > kMaxRunTokens) {
    return invalid_argument("--num-prompts " + std::to_string(num_requests) + " of up to " +
                            std::to_string(int64_t(longest_prompt)) + " tokens make " +
                            std::to_string(int64_t(total)) + " prompt tokens, over the " +
                            std::to_string(int64_t(kMaxRunTokens)) + " a run holds in memory");
  }
  return Status::ok();
}

// Appends `length` random tokens: ids, or letters for a text prompt.
void append_random(BenchRequest& request, int64_t length, const WorkloadOptions& options,
                   std::mt19937_64& rng) {
  for (int64_t i = 0; i < length; ++i) {
    if (options.text_prompts) {
      request.prompt_text += char('a' + uniform_int(rng, 0, 25));
    } else {
      request.prompt_ids.push_back(
          int32_t(uniform_int(rng, kFirstPlainTokenId, options.vocab_size - 1)));
    }
  }
  request.prompt_len += length;
}

int64_t ranged_length(std::mt19937_64& rng, int64_t length, double ratio) {
  const auto lo = int64_t(std::floor(double(length) * (1.0 - ratio)));
  const auto hi = int64_t(std::floor(double(length) * (1.0 + ratio)));
  return std::max<int64_t>(1, uniform_int(rng, std::max<int64_t>(lo, 1), std::max<int64_t>(hi, 1)));
}

}  // namespace

Result<std::vector<BenchRequest>> random_requests(int64_t num_requests,
                                                  const RandomWorkload& workload,
                                                  const WorkloadOptions& options) {
  BATON_RETURN_IF_ERROR(check_vocab(options));
  BATON_RETURN_IF_ERROR(check_positive(workload.input_len, "--random-input-len"));
  BATON_RETURN_IF_ERROR(check_positive(workload.output_len, "--random-output-len"));
  if (!(workload.range_ratio >= 0.0 && workload.range_ratio < 1.0))
    return invalid_argument("--random-range-ratio must be in [0, 1)");
  if (workload.prefix_len < 0) return invalid_argument("--random-prefix-len must be at least 0");
  BATON_RETURN_IF_ERROR(
      check_run_size(num_requests,
                     double(workload.prefix_len) +
                         std::floor(double(workload.input_len) * (1.0 + workload.range_ratio)),
                     0, "--random-input-len and --random-prefix-len"));
  std::mt19937_64 rng(options.seed);
  // Drawn first, and only when asked for, so lists without a prefix stay
  // what a seed always gave.
  BenchRequest prefix;
  append_random(prefix, workload.prefix_len, options, rng);
  std::vector<BenchRequest> requests(size_t(std::max<int64_t>(num_requests, 0)), prefix);
  for (auto& request : requests) {
    append_random(request, ranged_length(rng, workload.input_len, workload.range_ratio), options,
                  rng);
    request.output_len = ranged_length(rng, workload.output_len, workload.range_ratio);
  }
  return requests;
}

Result<std::vector<BenchRequest>> prefix_requests(int64_t num_requests,
                                                  const PrefixWorkload& workload,
                                                  const WorkloadOptions& options) {
  BATON_RETURN_IF_ERROR(check_vocab(options));
  BATON_RETURN_IF_ERROR(check_positive(workload.prefix_len, "--prefix-len"));
  BATON_RETURN_IF_ERROR(check_positive(workload.output_len, "--prefix-output-len"));
  BATON_RETURN_IF_ERROR(check_positive(workload.num_prefixes, "--prefix-num-prefixes"));
  if (workload.suffix_len < 0) return invalid_argument("--prefix-suffix-len must be at least 0");
  BATON_RETURN_IF_ERROR(check_run_size(num_requests,
                                       double(workload.prefix_len) + double(workload.suffix_len),
                                       double(workload.num_prefixes) * double(workload.prefix_len),
                                       "--prefix-len and --prefix-suffix-len"));
  std::mt19937_64 rng(options.seed);
  std::vector<BenchRequest> prefixes(size_t(workload.num_prefixes));
  for (auto& prefix : prefixes) append_random(prefix, workload.prefix_len, options, rng);
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < num_requests; ++i) {
    BenchRequest request = prefixes[size_t(i % workload.num_prefixes)];
    append_random(request, workload.suffix_len, options, rng);
    request.output_len = workload.output_len;
    requests.push_back(std::move(request));
  }
  shuffle(requests, rng);
  return requests;
}

Result<std::vector<BenchRequest>> sharegpt_requests(int64_t num_requests,
                                                    const std::vector<Conversation>& conversations,
                                                    int64_t output_len, uint64_t seed) {
  if (conversations.empty()) return invalid_argument("the dataset holds no conversations");
  std::vector<size_t> order(conversations.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::mt19937_64 rng(seed);
  shuffle(order, rng);
  std::vector<BenchRequest> requests;
  for (int64_t i = 0; i < num_requests; ++i) {
    const Conversation& conversation = conversations[order[size_t(i) % order.size()]];
    BenchRequest request;
    request.prompt_text = conversation.prompt;
    request.prompt_len = int64_t(conversation.prompt.size());
    request.output_len =
        output_len > 0 ? output_len : std::max<int64_t>(1, int64_t(conversation.reply.size()));
    requests.push_back(std::move(request));
  }
  return requests;
}

Result<Shard> parse_shard(const std::string& text) {
  const size_t slash = text.find('/');
  Shard shard;
  try {
    size_t used_index = 0, used_count = 0;
    if (slash == std::string::npos) throw std::invalid_argument("no slash");
    shard.index = std::stoll(text.substr(0, slash), &used_index);
    shard.count = std::stoll(text.substr(slash + 1), &used_count);
    if (used_index != slash || used_count != text.size() - slash - 1)
      throw std::invalid_argument("trailing characters");
  } catch (const std::exception&) {
    return invalid_argument("--shard must be i/N (e.g. 0/2), got '" + text + "'");
  }
  if (shard.count < 1 || shard.index < 0 || shard.index >= shard.count)
    return invalid_argument("--shard i/N needs 0 <= i < N, got '" + text + "'");
  return shard;
}

std::vector<size_t> shard_indices(size_t num_requests, const Shard& shard) {
  std::vector<size_t> indices;
  for (size_t i = size_t(shard.index); i < num_requests; i += size_t(shard.count))
    indices.push_back(i);
  return indices;
}

Result<Endpoint> parse_endpoint(const std::string& path) {
  if (path == endpoint_path(Endpoint::kCompletions)) return Endpoint::kCompletions;
  if (path == endpoint_path(Endpoint::kChatCompletions)) return Endpoint::kChatCompletions;
  return invalid_argument("--endpoint must be /v1/completions or /v1/chat/completions, got '" +
                          path + "'");
}

const char* endpoint_path(Endpoint endpoint) {
  return endpoint == Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
}

nlohmann::json request_body(const BenchRequest& request, Endpoint endpoint,
                            const std::string& model, const SamplingOptions& sampling) {
  nlohmann::json body = {{"model", model},
                         {"max_tokens", request.output_len},
                         {"temperature", sampling.temperature},
                         {"ignore_eos", sampling.ignore_eos},
                         {"stream", true},
                         {"stream_options", {{"include_usage", true}}}};
  if (endpoint == Endpoint::kChatCompletions) {
    body["messages"] = {{{"role", "user"}, {"content", request.prompt_text}}};
  } else if (request.prompt_ids.empty()) {
    body["prompt"] = request.prompt_text;
  } else {
    body["prompt"] = request.prompt_ids;
  }
  return body;
}

}  // namespace baton::loadtest
