#include "engine/jinja/interpreter.h"

#include <ctime>

#include "engine/jinja/builtins.h"
#include "engine/jinja/lexer.h"
#include "engine/jinja/operators.h"
#include "engine/jinja/parser.h"
#include "engine/jinja/python_text.h"

namespace baton::jinja {

Status error_at(int line, int column, const std::string& message) {
  return invalid_argument("template " + describe_position(line, column) + ": " + message);
}

namespace {

constexpr int kMaxCallDepth = 64;
// How many statement bodies and expressions a render may be inside of at
// once, through macro calls too: each is a call of exec or eval on the stack.
constexpr int kMaxRenderDepth = 400;
constexpr int kMaxNestedFilters = 16;

// Counts one level of render_depth for as long as it lives.
class DepthGuard {
 public:
  explicit DepthGuard(int& depth) : depth_(++depth) {}
  ~DepthGuard() { --depth_; }
  DepthGuard(const DepthGuard&) = delete;
  DepthGuard& operator=(const DepthGuard&) = delete;
  bool too_deep() const { return depth_ > kMaxRenderDepth; }

 private:
  int& depth_;
};

Status too_deep() {
  return resource_exhausted("template rendering nested more than " +
                            std::to_string(kMaxRenderDepth) + " statements and expressions deep");
}

// s, with the position of what failed if it has none yet.
Status at(int line, int column, const Status& s) {
  if (s.is_ok() || s.message().rfind("template line", 0) == 0) {
    return s;
  }
  return Status(s.code(), "template " + describe_position(line, column) + ": " + s.message());
}
Status at(const Expr& e, const Status& s) { return at(e.line, e.column, s); }

Status undefined_error(const Value& v) {
  return invalid_argument(v.undefined_hint().empty() ? "value is undefined" : v.undefined_hint());
}

}  // namespace

void Interpreter::Frame::set(const std::string& name, Value value) {
  for (auto& [n, v] : names) {
    if (n == name) {
      v = std::move(value);
      return;
    }
  }
  names.emplace_back(name, std::move(value));
}

Interpreter::Interpreter(const RenderOptions& options)
    : options_(options),
      globals_(make_globals(options.now_seconds != 0 ? options.now_seconds
                                                     : int64_t(std::time(nullptr)))) {}

Status Interpreter::charge_output(size_t bytes) {
  output_bytes_ += bytes;
  if (output_bytes_ > options_.max_output_bytes) {
    return resource_exhausted("template output passed " +
                              std::to_string(options_.max_output_bytes) + " bytes");
  }
  return Status::ok();
}

Result<std::string> Interpreter::render(const Body& body, const Value& context) {
  context_ = context.is_dict() ? context : Value::dict();
  Frame root;
  root_ = &root;
  std::string out;
  Result<Flow> flow = exec(body, root, out);
  root_ = nullptr;
  if (!flow.is_ok()) return flow.status();
  return out;
}

Value Interpreter::lookup(const Frame& frame, const std::string& name) const {
  for (const Frame* f = &frame; f != nullptr; f = f->parent) {
    for (const auto& [n, v] : f->names) {
      if (n == name) return v;
    }
  }
  if (const Value* v = context_.dict_data().find(Value::string(name))) return *v;
  if (const Value* v = globals_.dict_data().find(Value::string(name))) return *v;
  return Value::undefined("'" + name + "' is undefined");
}

Status Interpreter::take_step() {
  if (++steps_ > options_.max_steps) {
    return resource_exhausted("template loops and macro calls passed " +
                              std::to_string(options_.max_steps) + " steps");
  }
  return Status::ok();
}

Result<Interpreter::Flow> Interpreter::exec(const Body& body, Frame& frame, std::string& out) {
  DepthGuard guard(render_depth_);
  if (guard.too_deep()) return too_deep();
  return exec_statements(body, frame, out);
}

Result<Interpreter::Flow> Interpreter::exec_statements(const Body& body, Frame& frame,
                                                       std::string& out) {
  for (const StmtPtr& sp : body) {
    const Stmt& s = *sp;
    switch (s.kind) {
      case Stmt::Kind::kText:
        BATON_RETURN_IF_ERROR(charge_output(s.text.size()));
        out += s.text;
        break;
      case Stmt::Kind::kPrint: {
        BATON_ASSIGN_OR_RETURN(Value v, eval(*s.expr, frame));
        std::string text = to_str(v);
        BATON_RETURN_IF_ERROR(charge_output(text.size()));
        out += text;
        break;
      }
      case Stmt::Kind::kIf: {
        for (size_t i = 0; i < s.bodies.size(); ++i) {
          bool taken = i >= s.conditions.size();
          if (!taken) {
            BATON_ASSIGN_OR_RETURN(Value c, eval(*s.conditions[i], frame));
            taken = truthy(c);
          }
          if (taken) {
            BATON_ASSIGN_OR_RETURN(Flow flow, exec(s.bodies[i], frame, out));
            if (flow != Flow::kNormal) return flow;
            break;
          }
        }
        break;
      }
      case Stmt::Kind::kFor: {
        // A break or continue in the loop's else body is the enclosing loop's.
        BATON_ASSIGN_OR_RETURN(Flow flow, exec_for(s, frame, out));
        if (flow != Flow::kNormal) return flow;
        break;
      }
      case Stmt::Kind::kSet:
        BATON_RETURN_IF_ERROR(exec_set(s, frame));
        break;
      case Stmt::Kind::kSetBlock: {
        std::string text;
        BATON_ASSIGN_OR_RETURN(Flow flow, exec(s.bodies[0], frame, text));
        if (flow != Flow::kNormal) return flow;
        BATON_ASSIGN_OR_RETURN(Value v,
                               apply_filters(s.filters, Value::string(std::move(text)), frame));
        BATON_RETURN_IF_ERROR(assign(s.targets, v, frame, s));
        break;
      }
      case Stmt::Kind::kMacro:
        frame.set(s.text, make_macro(s));
        break;
      case Stmt::Kind::kFilterBlock: {
        std::string text;
        BATON_ASSIGN_OR_RETURN(Flow flow, exec(s.bodies[0], frame, text));
        if (flow != Flow::kNormal) return flow;
        BATON_ASSIGN_OR_RETURN(Value v,
                               apply_filters(s.filters, Value::string(std::move(text)), frame));
        std::string filtered = to_str(v);
        BATON_RETURN_IF_ERROR(charge_output(filtered.size()));
        out += filtered;
        break;
      }
      case Stmt::Kind::kBreak:
        return Flow::kBreak;
      case Stmt::Kind::kContinue:
        return Flow::kContinue;
      case Stmt::Kind::kScope: {
        BATON_ASSIGN_OR_RETURN(Flow flow, exec(s.bodies[0], frame, out));
        if (flow != Flow::kNormal) return flow;
        break;
      }
    }
  }
  return Flow::kNormal;
}

Status Interpreter::assign(const std::vector<std::string>& targets, const Value& value,
                           Frame& frame, const Stmt& s) {
  if (Status stored = check_storable(value, /*in_namespace=*/false); !stored.is_ok()) {
    return at(s.line, s.column, stored);
  }
  if (targets.size() == 1) {
    frame.set(targets[0], value);
    return Status::ok();
  }
  BATON_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(value));
  if (items.size() != targets.size()) {
    return error_at(s.line, s.column,
                    std::string(items.size() > targets.size() ? "too many" : "not enough") +
                        " values to unpack (expected " + std::to_string(targets.size()) + ", got " +
                        std::to_string(items.size()) + ")");
  }
  for (size_t i = 0; i < targets.size(); ++i) frame.set(targets[i], items[i]);
  return Status::ok();
}

