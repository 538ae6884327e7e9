#!/bin/sh
# The model on shard servers, over real links: a head (the coordinator), up to 4 shard-server
# hosts and 2 worker hosts in network namespaces, each joined to a switch namespace by its own
# veth, every veth shaped by tc tbf on both ends (the head's too). The Fashion-MNIST MLP
# (784-HIDDEN-10: 256 is the example, 1280 is a 4 MB model), 64 images per worker in one
# synchronous group, bf16: images/s with the head holding the model (servers 0) and with it on
# 1, 2 and 4 shard servers of their own, next to PyTorch DDP with one rank per worker host
# (gloo) on the same links, when python3-torch is there. Medians of RUNS interleaved runs.
# Needs root (skips otherwise).
# Usage: bench/servers_links.sh [BUILD_DIR]   (RUNS, RATES, SERVERS, HIDDEN, SHARDS, LIMIT, EPOCHS, WORKERS (2 or 4 worker hosts), KEEP_LOGS, DDP (no: skip it), WIRE (bf16, int8 or fp32) from
# the environment; a server count with r, as SERVERS="2 2r", runs [cluster] replicas = 2 with a
# backup of each range on a host of its own: 2r takes 4 server hosts)
set -eu
build=${1:-build}
RUNS=${RUNS:-3} RATES=${RATES:-"1gbit 200mbit"} SERVERS=${SERVERS:-"0 1 2 4"}
HIDDEN=${HIDDEN:-256} LIMIT=${LIMIT:-20000} EPOCHS=${EPOCHS:-2} SHARDS=${SHARDS:-8} WORKERS=${WORKERS:-2} WIRE=${WIRE:-bf16}
ctl=$build/server/omnivorectl daemon=$build/server/omnivored worker=$build/worker/omnivore-worker
data=/usr/share/datasets/fashion-mnist
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root for network namespaces"; exit 0; }
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "skipped: no $data"; exit 0; }
p=omvs$$
hosts="head s1 s2 s3 s4 $(seq -f 'w%g' -s ' ' "$WORKERS")"
tmp=$(mktemp -d)
pids=""
stop_all() {
    for q in $pids; do kill "$q" 2>/dev/null || true; done
    for q in $pids; do wait "$q" 2>/dev/null || true; done
    pids=""
}
cleanup() {
    stop_all
    for h in sw $hosts; do ip netns del "$p-$h" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
addr() { case $1 in head) echo 1 ;; s*) echo $((10 + ${1#s})) ;; w*) echo $((20 + ${1#w})) ;; esac; }
. "$(dirname "$0")/../tests/lib/cluster_lib.sh"
. "$(dirname "$0")/links_lib.sh"
netns_bridge "$p-sw" "" || { echo "cannot make the namespaces: $(cat "$tmp/err")"; exit 1; }
for h in $hosts; do netns_host "$p-$h" "$p-sw" "$p$h" "10.79.0.$(addr "$h")/24"; done
shape() { # every host's link, both ends
    for h in $hosts; do
        netns_shape "$p-$h" eth0 "$RATE"
        netns_shape "$p-sw" "$p$h" "$RATE"
    done
}
on() { h=$1 log=$2; shift 2; ip netns exec "$p-$h" "$@" >"$log" 2>&1 & pids="$pids $!"; }
val() { sed -n "s/^$1://p" "$tmp/status" | head -1; }
one_run() { # one_run SERVERS (2r: 2 servers with replicas = 2): prints "images_per_second test_accuracy"
    n=${1%r} reps=1 nhosts=${1%r} sock=$tmp/c.sock
    [ "$1" = "${1%r}" ] || { reps=2 nhosts=$((2 * n)); }
    rm -rf "$tmp/state" && mkdir "$tmp/state"
    on head "$tmp/d.log" "$daemon" --once --job examples/fashion-mlp.ini \
        --endpoint tcp://10.79.0.1:5555 --control "$sock" --state-dir "$tmp/state" \
        --log-level warn --curve no --set cluster.servers="$n" --set cluster.replicas="$reps" \
        --set cluster.shards="$SHARDS" --set cluster.wire="$WIRE" --set model.layers="784 $HIDDEN 10" \
        --set train.batch_size=$((64 * WORKERS)) --set data.train_limit="$LIMIT" --set job.epochs="$EPOCHS" \
        --set eval.every_epochs=0 --set checkpoint.every_s=0
    k=0
    until "$ctl" --socket "$sock" status >/dev/null 2>&1; do
        k=$((k + 1)); [ $k -lt 100 ] || { echo "omnivored did not start:" >&2; cat "$tmp/d.log" >&2; exit 1; }; sleep 0.1
    done
    for i in $(seq "$nhosts"); do
        on "s$i" "$tmp/s$i.log" "$daemon" --role shard --coordinator tcp://10.79.0.1:5555 \
            --endpoint "tcp://10.79.0.$(addr "s$i"):5556" --control "$tmp/s$i.sock" \
            --state-dir "$tmp/state" --log-level warn --curve no
    done
    for i in $(seq "$WORKERS"); do on "w$i" "$tmp/w$i.log" "$worker" --server tcp://10.79.0.1:5555; done
    on w2 "$tmp/ev.log" "$worker" --server tcp://10.79.0.1:5555 --role evaluator
    k=0
    while "$ctl" --socket "$sock" status >"$tmp/status" 2>/dev/null; do
        [ "$(val state)" = done ] && break
        [ "$(val state)" != failed ] || { echo "job failed:" >&2; cat "$tmp/status" "$tmp/d.log" >&2; exit 1; }
        k=$((k + 1)); [ $k -lt 600 ] || { echo "run did not end" >&2; exit 1; }; sleep 1
    done
    echo "$(val images_per_second) $(val test_accuracy)"
    "$ctl" --socket "$sock" shutdown >/dev/null 2>&1 || true
    stop_all
    # KEEP_LOGS=DIR: each run's logs (the workers' step profiles among them) stay there
    [ -z "${KEEP_LOGS:-}" ] || { d="$KEEP_LOGS/$RATE-$1-$(date +%s%N)"; mkdir -p "$d"; cp "$tmp"/*.log "$d"/; }
}
ddp_run() { # one rank per worker host, rank 0 (the rendezvous) on w1
    port=$((29500 + $$ % 400)) ranks=""
    for r in $(seq $((WORKERS - 1))); do
        ip netns exec "$p-w$((r + 1))" env GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/torch_ddp.py \
            --rank "$r" --procs "$WORKERS" --master 10.79.0.21:$port --batch 64 --epochs "$EPOCHS" \
            --limit "$LIMIT" --hidden "$HIDDEN" --eval-every 1000 >"$tmp/ddp$r.log" 2>&1 &
        ranks="$ranks $!"
    done
    ip netns exec "$p-w1" env GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/torch_ddp.py --rank 0 \
        --procs "$WORKERS" --master 10.79.0.21:$port --batch 64 --epochs "$EPOCHS" --limit "$LIMIT" \
        --hidden "$HIDDEN" --eval-every 1000 2>"$tmp/ddp0.log" | tail -1 |
        sed -n 's/.*"images_per_second": \([0-9.]*\).*/\1/p'
    for q in $ranks; do wait "$q" || true; done
}
have_ddp=0
/usr/bin/python3 -c 'import torch' 2>/dev/null && have_ddp=1
[ $have_ddp = 1 ] || echo "# DDP skipped: python3-torch is not installed (apt-get install python3-torch)"
[ "${DDP:-yes}" = yes ] || have_ddp=0
echo "# $RUNS runs each, interleaved; MLP 784-$HIDDEN-10, $WORKERS workers x 64 images, wire $WIRE, $LIMIT images x $EPOCHS epochs; every link shaped"
printf '%-8s %-10s %12s %10s\n' link servers images/s accuracy
json="{"
cases=$SERVERS
for RATE in $RATES; do
    shape
    links_rate "$RATE" servers_ '%-8s %-10s %12s %10s\n'
done
echo "${json%,}}"
