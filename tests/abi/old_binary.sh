#!/usr/bin/env bash
# old_binary.sh -- programs built against earlier releases keep working when
# only the shared library is replaced by this build's.
#
#   old_binary.sh SOURCE_DIR NEW_LIBTASKPOOL_SO CMAKE C_COMPILER
#
# For every release listed in tests/abi/previous-release (tag, commit, the
# program of tests/abi/ written against it: old_consumer.c for 1.0,
# old_consumer_1_1.c for 1.1):
# 1. Takes that release's sources from git history into a temporary folder
#    and builds its shared library there.
# 2. Builds the program against that release's header and links it against
#    that release's library, so its references carry that release's symbol
#    versions (none at all for 1.0, TASKPOOL_1.1 for the calls whose structs
#    grew in 1.1); checks that they do.
# 3. Runs it on the old library (sanity), then with LD_LIBRARY_PATH pointing
#    at this build's library, and checks that the dynamic linker really loaded
#    the new one.
# Registered with CTest as abi_old_binary (plain builds only). Fails if any
# release fails; the summary names each.
set -euo pipefail
src=$1 newlib=$2 cmake=$3 cc=$4
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-abi-old.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
step() { printf '\n== abi_old_binary: %s\n' "$*"; }
newdir=$(dirname "$newlib")

# check_release TAG COMMIT PROGRAM
check_release() {
    local tag=$1 commit=$2 prog=$3
    local dir=$tmp/$tag name=${3%.c}
    if ! git -C "$src" cat-file -e "$commit^{commit}" 2>/dev/null; then
        echo "abi_old_binary: commit $commit ($tag) is not in this clone's history;" >&2
        echo "  a shallow clone cannot run this check (git fetch --unshallow)." >&2
        return 1
    fi
    [ -f "$here/$prog" ] || { echo "abi_old_binary: no $prog in tests/abi/" >&2; return 1; }

    step "$tag: build $tag ($commit) from git history"
    mkdir -p "$dir/old-src"
    # What the library needs; docs/ holds the man pages, which TP_INSTALL=OFF skips.
    git -C "$src" archive "$commit" include src cmake CMakeLists.txt LICENSE | tar -x -C "$dir/old-src"
    "$cmake" -S "$dir/old-src" -B "$dir/old-build" -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
        -DTP_BUILD_TESTS=OFF -DTP_BUILD_EXAMPLES=OFF -DTP_BUILD_BENCH=OFF -DBUILD_TESTING=OFF \
        -DTP_INSTALL=OFF >/dev/null 2>"$dir/cmake.err" || { cat "$dir/cmake.err" >&2; return 1; }
    "$cmake" --build "$dir/old-build" --target taskpool -j2 >/dev/null
    local oldlib
    oldlib=$(find "$dir/old-build" -maxdepth 1 -name 'libtaskpool.so' | head -n 1)
    [ -n "$oldlib" ] || { echo "abi_old_binary: the $tag library was not built" >&2; return 1; }

    step "$tag: build $prog against $tag's header and library"
    "$cc" -std=c11 -O1 -Wall -Wextra -Werror -pthread -I"$dir/old-src/include" -o "$dir/$name" \
        "$here/$prog" -L"$(dirname "$oldlib")" -ltaskpool
    # The symbol versions the binary asks for: those of its release.
    local versions
    versions=$(LC_ALL=C readelf --dyn-syms --wide "$dir/$name" |
        sed -nE 's/.* UND (tp_[a-z0-9_]+)(@[A-Z0-9_.]+)?( .*)?$/\2/p' | sed '/^$/d' | sort -u | paste -sd' ' -)
    echo "symbol versions referenced: ${versions:-none}"
    case $tag in
        v1.0.*) [ -z "$versions" ] ||
            { echo "abi_old_binary: a 1.0 binary should reference no symbol version" >&2; return 1; } ;;
        v1.1.*) [[ $versions == *"@TASKPOOL_1.1"* ]] ||
            { echo "abi_old_binary: a 1.1 binary should reference TASKPOOL_1.1 symbols" >&2; return 1; } ;;
    esac

    step "$tag: run on $tag's library"
    LD_LIBRARY_PATH=$(dirname "$oldlib") "$dir/$name"

    step "$tag: run on this build's library ($(basename "$(readlink -f "$newlib")"))"
    local loaded
    loaded=$(LD_LIBRARY_PATH=$newdir LD_TRACE_LOADED_OBJECTS=1 "$dir/$name" | awk '/libtaskpool/ { print $3 }')
    [ "$(readlink -f "$loaded")" = "$(readlink -f "$newlib")" ] ||
        { echo "abi_old_binary: loaded '$loaded', expected '$newlib'" >&2; return 1; }
    LD_LIBRARY_PATH=$newdir "$dir/$name"
    echo "abi_old_binary: a $tag binary runs unchanged on this library"
}

declare -a summary=()
fails=0 releases=0
while read -r tag commit prog; do
    case $tag in '' | '#'*) continue ;; esac
    releases=$((releases + 1))
    # A subshell with -e of its own: inside an `if` condition bash would
    # ignore -e, and a failed step would not stop the release's check.
    set +e
    (
        set -e
        check_release "$tag" "$commit" "$prog"
    )
    rc=$?
    set -e
    if [ "$rc" -eq 0 ]; then
        summary+=("$tag ($prog): ok")
    else
        summary+=("$tag ($prog): FAILED")
        fails=$((fails + 1))
    fi
done <"$here/previous-release"

[ "$releases" -gt 0 ] || { echo "abi_old_binary: no release listed in tests/abi/previous-release" >&2; exit 1; }
printf '\n== abi_old_binary: summary\n'
printf '  %s\n' "${summary[@]}"
[ "$fails" -eq 0 ] || exit 1
