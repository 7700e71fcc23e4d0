#!/usr/bin/env python3
"""Checks of a running Baton cluster against one engine, for deploy/gpu_check.sh.

Each subcommand talks to the router over HTTP, compares answers with `baton
generate` on the same model (the --generate command, which names the model
and the device), prints what it saw and exits 1 on a failed check:

  wait            until the named nodes are up (with the given pids)
  handoffs        greedy and seeded prompts prefilled on a prefill node equal
                  one engine's answers; the nodes compute on --device and
                  stage their pools when --staged
  slots-back      every node's staging slots are free again
  fallbacks       each prompt is computed on its decode node (its prefill
                  failed) and equals one engine's; the router counted them;
                  the decode node's blocks and slots are back
  killed-prefill  a prompt whose prefill node is killed (SIGKILL) while it
                  holds the prompt is answered by its decode node as one
                  engine answers it, within a bound, and the decode node's
                  blocks and slots come back

gpu_check.sh runs them on a GPU cluster; on a CPU cluster they run the same
way (`--generate "build/tools/baton generate --model DIR"`).
"""
import argparse
import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request


class Cluster:
    def __init__(self, base, served, generate):
        self.base = base
        self.served = served
        self.generate = shlex.split(generate)

    def get(self, path):
        with urllib.request.urlopen(self.base + path, timeout=10) as r:
            return json.load(r) if path != "/metrics" else r.read().decode()

    def nodes(self):
        try:
            return {n["name"]: n for n in self.get("/v1/nodes")["nodes"]}
        except Exception:
            return {}

    def metric(self, name):
        for line in self.get("/metrics").splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        sys.exit(f"no {name} in /metrics")

    def complete(self, ids, sampling, max_tokens):
        body = json.dumps({"model": self.served, "prompt": ids, "max_tokens": max_tokens,
                           "ignore_eos": True, **sampling}).encode()
        request = urllib.request.Request(self.base + "/v1/completions", body,
                                         {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as r:
            return json.load(r)["choices"][0]

    def one_engine(self, ids, sampling, max_tokens):
        flags = ["--temperature", str(sampling["temperature"])]
        if "seed" in sampling:
            flags += ["--seed", str(sampling["seed"])]
        run = subprocess.run(self.generate + ["--prompt-ids", ",".join(map(str, ids)),
                                              "--max-tokens", str(max_tokens), "--ignore-eos",
                                              "--json", *flags],
                             capture_output=True, text=True, check=True)
        return json.loads(run.stdout)


def random_ids(rng, shortest, longest):
    return [rng.randrange(3, 49000) for _ in range(rng.randrange(shortest, longest))]


def alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def wait_up(cluster, wanted, seconds):
    """wanted: {name: pid or None}. Whether they all came up in time."""
    deadline = time.time() + seconds
    while time.time() < deadline:
        nodes = cluster.nodes()
        if all(nodes.get(name, {}).get("up") and (pid is None or nodes[name].get("pid") == pid)
               for name, pid in wanted.items()):
            print(json.dumps([nodes[name] for name in wanted], indent=1))
            return True
        # A node that stopped at start (its log says why) never comes up.
        stopped = [name for name, pid in wanted.items() if pid is not None and not alive(pid)]
        if stopped:
            print("stopped at start:", stopped)
            return False
        time.sleep(0.5)
    print("not up in time:", json.dumps(cluster.nodes()))
    return False


def blocks_back(cluster, name, seconds=5):
    """Whether node `name` has every KV block and staging slot free again."""
    deadline = time.time() + seconds
    while True:
        node = cluster.nodes().get(name, {})
        back = node.get("free_blocks") == node.get("total_blocks") and \
            node.get("staging_slots_free") == node.get("staging_slots")
        if back or time.time() > deadline:
            print(f"{name}: free blocks {node.get('free_blocks')} of {node.get('total_blocks')},"
                  f" staging slots free {node.get('staging_slots_free')} of "
                  f"{node.get('staging_slots')}")
            return back
        time.sleep(0.2)


def handoffs(cluster, args):
    nodes = cluster.nodes()
    failed = False
    for name, node in nodes.items():
        if node.get("device") != args.device or (args.staged and not node.get("kv_staging")):
            print(f"{name}: on {node.get('device')}, staged: {bool(node.get('kv_staging'))};"
                  f" expected {args.device}{', staged' if args.staged else ''}")
            failed = True
    rng = random.Random()
    # Greedy and seeded sampling: the prefill node samples the first token,
    # the decode node the rest from the same seeded generator.
    for i in range(args.prompts):
        ids = random_ids(rng, 40, 400)
        seeded = i % 2 == 1
        sampling = {"temperature": 0.8, "seed": rng.randrange(1 << 31)} if seeded else \
            {"temperature": 0}
        answer = cluster.complete(ids, sampling, args.max_tokens)
        one = cluster.one_engine(ids, sampling, args.max_tokens)
        remote = answer["served_by"]["prefill"] is not None
        same = answer["text"] == one["text"]
        failed |= not (remote and same)
        print(f"prompt {i} ({len(ids)} tokens, {'seeded' if seeded else 'greedy'}), served by",
              answer["served_by"], "equals one engine:", same)
    return failed


def slots_back(cluster, args):
    time.sleep(1)  # a heartbeat after the last request
    nodes = cluster.nodes()
    held = {name: n["staging_slots"] - n["staging_slots_free"] for name, n in nodes.items()}
    print("staging slots still held:", held)
    return any(held.values()) or (args.staged and not all(n["staging_slots"]
                                                           for n in nodes.values()))


def fallbacks(cluster, args):
    before = cluster.metric("baton:prefill_fallbacks_total")
    failed = False
    rng = random.Random()
    for i in range(args.prompts):
        ids = random_ids(rng, 40, 400)
        sampling = {"temperature": 0}
        answer = cluster.complete(ids, sampling, args.max_tokens)
        one = cluster.one_engine(ids, sampling, args.max_tokens)
        here = answer["served_by"]["prefill"] is None
        same = answer["text"] == one["text"]
        failed |= not (here and same)
        print(f"prompt {i} ({len(ids)} tokens): computed on the decode node: {here}, "
              f"equals one engine: {same}")
    counted = cluster.metric("baton:prefill_fallbacks_total") - before
    print("prefill fallbacks counted:", counted)
    failed |= counted != args.prompts
    return failed | (not blocks_back(cluster, args.decode))


def killed_prefill(cluster, args):
    if args.victim <= 1:  # 0 would be this process group, 1 init
        sys.exit(f"killed-prefill: --victim {args.victim} is no node's pid")
    before = cluster.metric("baton:prefill_fallbacks_total")
    rng = random.Random()
    ids = random_ids(rng, 100, 400)
    sampling = {"temperature": 0}
    answer = {}

    def ask():
        try:
            answer["choice"] = cluster.complete(ids, sampling, args.max_tokens)
        except Exception as e:  # the check below reports it
            answer["error"] = repr(e)
        answer["at"] = time.time()

    asking = threading.Thread(target=ask)
    asking.start()
    # The decode node reserves the prompt's blocks before the prefill node
    # computes it; the prefill node holds it (its first step stalled).
    reserved = False
    deadline = time.time() + 10
    while time.time() < deadline and not reserved:
        node = cluster.nodes().get(args.decode, {})
        reserved = node.get("free_blocks", 0) < node.get("total_blocks", 0)
        time.sleep(0.05)
    print("decode node reserved blocks before the kill:", reserved)
    killed_at = time.time()
    os.kill(args.victim, signal.SIGKILL)
    asking.join(timeout=120)
    if "choice" not in answer:
        print("no answer:", answer.get("error", "timed out"))
        return True
    one = cluster.one_engine(ids, sampling, args.max_tokens)
    here = answer["choice"]["served_by"]["prefill"] is None
    same = answer["choice"]["text"] == one["text"]
    took = answer["at"] - killed_at
    print(f"prompt of {len(ids)} tokens answered {took:.1f} s after the kill; computed on the "
          f"decode node: {here}, equals one engine: {same}")
    # Computed on the decode node because its prefill node died, not
    # placed there to begin with.
    counted = cluster.metric("baton:prefill_fallbacks_total") - before
    print("prefill fallbacks counted:", counted)
    failed = not (reserved and here and same) or took > args.bound or counted != 1
    return failed | (not blocks_back(cluster, args.decode))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("check", choices=["wait", "handoffs", "slots-back", "fallbacks",
                                          "killed-prefill"])
    parser.add_argument("--base", default="http://127.0.0.1:8000")
    parser.add_argument("--served", default="smollm2-135m", help="the model's served name")
    parser.add_argument("--generate", default="",
                        help="`baton generate` with its model and device, as one string")
    parser.add_argument("--nodes", default="", help="wait: NAME=PID,... (PID may be left out)")
    parser.add_argument("--seconds", type=float, default=120, help="wait: how long")
    parser.add_argument("--device", default="cuda:0", help="handoffs: the nodes' device")
    parser.add_argument("--staged", action="store_true", help="the nodes' pools are staged")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--decode", default="decode-0", help="the decode node to watch")
    parser.add_argument("--victim", type=int, default=0,
                        help="killed-prefill: the prefill node's pid (required there)")
    parser.add_argument("--bound", type=float, default=30,
                        help="killed-prefill: seconds from the kill to the answer, at most")
    args = parser.parse_args()
    cluster = Cluster(args.base, args.served, args.generate)
    if args.check == "wait":
        wanted = {}
        for item in filter(None, args.nodes.split(",")):
            name, _, pid = item.partition("=")
            wanted[name] = int(pid) if pid else None
        failed = not wait_up(cluster, wanted, args.seconds)
    else:
        failed = {"handoffs": handoffs, "slots-back": slots_back, "fallbacks": fallbacks,
                  "killed-prefill": killed_prefill}[args.check](cluster, args)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
