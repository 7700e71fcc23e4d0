#include "engine/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "engine/utf8.h"

namespace baton::jinja {

const Value* Value::DictData::find(const Value& key) const {
  for (const auto& [k, v] : entries) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}

Value* Value::DictData::find(const Value& key) {
  for (auto& [k, v] : entries) {
    if (equal(k, key)) return &v;
  }
  return nullptr;
}

void Value::Contents::note(const Value& item) {
  nesting = std::max(nesting, nesting_of(item) + 1);
  holds_namespace = holds_namespace || jinja::holds_namespace(item);
}

int nesting_of(const Value& v) {
  if (v.is_list()) return v.list_data().contents.nesting;
  if (v.is_dict()) return v.dict_data().contents.nesting;
  if (v.is_callable()) return v.callable_data().contents.nesting;
  return 0;
}

bool holds_namespace(const Value& v) {
  if (v.is_list()) return v.list_data().contents.holds_namespace;
  if (v.is_dict()) return v.dict_data().is_namespace || v.dict_data().contents.holds_namespace;
  if (v.is_callable()) return v.callable_data().contents.holds_namespace;
  return false;
}

Status check_storable(const Value& v, bool in_namespace) {
  if (in_namespace && holds_namespace(v)) {
    return invalid_argument("a namespace cannot hold a namespace");
  }
  if (nesting_of(v) + (in_namespace ? 1 : 0) > kMaxValueNesting) {
    return resource_exhausted("values nested more than " + std::to_string(kMaxValueNesting) +
                              " lists or dicts deep");
  }
  return Status::ok();
}

void Value::DictData::set(Value key, Value value) {
  contents.note(key);
  contents.note(value);
  if (Value* existing = find(key)) {
    *existing = std::move(value);
  } else {
    entries.emplace_back(std::move(key), std::move(value));
  }
}

const std::string& Value::empty_string() {
  static const std::string empty;
  return empty;
}

Value Value::undefined(std::string hint) {
  Value v;
  if (!hint.empty()) v.s_ = std::make_shared<const std::string>(std::move(hint));
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.b_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.i_ = i;
  return v;
}

Value Value::floating(double f) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.f_ = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.s_ = std::make_shared<const std::string>(std::move(s));
  return v;
}

Value Value::markup(std::string s) {
  Value v = string(std::move(s));
  v.markup_ = true;
  return v;
}

Value Value::list(std::vector<Value> items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<ListData>();
  for (const Value& item : items) v.list_->contents.note(item);
  v.list_->items = std::move(items);
  return v;
}

Value Value::tuple(std::vector<Value> items) {
  Value v = list(std::move(items));
  v.list_->is_tuple = true;
  return v;
}

Value Value::iterator(std::vector<Value> items, std::string type) {
  Value v = list(std::move(items));
  v.list_->lazy = ListData::Lazy::kIterator;
  v.list_->lazy_type = std::move(type);
  return v;
}

Value Value::view(std::vector<Value> items, std::string type) {
  Value v = list(std::move(items));
  v.list_->lazy = ListData::Lazy::kView;
  v.list_->lazy_type = std::move(type);
  return v;
}

Value Value::dict() {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<DictData>();
  return v;
}

Value Value::namespace_object() {
  Value v = dict();
  v.dict_->is_namespace = true;
  return v;
}

