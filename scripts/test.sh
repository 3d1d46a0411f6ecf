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
# A job run beside the others in its own process group (started with
# setsid -w, its PID in $1, killed by the EXIT trap if the script fails
# first): waits for it, prints its log ($2), and fails as it did, naming it ($3).
finish() {
    local rc=0
    wait "$1" || rc=$?
    trap - EXIT
    cat "$2"
    if [ "$rc" -ne 0 ]; then
        echo "$3 failed (exit status $rc)" >&2
        exit "$rc"
    fi
}

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
# The soak campaign is one test that lasts a minute of wall time on a
# fraction of the CPUs: it runs beside the others rather than after them.
# Cargo holds its build directory while tests run, so the campaign's test
# binary runs by itself (from its package's directory, as cargo would),
# its path read from cargo's messages, in its own process group.
soak_test=soak::short_campaign_with_authentication_loses_nothing
cli_tests="$(cargo test --workspace --profile "$COREFARM_PROFILE" --no-run --message-format=json-render-diagnostics |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "cli" and m["profile"]["test"]:
        print(m["executable"])')"
soak_log="$CARGO_TARGET_DIR/soak-test.log"
(cd crates/cli && exec setsid -w "$cli_tests" --exact "$soak_test") >"$soak_log" 2>&1 &
soak=$!
trap 'kill -- -"$soak" 2>/dev/null || true' EXIT
cargo test --workspace --profile "$COREFARM_PROFILE" -- --skip "$soak_test"
finish "$soak" "$soak_log" "the soak campaign test"
if ! grep -q "test result: ok. 1 passed" "$soak_log"; then
    echo "the soak campaign test ($soak_test) did not run: renamed? update scripts/test.sh" >&2
    exit 1
fi

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
finish "$quick" "$quick_log" "the benchmark suite"

step "all tests passed"
