// engine/jinja/interpreter.h — walks a parsed template: statements write
// text, expressions compute values, with Jinja2's scoping (a for loop's body
// and a macro's body get their own names; if does not).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/jinja/ast.h"
#include "engine/jinja/template.h"

namespace baton::jinja {

class Interpreter {
 public:
  explicit Interpreter(const RenderOptions& options);

  Result<std::string> render(const Body& body, const Value& context);
  Result<Value> call(const Value& callee, CallArgs& args);
  // A filter a filter applies (map's): one level of the render's depth, as
  // an expression is, since `map('map', 'map', ...)` nests without one.
  Result<Value> apply_nested_filter(std::string_view name, const Value& v, CallArgs& args);
  Status charge_output(size_t bytes);

 private:
  struct Frame {
    std::vector<std::pair<std::string, Value>> names;
    Frame* parent = nullptr;
    void set(const std::string& name, Value value);
  };
  enum class Flow { kNormal, kBreak, kContinue };

  Value lookup(const Frame& frame, const std::string& name) const;
  Result<Flow> exec(const Body& body, Frame& frame, std::string& out);
  Result<Flow> exec_statements(const Body& body, Frame& frame, std::string& out);
  Result<Flow> exec_for(const Stmt& s, Frame& frame, std::string& out);
  Status exec_set(const Stmt& s, Frame& frame);
  Status assign(const std::vector<std::string>& targets, const Value& value, Frame& frame,
                const Stmt& at);
  Value make_macro(const Stmt& s);
  Result<Value> apply_filters(const std::vector<ExprPtr>& filters, Value value, Frame& frame);

  Result<Value> eval(const Expr& e, Frame& frame);
  Result<Value> eval_node(const Expr& e, Frame& frame);
  Status take_step();
  Result<CallArgs> eval_arguments(const Expr& e, size_t first, Frame& frame);
  Result<Value> eval_binary(const Expr& e, Frame& frame);
  Result<Value> eval_compare(const Expr& e, Frame& frame);
  Result<Value> eval_slice(const Expr& e, Frame& frame);

  RenderOptions options_;
  Value globals_;
  Value context_;
  Frame* root_ = nullptr;
  size_t output_bytes_ = 0;
  size_t steps_ = 0;
  int call_depth_ = 0;
  int render_depth_ = 0;
  int nested_filters_ = 0;
};

// An error at an expression or statement's position.
Status error_at(int line, int column, const std::string& message);

}  // namespace baton::jinja
