"""Baton's Jinja engine against Python's jinja2, rendering chat templates.

The reference is jinja2 set up exactly as transformers renders chat
templates (`apply_chat_template`): an ImmutableSandboxedEnvironment with
trim_blocks, lstrip_blocks and the loopcontrols extension, `tojson` as
json.dumps(ensure_ascii=False), and the globals raise_exception and
strftime_now; the context holds messages, tools (None without tools),
documents (None), add_generation_prompt and the special tokens.

Templates:
  * every template of llama.cpp's models/templates/ (real checkpoints'
    templates, as the llama-cpp-python sdist vendors them; fetched by
    deploy/fetch_chat_templates.sh into the directory given by --templates);
  * feature templates written here that exercise each construct Baton
    implements over freshly drawn random data.

Conversations: a fresh random set each run (system prompt or not, several
turns, generation prompt or not, tool definitions, assistant tool calls and
tool results, reasoning content, text with quotes, newlines, Unicode and
special-token strings).

Verdicts, per template: Baton refuses it at load (the construct it lacks is
named), or every conversation renders byte-equal to jinja2, and when jinja2
raises (a template's raise_exception, or an error), Baton fails too. The
templates of the families Baton serves must render. Exits non-zero naming
the first mismatches; prints how many templates render.

    python chat_template_test.py --render build/tests/engine/template_render \
        --templates .deps/chat-templates-0.3.36
"""
import argparse
import datetime
import json
import os
import random
import subprocess
import sys

try:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("SKIP: jinja2 is not installed")
    sys.exit(77)

# Families Baton serves: their templates must render byte-equal.
REQUIRED = [
    "meta-llama-Llama-3.1-8B-Instruct.jinja",
    "meta-llama-Llama-3.2-3B-Instruct.jinja",
    "meta-llama-Llama-3.3-70B-Instruct.jinja",
    "Qwen-Qwen2.5-7B-Instruct.jinja",
    "Qwen-Qwen3-0.6B.jinja",
    "Qwen-QwQ-32B.jinja",
    "HuggingFaceTB-SmolLM3-3B.jinja",
    "mistralai-Mistral-Nemo-Instruct-2407.jinja",
    "microsoft-Phi-3.5-mini-instruct.jinja",
    "google-gemma-2-2b-it.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
]

