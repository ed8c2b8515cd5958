#!/usr/bin/env bash
# The C++ compiler cargo's cc crate runs (`.cargo/config.toml`): clang++,
# with RocksDB's common headers (`pch.h`) precompiled once per build and
# handed to each of its source files with `-include-pch`.
#
# Why: RocksDB's C++ is about half of a cold build on two cores, and most of
# each file's 3.5 s is parsing the same headers. On a 12-file sample the
# precompiled headers cut clang's CPU time by 30% (31.5 → 22.2 s), and a
# cold build from 1,304 to 1,119 s; the code is the same: `verify.sh`
# (which sets TOCSIN_PCH_VERIFY) compiled each of RocksDB's 342 files with
# and without them and every code section's disassembly compared equal
# (BENCHMARKS.md, "The cold build").
#
# How: a compile of a RocksDB source file (`rocksdb/*.cc` relative to the
# `librocksdb-sys` crate, where the cc crate runs) gets `-include-pch`; the
# header is precompiled with that compile's own flags (clang refuses a
# precompiled header built with other flags), into the build script's
# OUT_DIR, under a name from those flags and `pch.h`, once, under a lock
# (cargo runs two compiles at once). Every other command (the cc crate's
# probes, lz4's C, anything outside RocksDB) runs clang++ unchanged, and so
# does a RocksDB compile when precompiling fails, with a warning.
#
# A precompiled header records the path and mtime of every header it read,
# and clang refuses it once one of them changes. So it is built from a copy
# of `pch.h` in OUT_DIR, written once beside it, never from this clone's
# file: OUT_DIR outlives clones (CI reuses one target directory, and a clone
# elsewhere reruns the build script into the same OUT_DIR), and a precompiled
# header that pointed into a deleted or re-cloned checkout failed every
# RocksDB compile of the next build (2026-12-06: "pch.h has been modified
# since the precompiled header was built"). Anything else that goes stale
# under it (a system header updated by apt) is caught the same way as a
# failed precompile: the compile is retried without it, with a warning, and
# the header is marked failed so the rest of the build skips it. The key
# covers this script too, so a change here never meets an old header.
set -euo pipefail
real="${TOCSIN_REAL_CXX:-clang++}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

src="" out="" prev=""
flags=()
for arg in "$@"; do
    if [[ "$prev" == "-o" ]]; then
        out="$arg"
    elif [[ "$arg" == *.cc && "$PWD/$arg" == *"/librocksdb-sys-"*"/rocksdb/"* ]]; then
        src="$arg"
    elif [[ "$arg" != "-o" && "$arg" != "-c" ]]; then
        flags+=("$arg")
    fi
    prev="$arg"
done
if [[ -z "$src" || -z "$out" || -z "${OUT_DIR:-}" ]]; then
    exec "$real" "$@"
fi

dir="$OUT_DIR/tocsin-pch"
mkdir -p "$dir"
key="$({ printf '%s\n' "$real" "${flags[@]}"; cat "$here/pch.h" "${BASH_SOURCE[0]}"; } | cksum | cut -d' ' -f1)"
pch="$dir/$key.pch"
header="$dir/$key.h"
if [[ ! -f "$pch" && ! -f "$pch.failed" ]]; then
    exec 9>"$dir/$key.lock"
    flock 9
    if [[ ! -f "$pch" && ! -f "$pch.failed" ]]; then
        if [[ ! -f "$header" ]]; then
            cp "$here/pch.h" "$header.tmp.$$"
            mv "$header.tmp.$$" "$header"
        fi
        if "$real" "${flags[@]}" -x c++-header "$header" -o "$pch.tmp.$$"; then
            mv "$pch.tmp.$$" "$pch"
        else
            rm -f "$pch.tmp.$$"
            touch "$pch.failed"
            echo "warning: clang++.sh: precompiling $header failed; RocksDB compiles without it" >&2
        fi
    fi
    exec 9>&-
fi
if [[ ! -f "$pch" || -f "$pch.failed" ]]; then
    exec "$real" "$@"
fi
if [[ -z "${TOCSIN_PCH_VERIFY:-}" ]]; then
    if "$real" -include-pch "$pch" "$@"; then
        exit 0
    fi
    # A stale or unreadable precompiled header, or a real error in `$src`:
    # the plain compile below settles which, and says it in clang's words.
    touch "$pch.failed"
    echo "warning: clang++.sh: $src failed with $pch; retrying without it, and the rest of this build compiles without it" >&2
    exec "$real" "$@"
fi
# `verify.sh`: compile the file both ways and compare the code.
"$real" -include-pch "$pch" "$@"
plain="$out.plain.o"
"$real" "${flags[@]}" -c "$src" -o "$plain"
if verdict="$("$here/same-code.py" "$plain" "$out")"; then
    echo "same $src" >>"$TOCSIN_PCH_VERIFY"
else
    echo "DIFFERENT $src: $verdict" >>"$TOCSIN_PCH_VERIFY"
fi
rm -f "$plain"
