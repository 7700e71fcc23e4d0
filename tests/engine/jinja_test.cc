// The Jinja engine's refusals, errors and bounds. Rendering itself is held
// against Python's jinja2 by chat_template_test.py; these check what that
// comparison cannot: that what Baton lacks is refused at load with its
// position, that render errors name theirs, and that no template or input
// takes unbounded memory, time or stack.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "engine/jinja/template.h"

namespace baton::jinja {
namespace {

Value context_with(const std::string& json) {
  return Value::from_json(nlohmann::ordered_json::parse(json));
}

// A fresh draw from [lo, hi] each run.
int draw(int lo, int hi) {
  static std::mt19937 rng(std::random_device{}());
  return std::uniform_int_distribution<int>(lo, hi)(rng);
}

std::string load_error(const std::string& source) {
  auto t = Template::parse(source);
  EXPECT_FALSE(t.is_ok()) << source;
  return t.is_ok() ? "" : t.status().message();
}

TEST(JinjaTest, RefusesWhatItLacksAtLoadNamingItAndItsPosition) {
  struct Case {
    std::string source;
    std::string names;
    std::string position;
  };
  const Case cases[] = {
      {"ab\n  {% include 'x.j2' %}", "unsupported tag 'include'", "line 2, column 6"},
      {"{{ x | from_json }}", "unsupported filter 'from_json'", "line 1, column 8"},
      {"{% if x is prime %}{% endif %}", "unsupported test 'prime'", "line 1, column 12"},
      {"{{ xs.append(1) }}", "unsupported method 'append'", "line 1, column 13"},
      {"{% for x in xs recursive %}{% endfor %}", "recursive", "line 1, column 16"},
      {"{% break %}", "'break' outside of a loop", "line 1, column 4"},
      {"{% macro m() %}{{ caller() }}{% endmacro %}", "unsupported macro variable 'caller'",
       "line 1, column 19"},
      {"{{ f(*args) }}", "unsupported * and ** arguments", "line 1, column 6"},
  };
  for (const Case& c : cases) {
    const std::string message = load_error(c.source);
    EXPECT_NE(message.find(c.names), std::string::npos) << c.source << " -> " << message;
    EXPECT_NE(message.find(c.position), std::string::npos) << c.source << " -> " << message;
  }
}

TEST(JinjaTest, MalformedTemplatesAreLoadErrors) {
  for (const std::string source :
       {"{{ x ", "{% if x %}", "{% for x in y %}", "{{ (1 }}", "{{ 1) }}", "{# open", "{{ 'abc }}",
        "{% set %}", "{% macro m(a=1, b) %}{% endmacro %}", "{{ x[1, 2] }}", "{% endif %}",
        "{% if x %}{% endfor %}", "{{ x.0x }}", "{{ '\\x4' }}", "{{ }}",
        // Integers past int64, as a literal and as an index (found by the fuzzer).
        "{{ 99999999999999999999 }}", "{{ x.99999999999999999999 }}"}) {
    EXPECT_FALSE(Template::parse(source).is_ok()) << source;
  }
}

TEST(JinjaTest, AttributePathsPastInt64AreKeysNotCrashes) {
  auto t = Template::parse("{{ rows|map(attribute='99999999999999999999')|list }}");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  auto out = t->render(context_with(R"({"rows": [{"a": 1}]})"));
  ASSERT_TRUE(out.is_ok()) << out.status().message();
  EXPECT_EQ(*out, "[Undefined]");
}

// Values from a request (chat_template_kwargs, tool arguments) past int64,
// where Python would hold a big integer: errors, not undefined behaviour
// (UBSan: negation and llabs of INT64_MIN, float-to-int casts out of range).
TEST(JinjaTest, IntegersPastInt64AreErrorsNotUndefinedBehaviour) {
  const Value context = context_with(
      R"({"low": -9223372036854775808, "huge": 1e300, "text": "1e300", "wide": 18446744073709551615})");
  for (const char* source :
       {"{{ -low }}", "{{ low|abs }}", "{{ huge|int }}", "{{ text|int }}", "{{ wide|int }}",
        "{{ '%d' % huge }}", "{{ '%x' % wide }}", "{{ 2 ** 63 }}", "{{ 3037000500 ** 3 }}",
        "{{ '-9223372036854775809'|int }}", "{{ 'ffffffffffffffffffff'|int(base=16) }}"}) {
    SCOPED_TRACE(source);
    auto t = Template::parse(source);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    auto out = t->render(context);
    EXPECT_FALSE(out.is_ok()) << *out;
  }
}

// Integer powers as Python computes them, in steps that grow with the
// exponent's bits (an exponent of 10**18 rendered in about 60).
TEST(JinjaTest, IntegerPowersKeepTheirSignAndTakeLogarithmicSteps) {
  const int e = 2 * draw(0, 1000) + 1;  // odd
  const std::string huge_odd = std::to_string(int64_t(1e18) + 1);
  const struct {
    std::string source, expected;
  } cases[] = {
      {"{{ (-1) ** " + std::to_string(e) + " }}", "-1"},
      {"{{ (-1) ** " + std::to_string(e + 1) + " }}", "1"},
      {"{{ (-1) ** " + huge_odd + " }}", "-1"},
      {"{{ (-2) ** 63 }}", "-9223372036854775808"},
      {"{{ 2 ** 62 }}", "4611686018427387904"},
      {"{{ 0 ** 0 }}|{{ 0 ** " + huge_odd + " }}|{{ 1 ** " + huge_odd + " }}", "1|0|1"},
      {"{{ (-3) ** 5 }}|{{ 7 ** 2 }}", "-243|49"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.source);
    auto t = Template::parse(c.source);
    ASSERT_TRUE(t.is_ok()) << t.status().message();
    auto out = t->render(Value::dict());
    ASSERT_TRUE(out.is_ok()) << out.status().message();
    EXPECT_EQ(*out, c.expected);
  }
}

TEST(JinjaTest, FormatIndicesPastSizeTAreErrorsNotCrashes) {
  auto t = Template::parse("{{ '{99999999999999999999999}'.format(1) }}");
  ASSERT_TRUE(t.is_ok());
  EXPECT_FALSE(t->render(Value::dict()).is_ok());
}

TEST(JinjaTest, RenderErrorsNameTheirPosition) {
  auto t = Template::parse("line one\n{{ message.content.text }}");
  ASSERT_TRUE(t.is_ok()) << t.status().message();
  auto out = t->render(context_with(R"({"message": {}})"));
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("line 2"), std::string::npos) << out.status().message();
  EXPECT_NE(out.status().message().find("content"), std::string::npos) << out.status().message();
}

TEST(JinjaTest, RaiseExceptionCarriesTheTemplatesMessage) {
  auto t = Template::parse("{{ raise_exception('Conversation roles must alternate') }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(Value::dict());
  ASSERT_FALSE(out.is_ok());
  EXPECT_NE(out.status().message().find("raise_exception: Conversation roles must alternate"),
            std::string::npos)
      << out.status().message();
}

TEST(JinjaTest, OutputIsBounded) {
  auto t = Template::parse("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}");
  ASSERT_TRUE(t.is_ok());
  RenderOptions options;
  options.max_output_bytes = 1 << 20;
  auto out = t->render(Value::dict(), options);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaTest, StringsBuiltByConcatenationAreBounded) {
  auto t = Template::parse(
      "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s|length }}");
  ASSERT_TRUE(t.is_ok());
  RenderOptions options;
  options.max_output_bytes = 1 << 20;
  auto out = t->render(Value::dict(), options);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

// Padding, indenting and replacing are bounded as concatenation is: each
// refused before it builds its string, naming what would have built it.
TEST(JinjaTest, StringsBuiltByPaddingIndentingAndReplacingAreBounded) {
  for (const char* source :
       {"{{ 'x'.center(10000000000) }}", "{{ '1'.zfill(100000000000) }}",
        "{{ 'x'.ljust(20000000, 'ab') }}", "{{ 'a\nb'|indent(1000000000) }}",
        "{{ [1, 2]|tojson(indent=1000000000) }}",
        "{% set ns = namespace(s='xx') %}{% for i in range(40) %}"
        "{% set ns.s = ns.s.replace('x', 'xx') %}{% endfor %}{{ ns.s|length }}"}) {
    SCOPED_TRACE(source);
    auto t = Template::parse(source);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto out = t->render(Value::dict(), RenderOptions{});
    ASSERT_FALSE(out.is_ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted) << out.status().to_string();
    EXPECT_NE(out.status().message().find("a template may build at most"), std::string::npos)
        << out.status().to_string();
  }
  // Within the bound, the same calls render as Python does.
  auto t = Template::parse(
      "{{ 'ab'.center(6, '*') }}|{{ '7'.zfill(3) }}|{{ 'aXa'.replace('a', 'bb') }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(Value::dict(), RenderOptions{});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, "**ab**|007|bbXbb");
}

TEST(JinjaTest, LoopsAreBounded) {
  auto t = Template::parse(
      "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}");
  ASSERT_TRUE(t.is_ok());
  RenderOptions options;
  options.max_steps = 100000;
  auto out = t->render(Value::dict(), options);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaTest, RecursiveMacrosHitADepthLimitNotTheStack) {
  auto t = Template::parse("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(Value::dict());
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
}

TEST(JinjaTest, DeepNestingIsALoadErrorNotAStackOverflow) {
  for (const std::string& open : {std::string("("), std::string("["), std::string("not "),
                                  std::string("-"), std::string("{% if x %}")}) {
    std::string source = "{{ ";
    if (open.rfind("{%", 0) == 0) source.clear();
    for (int i = 0; i < 100000; ++i) source += open;
    EXPECT_FALSE(Template::parse(source).is_ok()) << open;
  }
}

// Chains the parser builds in a loop, not by recursion, still make a tree
// that rendering and freeing recurse through: a long one is refused at load
// with its position, a short one renders.
TEST(JinjaTest, LongChainsAreALoadErrorNotAStackOverflow) {
  struct Chain {
    std::string first, link, rendered;  // rendered: of the first and 100 links
  };
  // d.d.d... 100 deep: "leaf".
  Value d = Value::string("leaf");
  for (int i = 0; i < 100; ++i) {
    Value outer = Value::dict();
    outer.dict_data().set(Value::string("d"), d);
    d = outer;
  }
  Value context = Value::dict();
  context.dict_data().set(Value::string("d"), d);
  for (const Chain& c : std::vector<Chain>{{"'a'", " ~ 'a'", std::string(101, 'a')},
                                           {"'A'", "|lower", "a"},
                                           {"d", ".d", "leaf"},
                                           {"d", "['d']", "leaf"},
                                           {"1", " + 1", "101"},
                                           {"true", " and true", "True"},
                                           {"2", " if false else 1", "1"},
                                           {"'a'", ".upper()", "A"}}) {
    SCOPED_TRACE(c.link);
    std::string long_chain = "{{ " + c.first;
    for (int i = 0; i < 100000; ++i) long_chain += c.link;
    auto refused = Template::parse(long_chain + " }}");
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(refused.status().message().find("template line 1, column"), std::string::npos)
        << refused.status().message();

    std::string short_chain = "{{ " + c.first;
    for (int i = 0; i < 100; ++i) short_chain += c.link;
    auto t = Template::parse(short_chain + " }}");
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto out = t->render(context);
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, c.rendered);
  }
}

// A template that wraps a value in itself, in a loop or statement by
// statement, is stopped at the nesting bound; printing or freeing the value
// would otherwise recurse past the stack.
TEST(JinjaTest, ValuesNestedPastTheBoundAreRefused) {
  std::string by_statements = "{% set x = 1 %}";
  for (int i = 0; i < 100000; ++i) by_statements += "{% set x = [x] %}";
  for (const std::string& source :
       {std::string("{% set ns = namespace(x=1) %}{% for i in range(1000) %}"
                    "{% for j in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}{% endfor %}"
                    "{{ ns.x|length }}"),
        std::string("{% set ns = namespace(x=1) %}{% for i in range(100000) %}"
                    "{% set ns.x = {'k': ns.x} %}{% endfor %}{{ ns.x|tojson }}"),
        std::string("{% set ns = namespace(x=1) %}{% for i in range(100000) %}"
                    "{% for j in [ns.x, 0] %}{% set ns.x = loop %}{% endfor %}{% endfor %}"
                    "{{ ns.x }}"),
        by_statements}) {
    SCOPED_TRACE(source.substr(0, 120));
    auto t = Template::parse(source);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto out = t->render(Value::dict());
    ASSERT_FALSE(out.is_ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted) << out.status().to_string();
    EXPECT_NE(out.status().message().find("values nested more than"), std::string::npos)
        << out.status().to_string();
  }
  // Under the bound, a nested value prints as Python prints it.
  const int depth = draw(1, 200);
  auto t = Template::parse(
      "{% set ns = namespace(x=7) %}{% for i in range(n) %}{% set ns.x = [ns.x] %}{% endfor %}"
      "{{ ns.x }}");
  ASSERT_TRUE(t.is_ok());
  Value context = Value::dict();
  context.dict_data().set(Value::string("n"), Value::integer(depth));
  auto out = t->render(context);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, std::string(size_t(depth), '[') + "7" + std::string(size_t(depth), ']'));
}

// Namespaces are the one value a template changes after making it; one
// held in another could close a cycle that printing would follow forever.
TEST(JinjaTest, ANamespaceCannotHoldANamespace) {
  for (const char* source :
       {"{% set ns = namespace(x=1) %}{% set ns.x = ns %}{{ ns.x }}",
        "{% set ns = namespace(x=1) %}{% set ns.x = [1, {'a': ns}] %}{{ ns.x }}",
        "{% set a = namespace(x=1) %}{% set b = namespace(y=a) %}{{ b.y.x }}"}) {
    SCOPED_TRACE(source);
    auto t = Template::parse(source);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto out = t->render(Value::dict());
    ASSERT_FALSE(out.is_ok());
    EXPECT_NE(out.status().message().find("a namespace cannot hold a namespace"), std::string::npos)
        << out.status().to_string();
  }
  // Namespaces in lists, and lists in namespaces, are as Jinja2 has them.
  auto t = Template::parse(
      "{% set a = namespace(v=[1, 2]) %}{% set l = [a, a] %}{% set a.v = a.v + [3] %}"
      "{{ l[1].v }}");
  ASSERT_TRUE(t.is_ok());
  auto out = t->render(Value::dict());
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, "[1, 2, 3]");
}

// A macro that calls itself twice, 40 deep, stays under the call-depth bound
// but would make 2^40 calls: calls count against the render's steps.
TEST(JinjaTest, MacroCallsCountAgainstTheStepBound) {
  auto t = Template::parse(
      "{% macro f(n) %}{% if n < 40 %}{{ f(n + 1) }}{{ f(n + 1) }}{% endif %}{% endmacro %}"
      "{{ f(0) }}");
  ASSERT_TRUE(t.is_ok());
  RenderOptions options;
  options.max_steps = size_t(draw(1000, 2000));
  auto out = t->render(Value::dict(), options);
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.status().message().find("passed " + std::to_string(options.max_steps) + " steps"),
            std::string::npos)
      << out.status().to_string();
  // 2^k - 1 calls of a tree k deep fit in a bound of exactly that many.
  const int k = draw(1, 9);
  auto fits = Template::parse("{% macro f(n) %}{% if n < " + std::to_string(k) +
                              " %}{{ f(n + 1) }}{{ f(n + 1) }}{% else %}x{% endif %}"
                              "{% endmacro %}{{ f(1) }}");
  ASSERT_TRUE(fits.is_ok());
  options.max_steps = (size_t(1) << k) - 1;
  out = fits->render(Value::dict(), options);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(*out, std::string(size_t(1) << (k - 1), 'x'));
  options.max_steps -= 1;
  EXPECT_FALSE(fits->render(Value::dict(), options).is_ok());
}

// Each macro call nests its body's statements and expressions on the
// stack: a recursion whose every level holds a tall expression is stopped
// by the render's depth bound well inside the stack.
TEST(JinjaTest, RenderingDepthIsBoundedAcrossMacroCalls) {
  std::string body = "{{ ";
  for (int i = 0; i < 150; ++i) body += "(";
  body += "f(n + 1)";
  for (int i = 0; i < 150; ++i) body += " ~ 'a')";
  auto t = Template::parse("{% macro f(n) %}" + body + " }}{% endmacro %}{{ f(0) }}");
  ASSERT_TRUE(t.is_ok()) << t.status().to_string();
  auto out = t->render(Value::dict());
  ASSERT_FALSE(out.is_ok());
  EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(out.status().message().find("statements and expressions deep"), std::string::npos)
      << out.status().to_string();
}

// What else a template could build without end, each refused at its bound
// with the bound's kind of error, and the same operations within bounds
// rendering as Python does.
TEST(JinjaTest, EveryWayToBuildPastTheBoundsIsRefused) {
  std::string nested_maps = "{% set m = 'map' %}{{ ('a'|map(m";
  for (int i = 0; i < 2000; ++i) nested_maps += ", m";
  nested_maps += "))|list }}";
  std::string set_blocks = "{% set x = 1 %}";
  for (int i = 0; i < 40; ++i) {
    set_blocks += "{% set x | default(" + std::string(100, '[') + "x" + std::string(100, ']') +
                  ", true) %}{% endset %}";
  }
  for (const std::string& source :
       {// Bound methods hold their object: a chain of them nests as lists do.
        std::string("{% set ns = namespace(f=none) %}{% for i in range(100000) %}"
                    "{% set ns.f = [ns.f].copy %}{% endfor %}"),
        nested_maps, set_blocks,
        std::string("{% macro f(x, n) %}{% if n %}{{ f(") + std::string(100, '[') + "x" +
            std::string(100, ']') + ", n - 1) }}{% endif %}{% endmacro %}{{ f(1, 60) }}",
        std::string("{{ 'ab' * 4611686018427387904 }}"),
        std::string("{{ [1, 2] * 4611686018427387904 }}"),
        std::string("{% set ns = namespace(l=[1]) %}{% for i in range(40) %}"
                    "{% set ns.l = ns.l + ns.l %}{% endfor %}"),
        std::string("{% set s = 'x' * 100000 %}{{ s|replace('x', s) }}"),
        std::string("{{ ('a\n' * 1000000)|indent(1000) }}"),
        std::string("{{ range(100000)|list|tojson(indent=9000000) }}"),
        std::string("{{ [1]|batch(100000000000, 0)|list }}"),
        std::string("{{ '%2000000000s' % '' }}"), std::string("{{ '%.99999999999d' % 5 }}")}) {
    SCOPED_TRACE(source.substr(0, 100));
    auto t = Template::parse(source);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto out = t->render(Value::dict());
    ASSERT_FALSE(out.is_ok());
    EXPECT_EQ(out.status().code(), StatusCode::kResourceExhausted) << out.status().to_string();
  }
  // Within the bounds, as Python renders them.
  for (const auto& [source, rendered] : std::vector<std::pair<std::string, std::string>>{
           {"{{ 'abcdef'[5::9223372036854775807] }}", "f"},
           {"{{ [1, 2, 3][::-9223372036854775807] }}", "[3]"},
           {"{{ range(0, 9223372036854775807, 4611686018427387904)|list }}",
            "[0, 4611686018427387904]"},
           {"{{ ('%600d' % 5)|length }}", "600"},
           {"{{ '%-5s|%05.1f' % ('ab', 2.25) }}", "ab   |002.2"},
           {"{{ 'aXa'|replace('a', 'bb') }}", "bbXbb"},
           {"{{ [1, 2] + [3] }}", "[1, 2, 3]"},
           {"{{ 'a\nb'|indent(2, true) }}", "  a\n  b"},
           {"{{ [1, 2, 3]|batch(2, 0)|list }}", "[[1, 2], [3, 0]]"},
           {"{{ [[1]]|tojson(indent=1) }}", "[\n [\n  1\n ]\n]"}}) {
    SCOPED_TRACE(source);
    auto t = Template::parse(source);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    auto out = t->render(Value::dict());
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_EQ(*out, rendered);
  }
}

// Random bytes spliced into a template that uses most constructs: the lexer
// and parser return a template or an error, never crash (run under ASan).
TEST(JinjaTest, MutatedTemplatesLoadOrFailCleanly) {
  const std::string base =
      "{%- set ns = namespace(a=0) -%}\n{% for m in messages if m.role != 'x' %}"
      "{{ m['content'] | trim | tojson(indent=2) }}{% if loop.last and not x is defined %}"
      "{{ '%s' % m.role ~ (1 + 2 * 3 // 4) }}{% elif m.content is string %}{{ m.content[1:-1] }}"
      "{% else %}{% set ns.a = ns.a + 1 %}{% endif %}{% endfor %}{# c #}"
      "{% macro f(x, y='d') %}{{ x.split(',')|join('-') }}{% endmacro %}{{ f('a,b') }}";
  const std::string alphabet = "{}%#-+()[]'\"|.,:=~*/ \n\\ifor";
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);
  const Value context = context_with(
      R"({"messages": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": 5}]})");
  // The base itself renders, so mutations start from a template that
  // reaches every construct rather than from a parse error.
  auto whole = Template::parse(base);
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  ASSERT_TRUE(whole->render(context).is_ok());
  int rendered = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string source = base;
    const int edits = 1 + int(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t at = rng() % source.size();
      switch (rng() % 3) {
        case 0:
          source[at] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          source.insert(at, 1, alphabet[rng() % alphabet.size()]);
          break;
        default:
          source.erase(at, 1 + rng() % 8);
      }
    }
    auto t = Template::parse(source);
    if (t.is_ok()) {
      auto out = t->render(context);
      if (!out.is_ok()) {
        EXPECT_FALSE(out.status().message().empty()) << "seed " << seed;
      }
      rendered += out.is_ok();
    } else {
      EXPECT_FALSE(t.status().message().empty()) << "seed " << seed;
    }
  }
  EXPECT_GT(rendered, 0) << "no mutated template rendered; seed " << seed;
}

}  // namespace
}  // namespace baton::jinja
