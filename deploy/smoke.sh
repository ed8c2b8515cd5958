#!/usr/bin/env bash
# Docker smoke test: builds the FROM scratch image, starts the compose
# cluster, runs `tocsin bench fire` (the client library plus a fencing sink)
# in a container on the cluster's network, `docker kill`s the container that
# leads shard 0 while timers are due, and requires every timer that must fire
# to be delivered, none early, none after an acknowledged cancel and no stale
# epoch accepted. Tears everything down whatever happens.
#   bash deploy/smoke.sh [path/to/tocsin]   (default: build the release binary)
# Prints "skipped: no docker" and exits 0 when no Docker engine answers.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v docker >/dev/null 2>&1 || ! docker info >/dev/null 2>&1; then
  echo "docker smoke: skipped: no docker"
  exit 0
fi
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
else
  echo "docker smoke: skipped: no docker-compose or docker compose"
  exit 0
fi
project=tocsin-smoke
export TOCSIN_IMAGE=tocsin:smoke
export TOCSIN_PROMETHEUS_IMAGE=tocsin-prometheus:smoke
# Prometheus's UI port on the host: a free one, not to collide with a
# Prometheus the machine may already run on 9090.
TOCSIN_PROMETHEUS_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
export TOCSIN_PROMETHEUS_PORT
dc() { "${compose[@]}" -p "$project" -f deploy/docker-compose.yml "$@"; }
net="${project}_tocsin"
# Tokens on, as in the compose file: a fresh bootstrap token for this run,
# which the load and the CLI present.
token_file="$(mktemp)"
head -c 32 /dev/urandom | base64 > "$token_file"
export TOCSIN_BOOTSTRAP_TOKEN="$token_file"
token="$(cat "$token_file")"
run() { docker run --rm --network "$net" "$TOCSIN_IMAGE" --token "$token" "$@"; }
cleanup() {
  docker rm -f "$project-bench" >/dev/null 2>&1 || true
  dc down -v --remove-orphans >/dev/null 2>&1 || true
}
# mTLS between the nodes, as in the compose file: a fresh CA and node
# certificates for this run, made with the image's own `tocsin certs`.
certs_dir="$(mktemp -d)"
export TOCSIN_CERTS="$certs_dir"
trap 'cleanup; rm -f "$token_file"; rm -rf "$certs_dir"' EXIT
cleanup

echo "== docker smoke: image"
IMAGE="$TOCSIN_IMAGE" bash deploy/build-image.sh "$@"
PROMETHEUS_IMAGE="$TOCSIN_PROMETHEUS_IMAGE" bash deploy/build-prometheus-image.sh
docker run --rm -v "$certs_dir:/certs" "$TOCSIN_IMAGE" certs init --dir /certs --force >/dev/null
docker run --rm -v "$certs_dir:/certs" "$TOCSIN_IMAGE" certs issue --dir /certs --node 1,2,3 --force >/dev/null
echo "== docker smoke: cluster up"
dc up -d
for _ in $(seq 1 90); do
  healthy=$(docker ps --filter "name=${project}_n" --filter health=healthy -q | wc -l)
  [ "$healthy" = 3 ] && break
  sleep 1
done
if [ "$healthy" != 3 ]; then
  dc ps
  dc logs --tail 30
  echo "docker smoke: FAIL: the nodes did not become healthy" >&2
  exit 1
fi
echo "   3 nodes healthy"
if [ "$(dc logs n1 n2 n3 2>&1 | grep -c 'peer TLS on')" -lt 3 ]; then
  echo "docker smoke: FAIL: not every node runs peer TLS" >&2
  exit 1
fi
if run cluster status --addr n2:7072 >/dev/null 2>&1; then
  echo "docker smoke: FAIL: a plaintext client was answered on a TLS peer port" >&2
  exit 1
fi
echo "   peer ports: mTLS on every node; a plaintext client is refused"

echo "== docker smoke: load (600 timers over 15 s, due 5 s after creation, 10% cancelled)"
docker run -d --name "$project-bench" --network "$net" --network-alias bench "$TOCSIN_IMAGE" \
  --token "$token" bench fire --addr n1:7070 --addr n2:7070 --addr n3:7070 --rate 40 --seconds 15 --delay-ms 5000 \
  --sink 0.0.0.0:9100 --sink-advertise bench:9100 --quiet --namespace smoke >/dev/null
sleep 6
status=$(run cluster status --addr n2:7070 --addr n3:7070 --json)
leader=$(python3 -c 'import json,sys; m=json.load(sys.stdin); print(next(s["leader"] for s in m["shards"] if s["shard"]==0))' <<<"$status")
if [ -z "$leader" ] || [ "$leader" = 0 ]; then
  echo "docker smoke: FAIL: shard 0 has no leader" >&2
  exit 1
fi
echo "== docker smoke: docker kill the leader of shard 0 (n$leader) while timers are due"
docker kill "${project}_n${leader}_1" >/dev/null
rc=$(docker wait "$project-bench")
docker logs "$project-bench" 2>&1 | sed 's/^/   /'
if [ "$rc" != 0 ]; then
  dc logs --tail 30
  echo "docker smoke: FAIL (bench exit $rc)" >&2
  exit 1
fi

echo "== docker smoke: Prometheus scrapes every node"
# promtool from the same image, on the compose network; then the host port.
query() { docker run --rm --network "$net" --entrypoint /bin/promtool "$TOCSIN_PROMETHEUS_IMAGE" \
  query instant -o json http://prometheus:9090 "$1"; }
count_series() { python3 -c 'import json,sys; print(len(json.load(sys.stdin)))'; }
ok=""
for _ in $(seq 1 30); do
  # The killed node is down: the two others report up, and every node's
  # timer totals were scraped while it was up.
  up=$(query 'up{job="tocsin"} == 1' | count_series)
  created=$(query 'count by (instance) (tocsin_timers_created_total)' | count_series)
  if [ "$up" -ge 2 ] && [ "$created" -ge 1 ]; then ok=1; break; fi
  sleep 2
done
targets=$(query 'up{job="tocsin"}' | count_series)
if [ -z "$ok" ] || [ "$targets" != 3 ]; then
  query 'up' >&2 || true
  echo "docker smoke: FAIL: Prometheus does not see the nodes (up: ${up:-?}, targets: $targets, created series: ${created:-?})" >&2
  exit 1
fi
curl -fsS "http://127.0.0.1:$TOCSIN_PROMETHEUS_PORT/api/v1/query?query=sum(tocsin_timers_created_total)" >/dev/null
echo "   3 targets, $up up after the kill, timer totals scraped; UI answered on the host port"
echo "docker smoke: PASS"
