#!/usr/bin/env bash
# check.sh -- install a libtaskpool build into a temporary prefix and build a
# consumer against it, through the CMake package and through pkg-config.
#
#   check.sh BUILD_DIR CONFIG CMAKE C_COMPILER VERSION
#
# BUILD_DIR: a configured and built libtaskpool tree. CONFIG: the build
# configuration (may be empty). Registered with CTest as install_consumer.
set -euo pipefail

build=$1 config=$2 cmake=$3 cc=$4 version=$5
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
prefix=$tmp/prefix
cfg_args=()
[ -n "$config" ] && cfg_args=(--config "$config")

step() { printf '\n== install_consumer: %s\n' "$*"; }

step "cmake --install into a temporary prefix"
"$cmake" --install "$build" --prefix "$prefix" "${cfg_args[@]}"

libdir=$(dirname "$(find "$prefix" -name 'libtaskpool.a' | head -n 1)")
major=${version%%.*}
for f in "$prefix/include/taskpool.h" "$libdir/libtaskpool.a" "$libdir/libtaskpool.so.$major" \
         "$libdir/libtaskpool.so" "$libdir/pkgconfig/taskpool.pc" \
         "$libdir/cmake/taskpool/taskpoolConfig.cmake" "$libdir/cmake/taskpool/taskpoolConfigVersion.cmake"; do
    [ -e "$f" ] || { echo "missing after install: ${f#"$prefix"/}" >&2; exit 1; }
done

step "find_package(taskpool) consumer"
"$cmake" -S "$here" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE="${config:-Release}" -DTP_EXPECT_VERSION="$version"
"$cmake" --build "$tmp/consumer" "${cfg_args[@]}"
bin=$tmp/consumer
[ -n "$config" ] && [ -d "$bin/$config" ] && bin=$bin/$config # multi-config generators
"$bin/consumer_shared"
"$bin/consumer_static"

step "pkg-config consumer"
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "pkg-config not found: skipping the pkg-config part"
    exit 0
fi
export PKG_CONFIG_PATH="$libdir/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
got=$(pkg-config --modversion taskpool)
[ "$got" = "$version" ] || { echo "pkg-config says version $got, expected $version" >&2; exit 1; }
flags=$(pkg-config --cflags --libs taskpool)
echo "pkg-config --cflags --libs taskpool: $flags"
# shellcheck disable=SC2086 # the flags are meant to split
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$tmp/pc_consumer" "$here/main.c" $flags
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/pc_consumer"
echo "install_consumer: OK"
