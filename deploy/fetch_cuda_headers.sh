#!/usr/bin/env bash
# Fetches the header-only CUDA libraries the CUDA backend builds on into
# .deps/ (ignored by git): FlashInfer's kernels (include/flashinfer/, from the
# flashinfer-python wheel) and the newer CCCL they need (the nvidia-cuda-cccl
# wheel). Pinned versions, verified by the wheels' SHA-256; only the headers
# are unpacked. Idempotent: a present, complete copy is kept.
# Exit status 0 with a warning when PyPI cannot be reached: the build then
# leaves the CUDA backend out and says why.
set -euo pipefail
cd "$(dirname "$0")/.."

flashinfer_version=0.7.2
flashinfer_sha256=770550a0aa92b2f10e6c9a1f048dd43713f0f3bb6a12710186fcf8e4e9c99bd8
cccl_version=13.3.5.0.6
cccl_sha256=d5230098fa2df5021e1a00c0c4eee41797671a91119d31e892463e5ccf3ee326

deps=.deps
flashinfer_dir=$deps/flashinfer-$flashinfer_version
cccl_dir=$deps/cccl-$cccl_version
if [ -f "$flashinfer_dir/.complete" ] && [ -f "$cccl_dir/.complete" ]; then
  echo "fetch_cuda_headers: FlashInfer $flashinfer_version and CCCL $cccl_version present"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fetch() {  # package version sha256 -> the wheel's path
  local package=$1 version=$2 sha=$3
  if ! python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" \
    "$package==$version" >&2; then
    return 1
  fi
  local wheel
  wheel=$(ls "$work"/"${package//-/_}"-"$version"-*.whl)
  echo "$sha  $wheel" | sha256sum -c --quiet - >&2 || {
    echo "fetch_cuda_headers: $package $version does not match its pinned SHA-256" >&2
    return 1
  }
  echo "$wheel"
}

if ! fi_wheel=$(fetch flashinfer-python "$flashinfer_version" "$flashinfer_sha256") ||
  ! cccl_wheel=$(fetch nvidia-cuda-cccl "$cccl_version" "$cccl_sha256"); then
  echo "WARNING: fetch_cuda_headers: could not fetch FlashInfer's headers; the CUDA backend" \
    "will not be built" >&2
  exit 0
fi

rm -rf "$flashinfer_dir" "$cccl_dir"
mkdir -p "$flashinfer_dir" "$cccl_dir"
python3 - "$fi_wheel" "$flashinfer_dir" "flashinfer/data/include/" \
  "$cccl_wheel" "$cccl_dir" "nvidia/cu13/include/cccl/" <<'PY'
import sys, zipfile, os
args = sys.argv[1:]
for wheel, dest, prefix in zip(args[0::3], args[1::3], args[2::3]):
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not names:
            sys.exit(f"fetch_cuda_headers: {wheel} holds no {prefix}")
        for n in names:
            target = os.path.join(dest, "include", n[len(prefix):])
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with z.open(n) as src, open(target, "wb") as out:
                out.write(src.read())
PY
touch "$flashinfer_dir/.complete" "$cccl_dir/.complete"
echo "fetch_cuda_headers: FlashInfer $flashinfer_version and CCCL $cccl_version in $deps/"
