#!/usr/bin/env bash
# Tests `clang++.sh` on one real RocksDB source file (from the cargo registry,
# which the build has fetched), in a scratch OUT_DIR, through what a CI
# machine does to it between builds:
#
#   1. a first compile precompiles the headers and uses them;
#   2. the clone is deleted and cloned again at the same path (its files
#      newer): the next compile reuses the precompiled headers, silently.
#      Before the headers were precompiled from a copy in OUT_DIR, this is
#      the compile that failed every RocksDB file of a CI run (2026-12-06);
#   3. a header under the precompiled one changes anyway: the compile still
#      succeeds, without it, with a warning, and marks it failed;
#   4. later compiles skip it without trying it again.
#
# Each step checks the object file was written. About 5 s on two cores.
#
#   bash deploy/rocksdb-cxx/test.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
repo="$PWD"
# Only the host's packages: the build fetched those and no others, and
# without the filter an offline `cargo metadata` wants every platform's
# (android_system_properties, windows-sys …) and fails on a fresh machine.
host="$(rustc -vV | sed -n 's/^host: //p')"
meta="$(cargo metadata --format-version 1 --locked --offline --filter-platform "$host")" \
  || { echo "rocksdb-cxx test: cargo metadata failed (above)" >&2; exit 1; }
crate="$(python3 -c 'import json, sys, os
for p in json.load(sys.stdin)["packages"]:
    if p["name"] == "librocksdb-sys":
        print(os.path.dirname(p["manifest_path"]))' <<<"$meta")"
[[ -d "$crate/rocksdb" ]] || { echo "rocksdb-cxx test: librocksdb-sys's source not found (run cargo fetch)" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
export OUT_DIR="$tmp/out"
mkdir -p "$OUT_DIR"
clone="$tmp/clone"
make_clone() {
  rm -rf "$clone"
  mkdir -p "$clone"
  cp "$repo/deploy/rocksdb-cxx/clang++.sh" "$repo/deploy/rocksdb-cxx/pch.h" "$clone/"
  # A later clone's files are newer than the last build's.
  touch -d "@$(( $(date +%s) + $1 ))" "$clone/clang++.sh" "$clone/pch.h"
}
fail() { echo "rocksdb-cxx test: FAILED: $*" >&2; exit 1; }

# A subset of the flags cc gives RocksDB's files (librocksdb-sys's build.rs),
# at -O0: the test is about the precompiled header, not the optimiser.
src="rocksdb/util/status.cc"
compile() { # $1: step name; writes $tmp/$1.o and $tmp/$1.err
  (cd "$crate" && "$clone/clang++.sh" -O0 -fPIC -m64 -std=c++20 \
    -I rocksdb/include/ -I rocksdb/ -I . -include cstdint \
    -DOS_LINUX -DROCKSDB_PLATFORM_POSIX -DROCKSDB_LIB_IO_POSIX -DNDEBUG=1 \
    -o "$tmp/$1.o" -c "$src") 2>"$tmp/$1.err" || { cat "$tmp/$1.err" >&2; fail "$1: the compile failed"; }
  [[ -s "$tmp/$1.o" ]] || fail "$1: no object file"
}
pch_count() { find "$OUT_DIR/tocsin-pch" -name '*.pch' | wc -l; }
failed_count() { find "$OUT_DIR/tocsin-pch" -name '*.pch.failed' | wc -l; }

make_clone 0
compile first
[[ "$(pch_count)" == 1 && "$(failed_count)" == 0 ]] || fail "first: expected one precompiled header, none failed"
grep -q warning "$tmp/first.err" && fail "first: warned: $(cat "$tmp/first.err")"
pch="$(find "$OUT_DIR/tocsin-pch" -name '*.pch')"
built="$(stat -c %Y.%s "$pch")"
echo "rocksdb-cxx test: 1. precompiled and used ($(stat -c %s "$pch") bytes)"

make_clone 120
compile recloned
grep -q warning "$tmp/recloned.err" && fail "recloned: warned: $(cat "$tmp/recloned.err")"
[[ "$(failed_count)" == 0 && "$(stat -c %Y.%s "$pch")" == "$built" ]] \
  || fail "recloned: the precompiled header was not reused"
echo "rocksdb-cxx test: 2. a re-cloned checkout reuses it, no warning"

touch -d "@$(( $(date +%s) + 240 ))" "${pch%.pch}.h"
compile stale
grep -q "retrying without it" "$tmp/stale.err" || fail "stale: no warning: $(cat "$tmp/stale.err")"
[[ "$(failed_count)" == 1 ]] || fail "stale: the precompiled header was not marked failed"
echo "rocksdb-cxx test: 3. a stale precompiled header: compiled without it, with a warning"

compile after
grep -q warning "$tmp/after.err" && fail "after: tried the failed header again: $(cat "$tmp/after.err")"
echo "rocksdb-cxx test: 4. later compiles skip it silently"
echo "rocksdb-cxx test: passed"
