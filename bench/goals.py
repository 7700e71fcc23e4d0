#!/usr/bin/env python3
"""Measures the engine's performance goals, several rounds, and says which hold.

The goals (each a ratio to a ceiling the benchmark measures between its own
iterations, bench/ceilings.h):

  batch-1 decode step, smollm2-135m and qwen2.5-0.5b, F32 and BF16
      effective GB/s >= 0.85 of the read passes    (model_bench Decode/*/1)
  prefill of 512 tokens, the same four
      GFLOP/s >= 0.70 of the sgemm passes           (model_bench Prefill)
  paged decode attention from memory, 1k/4k/16k tokens, batch 1 and 16,
  F32 and BF16, scattered and adjacent 16-token blocks
      KV GB/s >= 0.70 of the read passes            (bench_kernels)

One run of a case says little on a machine whose bandwidth swings by 10-30%
from one minute to the next: this runs every case in each of --rounds
rounds and reports its median ratio, its range, and in how many rounds it
met its goal. A goal holds for a case when its median does. Attention
cases also print their median ratio to a plain read of the same blocks in
the kernel's order with its prefetching (ratio_to_scattered_read): near 1,
the kernel reads as fast as the memory system gives those blocks, and what
separates it from the goal is the access pattern, not its arithmetic.

  bench/goals.py [--build build] [--rounds 5] [--avx512 0] [--only attention]

--avx512 0 runs the AVX2 kernels where the CPU has AVX-512: what AVX2-only
CPUs run, at this machine's bandwidth.

Exits 1 when a case is short of its goal by the median, when a case failed
to run (a benchmark that reported an error), or when a group ran fewer
cases than it has (EXPECTED_CASES) or not the same ones in every round;
each is named.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

GROUPS = {
    # group: (program, filter, min_time, goal)
    "decode": ("bench/model_bench", "Decode/.*/1/", "1", 0.85),
    "prefill": ("bench/model_bench", "Prefill", "1", 0.70),
    "attention": ("bench/bench_kernels", "BM_PagedDecodeAttention/.*/cold:1/.*/block:16", "0.3",
                  0.70),
}

# Cases each group has: 2 models x 2 dtypes; 3 lengths x 2 batches x 2 dtypes
# x scattered/adjacent blocks.
EXPECTED_CASES = {"decode": 4, "prefill": 4, "attention": 24}


def run(program, bench_filter, min_time, extra, failed):
    if not os.access(program, os.X_OK):
        sys.exit(f"goals.py: {program} is missing; build the benchmarks first")
    done = subprocess.run([program, "--benchmark_format=json", f"--benchmark_filter={bench_filter}",
                           f"--benchmark_min_time={min_time}", *extra],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"goals.py: {program} exited {done.returncode}:\n{done.stderr[-2000:]}")
    # model_bench prints its ceilings before the JSON.
    start = done.stdout.find("{\n")
    benchmarks = json.loads(done.stdout[max(start, 0):])["benchmarks"]
    ratios = {}  # case -> (ratio to the ceiling, ratio to the plain read or None)
    for b in benchmarks:
        if b.get("run_type") == "aggregate":
            continue
        name = b.get("run_name", b.get("name", "?"))
        name = name.replace("/manual_time", "").replace("/real_time", "")
        for noise in ("/min_warmup_time:0.500", "/iterations:3", "/cold:1", "/block:16", "BM_"):
            name = name.replace(noise, "")
        if b.get("error_occurred") or "ratio" not in b:
            failed.append(f"{name}: {b.get('error_message', 'reported no ratio')}")
            continue
        ratios[name] = (b["ratio"], b.get("ratio_to_scattered_read"))
    if not ratios:
        sys.exit(f"goals.py: {program} ran no benchmark matching {bench_filter}")
    return ratios


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", default="build")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--avx512", choices=["0", "1"],
                        help="0: the AVX2 kernels where AVX-512 is present")
    parser.add_argument("--only", choices=sorted(GROUPS), action="append",
                        help="measure only this group (repeatable)")
    a = parser.parse_args()
    if a.rounds < 1:
        parser.error("--rounds must be at least 1")
    groups = a.only or list(GROUPS)

    samples = {g: {} for g in groups}  # group -> case -> [ratio of each round]
    plain = {}  # attention case -> [ratio to the plain read of each round]
    failed = []  # cases that reported an error, with it
    for round_no in range(a.rounds):
        for g in groups:
            program, bench_filter, min_time, _ = GROUPS[g]
            extra = [f"--avx512={a.avx512}"] if a.avx512 else []
            for case, (ratio, to_plain) in run(f"{a.build}/{program}", bench_filter, min_time,
                                               extra, failed).items():
                samples[g].setdefault(case, []).append(ratio)
                if to_plain is not None:
                    plain.setdefault(case, []).append(to_plain)
        print(f"round {round_no + 1} of {a.rounds} done", file=sys.stderr, flush=True)

    short = 0
    for g in groups:
        goal = GROUPS[g][3]
        print(f"\n{g}: goal {goal:.2f} of the ceiling, {a.rounds} rounds")
        with_plain = any(case in plain for case in samples[g])
        print(f"{'case':<56} {'median':>6} {'range':>11} {'met':>5}" +
              (f" {'of plain read':>13}" if with_plain else ""))
        for case, ratios in samples[g].items():
            median = statistics.median(ratios)
            met = sum(r >= goal for r in ratios)
            mark = "" if median >= goal else "  short"
            short += median < goal
            to_plain = f" {statistics.median(plain[case]):13.2f}" if case in plain else ""
            print(f"{case:<56} {median:6.2f} {min(ratios):5.2f}-{max(ratios):<5.2f} "
                  f"{met:>2}/{len(ratios):<2}{to_plain}{mark}")
    print(f"\n{short} case(s) short of their goal by the median")

    problems = [f"failed to run: {f}" for f in sorted(set(failed))]
    for g in groups:
        if len(samples[g]) < EXPECTED_CASES[g]:
            problems.append(f"{g}: {len(samples[g])} cases ran, {EXPECTED_CASES[g]} expected")
        for case, ratios in samples[g].items():
            if len(ratios) != a.rounds:
                problems.append(f"{g}: {case} ran in {len(ratios)} of {a.rounds} rounds")
    for p in problems:
        print(p)
    return 1 if short or problems else 0


if __name__ == "__main__":
    sys.exit(main())