Result<Interpreter::Flow> Interpreter::exec_for(const Stmt& s, Frame& frame, std::string& out) {
  BATON_ASSIGN_OR_RETURN(Value iterable, eval(*s.expr, frame));
  if (iterable.is_none() || iterable.is_number() || iterable.is_callable()) {
    return error_at(s.line, s.column, quoted_type(iterable) + " object is not iterable");
  }
  BATON_ASSIGN_OR_RETURN(std::vector<Value> items, iterate(iterable));
  if (s.condition) {
    std::vector<Value> kept;
    for (Value& item : items) {
      Frame f{{}, &frame};
      BATON_RETURN_IF_ERROR(assign(s.targets, item, f, s));
      BATON_ASSIGN_OR_RETURN(Value keep, eval(*s.condition, f));
      if (truthy(keep)) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  const auto length = int64_t(items.size());
  for (int64_t i = 0; i < length; ++i) {
    BATON_RETURN_IF_ERROR(take_step());
    Frame f{{}, &frame};
    BATON_RETURN_IF_ERROR(assign(s.targets, items[size_t(i)], f, s));
    // The loop object; its keys are made once, and are distinct, so the
    // entries go in without lookups.
    static const auto kKeys = [] {
      std::vector<Value> keys;
      for (const char* name : {"index", "index0", "revindex", "revindex0", "first", "last",
                               "length", "depth", "depth0", "previtem", "nextitem", "cycle"}) {
        keys.push_back(Value::string(name));
      }
      return keys;
    }();
    Value loop = Value::dict();
    auto& entries = loop.dict_data().entries;
    entries.reserve(kKeys.size());
    entries.emplace_back(kKeys[0], Value::integer(i + 1));
    entries.emplace_back(kKeys[1], Value::integer(i));
    entries.emplace_back(kKeys[2], Value::integer(length - i));
    entries.emplace_back(kKeys[3], Value::integer(length - i - 1));
    entries.emplace_back(kKeys[4], Value::boolean(i == 0));
    entries.emplace_back(kKeys[5], Value::boolean(i == length - 1));
    entries.emplace_back(kKeys[6], Value::integer(length));
    entries.emplace_back(kKeys[7], Value::integer(1));
    entries.emplace_back(kKeys[8], Value::integer(0));
    if (i > 0) {
      loop.dict_data().contents.note(items[size_t(i - 1)]);
      entries.emplace_back(kKeys[9], items[size_t(i - 1)]);
    }
    if (i + 1 < length) {
      loop.dict_data().contents.note(items[size_t(i + 1)]);
      entries.emplace_back(kKeys[10], items[size_t(i + 1)]);
    }
    entries.emplace_back(
        kKeys[11], Value::callable("cycle", [i](Interpreter&, CallArgs& args) -> Result<Value> {
          if (args.positional.empty()) return invalid_argument("no items for cycling given");
          return args.positional[size_t(i) % args.positional.size()];
        }));
    f.set("loop", std::move(loop));
    BATON_ASSIGN_OR_RETURN(Flow flow, exec(s.bodies[0], f, out));
    if (flow == Flow::kBreak) break;
  }
  if (length == 0 && s.bodies.size() > 1) {
    BATON_ASSIGN_OR_RETURN(Flow flow, exec(s.bodies[1], frame, out));
    return flow;
  }
  return Flow::kNormal;
}

Status Interpreter::exec_set(const Stmt& s, Frame& frame) {
  BATON_ASSIGN_OR_RETURN(Value v, eval(*s.expr, frame));
  if (s.attribute.empty()) return assign(s.targets, v, frame, s);
  Value target = lookup(frame, s.targets[0]);
  if (!target.is_dict() || !target.dict_data().is_namespace) {
    return error_at(s.line, s.column, "cannot assign attribute on non-namespace object");
  }
  if (Status stored = check_storable(v, /*in_namespace=*/true); !stored.is_ok()) {
    return at(s.line, s.column, stored);
  }
  target.dict_data().set(Value::string(s.attribute), std::move(v));
  return Status::ok();
}

Value Interpreter::make_macro(const Stmt& s) {
  const Stmt* macro = &s;
  return Value::callable(s.text, [macro](Interpreter& self, CallArgs& args) -> Result<Value> {
    if (self.call_depth_ >= kMaxCallDepth) {
      return resource_exhausted("macro calls nested deeper than " + std::to_string(kMaxCallDepth));
    }
    BATON_RETURN_IF_ERROR(self.take_step());
    const auto& params = macro->targets;
    if (args.positional.size() > params.size()) {
      return invalid_argument("macro '" + macro->text + "' takes not more than " +
                              std::to_string(params.size()) + " argument(s)");
    }
    // Arguments are stored in the macro's names as a set stores values.
    for (const Value& arg : args.positional) BATON_RETURN_IF_ERROR(check_storable(arg, false));
    for (const auto& [name, arg] : args.keyword) BATON_RETURN_IF_ERROR(check_storable(arg, false));
    Frame f{{}, self.root_};
    std::vector<bool> bound(params.size(), false);
    for (size_t i = 0; i < args.positional.size(); ++i) {
      f.set(params[i], args.positional[i]);
      bound[i] = true;
    }
    for (auto& [name, value] : args.keyword) {
      size_t i = 0;
      while (i < params.size() && params[i] != name) ++i;
      if (i == params.size()) {
        return invalid_argument("macro '" + macro->text + "' takes no keyword argument '" + name +
                                "'");
      }
      f.set(name, value);
      bound[i] = true;
    }
    for (size_t i = 0; i < params.size(); ++i) {
      if (bound[i]) continue;
      if (macro->defaults[i]) {
        BATON_ASSIGN_OR_RETURN(Value fallback, self.eval(*macro->defaults[i], f));
        BATON_RETURN_IF_ERROR(check_storable(fallback, false));
        f.set(params[i], std::move(fallback));
      } else {
        f.set(params[i], Value::undefined("parameter '" + params[i] + "' was not provided"));
      }
    }
    ++self.call_depth_;
    std::string out;
    Result<Flow> flow = self.exec(macro->bodies[0], f, out);
    --self.call_depth_;
    if (!flow.is_ok()) return flow.status();
    return Value::string(std::move(out));
  });
}

Result<Value> Interpreter::apply_nested_filter(std::string_view name, const Value& v,
                                               CallArgs& args) {
  // A filter's frame is many times an expression's (under ASan, tens of
  // kilobytes): filters in filters have their own, smaller bound.
  if (nested_filters_ >= kMaxNestedFilters) {
    return resource_exhausted("filters applied by filters nested more than " +
                              std::to_string(kMaxNestedFilters) + " deep");
  }
  ++nested_filters_;
  DepthGuard guard(render_depth_);
  Result<Value> result =
      guard.too_deep() ? Result<Value>(too_deep()) : apply_filter(*this, name, v, args);
  --nested_filters_;
  return result;
}

Result<Value> Interpreter::call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) return undefined_error(callee);
  if (!callee.is_callable()) {
    return invalid_argument(quoted_type(callee) + " object is not callable");
  }
  return callee.callable_data().call(*this, args);
}

