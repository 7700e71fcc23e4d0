// common/json_depth.h — how deep a JSON text nests, how wide its objects
// are and how many lists and objects it holds, read before it is parsed:
// every later use of a parsed value (a copy, a dump, a walk over it) may
// recurse once a level, so a document nested 100,000 deep must be refused
// as text, not met as a parsed value; an ordered parse of a wide object is
// quadratic; and an empty list or object parses to some 20 times its
// bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

namespace baton {

// Calls `on(c)` for each character of `text` outside its strings, until it
// returns true; whether one did.
template <typename On>
bool any_outside_json_strings(std::string_view text, On on) {
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
    } else if (on(c)) {
      return true;
    }
  }
  return false;
}

// Whether `text` nests arrays and objects deeper than `max_depth`.
inline bool json_nests_deeper_than(std::string_view text, int max_depth) {
  int depth = 0;
  return any_outside_json_strings(text, [&](char c) {
    if (c == '[' || c == '{') return ++depth > max_depth;
    if (c == ']' || c == '}') --depth;
    return false;
  });
}

// Whether `text` has an object of more than `max_members` members (call it
// on a text json_nests_deeper_than has passed, whose depth bounds what this
// keeps). nlohmann's ordered_json finds each key of an object by a linear
// search as it parses, so an object of n members costs n^2 / 2
// comparisons: 8 MiB of short keys, hours.
inline bool json_object_wider_than(std::string_view text, size_t max_members) {
  // Per open container: its members so far, or SIZE_MAX for an array.
  std::vector<size_t> open;
  return any_outside_json_strings(text, [&](char c) {
    if (c == '{') {
      open.push_back(0);
    } else if (c == '[') {
      open.push_back(SIZE_MAX);
    } else if (c == ']' || c == '}') {
      if (!open.empty()) open.pop_back();
    } else if (c == ':' && !open.empty() && open.back() != SIZE_MAX) {
      return ++open.back() > max_members;
    }
    return false;
  });
}

// The lists and objects `text` opens. Each parsed one takes an allocation of
// its own beside its value's 16 bytes: "{}," is three bytes of text and
// some 64 parsed, so a body's byte limit alone bounds what its parse takes
// only loosely (and a chat body is held parsed several times over).
inline size_t json_containers(std::string_view text) {
  size_t containers = 0;
  any_outside_json_strings(text, [&](char c) {
    containers += c == '[' || c == '{';
    return false;
  });
  return containers;
}

}  // namespace baton
