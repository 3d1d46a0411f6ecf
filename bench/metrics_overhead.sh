#!/usr/bin/env bash
# Metrics overhead at full load (docs/benchmarks.md, "Metrics overhead").
#
#   bench/metrics_overhead.sh [--sequential] BASE_BIN METRICS_BIN PAIRS DURATION INPUT OUTPUT NODES
#
# BASE_BIN is best the same commit built with `--features
# corefarm-server/metrics-off` (the per-message hooks compiled out), so the
# pair differs in the metrics only: BASE_BIN without metrics, METRICS_BIN
# with --metrics-listen on the server and the node managers and the
# server's /metrics scraped every second. Each cluster gets its own
# benchmarking user (delay 0, as fast as it goes).
#
# By default a pair runs both clusters at the same time, so both see the
# same background load; on a quiet machine that is the noisier design (the
# two clusters share the CPUs and one can crowd out the other), and
# --sequential runs them one after the other, alone on the machine. Either
# way which variant goes first alternates by pair, so an edge of the first
# (or second) run does not lean on one side. One line per pair:
#   off INPUTS/S SERVER-US/MSG MISSING on INPUTS/S SERVER-US/MSG MISSING
set -euo pipefail
SEQ=0
if [ "${1:-}" = --sequential ]; then
    SEQ=1
    shift
fi
ABIN=$1 BBIN=$2 PAIRS=$3 DUR=$4 IN=$5 OUT=$6 NODES=$7
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
field() { grep -o "$1=[^ ]*" "$2" | head -1 | cut -d= -f2; }

# Variant t (a = without metrics, b = with): its binary and extra flags.
variant() {
    bin=$ABIN extra=()
    if [ "$1" = b ]; then bin=$BBIN extra=(--metrics-listen 127.0.0.1:0); fi
}

# Starts the servers of the variants given, then their node managers, and
# for b the scraper; their pids go to `pids`.
start() {
    for t in "$@"; do
        variant "$t"
        "$bin" server --nodes-listen 127.0.0.1:0 --users-listen 127.0.0.1:0 "${extra[@]}" \
            > "$dir/$t.log" 2>/dev/null &
        echo $! > "$dir/$t.pid"
        pids+=($!)
    done
    for t in "$@"; do
        for _ in $(seq 100); do
            grep -q listening "$dir/$t.log" && break
            sleep 0.1
        done
    done
    for t in "$@"; do
        variant "$t"
        "$bin" node --server "$(field nodes "$dir/$t.log")" --count "$NODES" "${extra[@]}" \
            > /dev/null 2>&1 &
        pids+=($!)
        if [ "$t" = b ]; then
            metrics=$(field metrics "$dir/b.log")
            # One process scrapes every second, as Prometheus would from
            # elsewhere: a curl started per scrape cost this machine more
            # CPU (process start-up) than the scrape itself.
            python3 -c '
import sys, time, urllib.request
while True:
    time.sleep(1)
    urllib.request.urlopen(sys.argv[1]).read()
' "http://$metrics/metrics" 2>/dev/null &
            pids+=($!)
        fi
    done
}

# Runs the benchmarking users of the variants given, at the same time.
measure() {
    users=()
    for t in "$@"; do
        variant "$t"
        "$bin" bench user --server "$(field users "$dir/$t.log")" --json --nodes "$NODES" \
            --duration "$DUR" --warmup 1 --input-size "$IN" --output-size "$OUT" \
            --cpu-pid "server=$(cat "$dir/$t.pid")" > "$dir/$t.json" &
        users+=($!)
    done
    wait "${users[@]}"
}

stop() {
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    pids=()
}

pids=()
for i in $(seq "$PAIRS"); do
    order="a b"
    [ $((i % 2)) -eq 0 ] && order="b a"
    if [ $SEQ = 1 ]; then
        for t in $order; do
            start "$t"
            measure "$t"
            stop
        done
    else
        # shellcheck disable=SC2086
        start $order
        # shellcheck disable=SC2086
        measure $order
        stop
    fi
    python3 - "$dir" <<'PY'
import json, sys
def row(t):
    d = json.load(open(f"{sys.argv[1]}/{t}.json"))
    rate, cpu = d["throughput"]["inputs_per_s"], d["cpu"][0]
    return rate, cpu["cpu_s"] / (rate * cpu["wall_s"]) * 1e6, d["counts"]["missing"]
print("off %.1f %.3f %d on %.1f %.3f %d" % (row("a") + row("b")))
PY
done
