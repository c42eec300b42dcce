#!/usr/bin/env bash
# check_format.sh -- every C source and header of the repository is formatted
# as .clang-format says (clang-format 14, Debian's clang-format package).
#
#   check_format.sh SOURCE_DIR CLANG_FORMAT
#
# Registered with CTest as clang_format (plain builds). To fix what it
# reports: clang-format -i $(git ls-files '*.c' '*.h')
set -euo pipefail
src=$1 cf=$2
cd "$src"
if [ -d .git ] || [ -f .git ]; then
    mapfile -t files < <(git ls-files '*.c' '*.h')
else
    mapfile -t files < <(find include src tests bench examples -name '*.[ch]' | sort)
fi
[ ${#files[@]} -gt 0 ] || { echo "check_format: no C files found under $src"; exit 1; }
if ! "$cf" --dry-run --Werror "${files[@]}"; then
    echo "check_format: run: clang-format -i \$(git ls-files '*.c' '*.h')" >&2
    exit 1
fi
echo "check_format: ${#files[@]} files formatted as .clang-format says ($("$cf" --version | head -n 1))"
