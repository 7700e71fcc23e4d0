#!/usr/bin/env python3
"""A bounded soak: `baton bench` at a steady rate against a cluster for a
while, with faults injected at random moments, then the checks that nothing
was lost.

    deploy/soak.py --duration 3600                 # an hour, configs/local-2p2d.yaml
    deploy/soak.py --duration 300 --rate 1 --fault-every 30

Faults, one at a time, at random: kill -9 of a node (its `baton up`
starts it again); SIGSTOP of a node for a few seconds, then SIGCONT (the
router declares it dead, then it registers again); kill -9 of the router
(started again; the nodes register with it by themselves); a client that
hangs up mid-stream. Every prefill node also loses the first completion
notice it sends after each start (BATON_FAULT_DROP_NOTICES, --drop-notices).
At the end:

  * every node is up, idle, and its pool's free blocks equal its total;
  * no process has grown: each role's last private resident memory
    (RssAnon) is at most --rss-growth times the most it held in the run's
    second quarter, plus 64 MiB (the first quarter is warm-up). Shared
    memory is left out: a prefill node maps its peers' KV pools (UCX over
    shared memory) and touches their pages as it writes blocks, up to the
    pools' size, and lets a dead peer's go; it is logged beside;
  * every request that failed says why (a non-empty error), and the share
    that failed is below --max-failed (only requests a fault struck should
    fail).

Exits non-zero, naming what failed. Not part of CI (it takes as long as
--duration); docs/PERFORMANCE.md records a run.
"""
import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(message):
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def get(port, path):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as r:
            return json.load(r)
    except (OSError, ValueError):
        return None


def nodes(port):
    doc = get(port, "/v1/nodes")
    return {n["name"]: n for n in doc["nodes"]} if doc else {}


def drained(port, expected):
    listed = nodes(port)
    return len(listed) == expected and all(
        n["up"] and n["free_blocks"] == n["total_blocks"] and n["running"] == 0
        and n["waiting"] == 0 and n["awaiting_kv"] == 0 for n in listed.values())


def roles(up_pid):
    """{role name: (pid, private RSS, shared RSS in bytes)} of the roles
    below `baton up`, by the argument after --name, or "router"."""
    out = {}
    try:
        with open(f"/proc/{up_pid}/task/{up_pid}/children") as f:
            children = [int(c) for c in f.read().split()]
    except OSError:
        return out
    for pid in children:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = [a.decode() for a in f.read().split(b"\0") if a]
            with open(f"/proc/{pid}/status") as f:
                status = dict(line.split(":", 1) for line in f if ":" in line)
            anon = int(status["RssAnon"].split()[0]) * 1024
            shared = int(status["RssShmem"].split()[0]) * 1024
        except (OSError, KeyError, IndexError, ValueError):
            continue
        name = args[args.index("--name") + 1] if "--name" in args else "router"
        out[name] = (pid, anon, shared)
    return out


