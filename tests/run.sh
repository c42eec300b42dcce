#!/usr/bin/env bash
# run.sh -- build libtaskpool and run every test, four ways; then fuzz it.
#
#   bash tests/run.sh [plain|tsan|asan|valgrind|fuzz ...]  (default: all five)
#
# After the full pass, the racy tests run again TP_REPEAT times (default 10;
# under tsan TP_REPEAT_TSAN, default 30).
#
#   plain     gcc, RelWithDebInfo with assertions kept, -Werror; also installs,
#             checks the man pages, packs and checks the .deb files, builds
#             a parent project that vendors the library, checks the ABI
#             (abidiff, a 1.0 binary) and the formatting (clang-format)
#   tsan      clang, ThreadSanitizer, -Werror
#   asan      gcc, AddressSanitizer + LeakSanitizer + UBSan, -Werror
#   valgrind  gcc as plain; every unit test under valgrind memcheck, which must
#             report no error and no leak (TP_TEST_SLOWDOWN=4 for the tests)
#   fuzz      clang, libFuzzer + ASan + UBSan: the model-based fuzzer of
#             tests/fuzz/ for TP_FUZZ_SECONDS (default 90; 600 when the
#             environment variable CI is set, as .ci/run does: windows of a
#             few microseconds need tens of thousands of inputs), after the
#             others
#
# Works on a fresh Debian/Ubuntu machine: missing tools and cmocka are
# installed with apt-get (through sudo when not root). Build trees go to
# $TP_CI_DIR/<mode> (default build-ci/ in the repository, reused between runs;
# TP_CI_CLEAN=1 starts them afresh). Exits non-zero when any step of any mode
# fails; the last lines are one summary line per mode.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
ci_dir=${TP_CI_DIR:-build-ci}
case $ci_dir in /*) ;; *) ci_dir=$root/$ci_dir ;; esac
jobs=$(nproc 2>/dev/null || echo 2)

log() { printf '\n=== run.sh: %s\n' "$*"; }
die() { printf 'run.sh: %s\n' "$*" >&2; exit 1; }

# ------------------------------------------------------------------ modes
modes=()
for m in "$@"; do
    case $m in
    plain | tsan | asan | valgrind | fuzz) modes+=("$m") ;;
    -h | --help) sed -n '2,27p' "$0"; exit 0 ;;
    *) die "unknown mode '$m' (expected plain, tsan, asan, valgrind or fuzz)" ;;
    esac
done
[ ${#modes[@]} -gt 0 ] || modes=(plain tsan asan valgrind fuzz)
wants() { [[ " ${modes[*]} " == *" $1 "* ]]; }

# ------------------------------------------------------------------ dependencies
have_cmocka() {
    { command -v pkg-config >/dev/null 2>&1 && pkg-config --exists cmocka; } ||
        [ -f /usr/include/cmocka.h ]
}
have_tsan_runtime() {
    local dir
    dir=$(clang -print-runtime-dir 2>/dev/null) || return 1
    [ -e "$dir/libclang_rt.tsan-$(uname -m).a" ] || [ -e "$dir/libclang_rt.tsan.a" ]
}
have_fuzzer_runtime() {
    local dir
    dir=$(clang -print-runtime-dir 2>/dev/null) || return 1
    [ -e "$dir/libclang_rt.fuzzer-$(uname -m).a" ] || [ -e "$dir/libclang_rt.fuzzer.a" ]
}
# The Redis Streams example (examples/stream/) and its process-level tests.
have_stream_deps() {
    [ -f /usr/include/hiredis/hiredis.h ] && command -v redis-server >/dev/null 2>&1 &&
        command -v python3 >/dev/null 2>&1
}
# The event-loop examples (examples/loop/): taskpool-loop-uv needs libuv; the
# loop_* process tests need python3.
have_loop_deps() {
    [ -f /usr/include/uv.h ] && command -v python3 >/dev/null 2>&1
}
have_prom_client() {
    local py
    for py in python3 /usr/bin/python3; do
        command -v "$py" >/dev/null 2>&1 && "$py" -c 'import prometheus_client' 2>/dev/null && return 0
    done
    return 1
}
missing_deps() {
    local c
    for c in cmake make gcc pkg-config; do command -v "$c" >/dev/null 2>&1 || return 0; done
    have_cmocka || return 0
    have_stream_deps || return 0
    have_loop_deps || return 0
    if wants plain; then
        command -v abidw >/dev/null 2>&1 || return 0 # the ABI baseline check
        command -v clang-format >/dev/null 2>&1 || return 0 # the clang_format check
        command -v git >/dev/null 2>&1 || return 0   # the previous release, for the old-binary check
    fi
    if wants tsan; then
        command -v clang >/dev/null 2>&1 || return 0
        have_tsan_runtime || return 0
    fi
    if wants fuzz; then
        command -v clang >/dev/null 2>&1 || return 0
        have_fuzzer_runtime || return 0
    fi
    if wants valgrind; then
        command -v valgrind >/dev/null 2>&1 || return 0
    fi
    # The man pages are built in every mode; plain also installs them, packs
    # the .deb files and checks both (man_pages, deb_packages).
    command -v scdoc >/dev/null 2>&1 || return 0
    if wants plain; then
        for c in man dpkg-deb dpkg-shlibdeps lintian; do command -v "$c" >/dev/null 2>&1 || return 0; done
    fi
    # tests/metrics/check.sh: tp_metrics_format through promtool and prometheus_client
    command -v promtool >/dev/null 2>&1 || return 0
    have_prom_client || return 0
    return 1
}

if missing_deps; then
    log "installing build dependencies with apt-get"
    command -v apt-get >/dev/null 2>&1 ||
        die "missing tools and no apt-get: install cmake, make, gcc, clang, pkg-config and cmocka"
    sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        command -v sudo >/dev/null 2>&1 || die "not root and no sudo: cannot install dependencies"
        sudo=(sudo)
    fi
    pkgs=(libcmocka-dev cmake make gcc libc6-dev pkg-config scdoc prometheus python3-prometheus-client)
    wants plain && pkgs+=(man-db dpkg-dev lintian)
    # examples/stream/ and its stream_* tests: hiredis, a real redis-server, python3
    pkgs+=(libhiredis-dev redis-server python3)
    # examples/loop/ (taskpool-loop-uv) and its loop_* tests: libuv
    pkgs+=(libuv1-dev)
    # clang's sanitizer runtimes are only "recommended" by clang on Debian 12.
    { wants tsan || wants fuzz; } && pkgs+=(clang libclang-rt-dev)
    wants valgrind && pkgs+=(valgrind)
    wants plain && pkgs+=(abigail-tools git clang-format)
    export DEBIAN_FRONTEND=noninteractive
    "${sudo[@]}" apt-get update -q || die "apt-get update failed"
    "${sudo[@]}" apt-get install -y -q "${pkgs[@]}" || die "apt-get install failed"
    missing_deps && die "dependencies still missing after apt-get install"
fi

# ------------------------------------------------------------------ sanitizer runtime options
export TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1}
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The metrics parsers were installed above: their test must not skip here.
export TP_REQUIRE_METRICS_TOOLS=1
export CTEST_OUTPUT_ON_FAILURE=1

probe_dir=$ci_dir/probe
mkdir -p "$probe_dir" || die "cannot create $probe_dir"

# Commands that run the tests of a mode are prefixed with this (see probe_tsan).
tsan_wrap=()

# clang 14's ThreadSanitizer aborts with "unexpected memory mapping" when the
# kernel randomises mmap with more than 28 bits. Make sure it works here, and
# that it reports a real race, before trusting a clean run.
probe_tsan() {
    cat >"$probe_dir/race.c" <<'EOF'
#include <pthread.h>
static int shared;
static void *bump(void *a) { (void)a; shared++; return 0; }
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, bump, 0);
    shared++;
    pthread_join(t, 0);
    return 0;
}
EOF
    clang -fsanitize=thread -g -O1 -o "$probe_dir/race" "$probe_dir/race.c" -pthread ||
        { echo "run.sh: clang cannot build with -fsanitize=thread" >&2; return 1; }
    local out
    out=$("$probe_dir/race" 2>&1)
    if grep -q "unexpected memory mapping" <<<"$out"; then
        local bits
        bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null || echo "?")
        echo "run.sh: TSan cannot map its shadow here (vm.mmap_rnd_bits=$bits)"
        if [ "$(id -u)" -eq 0 ] && sysctl -w vm.mmap_rnd_bits=28 >/dev/null 2>&1; then
            echo "run.sh: set vm.mmap_rnd_bits=28"
        else
            echo "run.sh: running the TSan tests under 'setarch $(uname -m) -R' (no ASLR)"
            tsan_wrap=(setarch "$(uname -m)" -R)
        fi
        out=$("${tsan_wrap[@]}" "$probe_dir/race" 2>&1)
    fi
    if ! grep -q "WARNING: ThreadSanitizer: data race" <<<"$out"; then
        printf 'run.sh: TSan did not report the probe race; its output:\n%s\n' "$out" >&2
        return 1
    fi
    echo "run.sh: TSan works (probe race reported)"
}

# Same idea for ASan: it must catch an overflow, and LeakSanitizer a leak
# (LSan needs ptrace-like access some sandboxes deny: then leaks go unchecked).
probe_asan() {
    cat >"$probe_dir/overflow.c" <<'EOF'
#include <stdlib.h>
int main(int argc, char **argv) {
    (void)argv;
    char *p = malloc(4);
    p[argc + 3] = 1;
    free(p);
    return 0;
}
EOF
    cat >"$probe_dir/leak.c" <<'EOF'
#include <stdlib.h>
void *volatile sink;
int main(void) {
    sink = malloc(64);
    sink = 0;
    return 0;
}
EOF
    local out
    if ! gcc -fsanitize=address,undefined -g -O0 -o "$probe_dir/overflow" "$probe_dir/overflow.c" ||
        ! gcc -fsanitize=address,undefined -g -O0 -o "$probe_dir/leak" "$probe_dir/leak.c"; then
        echo "run.sh: gcc cannot build with -fsanitize=address,undefined" >&2
        return 1
    fi
    out=$(ASAN_OPTIONS=detect_leaks=0 "$probe_dir/overflow" 2>&1)
    if ! grep -q "heap-buffer-overflow" <<<"$out"; then
        printf 'run.sh: ASan did not report the probe overflow; its output:\n%s\n' "$out" >&2
        return 1
    fi
    out=$(ASAN_OPTIONS=detect_leaks=1 "$probe_dir/leak" 2>&1)
    if ! grep -q "detected memory leaks" <<<"$out"; then
        printf 'run.sh: WARNING: LeakSanitizer does not work here; leak checks are off:\n%s\n' "$out" >&2
        export ASAN_OPTIONS=${ASAN_OPTIONS//detect_leaks=1/detect_leaks=0}
        return 0
    fi
    echo "run.sh: ASan and LeakSanitizer work (probe overflow and leak reported)"
}

# ------------------------------------------------------------------ one mode
declare -A result why
# The fuzzer has its own script; its last line is "fuzz: PASS: N operations ...".
run_fuzz() {
    [ -n "${CI:-}" ] && export TP_FUZZ_SECONDS=${TP_FUZZ_SECONDS:-600}
    log "fuzz: model-based fuzzing, ${TP_FUZZ_SECONDS:-90} s (tests/fuzz/run.sh)"
    bash "$root/tests/fuzz/run.sh" "$ci_dir/fuzz" 2>&1 | tee "$ci_dir/fuzz.log"
    local rc=${PIPESTATUS[0]} line
    line=$(grep -E '^fuzz: (PASS|FAIL)' "$ci_dir/fuzz.log" | tail -n 1)
    result[fuzz]=${line#fuzz: }
    [ -n "$line" ] || result[fuzz]="FAIL (tests/fuzz/run.sh exited with $rc)"
    return "$rc"
}

run_mode() {
    local mode=$1 cc san=() wrap=() flags dir=$ci_dir/$1 t0 select=()
    [ "$mode" = fuzz ] && { run_fuzz; return; }
    case $mode in
    plain) cc=gcc flags="-O2 -g" ;;
    valgrind)
        # Every test executable runs under memcheck (CTest prefixes the
        # emulator); the non-unit tests (install, exports, bench) are left to
        # the other modes. --fair-sched: memcheck runs one thread at a time,
        # and its default hand-over can leave a pool's worker without a turn
        # for many seconds while the test's thread polls on a busy machine
        # (test_lane0_started_is_a_counter); fair scheduling hands the lock
        # over in order (try: where the machine cannot, the default).
        cc=gcc flags="-O2 -g" select=(-R '^test_')
        san=("-DCMAKE_CROSSCOMPILING_EMULATOR=valgrind;--fair-sched=try;--error-exitcode=99;--leak-check=full;--show-leak-kinds=definite,indirect,possible;--errors-for-leak-kinds=definite,indirect,possible;--track-fds=no;-q"
            -DTP_TEST_TIMEOUT=900) ;;
    tsan) cc=clang flags="-O1 -g" san=(-DTP_SANITIZE=thread) ;;
    asan) cc=gcc flags="-O1 -g" san=(-DTP_SANITIZE=address) ;;
    esac
    t0=$SECONDS
    if [ "$mode" = tsan ]; then
        log "$mode: checking that ThreadSanitizer works here"
        probe_tsan || { result[$mode]="FAIL (ThreadSanitizer does not work here)"; return 1; }
        wrap=("${tsan_wrap[@]}")
    elif [ "$mode" = asan ]; then
        log "$mode: checking that AddressSanitizer works here"
        probe_asan || { result[$mode]="FAIL (AddressSanitizer does not work here)"; return 1; }
    elif [ "$mode" = valgrind ]; then
        wrap=(env "TP_TEST_SLOWDOWN=${TP_TEST_SLOWDOWN:-4}")
    fi

    log "$mode: configure ($cc) in ${dir#"$root"/}"
    [ "${TP_CI_CLEAN:-0}" = 1 ] && rm -rf "$dir"

    # RelWithDebInfo, but assert() stays on: the flags replace CMake's -DNDEBUG.
    cmake -S "$root" -B "$dir" \
        -DCMAKE_C_COMPILER="$cc" \
        -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        -DCMAKE_C_FLAGS_RELWITHDEBINFO="$flags" \
        -DTP_WERROR=ON -DBUILD_TESTING=ON -DTP_BUILD_TESTS=ON \
        -DTP_BUILD_EXAMPLES=ON -DTP_BUILD_BENCH=ON \
        "${san[@]}" || { result[$mode]="FAIL at configure"; return 1; }

    log "$mode: build"
    if ! cmake --build "$dir" --parallel "$jobs"; then
        result[$mode]="FAIL at build"
        return 1
    fi

    # A missing cmocka only warns at configure time; here it must not pass
    # silently with the unit tests left out.
    local want have
    want=$(find "$root/tests" -maxdepth 1 -name 'test_*.c' | wc -l)
    have=$(cd "$dir" && ctest -N | grep -cE 'Test +#[0-9]+: test_')
    if [ "$have" -ne "$want" ]; then
        result[$mode]="FAIL: $have of the $want tests/test_*.c registered with CTest (cmocka missing?)"
        return 1
    fi
    # Likewise the install and package checks, which CMake skips when a tool
    # (scdoc, man, dpkg-deb) is missing.
    if [ "$mode" = plain ]; then
        local t listed
        listed=$(cd "$dir" && ctest -N) # not piped into grep -q: pipefail and SIGPIPE
        for t in install_consumer man_pages deb_packages subproject subproject_fetchcontent \
                 abi_old_binary abi_baseline clang_format; do
            if ! grep -Eq "Test +#[0-9]+: $t\$" <<<"$listed"; then
                result[$mode]="FAIL: test $t is not registered with CTest (scdoc, man, dpkg-deb, abidw, git or clang-format missing?)"
                return 1
            fi
        done
    fi

    # Nor may the Redis Streams process tests (hiredis, redis-server, python3).
    have=$(cd "$dir" && ctest -N | grep -cE 'Test +#[0-9]+: stream_')
    if [ "$mode" != valgrind ] && [ "$have" -ne 31 ]; then
        result[$mode]="FAIL: $have of the 31 stream_* tests registered with CTest (hiredis or redis-server missing?)"
        return 1
    fi

    # Nor the event-loop process tests: 9 scenarios x 2 servers (libuv, python3).
    have=$(cd "$dir" && ctest -N | grep -cE 'Test +#[0-9]+: loop_(uv|epoll)_')
    if [ "$mode" != valgrind ] && [ "$have" -ne 18 ]; then
        result[$mode]="FAIL: $have of the 18 loop_* tests registered with CTest (libuv or python3 missing?)"
        return 1
    fi

    log "$mode: test${wrap[*]:+ (under ${wrap[*]})}"
    local rc summary failed
    (cd "$dir" && "${wrap[@]}" ctest --output-on-failure --no-tests=error --parallel "$jobs" \
        "${select[@]}") 2>&1 | tee "$dir/ctest.log"
    rc=${PIPESTATUS[0]}
    summary=$(grep -E "tests passed|tests failed" "$dir/ctest.log" | tail -n 1)
    if [ "$rc" -ne 0 ]; then
        # The names listed after "The following tests FAILED:", joined with ", ".
        failed=$(sed -n '/The following tests FAILED:/,$p' "$dir/ctest.log" |
            sed -nE 's/^[[:space:]]+[0-9]+ - ([^ ]+).*/\1/p' | paste -sd, - | sed 's/,/, /g')
        result[$mode]="FAIL at test: ${summary:-ctest failed}${failed:+ -- $failed}"
        why[$mode]=$(failure_lines "$dir/ctest.log")
        return 1
    fi

    # The racy tests once more, many times: an interleaving that breaks a
    # promise once in a hundred runs must not hide behind one green pass.
    local repeat=${TP_REPEAT:-10}
    [ "$mode" = tsan ] && repeat=${TP_REPEAT_TSAN:-30}
    [ "$mode" = valgrind ] && repeat=1 # memcheck serialises threads: one pass
    if [ "$repeat" -gt 1 ]; then
        log "$mode: racy tests repeated $repeat times"
        (cd "$dir" && "${wrap[@]}" ctest --output-on-failure --no-tests=error --parallel "$jobs" \
            -R "$racy" --repeat "until-fail:$repeat") 2>&1 | tee "$dir/ctest-repeat.log"
        if [ "${PIPESTATUS[0]}" -ne 0 ]; then
            failed=$(sed -n '/The following tests FAILED:/,$p' "$dir/ctest-repeat.log" |
                sed -nE 's/^[[:space:]]+[0-9]+ - ([^ ]+).*/\1/p' | paste -sd, - | sed 's/,/, /g')
            result[$mode]="FAIL in repeated racy tests${failed:+ -- $failed}"
            why[$mode]=$(failure_lines "$dir/ctest-repeat.log")
            return 1
        fi
    fi
    result[$mode]="PASS: $summary, racy tests x$repeat ($((SECONDS - t0)) s)"
}

