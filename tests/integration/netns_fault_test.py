"""Faults across hosts: a cluster whose router, prefill node and decode node
each run in a network namespace of their own (three "hosts" joined by veth
links to a bridge, UCX over TCP between them), and faults on the links.

For each fault: the affected requests fail with an error within a stated
bound, the unaffected ones finish with the output one engine gives, the
cluster serves again once the fault is gone without anyone restarting
anything, and every pool's free blocks return to their total.

  * partition: the decode node cut off from the router (not from the
    prefill node) mid-stream;
  * a slow, lossy link: 40 ms each way and 5% of the packets lost on the
    decode node's link (tc's netem); where the kernel has no netem, the link
    capped at 20 Mbit/s each way (tc's tbf) and 5% of the packets arriving
    at either end dropped (nftables);
  * kill -9 of the decode node mid-stream, which `baton up` starts again;
  * SIGSTOP of the decode node mid-stream, then SIGCONT;
  * a client that hangs up mid-stream, over HTTP and over ZeroMQ;
  * kill -9 of the prefill node while its KV streams to the decode node;
  * twice router.max_queued_requests at once;
  * kill -9 of the router with a stream in flight, whose nodes on the
    other hosts come back to it and drop the dead router's work;
  * a transfer's completion notice lost (the prefill node's first, by
    BATON_FAULT_DROP_NOTICES), while another request runs beside it;
  * the SSD tier's pages corrupted under an evicted prompt, which the nodes
    refuse and compute again.

Needs CAP_NET_ADMIN (ip netns, ip route); exits 77 (skipped) where a
namespace cannot be made, saying why.

    python3 netns_fault_test.py --baton build/tools/baton
"""
import argparse
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

SKIP = 77
BRIDGE = "btfbr0"
SUBNET = "10.77.0"
# The three hosts: namespace, address, and the root side of its veth link.
HOSTS = {
    "router": ("btf-router", f"{SUBNET}.2", "btf-router-b"),
    "prefill": ("btf-prefill", f"{SUBNET}.3", "btf-prefill-b"),
    "decode": ("btf-decode", f"{SUBNET}.4", "btf-decode-b"),
}
HEARTBEAT_TIMEOUT_S = 1.0
TRANSFER_DEADLINE_S = 3.0  # transfer.default_deadline_ms
MAX_QUEUED = 6  # router.max_queued_requests: the queue-overflow case fills it
ROUTER = HOSTS["router"][1]


