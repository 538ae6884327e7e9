#!/bin/sh
# Prints pairs of object files in a static library that call each other (a circle of two) and
# any longer circle: for each object, the symbols it needs and the objects that define them.
# Usage: tools/file_deps.sh build/server/libomnivore-server.a
set -eu
lib=$1
nm -A "$lib" 2>/dev/null | awk '
{ split($1, p, ":"); obj = p[2]; sym = $NF; type = $(NF-1) }
type ~ /^[TDBR]$/ { def[sym] = obj }
type == "U" { need[obj, sym] = 1; objs[obj] = 1 }
END {
    for (k in need) { split(k, q, SUBSEP); o = q[1]; s = q[2]
        if ((s in def) && def[s] != o) edge[o, def[s]] = 1 }
    for (k in edge) { split(k, q, SUBSEP); print q[1], q[2] }
}' | sort -u > /tmp/deps.$$
# Circles: a path from a file back to itself (transitive closure over the edges).
python3 - /tmp/deps.$$ <<'PY'
import sys
edges = {}
for line in open(sys.argv[1]):
    a, b = line.split()
    edges.setdefault(a, set()).add(b)
def reach(a):
    seen, todo = set(), list(edges.get(a, ()))
    while todo:
        x = todo.pop()
        if x not in seen:
            seen.add(x); todo.extend(edges.get(x, ()))
    return seen
bad = sorted({tuple(sorted((a, b))) for a in edges for b in edges[a] if a in reach(b)})
for a, b in bad:
    print("circle:", a, "<->", b)
sys.exit(1 if bad else 0)
PY
rc=$?
rm -f /tmp/deps.$$
exit $rc
