// engine/jinja/operators.h — Python's arithmetic and membership on template
// values: + - * / // % ** with ints, floats, strings and lists, `in`, and
// the printf-style `str % args`.
#pragma once

#include <string_view>

#include "engine/jinja/value.h"

namespace baton::jinja {

Result<Value> arithmetic(std::string_view op, const Value& a, const Value& b);
Result<bool> contains(const Value& container, const Value& item);
Result<Value> negate(const Value& v);
// "%s and %d" % args, as Python formats it (flags, width, precision; s r d i f e g x o c %).
Result<std::string> printf_format(const std::string& format, const Value& args);

}  // namespace baton::jinja
