#!/usr/bin/env python3
"""Loads a model exported by `omnivorectl export ... --out MODEL.safetensors` into the same
network built in PyTorch from the model definition in the file's metadata (strict
load_state_dict: every name and shape must match), evaluates it on the test set, and prints
omnivore's accuracy (from the file's training summary) beside PyTorch's.

Usage: bench/torch_check_export.py MODEL.safetensors [--images T10K-IMAGES.gz]
       [--labels T10K-LABELS.gz] [--scale 1/255] [--mean M] [--std S]
Needs Debian's python3-torch; says so and exits 2 without it."""
import argparse
import gzip
import json
import struct
import sys

try:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
except ImportError:
    print("torch_check_export: PyTorch is not installed (apt install python3-torch)",
          file=sys.stderr)
    sys.exit(2)

FMNIST = "/usr/share/datasets/fashion-mnist/"
DTYPES = {"F32": torch.float32, "I64": torch.int64}


def read_safetensors(path):
    """An independent reader: header length, JSON header, then the tensors' bytes."""
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, t in header.items():
        b, e = t["data_offsets"]
        buf = bytearray(data[base + b:base + e])
        tensors[name] = torch.frombuffer(buf, dtype=DTYPES[t["dtype"]]).reshape(t["shape"])
    return tensors, meta


class Net(nn.Module):
    """The network a model definition describes, with omnivore's export names."""

    def __init__(self, text):
        super().__init__()
        self.steps = []  # (kind, argument)
        counts = {}
        shape = None  # (c, h, w)
        saved = {}

        def name(kind):
            counts[kind] = counts.get(kind, 0) + 1
            return "%s%d" % (kind, counts[kind])

        for line in text.splitlines():
            w = line.split("#")[0].split()
            if not w:
                continue
            k = w[0].lower()
            if k == "input":
                d = [int(x) for x in w[1].split("x")]
                shape = tuple(d) if len(d) == 3 else (d[0], 1, 1)
            elif k == "conv":
                kh, kw = (int(x) for x in (w[2].split("x") * 2)[:2])
                opts = dict(zip(w[3::2], (int(x) for x in w[4::2])))
                s, p = opts.get("stride", 1), opts.get("pad", 0)
                n = name("conv")
                setattr(self, n, nn.Conv2d(shape[0], int(w[1]), (kh, kw), s, p))
                self.steps.append(("mod", n))
                shape = (int(w[1]), (shape[1] + 2 * p - kh) // s + 1,
                         (shape[2] + 2 * p - kw) // s + 1)
            elif k in ("maxpool", "avgpool"):
                kh, kw = (int(x) for x in (w[1].split("x") * 2)[:2])
                opts = dict(zip(w[2::2], (int(x) for x in w[3::2])))
                s = opts.get("stride", kh)
                self.steps.append((k, (kh, kw, s)))
                shape = (shape[0], (shape[1] - kh) // s + 1, (shape[2] - kw) // s + 1)
            elif k == "globalavgpool":
                self.steps.append((k, None))
                shape = (shape[0], 1, 1)
            elif k == "batchnorm":
                n = name("bn")
                vector = shape[1] == 1 and shape[2] == 1
                setattr(self, n, nn.BatchNorm1d(shape[0]) if vector else nn.BatchNorm2d(shape[0]))
                self.steps.append(("mod", n))
            elif k in ("relu", "dropout"):
                self.steps.append((k, None))
            elif k == "flatten":
                self.steps.append(("flat", None))
                shape = (shape[0] * shape[1] * shape[2], 1, 1)
            elif k == "fc":
                n = name("fc")
                setattr(self, n, nn.Linear(shape[0] * shape[1] * shape[2], int(w[1])))
                self.steps.append(("flat", None))
                self.steps.append(("mod", n))
                shape = (int(w[1]), 1, 1)
            elif k == "save":
                saved[w[1]] = shape
                self.steps.append(("save", w[1]))
            elif k == "add":
                src = saved[w[1]]
                proj = None
                if src != shape:
                    proj = name("proj")
                    stride = next(s for s in range(1, src[1] + 1)
                                  if (src[1] - 1) // s + 1 == shape[1])
                    setattr(self, proj, nn.Conv2d(src[0], shape[0], 1, stride, 0))
                self.steps.append(("add", (w[1], proj)))
            elif k == "softmax":
                pass

    def forward(self, x):
        saved = {}
        for kind, arg in self.steps:
            if kind == "mod":
                m = getattr(self, arg)
                if isinstance(m, nn.BatchNorm1d) and x.dim() == 4:
                    x = x.flatten(1)
                x = m(x)
            elif kind == "maxpool":
                x = F.max_pool2d(x, arg[:2], arg[2])
            elif kind == "avgpool":
                x = F.avg_pool2d(x, arg[:2], arg[2])
            elif kind == "globalavgpool":
                x = F.adaptive_avg_pool2d(x, 1)
            elif kind == "relu":
                x = F.relu(x)
            elif kind == "flat":
                x = x.flatten(1)
            elif kind == "save":
                saved[arg] = x
            elif kind == "add":
                s = saved[arg[0]]
                x = x + (getattr(self, arg[1])(s) if arg[1] else s)
        return x


def read_idx(path):
    data = gzip.open(path).read() if path.endswith(".gz") else open(path, "rb").read()
    magic, n = struct.unpack(">II", data[:8])
    dims = [struct.unpack(">I", data[8 + 4 * i:12 + 4 * i])[0] for i in range((magic & 255) - 1)]
    off = 8 + 4 * len(dims)
    return torch.frombuffer(bytearray(data[off:]), dtype=torch.uint8).reshape([n] + dims)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--images", default=FMNIST + "t10k-images-idx3-ubyte.gz")
    ap.add_argument("--labels", default=FMNIST + "t10k-labels-idx1-ubyte.gz")
    ap.add_argument("--scale", type=float, default=1 / 255)
    ap.add_argument("--mean", type=float, default=0.0)
    ap.add_argument("--std", type=float, default=1.0)
    a = ap.parse_args()
    tensors, meta = read_safetensors(a.model)
    net = Net(meta["omnivore_model"])
    net.load_state_dict(tensors, strict=True)
    net.eval()
    x = read_idx(a.images).float() * a.scale
    x = (x - a.mean) / a.std
    x = x.unsqueeze(1) if x.dim() == 3 else x
    y = read_idx(a.labels).long()
    with torch.no_grad():
        correct = sum(int((net(x[i:i + 1000]).argmax(1) == y[i:i + 1000]).sum())
                      for i in range(0, len(y), 1000))
    summary = dict(line.split(":", 1) for line in meta.get("omnivore_summary", "").splitlines()
                   if ":" in line)
    ours = float(summary.get("test_accuracy", "nan"))
    theirs = correct / len(y)
    print("omnivore test_accuracy %.4f, pytorch %.4f (%d images), difference %.2f points"
          % (ours, theirs, len(y), 100 * abs(ours - theirs)))
    sys.exit(0 if abs(ours - theirs) <= 0.001 else 1)


if __name__ == "__main__":
    main()
