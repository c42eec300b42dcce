#!/usr/bin/env bash
# consume.sh -- build and run tests/install/main.c against an installed
# libtaskpool, every way a user would: the CMake package (shared and static
# targets), pkg-config with the shared library, and pkg-config --static into a
# fully static program. Checks that each program uses the library under
# PREFIX, not one installed elsewhere on the machine.
#
#   consume.sh PREFIX WORKDIR CMAKE C_COMPILER VERSION [CONFIG]
#
# PREFIX: the install prefix (`cmake --install --prefix`, or <root>/usr of a
# tree unpacked with `dpkg -x`). Used by check.sh (install_consumer) and
# check_deb.sh (deb_packages).
set -euo pipefail

prefix=$1 work=$2 cmake=$3 cc=$4 version=$5 config=${6:-}
here=$(cd "$(dirname "$0")" && pwd)
prefix=$(cd "$prefix" && pwd -P)
mkdir -p "$work"
cfg_args=()
[ -n "$config" ] && cfg_args=(--config "$config")
major=${version%%.*}

step() { printf '\n== consume: %s\n' "$*"; }
fail() { printf 'consume: FAIL: %s\n' "$*" >&2; exit 1; }

# The directory of libtaskpool.so.MAJOR: lib, lib64 or lib/<multiarch>.
soname=$(find "$prefix" -name "libtaskpool.so.$major" | head -n 1)
[ -n "$soname" ] || fail "no libtaskpool.so.$major under $prefix"
libdir=$(dirname "$soname")
for f in "$prefix/include/taskpool.h" "$libdir/libtaskpool.a" "$libdir/libtaskpool.so" \
         "$libdir/pkgconfig/taskpool.pc" "$libdir/cmake/taskpool/taskpoolConfig.cmake" \
         "$libdir/cmake/taskpool/taskpoolConfigVersion.cmake"; do
    [ -e "$f" ] || fail "missing: ${f#"$prefix"/}"
done

# `ldd PROGRAM` must resolve libtaskpool.so.MAJOR inside PREFIX.
uses_prefix_lib() {
    local line path
    line=$(ldd "$1" | grep "libtaskpool.so.$major") || fail "$1 does not load libtaskpool.so.$major"
    path=$(awk '{print $3}' <<<"$line")
    [ -e "$path" ] || fail "$1: libtaskpool.so.$major not found ($line)"
    path=$(cd "$(dirname "$path")" && pwd -P)
    [ "$path" = "$(cd "$libdir" && pwd -P)" ] || fail "$1 loads libtaskpool from $path, not from $libdir"
    echo "$(basename "$1") loads $line"
}

step "find_package(taskpool) consumer"
"$cmake" -S "$here" -B "$work/consumer" -DCMAKE_PREFIX_PATH="$prefix" \
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_BUILD_TYPE="${config:-Release}" -DTP_EXPECT_VERSION="$version" \
    -DTP_EXPECT_CONFIG_DIR="$libdir/cmake/taskpool"
"$cmake" --build "$work/consumer" "${cfg_args[@]}"
bin=$work/consumer
[ -n "$config" ] && [ -d "$bin/$config" ] && bin=$bin/$config # multi-config generators
uses_prefix_lib "$bin/consumer_shared"
"$bin/consumer_shared"
"$bin/consumer_static"

step "pkg-config consumer"
if ! command -v pkg-config >/dev/null 2>&1; then
    echo "pkg-config not found: skipping the pkg-config part"
    exit 0
fi
# Only this prefix's .pc files: a taskpool.pc installed on the machine must
# not stand in for the one under test.
export PKG_CONFIG_LIBDIR="$libdir/pkgconfig"
unset PKG_CONFIG_PATH
got=$(pkg-config --modversion taskpool)
[ "$got" = "$version" ] || fail "pkg-config says version $got, expected $version"
# Relocatable: the prefix is computed from the .pc file's own place.
pc_prefix=$(pkg-config --variable=prefix taskpool)
[ -d "$pc_prefix" ] && [ "$(cd "$pc_prefix" && pwd -P)" = "$prefix" ] ||
    fail "taskpool.pc prefix is '$pc_prefix', not $prefix"
flags=$(pkg-config --cflags --libs taskpool)
echo "pkg-config --cflags --libs taskpool: $flags"
# shellcheck disable=SC2086 # the flags are meant to split
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -o "$work/pc_shared" "$here/main.c" $flags
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" uses_prefix_lib "$work/pc_shared"
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$work/pc_shared"

step "pkg-config --static consumer (a fully static program)"
flags=$(pkg-config --static --cflags --libs taskpool)
echo "pkg-config --static --cflags --libs taskpool: $flags"
case " $flags " in *" -pthread "*) ;; *) fail "pkg-config --static does not give -pthread" ;; esac
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Wpedantic -Werror -static -o "$work/pc_static" "$here/main.c" $flags
if ldd "$work/pc_static" >/dev/null 2>&1 && ldd "$work/pc_static" | grep -q libtaskpool; then
    fail "pc_static is linked dynamically against libtaskpool"
fi
"$work/pc_static"
echo "consume: OK ($prefix)"
