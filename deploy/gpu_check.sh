#!/usr/bin/env bash
# The one script to run on a machine with a CUDA device: runs the CUDA tests,
# `baton generate --device cuda` and the benchmarks that deploy/gpu_bundle.sh packed into
# .gpu-bundle/ (the tests skip where there is no device, so here they must
# run), through the bundle's own glibc loader, so the machine needs the GPU
# driver and a CUDA 13 cuBLASLt and nothing else; the engine test compares
# against the committed golden checkpoints of the CUDA backend's shapes
# (tests/golden/data-gpu). Logs and the benchmarks' tables go to $OUT when
# set (eight files), written as each stage runs, so a run cut short still
# brings back what it reached. It also serves
# configs/gpu-1p1d.yaml's shape with a small model (greedy and seeded
# handoffs against one engine, a corrupted transfer computed on the decode
# node, a prefill node killed with a prompt in hand; deploy/cluster_checks.py)
# and load-tests it beside configs/gpu-colocated.yaml's, and runs the KV
# transfer benchmark between device pools. Each
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
# through the loader in the background (env execs it), so that $! is that
# process and stop_pids (or the exit trap) stops it. deploy/cluster_checks.py does the
# checks against one engine on the device: greedy and seeded handoffs,
# staging slots back after `baton bench` at concurrency 1, 8 and 32, a
# corrupted transfer computed on the decode node, a prefill node killed
# while it holds a prompt. Then configs/gpu-colocated.yaml's shape under
# the same load.
: >"$out/cluster.log"
: >"$out/cluster_bench.md"
generate=$(printf '%q ' "$loader" --library-path "$libpath" "$bundle/bin/baton" generate \
  --model "$model" --device cuda)
# cluster_checks.py SECONDS CHECK [FLAGS...], its output into cluster.log.
checks() {
  local seconds=$1
  shift
  timeout "$(budget "$seconds")" python3 deploy/cluster_checks.py "$@" --generate "$generate" \
    >>"$out/cluster.log" 2>&1
}
# ROLE YAML NODE [ENV=VALUE...]: starts a node, its output appended to
# $scratch/NODE.log; its pid in $started.
start_node() {
  local role=$1 config=$2 name=$3
  shift 3
  env "$@" "$loader" --library-path "$libpath" "$bundle/bin/baton" "$role" --config "$config" \
    --name "$name" >>"$scratch/$name.log" 2>&1 &
  started=$!
}
# baton bench at concurrency 1, 8 and 32, headed by $1.
bench_cluster() {
  local c
  for c in 1 8 32; do
    echo "== $1: baton bench, random 1024 in / 128 out, concurrency $c (at ${SECONDS} s)" |
      tee -a "$out/cluster_bench.md"
    run_for 60 "$bundle/bin/baton" bench --port 8000 --num-prompts $((c < 8 ? 16 : 4 * c)) \
      --random-input-len 1024 --random-output-len 128 --max-concurrency "$c" --seed 1 \
      --vocab-size 49000 --ignore-eos --metric-percentiles 50,99 2>&1 |
      tee -a "$out/cluster_bench.md" || status=1
  done
}
stage() { echo "== $1 (at ${SECONDS} s)" | tee -a "$out/cluster.log"; }
# A shipped GPU config with the model above; its pools are the parts of the
# device its memory fractions leave (the nodes log the numbers).
shape_of() {
  sed -e "s|^  preset: .*|  preset: smollm2-135m|" -e "s|^  path: .*|  path: $model|" \
    -e "s|^  served_name: .*|  served_name: smollm2-135m|" "$1"
}

stage "configs/gpu-1p1d.yaml (smollm2-135m): a GPU prefill node hands off to a GPU decode node"
yaml=$scratch/gpu-1p1d.yaml
shape_of configs/gpu-1p1d.yaml >"$yaml"
"$loader" --library-path "$libpath" "$bundle/bin/baton" router --config "$yaml" \
  >"$scratch/router.log" 2>&1 &