Result<Value> Interpreter::apply_filters(const std::vector<ExprPtr>& filters, Value value,
                                         Frame& frame) {
  for (const ExprPtr& f : filters) {
    BATON_ASSIGN_OR_RETURN(CallArgs args, eval_arguments(*f, 1, frame));
    Result<Value> next = apply_filter(*this, f->name, value, args);
    if (!next.is_ok()) return at(*f, next.status());
    value = std::move(next).value();
  }
  return value;
}

Result<CallArgs> Interpreter::eval_arguments(const Expr& e, size_t first, Frame& frame) {
  CallArgs args;
  for (size_t i = first; i < e.items.size(); ++i) {
    BATON_ASSIGN_OR_RETURN(Value v, eval(*e.items[i], frame));
    const std::string& name = e.arg_names[i - first];
    if (name.empty()) {
      args.positional.push_back(std::move(v));
    } else {
      args.keyword.emplace_back(name, std::move(v));
    }
  }
  return args;
}

Result<Value> Interpreter::eval(const Expr& e, Frame& frame) {
  DepthGuard guard(render_depth_);
  if (guard.too_deep()) return at(e, too_deep());
  return eval_node(e, frame);
}

Result<Value> Interpreter::eval_node(const Expr& e, Frame& frame) {
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.value;
    case Expr::Kind::kName:
      return lookup(frame, e.name);
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      std::vector<Value> items;
      for (const ExprPtr& item : e.items) {
        BATON_ASSIGN_OR_RETURN(Value v, eval(*item, frame));
        items.push_back(std::move(v));
      }
      return e.kind == Expr::Kind::kList ? Value::list(std::move(items))
                                         : Value::tuple(std::move(items));
    }
    case Expr::Kind::kDict: {
      Value d = Value::dict();
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        BATON_ASSIGN_OR_RETURN(Value key, eval(*e.items[i], frame));
        BATON_ASSIGN_OR_RETURN(Value value, eval(*e.items[i + 1], frame));
        d.dict_data().set(std::move(key), std::move(value));
      }
      return d;
    }
    case Expr::Kind::kAttribute: {
      BATON_ASSIGN_OR_RETURN(Value obj, eval(*e.items[0], frame));
      if (obj.is_undefined()) return at(e, undefined_error(obj));
      return get_attribute(obj, e.name);
    }
    case Expr::Kind::kItem: {
      BATON_ASSIGN_OR_RETURN(Value obj, eval(*e.items[0], frame));
      BATON_ASSIGN_OR_RETURN(Value key, eval(*e.items[1], frame));
      if (obj.is_undefined()) return at(e, undefined_error(obj));
      return get_item(obj, key);
    }
    case Expr::Kind::kSlice:
      return eval_slice(e, frame);
    case Expr::Kind::kCall: {
      BATON_ASSIGN_OR_RETURN(Value callee, eval(*e.items[0], frame));
      BATON_ASSIGN_OR_RETURN(CallArgs args, eval_arguments(e, 1, frame));
      Result<Value> result = call(callee, args);
      if (!result.is_ok()) return at(e, result.status());
      return result;
    }
    case Expr::Kind::kFilter: {
      BATON_ASSIGN_OR_RETURN(Value operand, eval(*e.items[0], frame));
      BATON_ASSIGN_OR_RETURN(CallArgs args, eval_arguments(e, 1, frame));
      Result<Value> result = apply_filter(*this, e.name, operand, args);
      if (!result.is_ok()) return at(e, result.status());
      return result;
    }
    case Expr::Kind::kTest: {
      BATON_ASSIGN_OR_RETURN(Value operand, eval(*e.items[0], frame));
      BATON_ASSIGN_OR_RETURN(CallArgs args, eval_arguments(e, 1, frame));
      Result<bool> result = apply_test(*this, e.name, operand, args);
      if (!result.is_ok()) return at(e, result.status());
      return Value::boolean(*result != e.negated);
    }
    case Expr::Kind::kCompare:
      return eval_compare(e, frame);
    case Expr::Kind::kUnary: {
      BATON_ASSIGN_OR_RETURN(Value v, eval(*e.items[0], frame));
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (v.is_undefined()) return at(e, undefined_error(v));
      if (e.name == "-") {
        Result<Value> negated = negate(v);
        if (!negated.is_ok()) return at(e, negated.status());
        return negated;
      }
      if (!v.is_number()) {
        return at(e, invalid_argument("bad operand type for unary +: '" + type_name(v) + "'"));
      }
      return v.is_bool() ? Value::integer(v.as_int()) : v;
    }
    case Expr::Kind::kBinary:
      return eval_binary(e, frame);
    case Expr::Kind::kCondition: {
      BATON_ASSIGN_OR_RETURN(Value condition, eval(*e.items[1], frame));
      if (truthy(condition)) return eval(*e.items[0], frame);
      if (e.items[2]) return eval(*e.items[2], frame);
      return Value::undefined("the inline if expression's condition was false and it has no else");
    }
  }
  return internal_error("unknown expression");
}

