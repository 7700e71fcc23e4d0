#include "tools/loadtest/stream_record.h"

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <numeric>

namespace baton::loadtest {
namespace {

using json = nlohmann::json;

// Splits `total` into integers proportional to `weights` (largest remainder,
// ties to the earlier index). The weights are positive.
std::vector<int64_t> apportion(int64_t total, const std::vector<double>& weights) {
  const double sum = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<int64_t> counts(weights.size());
  std::vector<std::pair<double, size_t>> remainders;
  int64_t given = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    const double exact = double(total) * weights[i] / sum;
    counts[i] = int64_t(std::floor(exact));
    given += counts[i];
    remainders.push_back({exact - double(counts[i]), i});
  }
  std::stable_sort(remainders.begin(), remainders.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t k = 0; given < total; ++k, ++given)
    ++counts[remainders[k % remainders.size()].second];
  return counts;
}

// The text a streamed choice adds: `text` (completions) or `delta.content` (chat).
size_t chunk_text_bytes(const json& choice) {
  auto text = choice.find("text");
  if (text != choice.end() && text->is_string()) return text->get_ref<const std::string&>().size();
  auto delta = choice.find("delta");
  if (delta == choice.end() || !delta->is_object()) return 0;
  auto content = delta->find("content");
  if (content != delta->end() && content->is_string())
    return content->get_ref<const std::string&>().size();
  return 0;
}

// `object[key]` if it is a string (an int64 for the other), else `fallback`:
// a reply from a server that is not Baton must not throw.
std::string string_or(const json& object, const char* key, std::string fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : fallback;
}
int64_t int_or(const json& object, const char* key, int64_t fallback) {
  auto it = object.find(key);
  return it != object.end() && it->is_number_integer() ? it->get<int64_t>() : fallback;
}

std::string error_text(const json& error) {
  return error.is_object() ? string_or(error, "message", error.dump()) : error.dump();
}

}  // namespace

std::vector<double> spread_itl(const std::vector<double>& chunk_times,
                               const std::vector<size_t>& chunk_bytes, int64_t output_tokens) {
  const size_t later = chunk_times.size() > 0 ? chunk_times.size() - 1 : 0;
  if (later == 0 || output_tokens < 2) return {};
  const int64_t tokens = output_tokens - 1;  // the first chunk holds the first token
  std::vector<int64_t> counts;
  if (tokens >= int64_t(later)) {
    // One token each, the rest by text beyond one byte (evenly when there is none).
    std::vector<double> extra(later);
    for (size_t i = 0; i < later; ++i)
      extra[i] = double(std::max<size_t>(chunk_bytes.at(i + 1), 1) - 1);
    if (std::all_of(extra.begin(), extra.end(), [](double e) { return e == 0; }))
      std::fill(extra.begin(), extra.end(), 1.0);
    counts = apportion(tokens - int64_t(later), extra);
    for (auto& count : counts) ++count;
  } else {
    // Fewer tokens than chunks: some chunks carried none.
    std::vector<double> weight(later);
    for (size_t i = 0; i < later; ++i)
      weight[i] = double(std::max<size_t>(chunk_bytes.at(i + 1), 1));
    counts = apportion(tokens, weight);
  }
  std::vector<double> itl;
  double previous = chunk_times[0];
  for (size_t i = 0; i < later; ++i) {
    if (counts[i] == 0) continue;  // its gap joins the next chunk that has tokens
    const double gap = (chunk_times[i + 1] - previous) / double(counts[i]);
    itl.insert(itl.end(), size_t(counts[i]), gap);
    previous = chunk_times[i + 1];
  }
  return itl;
}

void SseSplitter::feed(std::string_view bytes,
                       const std::function<void(std::string_view)>& on_payload) {
  pending_.append(bytes);
  size_t pos = 0;
  for (size_t end; (end = pending_.find("\n\n", pos)) != std::string::npos; pos = end + 2) {
    std::string_view event(pending_.data() + pos, end - pos);
    if (event.starts_with("data: ")) on_payload(event.substr(6));
  }
  pending_.erase(0, pos);
}

StreamRecorder::StreamRecorder(Clock::time_point sent, int64_t prompt_len)
    : sent_(sent), prompt_len_(prompt_len) {}

void StreamRecorder::fail(std::string error) {
  if (error_.empty()) error_ = std::move(error);
}

void StreamRecorder::on_event(std::string_view payload, Clock::time_point at) {
  if (done()) return;
  if (payload == "[DONE]") {
    done_ = true;
    return;
  }
  json chunk = json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (!chunk.is_object())
    return fail("the stream carried an event that is not a JSON object: " + std::string(payload));
  if (chunk.contains("error")) return fail(error_text(chunk["error"]));
  if (auto usage = chunk.find("usage"); usage != chunk.end() && usage->is_object()) {
    usage_prompt_tokens_ = int_or(*usage, "prompt_tokens", -1);
    usage_completion_tokens_ = int_or(*usage, "completion_tokens", -1);
  }
  auto choices = chunk.find("choices");
  if (choices == chunk.end() || !choices->is_array() || choices->empty()) return;
  const json& choice = (*choices)[0];
  if (!choice.is_object()) return;
  chunk_times_.push_back(std::chrono::duration<double>(at - sent_).count());
  chunk_bytes_.push_back(chunk_text_bytes(choice));
  if (auto served = choice.find("served_by"); served != choice.end() && served->is_object()) {
    prefill_node_ = string_or(*served, "prefill", "");
    decode_node_ = string_or(*served, "decode", "");
  }
}

RequestRecord StreamRecorder::finish() const {
  RequestRecord record;
  record.prefill_node = prefill_node_;
  record.decode_node = decode_node_;
  record.prompt_tokens = usage_prompt_tokens_ >= 0 ? usage_prompt_tokens_ : prompt_len_;
  record.output_tokens =
      usage_completion_tokens_ >= 0 ? usage_completion_tokens_ : int64_t(chunk_times_.size());
  record.error = error_;
  if (record.error.empty() && !done_) record.error = "the stream ended before [DONE]";
  if (record.error.empty() && chunk_times_.empty()) record.error = "the stream carried no token";
  record.success = record.error.empty();
  if (!chunk_times_.empty()) {
    record.ttft_s = chunk_times_.front();
    record.e2el_s = chunk_times_.back();
  }
  record.itl_s = spread_itl(chunk_times_, chunk_bytes_, record.output_tokens);
  return record;
}

}  // namespace baton::loadtest
