#!/usr/bin/env bash
# check_deb.sh -- build the .deb packages of a libtaskpool build with CPack,
# check their metadata and contents, unpack them into a scratch root with
# `dpkg -x`, and build and run tests/install against that root (consume.sh:
# find_package, pkg-config, pkg-config --static).
#
#   check_deb.sh BUILD_DIR CONFIG CMAKE CPACK C_COMPILER VERSION
#
# Registered with CTest as deb_packages (not under sanitizers); needs dpkg-deb.
# When lintian is installed, the packages must have no error-level finding
# but the missing Debian changelog, which only an upload to the archive needs.
set -euo pipefail

build=$1 config=$2 cmake=$3 cpack=$4 cc=$5 version=$6
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tp-deb.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
major=${version%%.*}
runtime=libtaskpool$major dev=libtaskpool-dev

fails=0
fail() { printf 'deb_packages: FAIL: %s\n' "$*" >&2; fails=$((fails + 1)); }
step() { printf '\n== deb_packages: %s\n' "$*"; }

step "cpack -G DEB"
cfg_args=()
[ -n "$config" ] && cfg_args=(-C "$config")
(cd "$build" && "$cpack" -G DEB -B "$tmp/out" "${cfg_args[@]}") >"$tmp/cpack.log" 2>&1 ||
    { cat "$tmp/cpack.log" >&2; echo "deb_packages: cpack failed" >&2; exit 1; }
arch=$(dpkg --print-architecture)
rdeb=$tmp/out/${runtime}_${version}_${arch}.deb
ddeb=$tmp/out/${dev}_${version}_${arch}.deb
ls -l "$tmp"/out/*.deb
for d in "$rdeb" "$ddeb"; do
    [ -f "$d" ] || { echo "deb_packages: missing $(basename "$d")" >&2; exit 1; }
done

step "metadata (dpkg-deb -I)"
field() { dpkg-deb -f "$1" "$2"; }
for d in "$rdeb" "$ddeb"; do
    dpkg-deb -I "$d"
    [ "$(field "$d" Version)" = "$version" ] || fail "$(basename "$d"): Version is not $version"
    [ "$(field "$d" Architecture)" = "$arch" ] || fail "$(basename "$d"): Architecture is not $arch"
    [ -n "$(field "$d" Maintainer)" ] || fail "$(basename "$d"): no Maintainer"
    [ "$(field "$d" Description | wc -l)" -ge 3 ] || fail "$(basename "$d"): no extended Description"
done
[ "$(field "$rdeb" Package)" = "$runtime" ] || fail "runtime package is not named $runtime"
[ "$(field "$ddeb" Package)" = "$dev" ] || fail "development package is not named $dev"
[ "$(field "$rdeb" Section)" = libs ] || fail "$runtime: Section is not libs"
[ "$(field "$ddeb" Section)" = libdevel ] || fail "$dev: Section is not libdevel"
grep -Eq '(^|, )libc6 \(>= [0-9.]+\)' <<<"$(field "$rdeb" Depends)" ||
    fail "$runtime: Depends '$(field "$rdeb" Depends)' has no versioned libc6"
grep -Fq "$runtime (= $version)" <<<"$(field "$ddeb" Depends)" ||
    fail "$dev: Depends '$(field "$ddeb" Depends)' lacks '$runtime (= $version)'"
# The shlibs file lets packages built against libtaskpool depend on it;
# the ldconfig trigger refreshes the cache on install.
dpkg-deb -e "$rdeb" "$tmp/control"
grep -Eq "^libtaskpool $major $runtime \(>= $version\)$" "$tmp/control/shlibs" 2>/dev/null ||
    fail "$runtime: no shlibs line 'libtaskpool $major $runtime (>= $version)'"
grep -q ldconfig "$tmp/control/triggers" 2>/dev/null || fail "$runtime: no ldconfig trigger"

step "contents (dpkg-deb -c)"
# "path" or "path -> target", one a line.
listing() { dpkg-deb -c "$1" | awk '{ $1 = $2 = $3 = $4 = $5 = ""; sub(/^ +/, ""); print }'; }
listing "$rdeb" | tee "$tmp/runtime.list"
listing "$ddeb" >"$tmp/dev.list"
sed -n '1,12p;$p' "$tmp/dev.list"; echo "... ($(wc -l <"$tmp/dev.list") entries)"
has() { grep -Eq "$2" "$1" || fail "$(basename "$1" .list): nothing matches $2"; }
hasnt() { ! grep -Eq "$2" "$1" || fail "$(basename "$1" .list): unexpected $(grep -E "$2" "$1" | head -n 1)"; }
has "$tmp/runtime.list" "^\./usr/lib/([^/]+/)?libtaskpool\.so\.$major -> libtaskpool\.so\.$version"
has "$tmp/runtime.list" "^\./usr/lib/([^/]+/)?libtaskpool\.so\.$version$"
has "$tmp/runtime.list" "^\./usr/share/doc/$runtime/copyright$"
hasnt "$tmp/runtime.list" '\.(h|a|pc)$|libtaskpool\.so( |$)|/man/'
has "$tmp/dev.list" '^\./usr/include/taskpool\.h$'
has "$tmp/dev.list" "^\./usr/lib/([^/]+/)?libtaskpool\.so -> libtaskpool\.so\.$major$"
has "$tmp/dev.list" '^\./usr/lib/([^/]+/)?libtaskpool\.a$'
has "$tmp/dev.list" '^\./usr/lib/([^/]+/)?pkgconfig/taskpool\.pc$'
has "$tmp/dev.list" '^\./usr/lib/([^/]+/)?cmake/taskpool/taskpoolConfig\.cmake$'
has "$tmp/dev.list" "^\./usr/share/doc/$dev/copyright$"
if [ -d "$build/docs/man/man7" ]; then # built when scdoc was found
    has "$tmp/dev.list" '^\./usr/share/man/man7/taskpool\.7\.gz$'
    has "$tmp/dev.list" '^\./usr/share/man/man3/tp_submit\.3\.gz$'
    has "$tmp/dev.list" '^\./usr/share/man/man3/tp_submit_wait\.3\.gz -> tp_submit\.3\.gz$'
fi
hasnt "$tmp/dev.list" '^\./usr/lib/([^/]+/)?libtaskpool\.so\.[0-9]'

step "dpkg -x into a scratch root"
root=$tmp/root
dpkg -x "$rdeb" "$root"
dpkg -x "$ddeb" "$root"
cmp "$root/usr/share/doc/$runtime/copyright" "$here/../../LICENSE" || fail "copyright is not LICENSE"
bash "$here/consume.sh" "$root/usr" "$tmp/work" "$cmake" "$cc" "$version" "$config" || fail "consume.sh"

if command -v lintian >/dev/null 2>&1; then
    step "lintian"
    # The one finding that only matters for an upload to the Debian archive:
    # no changelog in Debian's own format (the project's is CHANGELOG.md).
    allowed='(no-changelog|debian-changelog-file-missing)'
    lintian --tag-display-limit 0 "$rdeb" "$ddeb" >"$tmp/lintian.out" 2>&1 || true
    cat "$tmp/lintian.out"
    errors=$(grep -E '^E: ' "$tmp/lintian.out" | grep -Ev "$allowed" || true)
    [ -z "$errors" ] || fail "lintian errors: $errors"
else
    echo "lintian not installed: metadata checked with dpkg-deb only"
fi

if [ "$fails" -ne 0 ]; then
    echo "deb_packages: $fails failure(s)"
    exit 1
fi
echo "deb_packages: OK"
