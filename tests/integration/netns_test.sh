#!/bin/sh
# A cluster of three "machines": network namespaces joined by a bridge (veth pairs) with private
# addresses, each with its own hostname. omnivored runs on the head (tcp on its bridge address),
# one trainer on each worker host (the second host also runs the evaluator). The job trains a
# generated data set until its loss falls below a threshold and it is done, while omnivorectl
# status is read throughout. The namespaces are removed however the test ends.
# Usage: netns_test.sh OMNIVORED OMNIVORE_WORKER OMNIVORECTL MAKE_BLOBS   (77 = skipped)
set -eu
daemon=$1 worker=$2 ctl=$3 make_blobs=$4
. "$(dirname "$0")/../lib/cluster_lib.sh"
LOSS_MAX=0.15   # the training loss the job must reach
ACC_MIN=0.95    # and the test accuracy

skip() { echo "skipped: $*"; exit 77; }
fail() { echo "FAIL: $*"; [ -f "$tmp/status" ] && cat "$tmp/status"; exit 1; }
[ "$(id -u)" -eq 0 ] || skip "needs root to make network namespaces (sudo meson test netns)"
command -v ip >/dev/null 2>&1 || skip "no 'ip' command (Debian package iproute2)"
command -v unshare >/dev/null 2>&1 || skip "no 'unshare' command (Debian package util-linux)"

ns_head=omv$$-head ns_w1=omv$$-w1 ns_w2=omv$$-w2
tmp=$(mktemp -d)
pids=""
cleanup() {
    rc=$?
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    for ns in $ns_head $ns_w1 $ns_w2; do ip netns del "$ns" 2>/dev/null || true; done
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
        for f in "$tmp"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -20 "$f"; }; done
    fi
    rm -rf "$tmp"
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# The head's bridge 10.77.0.1/24; each worker host's veth end 10.77.0.(i+1) on it.
netns_bridge "$ns_head" 10.77.0.1/24 || skip "no network namespaces or bridges: $(cat "$tmp/err")"
netns_host "$ns_w1" "$ns_head" "omv$$h1" 10.77.0.2/24
netns_host "$ns_w2" "$ns_head" "omv$$h2" 10.77.0.3/24
if command -v ping >/dev/null 2>&1; then
    for ns in $ns_w1 $ns_w2; do
        ip netns exec "$ns" ping -c 1 -W 5 10.77.0.1 >/dev/null || fail "$ns cannot reach the head"
    done
fi

"$make_blobs" "$tmp"
blobs_job "$tmp/job.ini" netns 30
cat >>"$tmp/job.ini" <<JOB
[cluster]
workers = 2
groups = 2
staleness = 2
worker_timeout_s = 3
[eval]
every_epochs = 5
batch_size = 128
progress_interval_s = 1
JOB
sock=$tmp/control.sock
# Each host gets its own hostname (UTS namespace), so the daemon sees three machines.
on() { # on NS HOSTNAME LOG COMMAND...
    ns=$1 host=$2 log=$3
    shift 3
    # shellcheck disable=SC2016
    ip netns exec "$ns" unshare --uts sh -c 'hostname "$0"; exec "$@"' "$host" "$@" >"$log" 2>&1 &
    pids="$pids $!"
}
# CURVE, as on a real network.
curve_keys "$ctl" "$tmp/keys" "$tmp/omnivored.conf"
on "$ns_head" head "$tmp/daemon.log" "$daemon" --once --job "$tmp/job.ini" \
    --endpoint tcp://10.77.0.1:5555 --control "$sock" --state-dir "$tmp" --log-level info \
    --config "$tmp/omnivored.conf"
