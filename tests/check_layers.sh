#!/usr/bin/env bash
# check_layers.sh -- src/ calls flow one way: no file calls a tp__ function
# defined in its own layer's other files or in a layer above it (see the
# layer table at the top of src/pool.h).
#
#   check_layers.sh LIBTASKPOOL_A NM SRC_DIR
#
# It reads the built static library with nm: each member (src/<file>.c.o)
# gives the tp__ symbols it defines (T, D, B...) and the ones it uses (U).
# Inline functions of the headers (ring.h, the id index, the lock wrappers)
# are compiled into their callers and do not appear as references. Every
# src/*.c must have a layer here, so a new file has to be placed.
#
# TP_LAYERS_INJECT="file.c:tp__symbol ..." adds references as if file.c used
# them: the CTest test layers_selftest injects a call upwards and expects this
# script to fail, so a checker that can no longer fail is noticed.
set -euo pipefail
lib=$1 nm=$2 src=$3

# Top to bottom; files in one string share a layer.
layers=(
    "compat.c"                                     # 0 1.0 entry points (public calls only)
    "group.c metrics.c default.c"                  # 1 groups (on pool.c's admission), metrics, default pool
    "pool.c stats.c"                               # 2 the public calls of a pool, its reads
    "engine.c"                                     # 3 threads, the lock, waits, wake-ups
    "life.c"                                       # 4 the task's life (state machine)
    "scheduler.c cq.c ctx.c tasks.c users.c hist.c"    # 5 leaves (ring.h is inline)
    "clock.c error.c text.c"                       # 6 the clocks; error table, tp__assert_fail; text
)
declare -A rank=()
for i in "${!layers[@]}"; do
    for f in ${layers[$i]}; do rank[$f]=$i; done
done

status=0
for f in "$src"/*.c; do
    b=${f##*/}
    if [ -z "${rank[$b]:-}" ]; then
        echo "check_layers: src/$b has no layer: add it to tests/check_layers.sh and src/pool.h"
        status=1
    fi
done

# "lib.a:life.c.o:0000000000000ac0 T tp__admit_locked" -> "life.c T tp__admit_locked"
syms=$("$nm" -A -g "$lib" | sed -nE 's/^[^:]*:([^:]+)\.o: *[0-9a-fA-F]* ([A-Za-z]) (tp__[A-Za-z0-9_]+)$/\1 \2 \3/p')
[ -n "$syms" ] || { echo "check_layers: no tp__ symbols found in $lib"; exit 1; }

declare -A def=()
while read -r file type sym; do
    [ "$type" = U ] || def[$sym]=$file
done <<<"$syms"

refs=$(awk '$2 == "U" { print $1, $3 }' <<<"$syms")
for inj in ${TP_LAYERS_INJECT:-}; do
    refs+=$'\n'"${inj%%:*} ${inj#*:}"
done

checked=0
while read -r file sym; do
    [ -n "$file" ] || continue
    target=${def[$sym]:-}
    [ -n "$target" ] || continue # libc or a symbol defined outside src/
    [ "$target" = "$file" ] && continue
    checked=$((checked + 1))
    if [ -z "${rank[$file]:-}" ] || [ -z "${rank[$target]:-}" ]; then
        continue # reported above as a file without a layer
    fi
    if [ "${rank[$target]}" -le "${rank[$file]}" ]; then
        echo "check_layers: $file calls $sym, defined in $target (layer $((rank[$target] + 1))," \
            "not below $file's layer $((rank[$file] + 1)))"
        status=1
    fi
done <<<"$refs"

[ $status -eq 0 ] && echo "check_layers: $checked calls between files, all downwards through ${#layers[@]} layers"
exit $status
