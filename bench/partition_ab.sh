#!/usr/bin/env bash
# Times two versions of the decode partition kernel (attention_decode.cc)
# against each other in one process (bench/partition_ab/partition_ab.cc).
#
#   bench/partition_ab.sh OLD NEW [partition_ab options]
#   bench/partition_ab.sh HEAD kernels/cpu/attention_decode.cc --ctx 256
#   bench/partition_ab.sh HEAD~1 HEAD --ctx 16384 --cold --trials 100
#
# OLD and NEW are each a file or a git revision. A revision gives its
# kernels/cpu/attention_decode.cc, its 512-bit tile passes
# (decode_tiles_avx512.cc), VDPBF16PS V pass (attention_decode_avx512.cc) and
# 8-bit score passes (decode_scores_vnni.cc, decode_scores_fp8.cc,
# decode_scores_e4m3_fma.cc, decode_scores_avx2.cc), built
# with its own
# kernels/cpu and common headers; a file is an attention_decode.cc, with this
# tree's other sources and headers. A is OLD, B is NEW. Each side
# has its own prefetch stream class, so the templates that take it (the AVX2
# tile passes of key_tile_scores.h among them) are each side's own: a change
# to a header is compared by revisions (commit it on a branch). The rest of
# the kernels library (softmax, ...) comes from the current build in $BUILD
# (default: build). Revisions whose 512-bit tile passes were not yet in
# namespace avx512 do not build.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD:-$root/build}
if [ $# -lt 2 ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
  exit 2
fi
work=$build/partition_ab_sources
mkdir -p "$work"

# The kernel source of a file or a revision, as files under $work; a
# revision's kernels/cpu and common headers go to $work/<side>_root,
# searched first.
source_of() {
  local spec=$1 side=$2
  local tiles=kernels/cpu/decode_tiles_avx512.cc
  local bf16=kernels/cpu/attention_decode_avx512.cc
  local vnni=kernels/cpu/decode_scores_vnni.cc  # absent before int8 KV: empty
  local fp8=kernels/cpu/decode_scores_fp8.cc    # absent before its own pass: empty
  local avx2=kernels/cpu/decode_scores_avx2.cc  # absent before 8-bit AVX2 passes: empty
  local e4m3=kernels/cpu/decode_scores_e4m3_fma.cc  # absent before its own file: empty
  rm -rf "$work/${side}_root"
  mkdir -p "$work/${side}_root/kernels/cpu" "$work/${side}_root/common"
  if [ -f "$spec" ]; then
    cp "$spec" "$work/$side.cc"
    cp "$root/$tiles" "$work/${side}_tiles.cc"
    cp "$root/$bf16" "$work/${side}_bf16.cc"
    cp "$root/$vnni" "$work/${side}_vnni.cc"
    cp "$root/$fp8" "$work/${side}_fp8.cc"
    cp "$root/$avx2" "$work/${side}_avx2.cc"
    cp "$root/$e4m3" "$work/${side}_e4m3.cc"
  else
    git -C "$root" show "$spec:kernels/cpu/attention_decode.cc" >"$work/$side.cc"
    git -C "$root" show "$spec:$tiles" >"$work/${side}_tiles.cc"
    git -C "$root" show "$spec:$bf16" >"$work/${side}_bf16.cc"
    git -C "$root" show "$spec:$vnni" >"$work/${side}_vnni.cc" 2>/dev/null || : >"$work/${side}_vnni.cc"
    git -C "$root" show "$spec:$fp8" >"$work/${side}_fp8.cc" 2>/dev/null || : >"$work/${side}_fp8.cc"
    git -C "$root" show "$spec:$avx2" >"$work/${side}_avx2.cc" 2>/dev/null || : >"$work/${side}_avx2.cc"
    git -C "$root" show "$spec:$e4m3" >"$work/${side}_e4m3.cc" 2>/dev/null || : >"$work/${side}_e4m3.cc"
    local header
    for header in $(git -C "$root" ls-tree --name-only "$spec" kernels/cpu/ common/ | grep -E '\.(h|inc)$'); do
      git -C "$root" show "$spec:$header" >"$work/${side}_root/$header"
    done
  fi
}
source_of "$1" a
source_of "$2" b
shift 2

for lib in kernels/libbaton_kernels_cpu.a common/libbaton_common.a; do
  [ -f "$build/$lib" ] || { echo "partition_ab.sh: $build/$lib is missing; build the tree first" >&2; exit 1; }
done
flags=(-O3 -DNDEBUG -std=c++20 -I"$root")
compile() { ${CXX:-c++} "${flags[@]}" "$@"; }
side() {
  ${CXX:-c++} -I"$work/${1}_root" "${flags[@]}" -c "$root/bench/partition_ab/variant.cc" \
    -DBATON_AB_SIDE="$1" \
    -DBATON_AB_SOURCE="\"$work/$1.cc\"" -DBATON_AB_TILES_SOURCE="\"$work/${1}_tiles.cc\"" \
    -DBATON_AB_BF16_SOURCE="\"$work/${1}_bf16.cc\"" -DBATON_AB_VNNI_SOURCE="\"$work/${1}_vnni.cc\"" \
    -DBATON_AB_FP8_SOURCE="\"$work/${1}_fp8.cc\"" -DBATON_AB_AVX2_SCORES_SOURCE="\"$work/${1}_avx2.cc\"" \
    -DBATON_AB_E4M3_FMA_SOURCE="\"$work/${1}_e4m3.cc\"" \
    -o "$work/$1.o"
}
# No object of an earlier run may stand in for one that failed to build.
rm -f "$work"/*.o "$work/partition_ab"
side a &
side_a=$!
side b
wait "$side_a"
compile -c "$root/bench/partition_ab/partition_ab.cc" -o "$work/driver.o"
compile "$work/driver.o" "$work/a.o" "$work/b.o" "$build/kernels/libbaton_kernels_cpu.a" \
  "$build/common/libbaton_common.a" -lopenblas -lpthread -o "$work/partition_ab"
exec "$work/partition_ab" "$@"
