#include "engine/jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <initializer_list>

#include "engine/jinja/builtins.h"

namespace baton::jinja {
namespace {

constexpr int kMaxNesting = 200;
// Chains the parser builds in loops (a ~ b ~ c, x|f|g, a.b.c, x if c else
// y if d else z) nest their tree without nesting its calls; rendering and
// freeing the tree recurse through them, so a taller tree is refused here.
constexpr int kMaxExpressionHeight = 256;

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : tokens_(tokens) {}

  Result<Body> run() {
    std::string end;
    BATON_ASSIGN_OR_RETURN(Body body, parse_body({}, end));
    return body;
  }

 private:
  const Token& current() const { return tokens_[pos_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(pos_ + ahead, tokens_.size() - 1)];
  }
  void advance() {
    if (pos_ + 1 < tokens_.size()) ++pos_;
  }
  bool is_op(std::string_view op) const {
    return current().kind == Token::Kind::kOperator && current().text == op;
  }
  bool is_name(std::string_view name) const {
    return current().kind == Token::Kind::kName && current().text == name;
  }
  bool skip_op(std::string_view op) {
    if (!is_op(op)) return false;
    advance();
    return true;
  }
  bool skip_name(std::string_view name) {
    if (!is_name(name)) return false;
    advance();
    return true;
  }

  Status error(const Token& at, const std::string& message) const {
    return invalid_argument("template " + describe_position(at.line, at.column) + ": " + message);
  }
  Status unexpected(const std::string& expected) const {
    const Token& t = current();
    std::string what = t.kind == Token::Kind::kEnd        ? "end of template"
                       : t.kind == Token::Kind::kBlockEnd ? "'%}'"
                       : t.kind == Token::Kind::kPrintEnd ? "'}}'"
                                                          : "'" + t.text + "'";
    return error(t, "unexpected " + what + ", expected " + expected);
  }
  Status expect_op(std::string_view op) {
    if (!skip_op(op)) return unexpected("'" + std::string(op) + "'");
    return Status::ok();
  }
  Status expect_block_end() {
    if (current().kind != Token::Kind::kBlockEnd) return unexpected("'%}'");
    advance();
    return Status::ok();
  }
  Result<std::string> expect_name() {
    if (current().kind != Token::Kind::kName) return unexpected("a name");
    std::string name = current().text;
    advance();
    return name;
  }

  ExprPtr node(Expr::Kind kind, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->line = at.line;
    e->column = at.column;
    return e;
  }
  // e with its height measured over its operands, refused past the limit.
  Result<ExprPtr> sized(ExprPtr e) const {
    int tallest = 0;
    for (const ExprPtr& item : e->items) {
      if (item) tallest = std::max(tallest, item->height);
    }
    e->height = tallest + 1;
    if (e->height > kMaxExpressionHeight) {
      return invalid_argument("template " + describe_position(e->line, e->column) +
                              ": expression nested more than " +
                              std::to_string(kMaxExpressionHeight) + " operations deep");
    }
    return e;
  }
  StmtPtr statement(Stmt::Kind kind, const Token& at) {
    auto s = std::make_unique<Stmt>();
    s->kind = kind;
    s->line = at.line;
    s->column = at.column;
    return s;
  }

  // Statements up to a block tag named in `ends` (its name is consumed and
  // returned in `end`; the rest of that tag is the caller's).
  Result<Body> parse_body(std::initializer_list<std::string_view> ends, std::string& end) {
    Body body;
    while (true) {
      const Token& t = current();
      switch (t.kind) {
        case Token::Kind::kText: {
          auto s = statement(Stmt::Kind::kText, t);
          s->text = t.text;
          body.push_back(std::move(s));
          advance();
          break;
        }
        case Token::Kind::kPrintBegin: {
          advance();
          auto s = statement(Stmt::Kind::kPrint, t);
          BATON_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
          if (current().kind != Token::Kind::kPrintEnd) return unexpected("'}}'");
          advance();
          body.push_back(std::move(s));
          break;
        }
        case Token::Kind::kBlockBegin: {
          advance();
          const Token& tag = current();
          if (tag.kind != Token::Kind::kName) return unexpected("a tag name");
          if (std::find(ends.begin(), ends.end(), tag.text) != ends.end()) {
            end = tag.text;
            advance();
            return body;
          }
          BATON_ASSIGN_OR_RETURN(StmtPtr s, parse_statement());
          body.push_back(std::move(s));
          break;
        }
        case Token::Kind::kEnd: {
          if (ends.size() == 0) return body;
          std::string expected;
          for (std::string_view e : ends)
            expected += (expected.empty() ? "'" : " or '") + std::string(e) + "'";
          return error(t, "unexpected end of template, expected " + expected);
        }
        default:
          return unexpected("text or a tag");
      }
    }
  }

