#!/usr/bin/env bash
# The one script to run on a machine with a CUDA device: runs the CUDA tests
# that deploy/gpu_bundle.sh packed into .gpu-bundle/ (they skip where there is
# no device, so here they must run), through the bundle's own glibc loader, so
# the machine needs the GPU driver and nothing else. Logs go to $OUT when set.
# Usage: bash deploy/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
bundle=$PWD/.gpu-bundle
[ -d "$bundle/bin" ] || { echo "gpu_check: no $bundle; run deploy/gpu_bundle.sh first" >&2; exit 2; }
out=${OUT:-/tmp}
echo "bundle of commit $(cat "$bundle/COMMIT")"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true

# The driver's libcuda lives outside the bundle: where the machine's loader
# finds it, or the usual driver folders.
driver_dirs=$(ldconfig -p 2>/dev/null | awk '/libcuda\.so\.1 / {print $NF}' | xargs -r -n1 dirname | sort -u | paste -sd:)
libpath="$bundle/lib:${driver_dirs:+$driver_dirs:}/usr/local/nvidia/lib64:/usr/local/nvidia/lib:/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
loader=$(ls "$bundle"/lib/ld-linux-x86-64.so.2)
run() { "$loader" --library-path "$libpath" "$@"; }

# The transfer test spawns its peer process by path: a wrapper that starts it
# through the same loader.
cat >"$bundle/peer.sh" <<PEER
#!/bin/sh
exec "$loader" --library-path "$libpath" "$bundle/bin/kv_transfer_test_peer" "\$@"
PEER
chmod +x "$bundle/peer.sh"
export BATON_TRANSFER_PEER="$bundle/peer.sh"
export UCX_MODULE_DIR="$bundle/ucx"

status=0
for t in kernels_cuda_test kv_transfer_cuda_test; do
  echo "== $t"
  run "$bundle/bin/$t" --gtest_brief=0 2>&1 | tee "$out/$t.log" || status=1
done
exit $status
