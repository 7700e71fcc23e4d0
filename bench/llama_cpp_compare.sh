#!/usr/bin/env bash
# Compares Baton's CPU prefill and decode speed with llama.cpp's llama-bench
# on the same random-weight models, same dtype, same thread count.
#
#   bench/llama_cpp_compare.sh [options]
#   bench/llama_cpp_compare.sh --rounds 1 --models "smollm2-135m:bf16"
#
# Options (defaults in brackets):
#   --work DIR                   downloads, builds, models, logs [build-llama]
#   --baton PATH                 the baton binary [build/tools/baton]
#   --threads N                  compute threads of both engines [2]
#   --prompt N                   prompt tokens [512]
#   --gen N                      generated tokens [128]
#   --rounds N                   timed runs of each engine per model [3]
#   --models "P:D ..."           preset:dtype list
#                                ["smollm2-135m:bf16 smollm2-135m:f32 smollm2-135m:f16 qwen2.5-0.5b:bf16"]
#   --llama-cpp-python VERSION   the llama-cpp-python sdist whose vendored
#                                llama.cpp is built [0.3.36]
#   --isa native|avx2            avx2: both engines run what an AVX2-only
#                                machine runs: llama.cpp built for AVX2, FMA
#                                and F16C without AVX-512, Baton with
#                                BATON_MAX_CPU_ISA=avx2 (its kernels and
#                                OpenBLAS's) [native]
#   --kv default|int8            the KV caches: default, each engine's own
#                                (below); int8, 8-bit on both: llama.cpp's
#                                q8_0 for K and V (a scale per 32 values),
#                                Baton's int8 (a scale per token and KV
#                                head). Compare at long prompts, where
#                                decode reads mostly KV [default]
# Relative paths are taken from the repository root.
#
# Steps, each skipped when its output is already there:
#  1. pip-download the llama-cpp-python sdist and build llama.cpp's llama-bench
#     from its vendor/llama.cpp (Release, -march=native; bench/llama_cpp/build.sh).
#  2. baton make-model --seed 1 for each preset:dtype, and the same weights as
#     GGUF (bench/llama_cpp/write_gguf.py, with the source tree's gguf-py).
#  3. Per model, one untimed Baton run, then rounds alternating which engine
#     goes first: llama-bench (prefill, then decode at depth PROMPT), and
#     baton generate with PROMPT random token ids, greedy, GEN tokens past
#     EOS, no prefix cache. Both warm up first, untimed (baton --warmup).
#  4. A markdown table of medians over rounds, with min-max ranges.
#
# Both prefill rates are PROMPT tokens in one batch from an empty cache; both
# decode rates are GEN tokens after PROMPT cached ones (llama-bench -d). The
# default KV caches differ: llama.cpp's F16, Baton's the checkpoint's dtype.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
}

work=build-llama
baton=build/tools/baton
threads=2
prompt=512
gen=128
rounds=3
models="smollm2-135m:bf16 smollm2-135m:f32 smollm2-135m:f16 qwen2.5-0.5b:bf16"
lcp_version=0.3.36
isa=native
kv=default
while [ $# -gt 0 ]; do
  [ $# -ge 2 ] || usage
  case $1 in
    --work) work=$2 ;;
    --baton) baton=$2 ;;
    --threads) threads=$2 ;;
    --prompt) prompt=$2 ;;
    --gen) gen=$2 ;;
    --rounds) rounds=$2 ;;
    --models) models=$2 ;;
    --llama-cpp-python) lcp_version=$2 ;;
    --isa) isa=$2 ;;
    --kv) kv=$2 ;;
    *) usage ;;
  esac
  shift 2
done
case $isa in
  native) ;;
  avx2) export BATON_MAX_CPU_ISA=avx2 ;;
  *) echo "llama_cpp_compare.sh: --isa '$isa': expected native or avx2" >&2; exit 2 ;;
esac
case $kv in
  default) llama_kv=() baton_kv=() ;;
  int8) llama_kv=(-ctk q8_0 -ctv q8_0) baton_kv=(--kv-dtype int8) ;;
  *) echo "llama_cpp_compare.sh: --kv '$kv': expected default or int8" >&2; exit 2 ;;
esac
for n in "$threads" "$prompt" "$gen" "$rounds"; do
  [[ $n =~ ^[1-9][0-9]*$ ]] || { echo "llama_cpp_compare.sh: '$n' is not a positive integer" >&2; exit 2; }
