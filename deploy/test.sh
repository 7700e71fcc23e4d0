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

# The parsers of untrusted files (checkpoints, the SSD tier's slots,
# tokenizer.json, chat templates) and of network input (OpenAI request validation, the HTTP
# server, control messages, the transfer wire format) again under
# AddressSanitizer and UBSan, the BF16 paged
# attention (its SIMD paths read ragged tails of scattered blocks), the
# 512-bit GEMV (tails of rows) and the scheduler's asynchronous SSD
# restores (the kernel writes pool blocks while the scheduler goes on).
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DBATON_SANITIZE=ON \
  -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF
cmake --build build-asan -j "$jobs" --target loader_test common_test kernels_cpu_test engine_test \
  router_test router_http_test kv_transfer_wire_test jinja_test baton serving_test fault_test \
  limits_test zmq_frontend_test api_key_test control_keys_test bench_test
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$jobs" \
  -R '^(CompletionRequest|ChatRequest|HttpServerTest|WireTest|HfTokenizerTest|JinjaTest|Safetensors|SsdKvStore|ModelConfig|Checkpoint|MakeModel|FileMapping|SmapsField|LoadLock|ControlMessages|ControlSocket|Dtypes/PagedAttentionTest\.MatchesReference.*/bf16|Isas/LinearTest\.MatchesReference.*/avx512|SchedulerTest\..*(Ssd|Restore|Burst)|RemoteKvTest\.CachedPrefix)'

# Every integration test (real clusters: router, nodes, UCX, ZeroMQ, HTTP,
# `baton bench`) with every process under ASan and UBSan, but the one whose
# premise is the engine's speed (a prefill step outlasting the heartbeat
# timeout yet not the transfer deadline), which the sanitizers' slowdown breaks.
ASAN_OPTIONS=detect_leaks=1 ctest --test-dir build-asan --output-on-failure -j "$jobs" \
  --timeout 600 -L integration -E 'LimitsTest\.LongEngineStepsDoNotLookLikeDeadNodes'

# The threaded parts under ThreadSanitizer: the transfer engine (its UCX
# progress thread against the API's callers, every transport and fault),
# the HTTP server (strands, responders called from other threads), the
# scheduler with asynchronous SSD restores and remote KV, the node registry.
# UCX is not instrumented: tests/sanitizers/tsan.supp says what that hides,
# and its memory hooks are off (they fight TSan's own interceptors).
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DBATON_TSAN=ON \
  -DBATON_WITH_CUDA=OFF -DBATON_BUILD_BENCH=OFF
cmake --build build-tsan -j "$jobs" --target kv_transfer_test kv_transfer_test_peer router_http_test \
  engine_test
UCX_MEM_EVENTS=no UCX_MEM_MALLOC_HOOKS=no UCX_MEM_MMAP_HOOK_MODE=none \
  TSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/tsan.supp halt_on_error=1" \
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" --timeout 600 \
  -R '^(.*Transfer.*Test|Staged.*Test|BlockRuns|HttpServerTest|SchedulerTest|RemoteKvTest|NodeRegistry)'

# The parsers of untrusted input under libFuzzer (ASan and UBSan), briefly,
# from their committed seed corpora, with a fixed seed so that a run's
# verdict depends on the code alone: deploy/fuzz.sh runs them longer and
# wider (a crash it finds joins tests/fuzz/corpus/ with its fix).
bash deploy/fuzz.sh --runs 20000 --seed 1