def sh(*args, check=True):
    return subprocess.run(list(args), check=check, capture_output=True, text=True)


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def set_up_network():
    """The bridge in this namespace, and a namespace per host linked to it.
    Returns None, or why it cannot be done here."""
    probe = sh("ip", "netns", "add", "btf-probe", check=False)
    if probe.returncode != 0:
        return "cannot make a network namespace: " + (probe.stderr.strip() or "ip netns add failed")
    sh("ip", "netns", "del", "btf-probe")
    tear_down_network()
    sh("ip", "link", "add", BRIDGE, "type", "bridge")
    sh("ip", "addr", "add", f"{SUBNET}.1/24", "dev", BRIDGE)
    sh("ip", "link", "set", BRIDGE, "up")
    for ns, address, root_side in HOSTS.values():
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", root_side, "type", "veth", "peer", "name", ns + "-a")
        sh("ip", "link", "set", ns + "-a", "netns", ns)
        # Every host's link is eth0, so one ucx_env names it for all of them.
        sh("ip", "-n", ns, "link", "set", ns + "-a", "name", "eth0")
        sh("ip", "-n", ns, "addr", "add", address + "/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "link", "set", root_side, "master", BRIDGE)
        sh("ip", "link", "set", root_side, "up")
    return None


def tear_down_network():
    for ns, _, root_side in HOSTS.values():
        sh("ip", "netns", "del", ns, check=False)  # takes its veth pair with it
        sh("ip", "link", "del", root_side, check=False)
    sh("ip", "link", "del", BRIDGE, check=False)


def cut(a, b):
    """Host a can no longer reach host b: a blackhole route in a's namespace
    (the kernel may lack tc's filters and netem; routes it always has)."""
    sh("ip", "-n", HOSTS[a][0], "route", "add", "blackhole", HOSTS[b][1] + "/32")


def uncut(a, b):
    sh("ip", "-n", HOSTS[a][0], "route", "del", "blackhole", HOSTS[b][1] + "/32", check=False)


def netem(host, *spec):
    """Adds netem's `spec` to host's link; False where the kernel has no netem."""
    result = sh("tc", "-n", HOSTS[host][0], "qdisc", "replace", "dev", "eth0", "root", "netem",
                *spec, check=False)
    return result.returncode == 0


def heal(host):
    sh("tc", "-n", HOSTS[host][0], "qdisc", "del", "dev", "eth0", "root", check=False)
    sh("tc", "qdisc", "del", "dev", HOSTS[host][2], "root", check=False)
    for namespace in (["ip", "netns", "exec", HOSTS[host][0]], []):
        sh(*namespace, "nft", "delete", "table", "netdev", "btf_loss", check=False)


def drop_arriving(interface, percent, namespace=()):
    """Drops `percent` of the packets arriving on `interface` (nftables'
    netdev ingress hook: on the wire, as far as the sender can tell)."""
    nft = [*namespace, "nft"]
    sh(*nft, "add", "table", "netdev", "btf_loss")
    sh(*nft, "add", "chain", "netdev", "btf_loss", "in",
       f"{{ type filter hook ingress device {interface} priority 0; }}")
    sh(*nft, "add", "rule", "netdev", "btf_loss", "in", "numgen", "random", "mod", "100", "<",
       str(percent), "counter", "drop")


def packets_dropped(host):
    """Packets the nftables loss rules on host's link dropped so far."""
    total = 0
    for namespace in (["ip", "netns", "exec", HOSTS[host][0]], []):
        listed = sh(*namespace, "nft", "list", "table", "netdev", "btf_loss", check=False).stdout
        words = listed.split()
        total += sum(int(words[i + 1]) for i, w in enumerate(words) if w == "packets")
    return total


def netem_counts(host):
    """(packets, dropped) of the netem qdisc on host's link so far, as
    `tc -s` reports them; (0, 0) where there is none."""
    shown = sh("tc", "-s", "-n", HOSTS[host][0], "qdisc", "show", "dev", "eth0", check=False).stdout
    if "netem" not in shown:
        return 0, 0
    found = re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", shown)
    return (int(found.group(1)), int(found.group(2))) if found else (0, 0)


def slow_lossy_link(host):
    """Makes host's link slow and lossy; returns what was done, or None
    where this kernel can do neither netem nor tbf with nftables."""
    if netem(host, "delay", "40ms", "loss", "5%"):
        return "40 ms each way, 5% loss (netem)"
    namespace, _, root_side = HOSTS[host]
    tbf = ["tbf", "rate", "20mbit", "burst", "32kbit", "latency", "100ms"]
    if sh("which", "nft", check=False).returncode != 0:
        return None
    if (sh("tc", "-n", namespace, "qdisc", "replace", "dev", "eth0", "root", *tbf,
           check=False).returncode != 0
            or sh("tc", "qdisc", "replace", "dev", root_side, "root", *tbf,
                  check=False).returncode != 0):
        heal(host)
        return None
    drop_arriving("eth0", 5, ["ip", "netns", "exec", namespace])
    drop_arriving(root_side, 5)
    return "20 Mbit/s each way (tbf), 5% of the packets arriving at either end dropped (nftables)"


def write_cluster(directory, model_dir, name="cluster.yaml", kv_cache_bytes="64MiB",
                  max_model_len=1024, engine_extra=""):
    path = os.path.join(directory, name)
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model_dir}, served_name: smollm2}}
router:
  host: {ROUTER}
  min_remote_prefill_tokens: 4
  heartbeat_interval_ms: 100
  heartbeat_timeout_ms: {int(HEARTBEAT_TIMEOUT_S * 1000)}
  drain_timeout_ms: 2000
  max_queued_requests: {MAX_QUEUED}