# Each exercises a group of constructs; rendered with random data.
FEATURE_TEMPLATES = [
    # Whitespace control, trim_blocks / lstrip_blocks, comments.
    "  {% if flag %}\n    yes {{ a }}\n  {% else %}\n  no\n  {% endif %}\n{# c #}\n"
    "x {#- c -#} y\n  {%- for i in items %} [{{ i }}]  {% endfor -%}  \nend\n",
    # Arithmetic, comparison, logic, literals.
    "{{ n + m }}|{{ n - m }}|{{ n * m }}|{{ n / (m or 1) }}|{{ n // (m or 1) }}|"
    "{{ n % (m or 1) }}|{{ n ** 2 }}|{{ -n }}|{{ f * 2 }}|{{ f / 3 }}|{{ n < m }}"
    "{{ n >= m }}{{ n == m }}{{ n != m }}|{{ a ~ n ~ f }}|{{ (n > 0 and a) or 'none' }}|"
    "{{ not flag }}|{{ 1 < n < 100 }}|{{ 'yes' if flag else 'no' }}|{{ 'x' if false }}|"
    "{{ [1, 'two', 3.0, none, true] }}|{{ {'k': a, 'n': n} }}|{{ (1, 2) }}|{{ (1,) }}|"
    "{{ 0.1 + 0.2 }}|{{ 1e20 }}|{{ 1.5e-7 }}|{{ 2 ** 0.5 }}|{{ minus_one ** big }}|"
    "{{ minus_two ** (big % 64) }}|{{ (m - 4) ** (big % 9) }}",
    # Strings: methods and slices.
    "{{ a.upper() }}|{{ a.lower() }}|{{ a.strip() }}|{{ a.strip('xa ') }}|{{ a.lstrip() }}|"
    "{{ a.rstrip() }}|{{ a.split() }}|{{ a.split(' ', 1) }}|{{ a.rsplit(' ', 1) }}|"
    "{{ a.startswith('a') }}{{ a.endswith(('z', 'b')) }}|{{ a.replace(' ', '_') }}|"
    "{{ a[1:] }}|{{ a[:3] }}|{{ a[::-1] }}|{{ a[-2:] }}|{{ a[0] if a else '' }}|{{ a.title() }}|"
    "{{ a.capitalize() }}|{{ a.find('b') }}|{{ a.count('a') }}|{{ '-'.join(items|map('string')) }}|"
    "{{ a.splitlines() }}|{{ '{} and {}'.format(a, n) }}|{{ '%s=%d' % (a, n) }}|"
    "{{ a|length }}|{{ a is string }}|{{ 'a' in a }}|{{ a ~ '' }}",
    # Filters.
    "{{ items|length }}|{{ items|first }}|{{ items|last }}|{{ items|join(', ') }}|"
    "{{ items|sort }}|{{ items|sort(reverse=true) }}|{{ items|reverse|list }}|{{ items|unique|list }}|"
    "{{ items|min }}|{{ items|max }}|{{ items|sum }}|{{ a|trim }}|{{ a|upper }}|{{ a|lower }}|"
    "{{ a|title }}|{{ a|capitalize }}|{{ a|replace('a', 'A') }}|{{ a|wordcount }}|{{ f|round }}|"
    "{{ f|round(2) }}|{{ f|int }}|{{ a|int }}|{{ n|float }}|{{ (-n)|abs }}|{{ missing|default('d') }}|"
    "{{ ''|default('e', true) }}|{{ a|string }}|{{ a|indent(2) }}|{{ a|indent(2, true) }}|"
    "{{ items|batch(2)|list }}|{{ a|center(30) }}|{{ a|e }}|{{ items|select('odd')|list }}|"
    "{{ items|reject('even')|list }}|{{ items|map('string')|join }}",
    # Dicts and JSON.
    "{{ d|tojson }}|{{ d|tojson(indent=2) }}|{{ d|tojson(sort_keys=true) }}|{{ d|dictsort }}|"
    "{{ d|items|list }}|{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}|{{ d.keys()|list }}|"
    "{{ d.values()|list }}|{{ d.get('zz', 'none') }}|{{ d.get('a') }}|{{ d['a'] }}|{{ d.a }}|"
    "{{ d|length }}|{{ 'a' in d }}|{{ d is mapping }}|{{ d.missing is defined }}|"
    "{{ rows|selectattr('ok')|map(attribute='name')|list }}|"
    "{{ rows|rejectattr('ok')|map(attribute='name')|join(',') }}|"
    "{{ rows|selectattr('name', 'equalto', 'b')|list|length }}|{{ rows|sort(attribute='name')|first }}|"
    "{{ rows|map(attribute='name')|list|tojson }}|{{ rows[0]|tojson }}|{{ [a, n, f, none, flag]|tojson }}",
    # Loops, namespaces, macros, set blocks, filter blocks, tests.
    "{% set ns = namespace(count=0, seen=[]) %}"
    "{% for r in rows if r.ok %}{{ loop.index }}/{{ loop.length }}:{{ r.name }}"
    "{% if loop.first %}F{% endif %}{% if loop.last %}L{% endif %}"
    "{% if loop.previtem is defined %}<{{ loop.previtem.name }}{% endif %}"
    "{% set ns.count = ns.count + 1 %}{% set ns.seen = ns.seen + [r.name] %}"
    "{{ loop.cycle('a', 'b') }}{% endfor %}|{{ ns.count }}|{{ ns.seen }}|"
    "{% for i in range(n % 7) %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 5 %}{% break %}{% endif %}{{ i }}{% else %}empty{% endfor %}|"
    "{% for x in [] %}{{ x }}{% else %}none{% endfor %}|"
    "{% for o in items %}[{{ o }}]{% for x in [] %}{% else %}{% if o > 50 %}{% break %}"
    "{% endif %}{% endfor %}{% endfor %}|"
    "{% macro m(x, y='dflt') %}<{{ x }}-{{ y }}>{% endmacro %}{{ m(a) }}{{ m(n, y=f) }}{{ m('q', 'r') }}|"
    "{% set block %}B{{ n }}{% endset %}{{ block }}|{% set up | upper %}u{{ a }}{% endset %}{{ up }}|"
    "{% filter upper %}in {{ a }}{% endfilter %}|{% set p, q = 1, 2 %}{{ p + q }}|"
    "{{ n is odd }}{{ n is even }}{{ n is divisibleby 3 }}{{ n is number }}{{ n is integer }}"
    "{{ f is float }}{{ none is none }}{{ items is iterable }}{{ items is sequence }}{{ flag is boolean }}"
    "{{ flag is true }}{{ missing is undefined }}{{ n is gt 5 }}{{ a is lower }}{{ n is in items }}",
    # Errors: raise_exception, undefined lookups, type errors must fail alike.
    "{% if n > 50 %}{{ raise_exception('too big: ' ~ n) }}{% endif %}ok",
    "{{ missing.attr if n > 50 else 'fine' }}",
    "{{ a + (n if n > 50 else '') }}",
]

