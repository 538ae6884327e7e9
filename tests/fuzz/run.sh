#!/bin/sh
# Runs every libFuzzer harness of a fuzz build for a share of SECONDS (default 120), each from
# a copy of its seed corpus in tests/fuzz/corpus, and ends with one line that counts targets,
# executions and crashes; exits 1 when any harness crashed (its reproducer is kept and named).
# Build first:  CC=clang meson setup build-fuzz -Dfuzz=enabled -Dtests=disabled && ninja -C build-fuzz
# Usage: tests/fuzz/run.sh [BUILD_DIR [SECONDS]]
set -eu
cd "$(dirname "$0")/../.."
build=${1:-build-fuzz} total=${2:-120}
targets="wire job model idx cert checkpoint"
n=$(echo $targets | wc -w)
each=$((total / n))
[ "$each" -ge 1 ] || each=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
execs=0 crashes=0 ran=0
for t in $targets; do
    bin=$build/tests/fuzz/fuzz_$t
    [ -x "$bin" ] || { echo "fuzz: $bin is missing (build with -Dfuzz=enabled)"; exit 2; }
    mkdir -p "$work/$t" "$work/$t-crash"
    cp tests/fuzz/corpus/$t/* "$work/$t/" 2>/dev/null || true
    rc=0
    "$bin" -max_total_time="$each" -print_final_stats=1 -rss_limit_mb=2048 -timeout=10 \
        -artifact_prefix="$work/$t-crash/" "$work/$t" >"$work/$t.log" 2>&1 || rc=$?
    e=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t.log" | tail -1)
    execs=$((execs + ${e:-0}))
    ran=$((ran + 1))
    if [ "$rc" -ne 0 ]; then
        crashes=$((crashes + 1))
        keep=tests/fuzz/crash-$t-$(date +%s)
        mkdir -p "$keep" && cp "$work/$t-crash/"* "$keep/" 2>/dev/null || true
        echo "fuzz: $t crashed (status $rc); reproducer in $keep; log:"
        tail -30 "$work/$t.log"
    fi
    echo "fuzz: $t: ${e:-0} executions in ${each} s"
done
echo "fuzz: $ran targets, $execs executions, $crashes crashes"
[ "$crashes" -eq 0 ]
