#!/usr/bin/env bash
# old_binary.sh -- a program built against the previous release keeps working
# when only the shared library is replaced by this build's.
#
#   old_binary.sh SOURCE_DIR NEW_LIBTASKPOOL_SO CMAKE C_COMPILER
#
# 1. Takes the previous release's sources from git history (the commit named
#    in tests/abi/previous-release) into a temporary folder and builds its
#    shared library there.
# 2. Builds tests/abi/old_consumer.c against that release's header and links
#    it against that release's library (so its references carry that release's
#    symbol versions -- none at all, for 1.0).
# 3. Runs it on the old library (sanity), then with LD_LIBRARY_PATH pointing
#    at this build's library, and checks that the dynamic linker really loaded
#    the new one.
# Registered with CTest as abi_old_binary (plain builds only).
set -euo pipefail
src=$1 newlib=$2 cmake=$3 cc=$4
here=$(cd "$(dirname "$0")" && pwd)
read -r tag commit <"$here/previous-release"
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-abi-old.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { printf '\n== abi_old_binary: %s\n' "$*"; }

if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
    echo "abi_old_binary: commit $commit ($tag) is not in this clone's history;" >&2
    echo "  a shallow clone cannot run this check (git fetch --unshallow)." >&2
    exit 1
fi

step "build $tag ($commit) from git history"
mkdir -p "$tmp/old-src"
git -C "$src" archive "$commit" include src cmake CMakeLists.txt LICENSE | tar -x -C "$tmp/old-src"
"$cmake" -S "$tmp/old-src" -B "$tmp/old-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
    -DTP_BUILD_TESTS=OFF -DTP_BUILD_EXAMPLES=OFF -DTP_BUILD_BENCH=OFF -DBUILD_TESTING=OFF >/dev/null
"$cmake" --build "$tmp/old-build" --target taskpool -j2 >/dev/null
oldlib=$(find "$tmp/old-build" -maxdepth 1 -name 'libtaskpool.so' | head -n 1)
[ -n "$oldlib" ] || { echo "abi_old_binary: the old library was not built" >&2; exit 1; }

step "build old_consumer against $tag's header and library"
"$cc" -std=c11 -O1 -Wall -Wextra -pthread -I"$tmp/old-src/include" -o "$tmp/old_consumer" \
    "$here/old_consumer.c" -L"$(dirname "$oldlib")" -ltaskpool

step "run on $tag's library"
LD_LIBRARY_PATH=$(dirname "$oldlib") "$tmp/old_consumer"

step "run on this build's library ($(basename "$(readlink -f "$newlib")"))"
newdir=$(dirname "$newlib")
loaded=$(LD_LIBRARY_PATH=$newdir LD_TRACE_LOADED_OBJECTS=1 "$tmp/old_consumer" | awk '/libtaskpool/ { print $3 }')
[ "$(readlink -f "$loaded")" = "$(readlink -f "$newlib")" ] ||
    { echo "abi_old_binary: loaded '$loaded', expected '$newlib'" >&2; exit 1; }
LD_LIBRARY_PATH=$newdir "$tmp/old_consumer"
echo "abi_old_binary: a $tag binary runs unchanged on this library"
