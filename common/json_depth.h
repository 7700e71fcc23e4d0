// common/json_depth.h — how deep a JSON text nests, read before it is parsed:
// every later use of a parsed value (a copy, a dump, a walk over it) may
// recurse once a level, so a document nested 100,000 deep must be refused
// as text, not met as a parsed value.
#pragma once

#include <cstddef>
#include <string_view>

namespace baton {

// Whether `text` nests arrays and objects deeper than `max_depth` (strings
// skipped).
inline bool json_nests_deeper_than(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

}  // namespace baton