def hang_up_mid_stream(port):
    """Streams a long completion and closes the connection at its first
    token; False if no token came."""
    body = json.dumps({"prompt": "hang up " * 16, "max_tokens": 512, "stream": True,
                       "ignore_eos": True}).encode()
    head = (f"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
            f"application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(head + body)
            received = b""
            while b"data:" not in received:
                chunk = conn.recv(4096)
                if not chunk:
                    return False
                received += chunk
        return True
    except OSError:
        return False


def strike(rng, port, up_pid):
    """One fault drawn at random; returns (its kind, what it struck), or
    None when there was nothing to strike."""
    kind = rng.choice(["kill", "stop", "kill router", "hang up"])
    if kind == "kill router":
        router = roles(up_pid).get("router")
        if not router:
            return None
        os.kill(router[0], signal.SIGKILL)
        return kind, f"pid {router[0]}"
    if kind == "hang up":
        return (kind, "a client mid-stream") if hang_up_mid_stream(port) else None
    listed = [n for n in nodes(port).values() if n["up"]]
    if not listed:
        return None
    victim = rng.choice(listed)
    if kind == "kill":
        os.kill(victim["pid"], signal.SIGKILL)
    else:
        os.kill(victim["pid"], signal.SIGSTOP)
        time.sleep(rng.uniform(2, 5))
        os.kill(victim["pid"], signal.SIGCONT)
    return kind, f"{victim['name']} (pid {victim['pid']})"


def report(args, doc, faults, up_log, problems):
    """Logs what the bench saw, by error, and adds to `problems` what breaks
    the soak's promises."""
    total = doc["completed"] + doc["failed"]
    said_why = sum(1 for e in doc["errors"] if e)
    if said_why < doc["failed"]:
        problems.append(f"{doc['failed'] - said_why} failed requests gave no error")
    if total and doc["failed"] / total > args.max_failed:
        problems.append(f"{doc['failed']} of {total} requests failed")
    reasons = {}
    for e in doc["errors"]:
        if e:
            reasons[e[:80]] = reasons.get(e[:80], 0) + 1
    kinds = {}
    for kind, _ in faults:
        kinds[kind] = kinds.get(kind, 0) + 1
    dropped = open(up_log).read().count("completion notice dropped")
    log(f"{total} requests, {doc['failed']} failed; {len(faults)} faults ("
        + ", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))
        + f") and {dropped} completion notices lost; "
        f"output {doc.get('output_throughput', 0):.1f} tok/s")
    for reason, count in sorted(reasons.items(), key=lambda kv: -kv[1]):
        log(f"  {count} x {reason}")


def lose_first_notices(args, up_log, node_count):
    """Sends requests until every prefill node has lost the notices
    --drop-notices asks it to (the bench's own warm-up request must get
    through); returns the notices lost."""
    prefill_nodes = sum(1 for n in nodes(args.port).values() if n.get("role") == "prefill")
    want = args.drop_notices * (prefill_nodes or node_count)
    body = json.dumps({"prompt": "warm up " * 32, "max_tokens": 2}).encode()
    deadline = time.time() + 120
    while time.time() < deadline:
        lost = open(up_log).read().count("completion notice dropped")
        if lost >= want:
            return lost
        request = urllib.request.Request(f"http://127.0.0.1:{args.port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            urllib.request.urlopen(request, timeout=30).read()
        except OSError:
            pass  # the requests whose notices were lost fail
    return open(up_log).read().count("completion notice dropped")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baton", default=os.path.join(ROOT, "build/tools/baton"))
    parser.add_argument("--config", default=os.path.join(ROOT, "configs/local-2p2d.yaml"))
    parser.add_argument("--port", type=int, default=8000, help="the config's router.http_port")
    parser.add_argument("--duration", type=float, default=3600, help="seconds of load")
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second")
    parser.add_argument("--drop-notices", type=int, default=1,
                        help="completion notices each prefill process loses after it starts")
    parser.add_argument("--fault-every", type=float, default=60,
                        help="mean seconds between faults")
    parser.add_argument("--input-len", type=int, default=256)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--rss-growth", type=float, default=1.5)
    parser.add_argument("--max-failed", type=float, default=0.1,
                        help="largest share of requests that may fail")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    work = tempfile.mkdtemp(prefix="baton-soak-")
    problems = []

    up_log = open(os.path.join(work, "up.log"), "w")
    up = subprocess.Popen([args.baton, "up", args.config], stdout=up_log, stderr=subprocess.STDOUT,
                          start_new_session=True,
                          env={**os.environ, "BATON_FAULT_DROP_NOTICES": str(args.drop_notices)})
    try:
        deadline = time.time() + 300
        while time.time() < deadline and "Baton is up" not in open(up_log.name).read():
            if up.poll() is not None:
                sys.exit(f"soak: baton up exited with {up.returncode}; see {up_log.name}")
            time.sleep(0.5)
        expected = len(nodes(args.port))
        log(f"cluster up: {expected} nodes; {args.duration:.0f} s at {args.rate} requests/s")
        lost = lose_first_notices(args, up_log.name, expected)
        log(f"warm-up: the prefill nodes lost {lost} completion notices, as asked")

        result = os.path.join(work, "bench.json")
        bench = subprocess.Popen(
            [args.baton, "bench", "--port", str(args.port), "--request-rate", str(args.rate),
             "--num-prompts", str(max(1, int(args.rate * args.duration))),
             "--random-input-len", str(args.input_len),
             "--random-output-len", str(args.output_len), "--vocab-size", "49000",
             "--seed", str(args.seed), "--save-detailed", "--save-result", result],
            stdout=open(os.path.join(work, "bench.txt"), "w"), stderr=subprocess.STDOUT)

        baseline, last, shared, faults = {}, {}, {}, []
        started = time.time()
        next_fault = started + rng.expovariate(1 / args.fault_every)
        while bench.poll() is None:
            time.sleep(1)
            now = roles(up.pid)
            rss = {role: anon for role, (_, anon, _) in now.items()}
            shared.update({role: shm for role, (_, _, shm) in now.items()})
            last.update(rss)
            if args.duration / 4 <= time.time() - started < args.duration / 2:
                for role, value in rss.items():
                    baseline[role] = max(baseline.get(role, 0), value)
            if time.time() < next_fault:
                continue
            fault = strike(rng, args.port, up.pid)
            if fault:
                faults.append(fault)
                log(f"fault {len(faults)}: {fault[0]} {fault[1]}")
            next_fault = time.time() + rng.expovariate(1 / args.fault_every)

        deadline = time.time() + 120
        while time.time() < deadline and not drained(args.port, expected):
            time.sleep(0.5)
        if not drained(args.port, expected):
            problems.append("not drained 120 s after the load: " + json.dumps(nodes(args.port)))

        for role, base in baseline.items():
            end = last.get(role, 0)
            if end > base * args.rss_growth + (64 << 20):
                problems.append(f"{role}: private RSS grew from {base >> 20} MiB to {end >> 20} MiB")

        if not os.path.exists(result):
            with open(os.path.join(work, "bench.txt")) as f:
                problems.append("baton bench saved no result: " + f.read().strip()[-300:])
        else:
            with open(result) as f:
                report(args, json.load(f), faults, up_log.name, problems)
            log("private RSS (MiB), most in the second quarter -> end: " + ", ".join(
                f"{r} {baseline.get(r, 0) >> 20} -> {last.get(r, 0) >> 20}" for r in sorted(last)))
            log("shared RSS at the end (MiB): " + ", ".join(
                f"{r} {shared.get(r, 0) >> 20}" for r in sorted(shared)))
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGTERM)
            try:
                up.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(up.pid, signal.SIGKILL)
    for problem in problems:
        log("FAILED: " + problem)
    log(f"logs in {work}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
