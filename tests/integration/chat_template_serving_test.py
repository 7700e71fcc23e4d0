"""Chat through a real cluster with a checkpoint's own chat template.

A tiny random model is given a real tokenizer and chat template: a
byte-level BPE trained here by `tokenizers` with Llama 3's special tokens,
BOS added by tokenizer_config.json, and Llama 3.1's real chat template (from
the templates deploy/fetch_chat_templates.sh fetches). `baton up` serves it
(router, prefill and decode node on loopback); for fresh random
conversations (system prompt or not, several turns, tools, tool calls and
tool results, special-token strings in text), the reference prompt is
jinja2's rendering with transformers' settings, tokenised by `tokenizers`
without added specials, as vLLM does for chat. Then:

  * /tokenize with the messages returns exactly the reference ids (the
    template's own BOS, no second one);
  * a chat completion reports that many prompt tokens and answers exactly
    what a completion of the reference ids answers (greedy), streamed or not;
  * where jinja2 raises for a conversation, the chat is a 400.

    python chat_template_serving_test.py --baton build/tools/baton --templates DIR
"""
import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request

import openai
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "engine"))
import chat_template_test as reference  # noqa: E402
from openai_client_test import check, wait_until_up, write_cluster  # noqa: E402

TEMPLATE = "meta-llama-Llama-3.1-8B-Instruct.jinja"
SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
            "<|eot_id|>", "<|eom_id|>", "<|python_tag|>"]


def make_tokenizer(rng, out_dir, template_source):
    corpus = [reference.random_text(rng, 3, 20) for _ in range(3000)]
    corpus += ["Environment: ipython\nCutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024",
               json.dumps(reference.TOOLS, indent=4)] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=480, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(corpus, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", tok.token_to_id("<|begin_of_text|>"))])
    os.makedirs(out_dir)
    tok.save(os.path.join(out_dir, "tokenizer.json"))
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "add_bos_token": True,
                   "chat_template": template_source}, f)
    return tok


def api_messages(messages):
    """The conversation as an OpenAI client sends it: tool call arguments as JSON strings."""
    out = []
    for m in messages:
        m = json.loads(json.dumps(m))
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        out.append(m)
    return out


def post(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=30) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)


def run(baton, templates, work, rng):
    with open(os.path.join(templates, TEMPLATE), encoding="utf-8") as f:
        template_source = f.read()
    tok = make_tokenizer(rng, os.path.join(work, "tokenizer"), template_source)
    model_dir = os.path.join(work, "model")
    subprocess.run([baton, "make-model", "--preset", "tiny", "--out", model_dir, "--tokenizer",
                    os.path.join(work, "tokenizer")], check=True, capture_output=True)
    config = os.path.join(work, "cluster.yaml")
    http = write_cluster(config, model_dir, kv_cache="8MiB", max_model_len=2048)
    env = reference.reference_environment(0)
    template = env.from_string(template_source)
    up = subprocess.Popen([baton, "up", config], stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_until_up(http, 2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused", max_retries=0)
        rendered = refused = 0
        for context in reference.conversations(rng, 16):
            context.update(bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")
            del context["unk_token"], context["pad_token"]
            body = {"messages": api_messages(context["messages"]),
                    "add_generation_prompt": context["add_generation_prompt"]}
            if context["tools"] is not None:
                body["tools"] = context["tools"]
            try:
                text = template.render(**context)
            except Exception as e:  # noqa: BLE001 — the template refused this conversation
                status, reply = post(http, "/v1/chat/completions", dict(body, max_tokens=4))
                check(status == 400, f"jinja2 raised {e!r}; Baton answered {status} {reply}")
                refused += 1
                continue
            want = tok.encode(text, add_special_tokens=False).ids
            status, reply = post(http, "/tokenize", body)
            check(status == 200, f"/tokenize {status} {reply}")
            check(reply["tokens"] == want, f"/tokenize ids differ from the reference:\n{reply['tokens']}\n{want}\n"
                                           f"rendered: {text!r}")
            # add_generation_prompt is vLLM's field, not the OpenAI client's.
            fields = {k: v for k, v in body.items() if k != "add_generation_prompt"}
            extra = {"add_generation_prompt": body["add_generation_prompt"]}
            # A first run caches the prompt's blocks: the three compared below
            # then all compute the same tail over them, with the same
            # arithmetic (one over an empty cache may part at a near-tie).
            client.completions.create(model="tiny", prompt=want, max_tokens=8, temperature=0)
            chat = client.chat.completions.create(model="tiny", max_tokens=8, temperature=0, extra_body=extra,
                                                  **fields)
            check(chat.usage.prompt_tokens == len(want), f"prompt tokens {chat.usage} != {len(want)}")
            plain = client.completions.create(model="tiny", prompt=want, max_tokens=8, temperature=0)
            check(chat.choices[0].message.content == plain.choices[0].text,
                  f"chat {chat.choices[0].message.content!r} != completion {plain.choices[0].text!r}")
            streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
                model="tiny", max_tokens=8, temperature=0, stream=True, extra_body=extra, **fields) if c.choices)
            check(streamed == plain.choices[0].text, f"streamed chat {streamed!r}")
            rendered += 1
        # Llama 3.1's template raises for two tool calls in one message.
        two_calls = [{"role": "user", "content": "hi"},
                     {"role": "assistant", "content": None, "tool_calls": [
                         {"id": f"c{i}", "type": "function",
                          "function": {"name": "search", "arguments": json.dumps({"query": "q"})}}
                         for i in range(2)]}]
        status, reply = post(http, "/v1/chat/completions", {"messages": two_calls, "max_tokens": 4})
        check(status == 400 and "single tool-calls" in reply["error"]["message"], f"{status} {reply}")
        refused += 1
        check(rendered >= 8, f"only {rendered} conversations rendered")
        print(f"chat template serving: {rendered} conversations equal the reference, {refused} refused alike")
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=30)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--baton", required=True)
    parser.add_argument("--templates", required=True)
    args = parser.parse_args()
    if not os.path.exists(os.path.join(args.templates, TEMPLATE)):
        print(f"SKIP: no {TEMPLATE} in {args.templates} (deploy/fetch_chat_templates.sh fetches it)")
        return 77
    seed = random.randrange(1 << 30)
    print("seed", seed)
    with tempfile.TemporaryDirectory() as work:
        run(os.path.abspath(args.baton), args.templates, work, random.Random(seed))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
