#!/usr/bin/env bash
# bench/transfer/run_transfer_bench.sh — the KV transfer benchmark beside this
# machine's UCX ceiling, measured back to back over the same transports.
#
# For each transport it runs ucx_perftest (ucp_put_bw, tag_bw and ucp_am_bw,
# with and without UCX peer error handling, -e) at the per-operation sizes the
# transfers use, then bench_transfer for smollm2-135m and llama3-8b KV.
#
#   bench/transfer/run_transfer_bench.sh [BUILD_DIR] [TRANSPORTS...]
#   e.g. bench/transfer/run_transfer_bench.sh build "tcp" "sm,self"
# Environment: ITERS (default 5), TOKENS (default 512,2048,8192,16384),
#              MODELS (default smollm2-135m,llama3-8b), PERFTEST_ITERS (default 50).
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
perftest_iters="${PERFTEST_ITERS:-50}"

# One ucx_perftest client/server pair on a free loopback port; prints MB/s.
perftest() {
  local tls="$1" test="$2" size="$3" errmode="$4" port server rate
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  UCX_TLS="${tls}" UCX_NET_DEVICES=lo ucx_perftest -p "${port}" ${errmode} >/dev/null 2>&1 &
  server=$!
  sleep 0.3
  rate=$(UCX_TLS="${tls}" UCX_NET_DEVICES=lo timeout 120 ucx_perftest 127.0.0.1 -p "${port}" -t "${test}" \
           -s "${size}" -n "${perftest_iters}" -w 5 ${errmode} 2>/dev/null |
         awk '/^Final:/ {print $6}')
  wait "${server}" 2>/dev/null || true
  echo "${rate:-n/a}"
}

# Per-operation sizes of contiguous transfers: one put/message per layer.
declare -A op_sizes=(
  [smollm2-135m]="393216 1572864 6291456 12582912"   # 512..16k tokens, 30 layers
  [llama3-8b]="2097152 8388608 33554432 67108864"    # 512..16k tokens, 32 layers
)

echo "# UCX ceiling (ucx_perftest, MB/s = 2^20 B/s); -e = peer error handling"
echo
echo "| transport | op size | put_bw | tag_bw | am_bw | put_bw -e | tag_bw -e | am_bw -e |"
echo "|---|---|---|---|---|---|---|---|"
for tls in "${transports[@]}"; do
  sizes=$(for m in ${models//,/ }; do echo "${op_sizes[$m]}"; done | tr ' ' '\n' | sort -n | uniq)
  for size in ${sizes}; do
    row="| ${tls} | $((size / 1024)) KiB"
    for e in "" "-e"; do
      for t in ucp_put_bw tag_bw ucp_am_bw; do row+=" | $(perftest "${tls}" "${t}" "${size}" "${e}")"; done
    done
    echo "${row} |"
  done
done
echo
for tls in "${transports[@]}"; do
  for pe in 1 0; do
    echo "# bench_transfer --tls ${tls} --peer-errors ${pe} (contiguous blocks, verify on)"
    "${bench}" --tls "${tls}" --peer-errors "${pe}" --iters "${iters}" --models "${models}" \
      --tokens "${tokens}" --block-sizes 16,64 --verify 1 2>/dev/null
    echo
  done
  echo "# bench_transfer --tls ${tls}: fragmented blocks, streamed layers (1 ms per layer)"
  "${bench}" --tls "${tls}" --iters "${iters}" --models smollm2-135m --tokens 2048,8192 \
    --block-sizes 16 --fragmented 1 --streamed 1 --layer-gap-us 1000 2>/dev/null
  echo
done
