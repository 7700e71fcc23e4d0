#include "engine/jinja/builtins.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>

#include "engine/jinja/interpreter.h"
#include "engine/jinja/operators.h"
#include "engine/jinja/python_text.h"

namespace baton::jinja {
namespace {

// A result past kMaxBuiltSize, refused before it is built.
Status too_large(const std::string& what, int64_t size) {
  return resource_exhausted(what + " would build " + std::to_string(size) +
                            " characters; a template may build at most " +
                            std::to_string(kMaxBuiltSize));
}

using python_text::Side;

// python_text::replace, refused before it is built past kMaxBuiltSize.
Result<std::string> bounded_replace(const std::string& self, const std::string& old_text,
                                    const std::string& new_text, int64_t count,
                                    const std::string& what) {
  int64_t matches = 0;
  if (old_text.empty()) {
    matches = int64_t(python_text::length(self)) + 1;
  } else {
    for (size_t at = self.find(old_text); at != std::string::npos;
         at = self.find(old_text, at + old_text.size()))
      ++matches;
  }
  if (count >= 0) matches = std::min(matches, count);
  const int64_t grows = int64_t(new_text.size()) - int64_t(old_text.size());
  const double size = double(self.size()) + double(matches) * double(grows);
  if (size > double(kMaxBuiltSize)) return too_large(what, int64_t(size));
  return python_text::replace(self, old_text, new_text, count);
}

constexpr int64_t kMaxRange = 100'000;  // Jinja2's sandbox refuses longer ranges

constexpr auto kFilters = std::to_array<std::string_view>(
    {"abs",       "attr",     "batch",  "capitalize", "center",     "count",      "d",
     "default",   "dictsort", "e",      "escape",     "first",      "float",      "format",
     "indent",    "int",      "items",  "join",       "last",       "length",     "list",
     "lower",     "map",      "max",    "min",        "reject",     "rejectattr", "replace",
     "reverse",   "round",    "safe",   "select",     "selectattr", "sort",       "string",
     "sum",       "title",    "tojson", "trim",       "unique",     "upper",      "wordcount",
     "striptags", "truncate"});

constexpr auto kTests = std::to_array<std::string_view>(
    {"boolean",  "callable", "defined", "divisibleby", "eq",   "equalto",   "==",     "escaped",
     "even",     "false",    "filter",  "float",       "ge",   ">=",        "gt",     "greaterthan",
     ">",        "in",       "integer", "iterable",    "le",   "<=",        "lower",  "lt",
     "lessthan", "<",        "mapping", "ne",          "!=",   "none",      "number", "odd",
     "sameas",   "sequence", "string",  "test",        "true", "undefined", "upper"});

// The methods of each type that templates call and the sandbox allows.
constexpr auto kStringMethods = std::to_array<std::string_view>(
    {"strip",        "lstrip",   "rstrip",    "split",     "rsplit",    "splitlines",
     "startswith",   "endswith", "replace",   "upper",     "lower",     "title",
     "capitalize",   "swapcase", "find",      "rfind",     "index",     "count",
     "join",         "format",   "isdigit",   "isalpha",   "isalnum",   "isspace",
     "islower",      "isupper",  "isnumeric", "isdecimal", "zfill",     "removeprefix",
     "removesuffix", "ljust",    "rjust",     "center",    "partition", "rpartition"});
constexpr auto kListMethods = std::to_array<std::string_view>({"index", "count", "copy"});
constexpr auto kDictMethods =
    std::to_array<std::string_view>({"items", "keys", "values", "get", "copy"});

template <size_t N>
bool contains_name(const std::array<std::string_view, N>& names, std::string_view name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

// A builtin's parameters bound from positional and keyword arguments;
// Undefined marks one not given.
Result<std::vector<Value>> bind(std::string_view function, CallArgs& args,
                                std::initializer_list<std::string_view> params) {
  std::vector<Value> out(params.size());
  if (args.positional.size() > params.size()) {
    return invalid_argument(std::string(function) + "() takes at most " +
                            std::to_string(params.size()) + " argument(s), " +
                            std::to_string(args.positional.size()) + " given");
  }
  for (size_t i = 0; i < args.positional.size(); ++i) out[i] = args.positional[i];
  for (auto& [name, value] : args.keyword) {
    const auto it = std::find(params.begin(), params.end(), name);
    if (it == params.end()) {
      return invalid_argument(std::string(function) + "() got an unexpected keyword argument '" +
                              name + "'");
    }
    out[size_t(it - params.begin())] = value;
  }
  return out;
}

Result<std::optional<std::string>> optional_string(const Value& v, std::string_view what) {
  if (v.is_undefined() || v.is_none()) return std::optional<std::string>();
  if (!v.is_string()) return invalid_argument(std::string(what) + " must be a string");
  return std::optional<std::string>(v.as_string());
}

Result<int64_t> int_or(const Value& v, int64_t fallback, std::string_view what) {
  if (v.is_undefined() || v.is_none()) return fallback;
  if (!v.is_int() && !v.is_bool())
    return invalid_argument(std::string(what) + " must be an integer");
  return v.as_int();
}

std::vector<Value> strings(const std::vector<std::string>& parts) {
  std::vector<Value> out;
  out.reserve(parts.size());
  for (const auto& p : parts) out.push_back(Value::string(p));
  return out;
}

// Jinja2's attribute getter for filters: "a.b.0" looks up item by item.
Value attribute_path(const Value& obj, const Value& path) {
  if (!path.is_string()) return get_item(obj, path);
  Value v = obj;
  for (const std::string& part : python_text::split(path.as_string(), std::string("."), -1)) {
    int64_t index = 0;
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), index);
    const bool integer = !part.empty() && ec == std::errc() && end == part.data() + part.size();
    v = get_item(v, integer ? Value::integer(index) : Value::string(part));
  }
  return v;
}

// Sort key of Jinja2's sort, min, max and dictsort: strings lowered unless
// case sensitive.
Value sort_key(const Value& v, bool case_sensitive) {
  if (!case_sensitive && v.is_string()) return Value::string(python_text::lower(v.as_string()));
  return v;
}

Status sort_values(std::vector<Value>& items, const std::function<Value(const Value&)>& key,
                   bool reverse) {
  Status status;
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) keyed.emplace_back(key(item), std::move(item));
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& b) {
    if (!status.is_ok()) return false;
    Result<int> c = compare(a.first, b.first);
    if (!c.is_ok()) {
      status = c.status();
      return false;
    }
    return reverse ? *c > 0 : *c < 0;
  });
  items.clear();
  for (auto& [k, v] : keyed) items.push_back(std::move(v));
  return status;
}

