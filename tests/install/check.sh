#!/usr/bin/env bash
# check.sh -- install a libtaskpool build into a temporary prefix and build a
# consumer against it, through the CMake package and through pkg-config
# (shared, and --static), with consume.sh.
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

printf '\n== install_consumer: cmake --install into a temporary prefix\n'
"$cmake" --install "$build" --prefix "$prefix" "${cfg_args[@]}"
bash "$here/consume.sh" "$prefix" "$tmp/work" "$cmake" "$cc" "$version" "$config"
echo "install_consumer: OK"
