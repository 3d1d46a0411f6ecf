#!/usr/bin/env bash
# What the metrics cost in server instructions per forwarded message
# (docs/benchmarks.md, "Metrics overhead"): the count does not depend on
# what else the machine runs, unlike throughput on 2 shared CPUs.
#
#   bench/metrics_instructions.sh OFF_BIN ON_BIN ROUNDS IN OUT NODES RATE
#
# OFF_BIN: `corefarm` built with `--features corefarm-server/metrics-off`
# (the per-message hooks compiled out); ON_BIN: the same commit built
# normally, its server with --metrics-listen and scraped every second.
# Each round runs both, alternating: the server under callgrind, native
# node managers and a benchmarking user at RATE messages per second (below
# what the server manages under callgrind, so both variants see the same
# load and batch alike; at full speed the batches, hence the instructions
# per message, vary by ~10 % from run to run). The instructions are
# counted over 8 s inside the user's measurement window and divided by
# the messages it measured in that time. One line per run:
#   off|on MESSAGES/S INSTRUCTIONS/MESSAGE
set -euo pipefail
OFF=$1 ON=$2 ROUNDS=$3 IN=$4 OUT=$5 NODES=$6 RATE=$7
command -v valgrind >/dev/null || { echo "needs valgrind (apt-get install valgrind)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
field() { grep -o "$1=[^ ]*" "$2" | head -1 | cut -d= -f2; }
run() {
    local t=$1 bin=$2 extra=()
    [ "$t" = on ] && extra=(--metrics-listen 127.0.0.1:0)
    rm -f "$dir"/cg.* "$dir/srv.log"
    valgrind --tool=callgrind --callgrind-out-file="$dir/cg.out" \
        "$bin" server --nodes-listen 127.0.0.1:0 --users-listen 127.0.0.1:0 "${extra[@]}" \
        > "$dir/srv.log" 2> "$dir/vg.log" &
    local srv=$! pids=()
    for _ in $(seq 300); do grep -q listening "$dir/srv.log" && break; sleep 0.1; done
    "$bin" node --server "$(field nodes "$dir/srv.log")" --count "$NODES" "${extra[@]}" \
        > /dev/null 2>&1 &
    pids+=($!)
    if [ "$t" = on ]; then
        local m
        m=$(field metrics "$dir/srv.log")
        (while sleep 1; do curl -s -o /dev/null "http://$m/metrics"; done) &
        pids+=($!)
    fi
    "$bin" bench user --server "$(field users "$dir/srv.log")" --json --nodes "$NODES" \
        --warmup 3 --duration 10 --input-size "$IN" --output-size "$OUT" --rate-hz "$RATE" \
        > "$dir/user.json" &
    local user=$!
    # Inside the user's window (3 s warm-up, 10 s measured): zero at 4 s, dump at 12 s.
    sleep 4
    callgrind_control -z "$srv" > /dev/null 2>&1
    sleep 8
    callgrind_control -d "$srv" > /dev/null 2>&1
    wait "$user"
    kill "${pids[@]}" 2>/dev/null || true
    kill -INT "$srv" 2>/dev/null || true
    wait 2>/dev/null || true
    python3 - "$dir" "$t" <<'PY'
import glob, json, sys
d, t = sys.argv[1], sys.argv[2]
u = json.load(open(f"{d}/user.json"))
rate = u["throughput"]["inputs_per_s"]
# The dump callgrind_control -d asked for: the one besides the final cg.out.
dumps = [p for p in glob.glob(f"{d}/cg.out*") if p != f"{d}/cg.out"]
ir = 0
for line in open(sorted(dumps)[0]):
    if line.startswith("summary:") or line.startswith("totals:"):
        ir = int(line.split()[1])
        break
print("%s %.1f %.0f" % (t, rate, ir / (rate * 8.0)))
PY
}
for _ in $(seq "$ROUNDS"); do
    run off "$OFF"
    run on "$ON"
done
