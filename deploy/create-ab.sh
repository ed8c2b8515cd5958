#!/usr/bin/env bash
# One create-throughput run on a fresh node or cluster, with what it cost:
# starts one `tocsin dev` node or three `tocsin serve` nodes (12 shards, as
# ../shared/peers/side-by-side.sh starts them) on loopback, runs `tocsin
# bench create` against them, then prints the bench's summary and the CPU
# the nodes used over the run (utime + stime from /proc). Run it with two
# builds in turn for an A/B in one hour; figures from different hours of
# this machine do not compare.
#
#   bash deploy/create-ab.sh <dir holding tocsin> [nodes: 1|3] [batch] [concurrency] [total]
#
# Defaults: 1 node, single creates (batch 1), concurrency 64, 100,000
# creates. Ports 7070-7091 must be free; data goes to a temporary directory
# that is removed at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:?usage: create-ab.sh <dir holding tocsin> [1|3] [batch] [concurrency] [total]}"
nodes="${2:-1}"
batch="${3:-1}"
concurrency="${4:-64}"
total="${5:-100000}"
case "$nodes" in 1 | 3) ;; *) echo "create-ab: nodes must be 1 or 3, not $nodes" >&2; exit 2 ;; esac
. deploy/ab-nodes.sh
ab_start "$bin/tocsin" "$nodes" create-ab
tocsin="$bin/tocsin"
before=$(ab_cpu_ticks)
"$tocsin" bench create --addr 127.0.0.1:7070 --batch "$batch" --concurrency "$concurrency" --total "$total" --quiet \
  --run "ab$$" 2>&1 | tail -4
after=$(ab_cpu_ticks)
echo "node CPU over the run (all nodes): $(( (after - before) * 1000 / $(getconf CLK_TCK) )) ms"
