#!/usr/bin/env bash
# One fire-lateness run with what it cost: starts one `tocsin dev` node or
# three `tocsin serve` nodes (12 shards, as ../shared/peers/side-by-side.sh
# starts them) on loopback, runs `tocsin bench fire` against them, then
# prints the bench's summary, the Raft entries the nodes' proposers wrote
# (`tocsin_raft_write_seconds_count` from /metrics, summed over nodes), the
# fires a lapsed lease refused (`tocsin_fire_lease_refusals_total`) and
# the CPU the nodes used over the run (utime + stime from /proc). Run it
# with two builds in turn for an A/B in one hour; figures from different
# hours of this machine do not compare.
#
#   bash deploy/fire-ab.sh <dir holding tocsin> [nodes: 1|3] [rate] [seconds]
#
# Defaults: 1 node, 1,000 timers a second, 20 s. Ports 7070-7091 must be
# free; data goes to a temporary directory that is removed at the end.
# With 3 nodes, TOCSIN_* settings in the environment reach the nodes
# (TOCSIN_FIRING__ARM_AHEAD_MS=0 turns armed fires off, for an A/B within
# one build); `tocsin dev`, the 1-node case, reads no TOCSIN_* settings,
# so there an A/B takes two builds.
set -euo pipefail
cd "$(dirname "$0")/.."
bin="${1:?usage: fire-ab.sh <dir holding tocsin> [1|3] [rate] [seconds]}"
nodes="${2:-1}"
rate="${3:-1000}"
seconds="${4:-20}"
case "$nodes" in 1 | 3) ;; *) echo "fire-ab: nodes must be 1 or 3, not $nodes" >&2; exit 2 ;; esac
. deploy/ab-nodes.sh
ab_start "$bin/tocsin" "$nodes" fire-ab
tocsin="$bin/tocsin"
before="$(ab_cpu_ticks)"
echo "fire-ab: $nodes node(s), $rate timers/s for $seconds s, $(date -u +%H:%M:%S) UTC, loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$tocsin" bench fire --addr 127.0.0.1:7070 --rate "$rate" --seconds "$seconds" --quiet 2>&1 | tail -6 || echo "fire-ab: the bench reported a failure (above)"
after="$(ab_cpu_ticks)"
entries=0
lost=0
refused=0
for i in $(seq "$nodes"); do
  metrics="$(curl -fs "http://127.0.0.1:$((7061 + 10 * i))/metrics")"
  n="$(awk '/^tocsin_raft_write_seconds_count/ { n += $2 } END { print n + 0 }' <<<"$metrics")"
  entries=$((entries + ${n%.*}))
  # Applied entries a leader's fire loop did not hear of (its queue was full).
  n="$(awk '/^tocsin_wheel_event_overflows_total/ { n += $2 } END { print n + 0 }' <<<"$metrics")"
  lost=$((lost + ${n%.*}))
  # Fires openraft refused because a leader's lease lapsed (each re-read).
  n="$(awk '/^tocsin_fire_lease_refusals_total/ { n += $2 } END { print n + 0 }' <<<"$metrics")"
  refused=$((refused + ${n%.*}))
done
echo "entries written: $entries; entries lost to full fire-loop queues: $lost; fires refused by a lapsed lease: $refused; node CPU over the run: $(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t / hz }') s"