engine: {{threads: 1, kv_cache_bytes: {kv_cache_bytes}, max_model_len: {max_model_len},
          max_num_seqs: 4{engine_extra}}}
transfer:
  share_pool: false
  default_deadline_ms: {int(TRANSFER_DEADLINE_S * 1000)}
  ucx_env: {{UCX_TLS: "tcp,self", UCX_NET_DEVICES: "eth0"}}
prefill: [{{name: prefill-0, host: {HOSTS["prefill"][1]}}}]
decode: [{{name: decode-0, host: {HOSTS["decode"][1]}}}]
""")
    return path


def http(method, path, body=None, timeout=30):
    """(status, parsed JSON or text) from the router."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"http://{ROUTER}:8000{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            text = r.read().decode()
            status = r.status
    except urllib.error.HTTPError as e:
        text, status = e.read().decode(), e.code
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def nodes():
    try:
        status, doc = http("GET", "/v1/nodes", timeout=2)
        return {n["name"]: n for n in doc["nodes"]} if status == 200 else {}
    except OSError:
        return {}


def wait_for(what, condition, timeout):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what} within {timeout} s; nodes: {json.dumps(nodes())}")


def drained():
    """Every node up, idle, and its pool's free blocks equal to its total."""
    listed = nodes()
    return len(listed) == 2 and all(
        n["up"] and n.get("free_blocks") == n.get("total_blocks") and n.get("running", 0) == 0
        and n.get("waiting", 0) == 0 and n.get("awaiting_kv", 0) == 0 for n in listed.values())


