#!/usr/bin/env bash
# Reproduces the table in docs/cowork.md: builds the matrix-multiplier image,
# starts `corefarm local` (a server and NODES simulated nodes in one process)
# and runs the client's co-working example against it, which times
# all-local, all-cluster and co-worked runs at each N and checks that the
# three give the same bytes.
#
#   examples/cowork/bench.sh [N...]      # default N: 4 16 64 256 1024
#   NODES=2 THREADS=2 examples/cowork/bench.sh 64 256
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
target="${CARGO_TARGET_DIR:-$root/target}"
cargo build --release -q -p corefarm-cli
cargo build --release -q -p corefarm-client --example cowork
bin="$target/release/corefarm"
tmp="$(mktemp -d)"
pid=""
cleanup() {
    if [ -n "$pid" ]; then kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; fi
    rm -rf "$tmp"
}
trap cleanup EXIT
"$bin" image build --hls cores/matmul/matmul.cpp --entry mat_mul_64x64 \
    --input-size 32768 --output-size 16384 --cores 2 -o "$tmp/matmul.cfimg" >&2
"$bin" local --nodes "${NODES:-2}" --nodes-listen 127.0.0.1:0 --users-listen 127.0.0.1:0 \
    >"$tmp/local.out" 2>"$tmp/local.err" &
pid=$!
users=""
for _ in $(seq 600); do
    users="$(sed -n 's/.*users=\([^ ]*\).*/\1/p' "$tmp/local.out" | head -1)"
    [ -n "$users" ] && break
    kill -0 "$pid" 2>/dev/null || { cat "$tmp/local.err" >&2; exit 1; }
    sleep 0.1
done
[ -n "$users" ] || { echo "corefarm local did not start" >&2; exit 1; }
"$target/release/examples/cowork" "$tmp/matmul.cfimg" "$users" "${THREADS:-2}" "$@"
