#!/usr/bin/env bash
# run.sh -- build the model-based fuzzer (clang, libFuzzer + ASan + UBSan) and
# run it for a bounded time, starting from the committed seed corpus.
#
#   bash tests/fuzz/run.sh [BUILD_DIR]          (default: build-fuzz/)
#
#   TP_FUZZ_SECONDS  total fuzzing time (default 90)
#   TP_FUZZ_TIMEOUT  seconds before one input counts as hung (default 60)
#   TP_FUZZ_FLAGS    more libFuzzer flags, e.g. "-len_control=0" (long inputs at once)
#
# New inputs found are kept in BUILD_DIR/corpus and reused by the next run; a
# crash or violation is saved as BUILD_DIR/crash-* and replays with
#   BUILD_DIR/fuzz_pool BUILD_DIR/crash-...
# Exits non-zero on any build failure, crash or violation. The last line is
# the summary: "fuzz: PASS: N operations in M inputs, 0 violations (S s)".
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${1:-$root/build-fuzz}
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac
secs=${TP_FUZZ_SECONDS:-90}
per_input=${TP_FUZZ_TIMEOUT:-60}

fail() { printf 'fuzz: FAIL: %s\n' "$*"; exit 1; }

mkdir -p "$dir/corpus" || fail "cannot create $dir"
command -v clang >/dev/null 2>&1 || fail "clang not found (apt-get install clang libclang-rt-dev)"

# One binary: the library sources and the harness, all instrumented.
flags=(-std=gnu11 -g -O1 -fno-omit-frame-pointer -Wall -Wextra -Wpedantic -Werror
    -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined
    -I"$root/include" -I"$root/src")
echo "fuzz: building $dir/fuzz_pool"
clang "${flags[@]}" "$root"/src/*.c "$here/fuzz_pool.c" "$here/fz_sched.c" -o "$dir/fuzz_pool" -pthread ||
    fail "build (is libclang-rt-dev, with libclang_rt.fuzzer, installed?)"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

# The seeds once through the replay path first: a harness or library change
# that breaks one fails here with the seed's name.
echo "fuzz: replaying the $(ls "$here/corpus" | wc -l) seeds"
leaks=()
"$dir/fuzz_pool" -runs=0 "$here/corpus" >"$dir/seeds.log" 2>&1
rc=$?
if [ "$rc" -ne 0 ] && grep -q "LeakSanitizer has encountered a fatal error" "$dir/seeds.log"; then
    # LSan needs ptrace-like access that some sandboxes deny.
    echo "fuzz: WARNING: LeakSanitizer does not work here; leak checks are off"
    export ASAN_OPTIONS=${ASAN_OPTIONS//detect_leaks=1/detect_leaks=0}
    leaks=(-detect_leaks=0)
    "$dir/fuzz_pool" -runs=0 "${leaks[@]}" "$here/corpus" >"$dir/seeds.log" 2>&1
    rc=$?
fi
[ "$rc" -eq 0 ] || {
    tail -n 60 "$dir/seeds.log"
    fail "a seed input fails (see $dir/seeds.log)"
}

echo "fuzz: fuzzing for $secs s"
t0=$SECONDS
# New inputs go to the first directory; the committed seeds are read only.
read -r -a extra <<<"${TP_FUZZ_FLAGS:-}"
(cd "$dir" && ./fuzz_pool "${leaks[@]}" "${extra[@]}" -max_total_time="$secs" -timeout="$per_input" -max_len=512 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$dir/" \
    "$dir/corpus" "$here/corpus") >"$dir/fuzz.log" 2>&1
rc=$?
grep -E '^(#[0-9]+.*(DONE|pulse)|stat::number_of_executed_units|stat::peak_rss)' "$dir/fuzz.log" | tail -n 4
counts=$(grep -E '^fuzz_pool: [0-9]+ operations in [0-9]+ inputs' "$dir/fuzz.log" | tail -n 1 | sed 's/^fuzz_pool: //')
if [ "$rc" -ne 0 ]; then
    grep -A 80 -E 'VIOLATION|ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer)|runtime error' "$dir/fuzz.log" | head -n 120
    ls "$dir"/crash-* "$dir"/timeout-* "$dir"/leak-* 2>/dev/null
    last=$(grep -E '^fuzz_pool: progress: ' "$dir/fuzz.log" | tail -n 1 | sed 's/^fuzz_pool: progress: //')
    fail "libFuzzer exited with $rc after $((SECONDS - t0)) s${last:+ (before it: $last without a violation)}; log: $dir/fuzz.log"
fi
[ -n "$counts" ] || fail "no operation count in $dir/fuzz.log"
echo "fuzz: PASS: $counts ($((SECONDS - t0)) s)"
