// engine/jinja/builtins.h — what templates call by name: Jinja2's filters and
// tests (with transformers' tojson), the methods of Python's str, list and
// dict that transformers' immutable sandbox allows, and the globals
// (range, namespace, dict, raise_exception, strftime_now).
#pragma once

#include <string>
#include <string_view>

#include "engine/jinja/value.h"

namespace baton::jinja {

bool is_known_filter(std::string_view name);
bool is_known_test(std::string_view name);
bool is_known_method(std::string_view name);

Result<Value> apply_filter(Interpreter& interpreter, std::string_view name, const Value& operand,
                           CallArgs& args);
Result<bool> apply_test(Interpreter& interpreter, std::string_view name, const Value& operand,
                        CallArgs& args);
// obj.name as Jinja2 looks it up: a method of obj's type (bound), else an
// item of a dict, else Undefined.
Value get_attribute(const Value& obj, const std::string& name);
// obj[key]; Undefined when missing.
Value get_item(const Value& obj, const Value& key);

// The globals every template sees; `now` is the Unix time strftime_now formats.
Value make_globals(int64_t now_seconds);

// The items a for loop visits: a list's items, a dict's keys, a string's
// characters; Undefined visits nothing.
Result<std::vector<Value>> iterate(const Value& v);

}  // namespace baton::jinja
