#!/usr/bin/env bash
# check.sh -- the metrics document through the external parsers.
#
#   bash tests/metrics/check.sh EMIT_METRICS_BINARY WORK_DIR
#
# Writes the document of two awkwardly named pools (emit_metrics), then:
#   - `promtool check metrics` (Debian: prometheus) must exit 0 and print no
#     lint finding;
#   - prometheus_client's text parser and Python's json must read it and agree
#     with what the pools did (check_metrics.py; Debian: python3-prometheus-client).
# A missing tool skips (exit 77, CTest's SKIP_RETURN_CODE) with a message,
# unless TP_REQUIRE_METRICS_TOOLS=1 (tests/run.sh sets it after installing
# them), which makes it a failure.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
emit=$1
work=$2
mkdir -p "$work" || exit 1
prom=$work/metrics.prom
js=$work/metrics.json

skip() {
    if [ "${TP_REQUIRE_METRICS_TOOLS:-0}" = 1 ]; then
        echo "check.sh: FAIL: $* (TP_REQUIRE_METRICS_TOOLS=1)"
        exit 1
    fi
    echo "check.sh: SKIP: $*"
    exit 77
}

"$emit" "$prom" "$js" || { echo "check.sh: FAIL: emit_metrics failed"; exit 1; }

command -v promtool >/dev/null 2>&1 || skip "promtool not found (Debian package: prometheus)"
out=$(promtool check metrics <"$prom" 2>&1)
rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
    echo "check.sh: FAIL: promtool check metrics exited $rc:"
    echo "$out" | head -n 40
    exit 1
fi
echo "check.sh: promtool check metrics: exit 0, no findings ($(grep -c '' "$prom") lines)"

# The Debian module lives in the system python; another python3 may come first in PATH.
py=""
for cand in python3 /usr/bin/python3; do
    if command -v "$cand" >/dev/null 2>&1 && "$cand" -c 'import prometheus_client' 2>/dev/null; then
        py=$cand
        break
    fi
done
[ -n "$py" ] || skip "python3 prometheus_client not found (Debian package: python3-prometheus-client)"
"$py" "$here/check_metrics.py" "$prom" "$js"
