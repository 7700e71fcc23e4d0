#!/usr/bin/env bash
# Fetches RAPIDS' UCX from PyPI (the libucx-cu12 wheel: UCX 1.22 with its
# headers, pkg-config files and the CUDA transports, no verbs) into .deps/
# (ignored by git), with its pkg-config files pointed at where it lies. The
# UCX a GPU node would run with to use cuda_copy and cuda_ipc; Debian's
# (1.13) has no CUDA. Pinned and verified by the wheel's SHA-256.
# Idempotent. Prints the pkg-config folder to build against:
#   PKG_CONFIG_PATH=$(deploy/fetch_ucx_wheel.sh) cmake -S . -B build-ucx-wheel ...
set -euo pipefail
cd "$(dirname "$0")/.."

version=1.22.0
sha256=5cbbef0c140a0a158ae3486089af659b38822b2234cd3dc90ba40a5e6553402a
dir=$PWD/.deps/libucx-cu12-$version
if [ ! -f "$dir/.complete" ]; then
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" \
    "libucx-cu12==$version" >&2
  wheel=$(ls "$work"/libucx_cu12-"$version"-*.whl)
  echo "$sha256  $wheel" | sha256sum -c --quiet - >&2 || {
    echo "fetch_ucx_wheel: libucx-cu12 $version does not match its pinned SHA-256" >&2
    exit 1
  }
  rm -rf "$dir"
  mkdir -p "$dir"
  python3 -m zipfile -e "$wheel" "$dir"
  # The wheel's libraries find their modules (lib/ucx) beside themselves;
  # its pkg-config files name the folder it was built in.
  sed -i "s|^prefix = .*|prefix = $dir/libucx|" "$dir"/libucx/lib/pkgconfig/*.pc
  touch "$dir/.complete"
fi
echo "$dir/libucx/lib/pkgconfig"
