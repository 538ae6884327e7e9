#!/usr/bin/python3
"""The same training steps in PyTorch and in omnivore's engine, case by case, side by side.

For each model (the example MLP 784-256-10, CNN and residual network), batch size and thread count it measures
PyTorch (plain SGD with momentum 0.9, softmax cross-entropy, random inputs, median images/s of
repeats after a warm-up) and then runs bench_net for the same case right after it, so that both
figures come from the same minute of a noisy shared machine. Prints a table with the ratio
ours/PyTorch per case, then all figures as one JSON object on the last line.

Each PyTorch case runs in a child process whose OPENBLAS_NUM_THREADS and OMP_NUM_THREADS are
the case's thread count: Debian's torch does its fp32 matrix products in the system OpenBLAS,
whose pool torch.set_num_threads does not size (left alone, a "1 thread" case ran OpenBLAS on
every core).

Installs nothing: it needs Debian's python3-torch for the system python (/usr/bin/python3).

    bench/torch_side_by_side.py --bench build/bench/bench_net [--reps 7] [--rep-seconds 0.5]
        [--batches 64,256] [--threads 1,2] [--models mlp,cnn,resnet] [--mode split|blas|best]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time


def fail(msg):
    print(f"torch_side_by_side: {msg}", file=sys.stderr)
    print(json.dumps({"error": msg}))
    sys.exit(2)


try:
    import torch
    import torch.nn as nn
except ImportError as e:  # say so plainly: the figures need torch
    fail(f"PyTorch is not installed for {sys.executable} ({e}); "
         "install Debian's python3-torch (apt-get install python3-torch) and run with "
         "/usr/bin/python3")


def make_model(name):
    if name == "resnet":
        # examples/fashion-resnet.model, built from its text as torch_check_export.py does
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from torch_check_export import Net
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "..", "examples", "fashion-resnet.model")) as f:
            return Net(f.read()), (1, 28, 28)
    if name == "mlp":
        return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10)), (784,)
    # examples/fashion-cnn.model
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 256), nn.ReLU(), nn.Linear(256, 10)), (1, 28, 28)


def torch_case(name, batch, threads, reps, rep_seconds):
    torch.set_num_threads(threads)
    torch.manual_seed(1)
    model, shape = make_model(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.rand((batch,) + shape)
    y = torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    warm = 0
    while warm < 3 or time.perf_counter() - t0 < 0.3:
        step()
        warm += 1
    steps = max(2, int(rep_seconds / ((time.perf_counter() - t0) / warm)))
    rates = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        rates.append(steps * batch / (time.perf_counter() - t0))
    return statistics.median(rates)


def torch_case_in_child(name, batch, threads, reps, rep_seconds):
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--torch-case", name, str(batch),
         str(threads), str(reps), str(rep_seconds)],
        check=True, capture_output=True, text=True, env=env).stdout
    return float(out.strip().splitlines()[-1])


def ours_case(bench, name, batch, threads, reps, rep_seconds, mode):
    out = subprocess.run(
        [bench, "--models", name, "--batches", str(batch), "--threads", str(threads),
         "--reps", str(reps), "--rep-seconds", str(rep_seconds)],
        check=True, capture_output=True, text=True).stdout
    figures = json.loads(out.strip().splitlines()[-1])
    cases = [c for c in figures["cases"] if c["threads"] == threads]
    if mode != "best":
        cases = [c for c in cases if c["mode"] == mode] or cases
    best = max(cases, key=lambda c: c["images_per_second"])
    return best, figures["sgemm_peak_gflops"][str(threads)]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", default=os.path.join(os.path.dirname(__file__), "..", "build",
                                                     "bench", "bench_net"))
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--rep-seconds", type=float, default=0.5)
    ap.add_argument("--batches", default="64,256")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--models", default="mlp,cnn")
    ap.add_argument("--torch-case", nargs=5, metavar=("MODEL", "BATCH", "THREADS", "REPS", "SECS"),
                    help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="split", choices=["blas", "split", "best"],
                    help="which of our thread modes to compare (the worker uses split; with "
                         "one thread both are the same)")
    a = ap.parse_args()
    if a.torch_case:
        torch.set_num_interop_threads(1)
        name, batch, threads, reps, secs = a.torch_case
        print(torch_case(name, int(batch), int(threads), int(reps), float(secs)))
        return
    if not os.access(a.bench, os.X_OK):
        fail(f"{a.bench} is not built: run ninja -C build first")
    torch.set_num_interop_threads(1)
    print(f"# torch {torch.__version__}, mkldnn {torch.backends.mkldnn.is_available()}, "
          f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '')}, "
          f"{a.reps} repeats of ~{a.rep_seconds} s, median images/s")
    print(f"{'model':5} {'batch':>6} {'threads':>7} {'ours':>10} {'mode':>6} {'pytorch':>10} "
          f"{'ours/pt':>8}")
    results = []
    for name in a.models.split(","):
        for batch in (int(b) for b in a.batches.split(",")):
            for threads in (int(t) for t in a.threads.split(",")):
                pt = torch_case_in_child(name, batch, threads, a.reps, a.rep_seconds)
                ours, peak = ours_case(a.bench, name, batch, threads, a.reps, a.rep_seconds,
                                       a.mode)
                ratio = ours["images_per_second"] / pt
                print(f"{name:5} {batch:6d} {threads:7d} {ours['images_per_second']:10.0f} "
                      f"{ours['mode']:>6} {pt:10.0f} {ratio:7.2f}x", flush=True)
                results.append({"model": name, "batch": batch, "threads": threads,
                                "ours_images_per_second": round(ours["images_per_second"], 1),
                                "ours_mode": ours["mode"],
                                "ours_peak_fraction": ours["peak_fraction"],
                                "sgemm_peak_gflops": peak,
                                "pytorch_images_per_second": round(pt, 1),
                                "ratio": round(ratio, 3)})
    print(json.dumps({"torch_version": torch.__version__,
                      "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
                      "cases": results}))


if __name__ == "__main__":
    main()