// A string result of the same kind (Markup or str) as `like`.
Value same_kind(const Value& like, std::string s) {
  return like.is_markup() ? Value::markup(std::move(s)) : Value::string(std::move(s));
}

// Jinja2's wordcount: runs of word characters (\w: letters, digits, '_').
int64_t word_count(const std::string& s) {
  const auto word = [](uint32_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           (c >= 0xC0 && c <= 0x24F && c != 0xD7 && c != 0xF7) || (c >= 0x370 && c <= 0x52F) ||
           (c >= 0x3040 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7AF);
  };
  int64_t n = 0;
  bool in_word = false;
  for (uint32_t c : python_text::code_points(s)) {
    if (word(c) && !in_word) ++n;
    in_word = word(c);
  }
  return n;
}

// Jinja2's title filter, which is not str.title: words begin after runs of
// '-', white space, '(', '{', '[' or '<'; each word's first character is
// upper-cased and the rest lower-cased.
std::string jinja_title(const std::string& s) {
  const std::vector<uint32_t> cps = python_text::code_points(s);
  const auto separator = [](uint32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || python_text::is_space(c);
  };
  std::string out;
  for (size_t i = 0; i < cps.size();) {
    size_t j = i;
    const bool sep = separator(cps[i]);
    while (j < cps.size() && separator(cps[j]) == sep) ++j;
    out += python_text::upper(python_text::from_code_points(cps, i, i + 1));
    out += python_text::lower(python_text::from_code_points(cps, i + 1, j));
    i = j;
  }
  return out;
}

