// engine/jinja/value.h — the values a chat template computes with, behaving
// as the Python objects Jinja2 gives templates: None, bools, ints, floats,
// strings, lists (and tuples), dicts that keep insertion order, namespaces,
// callables, and Undefined (a missing name or key, which prints as "" and is
// an error to look inside).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"

namespace baton::jinja {

// The longest string (bytes) or list (items) one operation of a template
// may build: a chat prompt is far shorter, and a template that pads,
// indents, repeats or replaces its way past it is refused, not run out of
// memory.
inline constexpr int64_t kMaxBuiltSize = 10'000'000;

// How deeply lists and dicts a template stores in a name may nest: printing,
// comparing and freeing a value recurse through it, so a template that wraps
// a value in itself in a loop is refused, not run off the stack.
inline constexpr int kMaxValueNesting = 256;

class Value;
class Interpreter;

struct CallArgs {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> keyword;
};

using Function = std::function<Result<Value>(Interpreter&, CallArgs&)>;

class Value {
 public:
  enum class Kind { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kCallable };

  // What a list, a dict or a bound method holds, as the store checks read
  // it: how deeply it nests (1 for one holding no list or dict) and whether
  // a namespace is in it (the one value that changes after it is made, so a
  // namespace held in another namespace could make a cycle). Whoever adds
  // an item notes it.
  struct Contents {
    int nesting = 1;
    bool holds_namespace = false;
    void note(const Value& item);
  };

  struct ListData {
    std::vector<Value> items;
    Contents contents;
    bool is_tuple = false;
    // Not a list but a lazy Python object over the items, named by its
    // type: an iterator (a generator from map or select, a reversed list:
    // always true, no len, no index, not JSON) or a dict view (dict_items:
    // len, no index, not JSON). Templates that treat one as a list fail in
    // Jinja2, so they fail here too.
    enum class Lazy { kNone, kIterator, kView };
    Lazy lazy = Lazy::kNone;
    std::string lazy_type;
  };
  struct DictData {
    std::vector<std::pair<Value, Value>> entries;  // insertion order, keys unique
    Contents contents;
    bool is_namespace = false;
    const Value* find(const Value& key) const;
    Value* find(const Value& key);
    void set(Value key, Value value);
  };
  struct CallableData {
    std::string name;
    Function call;
    Contents contents;  // of the value a bound method holds (its object)
  };

  Value() = default;  // Undefined
  static Value undefined(std::string hint = {});
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value floating(double f);
  static Value string(std::string s);
  // Jinja2's Markup: a str marked safe (by |safe or |escape); joining it
  // with a plain str escapes the plain one.
  static Value markup(std::string s);
  static Value list(std::vector<Value> items = {});
  static Value tuple(std::vector<Value> items);
  static Value iterator(std::vector<Value> items, std::string type = "generator");
  static Value view(std::vector<Value> items, std::string type);
  static Value dict();
  static Value namespace_object();
  // `holds`: the value the callable keeps (a bound method's object), which
  // counts in its nesting as a list's item does.
  static Value callable(std::string name, Function call, const Value* holds = nullptr);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  // Python's bool is an int: True + 1 == 2.
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_markup() const { return kind_ == Kind::kString && markup_; }
  bool is_list() const { return kind_ == Kind::kList; }
  // A list or tuple, not a lazy iterator or view.
  bool is_sequence() const { return kind_ == Kind::kList && list_->lazy == ListData::Lazy::kNone; }
  bool is_lazy() const { return kind_ == Kind::kList && list_->lazy != ListData::Lazy::kNone; }
  bool is_iterator() const {
    return kind_ == Kind::kList && list_->lazy == ListData::Lazy::kIterator;
  }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_callable() const { return kind_ == Kind::kCallable; }

  bool as_bool() const { return b_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? int64_t(b_) : i_; }
  double as_double() const { return kind_ == Kind::kFloat ? f_ : double(as_int()); }
  const std::string& as_string() const { return s_ ? *s_ : empty_string(); }
  // The undefined value's explanation ("'x' is undefined").
  const std::string& undefined_hint() const { return as_string(); }
  ListData& list_data() const { return *list_; }
  DictData& dict_data() const { return *dict_; }
  const CallableData& callable_data() const { return *callable_; }

 private:
  Kind kind_ = Kind::kUndefined;
  bool b_ = false;
  int64_t i_ = 0;
  double f_ = 0;
  static const std::string& empty_string();
  // Shared: templates copy values freely (a lookup, a loop variable, a
  // slice of the messages), and contents run to megabytes.
  std::shared_ptr<const std::string> s_;
  bool markup_ = false;
  // Shared, as Python's references are: a namespace set in a loop is the
  // namespace outside it.
  std::shared_ptr<ListData> list_;
  std::shared_ptr<DictData> dict_;
  std::shared_ptr<const CallableData> callable_;
};

// How deeply v nests lists and dicts (0: neither), and whether it is or
// holds a namespace.
int nesting_of(const Value& v);
bool holds_namespace(const Value& v);
// Whether v may be stored in a name, or in a namespace's attribute (where a
// namespace may not go): nested at most kMaxValueNesting deep.
Status check_storable(const Value& v, bool in_namespace);

// Python's type name, for error messages: 'str', 'int', 'list', ...
std::string type_name(const Value& v);
// The type name in quotes, for messages: 'str'.
std::string quoted_type(const Value& v);
bool truthy(const Value& v);
// Python's ==.
bool equal(const Value& a, const Value& b);
// Python's ordering (<0, 0, >0) of numbers, strings and lists; an error
// naming both types for anything else.
Result<int> compare(const Value& a, const Value& b);
// str(v) as Jinja2 prints it; Undefined prints as "".
std::string to_str(const Value& v);
// repr(v).
std::string to_repr(const Value& v);
// markupsafe.escape: & < > " ' as HTML entities.
std::string html_escape(const std::string& s);
// escape(v): Markup as it is, anything else str(v) escaped into Markup.
Value escape_markup(const Value& v);
// repr(float): the shortest text that reads back as the same double.
std::string format_float(double f);

// json.dumps with its arguments (what transformers' tojson calls).
struct JsonStyle {
  std::optional<std::string> indent;  // None: one line
  std::string item_separator = ", ";
  std::string key_separator = ": ";
  bool sort_keys = false;
  bool ensure_ascii = false;
};
Result<std::string> to_json(const Value& v, const JsonStyle& style);

}  // namespace baton::jinja
