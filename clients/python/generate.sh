#!/usr/bin/env bash
# Regenerates the Python stubs in src/tocsin/v1 from proto/tocsin/v1's
# timer.proto and admin.proto (admin.proto imports nothing, so raft.proto is
# not needed) with a pinned grpcio-tools.
#
#   bash clients/python/generate.sh           # rewrite the committed stubs
#   bash clients/python/generate.sh --check   # regenerate into a temp dir;
#                                             # exit 1 with a diff if the
#                                             # committed stubs differ
#
# grpcio-tools lives in its own venv (TOCSIN_PYGEN_VENV, default
# ~/.cache/tocsin/pyvenv-gen): the pinned version requires protobuf < 6, and
# keeping it apart leaves the client's test venv free to run the newest
# protobuf the package accepts.
set -euo pipefail

# The generator. Changing it changes the gencode's runtime requirements:
# keep pyproject.toml's grpcio and protobuf lower bounds in step with it.
GRPCIO_TOOLS_VERSION=1.63.2

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
out_pkg="$here/src/tocsin/v1"
protos=(tocsin/v1/timer.proto tocsin/v1/admin.proto)
generated=(timer_pb2.py timer_pb2.pyi timer_pb2_grpc.py admin_pb2.py admin_pb2.pyi admin_pb2_grpc.py)

check=0
case "${1:-}" in
  --check) check=1 ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

venv="${TOCSIN_PYGEN_VENV:-$HOME/.cache/tocsin/pyvenv-gen}"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "generate.sh: python3 -m venv failed; installing python3-venv" >&2
      apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
      python3 -m venv "$venv"
    else
      echo "generate.sh: python3 -m venv failed (install python3-venv)" >&2
      exit 1
    fi
  fi
fi
py="$venv/bin/python"
have="$("$py" -c 'import importlib.metadata as m; print(m.version("grpcio-tools"))' 2>/dev/null || true)"
if [ "$have" != "$GRPCIO_TOOLS_VERSION" ]; then
  "$py" -m pip install -q --disable-pip-version-check "grpcio-tools==$GRPCIO_TOOLS_VERSION" >&2
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$root/proto" && "$py" -m grpc_tools.protoc -I . \
  --python_out="$tmp" --grpc_python_out="$tmp" --pyi_out="$tmp" "${protos[@]}")

if [ "$check" = 1 ]; then
  status=0
  for f in "${generated[@]}"; do
    if ! diff -u "$out_pkg/$f" "$tmp/tocsin/v1/$f"; then
      status=1
    fi
  done
  if [ "$status" != 0 ]; then
    echo "generate.sh --check: the stubs in clients/python/src/tocsin/v1 are out of date;" \
         "run: bash clients/python/generate.sh" >&2
    exit 1
  fi
  echo "generate.sh --check: stubs up to date (grpcio-tools $GRPCIO_TOOLS_VERSION)" >&2
  exit 0
fi

mkdir -p "$out_pkg"
for f in "${generated[@]}"; do
  cp "$tmp/tocsin/v1/$f" "$out_pkg/$f"
done
echo "generate.sh: wrote ${generated[*]} to $out_pkg (grpcio-tools $GRPCIO_TOOLS_VERSION)" >&2