Result<std::string> python_str_format(const std::string& format, const CallArgs& args) {
  std::string out;
  size_t next = 0;
  for (size_t i = 0; i < format.size(); ++i) {
    const char c = format[i];
    if (c == '}' && i + 1 < format.size() && format[i + 1] == '}') {
      out += '}';
      ++i;
      continue;
    }
    if (c != '{') {
      out += c;
      continue;
    }
    if (i + 1 < format.size() && format[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = format.find('}', i);
    if (close == std::string::npos)
      return invalid_argument("Single '{' encountered in format string");
    std::string field = format.substr(i + 1, close - i - 1);
    i = close;
    std::string spec;
    if (const size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    char conversion = 's';
    if (field.size() >= 2 && field[field.size() - 2] == '!') {
      conversion = field.back();
      field.resize(field.size() - 2);
    }
    Value arg;
    if (field.empty()) {
      if (next >= args.positional.size()) return invalid_argument("Replacement index out of range");
      arg = args.positional[next++];
    } else if (std::all_of(field.begin(), field.end(), ::isdigit)) {
      size_t index = 0;
      const auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), index);
      if (ec != std::errc() || index >= args.positional.size())
        return invalid_argument("Replacement index out of range");
      arg = args.positional[index];
    } else {
      const auto it = std::find_if(args.keyword.begin(), args.keyword.end(),
                                   [&](const auto& kw) { return kw.first == field; });
      if (it == args.keyword.end()) return invalid_argument("KeyError: '" + field + "'");
      arg = it->second;
    }
    if (!spec.empty()) return invalid_argument("unsupported format spec ':" + spec + "'");
    out += conversion == 'r' ? to_repr(arg) : to_str(arg);
  }
  return out;
}

Result<Value> string_method(const std::string& self, const std::string& name, CallArgs& args) {
  using python_text::code_points;
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"chars"}));
    BATON_ASSIGN_OR_RETURN(auto chars, optional_string(p[0], "chars"));
    const Side side = name == "strip" ? Side::kBoth : name == "lstrip" ? Side::kLeft : Side::kRight;
    return Value::string(python_text::strip(self, side, chars));
  }
  if (name == "split" || name == "rsplit") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"sep", "maxsplit"}));
    BATON_ASSIGN_OR_RETURN(auto sep, optional_string(p[0], "sep"));
    if (sep && sep->empty()) return invalid_argument("empty separator");
    BATON_ASSIGN_OR_RETURN(int64_t maxsplit, int_or(p[1], -1, "maxsplit"));
    return Value::list(strings(name == "split" ? python_text::split(self, sep, maxsplit)
                                               : python_text::rsplit(self, sep, maxsplit)));
  }
  if (name == "splitlines") return Value::list(strings(python_text::splitlines(self)));
  if (name == "startswith" || name == "endswith") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"prefix"}));
    std::vector<Value> candidates;
    if (p[0].is_list() && p[0].list_data().is_tuple) {
      candidates = p[0].list_data().items;
    } else {
      candidates.push_back(p[0]);
    }
    for (const Value& c : candidates) {
      if (!c.is_string()) return invalid_argument(name + " argument must be str or a tuple of str");
      const std::string& t = c.as_string();
      const bool match =
          name == "startswith"
              ? self.compare(0, t.size(), t) == 0
              : self.size() >= t.size() && self.compare(self.size() - t.size(), t.size(), t) == 0;
      if (match) return Value::boolean(true);
    }
    return Value::boolean(false);
  }
  if (name == "replace") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"old", "new", "count"}));
    if (!p[0].is_string() || !p[1].is_string())
      return invalid_argument("replace() arguments must be str");
    BATON_ASSIGN_OR_RETURN(int64_t count, int_or(p[2], -1, "count"));
    BATON_ASSIGN_OR_RETURN(
        std::string replaced,
        bounded_replace(self, p[0].as_string(), p[1].as_string(), count, "replace()"));
    return Value::string(std::move(replaced));
  }
  if (name == "upper") return Value::string(python_text::upper(self));
  if (name == "lower") return Value::string(python_text::lower(self));
  if (name == "title") return Value::string(python_text::title(self));
  if (name == "capitalize") return Value::string(python_text::capitalize(self));
  if (name == "swapcase") {
    const std::string up = python_text::upper(self), low = python_text::lower(self);
    std::vector<uint32_t> s = code_points(self), u = code_points(up), l = code_points(low), out;
    for (size_t i = 0; i < s.size(); ++i) out.push_back(s[i] != u[i] ? u[i] : l[i]);
    return Value::string(python_text::from_code_points(out, 0, out.size()));
  }
  if (name == "find" || name == "rfind" || name == "count" || name == "index") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"sub"}));
    if (!p[0].is_string()) return invalid_argument(name + "() argument must be str");
    const std::string& sub = p[0].as_string();
    if (name == "count") {
      if (sub.empty()) return Value::integer(int64_t(python_text::length(self)) + 1);
      int64_t n = 0;
      for (size_t at = self.find(sub); at != std::string::npos;
           at = self.find(sub, at + sub.size()))
        ++n;
      return Value::integer(n);
    }
    const size_t at = name == "rfind" ? self.rfind(sub) : self.find(sub);
    if (at == std::string::npos) {
      if (name == "index") return invalid_argument("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(int64_t(python_text::length(std::string_view(self).substr(0, at))));
  }
  if (name == "join") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"iterable"}));
    BATON_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(p[0]));
    std::string out;
    for (size_t i = 0; i < items.size(); ++i) {
      if (!items[i].is_string())
        return invalid_argument("sequence item " + std::to_string(i) + ": expected str instance");
      if (i > 0) out += self;
      out += items[i].as_string();
    }
    return Value::string(std::move(out));
  }
  if (name == "format") {
    BATON_ASSIGN_OR_RETURN(std::string out, python_str_format(self, args));
    return Value::string(std::move(out));
  }
  if (name.rfind("is", 0) == 0) {
    const std::vector<uint32_t> cps = code_points(self);
    if (cps.empty()) return Value::boolean(false);
    const auto all = [&](auto pred) { return std::all_of(cps.begin(), cps.end(), pred); };
    const auto digit = [](uint32_t c) { return c >= '0' && c <= '9'; };
    const auto alpha = [](uint32_t c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
             (c >= 0xC0 && c != 0xD7 && c != 0xF7);
    };
    if (name == "isdigit" || name == "isnumeric" || name == "isdecimal")
      return Value::boolean(all(digit));
    if (name == "isalpha") return Value::boolean(all(alpha));
    if (name == "isalnum")
      return Value::boolean(all([&](uint32_t c) { return digit(c) || alpha(c); }));
    if (name == "isspace") return Value::boolean(all(python_text::is_space));
    const bool cased = python_text::upper(self) != python_text::lower(self);
    if (name == "islower") return Value::boolean(cased && python_text::lower(self) == self);
    if (name == "isupper") return Value::boolean(cased && python_text::upper(self) == self);
  }
  if (name == "removeprefix" || name == "removesuffix") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"affix"}));
    if (!p[0].is_string()) return invalid_argument(name + "() argument must be str");
    const std::string& a = p[0].as_string();
    if (name == "removeprefix") {
      return Value::string(self.compare(0, a.size(), a) == 0 ? self.substr(a.size()) : self);
    }
    const bool ends =
        self.size() >= a.size() && self.compare(self.size() - a.size(), a.size(), a) == 0;
    return Value::string(ends ? self.substr(0, self.size() - a.size()) : self);
  }
  if (name == "partition" || name == "rpartition") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"sep"}));
    if (!p[0].is_string() || p[0].as_string().empty()) return invalid_argument("bad separator");
    const std::string& sep = p[0].as_string();
    const size_t at = name == "partition" ? self.find(sep) : self.rfind(sep);
    if (at == std::string::npos) {
      return name == "partition" ? Value::tuple(strings({self, "", ""}))
                                 : Value::tuple(strings({"", "", self}));
    }
    return Value::tuple(strings({self.substr(0, at), sep, self.substr(at + sep.size())}));
  }
  if (name == "zfill" || name == "ljust" || name == "rjust" || name == "center") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"width", "fillchar"}));
    BATON_ASSIGN_OR_RETURN(int64_t width, int_or(p[0], 0, "width"));
    BATON_ASSIGN_OR_RETURN(auto fill, optional_string(p[1], "fillchar"));
    const std::string pad = name == "zfill" ? "0" : fill.value_or(" ");
    const int64_t missing = width - int64_t(python_text::length(self));
    if (missing <= 0) return Value::string(self);
    if (missing > kMaxBuiltSize / int64_t(std::max<size_t>(pad.size(), 1)))
      return too_large(name + "()", width);
    const auto repeat = [&](int64_t n) {
      std::string s;
      for (int64_t i = 0; i < n; ++i) s += pad;
      return s;
    };
    if (name == "zfill") {
      if (!self.empty() && (self[0] == '-' || self[0] == '+')) {
        return Value::string(self.substr(0, 1) + repeat(missing) + self.substr(1));
      }
      return Value::string(repeat(missing) + self);
    }
    if (name == "ljust") return Value::string(self + repeat(missing));
    if (name == "rjust") return Value::string(repeat(missing) + self);
    const int64_t left = missing / 2 + (missing & width & 1);
    return Value::string(repeat(left) + self + repeat(missing - left));
  }
  return invalid_argument("'str' object has no attribute '" + name + "'");
}

