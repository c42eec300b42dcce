#!/usr/bin/env bash
# check_man.sh -- the installed man pages: found by man(1), complete, rendered
# without a warning, and the example of taskpool(7) compiles and runs.
#
#   check_man.sh BUILD_DIR CONFIG CMAKE C_COMPILER HEADER
#
# Installs BUILD_DIR into a temporary prefix, then:
#   1. `MANPATH=<prefix>/share/man man -w NAME` finds a page under the prefix
#      for every TP_API function of HEADER, for the 1.1 calls of SPEC section 11
#      and for taskpool(7);
#   2. every page renders with `man -l` at 80 columns with all groff warnings
#      on (--warnings=all) and writes nothing to stderr, in the C and a UTF-8
#      locale;
#   3. every alias (a link to a page) is named in that page's NAME section, so
#      whatis/apropos list it;
#   4. the EXAMPLE program of taskpool(7), as man shows it, compiles with
#      -Wall -Wextra -Wpedantic -Werror against the installed library and runs.
# Registered with CTest as man_pages when scdoc was found at configure time.
set -euo pipefail

build=$1 config=$2 cmake=$3 cc=$4 header=$5
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-man.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cfg_args=()
[ -n "$config" ] && cfg_args=(--config "$config")

fails=0
fail() { printf 'man_pages: FAIL: %s\n' "$*" >&2; fails=$((fails + 1)); }
step() { printf '\n== man_pages: %s\n' "$*"; }

command -v man >/dev/null 2>&1 || { echo "man_pages: man(1) is not installed (apt-get install man-db)" >&2; exit 1; }

step "cmake --install into a temporary prefix"
"$cmake" --install "$build" --prefix "$prefix" "${cfg_args[@]}" >/dev/null
mandir=$prefix/share/man
[ -d "$mandir/man3" ] && [ -d "$mandir/man7" ] || { echo "man_pages: no man3/man7 under $mandir" >&2; exit 1; }

# Set the environment man(1) reads, and nothing from the caller's.
export MANPATH=$mandir MANWIDTH=80 MANPAGER=cat PAGER=cat MANOPT= MANSECT=
unset MANROFFOPT MAN_KEEP_FORMATTING || true

step "man -w finds a page for every public call"
# The public functions: TP_API declarations of the header, plus the calls that
# SPEC section 11 adds in 1.1 (documented before they reach the header).
names=$(sed -nE 's/^TP_API[^(]*[ *](tp_[a-z0-9_]+)\(.*/\1/p' "$header")
[ -n "$names" ] || { echo "man_pages: no TP_API function found in $header" >&2; exit 1; }
names="$names tp_submit_batch tp_group_create tp_group_submit tp_group_wait tp_group_cancel
       tp_group_destroy tp_hist_get tp_hist_bound_ns tp_hist_quantile_ns tp_metrics_format"
count=0
for n in $(printf '%s\n' $names | sort -u); do
    if ! path=$(man -w 3 "$n" 2>/dev/null); then
        fail "man 3 $n: no page"
        continue
    fi
    case $path in "$mandir"/*) ;; *) fail "man 3 $n found $path, outside the installed prefix" ;; esac
    count=$((count + 1))
done
path=$(man -w 7 taskpool 2>/dev/null) || fail "man 7 taskpool: no page"
echo "$count calls have a page; taskpool(7): ${path:-none}"

step "every page renders without a warning"
pages=0
while IFS= read -r page; do
    for loc in C C.UTF-8; do
        if ! LC_ALL=$loc man --warnings=all -l "$page" >"$tmp/out" 2>"$tmp/err"; then
            fail "$(basename "$page") ($loc): man exited with an error: $(cat "$tmp/err")"
        elif [ -s "$tmp/err" ]; then
            fail "$(basename "$page") ($loc): $(cat "$tmp/err")"
        elif [ "$(wc -l <"$tmp/out")" -lt 10 ]; then
            fail "$(basename "$page") ($loc): rendered to less than 10 lines"
        fi
    done
    pages=$((pages + 1))
done < <(find "$mandir" -type f -name '*.[37]*' | sort)
echo "$pages pages rendered"

step "every alias is named in its page's NAME section"
aliases=0
while IFS= read -r link; do
    alias=$(basename "$link"); alias=${alias%%.[37]*}
    name_line=$(LC_ALL=C man -l "$link" 2>/dev/null | sed 's/.\x08//g' |
        sed -n '/^NAME/,/^[A-Z]/p' | tr '\n' ' ')
    case " ${name_line//,/ } " in
        *" $alias "*) ;;
        *) fail "$(basename "$link") -> $(readlink "$link"): '$alias' is not in its NAME section" ;;
    esac
    aliases=$((aliases + 1))
done < <(find "$mandir" -type l | sort)
echo "$aliases aliases checked"

step "the example of taskpool(7) compiles and runs"
# The program as a reader sees it: rendered, plain text, its literal block.
LC_ALL=C MANWIDTH=200 man -l "$mandir/man7/taskpool.7"* 2>/dev/null | sed 's/.\x08//g' |
    awk '/^EXAMPLE/ { inex = 1; next }
         /^[A-Z]/   { inex = 0 }
         inex && /^ +#include <stdint.h>/ { code = 1 }
         inex && code { print }' | sed -E 's/^ {11}//' >"$tmp/example.c"
lines=$(wc -l <"$tmp/example.c")
[ "$lines" -gt 20 ] || fail "could not extract the example of taskpool(7) ($lines lines)"
libdir=$(dirname "$(find "$prefix" -name 'libtaskpool.so' | head -n 1)")
if "$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -I"$prefix/include" -o "$tmp/example" \
        "$tmp/example.c" -L"$libdir" -ltaskpool -pthread 2>"$tmp/cc.err"; then
    if LD_LIBRARY_PATH="$libdir" "$tmp/example" >"$tmp/example.out" 2>&1 &&
        grep -q '^accepted 10, succeeded 10, failed 0$' "$tmp/example.out"; then
        echo "the example ($lines lines) compiled and ran: $(tail -n 1 "$tmp/example.out")"
    else
        fail "the example of taskpool(7) failed: $(cat "$tmp/example.out")"
    fi
else
    fail "the example of taskpool(7) does not compile: $(cat "$tmp/cc.err")"
    cat -n "$tmp/example.c" >&2
fi

if [ "$fails" -ne 0 ]; then
    echo "man_pages: $fails failure(s)"
    exit 1
fi
echo "man_pages: OK"