Value Value::callable(std::string name, Function call, const Value* holds) {
  Value v;
  v.kind_ = Kind::kCallable;
  CallableData data{std::move(name), std::move(call), {}};
  if (holds != nullptr) data.contents.note(*holds);
  v.callable_ = std::make_shared<const CallableData>(std::move(data));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  using Type = nlohmann::ordered_json::value_t;
  switch (json.type()) {
    case Type::boolean:
      return boolean(json.get<bool>());
    case Type::number_integer:
      return integer(json.get<int64_t>());
    case Type::number_unsigned: {
      const auto u = json.get<uint64_t>();
      return u <= uint64_t(INT64_MAX) ? integer(int64_t(u)) : floating(double(u));
    }
    case Type::number_float:
      return floating(json.get<double>());
    case Type::string:
      return string(json.get<std::string>());
    case Type::array: {
      std::vector<Value> items;
      items.reserve(json.size());
      for (const auto& item : json) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case Type::object: {
      Value d = dict();
      for (const auto& [key, item] : json.items()) {
        Value value = from_json(item);
        d.dict_->contents.note(value);
        d.dict_->entries.emplace_back(string(key), std::move(value));
      }
      return d;
    }
    default:
      return none();
  }
}

std::string type_name(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      if (v.is_lazy()) return v.list_data().lazy_type;
      return v.list_data().is_tuple ? "tuple" : "list";
    case Value::Kind::kDict:
      return v.dict_data().is_namespace ? "Namespace" : "dict";
    case Value::Kind::kCallable:
      return "function";
  }
  return "object";
}

std::string quoted_type(const Value& v) {
  std::string out = "'";
  out += type_name(v);
  out += '\'';
  return out;
}

bool truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
      return v.as_bool();
    case Value::Kind::kInt:
      return v.as_int() != 0;
    case Value::Kind::kFloat:
      return v.as_double() != 0;
    case Value::Kind::kString:
      return !v.as_string().empty();
    case Value::Kind::kList:
      return v.is_iterator() || !v.list_data().items.empty();
    case Value::Kind::kDict:
      return v.dict_data().is_namespace || !v.dict_data().entries.empty();
    case Value::Kind::kCallable:
      return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      const auto& x = a.list_data();
      const auto& y = b.list_data();
      if (a.is_lazy() || b.is_lazy()) return &x == &y;
      if (x.is_tuple != y.is_tuple || x.items.size() != y.items.size()) return false;
      for (size_t i = 0; i < x.items.size(); ++i) {
        if (!equal(x.items[i], y.items[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      const auto& x = a.dict_data();
      const auto& y = b.dict_data();
      if (x.is_namespace || y.is_namespace) return &x == &y;
      if (x.entries.size() != y.entries.size()) return false;
      for (const auto& [k, v] : x.entries) {
        const Value* other = y.find(k);
        if (other == nullptr || !equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kCallable:
      return &a.callable_data() == &b.callable_data();
    default:
      return false;
  }
}

Result<int> compare(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) {
      const double x = a.as_double(), y = b.as_double();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = a.as_int(), y = b.as_int();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const int c = a.as_string().compare(b.as_string());
    return c < 0 ? -1 : c > 0 ? 1 : 0;
  }
  if (a.is_sequence() && b.is_sequence() && a.list_data().is_tuple == b.list_data().is_tuple) {
    const auto& x = a.list_data().items;
    const auto& y = b.list_data().items;
    for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
      if (equal(x[i], y[i])) continue;
      return compare(x[i], y[i]);
    }
    return x.size() < y.size() ? -1 : x.size() > y.size() ? 1 : 0;
  }
  return invalid_argument("'<' not supported between instances of '" + type_name(a) + "' and '" +
                          type_name(b) + "'");
}

std::string format_float(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  char buffer[64];
  auto [end, ec] = std::to_chars(buffer, buffer + sizeof(buffer), f, std::chars_format::scientific);
  std::string_view sci(buffer, size_t(end - buffer));
  std::string sign;
  if (sci.front() == '-') {
    sign = "-";
    sci.remove_prefix(1);
  }
  const size_t e = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e)) {
    if (c != '.') digits.push_back(c);
  }
  int exponent = 0;
  std::from_chars(sci.data() + e + (sci[e + 1] == '+' ? 2 : 1), sci.data() + sci.size(), exponent);
  while (digits.size() > 1 && digits.back() == '0') digits.pop_back();
  std::string out = sign;
  if (exponent >= -4 && exponent < 16) {
    if (exponent >= 0) {
      if (digits.size() <= size_t(exponent) + 1) digits.resize(size_t(exponent) + 1, '0');
      out += digits.substr(0, size_t(exponent) + 1);
      std::string fraction = digits.substr(size_t(exponent) + 1);
      out += "." + (fraction.empty() ? std::string("0") : fraction);
    } else {
      out += "0." + std::string(size_t(-exponent - 1), '0') + digits;
    }
    return out;
  }
  out += digits.substr(0, 1);
  if (digits.size() > 1) out += "." + digits.substr(1);
  char exp_text[16];
  std::snprintf(exp_text, sizeof(exp_text), "e%c%02d", exponent < 0 ? '-' : '+',
                std::abs(exponent));
  return out + exp_text;
}

