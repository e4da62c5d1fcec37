#!/usr/bin/python3
"""torch_step.py — the PyTorch twin of bench_step: the same model, the same
kind of synthetic data, the same optimizer defaults, the same JSON fields.

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \\
    /usr/bin/python3 bench/torch_step.py --model NAME|FILE --batch B \\
        --optimizer sgd|adam|adamw --steps N --threads T [--warmup W] [--json]

The model is built from the same model file frugal reads (models/NAME.model
for a built-in name), so the two cannot drift apart: every statement of the
model-file grammar maps to the nn module PyTorch users would write
(conv2d -> nn.Conv2d, batchnorm -> nn.BatchNorm1d/2d, residual ... end ->
body(x) + shortcut(x), ...). Inputs are uniform in [0, 1), labels uniform in
[0, classes), from a fixed seed, drawn in place before every step outside the
timed region. One step is zero_grad(set_to_none=True), forward, loss,
backward, optimizer.step() -- frugal's step and PyTorch 2.x's defaults.

Debian's torch calls whatever libblas.so.3 the dynamic loader finds; the
reference BLAS runs nn.Linear at about 4 GFLOP/s. Run it with LD_LIBRARY_PATH
pointing at Debian's OpenMP OpenBLAS (bench/compare.sh does); the script
reports which BLAS got loaded and the GFLOP/s of a 1024x1024 matmul, and
warns when it looks like the reference BLAS.

torch has no CPU allocator statistics, so peak_allocated_bytes and
peak_reserved_bytes are null; peak_rss_bytes is getrusage's ru_maxrss, as in
bench_step, and rss_after_import_bytes is the peak RSS before the model exists.
"""
import argparse
import json
import re
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_blas, run from any cwd
from torch_blas import blas_report

RSS_AFTER_IMPORT = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# ---- the model file, as PyTorch modules ------------------------------------

class Residual(nn.Module):
    """y = body(x) + shortcut(x); an empty shortcut is the identity."""

    def __init__(self, body, shortcut):
        super().__init__()
        self.body = body
        self.shortcut = shortcut

    def forward(self, x):
        return self.body(x) + self.shortcut(x)


class GlobalAvgPool(nn.Module):
    """(N, C, H, W) -> (N, C): the mean over H and W."""

    def forward(self, x):
        return x.mean(dim=(2, 3))


def model_path(name):
    if os.path.exists(name):
        return name
    path = os.path.join(REPO, "models", name + ".model")
    if os.path.exists(path):
        return path
    sys.exit(f"torch_step.py: no model file '{name}' (nor {path})")


