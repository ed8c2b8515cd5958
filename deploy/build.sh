#!/usr/bin/env bash
# Builds every binary once, in the profile the tests use, into the build
# cache that `.ci/test` uses too, so the README's two commands share one
# compile (RocksDB from source is most of it). Prints the directory holding
# `tocsin` and `tocsin-chaos` on stdout; cargo's progress goes to stderr.
#
# The profile is cargo's dev profile as Cargo.toml sets it: everything at
# opt-level 2, our crates keeping debug assertions and overflow checks (and
# so the test-only fault points, armed only through FAILPOINTS). For a
# production image use `deploy/build-image.sh`, which builds --release.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/tocsin/target}"
cargo build --workspace --bins --locked >&2
echo "$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/debug"
