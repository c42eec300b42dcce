#!/usr/bin/env bash
# check.sh -- libtaskpool as a subproject of tests/subproject/: configure,
# build and run the parent's programs, then `cmake --install` the parent into
# a scratch prefix and check that it installed its own program and no file of
# libtaskpool (TP_INSTALL is off under a parent).
#
#   check.sh SOURCE_DIR CMAKE C_COMPILER add_subdirectory|fetchcontent
#
# Registered with CTest as subproject and subproject_fetchcontent.
set -euo pipefail

src=$1 cmake=$2 cc=$3 via=$4
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-sub.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { printf '\n== subproject (%s): %s\n' "$via" "$*"; }
fail() { printf 'subproject (%s): FAIL: %s\n' "$via" "$*" >&2; exit 1; }

step "configure and build the parent"
"$cmake" -S "$here" -B "$tmp/build" -DTP_SOURCE_DIR="$src" -DTP_VIA="$via" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE=Release
"$cmake" --build "$tmp/build" --parallel 2

step "run the parent's programs"
"$tmp/build/parent_shared"
"$tmp/build/parent_static"

step "cmake --install the parent"
"$cmake" --install "$tmp/build" --prefix "$tmp/prefix"
installed=$(cd "$tmp/prefix" && find . ! -type d | sort)
printf 'installed:\n%s\n' "$installed"
[ "$installed" = "./bin/parent_static" ] ||
    fail "expected only bin/parent_static, got: $(tr '\n' ' ' <<<"$installed")"
# The manifest lists what the install step did, also outside the prefix.
if grep -Ei 'taskpool' "$tmp/build/install_manifest.txt"; then
    fail "the parent's install manifest names libtaskpool files"
fi
[ -z "$(find "$tmp/build" -name 'CTestTestfile.cmake' -path '*tests*')" ] ||
    fail "libtaskpool registered its tests in the parent"
echo "subproject ($via): OK"
