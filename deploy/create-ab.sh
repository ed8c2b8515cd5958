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
tocsin="$bin/tocsin"
[ -x "$tocsin" ] || { echo "create-ab: no executable $tocsin" >&2; exit 2; }
dir="$(mktemp -d /tmp/tocsin-create-ab.XXXXXX)"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; }; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT
for port in 7070 7071 7080 7081 7090 7091; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "create-ab: port $port is taken; stop what listens there first" >&2
    exit 1
  fi
done
if [ "$nodes" = 1 ]; then
  "$tocsin" dev --data "$dir/n1" --grpc 127.0.0.1:7070 --http 127.0.0.1:7071 >"$dir/n1.log" 2>&1 &
  pids+=($!)
else
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
  curl -fs "http://$http/readyz" >/dev/null || { echo "create-ab: node $i never became ready (log: $dir/n$i.log)" >&2; exit 1; }
done
# As the side-by-side script does: let the cluster's leaderships settle.
[ "$nodes" = 1 ] || sleep 3
ticks() { local t=0; for p in "${pids[@]}"; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo "$t"; }
before=$(ticks)
"$tocsin" bench create --addr 127.0.0.1:7070 --batch "$batch" --concurrency "$concurrency" --total "$total" --quiet \
  --run "ab$$" 2>&1 | tail -4
after=$(ticks)
echo "node CPU over the run (all nodes): $(( (after - before) * 1000 / $(getconf CLK_TCK) )) ms"
