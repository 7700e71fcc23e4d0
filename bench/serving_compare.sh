#!/usr/bin/env bash
# Serves one workload from Baton's one-host cluster configs and from
# llama-server, in alternating rounds on this machine, and prints a table of
# medians with the ratio to llama-server's output tokens/s.
#
#   bench/serving_compare.sh [options]
#   bench/serving_compare.sh --rounds 1 --configs configs/local-colocated.yaml
#
# Options (defaults in brackets):
#   --work DIR                   downloads, the llama.cpp build, GGUF, logs [build-llama]
#   --baton PATH                 the baton binary [build/tools/baton]
#   --configs "A B"              cluster YAMLs; each serves HTTP on port 8000
#                                ["configs/local.yaml configs/local-colocated.yaml"]
#   --slots N                    llama-server -np [8]
#   --threads N                  llama-server -t [2]
#   --rounds N                   runs of each server [2]
#   --prompts N                  requests per run [48]
#   --input N                    prompt tokens [256]
#   --output N                   output tokens, forced on both sides [64]
#   --concurrency N              requests at once [8]
#   --llama-cpp-python VERSION   the sdist whose vendored llama.cpp builds llama-server [0.3.36]
# Relative paths are taken from the repository root.
#
# Every config must serve the same model (the first one's); llama-server
# serves a GGUF of the same weights (bench/llama_cpp/write_gguf.py
# --spm-vocab). A run starts the server, sends warm-up runs of 8 requests
# until one succeeds (the cluster's nodes are registered then), runs
# `baton bench` with --ignore-eos, so every request does the same work on
# both sides, and stops the server. Rounds alternate which server goes first.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
}

work=build-llama
baton=build/tools/baton
configs="configs/local.yaml configs/local-colocated.yaml"
slots=8
threads=2
rounds=2
prompts=48
input=256
output=64
concurrency=8
lcp_version=0.3.36
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case $1 in
    --work) work=$2 ;;
    --baton) baton=$2 ;;
    --configs) configs=$2 ;;
    --slots) slots=$2 ;;
    --threads) threads=$2 ;;
    --rounds) rounds=$2 ;;
    --prompts) prompts=$2 ;;
    --input) input=$2 ;;
    --output) output=$2 ;;
    --concurrency) concurrency=$2 ;;
    --llama-cpp-python) lcp_version=$2 ;;
    *) usage ;;
  esac
  shift 2