Result<Value> Interpreter::eval_binary(const Expr& e, Frame& frame) {
  BATON_ASSIGN_OR_RETURN(Value left, eval(*e.items[0], frame));
  if (e.name == "and") return truthy(left) ? eval(*e.items[1], frame) : Result<Value>(left);
  if (e.name == "or") return truthy(left) ? Result<Value>(left) : eval(*e.items[1], frame);
  BATON_ASSIGN_OR_RETURN(Value right, eval(*e.items[1], frame));
  if (e.name == "~") {
    std::string text = to_str(left) + to_str(right);
    BATON_RETURN_IF_ERROR(charge_output(text.size()));
    return Value::string(std::move(text));
  }
  if (left.is_undefined()) return at(e, undefined_error(left));
  if (right.is_undefined()) return at(e, undefined_error(right));
  Result<Value> result = arithmetic(e.name, left, right);
  if (!result.is_ok()) return at(e, result.status());
  if (result->is_string()) BATON_RETURN_IF_ERROR(charge_output(result->as_string().size()));
  return result;
}

Result<Value> Interpreter::eval_compare(const Expr& e, Frame& frame) {
  BATON_ASSIGN_OR_RETURN(Value left, eval(*e.items[0], frame));
  for (size_t i = 1; i < e.items.size(); ++i) {
    BATON_ASSIGN_OR_RETURN(Value right, eval(*e.items[i], frame));
    const std::string& op = e.arg_names[i - 1];
    bool holds = false;
    if (op == "==" || op == "!=") {
      holds = equal(left, right) == (op == "==");
    } else if (op == "in" || op == "not in") {
      Result<bool> found = contains(right, left);
      if (!found.is_ok()) return at(e, found.status());
      holds = *found == (op == "in");
    } else {
      if (left.is_undefined()) return at(e, undefined_error(left));
      if (right.is_undefined()) return at(e, undefined_error(right));
      Result<int> order = compare(left, right);
      if (!order.is_ok()) return at(e, order.status());
      holds = op == "<"    ? *order < 0
              : op == ">"  ? *order > 0
              : op == "<=" ? *order <= 0
                           : *order >= 0;
    }
    if (!holds) return Value::boolean(false);
    left = std::move(right);
  }
  return Value::boolean(true);
}

