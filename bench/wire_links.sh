#!/bin/sh
# fp32 against bf16 on the wire, over real links: a head and two worker hosts in network
# namespaces joined by a bridge, each worker host's veth shaped by tc tbf (both ends), the
# Fashion-MNIST MLP with 64 images per worker in one synchronous group, and PyTorch DDP with one
# rank per worker host on the same links, batch and data (when python3-torch is there). For each
# link rate, the median of RUNS runs: images/s and the final test accuracy. Needs root (skips
# otherwise). Usage: bench/wire_links.sh [BUILD_DIR]   (RUNS, RATES, LIMIT, EPOCHS, WIRES from
# the environment, and SHARDS for the job's [cluster] shards; BEFORE=OTHER_BUILD_DIR adds that build's bf16 run, as "before", interleaved)
set -eu
build=${1:-build}
RUNS=${RUNS:-3} RATES=${RATES:-"unshaped 1gbit 200mbit"} LIMIT=${LIMIT:-20000} EPOCHS=${EPOCHS:-2}
WIRES=${WIRES:-"fp32 bf16"} BEFORE=${BEFORE:-} SHARDS=${SHARDS:-2}
ctl=$build/server/omnivorectl
cases=$WIRES
[ -z "$BEFORE" ] || cases="$cases before"
data=/usr/share/datasets/fashion-mnist
[ "$(id -u)" -eq 0 ] || { echo "skipped: needs root for network namespaces"; exit 0; }
[ -f "$data/train-images-idx3-ubyte.gz" ] || { echo "skipped: no $data"; exit 0; }
ns_head=omvb$$-head ns_w1=omvb$$-w1 ns_w2=omvb$$-w2
tmp=$(mktemp -d)
pids=""
stop_all() {
    for p in $pids; do kill "$p" 2>/dev/null || true; done
    for p in $pids; do wait "$p" 2>/dev/null || true; done
    pids=""
}
cleanup() {
    stop_all
    for ns in $ns_head $ns_w1 $ns_w2; do ip netns del "$ns" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM
. "$(dirname "$0")/../tests/lib/cluster_lib.sh"
. "$(dirname "$0")/links_lib.sh"
netns_bridge "$ns_head" 10.78.0.1/24 || { echo "cannot make the namespaces: $(cat "$tmp/err")"; exit 1; }
netns_host "$ns_w1" "$ns_head" "omvb$$h1" 10.78.0.2/24
netns_host "$ns_w2" "$ns_head" "omvb$$h2" 10.78.0.3/24
shape() { # shape RATE: tbf on both ends of each worker host's link
    for i in 1 2; do
        netns_shape "$(eval echo "\$ns_w$i")" eth0 "$RATE"
        netns_shape "$ns_head" "omvb$$h$i" "$RATE"
    done
}
on() { ns=$1 log=$2; shift 2; ip netns exec "$ns" "$@" >"$log" 2>&1 & pids="$pids $!"; }
val() { sed -n "s/^$1://p" "$tmp/status" | head -1; }
one_run() { # one_run WIRE|before: prints "images_per_second test_accuracy"
    b=$build job=examples/fashion-mlp.ini
    # The other build reads its own tree's example (its keys are that tree's).
    [ "$1" != before ] || { b=$BEFORE job=$BEFORE/../examples/fashion-mlp.ini; set -- bf16; }
    daemon=$b/server/omnivored worker=$b/worker/omnivore-worker
    # Plain tcp, as DDP's gloo is (builds from before CURVE have no --curve).
    curve=""
    "$daemon" --help 2>&1 | grep -q -- --curve && curve="--curve no"
    sock=$tmp/c.sock
    rm -rf "$tmp/state" && mkdir "$tmp/state"
    on "$ns_head" "$tmp/d.log" "$daemon" --once --job "$job" \
        --endpoint tcp://10.78.0.1:5555 --control "$sock" --state-dir "$tmp/state" \
        --log-level warn $curve --set cluster.wire="$1" --set cluster.shards="$SHARDS" \
        --set train.batch_size=128 \
        --set data.train_limit="$LIMIT" --set job.epochs="$EPOCHS" --set eval.every_epochs=0
    n=0
    until "$ctl" --socket "$sock" status >/dev/null 2>&1; do
        n=$((n + 1)); [ $n -lt 100 ] || { echo "omnivored did not start:" >&2; cat "$tmp/d.log" >&2; exit 1; }; sleep 0.1
    done
    on "$ns_w1" "$tmp/w1.log" "$worker" --server tcp://10.78.0.1:5555
    on "$ns_w2" "$tmp/w2.log" "$worker" --server tcp://10.78.0.1:5555
    on "$ns_w2" "$tmp/ev.log" "$worker" --server tcp://10.78.0.1:5555 --role evaluator
    n=0
    while "$ctl" --socket "$sock" status >"$tmp/status" 2>/dev/null; do
        [ "$(val state)" = done ] && break
        n=$((n + 1)); [ $n -lt 300 ] || { echo "run did not end" >&2; exit 1; }; sleep 1
    done
    echo "$(val images_per_second) $(val test_accuracy)"
    "$ctl" --socket "$sock" shutdown >/dev/null 2>&1 || true
    stop_all
}
ddp_run() { # PyTorch DDP, one rank per worker host, the same batch and data: prints images/s
    port=$((29500 + $$ % 400))
    ip netns exec "$ns_w2" env GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/torch_ddp.py --rank 1 --procs 2 \
        --master 10.78.0.2:$port --batch 64 --epochs "$EPOCHS" --limit "$LIMIT" \
        --eval-every 1000 >"$tmp/ddp1.log" 2>&1 &
    r1=$!
    ip netns exec "$ns_w1" env GLOO_SOCKET_IFNAME=eth0 /usr/bin/python3 bench/torch_ddp.py --rank 0 --procs 2 \
        --master 10.78.0.2:$port --batch 64 --epochs "$EPOCHS" --limit "$LIMIT" \
        --eval-every 1000 2>"$tmp/ddp0.log" | tail -1 |
        sed -n 's/.*"images_per_second": \([0-9.]*\).*/\1/p'
    wait "$r1" || true
}
have_ddp=0
/usr/bin/python3 -c 'import torch' 2>/dev/null && have_ddp=1
[ $have_ddp = 1 ] || echo "# DDP skipped: python3-torch is not installed (apt-get install python3-torch)"
echo "# $RUNS runs each, interleaved; MLP, 2 workers x 64 images, $LIMIT images x $EPOCHS epochs"
printf '%-10s %-6s %12s %10s\n' link wire images/s accuracy
json="{"
for RATE in $RATES; do
    shape
    links_rate "$RATE" "" '%-10s %-6s %12s %10s\n'
done
echo "${json%,}}"
