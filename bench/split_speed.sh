#!/bin/sh
# A group of two workers of unequal speed (one takes SLOWDOWN times its compute time, as a device
# that much slower would): the MLP's images/s and the group's step time with [cluster] split =
# even and = speed, interleaved, median of RUNS. Usage: bench/split_speed.sh [BUILD_DIR]
# (RUNS, SLOWDOWN, LIMIT from the environment)
set -eu
build=${1:-build}
RUNS=${RUNS:-3} SLOWDOWN=${SLOWDOWN:-4} LIMIT=${LIMIT:-20000}
daemon=$build/server/omnivored worker=$build/worker/omnivore-worker ctl=$build/server/omnivorectl
tmp=$(mktemp -d)
pids=""
stop_all() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    pids=""
}
trap 'stop_all; rm -rf "$tmp"' EXIT
trap 'exit 1' INT TERM
val() { sed -n "s/^$1://p" "$tmp/status" | head -1; }
one_run() { # one_run SPLIT: prints "images_per_second step_ms test_accuracy"
    sock=$tmp/c.sock ep=ipc://$tmp/w.sock
    rm -rf "$tmp/state" && mkdir "$tmp/state"
    "$daemon" --once --job examples/fashion-mlp.ini --endpoint "$ep" --control "$sock" \
        --state-dir "$tmp/state" --log-level warn --set cluster.split="$1" \
        --set data.train_limit="$LIMIT" --set job.epochs=2 --set eval.every_epochs=0 \
        >"$tmp/d.log" 2>&1 &
    pids="$pids $!"
    n=0
    until "$ctl" --socket "$sock" status >/dev/null 2>&1; do
        n=$((n + 1)); [ $n -lt 100 ] || { echo "omnivored did not start" >&2; exit 1; }; sleep 0.1
    done
    "$worker" --server "$ep" >"$tmp/w1.log" 2>&1 & pids="$pids $!"
    "$worker" --server "$ep" --slowdown "$SLOWDOWN" >"$tmp/w2.log" 2>&1 & pids="$pids $!"
    "$worker" --server "$ep" --role evaluator >"$tmp/ev.log" 2>&1 & pids="$pids $!"
    while "$ctl" --socket "$sock" status >"$tmp/status" 2>/dev/null; do
        [ "$(val state)" = done ] && break
        sleep 0.25
    done
    ips=$(val images_per_second)
    # A step of the group is 64 images: its time in ms at that rate.
    echo "$ips $(awk -v r="$ips" 'BEGIN { printf "%.2f", 64000 / r }') $(val test_accuracy)"
    "$ctl" --socket "$sock" shutdown >/dev/null 2>&1 || true
    stop_all
}
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
echo "# MLP, one group of 2 workers (64 images a step), one of them $SLOWDOWN times slower"
printf '%-6s %10s %12s %10s\n' split images/s step_ms accuracy
: >"$tmp/even" && : >"$tmp/speed"
for r in $(seq "$RUNS"); do
    for s in even speed; do one_run $s >>"$tmp/$s"; done
done
json="{"
for s in even speed; do
    ips=$(cut -d' ' -f1 "$tmp/$s" | median) ms=$(cut -d' ' -f2 "$tmp/$s" | median)
    acc=$(cut -d' ' -f3 "$tmp/$s" | median)
    printf '%-6s %10s %12s %10s\n' "$s" "$ips" "$ms" "$acc"
    json="$json\"$s\":{\"images_per_second\":$ips,\"step_ms\":$ms,\"test_accuracy\":$acc},"
done
echo "${json%,}}"
