#!/usr/bin/env bash
# One fire-lateness run with what it cost: starts one `tocsin dev` node or
# three `tocsin serve` nodes (12 shards, as ../shared/peers/side-by-side.sh
# starts them) on loopback, runs `tocsin bench fire` against them, then
# prints the bench's summary, the Raft entries the nodes' proposers wrote
# (`tocsin_raft_write_seconds_count` from /metrics, summed over nodes) and
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
tocsin="$bin/tocsin"
[ -x "$tocsin" ] || { echo "fire-ab: no executable $tocsin" >&2; exit 2; }
dir="$(mktemp -d /tmp/tocsin-fire-ab.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; }; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for port in 7070 7071 7080 7081 7090 7091; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "fire-ab: port $port is taken; stop what listens there first" >&2
    exit 1
  fi
done
if [ "$nodes" = 1 ]; then
  "$tocsin" dev --data "$dir/n1" --grpc 127.0.0.1:7070 --http 127.0.0.1:7071 >"$dir/n1.log" 2>&1 &
  pids+=($!)
else
  export TOCSIN_DELIVERY__WEBHOOK_ALLOW="${TOCSIN_DELIVERY__WEBHOOK_ALLOW:-127.0.0.0/8}"
  export TOCSIN_AUTH__MODE="${TOCSIN_AUTH__MODE:-open}"
  ic="1=127.0.0.1:7070/127.0.0.1:7071,2=127.0.0.1:7080/127.0.0.1:7081,3=127.0.0.1:7090/127.0.0.1:7091"
  for i in 1 2 3; do
    g=$((7060 + 10 * i))
    "$tocsin" serve --node-id "$i" --data "$dir/n$i" --grpc "127.0.0.1:$g" --http "127.0.0.1:$((g + 1))" \
      --initial-cluster "$ic" --shards 12 >"$dir/n$i.log" 2>&1 &
    pids+=($!)
  done
fi
for i in $(seq "$nodes"); do
  http="127.0.0.1:$((7061 + 10 * i))"
  for _ in $(seq 300); do curl -fs "http://$http/readyz" >/dev/null 2>&1 && break; sleep 0.1; done
  curl -fs "http://$http/readyz" >/dev/null || { echo "fire-ab: node $i never became ready (log: $dir/n$i.log)" >&2; exit 1; }
done
[ "$nodes" = 3 ] && sleep 3
cpu_ticks() {
  local total=0 p stat rest
  for p in "${pids[@]}"; do
    stat="$(cat "/proc/$p/stat")"
    rest="${stat##*) }"
    # shellcheck disable=SC2086
    set -- $rest
    total=$((total + ${12} + ${13}))
  done
  echo "$total"
}
before="$(cpu_ticks)"
echo "fire-ab: $nodes node(s), $rate timers/s for $seconds s, $(date -u +%H:%M:%S) UTC, loadavg $(cut -d' ' -f1-3 /proc/loadavg)" >&2
"$tocsin" bench fire --addr 127.0.0.1:7070 --rate "$rate" --seconds "$seconds" --quiet 2>&1 | tail -6 || echo "fire-ab: the bench reported a failure (above)"
after="$(cpu_ticks)"
entries=0
lost=0
for i in $(seq "$nodes"); do
  metrics="$(curl -fs "http://127.0.0.1:$((7061 + 10 * i))/metrics")"
  n="$(awk '/^tocsin_raft_write_seconds_count/ { n += $2 } END { print n + 0 }' <<<"$metrics")"
  entries=$((entries + ${n%.*}))
  # Applied entries a leader's fire loop did not hear of (its queue was full).
  n="$(awk '/^tocsin_wheel_event_overflows_total/ { n += $2 } END { print n + 0 }' <<<"$metrics")"
  lost=$((lost + ${n%.*}))
done
echo "entries written: $entries; entries lost to full fire-loop queues: $lost; node CPU over the run: $(awk -v t=$((after - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.1f", t / hz }') s"