WORDS = ("hello world the quick brown fox It's \"quoted\" naïve café 中文 日本語 😀 👍🏽 "
         "<|im_start|> <|eot_id|> </s> [INST] {{ x }} {% raw %} \\n tab\t").split(" ")


def random_text(rng, lo=0, hi=12):
    parts = [rng.choice(WORDS) for _ in range(rng.randint(lo, hi))]
    text = ""
    for p in parts:
        text += p + rng.choice([" ", " ", " ", "\n", "  ", "\n\n", ""])
    return text if rng.random() < 0.8 else "  " + text + " \n"


def feature_context(rng):
    items = [rng.randint(-20, 99) for _ in range(rng.randint(1, 8))]
    rows = [{"name": rng.choice("abcdef"), "ok": rng.random() < 0.6} for _ in range(rng.randint(1, 6))]
    d = {}
    for k in rng.sample(["a", "b", "zeta", "Alpha", "é", "k1"], rng.randint(1, 5)):
        d[k] = rng.choice([rng.randint(-5, 5), random_text(rng, 0, 3), None, True, 2.5, [1, "x"],
                           {"n": "v"}])
    return {
        "a": random_text(rng, 1, 5).strip() or "ab",
        "n": rng.randint(0, 100),
        "m": rng.randint(0, 9),
        # Negative bases as names: jinja2 folds a literal (-1) into the
        # constant -1 and renders (-1) ** 2 as -1 ** 2, which Python reads
        # as -(1 ** 2); Baton computes what the parentheses say.
        "big": rng.choice([0, 1, 2, 3, 62, 63, rng.randint(0, 10**18)]),
        "minus_one": -1,
        "minus_two": -2,
        "f": rng.choice([0.1, 2.5, -3.25, 1e-7, 123456.789, 3.0]),
        "flag": rng.random() < 0.5,
        "items": items,
        "rows": rows,
        "d": d,
    }


TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "Weather for a city, in Celsius.",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "The city"},
            "days": {"type": "integer", "description": "How many days", "enum": [1, 3, 7]}},
            "required": ["city"]}}},
    {"type": "function", "function": {
        "name": "search", "description": "Search the web.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"}, "top_k": {"type": "number", "default": 3.5}},
            "required": ["query"]}}},
]


def conversations(rng, count):
    out = []
    for i in range(count):
        messages = []
        if rng.random() < 0.5:
            messages.append({"role": "system", "content": random_text(rng, 1)})
        turns = rng.randint(1, 3)
        use_tools = rng.random() < 0.35
        for t in range(turns):
            messages.append({"role": "user", "content": random_text(rng, 1)})
            last = t == turns - 1
            if use_tools and rng.random() < 0.6:
                call = {"id": "call_%d" % rng.randint(0, 999), "type": "function",
                        "function": {"name": "get_weather",
                                     "arguments": {"city": random_text(rng, 1, 2).strip() or "Paris",
                                                   "days": 3}}}
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
                messages.append({"role": "tool", "tool_call_id": call["id"], "name": "get_weather",
                                 "content": json.dumps({"temp": rng.randint(-10, 35)})})
                messages.append({"role": "assistant", "content": random_text(rng, 1)})
            elif not last or rng.random() < 0.3:
                reply = {"role": "assistant", "content": random_text(rng, 1)}
                if rng.random() < 0.2:
                    reply["reasoning_content"] = random_text(rng, 1)
                messages.append(reply)
        context = {
            "messages": messages,
            "tools": TOOLS if use_tools else None,
            "documents": None,
            "add_generation_prompt": rng.random() < 0.7,
            "bos_token": rng.choice(["<s>", "<|begin_of_text|>", "<bos>"]),
            "eos_token": rng.choice(["</s>", "<|eot_id|>", "<|im_end|>", "<eos>"]),
            "unk_token": "<unk>",
            "pad_token": None,
        }
        out.append(context)
    return out


