#!/bin/sh
# Prints pairs of object files in a static library that call each other (a circle of two) and
# any longer circle: for each object, the symbols it needs and the objects that define them.
# With SRCDIR (the folder the library's sources are under, in subfolders), the same for the
# subfolders: a file of one that calls a file of another is an arrow between them, and arrows
# must run one way.
# Usage: tools/file_deps.sh build/server/libomnivore-server.a [server]
set -eu
lib=$1
srcdir=${2:-}
nm -A "$lib" 2>/dev/null | awk '
{ split($1, p, ":"); obj = p[2]; sub(/.*\//, "", obj); sym = $NF; type = $(NF-1) }
type ~ /^[TDBR]$/ { def[sym] = obj }
type == "U" { need[obj, sym] = 1; objs[obj] = 1 }
END {
    for (k in need) { split(k, q, SUBSEP); o = q[1]; s = q[2]
        if ((s in def) && def[s] != o) edge[o, def[s]] = 1 }
    for (k in edge) { split(k, q, SUBSEP); print q[1], q[2] }
}' | sort -u > /tmp/deps.$$
# meson names an object after its source's path below the target's folder, "/" made "_":
# server/run/run.c is run_run.c.o. The map from object to folder comes from the sources.
: > /tmp/folders.$$
if [ -n "$srcdir" ]; then
    (cd "$srcdir" && find . -mindepth 2 -name '*.c' | sed 's#^\./##') | while read -r f; do
        echo "$(echo "$f" | tr / _).o ${f%%/*}"
    done > /tmp/folders.$$
fi
# Circles: a path from a node back to itself (transitive closure over the edges).
python3 - /tmp/deps.$$ /tmp/folders.$$ <<'PY'
import sys
def circles(edges):
    def reach(a):
        seen, todo = set(), list(edges.get(a, ()))
        while todo:
            x = todo.pop()
            if x not in seen:
                seen.add(x); todo.extend(edges.get(x, ()))
        return seen
    return sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in reach(b)})
files, folders, folder_of = {}, {}, {}
for line in open(sys.argv[2]):
    obj, folder = line.split()
    folder_of[obj] = folder
why = {}
for line in open(sys.argv[1]):
    a, b = line.split()
    files.setdefault(a, set()).add(b)
    fa, fb = folder_of.get(a), folder_of.get(b)
    if fa and fb and fa != fb:
        folders.setdefault(fa, set()).add(fb)
        why.setdefault((fa, fb), []).append(a + " -> " + b)
bad = 0
for a, b in circles(files):
    print("circle:", a, "<->", b); bad = 1
for a, b in circles(folders):
    print("folder circle:", a, "<->", b)
    for k in ((a, b), (b, a)):
        for w in why.get(k, ())[:4]:
            print("   ", w)
    bad = 1
sys.exit(bad)
PY
rc=$?
rm -f /tmp/deps.$$ /tmp/folders.$$
exit $rc
