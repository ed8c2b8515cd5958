#!/usr/bin/env bash
# Sets up a fresh machine (build dependencies), builds Tocsin (the same build
# `.ci/test` uses: see deploy/build.sh), and runs a single-node cluster with
# its data in ./tocsin-data. Extra arguments go to `tocsin dev` (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
bin="$(bash deploy/build.sh)"
echo "tocsin is $bin/tocsin" >&2
exec "$bin/tocsin" dev "$@"
