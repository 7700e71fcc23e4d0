#!/usr/bin/env bash
# The one script to run on a machine with a CUDA device: runs the CUDA tests,
# `baton generate --device cuda` and the benchmarks that deploy/gpu_bundle.sh packed into
# .gpu-bundle/ (the tests skip where there is no device, so here they must
# run), through the bundle's own glibc loader, so the machine needs the GPU
# driver and a CUDA 13 cuBLASLt and nothing else; where its python3 has
# torch and transformers, it also makes the golden checkpoints of the CUDA
# backend's shapes (tests/golden/make_golden.py --gpu-shapes) that the engine
# test compares against. Logs, the benchmarks' tables and those checkpoints
# go to $OUT when set (six files).
# Usage: bash deploy/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=$PWD/.gpu-bundle
scratch=$(mktemp -d "${TMPDIR:-/tmp}/baton-gpu-check.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
if [ ! -d "$bundle/bin" ] && [ -f "$bundle.tar.xz" ]; then
  # The compressed bundle is what fits the trip; unpack it beside the tree.
  tar -xJf "$bundle.tar.xz" -C "$scratch"
  bundle=$scratch/.gpu-bundle
fi
[ -d "$bundle/bin" ] || { echo "gpu_check: no $bundle; run deploy/gpu_bundle.sh first" >&2; exit 2; }
out=${OUT:-/tmp}
echo "bundle of commit $(cat "$bundle/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true

# The driver's libcuda lives outside the bundle: where the machine's loader
# finds the 64-bit one, or the usual driver folders. Bundled libraries come
# first, so glibc and the rest are the bundle's.
driver_dirs=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF}' |
  xargs -r -n1 dirname | sort -u | paste -sd:)
# cuBLASLt is the machine's own (the bundle leaves it out): the CUDA
# toolkit's, or the nvidia-cublas wheel's; only its files join the path.
cublas=$scratch/cublas
mkdir -p "$cublas"
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  "$(python3 -c 'import nvidia.cublas; print(list(nvidia.cublas.__path__)[0] + "/lib")' 2>/dev/null)"; do
  if [ -n "$dir" ] && ls "$dir"/libcublasLt.so.13* >/dev/null 2>&1; then
    cp -L "$dir"/libcublasLt.so.13 "$dir"/libcublas.so.13 "$cublas/" 2>/dev/null
    break
  fi
done
[ -e "$cublas/libcublasLt.so.13" ] || echo "gpu_check: no libcublasLt.so.13 found on this machine" >&2
libpath="$bundle/lib:$cublas:${driver_dirs:+$driver_dirs:}/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
loader="$bundle/lib/ld-linux-x86-64.so.2"
run() { "$loader" --library-path "$libpath" "$@"; }

# The transfer test spawns its peer process by path: a wrapper (outside the
# bundle, which may be read-only) that starts it through the same loader.
peer=$scratch/peer
printf '#!/bin/bash\nexec %q --library-path %q %q "$@"\n' \
  "$loader" "$libpath" "$bundle/bin/kv_transfer_test_peer" >"$peer"
chmod +x "$peer"
export BATON_TRANSFER_PEER="$peer"
export UCX_MODULE_DIR="$bundle/ucx"

status=0
# transformers' logits at head_dim 64 and 128, made here (the machine's own
# python3), for the engine test; brought back in $OUT to be kept.
echo "== golden checkpoints of the CUDA backend's shapes"
if python3 tests/golden/make_golden.py --gpu-shapes --out "$scratch/golden/data-gpu" \
  >"$scratch/golden.log" 2>&1; then
  export BATON_GOLDEN_GPU_DIR="$scratch/golden/data-gpu"
  tar -czf "$out/golden-data-gpu.tar.gz" -C "$scratch/golden" data-gpu
else
  echo "gpu_check: make_golden.py --gpu-shapes failed:" >&2
  status=1
fi
tail -5 "$scratch/golden.log"

# Here the device must be found: a test that skips is a failure (a driver the
# bundle cannot load would otherwise pass as "no device").
: >"$out/tests.log"
for t in kernels_cuda_test engine_cuda_test kv_transfer_cuda_test; do
  echo "== $t" | tee -a "$out/tests.log"
  run "$bundle/bin/$t" --gtest_brief=0 >"$scratch/$t.log" 2>&1 || status=1
  tee -a "$out/tests.log" <"$scratch/$t.log" | grep -E "^\[  (FAILED|PASSED|SKIPPED) |Failure|^\[==" || true
  if grep -q "SKIPPED" "$scratch/$t.log"; then
    echo "gpu_check: $t skipped tests: no device reached" >&2
    status=1
  fi
done
# The whole engine from the command line, on the device and on the CPU.
model=$scratch/model
echo "== baton generate --device cuda (smollm2-135m shape, random BF16 weights)"
run "$bundle/bin/baton" make-model --preset smollm2-135m --dtype bf16 --out "$model" >/dev/null || status=1
: >"$out/generate.log"
for device in cuda cpu; do
  run "$bundle/bin/baton" generate --model "$model" --device "$device" --prompt-ids 5,6,7,8,9,10 \
    --max-tokens 64 --ignore-eos --json 2>&1 | tee -a "$out/generate.log" || status=1
done
echo "== bench_cuda_forward"
run "$bundle/bin/bench_cuda_forward" 2>"$out/bench.log" | tee "$out/bench_cuda_forward.md" ||
  status=1
echo "== bench_cuda_attention"
run "$bundle/bin/bench_cuda_attention" 2>>"$out/bench.log" |
  tee "$out/bench_cuda_attention.md" || status=1
cat "$out/bench.log" >&2
exit $status
