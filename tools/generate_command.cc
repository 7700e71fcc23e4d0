// tools/generate_command.cc — `baton generate`: run prompts through the
// engine with continuous batching and print the text and throughput.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "common/regular_file.h"
#include "engine/engine.h"
#include "tools/commands.h"
#include "tools/process_priority.h"

namespace baton::tools {
namespace {

struct GenerateOptions {
  std::string model_dir;
  // Unset unless given: an empty --prompt is an error of its own.
  std::optional<std::string> prompt;
  std::optional<std::string> prompt_ids;
  std::optional<std::string> prompts_file;
  std::string config_file;
  int32_t max_tokens = 16;
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;
  float min_p = 0.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t min_tokens = 0;
  std::vector<std::string> logit_bias;  // ID:BIAS
  uint64_t seed = 0;
  int32_t logprobs = 0;
  bool ignore_eos = false;
  bool warmup = false;
  bool json = false;
  std::optional<std::string> stop_token_ids;
  // Engine overrides, applied on top of --config's `engine:` section.
  std::vector<std::pair<std::string, std::string>> engine_overrides;
};

Result<std::vector<int32_t>> parse_id_list(const std::string& text, const std::string& what) {
  if (text.empty()) return invalid_argument(what + ": no token ids");
  std::vector<int32_t> ids;
  // Every comma separates two ids: "1,2," and "1,,2" both have an empty one.
  for (size_t begin = 0; begin <= text.size();) {
    size_t end = std::min(text.find(',', begin), text.size());
    const std::string item = text.substr(begin, end - begin);
    begin = end + 1;
    size_t used = 0;
    long long value = 0;
    try {
      value = std::stoll(item, &used);
    } catch (...) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    if (used == 0 || used != item.size() || value < INT32_MIN || value > INT32_MAX) {
      return invalid_argument(what + ": '" + item + "' is not a token id");
    }
    ids.push_back(int32_t(value));
  }
  return ids;
}

// Each prompt as token ids. Lines of --prompts starting with "ids:" are token
// ids; other lines are text for the checkpoint's tokenizer.
Result<std::vector<std::vector<int32_t>>> read_prompts(const GenerateOptions& o,
                                                       const engine::Tokenizer* tokenizer) {
  std::vector<std::vector<int32_t>> prompts;
  auto encode = [&](const std::string& text, const std::string& what) -> Status {
    if (tokenizer == nullptr) {
      return invalid_argument(what + ": the checkpoint ships no tokenizer; give token ids");
    }
    auto ids = tokenizer->encode(text);
    if (tokenizer->bos_id() >= 0) ids.insert(ids.begin(), tokenizer->bos_id());
    prompts.push_back(std::move(ids));
    return Status::ok();
  };
  int given = o.prompt.has_value() + o.prompt_ids.has_value() + o.prompts_file.has_value();
  if (given != 1) return invalid_argument("give exactly one of --prompt, --prompt-ids, --prompts");
  if (o.prompt) {
    if (o.prompt->empty()) return invalid_argument("--prompt: the prompt is empty");
    BATON_RETURN_IF_ERROR(encode(*o.prompt, "--prompt"));
  }
  if (o.prompt_ids) {
    BATON_ASSIGN_OR_RETURN(auto ids, parse_id_list(*o.prompt_ids, "--prompt-ids"));
    prompts.push_back(std::move(ids));
  }
  if (o.prompts_file) {
    if (Status file = check_regular_file(*o.prompts_file); !file.is_ok()) {
      return Status(file.code(), "--prompts: " + file.message());
    }
    std::ifstream in(*o.prompts_file);
    if (!in) return not_found("--prompts: cannot open " + *o.prompts_file);
    std::string line;
    for (int line_no = 1; std::getline(in, line); ++line_no) {
      if (!line.empty() && line.back() == '\r') line.pop_back();  // a file with CRLF lines
      if (line.empty()) continue;
      std::string where = *o.prompts_file + ":" + std::to_string(line_no);
      if (line.rfind("ids:", 0) == 0) {
        BATON_ASSIGN_OR_RETURN(auto ids, parse_id_list(line.substr(4), where));
        prompts.push_back(std::move(ids));
      } else {
        BATON_RETURN_IF_ERROR(encode(line, where));
      }
    }
    if (prompts.empty())
      return invalid_argument("--prompts: " + *o.prompts_file + " has no prompts");
  }
  return prompts;
}

Result<engine::EngineConfig> engine_config_from(const GenerateOptions& o) {
  YAML::Node node(YAML::NodeType::Map);
  if (!o.config_file.empty()) {
    // The whole file is validated first (unknown keys, bad values, a
    // non-mapping `engine:`), so the overrides below apply to a mapping.
    BATON_RETURN_IF_ERROR(engine::load_engine_config(o.config_file).status());
    try {
      YAML::Node root = YAML::LoadFile(o.config_file);
      if (root.IsMap() && root["engine"]) node = root["engine"];
    } catch (const YAML::Exception& e) {
      return invalid_argument(o.config_file + ": " + e.what());
    }
  }
  if (!node.IsMap() && !node.IsNull()) {
    return invalid_argument(o.config_file + ": engine: expected a mapping");
  }
  for (const auto& [key, value] : o.engine_overrides) node[key] = value;
  return engine::parse_engine_config(node, "engine");
}

nlohmann::json sequence_json(const engine::Sequence& seq, const engine::Tokenizer* tokenizer) {
  nlohmann::json out = {{"prompt_ids", seq.prompt},
                        {"output_ids", seq.output},
                        {"finish_reason", engine::finish_reason_name(seq.finish_reason)}};
  out["text"] = tokenizer ? tokenizer->decode(seq.output) : "";
  if (!seq.output_logprobs.empty()) {
    nlohmann::json list = nlohmann::json::array();
    for (const auto& lp : seq.output_logprobs) {
      nlohmann::json top = nlohmann::json::array();
      for (const auto& t : lp.top) top.push_back({{"id", t.id}, {"logprob", t.logprob}});
      list.push_back({{"id", lp.id}, {"logprob", lp.logprob}, {"top", top}});
    }
    out["logprobs"] = list;
  }
  return out;
}

// A token as readable text: its piece JSON-quoted (control bytes and invalid
// UTF-8 visible), or just the id where the checkpoint ships no tokenizer.
std::string token_label(int32_t id, const engine::Tokenizer* tokenizer) {
  std::string label = std::to_string(id);
  if (tokenizer == nullptr) return label;
  return label + " " +
         nlohmann::json(tokenizer->decode({id}))
             .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// --logprobs without --json: one line per generated token under its text.
void print_logprobs(const engine::Sequence& seq, const engine::Tokenizer* tokenizer) {
  for (const auto& lp : seq.output_logprobs) {
    std::string top;
    for (const auto& t : lp.top) {
      char value[32];
      std::snprintf(value, sizeof value, " %.4f", double(t.logprob));
      top += (top.empty() ? "" : ", ") + token_label(t.id, tokenizer) + value;
    }
    std::printf("  %s %.4f | top: %s\n", token_label(lp.id, tokenizer).c_str(), double(lp.logprob),
                top.c_str());
  }
}

// Bytes in the largest unit that keeps a whole number in front.
std::string human_bytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
  double value = double(bytes);
  int unit = 0;
  // 1023.999 KiB would print as "1024.00 KiB": move up a unit at what rounds to 1024.
  while (value >= 1023.995 && unit + 1 < int(std::size(kUnits))) value /= 1024, ++unit;
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.2f %s", value, kUnits[unit]);
  return text;
}

// " (N from SSD, M blocks saved there)" when the prefix cache has an SSD tier.
std::string ssd_note(const engine::SsdKvStore* ssd, const engine::SchedulerStats& stats) {
  if (ssd == nullptr) return "";
  return " (" + std::to_string(stats.prefix_ssd_hit_tokens) + " from SSD, " +
         std::to_string(ssd->stats().saved_blocks) + " blocks saved there)";
}

int run_generate(const GenerateOptions& o) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "error: %s\n", s.message().c_str());
    return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
  };
  auto config = engine_config_from(o);
  if (!config.is_ok()) return fail(config.status());
  if (Status s = lower_process_priority(config->nice); !s.is_ok()) return fail(s);
  auto created = engine::Engine::create(o.model_dir, *config);
  if (!created.is_ok()) return fail(created.status());
  engine::Engine& eng = **created;
  auto prompts = read_prompts(o, eng.tokenizer());
  if (!prompts.is_ok()) return fail(prompts.status());
  engine::GenerationOptions gen;
  gen.sampling = {.temperature = o.temperature,
                  .top_k = std::max(o.top_k, 0),
                  .top_p = o.top_p,
                  .min_p = o.min_p};
  gen.adjustments.presence_penalty = o.presence_penalty;
  gen.adjustments.frequency_penalty = o.frequency_penalty;
  gen.adjustments.repetition_penalty = o.repetition_penalty;
  gen.min_tokens = o.min_tokens;
  for (const std::string& pair : o.logit_bias) {
    const size_t colon = pair.find(':');
    char* end = nullptr;
    errno = 0;
    const long id = colon == std::string::npos ? -1 : std::strtol(pair.c_str(), &end, 10);
    const bool id_ok = id >= 0 && id <= std::numeric_limits<int32_t>::max() && errno == 0 &&
                       end != pair.c_str() && end == pair.c_str() + colon;
    // The whole text after the colon, a finite number: "5:" or "5:1.5x" is no bias.
    char* bias_end = nullptr;
    const char* bias_text = id_ok ? pair.c_str() + colon + 1 : "";
    const float bias = std::strtof(bias_text, &bias_end);
    if (!id_ok || *bias_text == '\0' || *bias_end != '\0' || !std::isfinite(bias)) {
      return fail(invalid_argument("--logit-bias takes ID:BIAS, got " + pair));
    }
    gen.adjustments.logit_bias.emplace_back(int32_t(id), bias);
  }
  gen.max_tokens = o.max_tokens;
  gen.ignore_eos = o.ignore_eos;
  gen.logprobs = o.logprobs;
  if (o.stop_token_ids) {
    auto ids = parse_id_list(*o.stop_token_ids, "--stop-token-ids");
    if (!ids.is_ok()) return fail(ids.status());
    gen.stop_token_ids = *ids;
  }
  if (o.warmup && !prompts->empty()) {
    // The first prompt once, untimed: first-touch page faults and cold caches
    // stay out of the stats, as llama-bench's warmup run keeps them out of its.
    engine::GenerationOptions first = gen;
    first.max_tokens = std::min(o.max_tokens, 2);
    auto id = eng.scheduler().add(prompts->front(), first);
    if (!id.is_ok()) return fail(id.status().with_context("warmup"));
    while (eng.scheduler().has_work()) {
      Status status = eng.scheduler().step(nullptr);
      if (!status.is_ok()) return fail(status.with_context("warmup"));
      (void)eng.scheduler().take_finished();
    }
  }
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < prompts->size(); ++i) {
    // Each prompt gets its own reproducible stream: seed, seed + 1, ...
    gen.seed = o.seed + i;
    prompt_tokens += int64_t((*prompts)[i].size());
    auto id = eng.scheduler().add((*prompts)[i], gen);
    if (!id.is_ok()) return fail(id.status().with_context("prompt " + std::to_string(i)));
  }

  using Clock = std::chrono::steady_clock;
  double prefill_seconds = 0, decode_seconds = 0;
  int64_t decode_tokens = 0;
  std::vector<std::unique_ptr<engine::Sequence>> done;
  auto start = Clock::now();
  while (eng.scheduler().has_work()) {
    auto t0 = Clock::now();
    Status status = eng.scheduler().step(nullptr);
    if (!status.is_ok()) return fail(status);
    double seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    // Steps that carry prompt tokens count as prefill time; the rest as decode.
    const auto& counts = eng.scheduler().last_step();
    if (counts.prompt_tokens > 0 || counts.recomputed_tokens > 0) {
      prefill_seconds += seconds;
    } else {
      decode_seconds += seconds;
      decode_tokens += counts.generated_tokens;
    }
    for (auto& seq : eng.scheduler().take_finished()) done.push_back(std::move(seq));
  }
  double total_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a->id < b->id; });

  int64_t output_tokens = 0;
  for (const auto& seq : done) {
    output_tokens += int64_t(seq->output.size());
    if (o.json) {
      // Sampled bytes need not be valid UTF-8: replace, never throw.
      std::printf("%s\n", sequence_json(*seq, eng.tokenizer())
                              .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
                              .c_str());
    } else if (eng.tokenizer() != nullptr) {
      std::printf("%s\n", eng.tokenizer()->decode(seq->output).c_str());
    } else {
      std::string ids;
      for (int32_t id : seq->output) ids += (ids.empty() ? "" : ",") + std::to_string(id);
      std::printf("%s\n", ids.c_str());
    }
    if (!o.json) print_logprobs(*seq, eng.tokenizer());
  }
  const auto& layout = eng.kv_pool().layout();
  auto stats = eng.scheduler().stats();
  uint64_t kv_used =
      uint64_t(stats.peak_used_blocks) * layout.block_size * layout.bytes_per_token();
  std::fprintf(
      stderr,
      "stats: %zu prompts, %lld prompt tokens at %.1f tok/s, %lld output tokens "
      "(decode %.1f tok/s, overall %.1f tok/s), %.2f s; KV used %s peak, "
      "%zu bytes/token (%s), %lld preemptions, %lld prompt tokens from the prefix "
      "cache%s\n",
      done.size(), static_cast<long long>(prompt_tokens),
      // Tokens the prefix cache held were not computed.
      prefill_seconds > 0 ? double(prompt_tokens - stats.prefix_hit_tokens) / prefill_seconds : 0.0,
      static_cast<long long>(output_tokens),
      decode_seconds > 0 ? double(decode_tokens) / decode_seconds : 0.0,
      total_seconds > 0 ? double(output_tokens) / total_seconds : 0.0, total_seconds,
      human_bytes(kv_used).c_str(), layout.bytes_per_token(),
      std::string(dtype_name(layout.dtype)).c_str(), static_cast<long long>(stats.preemptions),
      static_cast<long long>(stats.prefix_hit_tokens),
      ssd_note(eng.scheduler().ssd_store(), stats).c_str());
  return 0;
}

}  // namespace

