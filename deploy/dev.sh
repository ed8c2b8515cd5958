#!/usr/bin/env bash
# Sets up a fresh machine (build dependencies), builds Tocsin, and runs a
# single-node cluster with its data in ./tocsin-data. Extra arguments go to
# `tocsin dev` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
exec cargo run --release --locked -p tocsin-cli -- dev "$@"
