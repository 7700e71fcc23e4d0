#!/usr/bin/env bash
# A bounded soak under random faults (deploy/soak.py --help): an hour of
# `baton bench` against configs/local-2p2d.yaml by default. Not part of CI.
set -euo pipefail
exec python3 "$(dirname "$0")/soak.py" "$@"
