#!/usr/bin/env bash
# The one script to run on a machine with a CUDA device: builds the CUDA
# backend for that device and runs its tests (which skip elsewhere), printing
# the device first. Usage: bash deploy/gpu_check.sh [build-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-gpu}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_BUILD_BENCH=OFF \
  -DBATON_CUDA_ARCHITECTURES="${BATON_CUDA_ARCHITECTURES:-90}"
cmake --build "$build" -j"$(nproc)" --target kernels_cuda_test
"$build/tests/kernels/kernels_cuda_test" --gtest_brief=0
