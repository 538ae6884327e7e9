#!/usr/bin/env bash
# Issue 5, experiment 2: wall seconds to a test accuracy, the optimizer (probes included)
# against fixed configurations: synchronous (g = 1, momentum 0.9), fully asynchronous (g = N,
# momentum 0.9), and every point of a fixed grid (the best of it is "best fixed").
#
#   bench/time_to_accuracy.sh [--job examples/fashion-mlp.ini] [--target 0.88] [--workers 4]
#                             [--epochs 10] [--lr 0.05] [--grid-groups "1 2 4"]
#                             [--grid-momenta "0 0.3 0.6 0.9"] [--grid-lrs "0.05 0.01"]
#                             [--no-grid]
#
# Every run is `omnivorectl run JOB` with an evaluation every half epoch; the time to the target
# is the wall time of the first evaluation at or above it (none: the run never got there), and
# the run ends there ([job] stop_at_accuracy), so only runs that miss it train every epoch.
# Prints a table, the ratios the issue asks for, and every figure as one JSON object last.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
ctl="$here/build/server/omnivorectl"
job="$here/examples/fashion-mlp.ini" target=0.88 workers=4 epochs=10 lr=0.05
grid_groups="1 2 4" grid_momenta="0 0.3 0.6 0.9" grid_lrs="0.05 0.01" grid=1
while [ $# -gt 0 ]; do
    case "$1" in
    --job) job=$2; shift 2 ;;
    --target) target=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --epochs) epochs=$2; shift 2 ;;
    --lr) lr=$2; shift 2 ;;
    --grid-groups) grid_groups=$2; shift 2 ;;
    --grid-momenta) grid_momenta=$2; shift 2 ;;
    --grid-lrs) grid_lrs=$2; shift 2 ;;
    --no-grid) grid=0; shift ;;
    -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    *) echo "time_to_accuracy: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$ctl" ] || { echo "time_to_accuracy: build first (deploy/build.sh): no $ctl" >&2; exit 2; }

runs=()
# run NAME SET...: one job; prints a table row and appends a JSON record.
run() {
    local name=$1
    shift
    local sets=()
    for s in "$@"; do sets+=(--set "$s"); done
    local line
    line=$("$ctl" run "$job" --workers "$workers" --json --set job.epochs="$epochs" \
        --set eval.every_epochs=0.5 --set checkpoint.every_s=0 \
        --set job.stop_at_accuracy="$target" "${sets[@]}" 2>/dev/null |
        tail -n 1)
    local rec
    rec=$(python3 - "$line" "$name" "$target" <<'PY'
import json, sys
d = json.loads(sys.argv[1])
target = float(sys.argv[3])
hit = next((h for h in d["history"] if h["test_accuracy"] >= target), None)
phases = [(p["groups"], p["momentum"], p["learning_rate"]) for p in d.get("optimizer", {}).get("phases", [])]
print(json.dumps({"name": sys.argv[2], "seconds_to_target": hit["wall_seconds"] if hit else None,
                  "final_accuracy": d["test_accuracy"], "wall_seconds": d["wall_seconds"],
                  "groups": d["groups"], "momentum": d["momentum"],
                  "learning_rate": d["learning_rate"], "phases": phases}))
PY
)
    runs+=("$rec")
    python3 -c '
import json, sys
r = json.loads(sys.argv[1])
t = "%.1f" % r["seconds_to_target"] if r["seconds_to_target"] is not None else "never"
print("%-28s %-10s %-9s %-8s %s" % (r["name"], t, r["final_accuracy"], r["wall_seconds"],
                                     r["phases"] or ""))' "$rec"
}

printf '# time to %s test accuracy: %s, %s workers, up to %s epochs\n' "$target" \
    "$(basename "$job")" "$workers" "$epochs"
printf '%-28s %-10s %-9s %-8s %s\n' run seconds final wall phases
run optimizer optimizer.enabled=yes
run "sync g=1 m=0.9" cluster.groups=1 train.momentum=0.9 train.learning_rate="$lr"
run "async g=$workers m=0.9" cluster.groups="$workers" cluster.staleness=none \
    train.momentum=0.9 train.learning_rate="$lr"
if [ "$grid" = 1 ]; then
    for g in $grid_groups; do
        for m in $grid_momenta; do
            for l in $grid_lrs; do
                run "fixed g=$g m=$m lr=$l" cluster.groups="$g" cluster.staleness=none \
                    train.momentum="$m" train.learning_rate="$l"
            done
        done
    done
fi
json="[$(IFS=,; echo "${runs[*]}")]"
python3 - "$json" "$target" <<'PY'
import json, sys
runs = json.loads(sys.argv[1])
t = lambda r: r["seconds_to_target"]
opt = runs[0]
naive = [r for r in runs[1:3] if t(r) is not None]
fixed = [r for r in runs[3:] if t(r) is not None]
best = min(fixed, key=t) if fixed else None
out = {"experiment": "time_to_accuracy", "target": float(sys.argv[2]), "runs": runs}
if t(opt) is not None and best:
    out["optimizer_over_best_fixed"] = t(opt) / t(best)
    print("# optimizer / best fixed (%s): %.2fx (goal <= 1.15)" % (best["name"], t(opt) / t(best)))
worse = max(naive, key=t) if len(naive) == 2 else None
if t(opt) is not None and worse:
    out["worse_naive_over_optimizer"] = t(worse) / t(opt)
    print("# worse naive (%s) / optimizer: %.2fx (goal >= 2)" % (worse["name"], t(worse) / t(opt)))
for r in runs[1:3]:
    if t(r) is None:
        print("# %s never reached the target" % r["name"])
print(json.dumps(out))
PY
