"""Faults across hosts: a cluster whose router, prefill node and decode node
each run in a network namespace of their own (three "hosts" joined by veth
links to a bridge, UCX over TCP between them), and faults on the links.

For each fault: the affected requests fail with an error within a stated
bound, the unaffected ones finish with the output one engine gives, the
cluster serves again once the fault is gone without anyone restarting
anything, and every pool's free blocks return to their total.

  * partition: the decode node cut off from the router (not from the
    prefill node) mid-stream;
  * delay and loss: 40 ms each way and 5% of the packets lost on the decode
    node's link (where the kernel has tc's netem);
  * kill -9 of the decode node mid-stream, which `baton up` starts again;
  * SIGSTOP of the decode node mid-stream, then SIGCONT;
  * a client that hangs up mid-stream, over HTTP and over ZeroMQ;
  * kill -9 of the prefill node while its KV streams to the decode node;
  * twice router.max_queued_requests at once;
  * kill -9 of the router with a stream in flight, whose nodes on the
    other hosts come back to it and drop the dead router's work.

Needs CAP_NET_ADMIN (ip netns, ip route); exits 77 (skipped) where a
namespace cannot be made, saying why.

    python3 netns_fault_test.py --baton build/tools/baton
"""
import argparse
import json
import os
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


def write_cluster(directory, model_dir):
    path = os.path.join(directory, "cluster.yaml")
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model_dir}, served_name: smollm2}}
router:
  host: {ROUTER}
  min_remote_prefill_tokens: 4
  heartbeat_interval_ms: 100
  heartbeat_timeout_ms: {int(HEARTBEAT_TIMEOUT_S * 1000)}
  drain_timeout_ms: 2000
  max_queued_requests: {MAX_QUEUED}
engine: {{threads: 1, kv_cache_bytes: 64MiB, max_model_len: 1024, max_num_seqs: 4}}
transfer:
  share_pool: false
  default_deadline_ms: 3000
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
    def __init__(self, baton, yaml):
        self.procs = {}
        for role in ("router", "prefill", "decode"):
            log = open(yaml + f".{role}.log", "w")
            self.procs[role] = subprocess.Popen(
                ["ip", "netns", "exec", HOSTS[role][0], baton, "--log-level", "warn", "up", yaml,
                 "--ready-timeout", "60"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
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


def test_delay_and_loss(baton, model_dir):
    """40 ms each way and 5% loss on the decode node's link: every request
    still finishes, with one engine's output."""
    if not netem("decode", "delay", "40ms", "loss", "5%"):
        print("delay and loss: skipped: this kernel has no netem qdisc (tc)")
        return
    try:
        for i in range(3):
            check_serves(baton, model_dir, f"a slow lossy link {i} " * 3)
    finally:
        heal("decode")
    wait_for("drained after delay and loss", drained, 30)
    print("delay and loss: 3 completions equal one engine's")


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
    streams its KV layer by layer to the decode node: the request fails
    within the bound, the decode node frees what it had reserved, and the
    prefill node's `baton up` starts it again."""
    victim = nodes()["prefill-0"]["pid"]
    outcome = {}

    def run():
        outcome["answer"] = http("POST", "/v1/completions", {
            "prompt": "a long prompt " * 70, "max_tokens": 4, "temperature": 0}, timeout=60)

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
    check(status >= 500 and isinstance(answer, dict) and "error" in answer,
          f"the request of a killed prefill node: {status} {answer}")
    check(took < HEARTBEAT_TIMEOUT_S + 3.0, f"it failed {took:.1f} s after the kill")
    wait_for("prefill-0 started again and everything drained",
             lambda: nodes().get("prefill-0", {}).get("pid") not in (None, victim) and drained(),
             30)
    check_serves(baton, model_dir, "after the prefill node's restart")
    print(f"kill -9 prefill mid-prefill: failed {took:.2f} s after the kill "
          f"({status}); restarted, decode drained, served")


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
            try:
                check_serves(baton, model_dir, "three hosts")
                test_delay_and_loss(baton, model_dir)
                test_partition(baton, model_dir)
                test_kill_decode(baton, model_dir)
                test_stopped_decode(baton, model_dir)
                test_client_hangs_up(baton, model_dir)
                test_zmq_client_goes_away(baton, model_dir)
                test_prefill_killed_mid_prefill(baton, model_dir)
                test_queue_overflow(baton, model_dir)
                test_router_killed(baton, model_dir, cluster)
            except AssertionError:
                for role in HOSTS:
                    with open(yaml + f".{role}.log") as log:
                        print(f"--- {role} host's baton up, last lines:\n" +
                              "".join(log.readlines()[-15:]))
                raise
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