roles+=($!)
start_node prefill "$yaml" prefill-0 && prefill_pid=$started && roles+=("$started")
start_node decode "$yaml" decode-0 && decode_pid=$started && roles+=("$started")
if checks 150 wait --nodes "prefill-0=$prefill_pid,decode-0=$decode_pid"; then
  checks 180 handoffs --staged --device cuda:0 || status=1
  bench_cluster "gpu-1p1d"
  # Every transfer gave its staging slots back.
  checks 30 slots-back --staged || status=1

  # decode-0 again, flipping a bit of layer 0 of every KV it receives
  # (BATON_FAULT_CORRUPT_LAYER): each prompt fails its checksum and is
  # computed on the decode node, once it gave back the device blocks it had
  # reserved, as one engine answers it.
  stage "a corrupted KV transfer is computed on the decode node"
  stop_pids "$decode_pid"
  earlier=$(wc -l <"$scratch/decode-0.log")
  start_node decode "$yaml" decode-0 BATON_FAULT_CORRUPT_LAYER=decode-0:0
  decode_pid=$started && roles+=("$started")
  if checks 90 wait --nodes "decode-0=$decode_pid,prefill-0"; then
    checks 120 fallbacks --prompts 2 || status=1
  else
    status=1
  fi
  # The fallbacks came from checksum failures (in this run's log), not from
  # something else.
  tail -n +$((earlier + 1)) "$scratch/decode-0.log" | grep -q "checksum mismatch" ||
    { echo "gpu_check: decode-0 logged no checksum mismatch" | tee -a "$out/cluster.log"; status=1; }

  # prefill-0 again, its first step held 5 s (BATON_FAULT_STALL_FIRST_STEP),
  # and decode-0 as it was: the decode node reserves device blocks for the
  # prompt, the prefill node is killed (SIGKILL) while it holds it; the
  # router declares it dead after the 2 s heartbeat timeout, the decode node
  # gives its blocks back and computes the prompt.
  stage "a prefill node killed with a prompt in hand: the decode node answers"
  stop_pids "$decode_pid" "$prefill_pid"
  start_node decode "$yaml" decode-0 && decode_pid=$started && roles+=("$started")
  start_node prefill "$yaml" prefill-0 BATON_FAULT_STALL_FIRST_STEP=prefill-0:5000
  prefill_pid=$started && roles+=("$started")
  if checks 90 wait --nodes "prefill-0=$prefill_pid,decode-0=$decode_pid"; then
    checks 90 killed-prefill --victim "$prefill_pid" --bound 20 || status=1
  else
    status=1
  fi
else
  status=1
fi
stop_roles
tail -n 20 "$scratch"/router.log "$scratch"/prefill-0.log "$scratch"/decode-0.log >>"$out/cluster.log"

# One node on the device that prefills and decodes, under the same load.
stage "configs/gpu-colocated.yaml (smollm2-135m): one GPU node prefills and decodes"
colocated=$scratch/gpu-colocated.yaml
shape_of configs/gpu-colocated.yaml >"$colocated"
"$loader" --library-path "$libpath" "$bundle/bin/baton" router --config "$colocated" \
  >"$scratch/router-colocated.log" 2>&1 &
roles+=($!)
start_node decode "$colocated" decode-0 && roles+=("$started")
if checks 90 wait --nodes "decode-0=$started"; then
  bench_cluster "gpu-colocated"
else
  status=1
fi
stop_roles
tail -n 20 "$scratch"/router-colocated.log "$scratch"/decode-0.log >>"$out/cluster.log"
cat "$out/cluster.log"
echo "== bench_cuda_forward (at ${SECONDS} s)"
run_for 60 "$bundle/bin/bench_cuda_forward" 2>"$out/bench.log" | tee "$out/bench_cuda_forward.md" ||
  status=1
echo "== bench_cuda_attention (at ${SECONDS} s)"
run_for 60 "$bundle/bin/bench_cuda_attention" 2>>"$out/bench.log" |
  tee "$out/bench_cuda_attention.md" || status=1
# KV transfer between two processes on this host: device pools staged
# through pinned host slots (the path Debian's UCX leaves) beside host pools
# over the same transports, with the device copier's own rates (out / in)
# in each staged row: the bound of a staged transfer is the slowest of them
# and the wire.
echo "== bench_transfer: device pools against host pools (at ${SECONDS} s)"
self=$scratch/bench_transfer
printf '#!/bin/bash\nexec %q --library-path %q %q "$@"\n' \
  "$loader" "$libpath" "$bundle/bin/bench_transfer" >"$self"
chmod +x "$self"
export BATON_BENCH_TRANSFER_SELF=$self
: >"$out/transfer_bench.md"
for pool in cuda host; do
  for tls in tcp sm,self; do
    run_for 60 "$bundle/bin/bench_transfer" --pool "$pool" \
      --tls "$tls" --iters 3 --models llama3-8b --tokens 2048,8192 --block-sizes 16 \
      2>>"$out/bench.log" | tee -a "$out/transfer_bench.md" || status=1
  done
done
cat "$out/bench.log" >&2
exit $status
