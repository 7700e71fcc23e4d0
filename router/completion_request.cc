#include "router/completion_request.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "common/control_messages.h"
#include "common/json_depth.h"
#include "router/request_fields.h"

namespace baton::router {
namespace {

using nlohmann::json;
using nlohmann::ordered_json;

Status bad(const std::string& field, const std::string& what) {
  return invalid_argument("'" + field + "' " + what);
}

// A JSON value for an error message: a scalar as written, cut to a short
// prefix; a list or object only by its kind. Never the whole of a value a
// client sent (it may be megabytes, or nested deeper than a recursive dump
// can go).
std::string quote_value(const json& v) {
  if (v.is_array()) return "a list";
  if (v.is_object()) return "an object";
  std::string text = v.dump(-1, ' ', false, json::error_handler_t::replace);
  constexpr size_t kMaxQuoted = 40;
  if (text.size() > kMaxQuoted) text = text.substr(0, kMaxQuoted) + "...";
  return text;
}

// A present, non-null member of `doc`, or null.
const json* member(const json& doc, const char* key) {
  auto it = doc.find(key);
  return it == doc.end() || it->is_null() ? nullptr : &*it;
}

Result<int64_t> read_int(const json& v, const std::string& field, int64_t lo, int64_t hi) {
  // An integer past 64 bits reaches here as a float (10^30 as 1e+30).
  if (v.is_number_float() && std::fabs(v.get<double>()) >= 0x1p63 &&
      std::trunc(v.get<double>()) == v.get<double>()) {
    return bad(field, "is out of range: " + quote_value(v));
  }
  if (!v.is_number_integer()) return bad(field, "must be an integer, got " + quote_value(v));
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max())) {
    return bad(field, "is out of range: " + quote_value(v));
  }
  int64_t x = v.get<int64_t>();
  if (x < lo || x > hi) {
    return bad(field, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                          std::to_string(x));
  }
  return x;
}

Result<double> read_number(const json& v, const std::string& field) {
  if (!v.is_number()) return bad(field, "must be a number, got " + quote_value(v));
  double x = v.get<double>();
  // The nodes' control codec carries reals as floats within this magnitude.
  // (The double is bounded first: narrowing one past the floats' range is
  // undefined.)
  if (!std::isfinite(x) || std::fabs(x) > 2 * control::kMaxRealMagnitude ||
      std::fabs(double(float(x))) > control::kMaxRealMagnitude) {
    return bad(field, "must be finite and at most 1e30 in magnitude");
  }
  return x;
}

Result<bool> read_bool(const json& v, const std::string& field) {
  if (!v.is_boolean()) return bad(field, "must be true or false, got " + quote_value(v));
  return v.get<bool>();
}

Result<std::vector<int32_t>> read_token_ids(const json& v, const std::string& field) {
  if (!v.is_array()) return bad(field, "must be a list of token ids");
  std::vector<int32_t> ids;
  ids.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    BATON_ASSIGN_OR_RETURN(int64_t id, read_int(v[i], field + "[" + std::to_string(i) + "]", 0,
                                                std::numeric_limits<int32_t>::max()));
    ids.push_back(int32_t(id));
  }
  return ids;
}

Result<json> parse_object(std::string_view body) {
  if (json_nests_deeper_than(body, kMaxJsonDepth)) {
    return invalid_argument("the request body nests lists and objects deeper than " +
                            std::to_string(kMaxJsonDepth) + " levels");
  }
  if (json_object_wider_than(body, kMaxJsonObjectMembers)) {
    return invalid_argument("the request body has an object of more than " +
                            std::to_string(kMaxJsonObjectMembers) + " members");
  }
  if (json_containers(body) > kMaxJsonContainers) {
    return invalid_argument("the request body holds more than " +
                            std::to_string(kMaxJsonContainers) + " lists and objects");
  }
  json doc = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return invalid_argument("the request body is not valid JSON");
  if (!doc.is_object()) return invalid_argument("the request body must be a JSON object");
  return doc;
}

Result<std::string> read_model(const json& doc) {
  const json* v = member(doc, "model");
  if (v == nullptr) return std::string();
  if (!v->is_string()) return bad("model", "must be a string");
  return v->get<std::string>();
}

