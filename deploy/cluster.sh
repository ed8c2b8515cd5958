#!/usr/bin/env bash
# Sets up a fresh machine, builds Tocsin, and runs a three-node cluster on
# loopback until Ctrl-C:
#   node 1  gRPC 127.0.0.1:7070  HTTP 127.0.0.1:7071  peer 127.0.0.1:7072
#   node 2  gRPC 127.0.0.1:7080  HTTP 127.0.0.1:7081  peer 127.0.0.1:7082
#   node 3  gRPC 127.0.0.1:7090  HTTP 127.0.0.1:7091  peer 127.0.0.1:7092
# (a node's peer port, for Raft and forwarding, defaults to its gRPC port + 2)
# Data and logs go to ./tocsin-cluster/n{1,2,3}; a restart reuses them. The
# nodes speak mTLS to each other on their peer ports, with a CA and node
# certificates made once in ./tocsin-cluster/certs (`tocsin certs`).
# Environment: SHARDS (default 12), DATA (default ./tocsin-cluster),
# TOCSIN_AUTH__MODE (default open), TOCSIN_DELIVERY__WEBHOOK_ALLOW (default 127.0.0.0/8,::1/128: receivers on
# this machine; `serve` alone refuses them, see docs/security.md).
set -euo pipefail
cd "$(dirname "$0")/.."
bash .ci/setup
bin="$(bash deploy/build.sh)/tocsin"
data="${DATA:-./tocsin-cluster}"
shards="${SHARDS:-12}"
initial="1=127.0.0.1:7070/127.0.0.1:7071,2=127.0.0.1:7080/127.0.0.1:7081,3=127.0.0.1:7090/127.0.0.1:7091"

export TOCSIN_DELIVERY__WEBHOOK_ALLOW="${TOCSIN_DELIVERY__WEBHOOK_ALLOW:-127.0.0.0/8,::1/128}"
# A cluster on loopback for one machine: no tokens unless asked
# (TOCSIN_AUTH__MODE=tokens with TOCSIN_AUTH__BOOTSTRAP_TOKEN_FILE).
export TOCSIN_AUTH__MODE="${TOCSIN_AUTH__MODE:-open}"

# mTLS between the nodes: a cluster CA and a certificate per node, made on
# the first start and reused.
if [ ! -f "$data/certs/ca.pem" ]; then
  "$bin" certs init --dir "$data/certs" >/dev/null
  "$bin" certs issue --dir "$data/certs" --node 1,2,3 >/dev/null
fi
export TOCSIN_PEER_TLS__DIR="${TOCSIN_PEER_TLS__DIR:-$data/certs}"

pids=()
stop() {
  echo "stopping (each node hands its leaderships over first)"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
}
trap stop INT TERM EXIT

for i in 1 2 3; do
  grpc_port=$((7060 + 10 * i))
  http_port=$((grpc_port + 1))
  mkdir -p "$data/n$i"
  "$bin" serve --node-id "$i" --data "$data/n$i" \
    --grpc "127.0.0.1:$grpc_port" --http "127.0.0.1:$http_port" \
    --initial-cluster "$initial" --shards "$shards" \
    >"$data/n$i/stdout.log" 2>"$data/n$i/node.log" &
  pids+=($!)
done

for i in 1 2 3; do
  port=$((7061 + 10 * i))
  for _ in $(seq 1 300); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 || { echo "node $i did not become ready; see $data/n$i/node.log" >&2; exit 1; }
done
echo "Tocsin three-node cluster is running ($shards shards, data and logs in $data):"
echo "  gRPC 127.0.0.1:7070,127.0.0.1:7080,127.0.0.1:7090   HTTP 127.0.0.1:7071, :7081, :7091"
echo "  any node serves any request; try: $bin cluster status"
echo "Ctrl-C stops it."
wait "${pids[@]}"
