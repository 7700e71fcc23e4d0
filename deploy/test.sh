#!/usr/bin/env bash
# Sets up, builds and runs every Baton test: the command the README gives and
# CI runs. Safe to run on a fresh Debian 12 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/setup.sh
jobs=$(nproc)

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

# The parsers of untrusted files again under AddressSanitizer and UBSan.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DBATON_SANITIZE=ON \
  -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF
cmake --build build-asan -j "$jobs" --target loader_test
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$jobs" -R '^(Safetensors|ModelConfig|Checkpoint|MakeModel)'