def stream(prompt, max_tokens, started=None, progress=None):
    """Streams a completion, setting the event `started` at its first token
    and counting events in progress["events"]; returns (finish_reason or
    None, error text or None, seconds from the first token to the end)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True,
                       "ignore_eos": True, "temperature": 0}).encode()
    request = urllib.request.Request(f"http://{ROUTER}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
    finish, error, first = None, None, None
    with urllib.request.urlopen(request, timeout=60) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            if progress is not None:
                progress["events"] = progress.get("events", 0) + 1
            if first is None:
                first = time.time()
                if started:
                    started.set()
            event = json.loads(line[5:])
            if "error" in event:
                error = json.dumps(event["error"])
            elif event["choices"][0].get("finish_reason"):
                finish = event["choices"][0]["finish_reason"]
    return finish, error, (time.time() - first) if first else None


class Cluster:
    def __init__(self, baton, yaml, env=None):
        """`env`: more environment for a role's host ({"prefill": {...}})."""
        self.procs = {}
        for role in ("router", "prefill", "decode"):
            log = open(yaml + f".{role}.log", "w")
            self.procs[role] = subprocess.Popen(
                ["ip", "netns", "exec", HOSTS[role][0], baton, "--log-level", "warn", "up", yaml,
                 "--ready-timeout", "60"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True, env={**os.environ, **(env or {}).get(role, {})})
        wait_for("every node up", lambda: len(nodes()) == 2 and all(
            n["up"] for n in nodes().values()), 60)

    def stop(self):
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def expected_text(baton, model_dir, prompt, max_tokens):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt + "\n")
    try:
        out = subprocess.run([baton, "generate", "--model", model_dir, "--prompts", f.name,
                              "--json", "--max-tokens", str(max_tokens), "--temperature", "0",
                              "--ignore-eos"], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    return json.loads(out.strip().splitlines()[0])["text"]


def check_serves(baton, model_dir, prompt, max_tokens=12):
    status, answer = http("POST", "/v1/completions", {
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
    check(status == 200, f"a completion after the fault: {status} {answer}")
    want = expected_text(baton, model_dir, prompt, max_tokens)
    check(answer["choices"][0]["text"] == want,
          f"output differs from one engine: {answer['choices'][0]['text']!r} != {want!r}")


def stream_struck_by(prompt, strike, what):
    """Starts a long stream, runs strike() at its first token, and returns
    the seconds from the strike until the stream ended, which it must have
    done with an error event, not a finish."""
    result, started = {}, threading.Event()

    def run():
        result["outcome"] = stream(prompt, 900, started)

    client = threading.Thread(target=run)
    client.start()
    check(started.wait(20), "the stream did not start")
    struck = time.time()
    strike()
    client.join(timeout=30)
    check(not client.is_alive(), f"the stream did not end after {what}")
    took = time.time() - struck
    finish, error, _ = result["outcome"]
    check(error is not None and finish is None, f"the stream ended without an error after {what}: {finish}")
    bound = HEARTBEAT_TIMEOUT_S + 3.0
    check(took < bound, f"the stream failed {took:.1f} s after {what} (bound {bound} s)")
    return took


def test_partition(baton, model_dir):
    """The decode node cut off from the router but not from the prefill
    node, mid-stream: the stream fails within the heartbeat timeout plus a
    margin, /health says no decode node is up; healed, the node registers
    again by itself and the cluster serves the same output as one engine."""
    took = stream_struck_by("partition " * 8,
                            lambda: (cut("decode", "router"), cut("router", "decode")),
                            "the partition")
    status, health = http("GET", "/health")
    check(status == 503 and health.get("reason") == "no decode node is up",
          f"/health during the partition: {status} {health}")
    uncut("decode", "router")
    uncut("router", "decode")
    wait_for("the decode node back and drained", drained, 30)
    check_serves(baton, model_dir, "after the partition")
    print(f"partition: stream failed {took:.2f} s after the cut; served again after healing")


def test_slow_lossy_link(baton, model_dir):
    """A slow link losing 5% of its packets to the decode node: every
    request still finishes, with one engine's output."""
    how = slow_lossy_link("decode")
    if how is None:
        print("slow lossy link: skipped: this kernel has no netem, and no tbf with nftables")
        return
    try:
        for i in range(3):
            check_serves(baton, model_dir, f"a slow lossy link {i} " * 3)
        if "nftables" in how:
            dropped = packets_dropped("decode")
            check(dropped > 0, "the loss rules dropped no packet")
            how += f": {dropped} packets dropped"
        else:
            # Evidence the link in use was the one netem shaped: its packets,
            # and its losses (none of 200 packets at 5% comes once in 30,000).
            packets, dropped = netem_counts("decode")
            check(packets > 0, "netem saw no packet: the cluster does not use the shaped link")
            check(packets < 200 or dropped > 0, f"netem lost none of {packets} packets")
            how += f": {dropped} of {packets} packets lost"
    finally:
        heal("decode")
    wait_for("drained after the slow lossy link", drained, 30)
    print(f"slow lossy link ({how}): 3 completions equal one engine's")


def test_kill_decode(baton, model_dir):
    """kill -9 of the decode node mid-stream: the stream fails within a
    bound, its `baton up` starts it again, and it serves."""
    victim = nodes()["decode-0"]["pid"]
    took = stream_struck_by("killed " * 8, lambda: os.kill(victim, signal.SIGKILL), "the kill")
    wait_for("decode-0 started again",
             lambda: nodes().get("decode-0", {}).get("up") and nodes()["decode-0"]["pid"] != victim,
             30)
    wait_for("drained after the restart", drained, 30)
    check_serves(baton, model_dir, "after the restart")
    print(f"kill -9 decode: stream failed {took:.2f} s after the kill; restarted and served")


def test_stopped_decode(baton, model_dir):
    """SIGSTOP of the decode node mid-stream (a process that stops without
    dying): declared dead within the bound; on SIGCONT it registers again
    and serves, its pool drained of the failed request."""
    victim = nodes()["decode-0"]["pid"]
    try:
        took = stream_struck_by("stopped " * 8, lambda: os.kill(victim, signal.SIGSTOP),
                                "the stop")
    finally:
        os.kill(victim, signal.SIGCONT)
    wait_for("the stopped node back and drained", drained, 30)
    check_serves(baton, model_dir, "after the stop")
    print(f"SIGSTOP decode: stream failed {took:.2f} s after the stop; back after SIGCONT")


def test_client_hangs_up(baton, model_dir):
    """A client that hangs up mid-stream: the router aborts the request on
    the decode node across the link, whose blocks come back to the pool."""
    body = json.dumps({"prompt": "hang up " * 8, "max_tokens": 900, "stream": True,
                       "ignore_eos": True}).encode()
    request = (f"POST /v1/completions HTTP/1.1\r\nHost: {ROUTER}\r\n"
               f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection((ROUTER, 8000), timeout=20) as conn:
        conn.sendall(request + body)
        received = b""
        while b"data:" not in received:
            chunk = conn.recv(4096)
            check(chunk, "the stream closed before its first token")
            received += chunk
    hung_up = time.time()
    # Generating the 900 tokens to the end would take several times longer.
    wait_for("the decode node's blocks back after the hang-up", drained, 3)
    check_serves(baton, model_dir, "after the hang-up")
    print(f"client hang-up: the decode node drained {time.time() - hung_up:.2f} s later")


def test_zmq_client_goes_away(baton, model_dir):
    """A ZeroMQ client that goes away mid-stream (`baton bench` over the
    router's ZeroMQ front end, killed): the router cancels its request when
    the connection from the other host closes, and the decode node stops
    and gives its blocks back."""
    client = subprocess.Popen(
        [baton, "bench", "--backend", "zmq", "--host", ROUTER, "--port", "8001",
         "--num-prompts", "1", "--random-input-len", "16", "--random-output-len", "900",
         "--max-concurrency", "1", "--vocab-size", "49000", "--seed", "3"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for("the ZeroMQ client's request on the decode node",
                 lambda: nodes().get("decode-0", {}).get("running", 0) > 0, 10)
        time.sleep(0.3)  # tokens on the wire
    finally:
        client.kill()
        client.wait()
    gone = time.time()
    # Generating the 900 tokens to the end would take several times longer.
    wait_for("the decode node's blocks back after the ZeroMQ client went away", drained, 3)
    check_serves(baton, model_dir, "after the ZeroMQ client went away")
    print(f"ZeroMQ client gone: the decode node drained {time.time() - gone:.2f} s later")


def test_prefill_killed_mid_prefill(baton, model_dir):
    """kill -9 of the prefill node while it prefills a long prompt and
    streams its KV layer by layer to the decode node: nothing is lost. Once
    the router declares the node dead, the decode node frees what it had
    reserved and computes the prompt itself, answering as one engine does;
    the prefill node's `baton up` starts it again."""
    victim = nodes()["prefill-0"]["pid"]
    outcome = {}
    prompt, max_tokens = "a long prompt " * 70, 4
    want = expected_text(baton, model_dir, prompt, max_tokens)

    def run():
        outcome["answer"] = http("POST", "/v1/completions", {
            "prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}, timeout=60)

    client = threading.Thread(target=run)
    client.start()
    # The prefill of ~980 tokens takes a second or more on one thread; its
    # KV streams to the decode node layer by layer meanwhile.
    time.sleep(0.3)
    check(client.is_alive(), f"the prefill ended before the kill: {outcome}")
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    client.join(timeout=30)
    took = time.time() - killed
    status, answer = outcome["answer"]
    check(status == 200 and answer["choices"][0]["served_by"]["prefill"] is None,
          f"the request of a killed prefill node: {status} {answer}")
    check(answer["choices"][0]["text"] == want,
          f"computed on the decode node: {answer['choices'][0]['text']!r}, one engine: {want!r}")
    # Declared dead at the heartbeat timeout, then the prompt computed on
    # the decode node's one thread.
    check(took < HEARTBEAT_TIMEOUT_S + 6.0, f"it was answered {took:.1f} s after the kill")
    wait_for("prefill-0 started again and everything drained",
             lambda: nodes().get("prefill-0", {}).get("pid") not in (None, victim) and drained(),
             30)
    check_serves(baton, model_dir, "after the prefill node's restart")
    print(f"kill -9 prefill mid-prefill: answered by the decode node {took:.2f} s after the "
          f"kill; restarted, decode drained, served")


def test_queue_overflow(baton, model_dir):
    """Twice router.max_queued_requests at once: the overflow is refused
    at once with 429 and Retry-After, everything admitted finishes with one
    engine's output, and nothing stays queued."""
    prompt, max_tokens = "queue " * 6, 24
    want = expected_text(baton, model_dir, prompt, max_tokens)
    answers = [None] * (2 * MAX_QUEUED)

    def run(i):
        data = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                           "ignore_eos": True}).encode()
        request = urllib.request.Request(f"http://{ROUTER}:8000/v1/completions", data=data,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                answers[i] = (r.status, json.load(r), None)
        except urllib.error.HTTPError as e:
            answers[i] = (e.code, json.loads(e.read().decode()), e.headers.get("Retry-After"))

    clients = [threading.Thread(target=run, args=(i,)) for i in range(len(answers))]
    for c in clients:
        c.start()
    for c in clients:
        c.join(timeout=60)
    refused = [a for a in answers if a and a[0] == 429]
    served = [a for a in answers if a and a[0] == 200]
    check(len(refused) + len(served) == len(answers), f"answers other than 200/429: {answers}")
    check(refused, "no request was refused with twice the queue's worth at once")
    check(len(served) >= MAX_QUEUED // 2, f"only {len(served)} served")
    for status, body, retry_after in refused:
        check(retry_after == "1" and "error" in body, f"a refusal: {status} {body} {retry_after}")
    for _, body, _ in served:
        check(body["choices"][0]["text"] == want, "an admitted request's output differs")
    wait_for("drained after the overflow", drained, 30)
    print(f"queue overflow: {len(refused)} refused with 429, {len(served)} served")


def test_router_killed(baton, model_dir, cluster):
    """kill -9 of the router with a stream in flight: the stream's
    connection ends at once, its host's `baton up` starts the router again,
    the nodes on the other hosts register with it by themselves, and the
    decode node stops generating the dead router's request (the new router
    aborts what it does not know), so its pool drains."""
    router = child_pid(cluster.procs["router"].pid, "router")
    check(router, "no router process under its host's baton up")
    result, started, progress = {}, threading.Event(), {}

    def run():
        try:
            result["outcome"] = stream("router killed " * 6, 900, started, progress)
        except (OSError, ValueError) as e:  # the connection dies with the router
            result["outcome"] = e

    client = threading.Thread(target=run)
    client.start()
    check(started.wait(20), "the stream did not start")
    time.sleep(0.5)
    events = progress["events"]
    killed = time.time()
    os.kill(router, signal.SIGKILL)
    client.join(timeout=10)
    check(not client.is_alive(), "the stream outlived its router")
    check(time.time() - killed < 3.0, f"the stream ended {time.time() - killed:.1f} s after the kill")
    wait_for("the router started again with both nodes",
             lambda: child_pid(cluster.procs["router"].pid, "router") not in (None, router)
             and drained(), 30)
    # Generating the rest of the 900 tokens for nobody would have taken this
    # long at the stream's own pace (events in its first 0.5 s).
    drained_after = time.time() - killed
    rest = (900 - events) * 0.5 / max(events, 1)
    if rest > 4.0:
        check(drained_after < 0.7 * rest,
              f"the decode node drained {drained_after:.1f} s after the kill; generating the "
              f"rest would have taken {rest:.1f} s: the dead router's request was not aborted")
    check_serves(baton, model_dir, "after the router restart")
    print(f"kill -9 router: started again, both nodes registered with it; the decode node "
          f"drained {drained_after:.1f} s after the kill (the rest of the stream: {rest:.1f} s)")


def log_of(yaml, role):
    with open(yaml + f".{role}.log") as log:
        return log.read()


def test_lost_notice(baton, model_dir, yaml):
    """The prefill node's first completion notice never reaches the decode
    node (BATON_FAULT_DROP_NOTICES=1 on its host): that transfer fails at its
    deadline and the decode node computes the prompt itself, answering as
    one engine does within the deadline and a margin; a request started
    beside it finishes with one engine's output, and the decode node's
    reservation for the lost one comes back to its pool."""
    outcome = {}

    def run(key, prompt):
        began = time.time()
        answer = http("POST", "/v1/completions", {"prompt": prompt, "max_tokens": 12,
                                                  "temperature": 0, "ignore_eos": True}, timeout=60)
        outcome[key] = (answer, time.time() - began)

    lost = threading.Thread(target=run, args=("lost", "a lost notice " * 4))
    lost.start()
    wait_for("the prefill node dropping its first notice",
             lambda: "completion notice dropped" in log_of(yaml, "prefill"), 10)
    beside = threading.Thread(target=run, args=("beside", "beside the lost one " * 3))
    beside.start()
    for client in (lost, beside):
        client.join(timeout=30)
        check(not client.is_alive(), f"a request did not end: {outcome}")
    (status, recomputed), took = outcome["lost"]
    want_lost = expected_text(baton, model_dir, "a lost notice " * 4, 12)
    check(status == 200 and recomputed["choices"][0]["served_by"]["prefill"] is None
          and recomputed["choices"][0]["text"] == want_lost,
          f"the request whose notice was lost: {status} {recomputed} (want {want_lost!r})")
    bound = TRANSFER_DEADLINE_S + 2.5
    check(took < bound, f"the request whose notice was lost was answered after {took:.1f} s "
                        f"(bound {bound} s)")
    (served, answer), _ = outcome["beside"]
    want = expected_text(baton, model_dir, "beside the lost one " * 3, 12)
    check(served == 200 and answer["choices"][0]["text"] == want,
          f"the request beside the lost one: {served} {answer} (want {want!r})")
    wait_for("drained after the lost notice", drained, 10)
    check_serves(baton, model_dir, "after the lost notice")
    print(f"lost completion notice: the decode node computed the prompt, answered "
          f"{took:.2f} s after it was sent; the request beside it and the next one served")


def corrupt_pages(directory):
    """Flips one byte in every 4 KiB page of every SSD tier file in
    `directory`; returns the pages damaged."""
    pages = 0
    for name in os.listdir(directory):
        if not (name.startswith("baton-kv-") and name.endswith(".bin")):
            continue
        path = os.path.join(directory, name)
        with open(path, "r+b") as f:
            for offset in range(1000, os.path.getsize(path), 4096):
                f.seek(offset)
                byte = f.read(1)
                f.seek(offset)
                f.write(bytes([byte[0] ^ 0x5A]))
                pages += 1
            f.flush()
            os.fsync(f.fileno())
    return pages


def test_corrupted_ssd_pages(baton, model_dir, yaml, ssd_dir):
    """A prompt pushed out of both nodes' pools onto their SSD tiers, whose
    pages are then corrupted: asked again, its damaged blocks are refused
    (logged, naming the file and slot) and computed again, and the answer
    equals one engine's; nothing fails."""
    prompt = "corrupted on the disk " * 7
    fillers = [f"filler {i} pushes the prompt out " * 5 for i in range(3)]
    for text in [prompt] + fillers:
        status, answer = http("POST", "/v1/completions", {"prompt": text, "max_tokens": 4,
                                                          "temperature": 0})
        check(status == 200, f"a request before the damage: {status} {answer}")
    wait_for("drained before the damage", drained, 10)
    time.sleep(0.5)  # the tiers' last writes
    pages = corrupt_pages(ssd_dir)
    check(pages > 0, f"no SSD tier file in {ssd_dir}: {os.listdir(ssd_dir)}")
    check_serves(baton, model_dir, prompt)
    refused = [role for role in ("prefill", "decode") if "checksum mismatch" in log_of(yaml, role)]
    check(refused, "neither node refused a damaged SSD page (no 'checksum mismatch' logged)")
    wait_for("drained after the damaged pages", drained, 10)
    print(f"corrupted SSD pages: {pages} pages damaged; refused on the {' and '.join(refused)} "
          f"node, computed again, output equals one engine's")


def child_pid(parent, word):
    """The pid of a process below `parent` (ip netns exec, then baton up)
    with `word` among its arguments, or None."""
    todo = [parent]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/task/{pid}/children") as f:
                children = [int(c) for c in f.read().split()]
        except OSError:
            continue
        for child in children:
            try:
                with open(f"/proc/{child}/cmdline", "rb") as f:
                    if word.encode() in f.read().split(b"\0"):
                        return child
            except OSError:
                pass
            todo.append(child)
    return None


@contextlib.contextmanager
def logs_shown_on_failure(yaml):
    """Prints the last lines of each host's `baton up` when a check fails."""
    try:
        yield
    except AssertionError:
        for role in HOSTS:
            print(f"--- {role} host's baton up, last lines:\n" +
                  "".join(log_of(yaml, role).splitlines(keepends=True)[-15:]))
        raise


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baton", required=True)
    args = parser.parse_args()
    baton = os.path.abspath(args.baton)
    why_not = set_up_network()
    if why_not:
        print("skipped: " + why_not)
        return SKIP
    cluster = None
    try:
        with tempfile.TemporaryDirectory() as directory:
            # A model slow enough that a long stream is still running when
            # the fault strikes (the tiny one generates 900 tokens in less
            # time than the fault takes to set up).
            model_dir = os.path.join(directory, "smollm2")
            sh(baton, "make-model", "--preset", "smollm2-135m", "--dtype", "bf16", "--out", model_dir)
            yaml = write_cluster(directory, model_dir)
            cluster = Cluster(baton, yaml)
            with logs_shown_on_failure(yaml):
                check_serves(baton, model_dir, "three hosts")
                test_slow_lossy_link(baton, model_dir)
                test_partition(baton, model_dir)
                test_kill_decode(baton, model_dir)
                test_stopped_decode(baton, model_dir)
                test_client_hangs_up(baton, model_dir)
                test_zmq_client_goes_away(baton, model_dir)
                test_prefill_killed_mid_prefill(baton, model_dir)
                test_queue_overflow(baton, model_dir)
                test_router_killed(baton, model_dir, cluster)
            cluster.stop()
            # Small pools over SSD tiers, and a prefill node that loses its
            # first completion notice.
            ssd_dir = os.path.join(directory, "kv-ssd")
            os.mkdir(ssd_dir)
            yaml = write_cluster(directory, model_dir, name="cluster-ssd.yaml",
                                 kv_cache_bytes="8MiB", max_model_len=320,
                                 engine_extra=f", ssd_cache_dir: {ssd_dir}, ssd_cache_bytes: 64MiB")
            cluster = Cluster(baton, yaml, env={"prefill": {"BATON_FAULT_DROP_NOTICES": "1"}})
            with logs_shown_on_failure(yaml):
                test_lost_notice(baton, model_dir, yaml)
                test_corrupted_ssd_pages(baton, model_dir, yaml, ssd_dir)
            cluster.stop()
            cluster = None
    finally:
        if cluster:
            cluster.stop()
        tear_down_network()
    print("netns fault test: OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
