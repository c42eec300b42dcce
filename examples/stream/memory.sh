#!/usr/bin/env bash
# memory.sh -- Redis memory and worker RSS after N entries went through
# taskpool-stream-worker, unbounded and with the bounding settings.
#
#   bash examples/stream/memory.sh [BUILD_DIR]     (default: build)
#
# Environment: N (entries, default 1000000). Needs redis-server, redis-cli.
# One redis-server on a unix socket in a temporary directory, no persistence.
# For each configuration: FLUSHALL, N no-op entries (no user, work 0), one
# worker (WORKERS=4) until the group has read every entry and nothing is
# pending, then Redis's used_memory and the worker's peak RSS (VmHWM).
set -euo pipefail

build=${1:-build}
worker=$build/examples/taskpool-stream-worker
enqueue=$build/examples/taskpool-enqueue
N=${N:-1000000}
for t in "$worker" "$enqueue"; do
    [ -x "$t" ] || { echo "memory.sh: $t not built (cmake --build $build)" >&2; exit 1; }
done
dir=$(mktemp -d /tmp/tp-stream-memory.XXXXXX)
sock=$dir/redis.sock
wpid=
cleanup() {
    [ -n "$wpid" ] && { kill -KILL "$wpid" 2>/dev/null || true; wait "$wpid" 2>/dev/null || true; }
    [ -n "${redis_pid:-}" ] && { kill -TERM "$redis_pid" 2>/dev/null || true; wait "$redis_pid" 2>/dev/null || true; }
    rm -rf "$dir"
}
trap cleanup EXIT
redis-server --port 0 --unixsocket "$sock" --dir "$dir" --save '' --appendonly no \
    --logfile "$dir/redis.log" --daemonize no &
redis_pid=$!
rc() { redis-cli -s "$sock" "$@"; }
for _ in $(seq 100); do rc PING >/dev/null 2>&1 && break; sleep 0.1; done
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
used() { rc INFO memory | tr -d '\r' | sed -n 's/^used_memory:\(.*\)/\1/p'; }
# entries the group has not read yet plus those pending
left() {
    local got pend
    got=$(rc XINFO GROUPS tasks | tr -d '\r' | awk 'p {print; exit} $0 == "entries-read" {p = 1}')
    pend=$(rc XPENDING tasks taskpool | head -n 1)
    echo $((N - ${got:-0} + pend))
}

echo "redis-server $(rc INFO server | tr -d '\r' | sed -n 's/^redis_version://p'), $N no-op entries, 1 worker (WORKERS=4)"
echo
echo "| configuration | STREAM entries | results kept | Redis used_memory | worker peak RSS | seconds |"
echo "|---|---:|---:|---:|---:|---:|"
run() { # $1 = label, then worker environment
    local label=$1 t0 t1 hwm
    shift
    rc FLUSHALL >/dev/null
    REDIS_URL=unix://$sock "$enqueue" --count "$N" --users 0 --work 0 >/dev/null
    local before
    before=$(used)
    t0=$(date +%s.%N)
    env REDIS_URL=unix://$sock WORKERS=4 QUEUE_CAPACITY=256 "$@" "$worker" >"$dir/worker.log" 2>&1 &
    wpid=$!
    while [ "$(left)" != 0 ]; do sleep 0.2; done
    t1=$(date +%s.%N)
    sleep 2 # one more TRIM_INTERVAL (1s) for the last trim
    hwm=$(awk '/^VmHWM/ {print $2 * 1024}' "/proc/$wpid/status")
    kill -TERM "$wpid"
    wait "$wpid" || echo "memory.sh: worker exit $?" >&2
    wpid=
    echo "| $label | $(rc XLEN tasks) | $(rc XLEN tasks:done) | $(mib "$(used)") MiB (entries alone: $(mib "$before") MiB) | $(mib "$hwm") MiB | $(awk -v a="$t0" -v b="$t1" 'BEGIN {printf "%.1f", b - a}') |"
}
run "unbounded (defaults)"
run "TRIM_DONE=1, RESULTS_MAXLEN=10000, DEAD_MAXLEN=1000" TRIM_DONE=1 TRIM_INTERVAL=1s RESULTS_MAXLEN=10000 DEAD_MAXLEN=1000