// A real in [lo, hi] ((lo, hi] when `lo_open`), read into `out` where `key`
// is given. Checked as the 32-bit float the nodes take: 1e-300 is 0 to them,
// which an open range refuses.
Status read_real_in(const json& doc, const char* key, double lo, double hi, bool lo_open,
                    float& out) {
  const json* v = member(doc, key);
  if (v == nullptr) return Status::ok();
  BATON_ASSIGN_OR_RETURN(double x, read_number(*v, key));
  const auto outside = [&](double y) { return (lo_open ? y <= lo : y < lo) || y > hi; };
  const float f = float(x);
  if (outside(f)) {
    const auto bound = [](double b) {
      return b == std::trunc(b) ? std::to_string(int64_t(b)) : quote_value(json(b));
    };
    return bad(key, "must be in " + std::string(lo_open ? "(" : "[") + bound(lo) + ", " +
                        bound(hi) + "]" + (outside(x) ? "" : " (as a 32-bit float)") + ", got " +
                        quote_value(*v));
  }
  out = f;
  return Status::ok();
}

// vLLM's penalties, min_p, min_tokens and OpenAI's logit_bias, within the
// ranges OpenAI and vLLM take (and the control codec carries).
Status read_sampling_extras(const json& doc, SamplingFields& s) {
  BATON_RETURN_IF_ERROR(read_real_in(doc, "presence_penalty", -2, 2, false, s.presence_penalty));
  BATON_RETURN_IF_ERROR(read_real_in(doc, "frequency_penalty", -2, 2, false, s.frequency_penalty));
  BATON_RETURN_IF_ERROR(read_real_in(doc, "repetition_penalty", 0, 10, true, s.repetition_penalty));
  BATON_RETURN_IF_ERROR(read_real_in(doc, "min_p", 0, 1, false, s.min_p));
  if (const json* v = member(doc, "min_tokens")) {
    BATON_ASSIGN_OR_RETURN(int64_t n, read_int(*v, "min_tokens", 0, s.max_tokens));
    s.min_tokens = int32_t(n);
  }
  if (const json* v = member(doc, "logit_bias")) {
    if (!v->is_object()) return bad("logit_bias", "must be an object of token ids to biases");
    if (v->size() > control::kMaxLogitBias) {
      return bad("logit_bias",
                 "has more than " + std::to_string(control::kMaxLogitBias) + " entries");
    }
    for (const auto& [key, bias] : v->items()) {
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 ||
          id > std::numeric_limits<int32_t>::max()) {
        return bad("logit_bias", "keys must be token ids, got " + quote_value(json(key)));
      }
      BATON_ASSIGN_OR_RETURN(double b, read_number(bias, "logit_bias[" + key + "]"));
      if (b < -100 || b > 100) return bad("logit_bias[" + key + "]", "must be in [-100, 100]");
      // "01" and "1" are one token: which bias would hold is anyone's guess.
      if (std::ranges::any_of(s.logit_bias, [&](const auto& e) { return e.first == id; })) {
        return bad("logit_bias", "names token id " + std::to_string(id) + " twice");
      }
      s.logit_bias.emplace_back(int32_t(id), float(b));
    }
  }
  return Status::ok();
}

