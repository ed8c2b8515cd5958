#!/usr/bin/env bash
# Builds the `tocsin:dev` image FROM scratch without a registry: the static
# glibc `tocsin` binary (built here, or the one given as $1) and the host's
# CA bundle, with the legacy builder.
#   bash deploy/build-image.sh                 # cargo build --release, then the image
#   bash deploy/build-image.sh path/to/tocsin  # use an already built binary
# Environment: IMAGE (default tocsin:dev).
set -euo pipefail
cd "$(dirname "$0")/.."
image="${IMAGE:-tocsin:dev}"
if [ $# -ge 1 ]; then
  bin="$1"
else
  bash .ci/setup
  cargo build --release --locked -p tocsin-cli
  bin="${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-gnu/release/tocsin"
fi
[ -x "$bin" ] || { echo "build-image: no executable at $bin" >&2; exit 1; }
if command -v file >/dev/null && ! file "$bin" | grep -Eq "static(ally|-pie) linked"; then
  echo "build-image: $bin is dynamically linked; a FROM scratch image needs the static build (.cargo/config.toml)" >&2
  exit 1
fi
ca=/etc/ssl/certs/ca-certificates.crt
[ -f "$ca" ] || { echo "build-image: no CA bundle at $ca (apt-get install ca-certificates)" >&2; exit 1; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
# Debug info is no use in the image; strip it when binutils is here.
strip -o "$ctx/tocsin" "$bin" 2>/dev/null || cp "$bin" "$ctx/tocsin"
cp "$ca" "$ctx/ca-certificates.crt"
cp deploy/docker/Dockerfile.scratch "$ctx/Dockerfile"
if ! out=$(DOCKER_BUILDKIT=0 docker build -q -t "$image" "$ctx" 2>&1); then
  echo "$out" >&2
  exit 1
fi
echo "built $image ($(du -h "$ctx/tocsin" | cut -f1) binary) from $bin"
