#!/usr/bin/env bash
# bench/transfer/run_transfer_bench.sh — the KV transfer benchmark beside this
# machine's UCX ceiling, measured back to back over the same transport.
#
# For every (transport, UCX peer error handling on/off, model, prompt length)
# it runs ucx_perftest's ucp_put_bw and tag_bw at the transfer's per-operation
# size (one layer of the request: contiguous blocks merge into one op per
# layer), best of two, with -e when peer error handling is on, then bench_transfer for that
# one shape, and prints the ratio of bench_transfer's best rate to the better
# of the two ceilings. Both run right after each other because other work on a
# shared machine moves either by a factor of two.
#
#   bench/transfer/run_transfer_bench.sh BUILD_DIR [TRANSPORT...]
#   e.g. bench/transfer/run_transfer_bench.sh build tcp sm,self
# Environment: ITERS (default 5), TOKENS (default 512,2048,8192,16384),
#              MODELS (default smollm2-135m,llama3-8b), BLOCK (default 16),
#              VERIFY (default 1: xxhash on both sides, as in production),
#              SHARE_POOL (default 0; 1: UCX allocates both pools, as with
#              transfer.share_pool, so a same-host sender maps the receiver's),
#              POOL (default host; staged: host pools moved through the
#              engine's host slots by memcpy; cuda: device pools staged
#              through pinned slots, which needs the CUDA build and a GPU;
#              staged rows add the copier's own out / in rate).
set -euo pipefail

build_dir="${1:-build}"
shift || true
transports=("$@")
[[ ${#transports[@]} -eq 0 ]] && transports=("tcp" "sm,self")
bench="${build_dir}/bench_transfer"
[[ -x "${bench}" ]] || bench="${build_dir}/bench/transfer/bench_transfer"
[[ -x "${bench}" ]] || { echo "bench_transfer not found under ${build_dir}" >&2; exit 1; }
iters="${ITERS:-5}"
tokens="${TOKENS:-512,2048,8192,16384}"
models="${MODELS:-smollm2-135m,llama3-8b}"
block="${BLOCK:-16}"
verify="${VERIFY:-1}"
ucx_pool="${SHARE_POOL:-0}"
pool="${POOL:-host}"

# KV bytes one token adds to one layer: 2 (K,V) x kv_heads x head_dim x 2 (bf16).
declare -A bytes_per_token_layer=([smollm2-135m]=768 [llama3-8b]=4096)

# One ucx_perftest client/server pair on a free loopback port; prints MB/s.
perftest() {
  local tls="$1" test="$2" size="$3" errmode="$4" port server rate n
  n=$(( (64 << 20) / size )); (( n < 3 )) && n=3; (( n > 200 )) && n=200
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  UCX_TLS="${tls}" UCX_NET_DEVICES=lo ucx_perftest -p "${port}" ${errmode} >/dev/null 2>&1 &
  server=$!
  sleep 0.3
  rate=$(UCX_TLS="${tls}" UCX_NET_DEVICES=lo timeout 120 ucx_perftest 127.0.0.1 -p "${port}" \
           -t "${test}" -s "${size}" -n "${n}" -w 2 ${errmode} 2>/dev/null |
         awk '/^Final:/ {print $6}')
  wait "${server}" 2>/dev/null || true
  echo "${rate:-0}"
}

# Best of two runs; where UCX refuses peer error handling (shared memory in
# 1.13) the engine runs without it, and so does the ceiling.
ceiling() {
  local a b
  a=$(perftest "$@")
  [[ "${a}" == 0 && -n "$4" ]] && { set -- "$1" "$2" "$3" ""; a=$(perftest "$@"); }
  b=$(perftest "$@")
  python3 -c "print(max(${a}, ${b}))"
}

failed=0
echo "| transport | peer errors | model | tokens | op size KiB | ops | bench MB/s (median / best) |" \
     "last layer -> notified ms | ucp_put_bw | tag_bw | best / ceiling | copier out / in MB/s |"
echo "|---|---|---|---|---|---|---|---|---|---|---|---|"
for tls in "${transports[@]}"; do
  for pe in 1 0; do
    errmode=""; [[ "${pe}" == 1 ]] && errmode="-e"
    for model in ${models//,/ }; do
      for tok in ${tokens//,/ }; do
        size=$(( tok * ${bytes_per_token_layer[$model]} ))
        put=$(ceiling "${tls}" ucp_put_bw "${size}" "${errmode}")
        tag=$(ceiling "${tls}" tag_bw "${size}" "${errmode}")
        if ! out=$("${bench}" --tls "${tls}" --peer-errors "${pe}" --iters "${iters}" \
                --models "${model}" --tokens "${tok}" --block-sizes "${block}" --verify "${verify}" \
                --ucx-pool "${ucx_pool}" --pool "${pool}" 2>&1); then
          why=$(grep -m1 'cannot measure' <<<"${out}" || tail -1 <<<"${out}")
          echo "| ${tls} | $([[ ${pe} == 1 ]] && echo on || echo off) | ${model} | ${tok} |" \
               "not measured: ${why//|/ } | | | | | | | |"
          failed=1
          continue
        fi
        row=$(grep '^| ' <<<"${out}" | tail -1)  # the table's last row; logs may follow
        # | tls | pe | mode | pool | model | block | tokens | MiB | ops | op KiB | median | best |
        #   tail | copier |
        IFS='|' read -r _ _ _ mode _ _ _ _ _ ops opkib median best tail copier _ <<<"${row}"
        ceiling=$(python3 -c "print(max(${put}, ${tag}))")
        # ucx_perftest that could not run gives 0: no ratio against it.
        ratio=$(python3 -c "print(f'{100*${best}/${ceiling}:.0f}%' if ${ceiling} > 0 else 'no ceiling measured')")
        [[ "${put}" == 0 ]] && put="not measured"
        [[ "${tag}" == 0 ]] && tag="not measured"
        echo "| ${tls} | $([[ ${pe} == 1 ]] && echo on || echo off) | ${model} | ${tok} | ${opkib// /} | ${ops// /} |" \
             "${median// /} / ${best// /} (${mode// /}) | ${tail// /} | ${put} | ${tag} | ${ratio} |" \
             "${copier} |"
      done
    done
  done
done
# A row that could not be measured says so above; the run as a whole fails.
exit "${failed}"
