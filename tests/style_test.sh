#!/bin/sh
# The house rules a machine can check: the tree is clang-formatted, no product function is over
# 100 lines, and no two files of the daemon's library call each other (no circle of files).
# Usage: style_test.sh SOURCE_ROOT LIBRARY...
set -u
root=$1
shift
cd "$root" || exit 1
rc=0
files=$(git ls-files '*.c' '*.h' 2>/dev/null)
if [ -z "$files" ]; then
    files=$(find common server worker tests bench proto -name '*.[ch]' 2>/dev/null)
fi
if command -v clang-format >/dev/null 2>&1; then
    # shellcheck disable=SC2086
    if ! clang-format --dry-run -Werror $files 2>/tmp/style_format.$$; then
        head -40 /tmp/style_format.$$
        echo "style: these files differ from .clang-format; run: clang-format -i FILE"
        rc=1
    fi
    rm -f /tmp/style_format.$$
else
    echo "style: clang-format is not installed: the formatting check is skipped"
fi
long=$(awk -v max=100 -f tools/funclen.awk common/*.c server/*.c server/*/*.c worker/*.c \
       2>/dev/null)
if [ -n "$long" ]; then
    echo "$long"
    echo "style: the functions above are over 100 lines: split them"
    rc=1
fi
for lib in "$@"; do
    if ! tools/file_deps.sh "$lib"; then
        echo "style: the files above in $lib call each other; make the arrows run one way"
        rc=1
    fi
done
[ $rc = 0 ] && echo "style: formatting, function length and file dependencies are clean"
exit $rc
