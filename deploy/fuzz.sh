#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/: clang, ASan, UBSan) in
# build-fuzz/ and runs each from its seed corpus, for --seconds each
# (default 300) or --runs executions each, from a random seed or --seed N.
# New inputs go to a scratch corpus, never into the committed seeds (CI's
# scratch starts empty; a local one grows across runs); a crash leaves its
# input in build-fuzz/crashes/ and fails the script. Prints each target's
# executions.
#
#   bash deploy/fuzz.sh                        # 5 minutes per target
#   bash deploy/fuzz.sh --runs 20000 --seed 1  # what deploy/test.sh runs in CI
#   bash deploy/fuzz.sh --runs 1000000
set -euo pipefail
cd "$(dirname "$0")/.."

limit=(-max_total_time=300)
seed=()
while (($#)); do
  case "$1" in
    --seconds) limit=(-max_total_time="$2"); shift 2 ;;
    --runs) limit=(-runs="$2"); shift 2 ;;
    --seed) seed=(-seed="$2"); shift 2 ;;
    *) echo "usage: deploy/fuzz.sh [--seconds N | --runs N] [--seed N]" >&2; exit 2 ;;
  esac
done

targets=(fuzz_control_message fuzz_openai_request fuzz_http_request fuzz_zmq_request fuzz_kv_wire
  fuzz_chat_template fuzz_tokenizer_json fuzz_safetensors fuzz_ssd_slot fuzz_cluster_yaml
  fuzz_model_config)
cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang \
  -DCMAKE_CXX_COMPILER=clang++ -DBATON_FUZZ=ON -DBATON_WITH_CUDA=OFF -DBATON_BUILD_TESTS=OFF \
  -DBATON_BUILD_BENCH=OFF >/dev/null
cmake --build build-fuzz -j "$(nproc)" --target "${targets[@]}"

mkdir -p build-fuzz/crashes
failed=0
for t in "${targets[@]}"; do
  scratch=build-fuzz/corpus/$t
  mkdir -p "$scratch"
  log=build-fuzz/$t.log
  if ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
    "build-fuzz/tests/fuzz/$t" "${limit[@]}" "${seed[@]}" -rss_limit_mb=2048 -timeout=10 \
    -artifact_prefix="build-fuzz/crashes/$t-" "$scratch" "tests/fuzz/corpus/$t" >"$log" 2>&1; then
    runs=$(grep -Eo 'Done [0-9]+ runs' "$log" | grep -Eo '[0-9]+' | tail -1)
    echo "fuzz: $t: ${runs:-0} executions, no crash"
  else
    echo "fuzz: $t FAILED; the input is in build-fuzz/crashes/, the log in $log:" >&2
    tail -40 "$log" >&2
    failed=1
  fi
done
exit $failed