Result<Value> list_method(const Value& self, const std::string& name, CallArgs& args) {
  const auto& items = self.list_data().items;
  if (name == "copy") return Value::list(items);
  BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"value"}));
  if (name == "count") {
    return Value::integer(int64_t(
        std::count_if(items.begin(), items.end(), [&](const Value& v) { return equal(v, p[0]); })));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    if (equal(items[i], p[0])) return Value::integer(int64_t(i));
  }
  return invalid_argument(to_repr(p[0]) + " is not in list");
}

Result<Value> dict_method(const Value& self, const std::string& name, CallArgs& args) {
  const auto& entries = self.dict_data().entries;
  std::vector<Value> out;
  if (name == "items") {
    for (const auto& [k, v] : entries) out.push_back(Value::tuple({k, v}));
    return Value::view(std::move(out), "dict_items");
  }
  if (name == "keys" || name == "values") {
    for (const auto& [k, v] : entries) out.push_back(name == "keys" ? k : v);
    return Value::view(std::move(out), "dict_" + name);
  }
  if (name == "copy") {
    Value copy = Value::dict();
    copy.dict_data() = self.dict_data();
    return copy;
  }
  BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"key", "default"}));
  const Value* found = self.dict_data().find(p[0]);
  if (found != nullptr) return *found;
  return p[1].is_undefined() ? Value::none() : p[1];
}

bool is_method_of(const Value& obj, const std::string& name) {
  if (obj.is_string()) return contains_name(kStringMethods, name);
  if (obj.is_sequence()) return contains_name(kListMethods, name);
  if (obj.is_dict() && !obj.dict_data().is_namespace) return contains_name(kDictMethods, name);
  return false;
}

// A method of Markup: string arguments are escaped, and string results (or
// the items of list results) are Markup again.
Result<Value> markup_method(const Value& self, const std::string& name, CallArgs& args) {
  const auto escape_strings = [](std::vector<Value>& values) {
    for (Value& v : values) {
      if (v.is_string()) v = escape_markup(v);
    }
  };
  if (name != "startswith" && name != "endswith" && name != "find" && name != "rfind" &&
      name != "count" && name != "index") {
    escape_strings(args.positional);
    for (auto& [k, v] : args.keyword) {
      if (v.is_string()) v = escape_markup(v);
    }
  }
  if (name == "join" && !args.positional.empty()) {
    BATON_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(args.positional[0]));
    escape_strings(items);
    args.positional[0] = Value::list(std::move(items));
  }
  BATON_ASSIGN_OR_RETURN(Value result, string_method(self.as_string(), name, args));
  if (result.is_string()) return Value::markup(result.as_string());
  if (result.is_list()) {
    for (Value& item : result.list_data().items) item = Value::markup(item.as_string());
  }
  return result;
}

Value bound_method(const Value& obj, const std::string& name) {
  return Value::callable(
      name,
      [obj, name](Interpreter&, CallArgs& args) -> Result<Value> {
        if (obj.is_markup()) return markup_method(obj, name, args);
        if (obj.is_string()) return string_method(obj.as_string(), name, args);
        if (obj.is_list()) return list_method(obj, name, args);
        return dict_method(obj, name, args);
      },
      &obj);
}

std::string owner_name(const Value& obj) { return type_name(obj) + " object"; }

}  // namespace

bool is_known_filter(std::string_view name) { return contains_name(kFilters, name); }
bool is_known_test(std::string_view name) { return contains_name(kTests, name); }
bool is_known_method(std::string_view name) {
  // cycle: the loop object's, a callable it holds.
  return contains_name(kStringMethods, name) || contains_name(kListMethods, name) ||
         contains_name(kDictMethods, name) || name == "cycle";
}

Value get_attribute(const Value& obj, const std::string& name) {
  if (is_method_of(obj, name)) return bound_method(obj, name);
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().find(Value::string(name))) return *v;
  }
  return Value::undefined("'" + owner_name(obj) + "' has no attribute '" + name + "'");
}

Value get_item(const Value& obj, const Value& key) {
  if (obj.is_dict()) {
    if (const Value* v = obj.dict_data().find(key)) return *v;
  } else if (obj.is_sequence() && (key.is_int() || key.is_bool())) {
    const auto& items = obj.list_data().items;
    int64_t i = key.as_int();
    if (i < 0) i += int64_t(items.size());
    if (i >= 0 && i < int64_t(items.size())) return items[size_t(i)];
  } else if (obj.is_string() && (key.is_int() || key.is_bool())) {
    const std::vector<uint32_t> cps = python_text::code_points(obj.as_string());
    int64_t i = key.as_int();
    if (i < 0) i += int64_t(cps.size());
    if (i >= 0 && i < int64_t(cps.size()))
      return Value::string(python_text::from_code_points(cps, size_t(i), size_t(i) + 1));
  }
  if (key.is_string() && is_method_of(obj, key.as_string()))
    return bound_method(obj, key.as_string());
  return Value::undefined("'" + owner_name(obj) + "' has no attribute " + to_repr(key));
}

Result<std::vector<Value>> iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return std::vector<Value>();
    case Value::Kind::kList:
      return v.list_data().items;
    case Value::Kind::kDict: {
      std::vector<Value> keys;
      for (const auto& [k, item] : v.dict_data().entries) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      std::vector<Value> chars;
      const std::vector<uint32_t> cps = python_text::code_points(v.as_string());
      for (size_t i = 0; i < cps.size(); ++i)
        chars.push_back(Value::string(python_text::from_code_points(cps, i, i + 1)));
      return chars;
    }
    default:
      return invalid_argument(quoted_type(v) + " object is not iterable");
  }
}