done
case $work in /*) ;; *) work=$root/$work ;; esac
case $baton in /*) ;; *) baton=$root/$baton ;; esac
[ -x "$baton" ] || { echo "llama_cpp_compare.sh: $baton is missing; build Baton first" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd)

log() { printf '== %s\n' "$*" >&2; }

# Everything written here is build output; inside the repository it must not
# show up as untracked files.
case $work/ in
  "$root"/*)
    if ! git -C "$root" check-ignore -q "${work#"$root"/}/"; then
      log "warning: $work is inside the repository but not ignored by .gitignore"
    fi
    ;;
esac

# --- 1. llama.cpp --------------------------------------------------------------

# shellcheck source=llama_cpp/build.sh
source "$root/bench/llama_cpp/build.sh"
llama_bench=$(build_llama_cpp "$work" "$lcp_version" llama-bench "$isa") || exit 1
src=$work/llama_cpp_python-$lcp_version/vendor/llama.cpp
export GIT_CEILING_DIRECTORIES=$work

# The commit the sdist pins: its git metadata, else its changelog entry.
llama_commit=$(git -C "$src" rev-parse --short=9 HEAD 2>/dev/null ||
  sed -n "/^## \[$lcp_version\]/,/^## /s/.*ggml-org\/llama.cpp@\([0-9a-f]*\).*/\1/p" \
    "$work/llama_cpp_python-$lcp_version/CHANGELOG.md" | head -1)
llama_date=$(git -C "$src" log -1 --format=%cs 2>/dev/null || true)
llama_version="${llama_commit:-unknown}${llama_date:+ ($llama_date)}, vendored in llama-cpp-python $lcp_version"
log "llama.cpp $llama_version"

# --- 2. models -----------------------------------------------------------------

# numpy and PyYAML for write_gguf.py (bench/llama_cpp/build.sh).
python=$(llama_cpp_python "$work") || exit 1

