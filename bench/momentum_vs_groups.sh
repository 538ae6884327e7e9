#!/usr/bin/env bash
# Issue 5, experiment 1: "asynchrony begets momentum". For each number of compute groups g, a
# grid of explicit momentum values on short runs of the same job (same seed, same learning rate,
# the same images); the best momentum per g should fall as g grows, since g asynchronous groups
# add an implicit momentum of about 1 - 1/g.
#
#   bench/momentum_vs_groups.sh [--workers N] [--groups "1 2 4"] [--momenta "0 0.3 0.6 0.9"]
#                               [--lr 0.05] [--images 20000] [--epochs 1] [--repeats 1]
#
# Each point is `omnivorectl run examples/fashion-mlp.ini` with --set overrides, scored by the
# final test loss (lower is better; test accuracy is printed too). Prints a table, then every
# figure as one JSON object on the last line. Needs the build (deploy/build.sh) and Fashion-MNIST.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ctl="$here/build/server/omnivorectl"
job="$here/examples/fashion-mlp.ini"
workers=4 groups="1 2 4" momenta="0 0.3 0.6 0.9" lr=0.05 images=20000 epochs=1 repeats=1
while [ $# -gt 0 ]; do
    case "$1" in
    --workers) workers=$2; shift 2 ;;
    --groups) groups=$2; shift 2 ;;
    --momenta) momenta=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --images) images=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "momentum_vs_groups: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$ctl" ] || { echo "momentum_vs_groups: build first (deploy/build.sh): no $ctl" >&2; exit 2; }

results=()
printf '# momentum vs groups: %s workers, lr %s, %s images x %s epochs, staleness none\n' \
    "$workers" "$lr" "$images" "$epochs"
printf '%-6s %-9s %-10s %-10s %-8s\n' groups momentum test_loss accuracy seconds
for g in $groups; do
    for m in $momenta; do
        for r in $(seq 1 "$repeats"); do
            line=$("$ctl" run "$job" --workers "$workers" --json \
                --set cluster.groups="$g" --set cluster.staleness=none \
                --set train.momentum="$m" --set train.learning_rate="$lr" \
                --set data.train_limit="$images" --set job.epochs="$epochs" \
                --set eval.every_epochs=0 --set checkpoint.every_s=0 2>/dev/null | tail -n 1)
            read -r loss acc secs < <(python3 -c '
import json, sys
d = json.loads(sys.argv[1])
print(d["test_loss"], d["test_accuracy"], d["wall_seconds"])' "$line")
            printf '%-6s %-9s %-10s %-10s %-8s\n' "$g" "$m" "$loss" "$acc" "$secs"
            results+=("{\"groups\":$g,\"momentum\":$m,\"repeat\":$r,\"test_loss\":$loss,\"test_accuracy\":$acc,\"wall_seconds\":$secs}")
        done
    done
done
json="[$(IFS=,; echo "${results[*]}")]"
python3 - "$json" "$workers" "$lr" "$images" "$epochs" <<'PY'
import json, sys, statistics
rows = json.loads(sys.argv[1])
best = {}
for g in sorted({r["groups"] for r in rows}):
    by_m = {}
    for r in rows:
        if r["groups"] == g:
            by_m.setdefault(r["momentum"], []).append(r["test_loss"])
    med = {m: statistics.median(v) for m, v in by_m.items()}
    best[g] = min(med, key=lambda m: (med[m], -m))
print("# best momentum per g (lowest median test loss): " +
      ", ".join(f"g={g}: {m}" for g, m in best.items()))
print(json.dumps({"experiment": "momentum_vs_groups", "workers": int(sys.argv[2]),
                  "learning_rate": float(sys.argv[3]), "images": int(sys.argv[4]),
                  "epochs": int(sys.argv[5]), "best_momentum": {str(g): m for g, m in best.items()},
                  "runs": rows}))
PY