done
for n in "$slots" "$threads" "$rounds" "$prompts" "$input" "$output" "$concurrency"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "serving_compare.sh: '$n' is not a positive integer" >&2; exit 2; }
done
case $work in /*) ;; *) work=$root/$work ;; esac
case $baton in /*) ;; *) baton=$root/$baton ;; esac
[ -x "$baton" ] || { echo "serving_compare.sh: $baton is missing; build Baton first" >&2; exit 1; }
read -r -a config_list <<<"$configs"
[ ${#config_list[@]} -gt 0 ] || { echo "serving_compare.sh: no configs" >&2; exit 2; }
for i in "${!config_list[@]}"; do
  case ${config_list[$i]} in /*) ;; *) config_list[$i]=$root/${config_list[$i]} ;; esac
  [ -f "${config_list[$i]}" ] || { echo "serving_compare.sh: ${config_list[$i]} is missing" >&2; exit 1; }
done
mkdir -p "$work/logs"
work=$(cd "$work" && pwd)

log() { printf '== %s\n' "$*" >&2; }

if curl -s -o /dev/null localhost:8000; then
  echo "serving_compare.sh: something already listens on port 8000" >&2
  exit 1
fi

# --- llama-server and the model -------------------------------------------------

# shellcheck source=llama_cpp/build.sh
source "$root/bench/llama_cpp/build.sh"
llama_server=$(build_llama_cpp "$work" "$lcp_version" llama-server) || exit 1
src=$work/llama_cpp_python-$lcp_version/vendor/llama.cpp

# numpy and PyYAML for write_gguf.py and for reading the config here.
python=$(llama_cpp_python "$work") || exit 1

# The first config's model: its checkpoint directory, and how to make it.
read -r model_dir preset dtype seed < <("$python" - "${config_list[0]}" <<'EOF'
import os, sys, yaml
path = sys.argv[1]
model = (yaml.safe_load(open(path)) or {}).get("model") or {}
preset = model.get("preset", "")
where = model.get("path") or os.path.join("models", preset)
print(os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(path)), where)),
      preset or "-", model.get("dtype", "bf16"), model.get("seed", 0))
EOF
)
if [ ! -f "$model_dir/config.json" ]; then
  [ "$preset" != "-" ] || { echo "serving_compare.sh: $model_dir has no checkpoint" >&2; exit 1; }
  "$baton" make-model --preset "$preset" --dtype "$dtype" --seed "$seed" --out "$model_dir" >&2
fi
gguf=$work/models/serving-$(basename "$model_dir").gguf
mkdir -p "$work/models"
if [ ! -f "$gguf" ] || [ "$gguf" -ot "$model_dir/config.json" ]; then
  PYTHONPATH=$src/gguf-py "$python" "$root/bench/llama_cpp/write_gguf.py" --spm-vocab \
    "$model_dir" "$gguf" >&2
fi

# --- rounds ---------------------------------------------------------------------

results=$work/logs/serving-$(date +%Y%m%d-%H%M%S).tsv
printf 'server\tround\tout_tok_s\tmedian_ttft_ms\tmedian_tpot_ms\tp99_tpot_ms\n' >"$results"
bench_args=(--random-input-len "$input" --random-output-len "$output"
  --max-concurrency "$concurrency" --vocab-size 49000 --ignore-eos)

# One run: starts "$@" as the server (in its own process group), benchmarks
# it, stops the group and appends a row named $1 to $results.
run_server() {
  local name=$1 round=$2 out
  shift 2
  out=$work/logs/serving-$(tr ' /' '__' <<<"$name")-$round
  setsid "$@" >"$out.server.log" 2>&1 &
  local pid=$!
  local warmed=0
  for _ in $(seq 1 120); do
    if "$baton" bench --num-prompts 8 --seed 2 "${bench_args[@]}" >"$out.warmup.log" 2>&1; then
      warmed=1
      break
    fi
    sleep 1
  done
  if [ $warmed = 1 ]; then
    "$baton" bench --num-prompts "$prompts" --seed 1 --metric-percentiles 50,99 \
      "${bench_args[@]}" >"$out.log" 2>&1 || warmed=0
  fi
  kill -TERM -- -"$pid" 2>/dev/null || true
  for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- -"$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  if [ $warmed = 0 ]; then
    log "$name: the benchmark did not run; logs: $out.*"
    exit 1
  fi
  local value row=("$name" "$round")
  for key in 'Output token throughput (tok/s):' 'Median TTFT (ms):' 'Median TPOT (ms):' \
    'P99 TPOT (ms):'; do
    value=$(grep -F "$key" "$out.log" | grep -v '^ ' | head -1 | awk '{print $NF}')
    [ -n "$value" ] || { log "$name: no '$key' in $out.log"; exit 1; }
    row+=("$value")
  done
  (IFS=$'\t'; echo "${row[*]}") >>"$results"
  log "$name, round $round: ${row[2]} tok/s"
}

run_llama() {
  run_server "llama-server -np $slots" "$1" "$llama_server" -m "$gguf" -t "$threads" -np "$slots" \
    -c $((slots * (input + output + 192))) --host 127.0.0.1 --port 8000
}
run_configs() {
  for config in "${config_list[@]}"; do
    run_server "$(basename "$config")" "$1" "$baton" up "$config"
  done
}
for ((r = 1; r <= rounds; r++)); do
  log "round $r/$rounds"
  if ((r % 2 == 1)); then
    run_llama "$r"
    run_configs "$r"
  else
    run_configs "$r"
    run_llama "$r"
  fi
done

# --- report ---------------------------------------------------------------------

cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
baton_rev=$(git -C "$root" rev-parse --short HEAD)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  baton_rev="$baton_rev (modified)"
fi
echo "Serving $(basename "$model_dir"): $prompts requests of $input tokens in, $output out (forced), $concurrency at a time"
echo "Machine: $cpu, $(nproc) CPUs; Baton $baton_rev; llama-server -t $threads -np $slots, llama-cpp-python $lcp_version"
echo "Medians of $rounds alternating rounds (min-max); rows: $results"
echo
"$python" - "$results" "llama-server -np $slots" <<'EOF'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
servers = list(dict.fromkeys(r["server"] for r in rows))
def values(server, key):
    return [float(r[key]) for r in rows if r["server"] == server]
def cell(server, key):
    v = values(server, key)
    m = statistics.median(v)
    return f"{m:.1f}" if len(v) == 1 else f"{m:.1f} ({min(v):.1f}-{max(v):.1f})"
base = statistics.median(values(sys.argv[2], "out_tok_s"))
print("| server | out tok/s | x llama-server | median TTFT (ms) | median / P99 TPOT (ms) |")
print("|---|---|---|---|---|")
for s in servers:
    ratio = statistics.median(values(s, "out_tok_s")) / base
    print(f"| {s} | {cell(s, 'out_tok_s')} | {ratio:.2f} | {cell(s, 'median_ttft_ms')} | "
          f"{cell(s, 'median_tpot_ms')} / {cell(s, 'p99_tpot_ms')} |")
EOF
