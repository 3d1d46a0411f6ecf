#!/usr/bin/env bash
# Metrics overhead at full load (docs/benchmarks.md, "Metrics overhead").
#
#   bench/metrics_overhead.sh BASE_BIN METRICS_BIN PAIRS DURATION INPUT OUTPUT NODES
#
# BASE_BIN is best the same commit built with `--features
# corefarm-server/metrics-off` (the per-message hooks compiled out), so the
# pair differs in the metrics only.
# Each pair runs two clusters at the same time, so both see the same
# background load: BASE_BIN without metrics, METRICS_BIN with
# --metrics-listen on the server and the node managers and the server's
# /metrics scraped every second (which starts first alternates by pair).
# Each cluster gets its own benchmarking user
# (delay 0, as fast as it goes). One line per pair:
#   off INPUTS/S SERVER-US/MSG MISSING on INPUTS/S SERVER-US/MSG MISSING
set -euo pipefail
ABIN=$1 BBIN=$2 PAIRS=$3 DUR=$4 IN=$5 OUT=$6 NODES=$7
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
field() { grep -o "$1=[^ ]*" "$2" | head -1 | cut -d= -f2; }
for i in $(seq "$PAIRS"); do
    # Which variant starts first alternates, so an edge of the first (or
    # second) cluster started does not lean on one side.
    order="a b"
    [ $((i % 2)) -eq 0 ] && order="b a"
    pids=()
    for t in $order; do
        bin=$ABIN extra=()
        [ $t = b ] && bin=$BBIN extra=(--metrics-listen 127.0.0.1:0)
        "$bin" server --nodes-listen 127.0.0.1:0 --users-listen 127.0.0.1:0 "${extra[@]}" \
            > "$dir/$t.log" 2>/dev/null &
        echo $! > "$dir/$t.pid"
        pids+=($!)
    done
    for _ in $(seq 100); do
        grep -q listening "$dir/a.log" && grep -q listening "$dir/b.log" && break
        sleep 0.1
    done
    for t in $order; do
        bin=$ABIN extra=()
        [ $t = b ] && bin=$BBIN extra=(--metrics-listen 127.0.0.1:0)
        "$bin" node --server "$(field nodes "$dir/$t.log")" --count "$NODES" "${extra[@]}" \
            > /dev/null 2>&1 &
        pids+=($!)
    done
    metrics=$(field metrics "$dir/b.log")
    (while sleep 1; do curl -s -o /dev/null "http://$metrics/metrics"; done) &
    pids+=($!)
    users=()
    for t in $order; do
        bin=$ABIN
        [ $t = b ] && bin=$BBIN
        "$bin" bench user --server "$(field users "$dir/$t.log")" --json --nodes "$NODES" \
            --duration "$DUR" --warmup 1 --input-size "$IN" --output-size "$OUT" \
            --cpu-pid "server=$(cat "$dir/$t.pid")" > "$dir/$t.json" &
        users+=($!)
    done
    wait "${users[@]}"
    kill "${pids[@]}" 2>/dev/null || true
    wait "${pids[@]}" 2>/dev/null || true
    python3 - "$dir" <<'PY'
import json, sys
def row(t):
    d = json.load(open(f"{sys.argv[1]}/{t}.json"))
    rate, cpu = d["throughput"]["inputs_per_s"], d["cpu"][0]
    return rate, cpu["cpu_s"] / (rate * cpu["wall_s"]) * 1e6, d["counts"]["missing"]
print("off %.1f %.3f %d on %.1f %.3f %d" % (row("a") + row("b")))
PY
done