Result<bool> apply_test(Interpreter& interpreter, std::string_view name, const Value& v,
                        CallArgs& args) {
  const auto one = [&]() -> Result<Value> {
    BATON_ASSIGN_OR_RETURN(auto p, bind(name, args, {"other"}));
    return p[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.is_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.is_float();
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_string();
  if (name == "mapping") return v.is_dict() && !v.dict_data().is_namespace;
  if (name == "iterable") return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
  if (name == "sequence")
    return v.is_undefined() || v.is_string() || v.is_sequence() || v.is_dict();
  if (name == "callable") return v.is_callable();
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    if (!v.is_string()) return invalid_argument("test '" + std::string(name) + "' needs a string");
    CallArgs none;
    BATON_ASSIGN_OR_RETURN(
        Value r, string_method(v.as_string(), name == "lower" ? "islower" : "isupper", none));
    return r.as_bool();
  }
  if (name == "odd" || name == "even") {
    if (!v.is_int() && !v.is_bool())
      return invalid_argument("test '" + std::string(name) + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    BATON_ASSIGN_OR_RETURN(Value n, one());
    BATON_ASSIGN_OR_RETURN(Value r, arithmetic("%", v, n));
    return !truthy(r);
  }
  if (name == "sameas") {
    BATON_ASSIGN_OR_RETURN(Value other, one());
    if (v.kind() != other.kind()) return false;
    if (v.is_list()) return &v.list_data() == &other.list_data();
    if (v.is_dict()) return &v.dict_data() == &other.dict_data();
    return equal(v, other) && !v.is_float();
  }
  if (name == "in") {
    BATON_ASSIGN_OR_RETURN(Value seq, one());
    return contains(seq, v);
  }
  if (name == "filter" || name == "test") {
    BATON_ASSIGN_OR_RETURN(Value n, one());
    return n.is_string() &&
           (name == "filter" ? is_known_filter(n.as_string()) : is_known_test(n.as_string()));
  }
  BATON_ASSIGN_OR_RETURN(Value other, one());
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other);
  if (name == "ne" || name == "!=") return !equal(v, other);
  if (v.is_undefined() || other.is_undefined())
    return invalid_argument("comparison with an undefined value");
  BATON_ASSIGN_OR_RETURN(int order, compare(v, other));
  if (name == "lt" || name == "lessthan" || name == "<") return order < 0;
  if (name == "le" || name == "<=") return order <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return order > 0;
  if (name == "ge" || name == ">=") return order >= 0;
  (void)interpreter;
  return invalid_argument("unknown test '" + std::string(name) + "'");
}

namespace {

// select / reject / selectattr / rejectattr.
Result<Value> select_items(Interpreter& interpreter, std::string_view filter, const Value& v,
                           CallArgs& args) {
  const bool by_attribute = filter.size() > 6 && filter.substr(filter.size() - 4) == "attr";
  const bool keep_matching = filter.rfind("select", 0) == 0;
  std::vector<Value> rest = args.positional;
  Value attribute;
  if (by_attribute) {
    if (rest.empty()) return invalid_argument(std::string(filter) + " needs an attribute");
    attribute = rest.front();
    rest.erase(rest.begin());
  }
  std::string test;
  if (!rest.empty()) {
    if (!rest.front().is_string()) return invalid_argument("a test name must be a string");
    test = rest.front().as_string();
    rest.erase(rest.begin());
    if (!is_known_test(test)) return invalid_argument("no test named '" + test + "'");
  }
  // Jinja2 visits nothing of a false value (None, an empty string).
  if (!truthy(v)) return Value::iterator({});
  BATON_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  std::vector<Value> out;
  for (Value& item : items) {
    const Value subject = by_attribute ? attribute_path(item, attribute) : item;
    bool passes;
    if (test.empty()) {
      passes = truthy(subject);
    } else {
      CallArgs test_args{rest, args.keyword};
      BATON_ASSIGN_OR_RETURN(passes, apply_test(interpreter, test, subject, test_args));
    }
    if (passes == keep_matching) out.push_back(std::move(item));
  }
  return Value::iterator(std::move(out));
}

Result<Value> tojson(const Value& v, CallArgs& args) {
  BATON_ASSIGN_OR_RETURN(
      auto p, bind("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"}));
  JsonStyle style;
  style.ensure_ascii = truthy(p[0]);
  if (p[1].is_int()) {
    if (p[1].as_int() > kMaxBuiltSize) return too_large("tojson", p[1].as_int());
    style.indent = std::string(size_t(std::max<int64_t>(0, p[1].as_int())), ' ');
  } else if (p[1].is_string()) {
    style.indent = p[1].as_string();
  }
  if (style.indent) style.item_separator = ",";
  if (p[2].is_list() && p[2].list_data().items.size() == 2 &&
      p[2].list_data().items[0].is_string() && p[2].list_data().items[1].is_string()) {
    style.item_separator = p[2].list_data().items[0].as_string();
    style.key_separator = p[2].list_data().items[1].as_string();
  }
  style.sort_keys = truthy(p[3]);
  BATON_ASSIGN_OR_RETURN(std::string text, to_json(v, style));
  return Value::string(std::move(text));
}

Result<Value> indent(const Value& v, CallArgs& args) {
  BATON_ASSIGN_OR_RETURN(auto p, bind("indent", args, {"width", "first", "blank"}));
  if (p[0].is_int() && p[0].as_int() > kMaxBuiltSize) return too_large("indent", p[0].as_int());
  std::string prefix =
      p[0].is_string()
          ? p[0].as_string()
          : std::string(size_t(p[0].is_undefined() ? 4 : std::max<int64_t>(0, p[0].as_int())), ' ');
  const std::string text = to_str(v) + "\n";
  std::vector<std::string> lines = python_text::splitlines(text);
  if (!prefix.empty() &&
      int64_t(lines.size()) > (kMaxBuiltSize - int64_t(text.size())) / int64_t(prefix.size())) {
    return too_large("indent",
                     int64_t(text.size()) + int64_t(lines.size()) * int64_t(prefix.size()));
  }
  std::string out;
  if (truthy(p[2])) {
    for (size_t i = 0; i < lines.size(); ++i) {
      if (i > 0) out += "\n" + prefix;
      out += lines[i];
    }
  } else {
    out = lines.empty() ? std::string() : lines[0];
    for (size_t i = 1; i < lines.size(); ++i)
      out += "\n" + (lines[i].empty() ? "" : prefix) + lines[i];
  }
  if (truthy(p[1])) out = prefix + out;
  return Value::string(std::move(out));
}

Result<Value> to_int(const Value& v, CallArgs& args) {
  BATON_ASSIGN_OR_RETURN(auto p, bind("int", args, {"default", "base"}));
  const Value fallback = p[0].is_undefined() ? Value::integer(0) : p[0];
  if (v.is_int() || v.is_bool()) return Value::integer(v.as_int());
  if (v.is_float()) {
    if (!std::isfinite(v.as_double())) return fallback;
    BATON_ASSIGN_OR_RETURN(const int64_t i, float_to_integer(v.as_double()));
    return Value::integer(i);
  }
  if (v.is_string()) {
    const std::string s = python_text::strip(v.as_string(), Side::kBoth, std::nullopt);
    const int base = int(p[1].is_int() ? p[1].as_int() : 10);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, base);
    if (!s.empty() && *end == '\0' && errno == 0) return Value::integer(i);
    // An integer past int64 (Python would hold it whole): not its nearest
    // double, which strtod would read it as.
    if (!s.empty() && *end == '\0' && errno == ERANGE)
      return out_of_range("integer overflow: " + s);
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0' && std::isfinite(d)) {
      BATON_ASSIGN_OR_RETURN(const int64_t i, float_to_integer(d));
      return Value::integer(i);
    }
  }
  return fallback;
}