mkdir -p "$work/models" "$work/prompts" "$work/logs"
specs=()
for spec in $models; do
  preset=${spec%%:*} dtype=${spec#*:}
  [[ $spec == *:* && -n $preset && -n $dtype ]] || { echo "llama_cpp_compare.sh: '$spec' is not preset:dtype" >&2; exit 2; }
  specs+=("$spec")
  dir=$work/models/$preset-$dtype
  if [ ! -f "$dir/config.json" ] || [ ! -f "$dir/model.safetensors" ]; then
    "$baton" make-model --preset "$preset" --dtype "$dtype" --seed 1 --out "$dir" >&2
  fi
  if [ ! -f "$dir.gguf" ]; then
    PYTHONPATH=$src/gguf-py "$python" "$root/bench/llama_cpp/write_gguf.py" "$dir" "$dir.gguf" >&2
  fi
  # PROMPT random ids below the vocabulary size, the same for every run of a
  # model, as llama-bench's prompt is random ids too.
  "$python" - "$dir/config.json" "$prompt" >"$work/prompts/$preset-$dtype-$prompt.txt" <<'EOF'
import json, random, sys
vocab = json.load(open(sys.argv[1]))["vocab_size"]
rng = random.Random(1)
print("ids:" + ",".join(str(rng.randrange(vocab)) for _ in range(int(sys.argv[2]))))
EOF
done
[ ${#specs[@]} -gt 0 ] || { echo "llama_cpp_compare.sh: no models" >&2; exit 2; }

# --- 3. timing -----------------------------------------------------------------

results=$work/logs/results-$(date +%Y%m%d-%H%M%S).tsv
printf 'preset\tdtype\tengine\tround\tprefill\tdecode\n' >"$results"

# Appends one llama-bench run's prefill and decode tok/s to $results: a pp
# test from an empty context, then a tg test at depth PROMPT (-d: the context
# is filled first, untimed), as Baton decodes after its prompt. Each JSON
# (stdout) has one row; the warmup runs llama-bench does first are not in it.
run_llama() {
  local preset=$1 dtype=$2 round=$3 out=$work/logs/$1-$2-llama-$3
  local gguf=$work/models/$preset-$dtype.gguf
  { "$llama_bench" -m "$gguf" -p "$prompt" -n 0 -t "$threads" -r 1 "${llama_kv[@]}" -o json \
    >"$out.pp.json" &&
    "$llama_bench" -m "$gguf" -p 0 -n "$gen" -d "$prompt" -t "$threads" -r 1 "${llama_kv[@]}" \
      -o json >"$out.tg.json"; } 2>"$out.log" ||
    { tail -20 "$out.log" >&2; log "llama-bench failed; log: $out.log"; exit 1; }
  "$python" -c 'import json, sys; print(json.dumps(json.load(open(sys.argv[1])) + json.load(open(sys.argv[2]))))' \
    "$out.pp.json" "$out.tg.json" >"$out.json"
  "$python" - "$out.json" "$preset" "$dtype" "$round" >>"$results" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
pp = [r["avg_ts"] for r in rows if r["n_prompt"] > 0 and r["n_gen"] == 0]
tg = [r["avg_ts"] for r in rows if r["n_gen"] > 0 and r["n_prompt"] == 0]
if len(pp) != 1 or len(tg) != 1:
    sys.exit(f"{sys.argv[1]}: expected one pp and one tg row")
print("\t".join(sys.argv[2:4] + ["llama.cpp", sys.argv[4], f"{pp[0]:.2f}", f"{tg[0]:.2f}"]))
EOF
}

# One baton generate run; prints its stats line, the last one starting "stats:".
baton_stats() {
  local preset=$1 dtype=$2 out=$3
  "$baton" generate --model "$work/models/$preset-$dtype" \
    --prompts "$work/prompts/$preset-$dtype-$prompt.txt" --max-tokens "$gen" \
    --temperature 0 --ignore-eos --threads "$threads" --enable-prefix-caching false --warmup \
    "${baton_kv[@]}" >"$out" 2>&1 || { tail -20 "$out" >&2; log "baton generate failed; log: $out"; exit 1; }
  { grep '^stats:' "$out" || true; } | tail -1
}

# Appends one Baton run's prefill and decode tok/s to $results, from
# "stats: 1 prompts, 512 prompt tokens at 1042.4 tok/s, 128 output tokens
# (decode 110.6 tok/s, ...".
run_baton() {
  local preset=$1 dtype=$2 round=$3 stats pre dec
  stats=$(baton_stats "$preset" "$dtype" "$work/logs/$1-$2-baton-$3.log")
  pre=$(sed -n 's/.* prompt tokens at \([0-9.]*\) tok\/s.*/\1/p' <<<"$stats")
  dec=$(sed -n 's/.*(decode \([0-9.]*\) tok\/s.*/\1/p' <<<"$stats")
  if [ -z "$pre" ] || [ -z "$dec" ]; then
    log "no stats line in $work/logs/$1-$2-baton-$3.log"
    exit 1
  fi
  printf '%s\t%s\tbaton\t%s\t%s\t%s\n' "$preset" "$dtype" "$round" "$pre" "$dec" >>"$results"
}

for spec in "${specs[@]}"; do
  preset=${spec%%:*} dtype=${spec#*:}
  # llama-bench warms up before it times; Baton's untimed run does the same
  # for the page cache (its weights are read in at start).
  log "$preset $dtype: untimed Baton run"
  baton_stats "$preset" "$dtype" "$work/logs/$preset-$dtype-baton-warmup.log" >/dev/null
  for ((r = 1; r <= rounds; r++)); do
    log "$preset $dtype: round $r/$rounds"
    # Alternating the order spreads any drift (clock, thermals, neighbours)
    # over both engines.
    if ((r % 2 == 1)); then
      run_llama "$preset" "$dtype" "$r"
      run_baton "$preset" "$dtype" "$r"
    else
      run_baton "$preset" "$dtype" "$r"
      run_llama "$preset" "$dtype" "$r"
    fi
  done
done

# --- 4. report -----------------------------------------------------------------

cpu=$(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -1)
if grep -qw avx512_bf16 /proc/cpuinfo; then bf16=yes; else bf16=no; fi
baton_rev=$(git -C "$root" rev-parse --short HEAD)
if [ -n "$(git -C "$root" status --porcelain --untracked-files=no)" ]; then
  baton_rev="$baton_rev (with uncommitted changes)"
fi

echo
echo "CPU: ${cpu:-unknown} (avx512_bf16: $bf16), $(nproc) hardware threads"
echo "Threads: $threads, prompt $prompt tokens, $gen generated, $rounds round(s)"
echo "Instruction sets: $isa"
echo "KV caches: $kv"
echo "llama.cpp: $llama_version"
echo "Baton: $baton_rev"
echo
"$python" - "$results" <<'EOF'
import csv, statistics, sys
runs = {}
order = []
with open(sys.argv[1]) as f:
    for row in csv.DictReader(f, delimiter="\t"):
        key = (row["preset"], row["dtype"])
        if key not in runs:
            order.append(key)
            runs[key] = {"llama.cpp": ([], []), "baton": ([], [])}
        runs[key][row["engine"]][0].append(float(row["prefill"]))
        runs[key][row["engine"]][1].append(float(row["decode"]))

def cell(values):
    text = f"{statistics.median(values):.1f}"
    if len(values) > 1:
        text += f" ({min(values):.1f}–{max(values):.1f})"
    return text

def ratio(baton, llama):
    return f"{statistics.median(baton) / statistics.median(llama):.2f}×"

print("| model | dtype | llama.cpp prefill tok/s | Baton prefill tok/s | × | "
      "llama.cpp decode tok/s | Baton decode tok/s | × |")
print("|---|---|---:|---:|---:|---:|---:|---:|")
for key in order:
    (lp, ld), (bp, bd) = runs[key]["llama.cpp"], runs[key]["baton"]
    print(f"| {key[0]} | {key[1]} | {cell(lp)} | {cell(bp)} | {ratio(bp, lp)} | "
          f"{cell(ld)} | {cell(bd)} | {ratio(bd, ld)} |")
print()
print("Medians over rounds, (min–max) in brackets; × = Baton / llama.cpp.")
EOF
echo "Per-run numbers: $results"
