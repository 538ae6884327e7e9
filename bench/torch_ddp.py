#!/usr/bin/python3
"""PyTorch DDP on the same job as omnivore's Fashion-MNIST examples, for bench/cluster_scaling.sh.

N processes (gloo, one thread each: OPENBLAS_NUM_THREADS and OMP_NUM_THREADS are 1), each on its
slice of the training set with its own batch, SGD with the example's learning rate and momentum,
softmax cross-entropy, pixels scaled by 1/255. Rank 0 evaluates on the test set every
--eval-every epochs, on a clock that is paused meanwhile (omnivore's evaluator runs beside the
training too). Prints one JSON object: images_per_second (training images over training
seconds), seconds_to (training seconds to the first evaluation at or above --target), the final
test accuracy.

Needs Debian's python3-torch for /usr/bin/python3 (apt-get install python3-torch).

    bench/torch_ddp.py --procs 2 --batch 64 --epochs 2 [--model mlp|cnn] [--target 0.85]
        [--limit N]                      (the first N training images only)
    bench/torch_ddp.py --rank R --procs N --master ADDR:PORT ...   (one rank of N, started by
        hand on its own host: the others are started the same way; rank 0 prints the JSON)
"""
import argparse
import gzip
import json
import os
import socket
import sys
import time

DATA = "/usr/share/datasets/fashion-mnist"


def idx(path):
    with gzip.open(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = [int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims)]
    import numpy as np
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def model_of(name, nn, hidden=256):
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), nn.ReLU(),
                             nn.Linear(hidden, 10))
    return nn.Sequential(
        nn.Conv2d(1, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(3136, 256), nn.ReLU(), nn.Linear(256, 10))


def evaluate(model, x, y, torch):
    model.eval()
    correct = 0
    with torch.no_grad():
        for i in range(0, len(x), 1000):
            correct += (model(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum().item()
    model.train()
    return correct / len(x)


def rank_main(rank, a):
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=a.procs)
    a.limit = a.limit or 60000
    torch.manual_seed(42)
    model = nn.parallel.DistributedDataParallel(model_of(a.model, nn, a.hidden))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=a.momentum)
    loss_fn = nn.CrossEntropyLoss()
    xs = torch.from_numpy(idx(f"{DATA}/train-images-idx3-ubyte.gz")[:a.limit].copy()).float()
    xs = xs / 255.0
    ys = torch.from_numpy(idx(f"{DATA}/train-labels-idx1-ubyte.gz")[:a.limit].copy()).long()
    n = len(xs) // a.procs
    x, y = xs[rank * n:(rank + 1) * n].unsqueeze(1), ys[rank * n:(rank + 1) * n]
    if rank == 0:
        tx = torch.from_numpy(idx(f"{DATA}/t10k-images-idx3-ubyte.gz").copy()).float() / 255.0
        tx = tx.unsqueeze(1)
        ty = torch.from_numpy(idx(f"{DATA}/t10k-labels-idx1-ubyte.gz").copy()).long()
    steps = n // a.batch
    eval_steps = max(1, int(steps * a.eval_every))
    train_s, seconds_to, acc, images = 0.0, None, float("nan"), 0
    g = torch.Generator().manual_seed(rank)
    for epoch in range(a.epochs):
        order = torch.randperm(n, generator=g)
        t0 = time.perf_counter()
        for s in range(steps):
            idx_ = order[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad()
            loss_fn(model(x[idx_]), y[idx_]).backward()
            opt.step()
            images += a.batch * a.procs
            if (s + 1) % eval_steps == 0 or s + 1 == steps:
                dist.barrier()
                train_s += time.perf_counter() - t0
                if rank == 0:
                    acc = evaluate(model, tx, ty, torch)
                    if seconds_to is None and acc >= a.target:
                        seconds_to = train_s
                dist.barrier()
                t0 = time.perf_counter()
    if rank == 0:
        print(json.dumps({"procs": a.procs, "batch": a.batch, "model": a.model,
                          "images_per_second": round(images / train_s, 1),
                          "seconds_to": None if seconds_to is None else round(seconds_to, 2),
                          "target": a.target, "test_accuracy": round(acc, 4),
                          "train_seconds": round(train_s, 2)}))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--procs", type=int, default=2)
    p.add_argument("--batch", type=int, default=64, help="images per process per step")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn"])
    p.add_argument("--hidden", type=int, default=256, help="the MLP's hidden width")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--target", type=float, default=0.85)
    p.add_argument("--eval-every", type=float, default=0.25, help="epochs between evaluations")
    p.add_argument("--limit", type=int, default=0, help="training images to use (0: all)")
    p.add_argument("--rank", type=int, default=-1, help="run this one rank (with --master)")
    p.add_argument("--master", default="", help="rank 0's ADDR:PORT for --rank")
    a = p.parse_args()
    try:
        import torch.multiprocessing as mp
    except ImportError as e:
        print(json.dumps({"error": f"PyTorch is not installed ({e}): apt-get install python3-torch"}))
        return 2
    os.environ.update(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    if a.rank >= 0:
        addr, port = a.master.rsplit(":", 1)
        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=port)
        rank_main(a.rank, a)
        return 0
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    mp.spawn(rank_main, args=(a,), nprocs=a.procs, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
