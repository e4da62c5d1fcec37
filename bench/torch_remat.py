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

Memory is read once per configuration, each in a fresh process (this
script with --worker N), with glibc's mmap threshold fixed at 64 KiB
(MALLOC_MMAP_THRESHOLD_) so that every freed tensor above it goes back to the
system at once and the RSS follows the live tensors:

- held_bytes: what the forward saves for backward, summed over distinct
  storages by torch.autograd.graph.saved_tensors_hooks, parameters and the
  input batch left out (bench_remat's "held" leaves the batch out too);
- held_rss_bytes: the RSS after forward and loss minus the RSS before;
- peak_bytes: the in-step peak, the highest RSS during one whole step
  (zero_grad, forward, backward, optimizer step) minus the RSS before it,
  read from VmHWM after resetting it (echo 5 > /proc/self/clear_refs).

Time is measured in this process, all configurations on one model (as
bench_remat's share their weights): --warmup steps each, then --steps rounds
of one step per configuration, the order reversed every other round (and
every other run). Per configuration: the median ms/step; the time ratio, the
median over rounds of its step's time over keep-everything's in the same
round (drift on a shared machine cancels); the ratio of medians; the median
process CPU time (time.process_time, all threads) in the JSON. With
--append, this run joins the runs already in --out (memory is not measured
again) and every statistic is over all of them: bench_remat runs this
between its groups of rounds so that the two engines alternate.

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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_blas, run from any cwd
from torch_blas import SLOW_BLAS_GFLOPS, blas_check


def status_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field} in /proc/self/status")


def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


# ---- the model and its step --------------------------------------------------

def make_model():
    layers = []
    for _ in range(32):
        layers += [nn.Linear(1024, 1024), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(1024, 10))


class Config:
    """One way to run the step: keep everything (segs 0) or checkpoint_sequential."""

    def __init__(self, model, opt, segs, batch):
        self.model, self.opt, self.segs = model, opt, segs
        self.x = torch.rand(batch, 1024)
        self.y = torch.randint(0, 10, (batch,))
        if segs > 0:
            self.x.requires_grad_()  # reentrant checkpointing needs it (see the docstring)

    def forward(self):
        out = self.model(self.x) if self.segs == 0 else checkpoint_sequential(self.model, self.segs, self.x)
        return nn.functional.cross_entropy(out, self.y)

    def step(self):
        self.opt.zero_grad(set_to_none=False)
        loss = self.forward()
        loss.backward()
        self.opt.step()
        return loss.item()


def memory_worker(o):
    """One configuration's memory, in a fresh process; prints one JSON line."""
    torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    c = Config(model, opt, o.worker, o.batch)
    for _ in range(max(o.warmup, 1)):
        c.step()

    # held for backward: distinct storages the forward saves
    skip = {storage_key(p) for p in model.parameters()} | {storage_key(c.x)}
    saved = {}

    def pack(t):
        k = storage_key(t)
        if k not in skip:
            saved[k] = k[1]
        return t

    opt.zero_grad(set_to_none=False)
    rss0 = status_kib("VmRSS")
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = c.forward()
    held_rss = (status_kib("VmRSS") - rss0) * 1024
    loss.backward()
    opt.step()
    del loss

    # in-step peak: VmHWM over one whole step, reset just before it
    rss0 = status_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    c.step()
    peak = (status_kib("VmHWM") - rss0) * 1024
    print(json.dumps({"segments": o.worker, "held_bytes": sum(saved.values()), "held_rss_bytes": held_rss,
                      "peak_bytes": peak}))


def time_configs(o, segments, reverse):
    """Every configuration in this process, on one model (as bench_remat
    shares its weights): --warmup steps each, then --steps rounds of one timed
    step each, the order reversed every other round."""
    torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    cfgs = [Config(model, opt, s, o.batch) for s in segments]
    for c in cfgs:
        for _ in range(o.warmup):
            c.step()
    ms = [[] for _ in cfgs]
    cpu = [[] for _ in cfgs]
    for r in range(o.steps):
        idx = list(range(len(cfgs)))
        if (r % 2 == 1) != reverse:
            idx.reverse()
        for i in idx:
            t0, u0 = time.perf_counter(), time.process_time()
            cfgs[i].step()
            ms[i].append((time.perf_counter() - t0) * 1e3)
            cpu[i].append((time.process_time() - u0) * 1e3)
    return ms, cpu


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
        memory_worker(o)
        return

    torch.set_num_threads(o.threads)
    libs, gflops = blas_check()
    print(f"torch_remat.py: torch {torch.__version__}, {o.threads} threads; BLAS: "
          f"{', '.join(libs) or 'none mapped'}; 1024x1024 matmul {gflops:.1f} GFLOP/s", file=sys.stderr)
    if gflops < SLOW_BLAS_GFLOPS:
        print("torch_remat.py: warning: that looks like the reference BLAS; set "
              "LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp", file=sys.stderr)

    segments = [int(s) for s in o.segments.split(",")]
    runs, memory = [], {}
    if o.append and os.path.exists(o.out):
        with open(o.out) as f:
            prev = json.load(f)
        runs = [r for r in prev.get("runs", []) if r.get("segments") == segments]
        memory = {int(k): v for k, v in prev.get("memory", {}).items()}

    # memory: once per configuration, each in a fresh process
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS=str(o.threads))
    for segs in segments:
        if segs in memory:
            continue
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", str(segs), "--batch", str(o.batch),
               "--warmup", str(o.warmup), "--threads", str(o.threads), "--seed", str(o.seed)]
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, text=True)
        if p.returncode:
            sys.exit(f"torch_remat.py: the memory worker for {label(segs)} exited with {p.returncode}")
        memory[segs] = json.loads(p.stdout.strip().splitlines()[-1])
        r = memory[segs]
        print(f"torch_remat.py: {label(segs)}: held {r['held_bytes'] / 2**20:.1f} MiB (RSS "
              f"{r['held_rss_bytes'] / 2**20:.1f}), in-step peak RSS {r['peak_bytes'] / 2**20:.1f} MiB",
              file=sys.stderr)

    # time: all configurations in this process, alternating
    ms, cpu = time_configs(o, segments, reverse=len(runs) % 2 == 1)
    runs.append({"segments": segments, "gflops": round(gflops, 2), "ms": ms, "cpu_ms": cpu})
    for i, segs in enumerate(segments):
        print(f"torch_remat.py: {label(segs)}: " + " ".join(f"{t:.0f}" for t in ms[i]) + " ms", file=sys.stderr)

    points = []
    for i, segs in enumerate(segments):
        all_ms = [t for r in runs for t in r["ms"][i]]
        all_cpu = [t for r in runs for t in r["cpu_ms"][i]]
        m = memory[segs]
        points.append({"label": label(segs), "segments": segs, "median_ms": statistics.median(all_ms),
                       "min_ms": min(all_ms), "cpu_median_ms": statistics.median(all_cpu),
                       "held_bytes": m["held_bytes"], "held_rss_bytes": m["held_rss_bytes"],
                       "peak_bytes": m["peak_bytes"], "runs": len(runs), "steps": len(all_ms)})
    for i, p in enumerate(points):
        # against keep-everything in the same round (drift hits both), then over the rounds of all runs
        p["ratio"] = statistics.median(a / b for r in runs for a, b in zip(r["ms"][i], r["ms"][0]))
        p["ratio_of_medians"] = p["median_ms"] / points[0]["median_ms"]
        p["min_ratio"] = p["min_ms"] / points[0]["min_ms"]
        p["cpu_ratio"] = p["cpu_median_ms"] / points[0]["cpu_median_ms"]
    doc = {"impl": "torch", "torch": torch.__version__, "threads": o.threads, "batch": o.batch,
           "blas_libraries": libs, "matmul_1024_gflops": round(gflops, 2), "blas_ok": gflops >= SLOW_BLAS_GFLOPS,
           "model": "32x(Linear(1024,1024)+ReLU)+Linear(1024,10)", "memory": {str(k): v for k, v in memory.items()},
           "runs": runs}
    # "points" last: bench_remat reads the objects after it
    os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
    with open(o.out + ".tmp", "w") as f:
        f.write(json.dumps(doc)[:-1] + ',\n "points": [\n')
        f.write(",\n".join("  " + json.dumps(p) for p in points) + "\n ]\n}\n")
    os.replace(o.out + ".tmp", o.out)
    print("| config | ms/step (median) | time ratio | ratio of medians | held MiB | held RSS MiB | "
          "in-step peak RSS MiB | in-step ratio |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for p in points:
        print(f"| torch {p['label']} | {p['median_ms']:.1f} | {p['ratio']:.2f}x | {p['ratio_of_medians']:.2f}x | "
              f"{p['held_bytes'] / 2**20:.1f} | {p['held_rss_bytes'] / 2**20:.1f} | "
              f"{p['peak_bytes'] / 2**20:.1f} | {p['peak_bytes'] / points[0]['peak_bytes']:.2f} |")


if __name__ == "__main__":
    main()