Result<Value> to_float(const Value& v, CallArgs& args) {
  BATON_ASSIGN_OR_RETURN(auto p, bind("float", args, {"default"}));
  const Value fallback = p[0].is_undefined() ? Value::floating(0.0) : p[0];
  if (v.is_number()) return Value::floating(v.as_double());
  if (v.is_string()) {
    const std::string s = python_text::strip(v.as_string(), Side::kBoth, std::nullopt);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value::floating(d);
  }
  return fallback;
}

Result<Value> round_filter(const Value& v, CallArgs& args) {
  BATON_ASSIGN_OR_RETURN(auto p, bind("round", args, {"precision", "method"}));
  if (!v.is_number()) return invalid_argument("round needs a number");
  BATON_ASSIGN_OR_RETURN(int64_t precision, int_or(p[0], 0, "precision"));
  const std::string method = p[1].is_string() ? p[1].as_string() : "common";
  const double scale = std::pow(10.0, double(precision));
  const double x = v.as_double() * scale;
  double r;
  if (method == "common") {
    r = std::nearbyint(x);  // Python's round: halves to even
  } else if (method == "ceil") {
    r = std::ceil(x);
  } else if (method == "floor") {
    r = std::floor(x);
  } else {
    return invalid_argument("method must be common, ceil or floor");
  }
  return Value::floating(r / scale);
}

}  // namespace

