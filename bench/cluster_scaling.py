#!/usr/bin/python3
"""A cluster against one of its workers alone, and against PyTorch DDP, side by side.

For each case (model and per-worker batch) it measures, in one go: the engine alone (bench_net,
1 thread, that batch: the limit a worker could reach), omnivore with 1, 2 and 4 workers
(`omnivorectl run` on the example job, the group's batch = workers x the per-worker batch, one
synchronous group) and PyTorch DDP with as many processes (bench/torch_ddp.py: gloo, 1 thread
each, the same batch per process, data, learning rate and momentum; skipped with a message when
python3-torch is missing). omnivore and DDP runs alternate; each figure is the median of --runs.
It also runs as many engines alone at once as there are workers (bench_net processes side by
side, no communication, each applying its own update): what the workers' engines do together on
this machine's shared cores, caches and memory bandwidth, so that the cluster's share of it is
the cost of the path. It is a reference, not a strict bound: a group applies one update per
step where the engines apply one each.
It prints images/s, seconds of training to the target test accuracy, the scaling efficiency
(cluster images/s over workers x the engine's images/s at the same per-worker batch), the
cluster's share of the engines-together figure, and the ratio to DDP, then all figures as one
JSON object on its last line.

    bench/cluster_scaling.py [--build build] [--runs 3] [--epochs 3] [--cases mlp:32,mlp:64]
        [--workers 1,2,4] [--target 0.85]     (add cnn:32 for the CNN, with --target 0.88)
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def engine_figure(out, model, batch):
    for line in out.splitlines():
        m = re.match(rf"{model}\s+{batch}\s+1\s+\w+\s+(\d+)", line)
        if m:
            return float(m.group(1))
    raise RuntimeError(f"no {model} batch {batch} line in bench_net's output:\n{out}")


def engines(build, model, batch, n=1):
    """images/s of n engines alone (1 thread each, updates their own), run at the same time."""
    cmd = [f"{build}/bench/bench_net", "--models", model, "--batches", str(batch), "--threads",
           "1", "--reps", "5"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
             for _ in range(n)]
    outs = [pr.communicate()[0] for pr in procs]
    if any(pr.returncode != 0 for pr in procs):
        raise RuntimeError(f"bench_net failed: {cmd}")
    return sum(engine_figure(out, model, batch) for out in outs)


def seconds_to(history, target):
    for h in history:
        if h.get("test_accuracy") is not None and h["test_accuracy"] >= target:
            return h["wall_seconds"]
    return None


def omnivore(build, model, batch, workers, epochs, target):
    cmd = [f"{build}/server/omnivorectl", "run", f"{HERE}/../examples/fashion-{model}.ini",
           "--workers", str(workers), "--json", "--set", f"train.batch_size={batch * workers}",
           "--set", f"job.epochs={epochs}", "--set", "eval.every_epochs=0.25"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    s = json.loads(out.strip().splitlines()[-1])
    return {"images_per_second": s["images_per_second"],
            "seconds_to": seconds_to(s["history"], target),
            "test_accuracy": s["test_accuracy"]}


def ddp(model, batch, procs, epochs, target):
    cmd = ["/usr/bin/python3", f"{HERE}/torch_ddp.py", "--procs", str(procs), "--batch",
           str(batch), "--epochs", str(epochs), "--model", model, "--target", str(target)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    lines = r.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {"error": r.stderr.strip()[-300:]}


def median(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return round(statistics.median(vals), 2) if vals else None


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--cases", default="mlp:32,mlp:64")
    p.add_argument("--workers", default="1,2,4")
    p.add_argument("--target", type=float, default=0.85)
    a = p.parse_args()
    # The DDP runs use Debian's interpreter, whichever one runs this script.
    have_torch = subprocess.run(["/usr/bin/python3", "-c", "import torch"],
                                capture_output=True).returncode == 0
    if not have_torch:
        print("# DDP skipped: python3-torch is not installed (apt-get install python3-torch)")
    print(f"# {a.runs} runs each (median), {a.epochs} epochs, target test accuracy {a.target}; "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}")
    print(f"{'case':<8} {'workers':>7} {'engine':>8} {'together':>8} {'omnivore':>9} {'eff':>5} "
          f"{'of_tog':>6} {'to_acc_s':>8} "
          f"{'ddp':>8} {'ddp_to_s':>8} {'x_ddp':>6} {'acc':>6} {'ddp_acc':>7}")
    results = {}
    for case in a.cases.split(","):
        model, batch = case.split(":")
        batch = int(batch)
        eng = engines(a.build, model, batch)
        for w in [int(x) for x in a.workers.split(",")]:
            together = eng if w == 1 else engines(a.build, model, batch, w)
            ours, theirs = [], []
            for _ in range(a.runs):
                ours.append(omnivore(a.build, model, batch, w, a.epochs, a.target))
                if have_torch:
                    theirs.append(ddp(model, batch, w, a.epochs, a.target))
            o_ips, d_ips = median(ours, "images_per_second"), median(theirs, "images_per_second")
            row = {"engine_images_per_second": eng, "engines_together_images_per_second": together,
                   "images_per_second": o_ips, "efficiency": round(o_ips / (w * eng), 3),
                   "of_together": round(o_ips / together, 3),
                   "seconds_to": median(ours, "seconds_to"),
                   "test_accuracy": median(ours, "test_accuracy"),
                   "ddp_images_per_second": d_ips, "ddp_seconds_to": median(theirs, "seconds_to"),
                   "ddp_test_accuracy": median(theirs, "test_accuracy"),
                   "ratio_ddp": round(o_ips / d_ips, 3) if d_ips else None}
            results[f"{model}_b{batch}_w{w}"] = row
            fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
            print(f"{case:<8} {w:>7} {eng:>8.0f} {together:>8.0f} {o_ips:>9.0f} "
                  f"{row['efficiency']:>5} {row['of_together']:>6} {fmt(row['seconds_to']):>8} "
                  f"{fmt(d_ips):>8} {fmt(row['ddp_seconds_to']):>8} "
                  f"{fmt(row['ratio_ddp']):>6} {fmt(row['test_accuracy']):>6} "
                  f"{fmt(row['ddp_test_accuracy']):>7}", flush=True)
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
