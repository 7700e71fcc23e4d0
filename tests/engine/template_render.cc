// tests/engine/template_render.cc — renders Jinja templates with Baton's
// engine for chat_template_test.py, which holds the output against Python's
// jinja2. Reads one JSON object per line:
//   {"template": "...", "context": {...}, "now": UNIX_SECONDS}
// and writes one per line: {"text": "..."}, {"render_error": "..."} or
// {"load_error": "..."} (the template was refused by the parser).
#include <cstdio>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/jinja/template.h"

int main() {
  using baton::jinja::Template;
  using baton::jinja::Value;
  std::map<std::string, baton::Result<Template>> parsed;
  std::string line;
  while (std::getline(std::cin, line)) {
    const auto request = nlohmann::ordered_json::parse(line);
    const std::string source = request.at("template").get<std::string>();
    auto it = parsed.find(source);
    if (it == parsed.end()) it = parsed.emplace(source, Template::parse(source)).first;
    nlohmann::json reply;
    if (!it->second.is_ok()) {
      reply["load_error"] = it->second.status().message();
    } else {
      baton::jinja::RenderOptions options;
      options.now_seconds = request.value("now", int64_t{0});
      auto text = it->second->render(Value::from_json(request.at("context")), options);
      if (text.is_ok()) {
        reply["text"] = *text;
      } else {
        reply["render_error"] = text.status().message();
      }
    }
    std::cout << reply.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  }
  return 0;
}
