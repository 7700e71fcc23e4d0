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
// int(x) of a float, truncated as Python does; a value past int64's range
// (which Python would hold in a big integer), or not finite, is an error.
Result<int64_t> float_to_integer(double x);
// "%s and %d" % args, as Python formats it (flags, width, precision; s r d i f e g x o c %).
Result<std::string> printf_format(const std::string& format, const Value& args);

}  // namespace baton::jinja
