#include "engine/chat_template.h"

#include <optional>

#include "engine/jinja/template.h"
#include "engine/json_file.h"

namespace baton::engine {

using nlohmann::ordered_json;

struct ChatTemplate::Impl {
  jinja::Template main;
  std::optional<jinja::Template> tool_use;
  jinja::Value special_tokens;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;
ChatTemplate::~ChatTemplate() = default;

namespace {

constexpr const char* kSpecialTokenNames[] = {"bos_token", "eos_token", "unk_token", "sep_token",
                                              "pad_token", "cls_token", "mask_token"};

// A special token as tokenizer_config.json writes it: a string, or an
// AddedToken object with its "content".
std::optional<std::string> token_text(const ordered_json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return std::nullopt;
}

// transformers' special_tokens_map: the special tokens that are set.
ordered_json special_tokens_of(const ordered_json& config) {
  ordered_json out = ordered_json::object();
  for (const char* name : kSpecialTokenNames) {
    if (!config.contains(name)) continue;
    if (auto text = token_text(config[name]); text && !text->empty()) (out)[name] = *text;
  }
  if (config.contains("additional_special_tokens") &&
      config["additional_special_tokens"].is_array()) {
    ordered_json extra = ordered_json::array();
    for (const auto& t : config["additional_special_tokens"]) {
      if (auto text = token_text(t)) extra.push_back(*text);
    }
    if (!extra.empty()) out["additional_special_tokens"] = std::move(extra);
  }
  return out;
}

Result<jinja::Template> parse_named(const std::string& source, const std::string& origin) {
  Result<jinja::Template> t = jinja::Template::parse(source);
  if (!t.is_ok()) {
    return invalid_argument(origin +
                            ": Baton cannot render this chat template: " + t.status().message());
  }
  return t;
}

}  // namespace

Result<ChatTemplate> ChatTemplate::from_source(const std::string& source,
                                               const ordered_json& special_tokens,
                                               const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  BATON_ASSIGN_OR_RETURN(impl->main, parse_named(source, origin));
  impl->special_tokens = jinja::Value::from_json(special_tokens);
  return ChatTemplate(std::move(impl));
}

Result<ChatTemplate> ChatTemplate::load(const std::filesystem::path& dir) {
  const std::filesystem::path config_path = dir / "tokenizer_config.json";
  ordered_json config = ordered_json::object();
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    BATON_ASSIGN_OR_RETURN(config, read_json_file<ordered_json>(config_path));
    if (!config.is_object()) return data_loss(config_path.string() + ": not a JSON object");
  }
  const ordered_json special_tokens = special_tokens_of(config);
  const std::filesystem::path jinja_path = dir / "chat_template.jinja";
  if (std::filesystem::exists(jinja_path, ec)) {
    BATON_ASSIGN_OR_RETURN(std::string source, read_text_file(jinja_path));
    return from_source(source, special_tokens, jinja_path.string());
  }
  const auto it = config.find("chat_template");
  if (it == config.end() || it->is_null()) {
    return not_found(dir.string() + " ships no chat template");
  }
  const std::string origin = config_path.string() + " chat_template";
  if (it->is_string()) return from_source(it->get<std::string>(), special_tokens, origin);
  if (!it->is_array()) return data_loss(origin + ": neither a string nor a list of templates");
  std::optional<std::string> main_source, tool_source;
  for (const auto& entry : *it) {
    if (!entry.is_object() || !entry.contains("name") || !entry["name"].is_string() ||
        !entry.contains("template") || !entry["template"].is_string()) {
      return data_loss(origin + ": each entry must be {\"name\": ..., \"template\": ...}");
    }
    const std::string name = entry["name"].get<std::string>();
    if (name == "default") main_source = entry["template"].get<std::string>();
    if (name == "tool_use") tool_source = entry["template"].get<std::string>();
  }
  if (!main_source) return data_loss(origin + ": no template named \"default\"");
  BATON_ASSIGN_OR_RETURN(ChatTemplate t, from_source(*main_source, special_tokens, origin));
  if (tool_source) {
    BATON_ASSIGN_OR_RETURN(t.impl_->tool_use, parse_named(*tool_source, origin + " tool_use"));
  }
  return t;
}

Result<std::string> ChatTemplate::render(const ChatTemplateInputs& inputs) const {
  using jinja::Value;
  Value context = Value::dict();
  auto& names = context.dict_data();
  // transformers: the special tokens, then chat_template_kwargs over them.
  for (const auto& [key, value] : impl_->special_tokens.dict_data().entries) names.set(key, value);
  for (const auto& [key, value] : inputs.extra.items()) {
    names.set(Value::string(key), Value::from_json(value));
  }
  names.set(Value::string("messages"), Value::from_json(inputs.messages));
  names.set(Value::string("tools"), Value::from_json(inputs.tools));
  names.set(Value::string("documents"), Value::none());
  names.set(Value::string("add_generation_prompt"), Value::boolean(inputs.add_generation_prompt));
  const bool with_tools = inputs.tools.is_array() && !inputs.tools.empty();
  const jinja::Template& t = with_tools && impl_->tool_use ? *impl_->tool_use : impl_->main;
  Result<std::string> text = t.render(context);
  // A render that fails, or that the template's bounds stop, fails for
  // this request's messages, and would again: the caller's error, not a
  // reason to retry.
  if (!text.is_ok()) return invalid_argument("chat template: " + text.status().message());
  return text;
}

}  // namespace baton::engine
