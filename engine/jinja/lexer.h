// engine/jinja/lexer.h — a template's source as Jinja2's lexer splits it,
// with the whitespace rules transformers renders chat templates with:
// trim_blocks (the newline after a block or comment tag goes), lstrip_blocks
// (spaces and tabs before a block or comment tag on its line go), "-" on a
// tag strips all white space on that side, and one trailing newline of the
// source is dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace baton::jinja {

struct Token {
  enum class Kind {
    kText,        // template data between tags
    kPrintBegin,  // {{
    kPrintEnd,    // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text: the literal's value, escapes resolved
    kInteger,
    kFloat,
    kOperator,
    kEnd,
  };
  Kind kind;
  std::string text;
  int line = 1;
  int column = 1;
};

// "line L, column C" of a byte offset.
std::string describe_position(int line, int column);

Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace baton::jinja
