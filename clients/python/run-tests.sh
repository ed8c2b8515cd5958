#!/usr/bin/env bash
# The Python client's checks: installs the package with its test extra into
# a venv, checks that the committed stubs match the protos, and runs the
# pytest suite, whose end-to-end tests start a real `tocsin dev` node.
#
#   bash clients/python/run-tests.sh [BIN_DIR] [pytest args...]
#
# BIN_DIR is the directory holding the `tocsin` binary, as deploy/build.sh
# prints it (default: $TOCSIN_BIN, else the default build directory). The
# venv is $TOCSIN_PYVENV (default ~/.cache/tocsin/pyvenv), created if
# needed; on Debian, python3-venv is installed with apt when missing.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"

if [ $# -ge 1 ] && [ -n "$1" ]; then
  export TOCSIN_BIN="$1/tocsin"
  shift
elif [ -z "${TOCSIN_BIN:-}" ]; then
  export TOCSIN_BIN="$HOME/.cache/tocsin/target/x86_64-unknown-linux-gnu/debug/tocsin"
fi
if [ ! -x "$TOCSIN_BIN" ]; then
  echo "run-tests.sh: no tocsin binary at $TOCSIN_BIN (give the bin dir deploy/build.sh prints)" >&2
  exit 1
fi

venv="${TOCSIN_PYVENV:-$HOME/.cache/tocsin/pyvenv}"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$(dirname "$venv")"
  if ! python3 -m venv "$venv" >/dev/null 2>&1; then
    rm -rf "$venv"
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      echo "run-tests.sh: python3 -m venv failed; installing python3-venv" >&2
      apt-get update -qq >&2
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >&2
      python3 -m venv "$venv"
    else
      echo "run-tests.sh: python3 -m venv failed (install python3-venv)" >&2
      exit 1
    fi
  fi
fi
py="$venv/bin/python"

# Quiet, but pip's errors still show. A regular (not editable) install,
# rebuilt from the tree each run, so the tests see the package as users get it.
"$py" -m pip install -q --disable-pip-version-check "./clients/python[test]"

TOCSIN_PYGEN_VENV="${TOCSIN_PYGEN_VENV:-$HOME/.cache/tocsin/pyvenv-gen}" bash "$here/generate.sh" --check

exec "$py" -m pytest -q -p no:cacheprovider clients/python/tests "$@"
