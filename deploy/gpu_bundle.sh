#!/usr/bin/env bash
# Builds the CUDA tests, benchmarks and the baton binary here and packs them,
# with every shared library they load (glibc and its loader included; the GPU
# driver and cuBLASLt excepted) and UCX's transport modules, into
# .gpu-bundle/ and .gpu-bundle.tar.xz: what runs on a GPU machine that has the
# driver and a CUDA 13 cuBLASLt (its toolkit's, or the nvidia-cublas wheel's)
# but none of Baton's Debian packages. cuBLASLt (over 500 MB) stays behind.
#
#   bash deploy/gpu_bundle.sh [build-dir]      # here; then, on the GPU machine:
#   bash deploy/gpu_check.sh                   # runs what the bundle holds
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
bundle=.gpu-bundle
tests=(tests/kernels/kernels_cuda_test tests/engine/engine_cuda_test tests/kv_transfer/kv_transfer_cuda_test)
helpers=(tests/kv_transfer/kv_transfer_test_peer bench/bench_cuda_attention bench/bench_cuda_forward
  bench/transfer/bench_transfer tools/baton)

if [ -f "$build/CMakeCache.txt" ]; then
  configured=$(cmake -S . -B "$build")
else
  configured=$(cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release)
fi
grep -q "Baton CUDA backend: ON" <<<"$configured" ||
  { echo "gpu_bundle: $build has no CUDA backend (is nvcc in /usr/local/cuda?)" >&2; exit 1; }
cmake --build "$build" -j2 --target kernels_cuda_test engine_cuda_test kv_transfer_cuda_test \
  kv_transfer_test_peer bench_cuda_attention bench_cuda_forward bench_transfer baton

rm -rf "$bundle"
mkdir -p "$bundle/bin" "$bundle/lib" "$bundle/ucx"
for b in "${tests[@]}" "${helpers[@]}"; do cp "$build/$b" "$bundle/bin/"; done
# Every library the binaries load, resolved here; the driver (libcuda) is the
# GPU machine's own and must come from there.
for b in "$bundle"/bin/*; do
  ldd "$b" | awk '/=> \// {print $3}; $1 ~ /ld-linux/ {print $1}'
done | sort -u | grep -v 'libcuda\.so\|libnvidia-\|libcublas' | while read -r lib; do cp -L "$lib" "$bundle/lib/"; done
# The whole glibc family, loaded or not: the driver's libcuda opens some of
# them, and they must not come from the GPU machine's glibc beside ours.
glibc_dir=$(dirname "$(ldd "$bundle/bin/$(basename "${tests[0]}")" | awk '$1 == "libc.so.6" {print $3}')")
for l in libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libresolv.so.2; do
  [ -e "$glibc_dir/$l" ] && cp -L "$glibc_dir/$l" "$bundle/lib/"
done
# UCX opens its transports as modules from a compiled-in folder.
ucx_modules=$(pkg-config --variable=libdir ucx)/ucx
[ -d "$ucx_modules" ] || { echo "gpu_bundle: no UCX module folder at $ucx_modules" >&2; exit 1; }
shopt -s nullglob
for m in "$ucx_modules"/*.so.0; do cp -L "$m" "$bundle/ucx/"; done
for m in "$bundle"/ucx/*.so.0; do
  ldd "$m" | awk '/=> \// {print $3}' | grep -v 'libcuda\.so\|libnvidia-' | while read -r lib; do
    [ -e "$bundle/lib/$(basename "$lib")" ] || cp -L "$lib" "$bundle/lib/"
  done
done
echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD || echo -dirty)" >"$bundle/COMMIT"
tar -cf - "$bundle" | xz -T2 -6 >"$bundle.tar.xz"
du -sh "$bundle" "$bundle.tar.xz"
echo "gpu_bundle: ready; on the GPU machine run: bash deploy/gpu_check.sh (carry $bundle.tar.xz)"
