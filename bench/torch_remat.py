#!/usr/bin/python3
"""torch_remat.py — the PyTorch twin of bench_remat's chain: activation
checkpointing with torch.utils.checkpoint.checkpoint_sequential, measured.

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \\
    /usr/bin/python3 bench/torch_remat.py [--segments 0,4,6] [--batch 256] \\
        [--steps 5] [--warmup 2] [--threads 2] [--out bench/out/torch_remat.json] [--append]

The model is nn.Sequential(32 x (nn.Linear(1024, 1024), nn.ReLU()),
nn.Linear(1024, 10)) -- 65 modules -- with cross-entropy, batch 256,
torch.optim.SGD(lr=0.01) and zero_grad(set_to_none=False) (torch 1.13's
default; bench_remat keeps its gradients the same way). Segments 0 is keep
everything; N > 0 is checkpoint_sequential(model, N, x): segments of 65 // N
modules, every one but the last run without saving and recomputed in the
backward. Torch 1.13's checkpoint_sequential is the reentrant one, which
gives the checkpointed segments' parameters gradients only when the input
requires grad, so x.requires_grad_() for N > 0 (one extra 256x1024x1024
GEMM, dx of the first layer: about 1% of the step).

Each configuration runs in a fresh process (python3 this-script --worker N),
so memory readings are its own, with glibc's mmap threshold fixed at 64 KiB
(MALLOC_MMAP_THRESHOLD_) so that every freed tensor above it goes back to the
system at once and the RSS follows the live tensors. Per configuration:

- median ms/step over --steps timed steps after --warmup untimed ones, and
  the median process CPU time per step (time.process_time, all threads);
- held_bytes: what the forward saves for backward, summed over distinct
  storages by torch.autograd.graph.saved_tensors_hooks, parameters and the
  input batch left out (bench_remat's "held" leaves the batch out too);
- held_rss_bytes: the RSS after forward and loss minus the RSS before;
- peak_bytes: the in-step peak, the highest RSS during one whole step
  (zero_grad, forward, backward, optimizer step) minus the RSS before it,
  read from VmHWM after resetting it (echo 5 > /proc/self/clear_refs).

The two readings of each are printed; the chart uses held_bytes and
peak_bytes. With --append, this run is added to the runs already in --out and
each point's median is taken over every timed step of every run (bench_remat
runs this between its rounds so that the engines alternate). The order of the
configurations is reversed on every other run.

Debian's torch calls whatever libblas.so.3 the loader finds; the reference
BLAS runs nn.Linear at about 4 GFLOP/s. The script lists the BLAS libraries
mapped into the process and prints the GFLOP/s of a 1024x1024 matmul.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint_sequential

SLOW_BLAS_GFLOPS = 15.0


def blas_check():
    """The BLAS files mapped into this process and the GFLOP/s of a 1024x1024
    float32 matmul (best of 5)."""
    libs = set()
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "blas" in os.path.basename(path):
                libs.add(path)
    a, b = torch.rand(1024, 1024), torch.rand(1024, 1024)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b)
        best = min(best, time.perf_counter() - t0)
    return sorted(libs), 2 * 1024 ** 3 / best / 1e9


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


# ---- one configuration, in its own process ---------------------------------

def worker(o):
    torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    layers = []
    for _ in range(32):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    model = nn.Sequential(*layers, nn.Linear(1024, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    segs = o.worker
    x = torch.rand(o.batch, 1024)
    y = torch.randint(0, 10, (o.batch,))
    if segs > 0:
        x.requires_grad_()  # reentrant checkpointing needs it (see the docstring)

    def forward():
        out = model(x) if segs == 0 else checkpoint_sequential(model, segs, x)
        return nn.functional.cross_entropy(out, y)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = forward()
        loss.backward()
        opt.step()
        return loss.item()

    for _ in range(o.warmup):
        step()

    # held for backward: distinct storages the forward saves
    skip = {storage_key(p) for p in model.parameters()} | {storage_key(x)}
    saved = {}

    def pack(t):
        k = storage_key(t)
        if k not in skip:
            saved[k] = k[1]
        return t

    opt.zero_grad(set_to_none=False)
    rss0 = status_kib("VmRSS")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = forward()
    held_rss = (status_kib("VmRSS") - rss0) * 1024
    held = sum(saved.values())
    loss.backward()
    opt.step()
    del loss

    # in-step peak: VmHWM over one whole step, reset just before it
    rss0 = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    step()
    peak = (status_kib("VmHWM") - rss0) * 1024

    ms, cpu = [], []
    first = last = None
    for i in range(o.steps):
        t0, u0 = time.perf_counter(), time.process_time()
        last = step()
        ms.append((time.perf_counter() - t0) * 1e3)
        cpu.append((time.process_time() - u0) * 1e3)
        first = last if first is None else first
    print(json.dumps({"segments": segs, "median_ms": statistics.median(ms), "ms": ms, "cpu_ms": cpu,
                      "held_bytes": held, "held_rss_bytes": held_rss, "peak_bytes": peak,
                      "first_loss": first, "last_loss": last, "threads": torch.get_num_threads()}))


# ---- the driver ---------------------------------------------------------------

def label(segs):
    return "none" if segs == 0 else f"seg{segs}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", default="0,4,6", help="comma-separated; 0 is keep everything")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "out",
                                                  "torch_remat.json"))
    ap.add_argument("--append", action="store_true", help="add this run to those in --out")
    ap.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    o = ap.parse_args()
    if o.worker is not None:
        worker(o)
        return

    torch.set_num_threads(o.threads)
    libs, gflops = blas_check()
    print(f"torch_remat.py: torch {torch.__version__}, {o.threads} threads; BLAS: "
          f"{', '.join(libs) or 'none mapped'}; 1024x1024 matmul {gflops:.1f} GFLOP/s", file=sys.stderr)
    if gflops < SLOW_BLAS_GFLOPS:
        print("torch_remat.py: warning: that looks like the reference BLAS; set "
              "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp", file=sys.stderr)

    runs = []
    if o.append and os.path.exists(o.out):
        with open(o.out) as f:
            runs = json.load(f).get("runs", [])
    segments = [int(s) for s in o.segments.split(",")]
    order = segments if len(runs) % 2 == 0 else segments[::-1]
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(o.threads))
    results = {}
    for segs in order:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(segs), "--batch", str(o.batch),
               "--steps", str(o.steps), "--warmup", str(o.warmup), "--threads", str(o.threads),
               "--seed", str(o.seed)]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if p.returncode:
            sys.exit(f"torch_remat.py: the worker for {label(segs)} exited with {p.returncode}")
        results[segs] = json.loads(p.stdout.strip().splitlines()[-1])
        r = results[segs]
        print(f"torch_remat.py: {label(segs)}: {r['median_ms']:.1f} ms/step, held {r['held_bytes'] / 2**20:.1f} "
              f"MiB (RSS {r['held_rss_bytes'] / 2**20:.1f}), in-step peak RSS {r['peak_bytes'] / 2**20:.1f} MiB",
              file=sys.stderr)
    runs.append({"gflops": round(gflops, 2), "configs": [results[s] for s in segments]})

    points = []
    for i, segs in enumerate(segments):
        per = [run["configs"][i] for run in runs if i < len(run["configs"])]
        ms = [t for r in per for t in r["ms"]]
        cpu = [t for r in per for t in r["cpu_ms"]]
        points.append({"label": label(segs), "segments": segs, "median_ms": statistics.median(ms),
                       "cpu_median_ms": statistics.median(cpu),
                       "held_bytes": statistics.median(r["held_bytes"] for r in per),
                       "held_rss_bytes": statistics.median(r["held_rss_bytes"] for r in per),
                       "peak_bytes": statistics.median(r["peak_bytes"] for r in per),
                       "runs": len(per), "steps": len(ms)})
    for p in points:
        p["ratio"] = p["median_ms"] / points[0]["median_ms"]
        p["cpu_ratio"] = p["cpu_median_ms"] / points[0]["cpu_median_ms"]
    doc = {"impl": "torch", "torch": torch.__version__, "threads": o.threads, "batch": o.batch,
           "blas_libraries": libs, "matmul_1024_gflops": round(gflops, 2), "blas_ok": gflops >= SLOW_BLAS_GFLOPS,
           "model": "32x(Linear(1024,1024)+ReLU)+Linear(1024,10)", "runs": runs}
    # "points" last: bench_remat reads the objects after it
    os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
    with open(o.out + ".tmp", "w") as f:
        f.write(json.dumps(doc, indent=1)[:-2] + ',\n "points": [\n')
        f.write(",\n".join("  " + json.dumps(p) for p in points) + "\n ]\n}\n")
    os.replace(o.out + ".tmp", o.out)
    print("| config | ms/step | time ratio | CPU-time ratio | held MiB | held RSS MiB | in-step peak RSS MiB | "
          "in-step ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in points:
        print(f"| torch {p['label']} | {p['median_ms']:.1f} | {p['ratio']:.2f}x | {p['cpu_ratio']:.2f}x | "
              f"{p['held_bytes'] / 2**20:.1f} | "
              f"{p['held_rss_bytes'] / 2**20:.1f} | {p['peak_bytes'] / 2**20:.1f} | "
              f"{p['peak_bytes'] / points[0]['peak_bytes']:.2f} |")


if __name__ == "__main__":
    main()