namespace {

// Characters Python's str.isprintable() refuses, beyond the C0/C1 controls:
// separators other than the space and the common format characters.
bool python_unprintable(uint32_t cp) {
  if (cp < 0x20 || (cp >= 0x7F && cp <= 0xA0)) return true;
  return cp == 0xAD || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200F) ||
         (cp >= 0x2028 && cp <= 0x202F) || (cp >= 0x205F && cp <= 0x2064) ||
         (cp >= 0x2066 && cp <= 0x206F) || cp == 0x3000 || cp == 0xFEFF ||
         (cp >= 0xD800 && cp <= 0xDFFF) || (cp >= 0xE000 && cp <= 0xF8FF) ||
         (cp >= 0xFFF9 && cp <= 0xFFFB) || cp == 0x061C || cp == 0x180E;
}

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (size_t i = 0; i < s.size();) {
    const size_t n = engine::utf8::length_at(s, i);
    const uint32_t cp = engine::utf8::decode_at(s, i, n);
    char escape[16];
    if (cp == '\\') {
      out += "\\\\";
    } else if (cp == uint32_t(quote)) {
      out += '\\';
      out += quote;
    } else if (cp == '\n') {
      out += "\\n";
    } else if (cp == '\r') {
      out += "\\r";
    } else if (cp == '\t') {
      out += "\\t";
    } else if (python_unprintable(cp)) {
      if (cp < 0x100) {
        std::snprintf(escape, sizeof(escape), "\\x%02x", cp);
      } else {
        std::snprintf(escape, sizeof(escape), "\\u%04x", cp);
      }
      out += escape;
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  out += quote;
  return out;
}

}  // namespace

std::string to_repr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kString:
      return repr_string(v.as_string());
    case Value::Kind::kList: {
      const auto& data = v.list_data();
      if (v.is_iterator()) return "<" + data.lazy_type + " object>";
      if (v.is_lazy()) {
        std::string out = data.lazy_type + "([";
        for (size_t i = 0; i < data.items.size(); ++i) {
          if (i > 0) out += ", ";
          out += to_repr(data.items[i]);
        }
        return out + "])";
      }
      std::string out = data.is_tuple ? "(" : "[";
      for (size_t i = 0; i < data.items.size(); ++i) {
        if (i > 0) out += ", ";
        out += to_repr(data.items[i]);
      }
      if (data.is_tuple && data.items.size() == 1) out += ",";
      return out + (data.is_tuple ? ")" : "]");
    }
    case Value::Kind::kDict: {
      const auto& data = v.dict_data();
      std::string out = data.is_namespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [key, item] : data.entries) {
        if (!first) out += ", ";
        first = false;
        out += to_repr(key) + ": " + to_repr(item);
      }
      return out + (data.is_namespace ? "}>" : "}");
    }
    case Value::Kind::kUndefined:
      return "Undefined";
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.as_bool() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.as_int());
    case Value::Kind::kFloat:
      return format_float(v.as_double());
    case Value::Kind::kString:
      return v.as_string();
    case Value::Kind::kCallable:
      return "<function " + v.callable_data().name + ">";
    default:
      return to_repr(v);
  }
}

std::string html_escape(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

Value escape_markup(const Value& v) {
  if (v.is_markup()) return v;
  return Value::markup(html_escape(to_str(v)));
}

namespace {

void json_string(const std::string& s, bool ensure_ascii, std::string& out) {
  out += '"';
  for (size_t i = 0; i < s.size();) {
    const size_t n = engine::utf8::length_at(s, i);
    const uint32_t cp = engine::utf8::decode_at(s, i, n);
    char escape[16];
    switch (cp) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const uint32_t u = cp - 0x10000;
            std::snprintf(escape, sizeof(escape), "\\u%04x\\u%04x", 0xD800 + (u >> 10),
                          0xDC00 + (u & 0x3FF));
          } else {
            std::snprintf(escape, sizeof(escape), "\\u%04x", cp);
          }
          out += escape;
        } else {
          out.append(s, i, n);
        }
    }
    i += n;
  }
  out += '"';
}