def parse_model(path):
    """Returns (nn.Sequential, per-sample input shape, loss name)."""
    in_shape, loss = None, "cross_entropy"
    stack = [[[], None]]  # per open block: [body modules, shortcut modules or None]
    cur = None

    def fail(lineno, msg):
        sys.exit(f"torch_step.py: {path}:{lineno}: {msg}")

    def out_hw(h, w, k, s, p):
        return (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1

    block_in = []  # shape at each open `residual`
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            toks = line.split("#", 1)[0].split()
            if not toks:
                continue
            word, pos, kv = toks[0], [], {}
            for t in toks[1:]:
                if "=" in t:
                    k, v = t.split("=", 1)
                    kv[k] = v
                else:
                    pos.append(t)
            bias = kv.get("bias", "true") == "true"
            target = stack[-1][1] if stack[-1][1] is not None else stack[-1][0]
            if word == "input":
                in_shape = tuple(int(v) for v in pos)
                cur = in_shape
                continue
            if cur is None:
                fail(lineno, "a layer before `input`")
            if word == "linear":
                if len(cur) != 1:
                    fail(lineno, f"linear on a {cur} input (add flatten)")
                target.append(nn.Linear(cur[0], int(pos[0]), bias=bias))
                cur = (int(pos[0]),)
            elif word == "conv2d":
                k, s, p = int(kv["kernel"]), int(kv.get("stride", 1)), int(kv.get("padding", 0))
                target.append(nn.Conv2d(cur[0], int(pos[0]), k, stride=s, padding=p, bias=bias))
                cur = (int(pos[0]),) + out_hw(cur[1], cur[2], k, s, p)
            elif word in ("maxpool2d", "avgpool2d"):
                k = int(pos[0])
                s = int(kv.get("stride", k))
                pool = nn.MaxPool2d if word == "maxpool2d" else nn.AvgPool2d
                target.append(pool(k, stride=s))
                cur = (cur[0],) + out_hw(cur[1], cur[2], k, s, 0)
            elif word == "global_avgpool":
                target.append(GlobalAvgPool())
                cur = (cur[0],)
            elif word == "batchnorm":
                target.append(nn.BatchNorm1d(cur[0]) if len(cur) == 1 else nn.BatchNorm2d(cur[0]))
            elif word == "layernorm":
                target.append(nn.LayerNorm(list(cur)))
            elif word in ("relu", "gelu", "sigmoid", "tanh"):
                target.append({"relu": nn.ReLU, "gelu": nn.GELU, "sigmoid": nn.Sigmoid,
                               "tanh": nn.Tanh}[word]())
            elif word == "dropout":
                target.append(nn.Dropout(float(pos[0])))
            elif word == "flatten":
                target.append(nn.Flatten())
                n = 1
                for d in cur:
                    n *= d
                cur = (n,)
            elif word == "residual":
                stack.append([[], None])
                block_in.append(cur)
            elif word == "shortcut":
                stack[-1][1] = []
                stack[-1].append(cur)  # the body's output shape
                cur = block_in[-1]
            elif word == "end":
                body, shortcut = stack[-1][0], stack[-1][1]
                if shortcut is not None:
                    cur = stack[-1][2]
                stack.pop()
                block_in.pop()
                res = Residual(nn.Sequential(*body),
                               nn.Sequential(*shortcut) if shortcut else nn.Identity())
                target = stack[-1][1] if stack[-1][1] is not None else stack[-1][0]
                target.append(res)
            elif word == "loss":
                loss = pos[0]
            else:
                fail(lineno, f"unknown statement '{word}'")
    if in_shape is None or len(stack) != 1:
        fail(0, "no `input`, or a `residual` without `end`")
    return nn.Sequential(*stack[0][0]), in_shape, loss, cur


# ---- the benchmark ----------------------------------------------------------

def blas_core(libs):
    """The kernels the process's OpenBLAS runs (openblas_get_corename), or None."""
    import ctypes
    for path in libs:
        try:
            f = ctypes.CDLL(path).openblas_get_corename
        except (OSError, AttributeError):
            continue
        f.restype = ctypes.c_char_p
        return f().decode()
    return None


def cpu_capability():
    """ATen's vector kernels and oneDNN's version, from torch.__config__.show()."""
    cfg = torch.__config__.show()
    cap = re.search(r"CPU capability usage: (\S+)", cfg)
    dnn = re.search(r"MKL-DNN v([0-9.]+)", cfg)
    return "ATen %s, oneDNN %s" % (cap.group(1) if cap else "?", dnn.group(1) if dnn else "?")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="mlp")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--optimizer", default="sgd", choices=["sgd", "adam", "adamw"])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()

    if o.threads > 0:
        torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    libs, gflops, blas_ok = blas_report("torch_step.py")

    model, in_shape, loss_name, out_shape = parse_model(model_path(o.model))
    if loss_name != "cross_entropy":
        sys.exit(f"torch_step.py: {o.model}: only cross-entropy models are benchmarked")
    classes = out_shape[0]
    model.train()
    params = sum(p.numel() for p in model.parameters())
    if o.optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
    elif o.optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()

    gen = torch.Generator().manual_seed(o.seed)
    x = torch.empty((o.batch,) + in_shape)
    y = torch.empty(o.batch, dtype=torch.long)
    times, first_loss, last_loss = [], None, None
    for i in range(o.warmup + o.steps):
        x.uniform_(0.0, 1.0, generator=gen)
        y.random_(0, classes, generator=gen)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        opt.step()
        last_loss = loss.item()  # the step is synchronous on the CPU; .item() is cheap
        t1 = time.perf_counter()
        if i == 0:
            first_loss = last_loss
        if i >= o.warmup:
            times.append((t1 - t0) * 1e3)

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    res = {
        "impl": "torch", "model": o.model, "batch": o.batch, "optimizer": o.optimizer,
        "threads": torch.get_num_threads(), "steps": o.steps, "warmup": o.warmup,
        "params": params, "median_ms": statistics.median(times),
        "mean_ms": statistics.fmean(times), "min_ms": min(times), "max_ms": max(times),
        "first_loss": first_loss, "last_loss": last_loss,
        "peak_allocated_bytes": None, "peak_reserved_bytes": None, "peak_rss_bytes": rss,
        "rss_after_import_bytes": RSS_AFTER_IMPORT, "torch_version": torch.__version__,
        "blas_libraries": libs, "matmul_1024_gflops": round(gflops, 2), "blas_ok": blas_ok,
        "blas_core": blas_core(libs), "cpu_capability": cpu_capability(),
    }
    if o.json:
        print(json.dumps(res))
    else:
        print(f"torch {torch.__version__} {o.model}, batch {o.batch}, {o.optimizer}, "
              f"{res['threads']} threads: {params} parameters")
        print(f"  BLAS: {', '.join(libs) or 'none mapped'}; 1024x1024 matmul {gflops:.1f} GFLOP/s"
              + ("" if blas_ok else "  (SLOW: reference BLAS?)"))
        print(f"  {o.steps} steps after {o.warmup} warm-up: median {res['median_ms']:.3f} ms/step, "
              f"mean {res['mean_ms']:.3f} (min {res['min_ms']:.3f}, max {res['max_ms']:.3f})")
        print(f"  loss {first_loss:.4f} -> {last_loss:.4f}")
        print(f"  process peak RSS {rss / 2**20:.2f} MiB "
              f"({RSS_AFTER_IMPORT / 2**20:.2f} MiB after import torch)")


if __name__ == "__main__":
    main()
