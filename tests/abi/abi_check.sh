#!/usr/bin/env bash
# abi_check.sh -- compare the ABI of this build's libtaskpool.so with the
# committed baseline (tests/abi/libtaskpool.abi) using libabigail's abidiff.
#
#   abi_check.sh SOURCE_DIR LIBTASKPOOL_SO           check (CTest: abi_baseline)
#   abi_check.sh SOURCE_DIR LIBTASKPOOL_SO --update  rewrite the baseline
#
# Fails on any change to what the baseline already exports: a removed or
# re-versioned symbol, a public struct whose size or field offsets changed, a
# changed function signature (abidiff's ABI-change and incompatible-change
# bits; libabigail calls a grown struct an "ABI change", and for programs that
# embed it that is a break). Added calls and symbol versions are filtered out
# (--no-added-syms) and pass; refresh the baseline with --update in the commit
# of a release that adds them.
# Needs a library built with debug information (RelWithDebInfo or Debug) and
# abigail-tools. Only public types (those reachable from include/) count.
set -euo pipefail
src=$1 lib=$2 mode=${3:-check}
base=$src/tests/abi/libtaskpool.abi
for t in abidw abidiff; do
    command -v "$t" >/dev/null 2>&1 || { echo "abi_check: $t not found (apt-get install abigail-tools)" >&2; exit 1; }
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-abi.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# No paths of this machine in the file: short locations, no corpus or build path.
abidw --headers-dir "$src/include" --drop-private-types --short-locs --no-corpus-path \
      --no-comp-dir-path --out-file "$tmp/current.abi" "$lib"
if [ "$mode" = --update ]; then
    cp "$tmp/current.abi" "$base"
    echo "abi_check: baseline written to tests/abi/libtaskpool.abi"
    exit 0
fi
[ -f "$base" ] || { echo "abi_check: no baseline at tests/abi/libtaskpool.abi (run with --update)" >&2; exit 1; }
set +e
abidiff --no-added-syms "$base" "$tmp/current.abi" >"$tmp/diff.txt" 2>&1
rc=$?
set -e
cat "$tmp/diff.txt"
# abidiff exit status bits: 1 error, 2 usage, 4 ABI change, 8 incompatible change.
if (( rc & 3 )); then echo "abi_check: abidiff failed to run (status $rc)" >&2; exit 1; fi
if (( rc & 12 )); then echo "abi_check: ABI CHANGE against tests/abi/libtaskpool.abi (see above)" >&2; exit 1; fi
echo "abi_check: the ABI of the baseline is unchanged (additions pass)"