Result<Value> apply_filter(Interpreter& interpreter, std::string_view name, const Value& v,
                           CallArgs& args) {
  const std::string filter(name);
  if (name == "default" || name == "d") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"default_value", "boolean"}));
    const bool use_fallback = v.is_undefined() || (truthy(p[1]) && !truthy(v));
    if (!use_fallback) return v;
    return p[0].is_undefined() ? Value::string("") : p[0];
  }
  if (name == "tojson") return tojson(v, args);
  if (name == "safe") return v.is_markup() ? v : Value::markup(to_str(v));
  if (name == "string") return v.is_markup() ? v : Value::string(to_str(v));
  if (name == "e" || name == "escape") return escape_markup(v);
  if (name == "length" || name == "count") {
    if (v.is_string()) return Value::integer(int64_t(python_text::length(v.as_string())));
    if (v.is_list() && !v.is_iterator()) return Value::integer(int64_t(v.list_data().items.size()));
    if (v.is_dict()) return Value::integer(int64_t(v.dict_data().entries.size()));
    if (v.is_undefined()) return Value::integer(0);
    return invalid_argument("object of type '" + type_name(v) + "' has no len()");
  }
  if (name == "trim") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"chars"}));
    BATON_ASSIGN_OR_RETURN(auto chars, optional_string(p[0], "chars"));
    return same_kind(v, python_text::strip(to_str(v), Side::kBoth, chars));
  }
  if (name == "upper") return same_kind(v, python_text::upper(to_str(v)));
  if (name == "lower") return same_kind(v, python_text::lower(to_str(v)));
  if (name == "capitalize") return same_kind(v, python_text::capitalize(to_str(v)));
  if (name == "title") return Value::string(jinja_title(to_str(v)));
  if (name == "replace") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"old", "new", "count"}));
    BATON_ASSIGN_OR_RETURN(int64_t count, int_or(p[2], -1, "count"));
    BATON_ASSIGN_OR_RETURN(std::string replaced, bounded_replace(to_str(v), to_str(p[0]),
                                                                 to_str(p[1]), count, "replace"));
    return Value::string(std::move(replaced));
  }
  if (name == "indent") return indent(v, args);
  if (name == "int") return to_int(v, args);
  if (name == "float") return to_float(v, args);
  if (name == "abs") {
    if (!v.is_number())
      return invalid_argument("bad operand type for abs(): '" + type_name(v) + "'");
    if (v.is_float()) return Value::floating(std::fabs(v.as_double()));
    if (v.as_int() == INT64_MIN) return out_of_range("integer overflow");
    return Value::integer(std::llabs(v.as_int()));
  }
  if (name == "round") return round_filter(v, args);
  if (name == "wordcount") return Value::integer(word_count(to_str(v)));
  if (name == "center") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"width"}));
    CallArgs width{{p[0].is_undefined() ? Value::integer(80) : p[0]}, {}};
    return string_method(to_str(v), "center", width);
  }
  if (name == "format") {
    Value format_args = args.keyword.empty() ? Value::tuple(args.positional) : Value::dict();
    for (auto& [k, item] : args.keyword) format_args.dict_data().set(Value::string(k), item);
    BATON_ASSIGN_OR_RETURN(std::string text, printf_format(to_str(v), format_args));
    return Value::string(std::move(text));
  }
  if (name == "attr") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"name"}));
    if (!p[0].is_string()) return invalid_argument("attr needs a name");
    return get_attribute(v, p[0].as_string());
  }
  if (name == "striptags") return invalid_argument("striptags is not supported");
  if (name == "truncate") return invalid_argument("truncate is not supported");
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    return select_items(interpreter, name, v, args);
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::iterator({});
    if (!v.is_dict()) return invalid_argument("items needs a mapping");
    CallArgs none;
    BATON_ASSIGN_OR_RETURN(Value view, dict_method(v, "items", none));
    return Value::iterator(view.list_data().items, "dict_itemiterator");
  }
  if (name == "map" && !truthy(v)) return Value::iterator({});
  if (name == "dictsort") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"case_sensitive", "by", "reverse"}));
    if (!v.is_dict()) return invalid_argument("dictsort needs a mapping");
    const bool by_value = p[1].is_string() && p[1].as_string() == "value";
    const bool case_sensitive = truthy(p[0]);
    CallArgs none;
    BATON_ASSIGN_OR_RETURN(Value pairs, dict_method(v, "items", none));
    std::vector<Value> items = pairs.list_data().items;
    BATON_RETURN_IF_ERROR(sort_values(
        items,
        [&](const Value& pair) {
          return sort_key(pair.list_data().items[by_value ? 1 : 0], case_sensitive);
        },
        truthy(p[2])));
    return Value::list(std::move(items));
  }
  // The filters below take any iterable.
  if (v.is_none() || v.is_number() || v.is_callable()) {
    return invalid_argument(quoted_type(v) + " object is not iterable");
  }
  BATON_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(v));
  if (name == "list") return Value::list(std::move(items));
  if (name == "first")
    return items.empty() ? Value::undefined("no first item, sequence was empty") : items.front();
  if (name == "last") {
    if (v.is_iterator()) return invalid_argument(quoted_type(v) + " object is not reversible");
    return items.empty() ? Value::undefined("no last item, sequence was empty") : items.back();
  }
  if (name == "reverse") {
    if (v.is_string()) {
      std::vector<uint32_t> cps = python_text::code_points(v.as_string());
      std::reverse(cps.begin(), cps.end());
      return Value::string(python_text::from_code_points(cps, 0, cps.size()));
    }
    std::reverse(items.begin(), items.end());
    // reversed() of what can be reversed is an iterator; a generator becomes a list.
    if (v.is_iterator()) return Value::list(std::move(items));
    return Value::iterator(std::move(items),
                           v.is_dict() ? "dict_reversekeyiterator" : "list_reverseiterator");
  }
  if (name == "join") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"d", "attribute"}));
    std::string out;
    const std::string separator = p[0].is_undefined() ? "" : to_str(p[0]);
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out += separator;
      out += to_str(p[1].is_undefined() ? items[i] : attribute_path(items[i], p[1]));
    }
    BATON_RETURN_IF_ERROR(interpreter.charge_output(out.size()));
    return Value::string(std::move(out));
  }
  if (name == "map") {
    std::vector<Value> out;
    const auto attribute = std::find_if(args.keyword.begin(), args.keyword.end(),
                                        [](const auto& kw) { return kw.first == "attribute"; });
    if (attribute != args.keyword.end()) {
      const auto fallback = std::find_if(args.keyword.begin(), args.keyword.end(),
                                         [](const auto& kw) { return kw.first == "default"; });
      for (const Value& item : items) {
        Value mapped = attribute_path(item, attribute->second);
        if (mapped.is_undefined() && fallback != args.keyword.end()) mapped = fallback->second;
        out.push_back(std::move(mapped));
      }
      return Value::iterator(std::move(out));
    }
    if (args.positional.empty() || !args.positional[0].is_string()) {
      return invalid_argument("map needs a filter name or attribute=");
    }
    const std::string inner = args.positional[0].as_string();
    if (!is_known_filter(inner)) return invalid_argument("no filter named '" + inner + "'");
    for (const Value& item : items) {
      CallArgs inner_args{std::vector<Value>(args.positional.begin() + 1, args.positional.end()),
                          args.keyword};
      BATON_ASSIGN_OR_RETURN(Value mapped,
                             interpreter.apply_nested_filter(inner, item, inner_args));
      out.push_back(std::move(mapped));
    }
    return Value::iterator(std::move(out));
  }
  if (name == "sort" || name == "unique" || name == "min" || name == "max") {
    BATON_ASSIGN_OR_RETURN(
        auto p, name == "sort" ? bind(filter, args, {"reverse", "case_sensitive", "attribute"})
                               : bind(filter, args, {"case_sensitive", "attribute"}));
    const bool is_sort = name == "sort";
    const bool case_sensitive = truthy(p[is_sort ? 1 : 0]);
    const Value attribute = p[is_sort ? 2 : 1];
    const auto key = [&](const Value& item) {
      return sort_key(attribute.is_undefined() ? item : attribute_path(item, attribute),
                      case_sensitive);
    };
    if (name == "unique") {
      std::vector<Value> out, seen;
      for (Value& item : items) {
        Value k = key(item);
        if (std::none_of(seen.begin(), seen.end(), [&](const Value& s) { return equal(s, k); })) {
          seen.push_back(std::move(k));
          out.push_back(std::move(item));
        }
      }
      return Value::iterator(std::move(out));
    }
    BATON_RETURN_IF_ERROR(sort_values(items, key, is_sort && truthy(p[0])));
    if (is_sort) return Value::list(std::move(items));
    if (items.empty()) return Value::undefined("no " + filter + " item, sequence was empty");
    return name == "min" ? items.front() : items.back();
  }
  if (name == "sum") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"attribute", "start"}));
    Value total = p[1].is_undefined() ? Value::integer(0) : p[1];
    for (const Value& item : items) {
      BATON_ASSIGN_OR_RETURN(
          total, arithmetic("+", total, p[0].is_undefined() ? item : attribute_path(item, p[0])));
    }
    return total;
  }
  if (name == "batch") {
    BATON_ASSIGN_OR_RETURN(auto p, bind(filter, args, {"linecount", "fill_with"}));
    BATON_ASSIGN_OR_RETURN(int64_t size, int_or(p[0], 0, "linecount"));
    if (size <= 0) return invalid_argument("batch size must be positive");
    if (size > kMaxBuiltSize) return too_large("batch", size);
    std::vector<Value> out;
    for (size_t i = 0; i < items.size(); i += size_t(size)) {
      std::vector<Value> chunk(items.begin() + long(i),
                               items.begin() + long(std::min(items.size(), i + size_t(size))));
      while (!p[1].is_undefined() && int64_t(chunk.size()) < size) chunk.push_back(p[1]);
      out.push_back(Value::list(std::move(chunk)));
    }
    return Value::iterator(std::move(out));
  }
  return invalid_argument("unknown filter '" + filter + "'");
}