// `max_tokens_key` is "max_tokens", or for chat also "max_completion_tokens".
Status read_sampling(const json& doc, const RequestLimits& limits, SamplingFields& s,
                     bool is_chat) {
  if (limits.default_temperature) s.temperature = *limits.default_temperature;
  if (limits.default_top_p) s.top_p = *limits.default_top_p;
  if (limits.default_top_k) s.top_k = std::max(0, *limits.default_top_k);
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (!is_chat && std::string_view(key) == "max_completion_tokens") continue;
    if (const json* v = member(doc, key)) {
      BATON_ASSIGN_OR_RETURN(int64_t x, read_int(*v, key, 1, std::numeric_limits<int32_t>::max()));
      s.max_tokens = int32_t(x);
    }
  }
  if (const json* v = member(doc, "temperature")) {
    BATON_ASSIGN_OR_RETURN(double t, read_number(*v, "temperature"));
    if (t < 0) return bad("temperature", "must be at least 0");
    s.temperature = float(t);
  }
  BATON_RETURN_IF_ERROR(read_real_in(doc, "top_p", 0, 1, /*lo_open=*/true, s.top_p));
  if (const json* v = member(doc, "top_k")) {
    BATON_ASSIGN_OR_RETURN(int64_t k,
                           read_int(*v, "top_k", -1, std::numeric_limits<int32_t>::max()));
    s.top_k = k < 0 ? 0 : int32_t(k);
  }
  if (const json* v = member(doc, "seed")) {
    BATON_ASSIGN_OR_RETURN(int64_t seed, read_int(*v, "seed", std::numeric_limits<int64_t>::min(),
                                                  std::numeric_limits<int64_t>::max()));
    s.seed = uint64_t(seed);
  }
  if (const json* v = member(doc, "stop")) {
    if (v->is_string()) {
      s.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      for (size_t i = 0; i < v->size(); ++i) {
        if (!(*v)[i].is_string()) return bad("stop", "must be a string or a list of strings");
        s.stop.push_back((*v)[i].get<std::string>());
      }
    } else {
      return bad("stop", "must be a string or a list of strings");
    }
    if (int32_t(s.stop.size()) > limits.max_stop_strings) {
      return bad("stop", "has more than " + std::to_string(limits.max_stop_strings) + " strings");
    }
    for (const auto& stop : s.stop) {
      if (stop.empty()) return bad("stop", "must not contain an empty string");
      if (stop.size() > kMaxStopStringBytes) {
        return bad("stop", "has a string of " + std::to_string(stop.size()) + " bytes (at most " +
                               std::to_string(kMaxStopStringBytes) + ")");
      }
    }
  }
  if (const json* v = member(doc, "stop_token_ids")) {
    BATON_ASSIGN_OR_RETURN(s.stop_token_ids, read_token_ids(*v, "stop_token_ids"));
    if (s.stop_token_ids.size() > control::kMaxStopTokenIds) {
      return bad("stop_token_ids",
                 "has more than " + std::to_string(control::kMaxStopTokenIds) + " ids");
    }
  }
  if (const json* v = member(doc, "return_tokens_as_token_ids")) {
    BATON_ASSIGN_OR_RETURN(s.tokens_as_ids, read_bool(*v, "return_tokens_as_token_ids"));
  }
  if (const json* v = member(doc, "ignore_eos")) {
    BATON_ASSIGN_OR_RETURN(s.ignore_eos, read_bool(*v, "ignore_eos"));
  }
  BATON_RETURN_IF_ERROR(read_sampling_extras(doc, s));
  if (const json* v = member(doc, "n")) {
    BATON_ASSIGN_OR_RETURN(int64_t n, read_int(*v, "n", 1, limits.max_n));
    s.n = int32_t(n);
  }
  if (const json* v = member(doc, "stream")) {
    BATON_ASSIGN_OR_RETURN(s.stream, read_bool(*v, "stream"));
  }
  s.best_of = s.n;
  if (const json* v = member(doc, "best_of")) {
    BATON_ASSIGN_OR_RETURN(int64_t best_of, read_int(*v, "best_of", 1, limits.max_n));
    if (best_of < s.n) return bad("best_of", "must be at least n (" + std::to_string(s.n) + ")");
    // The best are known only once every sample has ended.
    if (best_of > s.n && s.stream) return bad("best_of", "above n cannot be streamed");
    s.best_of = int32_t(best_of);
  }
  if (const json* v = member(doc, "stream_options")) {
    if (!s.stream) return bad("stream_options", "can only be given when 'stream' is true");
    if (!v->is_object()) return bad("stream_options", "must be an object");
    if (const json* u = member(*v, "include_usage")) {
      BATON_ASSIGN_OR_RETURN(s.include_usage, read_bool(*u, "stream_options.include_usage"));
    }
    // No field goes unread (request_fields.h): vLLM's usage in every chunk
    // is not sent, so asking for it is refused, not ignored.
    for (const auto& [key, value] : v->items()) {
      if (key == "include_usage") continue;
      if (key == "continuous_usage_stats") {
        if (value.is_null() || value == false) continue;
        return bad("stream_options.continuous_usage_stats", "is not supported");
      }
      return bad("stream_options", "has no field '" + key + "'");
    }
  }
  if (is_chat) {
    // Chat: "logprobs": bool, "top_logprobs": N.
    bool want = false;
    if (const json* v = member(doc, "logprobs")) {
      BATON_ASSIGN_OR_RETURN(want, read_bool(*v, "logprobs"));
    }
    // As OpenAI: no alternatives unless top_logprobs asks for them.
    s.want_logprobs = want;
    if (const json* v = member(doc, "top_logprobs")) {
      if (!want) return bad("top_logprobs", "requires 'logprobs' to be true");
      BATON_ASSIGN_OR_RETURN(int64_t n, read_int(*v, "top_logprobs", 0, limits.max_logprobs));
      s.logprobs = int32_t(n);
    }
  } else if (const json* v = member(doc, "logprobs")) {
    // 0 still asks for the chosen tokens' own log-probabilities.
    BATON_ASSIGN_OR_RETURN(int64_t n, read_int(*v, "logprobs", 0, limits.max_logprobs));
    s.want_logprobs = true;
    s.logprobs = int32_t(n);
  }
  return Status::ok();
}

