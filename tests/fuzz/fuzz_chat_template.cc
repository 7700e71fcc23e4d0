// libFuzzer target: a chat template (what a checkpoint ships), rendered with
// a small conversation. The input is the template's source; parsing gives a
// template or a refusal, and rendering gives text or an error within the
// output, loop and macro-depth bounds.
#include <cstdint>
#include <string_view>

#include "engine/jinja/template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace baton::jinja;
  static const Value context = Value::from_json(nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": " Be brief. "},
                 {"role": "user", "content": "Hi <|im_start|> {{ x }}"},
                 {"role": "assistant", "content": null, "tool_calls": [
                   {"type": "function", "function": {"name": "f", "arguments": {"a": [1, 2.5]}}}]},
                 {"role": "tool", "content": "42"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})"));
  auto t = Template::parse(std::string_view(reinterpret_cast<const char*>(data), size));
  if (!t.is_ok()) return 0;
  RenderOptions options;
  options.now_seconds = 1700000000;
  options.max_output_bytes = 1 << 20;
  options.max_steps = 100000;
  (void)t->render(context, options);
  return 0;
}
