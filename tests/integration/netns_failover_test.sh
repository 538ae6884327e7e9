#!/bin/sh
# Failover over real links: a head (the coordinator), 4 shard-server hosts and 2 worker hosts in
# network namespaces joined by veths to a bridge, all over tcp. The job spreads its model over 2
# shard servers with [cluster] replicas = 2 (a backup of each range on a host of its own). The
# primary of one range is SIGKILLed mid-run: the coordinator declares it gone, cuts the ranges'
# holders at the steps every worker reported, and goes on from that cut over the 3 servers left.
# The job ends done, with every image of its epochs counted once and the accuracy it should
# have; the cut was not behind the images trained when the server died. Prints the timeline.
# Needs root (skipped otherwise).
# Usage: netns_failover_test.sh OMNIVORED OMNIVORE_WORKER OMNIVORECTL MAKE_BLOBS
set -eu
daemon=$1 worker=$2 ctl=$3 make_blobs=$4
. "$(dirname "$0")/../lib/cluster_lib.sh"
EPOCHS=60 IMAGES=4096

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; [ -f "$tmp/status" ] && cat "$tmp/status"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (Debian package iproute2)"

p=omf$$
hosts="head s1 s2 s3 s4 w1 w2"
tmp=$(mktemp -d)
pids=""
cleanup() {
    rc=$?
    for q in $pids; do kill "$q" 2>/dev/null || true; done
    for q in $pids; do wait "$q" 2>/dev/null || true; done
    for h in $hosts; do ip netns del "$p-$h" 2>/dev/null || true; done
    ip netns del "$p-br" 2>/dev/null || true
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
        for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

netns_bridge "$p-br" "" || skip "no network namespaces or bridges: $(cat "$tmp/err")"
i=1
for h in $hosts; do
    netns_host "$p-$h" "$p-br" "$p$i" "10.78.0.$i/24"
    i=$((i + 1))
done
addr() { n=1; for h in $hosts; do [ "$h" = "$1" ] && { echo "10.78.0.$n"; return; }; n=$((n + 1)); done; }

"$make_blobs" "$tmp"
blobs_job "$tmp/job.ini" failover "$EPOCHS"
cat >>"$tmp/job.ini" <<JOB
[cluster]
workers = 2
groups = 1
staleness = none
servers = 2
replicas = 2
worker_timeout_s = 5
[checkpoint]
every_s = 0
[eval]
every_epochs = 10
batch_size = 128
progress_interval_s = 1
JOB
printf '[daemon]\nserver_timeout_s = 2\n' >"$tmp/omnivored.conf"
on() { # on HOST LOG COMMAND...
    h=$1 log=$2
    shift 2
    ip netns exec "$p-$h" "$@" >"$log" 2>&1 &
    pids="$pids $!"
}
sock=$tmp/control.sock head=$(addr head)
on head "$tmp/head.log" "$daemon" --once --job "$tmp/job.ini" --config "$tmp/omnivored.conf" \
    --endpoint "tcp://$head:5555" --control "$sock" --state-dir "$tmp" --curve no
n=0
until "$ctl" --socket "$sock" status >/dev/null 2>&1; do
    n=$((n + 1)); [ $n -lt 200 ] || fail "omnivored did not answer on $sock"; sleep 0.1
done
for s in s1 s2 s3 s4; do
    on "$s" "$tmp/$s.log" "$daemon" --role shard --coordinator "tcp://$head:5555" \
        --endpoint "tcp://$(addr "$s"):5556" --control "$tmp/$s.sock" --state-dir "$tmp/$s" \
        --curve no
    eval "pid_$s=\${pids##* }"
done
on w1 "$tmp/w1.log" "$worker" --server "tcp://$head:5555"
on w2 "$tmp/w2.log" "$worker" --server "tcp://$head:5555"
on w2 "$tmp/ev.log" "$worker" --server "tcp://$head:5555" --role evaluator

val() { sed -n "s/^$1://p" "$tmp/status" | head -1; }
status() { "$ctl" --socket "$sock" status >"$tmp/status" || fail "status failed"; }
start=$(date +%s)
until status && [ "$(val state)" = running ] && [ "$(val steps_total)" -ge 300 ]; do
    [ $(($(date +%s) - start)) -lt 120 ] || fail "the job did not reach 300 steps"
    sleep 0.1
done
# The primary of the range that starts at shard 1.
"$ctl" --socket "$sock" servers >"$tmp/servers"
victim=$(awk -v RS='# server' '/role:primary/ && /first_shard:1\n/ { if (match($0, /10\.78\.0\.[0-9]+/)) print substr($0, RSTART, RLENGTH) }' "$tmp/servers" | head -1)
[ -n "$victim" ] || fail "no primary of shard 1: $(cat "$tmp/servers")"
for s in s1 s2 s3 s4; do [ "$(addr "$s")" = "$victim" ] && vhost=$s; done
at_kill=$(val images_total)
eval "kill -KILL \$pid_$vhost"
killed=$(date +%s.%N)
echo "killed the primary of shard 1 ($vhost, $victim) at $at_kill images"
while status && [ "$(val state)" != "done" ]; do
    [ "$(val state)" = failed ] && fail "the job failed"
    [ $(($(date +%s) - start)) -lt 240 ] || fail "not done in 240 s"
    sleep 0.2
done
images=$(val images_total) acc=$(val test_accuracy)
want=$((EPOCHS * IMAGES))
[ "$images" -ge "$want" ] && [ "$images" -le $((want + 32)) ] || fail "images $images, want $want"
awk "BEGIN { exit !($acc >= 0.95) }" || fail "test_accuracy $acc"
"$ctl" --socket "$sock" servers >"$tmp/servers"
grep -q '^failovers_total:1$' "$tmp/servers" || fail "failovers: $(cat "$tmp/servers")"
back=$(sed -n 's/.*resumed from [^:]*: epoch [0-9.]*, \([0-9]*\) images.*/\1/p' "$tmp/head.log" | head -1)
[ -n "$back" ] && [ "$back" -ge "$at_kill" ] || fail "went back to ${back:-?} images from $at_kill"
echo "timeline (the kill at $(date -d "@$killed" +%H:%M:%S.%N | cut -c1-12)):"
grep -E ' daemon: .*(declared gone|go on from their backup|failover:|resumed from|running:)' "$tmp/head.log" |
    sed 's/^\([0-9:.]*\) [^ ]* [a-z]* *daemon: /  \1 /'
echo "done: $images images, test_accuracy $acc; the cut at $back images, the kill at $at_kill"
"$ctl" --socket "$sock" shutdown >/dev/null 2>&1 || true
echo "netns_failover: ok"
