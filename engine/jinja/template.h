// engine/jinja/template.h — a Jinja2 template, parsed once and rendered many
// times, as transformers renders chat templates (Jinja2's
// ImmutableSandboxedEnvironment with trim_blocks, lstrip_blocks and loop
// controls; tojson as json.dumps; raise_exception and strftime_now).
//
// What it covers is what the chat templates of real checkpoints use: text,
// {{ }} and {# #} with whitespace control, if/elif/else, for (with else, a
// filter, unpacking, `loop`, break/continue), set (names, tuples,
// namespace attributes, blocks), macros, filter blocks, {% generation %};
// Jinja2's operators, literals, slices, filters and tests; the str, list and
// dict methods the sandbox allows. Anything else is refused by parse() with
// its position; nothing is silently rendered differently.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "engine/jinja/value.h"

namespace baton::jinja {

struct Stmt;

struct RenderOptions {
  // The Unix time strftime_now formats (local time is UTC); 0: now.
  int64_t now_seconds = 0;
  // A bound on all the text a render produces, macros' output included, so
  // no template and no input can take unbounded memory or time.
  size_t max_output_bytes = size_t(64) << 20;
  // A bound on the loop iterations and macro calls of one render (about a
  // second's work): a chat template takes a few per message.
  size_t max_steps = 2'000'000;
};

class Template {
 public:
  static Result<Template> parse(std::string_view source);

  // Renders with the names of `context` (a dict) above the globals. Errors
  // name the position; the template's own raise_exception("...") reads
  // "raise_exception: ..." after it.
  Result<std::string> render(const Value& context, const RenderOptions& options = {}) const;

 private:
  std::shared_ptr<const std::vector<std::unique_ptr<Stmt>>> body_;
};

}  // namespace baton::jinja