daemon_pid=${pids##* }
n=0
until "$ctl" --socket "$sock" status >/dev/null 2>&1; do
    n=$((n + 1))
    [ $n -lt 200 ] || { echo "FAIL: omnivored did not answer on $sock"; exit 1; }
    kill -0 "$daemon_pid" 2>/dev/null || { echo "FAIL: omnivored exited"; exit 1; }
    sleep 0.1
done
# shellcheck disable=SC2086
on "$ns_w1" worker1 "$tmp/w1.log" "$worker" --server tcp://10.77.0.1:5555 --step-delay-ms 2 $tkey
w1=${pids##* }
# shellcheck disable=SC2086
on "$ns_w2" worker2 "$tmp/w2.log" "$worker" --server tcp://10.77.0.1:5555 --step-delay-ms 2 $tkey
w2=${pids##* }
# shellcheck disable=SC2086
on "$ns_w2" worker2 "$tmp/ev.log" "$worker" --server tcp://10.77.0.1:5555 --role evaluator $ekey
ev=${pids##* }

# Status throughout: both trainers alive while it runs, the loss falling below LOSS_MAX.
val() { sed -n "s/^$1://p" "$tmp/status" | head -1; }
reached="" polls=0 start=$(date +%s)
while :; do
    "$ctl" --socket "$sock" status >"$tmp/status" || { echo "FAIL: status failed"; exit 1; }
    polls=$((polls + 1))
    state=$(val state) loss=$(val loss) alive=$(val workers_alive) epoch=$(val epoch)
    if [ "$state" = running ] && [ "$(val joins_total)" -ge 2 ] && [ "$alive" -ne 2 ]; then
        echo "FAIL: $alive workers alive while running"; cat "$tmp/status"; exit 1
    fi
    if [ -z "$reached" ] && [ "$state" = running ] && [ -n "$loss" ] &&
        awk "BEGIN { exit !($loss > 0 && $loss < $LOSS_MAX) }"; then
        reached="epoch $epoch"
        echo "loss $loss < $LOSS_MAX at epoch $epoch (workers_alive $alive)"
    fi
    [ "$state" = "done" ] && break
    # Workers leave once training is over (finishing); before that none may end.
    live=$daemon_pid
    [ "$state" = waiting ] || [ "$state" = running ] && live="$live $w1 $w2 $ev"
    for p in $live; do
        kill -0 "$p" 2>/dev/null && continue
        # It may have left just after the status above was read: ask again.
        "$ctl" --socket "$sock" status >"$tmp/status" 2>/dev/null || true
        case $(val state) in
        finishing | "done") ;;
        *) echo "FAIL: process $p ended while the job was $(val state)"; exit 1 ;;
        esac
    done
    [ "$state" = failed ] && { echo "FAIL: job failed"; cat "$tmp/status"; exit 1; }
    [ $(($(date +%s) - start)) -lt 180 ] || fail "not done in 180 s"
    sleep 0.2
done
acc=$(val test_accuracy)
echo "done: epoch $(val epoch), loss $(val loss), test_accuracy $acc, $polls status reads"
[ -n "$reached" ] || fail "the loss never fell below $LOSS_MAX"
awk "BEGIN { exit !($acc >= $ACC_MIN) }" || { echo "FAIL: test_accuracy $acc < $ACC_MIN"; exit 1; }

# The daemon saw three hosts, and the gradients crossed the veths.
"$ctl" --socket "$sock" workers >"$tmp/workers"
for h in worker1 worker2; do
    grep -q "^host:$h$" "$tmp/workers" || fail "no worker from $h: $(cat "$tmp/workers")"
done
# Workers in other network namespaces cannot reach the daemon's shared-memory socket: tcp.
grep -q "^transport:shm" "$tmp/workers" && fail "a worker in another namespace used shared memory"
for ns in $ns_w1 $ns_w2; do
    tx=$(ip netns exec "$ns" cat /sys/class/net/eth0/statistics/tx_bytes)
    [ "$tx" -gt 1000000 ] || { echo "FAIL: only $tx bytes left $ns"; exit 1; }
    echo "$ns: $tx bytes sent to the head"
done
"$ctl" --socket "$sock" groups | tr '\n' ' '
echo
for p in $w1 $w2 $ev; do
    wait "$p" || { echo "FAIL: a worker exited with status $?"; exit 1; }
done
"$ctl" --socket "$sock" shutdown >/dev/null
wait "$daemon_pid" || { echo "FAIL: omnivored exited with status $?"; exit 1; }
pids=""
echo "netns: ok"
