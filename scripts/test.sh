#!/usr/bin/env bash
# The whole corefarm test suite, from a fresh clone: installs what it needs,
# checks formatting, lints and API docs, runs every Rust test (unit, property,
# integration against the real binaries), builds and tests the Python package,
# and runs the benchmark suite in --quick mode so the harness never rots.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
# Every test runs: a missing compiler, Verilator or binary is a failure, not a skip.
export COREFARM_REQUIRE_TOOLS=1
# Where the binaries the later steps run are built, and with which profile:
# `suite` is release at opt-level 1 (see Cargo.toml), a shorter build.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
export COREFARM_PROFILE=suite
start=$SECONDS
# Each step says how long the run has taken so far: the suite must fit CI's budget.
step() { printf '\n==> [%dm%02ds] %s\n' $(((SECONDS - start) / 60)) $(((SECONDS - start) % 60)) "$*" >&2; }

step "installing prerequisites"
bash scripts/setup.sh test

step "cargo fmt --check"
cargo fmt --all -- --check

step "cargo clippy -D warnings"
cargo clippy --workspace --all-targets --release -- -D warnings
# The workspace build unifies features, so co-working is always on there:
# check once that a plain client (the feature off, its default) builds clean.
cargo clippy -p corefarm-client --lib --release -- -D warnings

step "cargo doc -D warnings (broken, ambiguous or private intra-doc links, stray HTML)"
# --release reuses the dependencies clippy just checked. Twice: the public
# docs (a public item must not link to a private one), then every item's
# (private items' docs are read by contributors and must not rot either).
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --no-deps --release
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D warnings" cargo doc --workspace --no-deps --release --document-private-items

step "cargo test (profile suite: release at opt-level 1, overflow checks on)"
cargo test --workspace --profile "$COREFARM_PROFILE"

step "corefarm-board's tests, cross-built for aarch64 and run under qemu-user"
# The board interfaces (FPGA manager, UIO, u-dma-buf) run on ARM boards: one
# small crate, std plus libc and memmap2, so this costs seconds. The sysroot
# of the cross compiler holds the dynamic loader qemu needs.
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu" \
    cargo test --profile "$COREFARM_PROFILE" -p corefarm-board --lib --target aarch64-unknown-linux-gnu

export COREFARM_BIN="$CARGO_TARGET_DIR/$COREFARM_PROFILE/corefarm"

step "python package (maturin)"
bash python/build.sh

# The quick benchmark suite needs only the binary, and neither it nor
# pytest keeps both CPUs busy: they run side by side. Its own process
# group, so that a failing pytest stops it and every process it started.
step "pytest, beside the benchmark suite in quick mode"
quick_log="$root/target/bench-quick.log"
setsid -w "$COREFARM_BIN" bench suite all --quick --out "$root/target/bench-quick" >"$quick_log" 2>&1 &
quick=$!
trap 'kill -- -"$quick" 2>/dev/null || true' EXIT
python3 -m pytest -q python/tests tests/peers tests/deploy bench/tests examples

step "Python API reference (pdoc: a warning or an undocumented public name fails)"
python3 python/docs/build.py "$root/target/python-docs"

step "benchmark suite, quick mode (its output)"
quick_rc=0
wait "$quick" || quick_rc=$?
trap - EXIT
cat "$quick_log"
if [ "$quick_rc" -ne 0 ]; then
    echo "the benchmark suite failed (exit status $quick_rc)" >&2
    exit "$quick_rc"
fi

step "all tests passed"
