#!/usr/bin/env bash
# Installs every Debian package Baton's build, tests and benchmarks need.
# Idempotent and non-interactive: safe to run on every CI start.
set -euo pipefail

packages=(
  build-essential cmake ninja-build ccache pkg-config git python3 python3-venv
  libopenblas-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev nlohmann-json3-dev libcli11-dev
  libxxhash-dev
  libucx-dev ucx-utils
  libzmq3-dev cppzmq-dev
  libboost-dev libboost-system-dev
  liburing-dev
  libpcre2-dev libicu-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  clang-format
  clang libclang-rt-14-dev
  iproute2 nftables
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all ${#packages[@]} packages present"

# The CUDA backend's header-only libraries, where there is a CUDA compiler.
if command -v nvcc >/dev/null || [ -x /usr/local/cuda/bin/nvcc ]; then
  bash "$(dirname "$0")/fetch_cuda_headers.sh"
fi
