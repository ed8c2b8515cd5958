#!/usr/bin/env bash
# Builds the `tocsin-prometheus:dev` image FROM scratch without a registry:
# Debian's prometheus and promtool (apt-get install prometheus) and the
# shared libraries they link (ldd), with the legacy builder. The compose
# file runs it next to the nodes, scraping each one.
#   bash deploy/build-prometheus-image.sh
# Environment: PROMETHEUS_IMAGE (default tocsin-prometheus:dev).
set -euo pipefail
cd "$(dirname "$0")/.."
image="${PROMETHEUS_IMAGE:-tocsin-prometheus:dev}"
for b in /usr/bin/prometheus /usr/bin/promtool; do
  [ -x "$b" ] || { echo "build-prometheus-image: no $b (apt-get install prometheus)" >&2; exit 1; }
done
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/root/bin" "$ctx/root/etc/prometheus" "$ctx/root/prometheus" "$ctx/root/tmp"
for b in prometheus promtool; do
  cp "/usr/bin/$b" "$ctx/root/bin/$b"
  # Go binaries built with cgo link the C library: copy what ldd lists.
  for lib in $(ldd "/usr/bin/$b" | grep -o '/[^ ]*'); do
    mkdir -p "$ctx/root$(dirname "$lib")"
    cp -L "$lib" "$ctx/root$lib"
  done
done
cp deploy/prometheus/prometheus.yml "$ctx/root/etc/prometheus/prometheus.yml"
cp deploy/docker/Dockerfile.prometheus "$ctx/Dockerfile"
if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$image" "$ctx" 2>&1); then
  echo "$out" >&2
  exit 1
fi
echo "built $image from $(/usr/bin/prometheus --version 2>&1 | head -1)"