def reference_environment(now):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    # transformers' AssistantTracker adds {% generation %}; outside of
    # assistant-mask tracking it renders its body as is.
    class Generation(jinja2.ext.Extension):
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
            return jinja2.nodes.Scope(body).set_lineno(lineno)

    env.add_extension(Generation)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(now, tz=datetime.timezone.utc).strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--render", required=True)
    parser.add_argument("--templates", required=True)
    parser.add_argument("--conversations", type=int, default=40)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print("seed", seed)
    if not os.path.isdir(args.templates):
        print("SKIP: no templates in %s (deploy/fetch_chat_templates.sh fetches them)" %
              args.templates)
        return 77

    now = rng.randint(1_600_000_000, 1_900_000_000)
    env = reference_environment(now)
    cases = []  # (template name, source, context)
    names = sorted(n for n in os.listdir(args.templates) if n.endswith(".jinja"))
    missing = [n for n in REQUIRED if n not in names]
    if missing:
        print("FAIL: templates of served families missing from the set:", missing)
        return 1
    convs = conversations(rng, args.conversations)
    for name in names:
        with open(os.path.join(args.templates, name), encoding="utf-8") as f:
            source = f.read()
        for context in convs:
            cases.append((name, source, context))
    for i, source in enumerate(FEATURE_TEMPLATES):
        for _ in range(25):
            cases.append(("feature-%d" % i, source, feature_context(rng)))

    requests = "".join(json.dumps({"template": s, "context": c, "now": now}) + "\n"
                       for _, s, c in cases)
    result = subprocess.run([args.render], input=requests.encode(), capture_output=True,
                            check=True)
    replies = [json.loads(line) for line in result.stdout.decode().splitlines()]
    if len(replies) != len(cases):
        print("FAIL: %d replies for %d cases" % (len(replies), len(cases)))
        return 1

    compiled = {}
    refused = {}
    both_failed = 0
    mismatches = []
    rendered_cases = {}
    for (name, source, context), reply in zip(cases, replies):
        if source not in compiled:
            try:
                compiled[source] = env.from_string(source)
            except jinja2.TemplateError as e:
                compiled[source] = e
        template = compiled[source]
        if "load_error" in reply:
            refused.setdefault(name, reply["load_error"])
            continue
        if isinstance(template, Exception):
            mismatches.append((name, "jinja2 cannot compile it (%s) but Baton loaded it" % template))
            continue
        try:
            expected = template.render(**context)
        except Exception as e:  # noqa: BLE001 — any error of the reference counts
            if "text" in reply:
                mismatches.append((name, "jinja2 raised %s: %s; Baton rendered %r" %
                                   (type(e).__name__, e, reply["text"][:300])))
            else:
                both_failed += 1
            continue
        if reply.get("text") != expected:
            got = reply.get("text", "<error: %s>" % reply.get("render_error"))
            at = next((i for i, (x, y) in enumerate(zip(got, expected)) if x != y),
                      min(len(got), len(expected)))
            mismatches.append((name, "differs at %d:\n  jinja2: %r\n  Baton:  %r" %
                               (at, expected[max(0, at - 60):at + 60], got[max(0, at - 60):at + 60])))
            continue
        rendered_cases[name] = rendered_cases.get(name, 0) + 1

    failed = False
    for name in REQUIRED:
        if name in refused:
            print("FAIL: %s (a served family) refused: %s" % (name, refused[name]))
            failed = True
    for name in sorted(n for n in compiled_names(cases) if n.startswith("feature-")):
        if name in refused:
            print("FAIL: %s refused: %s" % (name, refused[name]))
            failed = True
    if mismatches:
        failed = True
        seen = set()
        for name, detail in mismatches:
            if name in seen:
                continue
            seen.add(name)
            print("MISMATCH %s: %s" % (name, detail))
        print("%d mismatching renders over %d templates" % (len(mismatches), len(seen)))
    loaded = [n for n in names if n not in refused]
    print("%d renders equal to jinja2's, %d raised in both" %
          (sum(rendered_cases.values()), both_failed))
    for name in REQUIRED:
        if not rendered_cases.get(name):
            print("FAIL: %s rendered no conversation" % name)
            failed = True
    print("%d of %d real templates load and render byte-equal to jinja2 on %d conversations;"
          " %d refused at load:" % (len(loaded), len(names), len(convs), len(refused)))
    for name in sorted(refused):
        if not name.startswith("feature-"):
            print("  %s: %s" % (name, refused[name]))
    return 1 if failed else 0


def compiled_names(cases):
    return {name for name, _, _ in cases}


if __name__ == "__main__":
    sys.exit(main())