std::function<int()> add_generate_command(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand("generate", "Generate text from a checkpoint on this machine");
  cmd->footer("Engine settings (YAML `engine:` keys; --flag-name overrides):\n" +
              engine::engine_config_reference());
  cmd->add_option("--model", o->model_dir, "checkpoint directory")->required();
  cmd->add_option("--prompt", o->prompt, "prompt text");
  cmd->add_option("--prompt-ids", o->prompt_ids, "prompt as token ids: 1,2,3");
  cmd->add_option("--prompts", o->prompts_file,
                  "file with one prompt per line (\"ids:1,2,3\" lines are token ids)");
  cmd->add_option("--config", o->config_file,
                  "YAML file whose `engine:` section configures the engine");
  cmd->add_option("--max-tokens", o->max_tokens, "tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0 = greedy")->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "nucleus sampling mass")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "keep the k most likely tokens; 0 or -1 = all")
      ->check(CLI::Range(-1, std::numeric_limits<int32_t>::max()))
      ->capture_default_str();
  cmd->add_option("--seed", o->seed, "sampling seed (prompt i uses seed + i)")
      ->check([](const std::string& text) -> std::string {
        // CLI11 reads "-1" into an unsigned seed as 2^64 - 1.
        return text.find('-') == std::string::npos ? "" : "must be a non-negative integer";
      })
      ->capture_default_str();
  cmd->add_option("--min-p", o->min_p, "cut tokens below min_p x the likeliest's probability");
  cmd->add_option("--presence-penalty", o->presence_penalty, "subtracted once per output token");
  cmd->add_option("--frequency-penalty", o->frequency_penalty,
                  "subtracted per occurrence in the output");
  cmd->add_option("--repetition-penalty", o->repetition_penalty,
                  "divides positive (multiplies negative) logits of tokens seen");
  cmd->add_option("--min-tokens", o->min_tokens, "no EOS or stop token before this many tokens");
  cmd->add_option("--logit-bias", o->logit_bias, "ID:BIAS added to a token's logit (repeatable)");
  cmd->add_option("--logprobs", o->logprobs, "top-N log-probabilities of each generated token");
  cmd->add_option("--stop-token-ids", o->stop_token_ids, "token ids that end generation: 5,7");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "keep generating past EOS");
  cmd->add_flag("--warmup", o->warmup,
                "run the first prompt once, untimed, before the others (with prefix caching on, "
                "the timed run then finds its blocks cached)");
  cmd->add_flag("--json", o->json, "one JSON object per prompt");
  // One override flag per engine setting: engine.block_size -> --block-size.
  for (const std::string& key : engine::engine_config_keys()) {
    std::string flag = "--" + key;
    for (auto& c : flag) c = c == '_' ? '-' : c;
    cmd->add_option_function<std::string>(
        flag, [o, key](const std::string& v) { o->engine_overrides.emplace_back(key, v); },
        "overrides engine." + key);
  }
  return [o]() { return run_generate(*o); };
}

}  // namespace baton::tools
