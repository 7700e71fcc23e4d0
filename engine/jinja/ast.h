// engine/jinja/ast.h — a parsed template: expressions and statements.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "engine/jinja/value.h"

namespace baton::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,    // value
    kName,       // name
    kList,       // items
    kTuple,      // items
    kDict,       // items: key, value, key, value, ...
    kAttribute,  // items[0].name
    kItem,       // items[0][items[1]]
    kSlice,      // items[0][items[1]:items[2]:items[3]] (null parts left out)
    kCall,       // items[0](items[1..]) with arg_names
    kFilter,     // items[0] | name(items[1..]) with arg_names
    kTest,       // items[0] is [not] name(items[1..])
    kCompare,    // items[0] arg_names[0] items[1] arg_names[1] items[2] ...: ==, <, in, not in, ...
    kUnary,      // op items[0]: "-", "+", "not"
    kBinary,     // items[0] name items[1]: arithmetic, "~", "and", "or"
    kCondition,  // items[0] if items[1] else items[2] (null: Undefined)
  };
  Kind kind;
  int line = 0;
  int column = 0;
  // 1 for a leaf, else one more than the tallest operand.
  int height = 1;
  Value value;
  std::string name;  // names, attributes, filters, tests, operators
  bool negated = false;
  std::vector<ExprPtr> items;
  // For calls, filters and tests: one per argument after the callee or
  // operand; empty for a positional one.
  std::vector<std::string> arg_names;
};

struct Stmt;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

struct Stmt {
  enum class Kind {
    kText,         // text
    kPrint,        // {{ expr }}
    kIf,           // conditions[i] -> bodies[i]; a last body without condition is else
    kFor,          // for targets in expr [if condition]: bodies[0], else bodies[1]
    kSet,          // set targets = expr, or set namespace.attribute = expr
    kSetBlock,     // set targets[0] %}bodies[0]{% endset, through filters
    kMacro,        // macro name(targets with defaults) bodies[0]
    kFilterBlock,  // filter filters bodies[0]
    kBreak,
    kContinue,
    kScope,  // bodies[0] rendered as is ({% generation %})
  };
  Kind kind;
  int line = 0;
  int column = 0;
  std::string text;
  ExprPtr expr;
  ExprPtr condition;
  std::vector<std::string> targets;
  std::string attribute;            // kSet on a namespace: targets[0].attribute
  std::vector<ExprPtr> defaults;    // kMacro: per target, null when none
  std::vector<ExprPtr> conditions;  // kIf
  std::vector<Body> bodies;
  std::vector<ExprPtr> filters;  // kSetBlock, kFilterBlock: kFilter nodes on a null operand
};

}  // namespace baton::jinja
