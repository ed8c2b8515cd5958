#!/usr/bin/env bash
# Profiles a Tocsin node under one of the benchmarks' loads, so "where does a
# create's CPU go" is a command, not a memory. Needs Linux `perf` (Debian:
# linux-perf) and root or perf_event_paranoid <= 1.
#
#   bash deploy/profile.sh <load> [out-dir]
#
# loads (each on a fresh node or cluster on loopback, data under out-dir):
#   single    one `tocsin dev` node, `bench create --batch 1 --concurrency 64`
#   batched   one node, `bench create --batch 100 --concurrency 16`
#   fire      one node, `bench fire --rate 10000` (creates and fires together)
#   burst     one node, `bench burst --count 200000` (profiles the drain)
#   cluster   three `tocsin serve` nodes with 12 shards (as the side-by-side
#             script starts them), `bench create --batch 1 --concurrency 64`;
#             node 1 is profiled
#   idle3     the same three nodes, nothing to do, 15 s
#
# It records node 1 with `perf record -F PROFILE_HZ --call-graph dwarf`
# (default 499 samples a second; lower it when the recording itself tips a
# load near capacity over) for PROFILE_SECONDS (default 8) once the load
# is running (the `fire` load's rate: PROFILE_FIRE_RATE, default 10000), and writes to
# out-dir (default /tmp/tocsin-profile/<load>): perf.data, folded.txt (one
# line per distinct stack, root first, then its sample count: the input
# format of every flame graph tool), flame.svg (deploy/flamegraph.py: the
# stacks as a flame graph; hover a box for its share), and summary.txt: the
# share of samples per thread and the frames with the largest inclusive and
# self shares. The node's CPU over the window (utime+stime from /proc) and
# the load's own output are in load.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
load="${1:?usage: profile.sh single|batched|fire|burst|cluster|idle3 [out-dir]}"
out="${2:-/tmp/tocsin-profile/$load}"
seconds="${PROFILE_SECONDS:-8}"
hz="${PROFILE_HZ:-499}"
fire_rate="${PROFILE_FIRE_RATE:-10000}"
command -v perf >/dev/null || { echo "profile: perf is missing (Debian: apt-get install linux-perf)" >&2; exit 1; }
bin="${PROFILE_BIN:-$(bash deploy/build.sh)}"
tocsin="$bin/tocsin"
rm -rf "$out"
mkdir -p "$out"
# The nodes allow webhooks to loopback (the bench's receiver) and take calls
# without tokens, as the side-by-side script runs them; their data and logs
# stay in out-dir.
export TOCSIN_DELIVERY__WEBHOOK_ALLOW=127.0.0.0/8 TOCSIN_AUTH__MODE=open AB_KEEP_DIR="$out"
# shellcheck source=deploy/ab-nodes.sh
source deploy/ab-nodes.sh
case "$load" in
  single | batched | fire | burst) ab_start "$tocsin" 1 profile ;;
  cluster | idle3) ab_start "$tocsin" 3 profile ;;
  *)
    echo "profile: unknown load $load" >&2
    exit 2
    ;;
esac
node="${ab_pids[0]}"
pids=()
cleanup() {
  for p in "${pids[@]:-}"; do [ -n "$p" ] && { kill "$p" 2>/dev/null || true; }; done
  ab_cleanup
}
trap cleanup EXIT
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }

# The load runs in the background; the recording starts once it is under way
# (the burst's drain starts after its creates and lead).
lead=3
case "$load" in
  single | cluster) "$tocsin" bench create --addr 127.0.0.1:7070 --batch 1 --concurrency 64 --total 400000 --quiet >"$out/load.txt" 2>&1 & ;;
  batched) "$tocsin" bench create --addr 127.0.0.1:7070 --batch 100 --concurrency 16 --total 1000000 --quiet >"$out/load.txt" 2>&1 & ;;
  fire) "$tocsin" bench fire --addr 127.0.0.1:7070 --rate "$fire_rate" --seconds 20 --quiet >"$out/load.txt" 2>&1 & ;;
  burst)
    "$tocsin" bench burst --addr 127.0.0.1:7070 --count 200000 --max-batch 1000 --lead-ms 1000 --quiet >"$out/load.txt" 2>&1 &
    lead=13 # 200,000 / 20 ms + 2 s planned for the creates, the lead, then the second
    ;;
  idle3) sleep 3600 & lead=15 ;;
esac
loadpid=$!
pids+=("$loadpid")
sleep "$lead"
echo "profile: recording node $node for $seconds s ($load)" >&2
before=$(cpu_ticks "$node")
perf record -F "$hz" --call-graph dwarf,16384 -p "$node" -o "$out/perf.data" -- sleep "$seconds" >"$out/perf.log" 2>&1
after=$(cpu_ticks "$node")
hz=$(getconf CLK_TCK)
if [ "$load" != idle3 ]; then wait "$loadpid" || true; fi
echo "node CPU while recorded: $(awk -v t=$((after - before)) -v hz="$hz" -v s="$seconds" 'BEGIN { printf "%.1f%% of a core", 100 * t / hz / s }')" >>"$out/load.txt"

perf script --no-inline -i "$out/perf.data" 2>/dev/null | python3 -c '
import collections, re, sys
# perf script: a header line per sample ("comm tid time: period event:"),
# then one line per frame, leaf first, then a blank line.
stacks = collections.Counter()
comm, frames = None, []
def flush():
    if comm is not None:
        stacks[";".join([comm] + frames[::-1])] += 1
for line in sys.stdin:
    line = line.rstrip("\n")
    if not line.strip():
        flush(); comm, frames = None, []
    elif not line[0].isspace():
        comm = re.sub(r"-?\d+$", "", line.split()[0]) or line.split()[0]
        frames = []
    else:
        parts = line.strip().split(None, 1)
        sym = parts[1] if len(parts) > 1 else "?"
        sym = re.sub(r"\+0x[0-9a-f]+ ", " ", sym)
        sym = re.sub(r" \(.*\)$", "", sym).replace(";", ":")
        frames.append(sym)
flush()
with open(sys.argv[1], "w") as f:
    for stack, n in stacks.most_common():
        f.write(f"{stack} {n}\n")
' "$out/folded.txt"

python3 deploy/profile_summary.py "$out/folded.txt" >"$out/summary.txt"
python3 deploy/flamegraph.py "$out/folded.txt" >"$out/flame.svg"
echo "profile: $out/flame.svg" >&2
echo "profile: $out/summary.txt" >&2
cat "$out/load.txt"
head -24 "$out/summary.txt"