# The lines of a ctest log that say why a test failed (cmocka's failed
# assertion, fail_msg's message and its line, a sanitizer's report, a timeout), at most 24: the
# summary repeats them, since a long log may reach the reader cut.
failure_lines() {
    grep -E 'ERROR: |\[  (ERROR|FAILED) +\]|\[   LINE   \]|condition never became true|ThreadSanitizer|AddressSanitizer|LeakSanitizer|runtime error|\*\*\*(Timeout|Exception)|Test +#[0-9]+: .*(Failed|Timeout)' \
        "$1" | head -n 24
}

# Tests whose subject is a race; repeated after the full pass (TP_REPEAT, default 10).
racy='^(test_(stress|soak|cancel|lifecycle|admission|elastic|default|retry|spin|group|hist|cq|priority|fair|users|stage)|fuzz_corpus)$'

status=0
for m in "${modes[@]}"; do
    run_mode "$m" || status=1
done

log "summary"
for m in "${modes[@]}"; do
    printf 'run.sh: %-8s %s\n' "$m" "${result[$m]}"
done
for m in "${modes[@]}"; do
    [ -n "${why[$m]:-}" ] || continue
    printf 'run.sh: why %s failed (from its ctest log):\n' "$m"
    printf '%s\n' "${why[$m]}" | sed 's/^/    /'
done
exit $status
