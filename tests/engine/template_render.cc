// tests/engine/template_render.cc — renders Jinja templates with Baton's
// engine for chat_template_test.py, which holds the output against Python's
// jinja2. Reads one JSON object per line:
//   {"template": "...", "context": {...}, "now": UNIX_SECONDS}
// and writes one per line: {"text": "..."}, {"render_error": "..."} or
// {"load_error": "..."} (the template was refused by the parser).
//
//   template_render --bench TEMPLATE_FILE CONTEXT_JSON_FILE
// renders one context for two seconds and prints the time per render.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "engine/jinja/template.h"

namespace {

std::string read_file(const char* path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

int bench(const char* template_file, const char* context_file) {
  auto t = baton::jinja::Template::parse(read_file(template_file));
  if (!t.is_ok()) {
    std::fprintf(stderr, "%s\n", t.status().to_string().c_str());
    return 1;
  }
  const auto context =
      baton::jinja::Value::from_json(nlohmann::ordered_json::parse(read_file(context_file)));
  size_t rounds = 0, bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  do {
    auto text = t->render(context);
    if (!text.is_ok()) {
      std::fprintf(stderr, "%s\n", text.status().to_string().c_str());
      return 1;
    }
    bytes = text->size();
    ++rounds;
    seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  } while (seconds < 2.0);
  std::printf("%.4f ms per render (%zu bytes of prompt, %zu renders)\n",
              seconds / double(rounds) * 1e3, bytes, rounds);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  using baton::jinja::Template;
  using baton::jinja::Value;
  if (argc == 4 && std::string(argv[1]) == "--bench") return bench(argv[2], argv[3]);
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