Result<std::string> json_key(const Value& key) {
  switch (key.kind()) {
    case Value::Kind::kString:
      return key.as_string();
    case Value::Kind::kInt:
      return std::to_string(key.as_int());
    case Value::Kind::kFloat:
      return format_float(key.as_double());
    case Value::Kind::kBool:
      return std::string(key.as_bool() ? "true" : "false");
    case Value::Kind::kNone:
      return std::string("null");
    default:
      return invalid_argument("keys must be str, int, float, bool or None, not " + type_name(key));
  }
}

Status json_value(const Value& v, const JsonStyle& style, int depth, std::string& out) {
  if (depth > 128) return invalid_argument("tojson: nesting deeper than 128");
  // Checked as the text grows, indents included (an indent of millions of
  // characters at every level): past the bound, no more is built.
  if (int64_t(out.size()) > kMaxBuiltSize) {
    return resource_exhausted("tojson would build more than " + std::to_string(kMaxBuiltSize) +
                              " characters");
  }
  const auto newline = [&](int level) {
    if (!style.indent) return;
    if (int64_t(out.size() + 1 + size_t(level) * style.indent->size()) > kMaxBuiltSize) {
      out.resize(size_t(kMaxBuiltSize) + 1, ' ');  // refused at the next check
      return;
    }
    out += '\n';
    for (int i = 0; i < level; ++i) out += *style.indent;
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return Status::ok();
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return Status::ok();
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return Status::ok();
    case Value::Kind::kFloat: {
      const double f = v.as_double();
      out += std::isnan(f)   ? "NaN"
             : std::isinf(f) ? (f < 0 ? "-Infinity" : "Infinity")
                             : format_float(f);
      return Status::ok();
    }
    case Value::Kind::kString:
      json_string(v.as_string(), style.ensure_ascii, out);
      return Status::ok();
    case Value::Kind::kList: {
      if (v.is_lazy()) break;
      const auto& items = v.list_data().items;
      if (items.empty()) {
        out += "[]";
        return Status::ok();
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(depth + 1);
        BATON_RETURN_IF_ERROR(json_value(items[i], style, depth + 1, out));
      }
      newline(depth);
      out += ']';
      return Status::ok();
    }
    case Value::Kind::kDict: {
      if (v.dict_data().is_namespace) break;
      std::vector<std::pair<std::string, const Value*>> entries;
      for (const auto& [key, item] : v.dict_data().entries) {
        BATON_ASSIGN_OR_RETURN(std::string text, json_key(key));
        entries.emplace_back(std::move(text), &item);
      }
      if (entries.empty()) {
        out += "{}";
        return Status::ok();
      }
      if (style.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](const auto& a, const auto& b) { return a.first < b.first; });
      }
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i > 0) out += style.item_separator;
        newline(depth + 1);
        json_string(entries[i].first, style.ensure_ascii, out);
        out += style.key_separator;
        BATON_RETURN_IF_ERROR(json_value(*entries[i].second, style, depth + 1, out));
      }
      newline(depth);
      out += '}';
      return Status::ok();
    }
    default:
      break;
  }
  return invalid_argument("Object of type " + type_name(v) + " is not JSON serializable");
}

}  // namespace

Result<std::string> to_json(const Value& v, const JsonStyle& style) {
  std::string out;
  BATON_RETURN_IF_ERROR(json_value(v, style, 0, out));
  if (int64_t(out.size()) > kMaxBuiltSize) {
    return resource_exhausted("tojson would build more than " + std::to_string(kMaxBuiltSize) +
                              " characters");
  }
  return out;
}

}  // namespace baton::jinja