  Result<StmtPtr> parse_statement() {
    if (++depth_ > kMaxNesting) return error(current(), "blocks nested too deeply");
    const Token tag = current();
    advance();
    Result<StmtPtr> s = [&]() -> Result<StmtPtr> {
      if (tag.text == "if") return parse_if(tag);
      if (tag.text == "for") return parse_for(tag);
      if (tag.text == "set") return parse_set(tag);
      if (tag.text == "macro") return parse_macro(tag);
      if (tag.text == "filter") return parse_filter_block(tag);
      if (tag.text == "generation") return parse_scope(tag, "endgeneration");
      if (tag.text == "break" || tag.text == "continue") {
        if (loop_depth_ == 0) return error(tag, "'" + tag.text + "' outside of a loop");
        BATON_RETURN_IF_ERROR(expect_block_end());
        return statement(tag.text == "break" ? Stmt::Kind::kBreak : Stmt::Kind::kContinue, tag);
      }
      return error(tag, "unsupported tag '" + tag.text + "'");
    }();
    --depth_;
    return s;
  }

  Result<StmtPtr> parse_if(const Token& tag) {
    auto s = statement(Stmt::Kind::kIf, tag);
    while (true) {
      BATON_ASSIGN_OR_RETURN(ExprPtr condition, parse_tuple(false));
      BATON_RETURN_IF_ERROR(expect_block_end());
      std::string end;
      BATON_ASSIGN_OR_RETURN(Body body, parse_body({"elif", "else", "endif"}, end));
      s->conditions.push_back(std::move(condition));
      s->bodies.push_back(std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        BATON_RETURN_IF_ERROR(expect_block_end());
        BATON_ASSIGN_OR_RETURN(Body else_body, parse_body({"endif"}, end));
        s->bodies.push_back(std::move(else_body));
      }
      BATON_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
  }

  // Names to assign: `a`, `a, b`, `(a, b)`.
  Result<std::vector<std::string>> parse_targets() {
    std::vector<std::string> names;
    const bool parenthesized = skip_op("(");
    while (true) {
      BATON_ASSIGN_OR_RETURN(std::string name, expect_name());
      names.push_back(std::move(name));
      if (!skip_op(",")) break;
      if (current().kind != Token::Kind::kName) break;
    }
    if (parenthesized) BATON_RETURN_IF_ERROR(expect_op(")"));
    return names;
  }

  Result<StmtPtr> parse_for(const Token& tag) {
    auto s = statement(Stmt::Kind::kFor, tag);
    BATON_ASSIGN_OR_RETURN(s->targets, parse_targets());
    if (!skip_name("in")) return unexpected("'in'");
    BATON_ASSIGN_OR_RETURN(s->expr, parse_tuple(false, /*stop_at_if=*/true));
    if (skip_name("if")) {
      BATON_ASSIGN_OR_RETURN(s->condition, parse_expression());
    }
    if (is_name("recursive")) return error(current(), "unsupported recursive for loops");
    BATON_RETURN_IF_ERROR(expect_block_end());
    ++loop_depth_;
    std::string end;
    Result<Body> body = parse_body({"else", "endfor"}, end);
    --loop_depth_;
    if (!body.is_ok()) return body.status();
    s->bodies.push_back(std::move(body).value());
    if (end == "else") {
      BATON_RETURN_IF_ERROR(expect_block_end());
      BATON_ASSIGN_OR_RETURN(Body else_body, parse_body({"endfor"}, end));
      s->bodies.push_back(std::move(else_body));
    }
    BATON_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_set(const Token& tag) {
    if (current().kind == Token::Kind::kName && peek().kind == Token::Kind::kOperator &&
        peek().text == ".") {
      auto s = statement(Stmt::Kind::kSet, tag);
      s->targets.push_back(current().text);
      advance();
      advance();
      BATON_ASSIGN_OR_RETURN(s->attribute, expect_name());
      BATON_RETURN_IF_ERROR(expect_op("="));
      BATON_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
      BATON_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    BATON_ASSIGN_OR_RETURN(std::vector<std::string> targets, parse_targets());
    if (skip_op("=")) {
      auto s = statement(Stmt::Kind::kSet, tag);
      s->targets = std::move(targets);
      BATON_ASSIGN_OR_RETURN(s->expr, parse_tuple(true));
      BATON_RETURN_IF_ERROR(expect_block_end());
      return s;
    }
    if (targets.size() != 1) return unexpected("'='");
    auto s = statement(Stmt::Kind::kSetBlock, tag);
    s->targets = std::move(targets);
    BATON_RETURN_IF_ERROR(parse_filter_chain(s->filters));
    BATON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    BATON_ASSIGN_OR_RETURN(Body body, parse_body({"endset"}, end));
    s->bodies.push_back(std::move(body));
    BATON_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_macro(const Token& tag) {
    auto s = statement(Stmt::Kind::kMacro, tag);
    BATON_ASSIGN_OR_RETURN(s->text, expect_name());
    BATON_RETURN_IF_ERROR(expect_op("("));
    while (!is_op(")")) {
      if (!s->targets.empty()) BATON_RETURN_IF_ERROR(expect_op(","));
      if (is_op(")")) break;
      BATON_ASSIGN_OR_RETURN(std::string name, expect_name());
      s->targets.push_back(std::move(name));
      ExprPtr fallback;
      if (skip_op("=")) {
        BATON_ASSIGN_OR_RETURN(fallback, parse_expression());
      } else if (!s->defaults.empty() && s->defaults.back() != nullptr) {
        return error(current(), "non-default argument follows default argument");
      }
      s->defaults.push_back(std::move(fallback));
    }
    advance();
    BATON_RETURN_IF_ERROR(expect_block_end());
    const int saved_loops = loop_depth_;
    loop_depth_ = 0;
    ++macro_depth_;
    std::string end;
    Result<Body> body = parse_body({"endmacro"}, end);
    --macro_depth_;
    loop_depth_ = saved_loops;
    if (!body.is_ok()) return body.status();
    s->bodies.push_back(std::move(body).value());
    if (current().kind == Token::Kind::kName) advance();  // {% endmacro name %}
    BATON_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_filter_block(const Token& tag) {
    auto s = statement(Stmt::Kind::kFilterBlock, tag);
    BATON_RETURN_IF_ERROR(parse_filter_chain(s->filters, /*leading_bar=*/false));
    BATON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    BATON_ASSIGN_OR_RETURN(Body body, parse_body({"endfilter"}, end));
    s->bodies.push_back(std::move(body));
    BATON_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  Result<StmtPtr> parse_scope(const Token& tag, std::string_view end_tag) {
    auto s = statement(Stmt::Kind::kScope, tag);
    BATON_RETURN_IF_ERROR(expect_block_end());
    std::string end;
    BATON_ASSIGN_OR_RETURN(Body body, parse_body({end_tag}, end));
    s->bodies.push_back(std::move(body));
    BATON_RETURN_IF_ERROR(expect_block_end());
    return s;
  }

  // `| f(args) | g` (the first bar optional for {% filter %}); each becomes a
  // kFilter node whose operand is filled in at render time.
  Status parse_filter_chain(std::vector<ExprPtr>& filters, bool leading_bar = true) {
    bool first = true;
    while (true) {
      if (!(first && !leading_bar) && !skip_op("|")) return Status::ok();
      first = false;
      BATON_ASSIGN_OR_RETURN(ExprPtr f, parse_filter(nullptr));
      filters.push_back(std::move(f));
    }
  }

  // Jinja2's parse_tuple: one expression, or a tuple when commas follow.
  Result<ExprPtr> parse_tuple(bool with_condition, bool stop_at_if = false) {
    const Token start = current();
    std::vector<ExprPtr> items;
    bool is_tuple = false;
    while (true) {
      if (!items.empty() && !skip_op(",")) break;
      if (current().kind == Token::Kind::kBlockEnd || current().kind == Token::Kind::kPrintEnd ||
          is_op(")") || (stop_at_if && is_name("if"))) {
        if (items.empty()) return unexpected("an expression");
        break;
      }
      BATON_ASSIGN_OR_RETURN(ExprPtr e, with_condition ? parse_expression() : parse_or());
      items.push_back(std::move(e));
      if (is_op(",")) {
        is_tuple = true;
      } else {
        break;
      }
    }
    if (!is_tuple) return std::move(items.front());
    auto t = node(Expr::Kind::kTuple, start);
    t->items = std::move(items);
    return sized(std::move(t));
  }

  Result<ExprPtr> parse_expression() {
    if (++depth_ > kMaxNesting) return error(current(), "expression nested too deeply");
    Result<ExprPtr> e = parse_condition();
    --depth_;
    return e;
  }

  Result<ExprPtr> parse_condition() {
    BATON_ASSIGN_OR_RETURN(ExprPtr value, parse_or());
    while (is_name("if")) {
      const Token at = current();
      advance();
      auto c = node(Expr::Kind::kCondition, at);
      BATON_ASSIGN_OR_RETURN(ExprPtr condition, parse_or());
      ExprPtr otherwise;
      if (skip_name("else")) {
        if (++depth_ > kMaxNesting) return error(at, "expression nested too deeply");
        Result<ExprPtr> e = parse_condition();
        --depth_;
        if (!e.is_ok()) return e.status();
        otherwise = std::move(e).value();
      }
      c->items.push_back(std::move(value));
      c->items.push_back(std::move(condition));
      c->items.push_back(std::move(otherwise));
      BATON_ASSIGN_OR_RETURN(value, sized(std::move(c)));
    }
    return value;
  }

  Result<ExprPtr> binary(const Token& at, std::string op, ExprPtr left, ExprPtr right) {
    auto b = node(Expr::Kind::kBinary, at);
    b->name = std::move(op);
    b->items.push_back(std::move(left));
    b->items.push_back(std::move(right));
    return sized(std::move(b));
  }

  Result<ExprPtr> parse_or() {
    BATON_ASSIGN_OR_RETURN(ExprPtr left, parse_and());
    while (is_name("or")) {
      const Token at = current();
      advance();
      BATON_ASSIGN_OR_RETURN(ExprPtr right, parse_and());
      BATON_ASSIGN_OR_RETURN(left, binary(at, "or", std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_and() {
    BATON_ASSIGN_OR_RETURN(ExprPtr left, parse_not());
    while (is_name("and")) {
      const Token at = current();
      advance();
      BATON_ASSIGN_OR_RETURN(ExprPtr right, parse_not());
      BATON_ASSIGN_OR_RETURN(left, binary(at, "and", std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_not() {
    if (is_name("not")) {
      const Token at = current();
      advance();
      if (++depth_ > kMaxNesting) return error(at, "expression nested too deeply");
      auto u = node(Expr::Kind::kUnary, at);
      u->name = "not";
      Result<ExprPtr> operand = parse_not();
      --depth_;
      if (!operand.is_ok()) return operand.status();
      u->items.push_back(std::move(operand).value());
      return sized(std::move(u));
    }
    return parse_compare();
  }

  Result<ExprPtr> parse_compare() {
    const Token start = current();
    BATON_ASSIGN_OR_RETURN(ExprPtr first, parse_math1());
    auto c = node(Expr::Kind::kCompare, start);
    c->items.push_back(std::move(first));
    while (true) {
      std::string op;
      if (current().kind == Token::Kind::kOperator &&
          (current().text == "==" || current().text == "!=" || current().text == "<" ||
           current().text == ">" || current().text == "<=" || current().text == ">=")) {
        op = current().text;
        advance();
      } else if (is_name("in")) {
        op = "in";
        advance();
      } else if (is_name("not") && peek().kind == Token::Kind::kName && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        break;
      }
      BATON_ASSIGN_OR_RETURN(ExprPtr operand, parse_math1());
      c->arg_names.push_back(std::move(op));
      c->items.push_back(std::move(operand));
    }
    if (c->arg_names.empty()) return std::move(c->items.front());
    return sized(std::move(c));
  }

  template <typename Next>
  Result<ExprPtr> parse_left_assoc(std::initializer_list<std::string_view> ops, Next next) {
    BATON_ASSIGN_OR_RETURN(ExprPtr left, (this->*next)());
    while (current().kind == Token::Kind::kOperator &&
           std::find(ops.begin(), ops.end(), current().text) != ops.end()) {
      const Token at = current();
      advance();
      BATON_ASSIGN_OR_RETURN(ExprPtr right, (this->*next)());
      BATON_ASSIGN_OR_RETURN(left, binary(at, at.text, std::move(left), std::move(right)));
    }
    return left;
  }

  Result<ExprPtr> parse_math1() { return parse_left_assoc({"+", "-"}, &Parser::parse_concat); }
  Result<ExprPtr> parse_concat() { return parse_left_assoc({"~"}, &Parser::parse_math2); }
  Result<ExprPtr> parse_math2() {
    return parse_left_assoc({"*", "/", "//", "%"}, &Parser::parse_pow);
  }
  Result<ExprPtr> parse_pow() { return parse_left_assoc({"**"}, &Parser::parse_unary_filtered); }
  Result<ExprPtr> parse_unary_filtered() { return parse_unary(true); }

  Result<ExprPtr> parse_unary(bool with_filter) {
    ExprPtr e;
    if (is_op("-") || is_op("+")) {
      const Token at = current();
      advance();
      if (++depth_ > kMaxNesting) return error(at, "expression nested too deeply");
      Result<ExprPtr> operand = parse_unary(false);
      --depth_;
      if (!operand.is_ok()) return operand.status();
      e = node(Expr::Kind::kUnary, at);
      e->name = at.text;
      e->items.push_back(std::move(operand).value());
      BATON_ASSIGN_OR_RETURN(e, sized(std::move(e)));
    } else {
      BATON_ASSIGN_OR_RETURN(e, parse_primary());
    }
    BATON_ASSIGN_OR_RETURN(e, parse_postfix(std::move(e)));
    if (with_filter) {
      BATON_ASSIGN_OR_RETURN(e, parse_filter_expr(std::move(e)));
    }
    return e;
  }

  Result<ExprPtr> parse_primary() {
    const Token t = current();
    switch (t.kind) {
      case Token::Kind::kName: {
        advance();
        if (t.text == "true" || t.text == "True" || t.text == "false" || t.text == "False") {
          auto e = node(Expr::Kind::kLiteral, t);
          e->value = Value::boolean(t.text[0] == 't' || t.text[0] == 'T');
          return e;
        }
        if (t.text == "none" || t.text == "None") {
          auto e = node(Expr::Kind::kLiteral, t);
          e->value = Value::none();
          return e;
        }
        if (macro_depth_ > 0 && (t.text == "caller" || t.text == "varargs" || t.text == "kwargs")) {
          return error(t, "unsupported macro variable '" + t.text + "'");
        }
        auto e = node(Expr::Kind::kName, t);
        e->name = t.text;
        return e;
      }
      case Token::Kind::kString: {
        std::string text;
        while (current().kind == Token::Kind::kString) {
          text += current().text;
          advance();
        }
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value::string(std::move(text));
        return e;
      }
      case Token::Kind::kInteger: {
        advance();
        auto e = node(Expr::Kind::kLiteral, t);
        try {
          e->value = Value::integer(std::stoll(t.text));
        } catch (const std::exception&) {
          return error(t, "integer literal out of range");
        }
        return e;
      }
      case Token::Kind::kFloat: {
        advance();
        auto e = node(Expr::Kind::kLiteral, t);
        e->value = Value::floating(std::strtod(t.text.c_str(), nullptr));
        return e;
      }
      case Token::Kind::kOperator:
        if (t.text == "(") {
          advance();
          if (skip_op(")")) {
            auto e = node(Expr::Kind::kTuple, t);
            return e;
          }
          BATON_ASSIGN_OR_RETURN(ExprPtr inner, parse_tuple(true));
          BATON_RETURN_IF_ERROR(expect_op(")"));
          return inner;
        }
        if (t.text == "[") {
          advance();
          auto e = node(Expr::Kind::kList, t);
          while (!is_op("]")) {
            if (!e->items.empty()) BATON_RETURN_IF_ERROR(expect_op(","));
            if (is_op("]")) break;
            BATON_ASSIGN_OR_RETURN(ExprPtr item, parse_expression());
            e->items.push_back(std::move(item));
          }
          advance();
          return sized(std::move(e));
        }
        if (t.text == "{") {
          advance();
          auto e = node(Expr::Kind::kDict, t);
          while (!is_op("}")) {
            if (!e->items.empty()) BATON_RETURN_IF_ERROR(expect_op(","));
            if (is_op("}")) break;
            BATON_ASSIGN_OR_RETURN(ExprPtr key, parse_expression());
            BATON_RETURN_IF_ERROR(expect_op(":"));
            BATON_ASSIGN_OR_RETURN(ExprPtr value, parse_expression());
            e->items.push_back(std::move(key));
            e->items.push_back(std::move(value));
          }
          advance();
          return sized(std::move(e));
        }
        break;
      default:
        break;
    }
    return unexpected("an expression");
  }

  Result<ExprPtr> parse_postfix(ExprPtr e) {
    while (true) {
      if (is_op(".") || is_op("[")) {
        BATON_ASSIGN_OR_RETURN(e, parse_subscript(std::move(e)));
      } else if (is_op("(")) {
        BATON_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_filter_expr(ExprPtr e) {
    while (true) {
      if (is_op("|")) {
        advance();
        BATON_ASSIGN_OR_RETURN(e, parse_filter(std::move(e)));
      } else if (is_name("is")) {
        BATON_ASSIGN_OR_RETURN(e, parse_test(std::move(e)));
      } else if (is_op("(")) {
        BATON_ASSIGN_OR_RETURN(e, parse_call(std::move(e)));
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> parse_subscript(ExprPtr e) {
    const Token at = current();
    if (skip_op(".")) {
      if (current().kind == Token::Kind::kName) {
        auto a = node(Expr::Kind::kAttribute, at);
        a->name = current().text;
        advance();
        a->items.push_back(std::move(e));
        return sized(std::move(a));
      }
      if (current().kind == Token::Kind::kInteger) {
        auto index = node(Expr::Kind::kLiteral, current());
        int64_t i = 0;
        const std::string& text = current().text;
        const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
        if (ec != std::errc() || end != text.data() + text.size()) {
          return error(current(), "integer literal out of range");
        }
        index->value = Value::integer(i);
        advance();
        auto item = node(Expr::Kind::kItem, at);
        item->items.push_back(std::move(e));
        item->items.push_back(std::move(index));
        return sized(std::move(item));
      }
      return unexpected("a name after '.'");
    }
    advance();  // [
    std::vector<ExprPtr> parts(3);
    bool is_slice = false;
    for (int part = 0; part < 3; ++part) {
      if (!is_op(":") && !is_op("]")) {
        BATON_ASSIGN_OR_RETURN(parts[size_t(part)], parse_expression());
      }
      if (part < 2 && skip_op(":")) {
        is_slice = true;
        continue;
      }
      break;
    }
    if (is_op(",")) return error(current(), "unsupported tuple subscript");
    BATON_RETURN_IF_ERROR(expect_op("]"));
    if (!is_slice) {
      if (parts[0] == nullptr) return error(at, "empty subscript");
      auto item = node(Expr::Kind::kItem, at);
      item->items.push_back(std::move(e));
      item->items.push_back(std::move(parts[0]));
      return sized(std::move(item));
    }
    auto slice = node(Expr::Kind::kSlice, at);
    slice->items.push_back(std::move(e));
    for (auto& p : parts) slice->items.push_back(std::move(p));
    return sized(std::move(slice));
  }

  // (args) into e's items from index 1 on, with their keyword names.
  Status parse_arguments(Expr& e) {
    BATON_RETURN_IF_ERROR(expect_op("("));
    bool first = true;
    bool keywords_seen = std::any_of(e.arg_names.begin(), e.arg_names.end(),
                                     [](const std::string& n) { return !n.empty(); });
    while (!is_op(")")) {
      if (!first) BATON_RETURN_IF_ERROR(expect_op(","));
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) return error(current(), "unsupported * and ** arguments");
      std::string keyword;
      if (current().kind == Token::Kind::kName && peek().kind == Token::Kind::kOperator &&
          peek().text == "=") {
        keyword = current().text;
        keywords_seen = true;
        advance();
        advance();
      } else if (keywords_seen) {
        return error(current(), "positional argument follows keyword argument");
      }
      BATON_ASSIGN_OR_RETURN(ExprPtr arg, parse_expression());
      e.items.push_back(std::move(arg));
      e.arg_names.push_back(std::move(keyword));
    }
    advance();
    return Status::ok();
  }

  Result<ExprPtr> parse_call(ExprPtr callee) {
    const Token at = current();
    if (callee->kind == Expr::Kind::kAttribute && !is_known_method(callee->name)) {
      return error(at, "unsupported method '" + callee->name + "'");
    }
    auto c = node(Expr::Kind::kCall, at);
    c->items.push_back(std::move(callee));
    BATON_RETURN_IF_ERROR(parse_arguments(*c));
    return sized(std::move(c));
  }

  Result<ExprPtr> parse_filter(ExprPtr operand) {
    const Token at = current();
    BATON_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (skip_op(".")) {
      BATON_ASSIGN_OR_RETURN(std::string part, expect_name());
      name += "." + part;
    }
    if (!is_known_filter(name)) return error(at, "unsupported filter '" + name + "'");
    auto f = node(Expr::Kind::kFilter, at);
    f->name = std::move(name);
    f->items.push_back(std::move(operand));
    if (is_op("(")) BATON_RETURN_IF_ERROR(parse_arguments(*f));
    return sized(std::move(f));
  }

  Result<ExprPtr> parse_test(ExprPtr operand) {
    const Token at = current();
    advance();  // is
    const bool negated = skip_name("not");
    const Token name_token = current();
    BATON_ASSIGN_OR_RETURN(std::string name, expect_name());
    while (skip_op(".")) {
      BATON_ASSIGN_OR_RETURN(std::string part, expect_name());
      name += "." + part;
    }
    if (!is_known_test(name)) return error(name_token, "unsupported test '" + name + "'");
    auto t = node(Expr::Kind::kTest, at);
    t->name = std::move(name);
    t->negated = negated;
    t->items.push_back(std::move(operand));
    if (is_op("(")) {
      BATON_RETURN_IF_ERROR(parse_arguments(*t));
    } else {
      const Token& c = current();
      const bool starts_argument =
          (c.kind == Token::Kind::kName && c.text != "else" && c.text != "or" && c.text != "and") ||
          c.kind == Token::Kind::kString || c.kind == Token::Kind::kInteger ||
          c.kind == Token::Kind::kFloat ||
          (c.kind == Token::Kind::kOperator && (c.text == "(" || c.text == "[" || c.text == "{"));
      if (starts_argument) {
        BATON_ASSIGN_OR_RETURN(ExprPtr arg, parse_primary());
        BATON_ASSIGN_OR_RETURN(arg, parse_postfix(std::move(arg)));
        t->items.push_back(std::move(arg));
        t->arg_names.emplace_back();
      }
    }
    return sized(std::move(t));
  }

  const std::vector<Token>& tokens_;
  size_t pos_ = 0;
  int depth_ = 0;
  int loop_depth_ = 0;
  int macro_depth_ = 0;
};

}  // namespace

Result<Body> parse(const std::vector<Token>& tokens) { return Parser(tokens).run(); }

}  // namespace baton::jinja
