#!/usr/bin/env python3
"""KV cache formats side by side: decode throughput of one pool filled in
BF16, int8 and fp8_e4m3.

    bench/kv_formats.py [--bench build/bench/model_bench] [--rounds 3]
                        [--presets smollm2-135m qwen2.5-0.5b llama3-8b-8layers]

For each preset, model_bench's DecodeSamePool benchmark (BF16 weights, 4096
cached tokens per sequence, the pool that holds 32 sequences in BF16, filled
in each format) runs once per format per round, the formats' order rotating
from round to round so that drift of the machine falls on each alike.
llama3-8b-8layers is Llama 3 8B's shape cut to 8 layers (9.2 GiB of
weights and pool; not run by default). Prints
a markdown table of medians (min-max over rounds): the batch the pool holds,
KV bytes per token, tokens/s and the ratio to BF16, and the memory rate the
step reached against the read-pass ceiling model_bench measures beside it.
"""
import argparse
import json
import statistics
import subprocess
import sys
import tempfile

FORMATS = ["bf16", "int8", "fp8_e4m3"]


def run_one(bench, preset, kv, min_time):
    name = f"DecodeSamePool/{preset}/kv_{kv}/"
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        # The JSON goes to a file: model_bench also prints notes to stdout.
        subprocess.run(
            [bench, f"--benchmark_filter=^{name}", f"--benchmark_min_time={min_time}",
             f"--benchmark_out={out.name}", "--benchmark_out_format=json"],
            check=True, capture_output=True, text=True)
        runs = [b for b in json.load(out)["benchmarks"] if b["name"].startswith(name)]
    if len(runs) != 1:
        sys.exit(f"expected one result of {name}, got {len(runs)}")
    if "error_message" in runs[0]:
        sys.exit(f"{name}: {runs[0]['error_message']}")
    return runs[0]


def spread(values, fmt):
    return f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", default="build/bench/model_bench")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--min-time", type=float, default=2.0)
    parser.add_argument("--presets", nargs="+", default=["smollm2-135m", "qwen2.5-0.5b"])
    args = parser.parse_args()

    print("| model | KV | batch | KV bytes/token | tok/s | vs bf16 | GB/s (ceiling) |")
    print("|---|---|---|---|---|---|---|")
    for preset in args.presets:
        results = {kv: [] for kv in FORMATS}
        for r in range(args.rounds):
            order = FORMATS[r % len(FORMATS):] + FORMATS[:r % len(FORMATS)]
            for kv in order:
                results[kv].append(run_one(args.bench, preset, kv, args.min_time))
        base = statistics.median(x["tok_per_s"] for x in results["bf16"])
        for kv in FORMATS:
            rs = results[kv]
            tok = [x["tok_per_s"] for x in rs]
            print(f"| {preset} | {kv} | {int(rs[0]['batch'])} | {int(rs[0]['kv_bytes_per_token'])} "
                  f"| {spread(tok, '{:.0f}')} | {statistics.median(tok) / base:.2f} "
                  f"| {spread([x['GB_per_s'] for x in rs], '{:.1f}')} "
                  f"({statistics.median(x['ceiling_GB_per_s'] for x in rs):.1f}) |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
