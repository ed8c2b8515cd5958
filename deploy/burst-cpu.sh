#!/usr/bin/env bash
# The thundering second on one fresh `tocsin dev` node, with the node's CPU
# time from the end of the creates to the end of the drain (utime + stime
# from /proc/<pid>/stat): `bench burst` says how late the last delivery was,
# this says what the drain cost the node: its CPU, its page faults (and the
# machine's transparent-huge-page faults, `thp_fault_alloc`) and its
# resident size at the end. For A/B runs of two builds, alternate them on
# the same machine in the same hour.
#
#   bash deploy/burst-cpu.sh <tocsin binary> [count] [data dir]
set -euo pipefail
bin=${1:?usage: deploy/burst-cpu.sh <tocsin binary> [count] [data dir]}
count=${2:-200000}
dir=${3:-/tmp/tocsin-burst-cpu}
rm -rf "$dir"; mkdir -p "$dir"
"$bin" dev --data "$dir/data" --grpc 127.0.0.1:7070 --http 127.0.0.1:7071 > "$dir/node.log" 2>&1 &
node=$!
trap 'kill $node 2>/dev/null; wait $node 2>/dev/null' EXIT
for _ in $(seq 300); do curl -fs http://127.0.0.1:7071/readyz >/dev/null 2>&1 && break; sleep 0.1; done
"$bin" bench burst --addr 127.0.0.1:7070 --count "$count" --max-batch 1000 --quiet --run "burst$count" > "$dir/bench.out" 2>&1 &
bench=$!
while ! grep -q '^created' "$dir/bench.out" 2>/dev/null; do
  kill -0 $bench 2>/dev/null || { cat "$dir/bench.out"; exit 1; }
  sleep 0.2
done
ticks() { awk '{print $14 + $15}' "/proc/$node/stat"; }
faults() { awk '{print $10}' "/proc/$node/stat"; }
huge_faults() { awk '/^thp_fault_alloc /{print $2}' /proc/vmstat; }
before=$(ticks); faults_before=$(faults); huge_before=$(huge_faults)
wait $bench
after=$(ticks); faults_after=$(faults); huge_after=$(huge_faults)
cat "$dir/bench.out"
hz=$(getconf CLK_TCK)
echo "node CPU from the end of the creates to the end of the drain: $(( (after - before) * 1000 / hz )) ms"
echo "node minor page faults in the drain: $(( faults_after - faults_before )); huge-page faults on the machine: $(( huge_after - huge_before ))"
echo "node resident at the end: $(awk '/^VmRSS/{print $2, $3}' "/proc/$node/status")"
