"""Chat template rendering time of Baton's Jinja engine beside Python's
jinja2 (as transformers and vLLM render templates: compiled once, then
rendered), for the real templates of the families Baton serves, on one
conversation of 50 turns of about 1 KB each. Prints ms per render of each
and the ratio.

    python bench/chat_template_bench.py --render build/tests/engine/template_render \
        --templates .deps/chat-templates-0.3.36
(with a Python that has jinja2, e.g. build-venv/)
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "engine"))
import chat_template_test as reference  # noqa: E402

TEMPLATES = ["meta-llama-Llama-3.1-8B-Instruct.jinja", "Qwen-Qwen2.5-7B-Instruct.jinja",
             "Qwen-Qwen3-0.6B.jinja", "HuggingFaceTB-SmolLM3-3B.jinja",
             "mistralai-Mistral-Nemo-Instruct-2407.jinja", "google-gemma-2-2b-it.jinja"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--render", required=True)
    ap.add_argument("--templates", required=True)
    args = ap.parse_args()
    messages = [{"role": "user" if i % 2 == 0 else "assistant", "content": ("word " * 200) + str(i)}
                for i in range(50)]
    context = {"messages": messages, "tools": None, "documents": None, "add_generation_prompt": True,
               "bos_token": "<s>", "eos_token": "</s>"}
    env = reference.reference_environment(0)
    print("| template | jinja2 | Baton | jinja2 / Baton |")
    print("|---|---|---|---|")
    with tempfile.TemporaryDirectory() as work:
        context_file = os.path.join(work, "context.json")
        with open(context_file, "w") as f:
            json.dump(context, f)
        for name in TEMPLATES:
            path = os.path.join(args.templates, name)
            template = env.from_string(open(path, encoding="utf-8").read())
            rounds, start = 0, time.perf_counter()
            while time.perf_counter() - start < 2.0:
                template.render(**context)
                rounds += 1
            python_ms = (time.perf_counter() - start) / rounds * 1e3
            out = subprocess.run([args.render, "--bench", path, context_file], check=True,
                                 capture_output=True, text=True).stdout
            baton_ms = float(out.split()[0])
            print(f"| {name.removesuffix('.jinja')} | {python_ms:.3f} ms | {baton_ms:.3f} ms |"
                  f" {python_ms / baton_ms:.1f} |")


if __name__ == "__main__":
    main()