Result<std::vector<Prompt>> read_prompts(const json& doc, const RequestLimits& limits) {
  const json* v = member(doc, "prompt");
  if (v == nullptr) return bad("prompt", "is required");
  std::vector<Prompt> prompts;
  auto check_text = [](const std::string& text, const std::string& field) -> Status {
    if (text.empty()) return bad(field, "must not be empty");
    return Status::ok();
  };
  if (v->is_string()) {
    BATON_RETURN_IF_ERROR(check_text(v->get<std::string>(), "prompt"));
    prompts.emplace_back(v->get<std::string>());
    return prompts;
  }
  if (!v->is_array() || v->empty()) {
    return bad("prompt", "must be a string, a list of token ids, or a non-empty list of either");
  }
  if ((*v)[0].is_number()) {  // one prompt as token ids
    BATON_ASSIGN_OR_RETURN(auto ids, read_token_ids(*v, "prompt"));
    prompts.emplace_back(std::move(ids));
    return prompts;
  }
  if (int32_t(v->size()) > limits.max_batch) {
    return bad("prompt", "batch has more than " + std::to_string(limits.max_batch) + " prompts");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const json& item = (*v)[i];
    std::string field = "prompt[" + std::to_string(i) + "]";
    if (item.is_string()) {
      BATON_RETURN_IF_ERROR(check_text(item.get<std::string>(), field));
      prompts.emplace_back(item.get<std::string>());
    } else if (item.is_array()) {
      if (item.empty()) return bad(field, "must not be empty");
      BATON_ASSIGN_OR_RETURN(auto ids, read_token_ids(item, field));
      prompts.emplace_back(std::move(ids));
    } else {
      return bad(field, "must be a string or a list of token ids");
    }
  }
  return prompts;
}

Result<std::string> read_content(const json& v, const std::string& field) {
  if (v.is_string()) return v.get<std::string>();
  // The list form: [{"type": "text", "text": "..."}, ...]; only text parts,
  // joined by newlines as vLLM joins them for templates that take a string.
  if (!v.is_array()) return bad(field, "must be a string or a list of text parts");
  std::string text;
  for (size_t i = 0; i < v.size(); ++i) {
    const json& part = v[i];
    std::string part_field = field + "[" + std::to_string(i) + "]";
    const json* type = part.is_object() ? member(part, "type") : nullptr;
    const json* text_part = part.is_object() ? member(part, "text") : nullptr;
    if (type == nullptr || !type->is_string() || type->get<std::string>() != "text" ||
        text_part == nullptr || !text_part->is_string()) {
      return bad(part_field,
                 "must be {\"type\": \"text\", \"text\": ...}; other parts are not supported");
    }
    if (i > 0) text += '\n';
    text += text_part->get<std::string>();
  }
  return text;
}

}  // namespace

Result<CompletionRequest> parse_completion_request(std::string_view body,
                                                   const RequestLimits& limits) {
  BATON_ASSIGN_OR_RETURN(json doc, parse_object(body));
  BATON_RETURN_IF_ERROR(check_request_fields(doc, Endpoint::kCompletions));
  CompletionRequest request;
  BATON_ASSIGN_OR_RETURN(request.model, read_model(doc));
  BATON_ASSIGN_OR_RETURN(request.prompts, read_prompts(doc, limits));
  BATON_RETURN_IF_ERROR(read_sampling(doc, limits, request.sampling, /*is_chat=*/false));
  if (const json* v = member(doc, "echo")) {
    BATON_ASSIGN_OR_RETURN(request.sampling.echo, read_bool(*v, "echo"));
  }
  return request;
}

