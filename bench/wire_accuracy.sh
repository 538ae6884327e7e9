#!/bin/sh
# The wire's cost in accuracy: the Fashion-MNIST examples trained with `omnivorectl run` on this
# host, over the socket (OMNIVORE_SHM=0: shared memory carries fp32 whatever the wire), once
# per [cluster] wire and seed, the same epochs. Prints each wire's final test accuracy, the mean
# over the seeds, and the mean's difference from fp32's, in points.
# Usage: bench/wire_accuracy.sh [BUILD_DIR]   (WIRES, SEEDS, MLP_EPOCHS, CNN_EPOCHS (0: skip
# that model), WORKERS from the environment)
set -eu
build=${1:-build}
WIRES=${WIRES:-"fp32 bf16 int8"} SEEDS=${SEEDS:-"1 2 3"} MLP_EPOCHS=${MLP_EPOCHS:-3}
CNN_EPOCHS=${CNN_EPOCHS:-1} WORKERS=${WORKERS:-2}
ctl=$build/server/omnivorectl
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] ||
    { echo "skipped: no Fashion-MNIST (apt-get install dataset-fashion-mnist)"; exit 0; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
one() { # one JOB EPOCHS WIRE SEED: prints the final test accuracy
    OMNIVORE_SHM=0 "$ctl" run "$1" --workers "$WORKERS" --json --set job.epochs="$2" \
        --set cluster.wire="$3" --set job.seed="$4" >"$tmp/json" 2>"$tmp/log" ||
        { cat "$tmp/log" >&2; exit 1; }
    sed -n 's/.*"test_accuracy":\([0-9.]*\).*/\1/p' "$tmp/json"
}
echo "# $WORKERS workers over the socket, seeds $SEEDS (interleaved: every wire for a seed, then the next seed)"
printf '%-5s %-5s %6s  %-28s %8s %14s\n' model wire epochs "accuracy per seed" mean "vs fp32 (pts)"
for m in mlp cnn; do
    job=examples/fashion-$m.ini epochs=$MLP_EPOCHS
    [ $m = mlp ] || epochs=$CNN_EPOCHS
    [ "$epochs" != 0 ] || continue
    for w in $WIRES; do : >"$tmp/acc-$w"; done
    for seed in $SEEDS; do
        for w in $WIRES; do one "$job" "$epochs" "$w" "$seed" >>"$tmp/acc-$w"; done
    done
    base=
    for w in $WIRES; do
        mean=$(awk '{ s += $1 } END { printf "%.4f", s / NR }' "$tmp/acc-$w")
        [ -n "$base" ] || base=$mean
        printf '%-5s %-5s %6s  %-28s %8s %14s\n' $m "$w" "$epochs" "$(tr '\n' ' ' <"$tmp/acc-$w")" \
            "$mean" "$(awk -v a="$mean" -v b="$base" 'BEGIN { printf "%+.2f", (a - b) * 100 }')"
    done
done
