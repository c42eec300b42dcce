#!/usr/bin/env bash
# bench.sh -- end-to-end entries/s of taskpool-stream-worker for no-op
# entries, next to redis-benchmark XADD and BullMQ on the same redis-server.
#
#   bash examples/stream/bench.sh [BUILD_DIR]     (default: build)
#
# Environment: N (entries per run, and jobs per BullMQ run: the same number
# for both systems; default 100000), CONC (concurrencies, default "4 16"),
# ROUNDS (runs of each configuration, the median is reported; default 3),
# NO_BULLMQ=1 to skip BullMQ. Needs redis-server, redis-cli, redis-benchmark, and node + npm
# for BullMQ (installed into a scratch directory under /tmp, never the repo).
#
# One redis-server 7 on a unix socket in a temporary directory, no
# persistence. For each concurrency C (pool WORKERS = C, BullMQ concurrency
# = C): N no-op entries (no user, work 0) are enqueued first, then 1 or 2
# workers start and the clock runs until the results stream holds N entries.
# Redis commands per entry come from INFO commandstats over the worker run.
# Everything runs under nice -n 10.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
build=${1:-build}
worker=$build/examples/taskpool-stream-worker
enqueue=$build/examples/taskpool-enqueue
N=${N:-100000}
CONC=${CONC:-"4 16"}
ROUNDS=${ROUNDS:-3}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }
for t in "$worker" "$enqueue"; do
    [ -x "$t" ] || { echo "bench.sh: $t not built (cmake --build $build)" >&2; exit 1; }
done
for t in redis-server redis-cli redis-benchmark; do
    command -v $t >/dev/null || { echo "bench.sh: $t not found (apt-get install redis-server redis-tools)" >&2; exit 1; }
done

dir=$(mktemp -d /tmp/tp-stream-bench.XXXXXX)
sock=$dir/redis.sock
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    [ -n "${redis_pid:-}" ] && { kill -TERM "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; }
    rm -rf "$dir"
}
trap cleanup EXIT

redis-server --port 0 --unixsocket "$sock" --dir "$dir" --save '' --appendonly no \
    --logfile "$dir/redis.log" --daemonize no &
redis_pid=$!
for _ in $(seq 100); do redis-cli -s "$sock" PING >/dev/null 2>&1 && break; sleep 0.1; done
rc() { redis-cli -s "$sock" "$@"; }
echo "redis-server $(rc INFO server | sed -n 's/^redis_version:\([^\r]*\).*/\1/p') on a unix socket; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"

now() { date +%s.%N; }
# Redis commands executed since the last CONFIG RESETSTAT, without our probes.
commands() {
    rc INFO commandstats | tr -d '\r' |
        awk -F'[:=,]' '/^cmdstat_/ && $1 !~ /(xlen|config|info|ping|client|hello|select)/ {s += $3} END {print s + 0}'
}

# ---------------------------------------------------------------- redis-benchmark
echo
echo "| redis-benchmark XADD | requests/s |"
echo "|---|---:|"
for P in 1 16; do
    out=$(nice -n 10 redis-benchmark -s "$sock" -n 200000 -c 50 -P $P -q XADD bench '*' f v 2>/dev/null | tr '\r' '\n' | grep -E 'requests per second' | tail -n 1)
    echo "| 50 clients, -P $P | $(sed -E 's/.*: ([0-9.]+) requests per second.*/\1/' <<<"$out") |"
done
rc DEL bench >/dev/null

# ---------------------------------------------------------------- taskpool-stream-worker
run_workers() { # $1 = workers, $2 = concurrency -> "entries/s commands/entry"
    local nw=$1 c=$2 t0 t1 i
    rc FLUSHALL >/dev/null
    REDIS_URL=unix://$sock nice -n 10 "$enqueue" --count "$N" --users 0 --work 0 >/dev/null
    rc CONFIG RESETSTAT >/dev/null
    pids=()
    t0=$(now)
    for ((i = 0; i < nw; i++)); do
        REDIS_URL=unix://$sock WORKERS=$c QUEUE_CAPACITY=256 CONSUMER=bench-$i \
            nice -n 10 "$worker" >"$dir/worker-$i.log" 2>&1 &
        pids+=($!)
    done
    while [ "$(rc XLEN tasks:done)" -lt "$N" ]; do sleep 0.01; done
    t1=$(now)
    local cmds
    cmds=$(commands)
    for p in "${pids[@]}"; do kill -TERM "$p"; wait "$p" || echo "bench.sh: worker exit $?" >&2; done
    pids=()
    [ "$(rc XPENDING tasks taskpool | head -n 1)" = 0 ] || echo "bench.sh: entries left pending" >&2
    awk -v n="$N" -v a="$t0" -v b="$t1" -v k="$cmds" 'BEGIN {printf "%.0f %.2f", n / (b - a), k / n}'
}

echo
echo "| taskpool-stream-worker, $N no-op entries | concurrency | entries/s | Redis commands per entry |"
echo "|---|---:|---:|---:|"
for c in $CONC; do
    for nw in 1 2; do
        rates=() per=
        for ((r = 0; r < ROUNDS; r++)); do
            read -r rate per <<<"$(run_workers $nw $c)"
            rates+=("$rate")
        done
        echo "| $nw worker$([ $nw = 1 ] || echo s) (WORKERS=$c each) | $c | $(printf '%s\n' "${rates[@]}" | median) (runs: ${rates[*]}) | $per |"
    done
done
echo
echo "Commands per entry, last run: $(rc INFO commandstats | tr -d '\r' | grep -E 'cmdstat_(x|eval|type)' | sed -E 's/cmdstat_([^:]+):calls=([0-9]+).*/\1=\2/' | paste -sd' ')"

# ---------------------------------------------------------------- BullMQ
if [ "${NO_BULLMQ:-0}" != 1 ]; then
    if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
        echo "bench.sh: node/npm not found: BullMQ skipped" >&2
        exit 0
    fi
    scratch=${BULLMQ_DIR:-/tmp/stream-bench-bullmq}
    mkdir -p "$scratch"
    cp "$here/bullmq/package.json" "$here/bullmq/bench-bullmq.mjs" "$scratch/"
    [ -d "$scratch/node_modules/bullmq" ] || (cd "$scratch" && npm install --no-audit --no-fund --silent)
    echo
    echo "| BullMQ $(sed -n 's/.*"version": "\([^"]*\)".*/\1/p' "$scratch/node_modules/bullmq/package.json"), $N no-op jobs | concurrency | jobs/s | addBulk jobs/s | Redis commands per job |"
    echo "|---|---:|---:|---:|---:|"
    for c in $CONC; do
        jpss=() apss=()
        for ((r = 0; r < ROUNDS; r++)); do
            rc FLUSHALL >/dev/null
            rc CONFIG RESETSTAT >/dev/null
            out=$(cd "$scratch" && nice -n 10 node bench-bullmq.mjs "$sock" "$N" "$c")
            cmds=$(commands)
            jpss+=("$(sed -E 's/.*"jobs_per_s":([0-9]+).*/\1/' <<<"$out")")
            apss+=("$(sed -E 's/.*"add_per_s":([0-9]+).*/\1/' <<<"$out")")
        done
        jps=$(printf '%s\n' "${jpss[@]}" | median)
        aps=$(printf '%s\n' "${apss[@]}" | median)
        echo "| 1 worker | $c | $jps (runs: ${jpss[*]}) | $aps | $(awk -v k="$cmds" -v n="$N" 'BEGIN {printf "%.1f", k / n}') (adds included) |"
    done
fi
