"""The official `openai` Python client against a real Baton cluster.

Starts `baton up` on a tiny random model (router, one prefill and one decode
node on loopback) and drives it the way users do: completions and chat, plain
and streamed, with usage, seeds, n > 1, and the client's own error classes.
Exits non-zero on the first failed check.

    python openai_client_test.py --baton build/tools/baton
"""
import argparse
import fcntl
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

import openai


_port_claims = []  # lock files held until this process exits


def free_ports(n):
    """n distinct ports for a cluster, claimed as cluster_harness.cc's
    free_port() claims them: a port the OS reports free can be taken again
    before the router binds it (by another test's router, or as the local
    port of any outgoing connection), so they come from below the ephemeral
    range, which the OS never hands out by itself, each locked with a file
    that test processes running side by side all respect."""
    low = 10000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            high = min(int(f.read().split()[0]), 32768)
    except (OSError, ValueError, IndexError):
        high = 32768
    lock_dir = os.path.join(tempfile.gettempdir(), "baton-test-ports")
    os.makedirs(lock_dir, exist_ok=True)
    rng = random.SystemRandom()
    ports = []
    for _ in range(10000):
        if len(ports) == n or high - low < 1000:
            break
        port = rng.randrange(low, high)
        if port in ports:
            continue
        fd = os.open(os.path.join(lock_dir, str(port)), os.O_CREAT | os.O_RDWR | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:
            os.close(fd)
            continue
        _port_claims.append(fd)
        ports.append(port)
    if len(ports) < n:
        raise RuntimeError(f"no {n} free ports below the ephemeral range ({low}..{high})")
    return ports


def check(condition, message):
    if not condition:
        raise AssertionError(message)


def wait_until_up(port, nodes, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/nodes", timeout=2) as r:
                doc = json.load(r)
                if sum(n["up"] for n in doc["nodes"]) == nodes:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError("the cluster did not come up")


def write_cluster(path, model_dir, kv_cache="4MiB", max_model_len=1024):
    """A one-prefill, one-decode cluster YAML for `baton up` on free ports;
    returns the HTTP port."""
    http, zmq, control = free_ports(3)
    with open(path, "w") as f:
        f.write(f"""model: {{path: {model_dir}, served_name: tiny}}
router: {{http_port: {http}, zmq_port: {zmq}, control_port: {control}, min_remote_prefill_tokens: 4,
          heartbeat_interval_ms: 100, heartbeat_timeout_ms: 1000, drain_timeout_ms: 2000}}
engine: {{threads: 1, kv_cache_bytes: {kv_cache}, max_model_len: {max_model_len}}}
prefill: [{{name: prefill-0}}]
decode: [{{name: decode-0}}]
""")
    return http


def baton_generate(baton, model_dir, prompt, *flags):
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(prompt + "\n")
    try:
        out = subprocess.run([baton, "generate", "--model", model_dir, "--prompts", f.name, "--json", *flags],
                             check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(f.name)
    return json.loads(out.strip().splitlines()[0])


def check_metrics(port):
    """/metrics as Prometheus' own parser reads it: vLLM's families with their
    types, and counters that agree with the per-request histograms."""
    from prometheus_client.parser import text_string_to_metric_families
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        families = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    expected = {
        "vllm:num_requests_running": "gauge", "vllm:num_requests_waiting": "gauge",
        "vllm:kv_cache_usage_perc": "gauge", "vllm:gpu_cache_usage_perc": "gauge",
        "vllm:prompt_tokens": "counter", "vllm:generation_tokens": "counter",
        "vllm:request_success": "counter", "vllm:num_preemptions": "counter",
        "vllm:time_to_first_token_seconds": "histogram",
        "vllm:inter_token_latency_seconds": "histogram",
        "vllm:e2e_request_latency_seconds": "histogram",
        "vllm:request_prompt_tokens": "histogram", "vllm:request_generation_tokens": "histogram",
        "vllm:request_decode_time_seconds": "histogram",
        "vllm:time_per_output_token_seconds": "histogram",
        "vllm:request_queue_time_seconds": "histogram",
        "vllm:request_prefill_time_seconds": "histogram",
        "vllm:request_inference_time_seconds": "histogram",
    }
    for name, kind in expected.items():
        check(name in families, f"/metrics lacks {name}")
        check(families[name].type == kind, f"{name} is a {families[name].type}, not a {kind}")

    def value(family, sample_name, **labels):
        return sum(s.value for s in families[family].samples if s.name == sample_name
                   and all(s.labels.get(k) == v for k, v in labels.items()))

    finished = (value("vllm:request_success", "vllm:request_success_total", finished_reason="stop")
                + value("vllm:request_success", "vllm:request_success_total", finished_reason="length"))
    check(finished > 0, "no finished requests counted")
    count = value("vllm:request_generation_tokens", "vllm:request_generation_tokens_count")
    check(count == finished, f"{count} requests in the histogram, {finished} finished")
    generated = value("vllm:generation_tokens", "vllm:generation_tokens_total")
    in_histogram = value("vllm:request_generation_tokens", "vllm:request_generation_tokens_sum")
    check(generated == in_histogram, f"generation tokens {generated} != per-request sum {in_histogram}")
    # Every first token was timed where its prompt was computed: the queue
    # and prefill seconds there lie inside the router's time to first token.
    ttft_count = value("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_count")
    for family in ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"):
        count = value(family, family + "_count")
        check(count == ttft_count, f"{family}: {count} observations, {ttft_count} first tokens")
    node_side = (value("vllm:request_queue_time_seconds", "vllm:request_queue_time_seconds_sum")
                 + value("vllm:request_prefill_time_seconds", "vllm:request_prefill_time_seconds_sum"))
    ttft_sum = value("vllm:time_to_first_token_seconds", "vllm:time_to_first_token_seconds_sum")
    check(0 < node_side <= ttft_sum, f"queue + prefill {node_side} s against TTFT {ttft_sum} s")
    for family in ("vllm:time_to_first_token_seconds", "vllm:e2e_request_latency_seconds",
                   "vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds"):
        buckets = [s for s in families[family].samples if s.name == family + "_bucket"]
        counts = [s.value for s in buckets]
        check(counts == sorted(counts), f"{family} buckets are not cumulative")


def check_request_logged(client, prompt, log_path):
    """A request's X-Request-Id is in the debug logs of the router and of
    both nodes that served it (the prompt is long enough to be prefilled
    on the prefill node), so grep follows it across the processes."""
    request_id = f"trace-{os.getpid()}-{time.monotonic_ns()}"
    client.completions.create(model="tiny", prompt=prompt, max_tokens=3,
                              extra_headers={"X-Request-Id": request_id})
    wanted = ("router: request " + request_id, "prefill-0: request " + request_id,
              "decode-0: request " + request_id)
    deadline = time.monotonic() + 5
    while True:
        with open(log_path) as f:
            lines = [line for line in f if request_id in line]
        missing = [w for w in wanted if not any(w in line for line in lines)]
        if not missing or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    check(not missing, f"no log line has {missing}; the request's lines: {lines}")


def run(baton, work):
    model_dir = os.path.join(work, "tiny")
    subprocess.run([baton, "make-model", "--preset", "tiny", "--out", model_dir], check=True,
                   capture_output=True)
    config = os.path.join(work, "cluster.yaml")
    http = write_cluster(config, model_dir)
    # Debug logs, to follow one request across the processes by its id.
    log_path = os.path.join(work, "cluster.log")
    log = open(log_path, "w")
    up = subprocess.Popen([baton, "--log-level", "debug", "up", config], stdout=subprocess.DEVNULL,
                          stderr=log, start_new_session=True)
    try:
        wait_until_up(http, 2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{http}/v1", api_key="unused", max_retries=0)

        models = client.models.list()
        check([m.id for m in models.data] == ["tiny"], f"models: {models}")

        prompt = "The quick brown fox jumps"
        done = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0)
        expected = baton_generate(baton, model_dir, prompt, "--max-tokens", "12", "--temperature", "0")
        check(done.choices[0].text == expected["text"], f"{done.choices[0].text!r} != {expected['text']!r}")
        check(done.usage.prompt_tokens == len(expected["prompt_ids"]), f"usage {done.usage}")
        check(done.usage.completion_tokens == len(expected["output_ids"]), f"usage {done.usage}")
        # The client's own model of the details: a count no larger than the prompt.
        details = done.usage.prompt_tokens_details
        check(details is not None and 0 <= details.cached_tokens <= done.usage.prompt_tokens,
              f"usage {done.usage}")

        stream = client.completions.create(model="tiny", prompt=prompt, max_tokens=12, temperature=0, stream=True,
                                           stream_options={"include_usage": True})
        text, usage, finish = "", None, None
        for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].text
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage:
                usage = chunk.usage
        check(text == expected["text"], f"streamed {text!r}")
        check(finish == expected["finish_reason"], f"finish {finish}")
        check(usage is not None and usage.completion_tokens == done.usage.completion_tokens, f"usage {usage}")

        seeded = dict(model="tiny", prompt=prompt, max_tokens=10, temperature=1.0, seed=1234, n=2)
        a = client.completions.create(**seeded)
        b = client.completions.create(**seeded)
        check([c.text for c in a.choices] == [c.text for c in b.choices], "same seed, same choices")
        check(sorted(c.index for c in a.choices) == [0, 1], "n=2 gives two choices")

        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                              max_tokens=6, temperature=0)
        check(chat.choices[0].message.role == "assistant", f"chat {chat}")
        pieces = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hello"}],
                                                max_tokens=6, temperature=0, stream=True)
        streamed = "".join(c.choices[0].delta.content or "" for c in pieces if c.choices)
        check(streamed == chat.choices[0].message.content, f"chat stream {streamed!r}")

        with_logprobs = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                       max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
        content = with_logprobs.choices[0].logprobs.content
        check(len(content) == with_logprobs.usage.completion_tokens, f"one logprob per token: {content}")
        check(all(len(c.top_logprobs) >= 1 and c.logprob <= 0 for c in content), f"logprobs {content}")
        legacy = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0, logprobs=2)
        check(len(legacy.choices[0].logprobs.token_logprobs) == legacy.usage.completion_tokens,
              f"completion logprobs {legacy.choices[0].logprobs}")

        # echo with logprobs: the prompt's tokens first, the first unscored
        # (None), then the same completion's.
        echoed = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0,
                                           logprobs=2, echo=True)
        lp = echoed.choices[0].logprobs
        prompt_len = echoed.usage.prompt_tokens
        check(echoed.choices[0].text == prompt + legacy.choices[0].text, f"echo text {echoed.choices[0]}")
        check(len(lp.tokens) == prompt_len + 4 and lp.token_logprobs[0] is None
              and lp.top_logprobs[0] is None and all(v <= 0 for v in lp.token_logprobs[1:]),
              f"echo logprobs {lp}")
        # (Equal up to rounding: the prompt's logits came in one GEMM with the others'.)
        check(all(abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs[prompt_len:],
                                                    legacy.choices[0].logprobs.token_logprobs)),
              f"echo's completion logprobs {lp.token_logprobs[prompt_len:]}")

        # Streamed, the chunks' log-probabilities add up to the whole answer's:
        # the same tokens, and log-probabilities equal up to rounding, since a
        # repeated prompt is computed over its cached blocks (only its tail
        # runs, in other GEMM shapes, whose sums round differently).
        def same_up_to_rounding(a, b):
            return len(a) == len(b) and all(abs(x - y) < 1e-4 for x, y in zip(a, b))

        chunks = client.completions.create(model="tiny", prompt=prompt, max_tokens=4, temperature=0,
                                           logprobs=2, stream=True)
        streamed = [(t, lp) for c in chunks if c.choices and c.choices[0].logprobs
                    for t, lp in zip(c.choices[0].logprobs.tokens, c.choices[0].logprobs.token_logprobs)]
        check([t for t, _ in streamed] == legacy.choices[0].logprobs.tokens and
              same_up_to_rounding([lp for _, lp in streamed], legacy.choices[0].logprobs.token_logprobs),
              f"streamed completion logprobs {streamed} vs {legacy.choices[0].logprobs}")
        chunks = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                max_tokens=4, temperature=0, logprobs=True, top_logprobs=2,
                                                stream=True)
        streamed_content = [e for c in chunks if c.choices and c.choices[0].logprobs
                            for e in c.choices[0].logprobs.content]
        check([e.token for e in streamed_content] == [e.token for e in content] and
              same_up_to_rounding([e.logprob for e in streamed_content], [e.logprob for e in content]),
              f"streamed chat logprobs {[(e.token, e.logprob) for e in streamed_content]} vs "
              f"{[(e.token, e.logprob) for e in content]}")

        # X-Request-Id: echoed, and the response's id, as vLLM does.
        raw = client.completions.with_raw_response.create(model="tiny", prompt=prompt, max_tokens=2,
                                                          extra_headers={"X-Request-Id": "req-123"})
        check(raw.headers.get("x-request-id") == "req-123", f"X-Request-Id echo: {raw.headers}")
        check(raw.parse().id == "cmpl-req-123", f"id {raw.parse().id}")
        check_request_logged(client, prompt, log_path)
        with urllib.request.urlopen(f"http://127.0.0.1:{http}/version", timeout=5) as r:
            check(json.load(r).get("version", "") != "", "/version")

        try:
            client.completions.create(model="tiny", prompt=prompt, max_tokens=-1)
            check(False, "max_tokens=-1 was accepted")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and "max_tokens" in str(e), f"400 names the field: {e}")
        try:
            client.completions.create(model="gpt-9", prompt=prompt, max_tokens=4)
            check(False, "an unknown model was accepted")
        except openai.NotFoundError as e:
            check(e.status_code == 404, f"404: {e}")
        check_metrics(http)
        print("openai client: all checks passed")
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        up.wait(timeout=30)
        log.close()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--baton", required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        run(os.path.abspath(args.baton), work)


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        sys.exit(1)
