#!/usr/bin/env bash
# Measures what an idle node costs: starts one `tocsin dev` node or three
# `tocsin serve` nodes on loopback (nothing created, nothing due), lets them
# settle, then reads each node's CPU (utime + stime from /proc) over a
# window and prints it as a share of one core, with the split by thread
# name (tocsin-raft: the Raft runtime; tokio-rt-worker: requests and the
# control plane; tocsin-fire: the fire loops).
#
#   bash deploy/idle.sh [nodes: 1|3] [shards] [settle-seconds] [window-seconds]
#
# Defaults: 3 nodes, 16 shards, 15 s to settle, a 30 s window. Environment
# variables reach the nodes (TOCSIN_RAFT__QUIET_HEARTBEAT_MS=0 turns quiet
# groups off, for an A/B); IDLE_BIN names the directory holding `tocsin`
# and skips the build. Ports 7070-7091 must be free; data goes to a
# temporary directory that is removed at the end. Besides CPU it prints each
# thread kind's context switches a second: how often it was put to sleep
# and woken again, the cost an idle node is made of.
set -euo pipefail
cd "$(dirname "$0")/.."
nodes="${1:-3}"
shards="${2:-16}"
settle="${3:-15}"
window="${4:-30}"
case "$nodes" in 1 | 3) ;; *) echo "idle: nodes must be 1 or 3, not $nodes" >&2; exit 2 ;; esac
bin="${IDLE_BIN:-$(bash deploy/build.sh)}"
tocsin="$bin/tocsin"
# shellcheck source=deploy/ab-nodes.sh
source deploy/ab-nodes.sh
ab_start "$tocsin" "$nodes" idle "$shards"
echo "idle: $nodes node(s), $shards shards, settling ${settle} s, then measuring ${window} s" >&2
sleep "$settle"
# One line per thread: node pid, thread name, utime + stime in ticks.
snapshot() {
  for p in "${ab_pids[@]}"; do
    for t in /proc/"$p"/task/*; do
      stat="$(cat "$t/stat" 2>/dev/null)" || continue
      rest="${stat##*) }"
      # shellcheck disable=SC2086
      set -- $rest
      # Context switches: how often the thread slept and was woken again.
      switches="$(awk '/ctxt_switches/ { n += $2 } END { print n + 0 }' "$t/status" 2>/dev/null || echo 0)"
      echo "$p $(tr ' ' '_' <"$t/comm") $((${12} + ${13})) $switches"
    done
  done
}
snapshot >"$ab_dir/before"
sleep "$window"
snapshot >"$ab_dir/after"
python3 - "$ab_dir/before" "$ab_dir/after" "$(getconf CLK_TCK)" "$window" <<'PY'
import collections, sys
def read(path):
    ticks, switches = collections.Counter(), collections.Counter()
    for line in open(path):
        pid, name, t, s = line.split()
        ticks[(pid, name)] += int(t)
        switches[(pid, name)] += int(s)
    return ticks, switches
(before, before_sw), (after, after_sw) = read(sys.argv[1]), read(sys.argv[2])
hz, window = int(sys.argv[3]), float(sys.argv[4])
share = lambda t: 100.0 * t / hz / window
per_node, per_thread = collections.Counter(), collections.Counter()
for key, t in after.items():
    d = t - before.get(key, 0)
    per_node[key[0]] += d
    per_thread[key[1]] += d
for n, (pid, t) in enumerate(sorted(per_node.items()), 1):
    print(f"node {n} (pid {pid}): {share(t):.2f}% of a core")
nodes = len(per_node)
print("by thread, per node: " + ", ".join(f"{k} {share(v) / nodes:.2f}%" for k, v in per_thread.most_common() if v))
wakes = collections.Counter()
for key, n in after_sw.items():
    wakes[key[1]] += n - before_sw.get(key, 0)
print("context switches a second, per node: " + ", ".join(f"{k} {v / nodes / window:.0f}" for k, v in wakes.most_common() if v))
PY