namespace {

// An assistant message's tool_calls: [{"function": {"name", "arguments"}}],
// arguments as a JSON string (OpenAI's API) or an object.
// `containers`: the lists and objects of the arguments strings checked so
// far, all of them held to kMaxJsonContainers together.
Status check_tool_calls(const json& calls, const std::string& field, size_t& containers) {
  if (!calls.is_array()) return bad(field, "must be a list");
  for (size_t i = 0; i < calls.size(); ++i) {
    const std::string call_field = field + "[" + std::to_string(i) + "]";
    const json* function = calls[i].is_object() ? member(calls[i], "function") : nullptr;
    if (function == nullptr || !function->is_object()) {
      return bad(call_field + ".function", "must be an object");
    }
    const json* name = member(*function, "name");
    if (name == nullptr || !name->is_string()) {
      return bad(call_field + ".function.name", "must be a string");
    }
    const json* arguments = member(*function, "arguments");
    if (arguments != nullptr && !arguments->is_string() && !arguments->is_object()) {
      return bad(call_field + ".function.arguments", "must be a JSON string or an object");
    }
    // A string is parsed for the template: held to the body's own bounds
    // first (the body's checks skip the insides of strings).
    if (arguments != nullptr && arguments->is_string()) {
      const std::string& text = arguments->get_ref<const std::string&>();
      if (json_nests_deeper_than(text, kMaxJsonDepth)) {
        return bad(
            call_field + ".function.arguments",
            "nests lists and objects deeper than " + std::to_string(kMaxJsonDepth) + " levels");
      }
      if (json_object_wider_than(text, kMaxJsonObjectMembers)) {
        return bad(
            call_field + ".function.arguments",
            "has an object of more than " + std::to_string(kMaxJsonObjectMembers) + " members");
      }
      containers += json_containers(text);
      if (containers > kMaxJsonContainers) {
        return bad(call_field + ".function.arguments",
                   "brings the lists and objects of the messages' tool-call arguments past " +
                       std::to_string(kMaxJsonContainers));
      }
    }
  }
  return Status::ok();
}

// The message as a template sees it (see ChatRequest::template_messages).
ordered_json template_message(ordered_json m, const std::string& role, const json* content,
                              const std::string& text) {
  m["role"] = role;
  m["content"] = content == nullptr ? ordered_json() : ordered_json(text);
  auto calls = m.find("tool_calls");
  if (calls == m.end() || !calls->is_array()) return m;
  for (auto& call : *calls) {
    auto& arguments = call["function"]["arguments"];
    if (!arguments.is_string()) continue;
    ordered_json parsed = ordered_json::parse(arguments.get<std::string>(), nullptr, false);
    if (!parsed.is_discarded() && parsed.is_object()) arguments = std::move(parsed);
  }
  return m;
}

Status read_messages(const json& doc, const ordered_json& ordered, ChatRequest& request) {
  const json* messages = member(doc, "messages");
  if (messages == nullptr) return bad("messages", "is required");
  if (!messages->is_array() || messages->empty()) {
    return bad("messages", "must be a non-empty list");
  }
  size_t argument_containers = 0;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    std::string field = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return bad(field, "must be an object");
    const json* role = member(m, "role");
    if (role == nullptr || !role->is_string()) return bad(field + ".role", "must be a string");
    std::string role_name = role->get<std::string>();
    if (role_name != "system" && role_name != "user" && role_name != "assistant" &&
        role_name != "developer" && role_name != "tool") {
      return bad(field + ".role",
                 "must be system, developer, user, assistant or tool, got " + quote_value(*role));
    }
    if (role_name == "developer") role_name = "system";
    const json* tool_calls = member(m, "tool_calls");
    if (tool_calls != nullptr) {
      if (role_name != "assistant") return bad(field + ".tool_calls", "is for assistant messages");
      BATON_RETURN_IF_ERROR(
          check_tool_calls(*tool_calls, field + ".tool_calls", argument_containers));
    }
    for (const char* key : {"name", "tool_call_id"}) {
      const json* v = member(m, key);
      if (v != nullptr && !v->is_string()) return bad(field + "." + key, "must be a string");
    }
    if (role_name == "tool" && member(m, "tool_call_id") == nullptr)
      return bad(field + ".tool_call_id", "is required for a tool message");
    const json* content = member(m, "content");
    std::string text;
    if (content != nullptr) {
      BATON_ASSIGN_OR_RETURN(text, read_content(*content, field + ".content"));
    } else if (tool_calls == nullptr) {
      return bad(field + ".content", "is required");
    }
    request.template_messages.push_back(
        template_message(ordered["messages"][i], role_name, content, text));
    request.messages.push_back({std::move(role_name), std::move(text)});
  }
  return Status::ok();
}

