#!/bin/sh
# The house rules a machine can check: the tree is clang-formatted, no product function is over
# 100 lines and no product file over 1,000, server/ keeps its files in subsystems' folders, and
# no two files of the daemon's library call each other (no circle of files), nor two of its
# folders (no circle of subsystems); the same for omnivorectl's library and the worker's.
# Usage: style_test.sh SOURCE_ROOT SERVER_LIBRARY CTL_LIBRARY WORKER_LIBRARY
set -u
root=$1
server_lib=$2
ctl_lib=$3
worker_lib=$4
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
# shellcheck disable=SC2046
long=$(awk -v max=100 -f tools/funclen.awk $(find common server worker -name '*.c' | sort) \
       2>/dev/null)
if [ -n "$long" ]; then
    echo "$long"
    echo "style: the functions above are over 100 lines: split them"
    rc=1
fi
# A file past 1,000 lines is two concerns or more (STYLE.md: "usually two past ~800").
big=$(find common server worker -name '*.c' -exec wc -l {} + | awk '$2 != "total" && $1 > 1000')
if [ -n "$big" ]; then
    echo "$big"
    echo "style: the files above are over 1,000 lines: split them by concern"
    rc=1
fi
# The daemon's files live in the folder of their subsystem; server/ holds its entry points.
top=$(find server -maxdepth 1 -type f | wc -l)
if [ "$top" -gt 8 ]; then
    find server -maxdepth 1 -type f
    echo "style: server/ holds $top files directly: put them in the folder of their subsystem"
    rc=1
fi
if ! tools/file_deps.sh "$server_lib" server; then
    echo "style: the files or folders above in $server_lib call each other; make the arrows run one way"
    rc=1
fi
if ! tools/file_deps.sh "$ctl_lib"; then
    echo "style: the files above in $ctl_lib call each other; make the arrows run one way"
    rc=1
fi
if ! tools/file_deps.sh "$worker_lib"; then
    echo "style: the files above in $worker_lib call each other; make the arrows run one way"
    rc=1
fi
[ $rc = 0 ] && echo "style: formatting, function and file length, and file and folder dependencies are clean"
exit $rc
