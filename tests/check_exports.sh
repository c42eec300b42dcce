#!/usr/bin/env bash
# check_exports.sh -- the shared library exports exactly the functions the
# public header declares with TP_API: none missing, nothing internal leaked,
# and (with the version script) each with a symbol version.
#
#   check_exports.sh LIBTASKPOOL_SO TASKPOOL_H NM
set -euo pipefail
lib=$1 header=$2 nm=$3

# "TP_API const char *tp_strerror(int err);" -> tp_strerror
declared=$(grep -E '^TP_API ' "$header" | sed -E 's/\(.*//; s/.*[^A-Za-z0-9_]//' | sort -u)
symbols=$("$nm" -D --defined-only "$lib" | awk '$2 ~ /^[TtWDdBbRrVvi]$/ { print $3 }')
exported=$(echo "$symbols" | sed 's/@.*//' | sort -u)

status=0
missing=$(comm -23 <(echo "$declared") <(echo "$exported"))
extra=$(comm -13 <(echo "$declared") <(echo "$exported"))
if [ -n "$missing" ]; then
    printf 'declared with TP_API but not exported:\n%s\n' "$missing"
    status=1
fi
if [ -n "$extra" ]; then
    printf 'exported but not in the public header:\n%s\n' "$extra"
    status=1
fi
# With the version script (ELF), every export carries a symbol version.
if "$nm" -D --defined-only "$lib" | grep -q '@TASKPOOL_'; then
    unversioned=$(echo "$symbols" | grep -v '@' || true)
    if [ -n "$unversioned" ]; then
        printf 'exported without a symbol version (add to src/taskpool.map):\n%s\n' "$unversioned"
        status=1
    fi
fi
[ $status -eq 0 ] && echo "check_exports: the $(echo "$declared" | wc -l) TP_API functions, nothing else"
exit $status
