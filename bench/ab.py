#!/usr/bin/env python3
"""Compares two builds of a Google Benchmark program on this machine.

Run-to-run swings here (±20% between consecutive runs of the same binary)
are larger than most changes worth making, so one run of each proves
nothing. This runs the two binaries alternately, swapping which goes first
every round so drift does not favour either, and reports for every
benchmark the median of a counter for each, their ratio, and in how many
rounds the new one did better (by that round's median, or its best with
--best).

  bench/ab.py OLD NEW [--rounds 6] [--counter NAME] [--lower-is-better] \\
      -- --benchmark_filter=... --benchmark_min_time=0.3

The counter defaults to real_time (lower is better); name a user counter
(KV_GBps, W_GBps, tokens_per_s, ...) to compare that instead.

--best reports each side's best value instead of its median. Interference
from other tenants only ever slows a run down, so the best of many runs is
the steadiest estimate of what a kernel can do; pass
--benchmark_repetitions=N to the benchmark to get N samples a round. (A
ratio to a ceiling measured between the iterations is a poor counter for
--best: its ceiling moves too.)
"""
import argparse
import json
import statistics
import subprocess
import sys


def run(binary, args):
    done = subprocess.run([binary, "--benchmark_format=json", *args],
                          capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"ab.py: {binary} exited {done.returncode}:\n{done.stderr[-2000:]}")
    # Some programs print their ceilings before the JSON (model_bench).
    start = done.stdout.find("{\n")
    return json.loads(done.stdout[max(start, 0):])["benchmarks"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old")
    parser.add_argument("new")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--counter", default="real_time")
    parser.add_argument("--lower-is-better", action="store_true",
                        help="implied for real_time and cpu_time")
    parser.add_argument("--best", action="store_true",
                        help="compare each side's best value, not its median")
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    a = parser.parse_args(argv[:split])
    bench_args = argv[split + 1:]
    lower = a.lower_is_better or a.counter in ("real_time", "cpu_time")
    if a.rounds < 1:
        parser.error("--rounds must be at least 1")

    # name -> {"old": [samples of round 0, of round 1, ...], "new": [...]}
    values = {}
    for r in range(a.rounds):
        order = ("old", "new") if r % 2 == 0 else ("new", "old")
        for which in order:
            for b in run(getattr(a, which), bench_args):
                if b.get("run_type") == "aggregate":
                    continue
                if a.counter not in b:
                    sys.exit(f"ab.py: {b['name']} has no counter {a.counter!r}")
                rounds = values.setdefault(b["name"], {"old": [], "new": []})[which]
                while len(rounds) <= r:
                    rounds.append([])
                rounds[r].append(float(b[a.counter]))
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr)

    stat = "best" if a.best else "median"
    pick = (min if lower else max) if a.best else statistics.median
    print(f"| benchmark | old {stat} {a.counter} | new {stat} | new / old | new better in |")
    print("|---|---|---|---|---|")
    for name, v in values.items():
        old, new = v["old"], v["new"]
        if not any(old) or not any(new):
            continue
        mo = pick([x for samples in old for x in samples])
        mn = pick([x for samples in new for x in samples])
        # Rounds, not samples: repetitions within a round come from the same
        # two processes run back to back, so they are not independent.
        paired = [(pick(o), pick(n)) for o, n in zip(old, new) if o and n]
        wins = sum(1 for o, n in paired if (n < o if lower else n > o))
        print(f"| {name} | {mo:.4g} | {mn:.4g} | {mn / mo:.3f} | {wins}/{len(paired)} rounds |")

if __name__ == "__main__":
    main()
