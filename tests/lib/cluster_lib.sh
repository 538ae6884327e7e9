# Shell pieces the cluster scripts share (tests/netns_test.sh, netns_failover_test.sh,
# sandbox_test.sh, bench/wire_links.sh, bench/servers_links.sh): network namespaces joined by a
# bridge, a link shaped by tc, the blobs job's sections, and CURVE keys. Sourced, POSIX sh.

# netns_bridge NS ADDR: namespace NS holding bridge br0, with ADDR (a.b.c.d/len) on it unless
# ADDR is empty, its loopback up. Fails when the kernel has no namespaces or bridges (the
# reason is in $tmp/err).
netns_bridge() {
    ip netns add "$1" 2>"$tmp/err" || return 1
    ip -n "$1" link add br0 type bridge 2>"$tmp/err" || return 1
    [ -z "$2" ] || ip -n "$1" addr add "$2" dev br0
    ip -n "$1" link set br0 up
    ip -n "$1" link set lo up
}

# netns_host NS BRIDGE_NS PORT ADDR: namespace NS (made) with eth0 at ADDR, a veth whose other
# end, PORT, is a port of BRIDGE_NS's br0.
netns_host() {
    ip netns add "$1"
    ip link add "$3" netns "$2" type veth peer name eth0 netns "$1"
    ip -n "$2" link set "$3" master br0 up
    ip -n "$1" addr add "$4" dev eth0
    ip -n "$1" link set eth0 up
    ip -n "$1" link set lo up
}

# netns_shape NS DEV RATE: tbf at RATE (1gbit, 200mbit, ...) on DEV in NS; unshaped: none. The
# bucket holds about 1 ms at the rate: a larger one lets a bursty sender (pull, then compute,
# then push) pass much of each burst at line rate and flatters it.
netns_shape() {
    tc -n "$1" qdisc del dev "$2" root 2>/dev/null || true
    case $3 in
    unshaped) return 0 ;;
    1gbit) burst=128kb ;;
    200mbit) burst=32kb ;;
    *) burst=64kb ;;
    esac
    tc -n "$1" qdisc add dev "$2" root tbf rate "$3" burst "$burst" latency 50ms
}

# blobs_job FILE NAME EPOCHS: a job on make_blobs' data (in FILE's folder), up to its [train]
# section; the caller appends the rest.
blobs_job() {
    cat >"$1" <<JOB
[job]
name = $2
epochs = $3
seed = 7
[model]
layers = 64 32 4
[data]
train_images = train-images.gz
train_labels = train-labels.gz
test_images = test-images
test_labels = test-labels
[train]
batch_size = 32
learning_rate = 0.05
momentum = 0.9
JOB
}

# curve_keys CTL DIR CONF: keys for a daemon, a trainer and an evaluator in DIR (made), the
# folder of public certificates doubling as the daemon's allow-list, and the daemon's config
# for them in CONF; sets tkey and ekey to the trainer's and the evaluator's worker arguments.
curve_keys() {
    mkdir "$2"
    "$1" keygen daemon "$2" >/dev/null
    "$1" keygen trainer "$2" >/dev/null
    "$1" keygen --roles evaluator evaluator "$2" >/dev/null
    printf '[security]\ncurve = yes\nsecret_key = %s/daemon.key_secret\nallow_dir = %s\n' \
        "$2" "$2" >"$3"
    tkey="--key $2/trainer.key_secret --server-key $2/daemon.key"
    ekey="--key $2/evaluator.key_secret --server-key $2/daemon.key"
}