Result<Value> Interpreter::eval_slice(const Expr& e, Frame& frame) {
  BATON_ASSIGN_OR_RETURN(Value obj, eval(*e.items[0], frame));
  int64_t bounds[3] = {0, 0, 1};
  bool given[3] = {false, false, false};
  for (int k = 0; k < 3; ++k) {
    if (!e.items[size_t(k) + 1]) continue;
    BATON_ASSIGN_OR_RETURN(Value v, eval(*e.items[size_t(k) + 1], frame));
    if (v.is_none()) continue;
    if (!v.is_int() && !v.is_bool()) {
      return at(e, invalid_argument("slice indices must be integers or None"));
    }
    bounds[k] = v.as_int();
    given[k] = true;
  }
  if (obj.is_undefined()) return at(e, undefined_error(obj));
  const int64_t step = bounds[2];
  if (step == 0) return at(e, invalid_argument("slice step cannot be zero"));
  std::vector<uint32_t> cps;
  int64_t n = 0;
  if (obj.is_string()) {
    cps = python_text::code_points(obj.as_string());
    n = int64_t(cps.size());
  } else if (obj.is_sequence()) {
    n = int64_t(obj.list_data().items.size());
  } else {
    return at(e, invalid_argument(quoted_type(obj) + " object is not subscriptable"));
  }
  const auto clamp = [&](int64_t i, bool is_given, int64_t fallback) {
    if (!is_given) return fallback;
    if (i < 0) i += n;
    if (step > 0) return std::clamp<int64_t>(i, 0, n);
    return std::clamp<int64_t>(i, -1, n - 1);
  };
  // A step longer than the sequence takes one item, as it would: cut to
  // n + 1 so that stepping cannot overflow past the end.
  const int64_t stride = std::clamp<int64_t>(step, -(n + 1), n + 1);
  const int64_t start = clamp(bounds[0], given[0], step > 0 ? 0 : n - 1);
  const int64_t stop = clamp(bounds[1], given[1], step > 0 ? n : -1);
  std::vector<int64_t> picked;
  for (int64_t i = start; step > 0 ? i < stop : i > stop; i += stride) picked.push_back(i);
  if (obj.is_string()) {
    std::vector<uint32_t> out;
    for (int64_t i : picked) out.push_back(cps[size_t(i)]);
    std::string text = python_text::from_code_points(out, 0, out.size());
    return obj.is_markup() ? Value::markup(std::move(text)) : Value::string(std::move(text));
  }
  std::vector<Value> out;
  for (int64_t i : picked) out.push_back(obj.list_data().items[size_t(i)]);
  return obj.list_data().is_tuple ? Value::tuple(std::move(out)) : Value::list(std::move(out));
}

Result<Template> Template::parse(std::string_view source) {
  BATON_ASSIGN_OR_RETURN(std::vector<Token> tokens, tokenize(source));
  BATON_ASSIGN_OR_RETURN(Body body, jinja::parse(tokens));
  Template t;
  t.body_ = std::make_shared<const Body>(std::move(body));
  return t;
}

Result<std::string> Template::render(const Value& context, const RenderOptions& options) const {
  Interpreter interpreter(options);
  return interpreter.render(*body_, context);
}

}  // namespace baton::jinja
