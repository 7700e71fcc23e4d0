#!/usr/bin/env bash
# The one script to run on a machine with a CUDA device: runs the CUDA tests,
# `baton generate --device cuda` and the benchmarks that deploy/gpu_bundle.sh packed into
# .gpu-bundle/ (the tests skip where there is no device, so here they must
# run), through the bundle's own glibc loader, so the machine needs the GPU
# driver and a CUDA 13 cuBLASLt and nothing else; the engine test compares
# against the committed golden checkpoints of the CUDA backend's shapes
# (tests/golden/data-gpu). Logs and the benchmarks' tables go to $OUT when
# set (seven files), written as each stage runs, so a run cut short still
# brings back what it reached. It also serves
# configs/gpu-1p1d.yaml's shape with a small model (greedy and seeded
# handoffs against one engine, a corrupted transfer computed on the decode
# node) and load-tests it. Each
# stage has a time limit, cut to what is left of one overall deadline
# (GPU_CHECK_SECONDS, 540 s: a device command gets 600), so one that hangs
# fails alone and the stages after it still get their turn where time is
# left.
# Usage: bash deploy/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
# From the start: unpacking the bundle counts against the device's time too.
deadline=$((SECONDS + ${GPU_CHECK_SECONDS:-540}))
bundle=$PWD/.gpu-bundle
scratch=$(mktemp -d "${TMPDIR:-/tmp}/baton-gpu-check.XXXXXX")
roles=()  # the cluster's processes, stopped on any exit
# Stops the cluster's processes: SIGTERM, up to 15 s to drain, then SIGKILL
# (a node that hangs on its way out must not hold up the stages after it).
stop_pids() {
  (($#)) || return 0
  kill "$@" 2>/dev/null
  local pid alive
  for _ in $(seq 150); do
    alive=0
    for pid in "$@"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  kill -9 "$@" 2>/dev/null
  wait "$@" 2>/dev/null
}
stop_roles() {
  ((${#roles[@]})) && stop_pids "${roles[@]}"
  roles=()
}
trap 'stop_roles; rm -rf "$scratch"' EXIT
if [ ! -d "$bundle/bin" ] && [ -f "$bundle.tar.xz" ]; then
  # The compressed bundle is what fits the trip; unpack it beside the tree.
  tar -xJf "$bundle.tar.xz" -C "$scratch"
  bundle=$scratch/.gpu-bundle
fi
[ -d "$bundle/bin" ] || { echo "gpu_check: no $bundle; run deploy/gpu_bundle.sh first" >&2; exit 2; }
out=${OUT:-/tmp}
echo "bundle of commit $(cat "$bundle/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
# The bundle's CUDA 13 runtime needs a driver of the R580 branch or later;
# an older one shows up only as "no device" in every test.
driver=$(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -n 1)
if [[ $driver =~ ^[0-9]+ ]] && ((${driver%%.*} < 580)); then
  echo "gpu_check: driver $driver is older than CUDA 13 needs (580 or later)" >&2
  exit 2
fi

# The driver's libcuda lives outside the bundle: where the machine's loader
# finds the 64-bit one, or the usual driver folders. Bundled libraries come
# first, so glibc and the rest are the bundle's.
driver_dirs=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF}' |
  xargs -r -n1 dirname | sort -u | paste -sd:)
# cuBLASLt is the machine's own (the bundle leaves it out): the CUDA
# toolkit's, or the nvidia-cublas wheel's; only its files join the path.
cublas=$scratch/cublas
mkdir -p "$cublas"
# CUDA 13's wheels put every library under nvidia/cu13/lib, 12's under
# nvidia/cublas/lib; the loader's cache may know a toolkit elsewhere.
wheel_dirs=$(python3 -c '
import nvidia, os
for root in nvidia.__path__:
    for sub in ("cu13/lib", "cublas/lib"):
        print(os.path.join(root, sub))' 2>/dev/null)
cached_dirs=$(ldconfig -p 2>/dev/null | awk '/libcublasLt\.so\.13 .*x86-64/ {print $NF}' | xargs -r -n1 dirname)
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  /usr/local/cuda-13*/targets/x86_64-linux/lib $wheel_dirs $cached_dirs; do
  if [ -n "$dir" ] && ls "$dir"/libcublasLt.so.13* >/dev/null 2>&1; then
    cp -L "$dir"/libcublasLt.so.13 "$dir"/libcublas.so.13 "$cublas/" 2>/dev/null
    break
  fi
done
if [ ! -e "$cublas/libcublasLt.so.13" ]; then
  echo "gpu_check: no libcublasLt.so.13 on this machine (the CUDA 13 toolkit's, or pip's" \
    "nvidia-cublas); every CUDA binary needs it" >&2
  exit 2
fi
libpath="$bundle/lib:$cublas:${driver_dirs:+$driver_dirs:}/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
loader="$bundle/lib/ld-linux-x86-64.so.2"
run() { "$loader" --library-path "$libpath" "$@"; }
# $1 seconds, or what is left before the deadline if less (at least 1:
# timeout takes 0 as no limit).
budget() {
  local left=$((deadline - SECONDS))
  ((left < 1)) && left=1
  echo $(($1 < left ? $1 : left))
}
# run under a time limit of $1 seconds (the loader is the process timeout
# stops).
run_for() {
  local seconds
  seconds=$(budget "$1")
  shift
  timeout -k 5 "$seconds" "$loader" --library-path "$libpath" "$@"
}

# The transfer test spawns its peer process by path: a wrapper (outside the
# bundle, which may be read-only) that starts it through the same loader.
peer=$scratch/peer
printf '#!/bin/bash\nexec %q --library-path %q %q "$@"\n' \
  "$loader" "$libpath" "$bundle/bin/kv_transfer_test_peer" >"$peer"
chmod +x "$peer"
export BATON_TRANSFER_PEER="$peer"
export UCX_MODULE_DIR="$bundle/ucx"

status=0
# transformers' logits at head_dim 64 and 128 (tests/golden/data-gpu, made
# on a CPU and committed), for the engine test: the tree's copy, wherever it
# lies here.
export BATON_GOLDEN_GPU_DIR="$PWD/tests/golden/data-gpu"

# Here the device must be found: a test that skips is a failure (a driver the
# bundle cannot load would otherwise pass as "no device").
: >"$out/tests.log"
for t in kernels_cuda_test engine_cuda_test kv_transfer_cuda_test; do
  echo "== $t (at ${SECONDS} s)" | tee -a "$out/tests.log"
  # Into $OUT as it runs: a test that hangs leaves its log up to there.
  run_for 150 "$bundle/bin/$t" --gtest_brief=0 2>&1 | tee "$out/$t.log" >"$scratch/$t.log" ||
    { echo "gpu_check: $t failed or ran past 150 s" | tee -a "$out/tests.log"; status=1; }
  tee -a "$out/tests.log" <"$scratch/$t.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|^\[==" || true
  rm -f "$out/$t.log"
  if grep -q "SKIPPED" "$scratch/$t.log"; then
    echo "gpu_check: $t skipped tests: no device reached" >&2
    status=1
  fi
done
# The whole engine from the command line, on the device and on the CPU.
model=$scratch/model
echo "== baton generate --device cuda (smollm2-135m shape, random BF16 weights; at ${SECONDS} s)"
run_for 60 "$bundle/bin/baton" make-model --preset smollm2-135m --dtype bf16 --out "$model" >/dev/null ||
  status=1
: >"$out/generate.log"
for device in cuda cpu; do
  run_for 60 "$bundle/bin/baton" generate --model "$model" --device "$device" --prompt-ids 5,6,7,8,9,10 \
    --max-tokens 64 --ignore-eos --json 2>&1 | tee -a "$out/generate.log" || status=1
done
# A GPU prefill node and a GPU decode node on this one device: the shape of
# configs/gpu-1p1d.yaml with the model above. Each role runs as its own
# process (`baton up` would start its children as the loader), started
# through the loader itself, not a function, so that $! is that process and
# the kill below (or the exit trap) stops it. Greedy
# completions prefilled on one node and decoded on the other must equal one
# engine's on the device; then `baton bench` at concurrency 1, 8 and 32.
echo "== configs/gpu-1p1d.yaml (smollm2-135m): a GPU prefill node hands off to a GPU decode" \
  "node (at ${SECONDS} s)"
yaml=$scratch/gpu-1p1d.yaml
sed -e "s|^  preset: .*|  preset: smollm2-135m|" -e "s|^  path: .*|  path: $model|" \
  -e "s|^  served_name: .*|  served_name: smollm2-135m|" -e "s|16GiB|2GiB|" \
  configs/gpu-1p1d.yaml >"$yaml"
"$loader" --library-path "$libpath" "$bundle/bin/baton" router --config "$yaml" \
  >"$scratch/router.log" 2>&1 &
roles+=($!)
for role in prefill decode; do
  "$loader" --library-path "$libpath" "$bundle/bin/baton" "$role" --config "$yaml" \
    --name "$role-0" >"$scratch/$role.log" 2>&1 &
  roles+=($!)
done
# One engine's answer on the device: $1 the prompt's ids, then sampling flags.
generate_ids() {
  run "$bundle/bin/baton" generate --model "$model" --device cuda --prompt-ids "$1" "${@:2}" \
    --max-tokens 32 --ignore-eos --json 2>/dev/null
}
export -f run generate_ids
export loader libpath bundle model
export NODE_PIDS="${roles[1]} ${roles[2]}"
timeout "$(budget 180)" python3 - >"$out/cluster.log" 2>&1 <<'PY' || status=1
import json, os, random, subprocess, sys, time, urllib.request
base = "http://127.0.0.1:8000"
def alive(pid):
    try:
        os.kill(int(pid), 0)
        return True
    except OSError:
        return False
def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return json.load(r)
deadline = time.time() + 120
nodes = []
while time.time() < deadline:
    try:
        nodes = [n for n in get("/v1/nodes")["nodes"] if n.get("up")]
    except Exception:
        nodes = []
    if len(nodes) == 2:
        break
    # A node that stopped at start (its log says why) never comes up.
    if not all(alive(pid) for pid in os.environ["NODE_PIDS"].split()):
        break
    time.sleep(0.5)
print(json.dumps(nodes, indent=1))
if len(nodes) != 2:
    sys.exit("the GPU cluster did not come up (its nodes' logs follow)")
bad = [n["name"] for n in nodes if n["device"] != "cuda:0" or not n["kv_staging"]]
failed = bool(bad)
if bad:
    print("not on cuda:0 behind a staged pool:", bad)
rng = random.Random()
# Greedy and seeded sampling: the prefill node samples the first token, the
# decode node the rest from the same seeded generator.
for i in range(4):
    ids = [rng.randrange(3, 49000) for _ in range(rng.randrange(40, 400))]
    seed = rng.randrange(1 << 31)
    sampling = {"temperature": 0.8, "seed": seed} if i % 2 else {"temperature": 0}
    flags = ["--temperature", "0.8", "--seed", str(seed)] if i % 2 else ["--temperature", "0"]
    body = json.dumps({"model": "smollm2-135m", "prompt": ids, "max_tokens": 32,
                       "ignore_eos": True, **sampling}).encode()
    req = urllib.request.Request(base + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        answer = json.load(r)
    one = json.loads(subprocess.run(["bash", "-c", 'generate_ids "$@"', "_",
                                     ",".join(map(str, ids)), *flags],
                                    capture_output=True, text=True, check=True).stdout)
    same = answer["choices"][0]["text"] == one["text"]
    failed |= not same
    print(f"prompt {i} ({len(ids)} tokens, {'seeded' if i % 2 else 'greedy'}), prefilled by",
          answer["choices"][0].get("served_by"), "equals one engine:", same)
sys.exit(1 if failed else 0)
PY
cat "$out/cluster.log"
: >"$out/cluster_bench.md"
for c in 1 8 32; do
  echo "== baton bench: random 1024 in / 128 out, concurrency $c (at ${SECONDS} s)" |
    tee -a "$out/cluster_bench.md"
  run_for 60 "$bundle/bin/baton" bench --port 8000 --num-prompts $((c < 8 ? 16 : 4 * c)) \
    --random-input-len 1024 --random-output-len 128 --max-concurrency "$c" --seed 1 \
    --vocab-size 49000 --ignore-eos --metric-percentiles 50,99 2>&1 |
    tee -a "$out/cluster_bench.md" || status=1
done
# Every transfer gave its staging slots back (a heartbeat after the last).
sleep 1
timeout "$(budget 30)" python3 - >>"$out/cluster.log" 2>&1 <<'PY' || status=1
import json, sys, urllib.request
with urllib.request.urlopen("http://127.0.0.1:8000/v1/nodes", timeout=10) as r:
    nodes = json.load(r)["nodes"]
held = {n["name"]: n["staging_slots"] - n["staging_slots_free"] for n in nodes}
print("staging slots still held after the load:", held)
sys.exit(1 if any(held.values()) or not all(n["staging_slots"] for n in nodes) else 0)
PY
# A corrupted transfer on the device: decode-0 again, flipping a bit of
# layer 0 of every KV it receives (BATON_FAULT_CORRUPT_LAYER). Each prompt
# fails its checksum and is computed on the decode node instead, once it
# gave back the device blocks it had reserved, as one engine answers it.
echo "== a corrupted KV transfer is computed on the decode node (at ${SECONDS} s)" |
  tee -a "$out/cluster.log"
stop_pids "${roles[2]}"
BATON_FAULT_CORRUPT_LAYER=decode-0:0 "$loader" --library-path "$libpath" "$bundle/bin/baton" \
  decode --config "$yaml" --name decode-0 >"$scratch/decode-corrupting.log" 2>&1 &
roles[2]=$!
export DECODE_PID=$!
timeout "$(budget 120)" python3 - >>"$out/cluster.log" 2>&1 <<'PY' || status=1
import json, os, random, subprocess, sys, time, urllib.request
base = "http://127.0.0.1:8000"
def get(path):
    with urllib.request.urlopen(base + path, timeout=10) as r:
        return r.read().decode()
def fallbacks():
    for line in get("/metrics").splitlines():
        if line.startswith("baton:prefill_fallbacks_total "):
            return float(line.split()[1])
    sys.exit("no baton:prefill_fallbacks_total in /metrics")
deadline = time.time() + 90
while True:
    try:
        nodes = {n["name"]: n for n in json.loads(get("/v1/nodes"))["nodes"]}
    except Exception:
        nodes = {}
    decode = nodes.get("decode-0", {})
    if decode.get("up") and str(decode.get("pid")) == os.environ["DECODE_PID"] and \
            nodes.get("prefill-0", {}).get("up"):
        break
    try:
        os.kill(int(os.environ["DECODE_PID"]), 0)
    except OSError:
        sys.exit("decode-0 stopped at start (its log follows)")
    if time.time() > deadline:
        sys.exit("decode-0 did not come back: " + json.dumps(nodes))
    time.sleep(0.5)
before = fallbacks()
failed = False
rng = random.Random()
for i in range(2):
    ids = [rng.randrange(3, 49000) for _ in range(rng.randrange(40, 400))]
    body = json.dumps({"model": "smollm2-135m", "prompt": ids, "max_tokens": 32,
                       "temperature": 0, "ignore_eos": True}).encode()
    req = urllib.request.Request(base + "/v1/completions", body,
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        answer = json.load(r)
    one = json.loads(subprocess.run(["bash", "-c", 'generate_ids "$@"', "_",
                                     ",".join(map(str, ids)), "--temperature", "0"],
                                    capture_output=True, text=True, check=True).stdout)
    here = answer["choices"][0]["served_by"]["prefill"] is None
    same = answer["choices"][0]["text"] == one["text"]
    failed |= not (here and same)
    print(f"corrupted prompt {i} ({len(ids)} tokens): computed on the decode node: {here}, "
          f"equals one engine: {same}")
print("prefill fallbacks counted:", fallbacks() - before)
failed |= fallbacks() - before != 2
# The device blocks and staging slots reserved for the corrupted KV came back.
time.sleep(1)  # a heartbeat after the last request
decode = {n["name"]: n for n in json.loads(get("/v1/nodes"))["nodes"]}["decode-0"]
print("decode-0 after the fallbacks: free blocks", decode["free_blocks"], "of",
      decode["total_blocks"], "; staging slots free", decode["staging_slots_free"], "of",
      decode["staging_slots"])
failed |= decode["free_blocks"] != decode["total_blocks"] or \
    decode["staging_slots_free"] != decode["staging_slots"]
sys.exit(1 if failed else 0)
PY
# The fallbacks above came from checksum failures, not from something else.
grep -q "checksum mismatch" "$scratch/decode-corrupting.log" ||
  { echo "gpu_check: decode-0 logged no checksum mismatch" | tee -a "$out/cluster.log"; status=1; }
stop_roles
tail -n 20 "$scratch"/router.log "$scratch"/prefill.log "$scratch"/decode.log \
  "$scratch"/decode-corrupting.log >>"$out/cluster.log"
sed -n '/== a corrupted KV transfer/,$p' "$out/cluster.log"
echo "== bench_cuda_forward (at ${SECONDS} s)"
run_for 60 "$bundle/bin/bench_cuda_forward" 2>"$out/bench.log" | tee "$out/bench_cuda_forward.md" ||
  status=1
echo "== bench_cuda_attention (at ${SECONDS} s)"
run_for 60 "$bundle/bin/bench_cuda_attention" 2>>"$out/bench.log" |
  tee "$out/bench_cuda_attention.md" || status=1
cat "$out/bench.log" >&2
exit $status