// tools, add_generation_prompt, chat_template_kwargs.
Status read_chat_template_fields(const json& doc, const ordered_json& ordered,
                                 ChatRequest& request) {
  if (const json* tools = member(doc, "tools")) {
    if (!tools->is_array()) return bad("tools", "must be a list");
    for (size_t i = 0; i < tools->size(); ++i) {
      const std::string field = "tools[" + std::to_string(i) + "]";
      const json& tool = (*tools)[i];
      const json* type = tool.is_object() ? member(tool, "type") : nullptr;
      if (type == nullptr || *type != "function")
        return bad(field + ".type", "must be \"function\"");
      const json* function = member(tool, "function");
      const json* name =
          function != nullptr && function->is_object() ? member(*function, "name") : nullptr;
      if (name == nullptr || !name->is_string()) {
        return bad(field + ".function.name", "must be a string");
      }
    }
    request.tools = ordered["tools"];
  }
  if (const json* v = member(doc, "tool_choice")) {
    if (!v->is_string() || (*v != "auto" && *v != "none")) {
      return bad("tool_choice", "must be \"auto\" or \"none\" (Baton does not force tool calls)");
    }
    if (*v == "none") request.tools = ordered_json();
  }
  if (const json* v = member(doc, "add_generation_prompt")) {
    BATON_ASSIGN_OR_RETURN(request.add_generation_prompt, read_bool(*v, "add_generation_prompt"));
  }
  if (const json* v = member(doc, "chat_template_kwargs")) {
    if (!v->is_object()) return bad("chat_template_kwargs", "must be an object");
    for (const char* reserved : {"messages", "tools", "documents", "add_generation_prompt"}) {
      if (v->contains(reserved)) {
        return bad(std::string("chat_template_kwargs.") + reserved,
                   "is set by the request itself, not here");
      }
    }
    request.chat_template_kwargs = ordered["chat_template_kwargs"];
  }
  return Status::ok();
}

// The chat fields of a body parsed (and depth-checked) as `doc`; the same
// body again with its keys in order, for templates.
Result<ChatRequest> read_chat(const json& doc, std::string_view body) {
  const ordered_json ordered = ordered_json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (ordered.is_discarded()) return invalid_argument("the request body is not valid JSON");
  ChatRequest request;
  BATON_ASSIGN_OR_RETURN(request.model, read_model(doc));
  BATON_RETURN_IF_ERROR(read_messages(doc, ordered, request));
  BATON_RETURN_IF_ERROR(read_chat_template_fields(doc, ordered, request));
  return request;
}

}  // namespace

Result<ChatRequest> parse_chat_request(std::string_view body, const RequestLimits& limits) {
  BATON_ASSIGN_OR_RETURN(json doc, parse_object(body));
  BATON_RETURN_IF_ERROR(check_request_fields(doc, Endpoint::kChatCompletions));
  BATON_ASSIGN_OR_RETURN(ChatRequest request, read_chat(doc, body));
  BATON_RETURN_IF_ERROR(read_sampling(doc, limits, request.sampling, /*is_chat=*/true));
  return request;
}

Result<TokenizeRequest> parse_tokenize_request(std::string_view body) {
  BATON_ASSIGN_OR_RETURN(json doc, parse_object(body));
  TokenizeRequest request;
  BATON_ASSIGN_OR_RETURN(request.model, read_model(doc));
  if (const json* v = member(doc, "add_special_tokens")) {
    BATON_ASSIGN_OR_RETURN(bool add, read_bool(*v, "add_special_tokens"));
    request.add_special_tokens = add;
  }
  const json* prompt = member(doc, "prompt");
  const json* messages = member(doc, "messages");
  if ((prompt == nullptr) == (messages == nullptr)) {
    return bad("prompt", "or 'messages' is required (one of them)");
  }
  if (prompt != nullptr) {
    if (!prompt->is_string()) return bad("prompt", "must be a string");
    request.text = prompt->get<std::string>();
    return request;
  }
  BATON_ASSIGN_OR_RETURN(request.chat, read_chat(doc, body));
  return request;
}

Result<DetokenizeRequest> parse_detokenize_request(std::string_view body) {
  BATON_ASSIGN_OR_RETURN(json doc, parse_object(body));
  DetokenizeRequest request;
  BATON_ASSIGN_OR_RETURN(request.model, read_model(doc));
  const json* tokens = member(doc, "tokens");
  if (tokens == nullptr) return bad("tokens", "is required");
  BATON_ASSIGN_OR_RETURN(request.tokens, read_token_ids(*tokens, "tokens"));
  return request;
}

}  // namespace baton::router