Value make_globals(int64_t now_seconds) {
  Value g = Value::dict();
  auto& d = g.dict_data();
  d.set(Value::string("range"),
        Value::callable("range", [](Interpreter&, CallArgs& args) -> Result<Value> {
          if (!args.keyword.empty() || args.positional.empty() || args.positional.size() > 3) {
            return invalid_argument("range expects 1 to 3 integer arguments");
          }
          int64_t bounds[3] = {0, 0, 1};
          for (const Value& a : args.positional) {
            if (!a.is_int() && !a.is_bool())
              return invalid_argument("range arguments must be integers");
          }
          if (args.positional.size() == 1) {
            bounds[1] = args.positional[0].as_int();
          } else {
            for (size_t i = 0; i < args.positional.size(); ++i)
              bounds[i] = args.positional[i].as_int();
          }
          if (bounds[2] == 0) return invalid_argument("range() arg 3 must not be zero");
          std::vector<Value> out;
          for (int64_t i = bounds[0]; bounds[2] > 0 ? i < bounds[1] : i > bounds[1];) {
            if (int64_t(out.size()) >= kMaxRange) {
              return resource_exhausted("range too big (the sandbox allows " +
                                        std::to_string(kMaxRange) + ")");
            }
            out.push_back(Value::integer(i));
            if (__builtin_add_overflow(i, bounds[2], &i)) break;  // past any stop
          }
          return Value::list(std::move(out));
        }));
  const auto from_keywords = [](Value target, CallArgs& args) -> Result<Value> {
    for (const Value& p : args.positional) {
      if (!p.is_dict()) return invalid_argument("positional arguments must be mappings");
      for (const auto& [k, v] : p.dict_data().entries) target.dict_data().set(k, v);
    }
    for (auto& [k, v] : args.keyword) target.dict_data().set(Value::string(k), v);
    return target;
  };
  d.set(
      Value::string("namespace"),
      Value::callable("namespace", [from_keywords](Interpreter&, CallArgs& args) -> Result<Value> {
        BATON_ASSIGN_OR_RETURN(Value ns, from_keywords(Value::namespace_object(), args));
        for (const auto& [key, value] : ns.dict_data().entries) {
          BATON_RETURN_IF_ERROR(check_storable(value, /*in_namespace=*/true));
        }
        return ns;
      }));
  d.set(Value::string("dict"),
        Value::callable("dict", [from_keywords](Interpreter&, CallArgs& args) {
          return from_keywords(Value::dict(), args);
        }));
  d.set(Value::string("raise_exception"),
        Value::callable("raise_exception", [](Interpreter&, CallArgs& args) -> Result<Value> {
          const std::string message = args.positional.empty() ? "" : to_str(args.positional[0]);
          return invalid_argument("raise_exception: " + message);
        }));
  d.set(
      Value::string("strftime_now"),
      Value::callable("strftime_now", [now_seconds](Interpreter&, CallArgs& args) -> Result<Value> {
        if (args.positional.size() != 1 || !args.positional[0].is_string()) {
          return invalid_argument("strftime_now takes one format string");
        }
        const std::time_t t = std::time_t(now_seconds);
        std::tm tm{};
        gmtime_r(&t, &tm);
        char buffer[256];
        const size_t n =
            std::strftime(buffer, sizeof(buffer), args.positional[0].as_string().c_str(), &tm);
        return Value::string(std::string(buffer, n));
      }));
  return g;
}

}  // namespace baton::jinja
