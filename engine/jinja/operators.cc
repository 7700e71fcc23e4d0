#include "engine/jinja/operators.h"

#include <cmath>
#include <cstdio>

#include "engine/jinja/python_text.h"

namespace baton::jinja {
namespace {

Status unsupported(std::string_view op, const Value& a, const Value& b) {
  return invalid_argument("unsupported operand type(s) for " + std::string(op) + ": '" +
                          type_name(a) + "' and '" + type_name(b) + "'");
}

Result<Value> repeat(const Value& seq, int64_t times) {
  if (times < 0) times = 0;
  if (seq.is_string()) {
    // Divided, not multiplied: a count near 2^62 would overflow the product.
    if (times > 0 && int64_t(seq.as_string().size()) > kMaxBuiltSize / times) {
      return resource_exhausted("repeated string too long");
    }
    std::string out;
    for (int64_t i = 0; i < times; ++i) out += seq.as_string();
    return seq.is_markup() ? Value::markup(std::move(out)) : Value::string(std::move(out));
  }
  const auto& items = seq.list_data().items;
  if (times > 0 && int64_t(items.size()) > kMaxBuiltSize / times) {
    return resource_exhausted("repeated list too long");
  }
  std::vector<Value> out;
  for (int64_t i = 0; i < times; ++i) out.insert(out.end(), items.begin(), items.end());
  return seq.list_data().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

double python_fmod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

}  // namespace

Result<int64_t> float_to_integer(double x) {
  if (std::isnan(x)) return invalid_argument("cannot convert float NaN to integer");
  // 2^63 is exact as a double; every double below it and at least -2^63 fits.
  if (!(x < 9223372036854775808.0 && x >= -9223372036854775808.0))
    return out_of_range("integer overflow");
  return int64_t(x);
}

Result<Value> negate(const Value& v) {
  if (v.is_float()) return Value::floating(-v.as_double());
  if (v.is_number()) {
    if (v.as_int() == INT64_MIN) return out_of_range("integer overflow");
    return Value::integer(-v.as_int());
  }
  return invalid_argument("bad operand type for unary -: '" + type_name(v) + "'");
}

Result<Value> arithmetic(std::string_view op, const Value& a, const Value& b) {
  const bool numbers = a.is_number() && b.is_number();
  const bool any_float = a.is_float() || b.is_float();
  if (op == "+") {
    if (numbers) {
      if (any_float) return Value::floating(a.as_double() + b.as_double());
      int64_t r;
      if (__builtin_add_overflow(a.as_int(), b.as_int(), &r))
        return out_of_range("integer overflow");
      return Value::integer(r);
    }
    if (a.is_string() && b.is_string()) {
      if (a.is_markup() || b.is_markup()) {
        return Value::markup(escape_markup(a).as_string() + escape_markup(b).as_string());
      }
      return Value::string(a.as_string() + b.as_string());
    }
    if (a.is_sequence() && b.is_sequence() && a.list_data().is_tuple == b.list_data().is_tuple) {
      if (int64_t(a.list_data().items.size() + b.list_data().items.size()) > kMaxBuiltSize) {
        return resource_exhausted("concatenated list too long");
      }
      std::vector<Value> items = a.list_data().items;
      items.insert(items.end(), b.list_data().items.begin(), b.list_data().items.end());
      return a.list_data().is_tuple ? Value::tuple(std::move(items))
                                    : Value::list(std::move(items));
    }
    return unsupported(op, a, b);
  }
  if (op == "*") {
    if (numbers) {
      if (any_float) return Value::floating(a.as_double() * b.as_double());
      int64_t r;
      if (__builtin_mul_overflow(a.as_int(), b.as_int(), &r))
        return out_of_range("integer overflow");
      return Value::integer(r);
    }
    if ((a.is_string() || a.is_sequence()) && (b.is_int() || b.is_bool()))
      return repeat(a, b.as_int());
    if ((b.is_string() || b.is_sequence()) && (a.is_int() || a.is_bool()))
      return repeat(b, a.as_int());
    return unsupported(op, a, b);
  }
  if (op == "%" && a.is_string()) {
    if (!a.is_markup()) {
      BATON_ASSIGN_OR_RETURN(std::string text, printf_format(a.as_string(), b));
      return Value::string(std::move(text));
    }
    // Markup % args escapes the string arguments.
    Value escaped = b;
    if (b.is_string()) {
      escaped = escape_markup(b);
    } else if (b.is_sequence() && b.list_data().is_tuple) {
      std::vector<Value> items = b.list_data().items;
      for (Value& item : items) {
        if (item.is_string()) item = escape_markup(item);
      }
      escaped = Value::tuple(std::move(items));
    }
    BATON_ASSIGN_OR_RETURN(std::string text, printf_format(a.as_string(), escaped));
    return Value::markup(std::move(text));
  }
  if (!numbers) return unsupported(op, a, b);
  if (op == "-") {
    if (any_float) return Value::floating(a.as_double() - b.as_double());
    int64_t r;
    if (__builtin_sub_overflow(a.as_int(), b.as_int(), &r)) return out_of_range("integer overflow");
    return Value::integer(r);
  }
  if (op == "/") {
    if (b.as_double() == 0) return invalid_argument("division by zero");
    return Value::floating(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (b.as_double() == 0) return invalid_argument("integer division or modulo by zero");
    if (any_float) {
      const double x = a.as_double(), y = b.as_double();
      return Value::floating(op == "//" ? std::floor(x / y) : python_fmod(x, y));
    }
    const int64_t x = a.as_int(), y = b.as_int();
    if (x == INT64_MIN && y == -1) return out_of_range("integer overflow");
    const int64_t q = floor_div(x, y);
    return Value::integer(op == "//" ? q : x - q * y);
  }
  if (op == "**") {
    if (!any_float && b.as_int() >= 0) {
      // By squaring: an exponent of 10**18 takes 60 steps, not 10**18.
      // A square that overflows while exponent bits remain makes the result
      // overflow too (|result| >= 1 then).
      int64_t result = 1, base = a.as_int();
      for (int64_t e = b.as_int(); e > 0;) {
        if ((e & 1) && __builtin_mul_overflow(result, base, &result))
          return out_of_range("integer overflow");
        e >>= 1;
        if (e > 0 && __builtin_mul_overflow(base, base, &base))
          return out_of_range("integer overflow");
      }
      return Value::integer(result);
    }
    return Value::floating(std::pow(a.as_double(), b.as_double()));
  }
  return unsupported(op, a, b);
}

Result<bool> contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        return invalid_argument("'in <string>' requires string as left operand, not " +
                                type_name(item));
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list_data().items) {
        if (equal(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return container.dict_data().find(item) != nullptr;
    default:
      return invalid_argument("argument of type '" + type_name(container) + "' is not iterable");
  }
}

// snprintf into a string of the length it needs (widths are bounded above).
template <typename T>
std::string formatted(const std::string& spec, T value) {
  const int n = std::snprintf(nullptr, 0, spec.c_str(), value);
  if (n <= 0) return {};
  std::string text(size_t(n), '\0');
  std::snprintf(text.data(), size_t(n) + 1, spec.c_str(), value);
  return text;
}

Result<std::string> printf_format(const std::string& format, const Value& args) {
  std::vector<Value> positional;
  if (args.is_list() && args.list_data().is_tuple) {
    positional = args.list_data().items;
  } else if (!args.is_dict()) {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%') {
      out += format[i];
      continue;
    }
    if (++i >= format.size()) return invalid_argument("incomplete format");
    if (format[i] == '%') {
      out += '%';
      continue;
    }
    Value arg;
    if (format[i] == '(') {
      const size_t close = format.find(')', i);
      if (close == std::string::npos || !args.is_dict())
        return invalid_argument("format requires a mapping");
      const Value* found =
          args.dict_data().find(Value::string(format.substr(i + 1, close - i - 1)));
      if (found == nullptr) return invalid_argument("format key not found");
      arg = *found;
      i = close + 1;
    }
    std::string spec = "%";
    while (i < format.size() &&
           std::string_view("-+ #0").find(format[i]) != std::string_view::npos) {
      spec += format[i++];
    }
    // Width and precision: digits, each at most a bound's worth (longer
    // would build past it, or past what snprintf can count).
    const auto digits = [&]() -> Status {
      std::string number;
      while (i < format.size() && std::isdigit(static_cast<unsigned char>(format[i])))
        number += format[i++];
      if (number.size() > 8 || (!number.empty() && std::stoll(number) > kMaxBuiltSize)) {
        return resource_exhausted("a format width or precision of " + number +
                                  " would build more than " + std::to_string(kMaxBuiltSize) +
                                  " characters");
      }
      spec += number;
      return Status::ok();
    };
    BATON_RETURN_IF_ERROR(digits());
    if (i < format.size() && format[i] == '.') {
      spec += format[i++];
      BATON_RETURN_IF_ERROR(digits());
    }
    if (i >= format.size()) return invalid_argument("incomplete format");
    const char type = format[i];
    if (arg.is_undefined()) {
      if (next >= positional.size())
        return invalid_argument("not enough arguments for format string");
      arg = positional[next++];
    }
    if (type == 's' || type == 'r' || type == 'a') {
      const std::string text = type == 's' ? to_str(arg) : to_repr(arg);
      out += formatted(spec + "s", text.c_str());
      continue;
    }
    if (!arg.is_number()) {
      std::string message = "%";
      message.append(1, type)
          .append(" format: a real number is required, not ")
          .append(type_name(arg));
      return invalid_argument(std::move(message));
    }
    if (type == 'd' || type == 'i' || type == 'x' || type == 'X' || type == 'o' || type == 'c') {
      int64_t v = 0;
      if (arg.is_float()) {
        BATON_ASSIGN_OR_RETURN(v, float_to_integer(arg.as_double()));
      } else {
        v = arg.as_int();
      }
      if (type == 'c') {
        std::string ch;
        python_text::from_code_points({uint32_t(v)}, 0, 1).swap(ch);
        out += ch;
        continue;
      }
      const std::string with_type = spec + "ll" + (type == 'i' ? 'd' : type);
      out += formatted(with_type, static_cast<long long>(v));
    } else if (std::string_view("feEgGF").find(type) != std::string_view::npos) {
      out += formatted(spec + type, arg.as_double());
    } else {
      return invalid_argument("unsupported format character '" + std::string(1, type) + "'");
    }
  }
  if (next < positional.size() && !(args.is_dict())) {
    return invalid_argument("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace baton::jinja
