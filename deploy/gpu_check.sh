#!/usr/bin/env bash
# The one script to run on a machine with a CUDA device: runs the CUDA tests
# and the decode-attention benchmark that deploy/gpu_bundle.sh packed into
# .gpu-bundle/ (the tests skip where there is no device, so here they must
# run), through the bundle's own glibc loader, so the machine needs the GPU
# driver and nothing else. Logs and the benchmark's table go to $OUT when set.
# Usage: bash deploy/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=$PWD/.gpu-bundle
[ -d "$bundle/bin" ] || { echo "gpu_check: no $bundle; run deploy/gpu_bundle.sh first" >&2; exit 2; }
out=${OUT:-/tmp}
echo "bundle of commit $(cat "$bundle/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true

# The driver's libcuda lives outside the bundle: where the machine's loader
# finds the 64-bit one, or the usual driver folders. Bundled libraries come
# first, so glibc and the rest are the bundle's.
driver_dirs=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 .*x86-64/ {print $NF}' |
  xargs -r -n1 dirname | sort -u | paste -sd:)
libpath="$bundle/lib:${driver_dirs:+$driver_dirs:}/usr/local/nvidia/lib64:/usr/local/nvidia/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
loader="$bundle/lib/ld-linux-x86-64.so.2"
run() { "$loader" --library-path "$libpath" "$@"; }

# The transfer test spawns its peer process by path: a wrapper (outside the
# bundle, which may be read-only) that starts it through the same loader.
peer=$(mktemp "${TMPDIR:-/tmp}/baton-peer.XXXXXX")
trap 'rm -f "$peer"' EXIT
printf '#!/bin/bash\nexec %q --library-path %q %q "$@"\n' \
  "$loader" "$libpath" "$bundle/bin/kv_transfer_test_peer" >"$peer"
chmod +x "$peer"
export BATON_TRANSFER_PEER="$peer"
export UCX_MODULE_DIR="$bundle/ucx"

# Here the device must be found: a test that skips is a failure (a driver the
# bundle cannot load would otherwise pass as "no device").
status=0
for t in kernels_cuda_test kv_transfer_cuda_test; do
  echo "== $t"
  run "$bundle/bin/$t" --gtest_brief=0 2>&1 | tee "$out/$t.log" || status=1
  if grep -q "SKIPPED" "$out/$t.log"; then
    echo "gpu_check: $t skipped tests: no device reached" >&2
    status=1
  fi
done
echo "== bench_cuda_attention"
run "$bundle/bin/bench_cuda_attention" 2>"$out/bench_cuda_attention.log" |
  tee "$out/bench_cuda_attention.md" || status=1
cat "$out/bench_cuda_attention.log" >&2
exit $status
