#!/usr/bin/python3
"""torch_gpt.py — the PyTorch side of the GPT benchmark: nanoGPT's model in
PyTorch 1.13, trained on bytes of a text, timed and weighed.

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \\
    /usr/bin/python3 bench/torch_gpt.py --data FILE|DIR [--layers 6] [--heads 6] \\
        [--dim 384] [--ctx 256] [--batch 8] [--steps 8] [--warmup 2] [--threads 2] \\
        [--gemm-share] [--autocast bf16] [--json]
    ... bench/torch_gpt.py --data FILE|DIR --sweep 256,512,1024,2048 [--tokens 2048] \\
        [--out bench/out/torch_gpt_sweep.json] [--json]

The model is nanoGPT's model.py (GPT-2's layout) with its defaults for
gpt-tiny: token and position embeddings, N blocks of x + attn(ln_1(x)) and
x + mlp(ln_2(x)), a final LayerNorm, and the head tied to the token embedding
(lm_head.weight is wte.weight). LayerNorm and Linear have biases, the MLP is
4x with GELU(approximate='tanh'), no dropout; nanoGPT's init (normal 0.02,
the residual projections 0.02 / sqrt(2 N)). Attention is written out by
hand, as PyTorch 1.13 has no fused scaled_dot_product_attention:

    att = (q @ k^T) * (1 / sqrt(head_size)); att.masked_fill(causal == 0, -inf);
    softmax(att) @ v

so autograd keeps softmax's (B, heads, T, T) output of every layer for the
backward. The vocabulary is the 256 byte values; the optimizer is
torch.optim.AdamW(lr 3e-4, weight_decay 0.1, torch's betas and eps) over all
parameters, as `frugal train --optimizer adamw --lr 3e-4 --weight-decay 0.1`.
One step is zero_grad(set_to_none=True), forward, cross-entropy over the
B x T next-byte predictions, backward, optimizer.step().

Data: the bytes of --data (a file, or every regular file under a directory
except fortune's .dat/.u8 indexes, in sorted order), read whole. Each batch
is B windows at offsets drawn from a generator seeded with --seed: x =
bytes[o:o+T], y = bytes[o+1:o+T+1], drawn before each step outside the timed
region.

What it reports (one process is one configuration, so peak RSS is this
configuration's):
- median_ms (and mean/min/max) over --steps timed steps after --warmup;
- peak_rss_bytes: getrusage's ru_maxrss at the end, the whole process
  (interpreter and torch's libraries too, about 230 MiB before the model:
  rss_after_import_bytes);
- saved_bytes: the bytes one forward (loss included) saves for the backward,
  summed over the distinct storages that torch.autograd.graph.saved_tensors_hooks
  packs, parameters and the input/target batch left out; saved_tt_bytes is
  the part in (B, heads, T, T) tensors (softmax's outputs);
  saved_formula_bytes is the same counted by hand (saved_formula), a check
  that the hooks saw what the model's layers are known to save;
- with --gemm-share, one more step under torch.profiler: the share of its
  ops' self CPU time (the calling thread's) spent in mm/addmm/bmm/baddbmm
  (gemm_share), and that step's wall time.

--sweep T1,T2,... runs each context length at a fixed --tokens = B x T
(batch tokens // T) in a fresh process of this script and prints or writes
every result (--out).

Debian's torch calls whatever libblas.so.3 the loader finds; the reference
BLAS runs nn.Linear at about 4 GFLOP/s. Run with Debian's OpenMP OpenBLAS on
LD_LIBRARY_PATH (bench/gpt.sh does); the script prints the GFLOP/s of a
1024x1024 matmul and warns when it looks like the reference BLAS.
"""
import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_blas, run from any cwd
from torch_blas import blas_report

RSS_AFTER_IMPORT = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
GEMM_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


# ---- the model: nanoGPT's model.py ------------------------------------------

class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, ctx):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(dim, 3 * dim)  # q, k, v of every head at once
        self.c_proj = nn.Linear(dim, dim)
        self.register_buffer("bias", torch.tril(torch.ones(ctx, ctx, dtype=torch.bool))
                             .view(1, 1, ctx, ctx))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        hs = C // self.heads
        q = q.view(B, T, self.heads, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.heads, hs).transpose(1, 2)
        v = v.view(B, T, self.heads, hs).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))  # (B, nh, T, T)
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, dim, heads, ctx):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, ctx)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, layers, heads, dim, ctx, vocab):
        super().__init__()
        self.ctx = ctx
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, dim),
            wpe=nn.Embedding(ctx, dim),
            h=nn.ModuleList([Block(dim, heads, ctx) for _ in range(layers)]),
            ln_f=nn.LayerNorm(dim),
        ))
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # tied
        self.apply(self._init_weights)
        for name, p in self.named_parameters():
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * layers))

    @staticmethod
    def _init_weights(m):
        if isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Embedding):
            nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        B, T = idx.size()
        pos = torch.arange(0, T, dtype=torch.long)
        tr = self.transformer
        x = tr.wte(idx) + tr.wpe(pos)
        for block in tr.h:
            x = block(x)
        logits = self.lm_head(tr.ln_f(x))  # (B, T, vocab)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


# ---- data ---------------------------------------------------------------------

def read_bytes(path):
    """The bytes of a file, or of every regular file under a directory (sorted,
    fortune's .dat and .u8 indexes left out), as a uint8 tensor."""
    if os.path.isdir(path):
        files = []
        for root, dirs, names in os.walk(path):
            dirs.sort()
            for n in sorted(names):
                p = os.path.join(root, n)
                if os.path.isfile(p) and not n.endswith((".dat", ".u8")):
                    files.append(p)
    else:
        files = [path]
    chunks = []
    for p in files:
        with open(p, "rb") as f:
            chunks.append(f.read())
    data = b"".join(chunks)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


class Batches:
    """B windows of T+1 bytes at random offsets (seeded): x the first T, y the last T."""

    def __init__(self, data, batch, ctx, seed):
        if data.numel() < ctx + 1:
            sys.exit(f"torch_gpt.py: the data holds {data.numel()} bytes, fewer than one window of {ctx + 1}")
        self.data, self.batch, self.ctx = data, batch, ctx
        self.gen = torch.Generator().manual_seed(seed)
        self.x = torch.empty(batch, ctx, dtype=torch.long)
        self.y = torch.empty(batch, ctx, dtype=torch.long)

    def next(self):
        offs = torch.randint(0, self.data.numel() - self.ctx, (self.batch,), generator=self.gen)
        for i, o in enumerate(offs.tolist()):
            w = self.data[o:o + self.ctx + 1]
            self.x[i].copy_(w[:-1])
            self.y[i].copy_(w[1:])
        return self.x, self.y


# ---- measurements --------------------------------------------------------------

def storage_key(t):
    s = t.storage()
    return s.data_ptr(), s.nbytes()


def saved_for_backward(model, x, y, batch, heads, ctx):
    """(bytes, bytes in (B, heads, T, T) tensors, count) of the distinct storages
    one forward saves for the backward, parameters, buffers and the batch left out."""
    skip = {storage_key(t) for t in list(model.parameters()) + list(model.buffers()) + [x, y]}
    saved, tt = {}, set()

    def pack(t):
        k = storage_key(t)
        if k not in skip:
            saved[k] = k[1]
            if tuple(t.shape) == (batch, heads, ctx, ctx):
                tt.add(k)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(x, y)
    loss.backward()  # frees what was saved
    model.zero_grad(set_to_none=True)
    return sum(saved.values()), sum(saved[k] for k in tt), len(saved)


def saved_formula(layers, heads, dim, vocab, batch, ctx):
    """The bytes nanoGPT's forward saves for the backward, by hand (float32 but
    where said; N = B x T tokens). Each block saves its input (ln_1's), ln_1's
    output (c_attn's input), qkv (N, 3d) (q @ k^T and att @ v save views of
    it), softmax's output (B, h, T, T) (att @ v's input too), the heads'
    output y (c_proj's input), its residual sum (ln_2's input), ln_2's output
    (c_fc's), c_fc's output (GELU's input) and GELU's output (c_proj's): 16 N d
    + B h T^2 floats; each LayerNorm its mean and rstd (2 N); masked_fill its
    (T, T) bool mask; the scalar multiply its scale as a 0-dim float64. After
    the blocks: ln_f's input and output (2 N d), log_softmax's output (N V),
    its mean and rstd, nll_loss's total_weight (one float) and the positions
    (T int64)."""
    n = batch * ctx
    per_block = 4 * (16 * n * dim + batch * heads * ctx * ctx + 2 * 2 * n) + ctx * ctx + 8
    return layers * per_block + 4 * (2 * n * dim + n * vocab + 2 * n + 1) + 8 * ctx


def gemm_share(step):
    """One step under the profiler: GEMM ops' share of the ops' self CPU time."""
    from torch.profiler import ProfilerActivity, profile
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    wall_ms = (time.perf_counter() - t0) * 1e3
    total = gemm = 0.0
    for e in prof.key_averages():
        total += e.self_cpu_time_total
        if e.key in GEMM_OPS:
            gemm += e.self_cpu_time_total
    return gemm / total if total else None, gemm / 1e3, total / 1e3, wall_ms


def run_one(o):
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    libs, gflops, blas_ok = blas_report("torch_gpt.py")
    if o.dim % o.heads:
        sys.exit(f"torch_gpt.py: --dim {o.dim} is not a multiple of --heads {o.heads}")

    data = read_bytes(o.data)
    model = GPT(o.layers, o.heads, o.dim, o.ctx, 256)
    model.train()
    params = sum(p.numel() for p in model.parameters())  # the tied weight once
    opt = torch.optim.AdamW(model.parameters(), lr=o.lr, weight_decay=o.weight_decay)
    batches = Batches(data, o.batch, o.ctx, o.seed)

    import contextlib
    mixed = (torch.autocast("cpu", dtype=torch.bfloat16) if o.autocast == "bf16"
             else contextlib.nullcontext())

    def step():
        x, y = batches.next()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with mixed:  # --autocast bf16: PyTorch's own mixed precision (forward under autocast)
            loss = model(x, y)
        loss.backward()
        opt.step()
        v = loss.item()
        return v, (time.perf_counter() - t0) * 1e3

    times, losses = [], []
    for i in range(o.warmup + o.steps):
        v, ms = step()
        losses.append(v)
        if i >= o.warmup:
            times.append(ms)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    x, y = batches.next()
    saved, saved_tt, saved_n = saved_for_backward(model, x, y, o.batch, o.heads, o.ctx)
    res = {
        "impl": "torch", "autocast": o.autocast, "model": f"gpt L{o.layers} H{o.heads} D{o.dim}", "layers": o.layers,
        "heads": o.heads, "dim": o.dim, "ctx": o.ctx, "vocab": 256, "batch": o.batch, "seq": o.ctx,
        "tokens": o.batch * o.ctx, "optimizer": "adamw", "lr": o.lr, "weight_decay": o.weight_decay,
        "threads": torch.get_num_threads(), "steps": o.steps, "warmup": o.warmup, "params": params,
        "data_bytes": data.numel(), "median_ms": statistics.median(times),
        "mean_ms": statistics.fmean(times), "min_ms": min(times), "max_ms": max(times),
        "step_ms": [round(t, 3) for t in times], "first_loss": losses[0], "last_loss": losses[-1],
        "peak_rss_bytes": rss, "rss_after_import_bytes": RSS_AFTER_IMPORT,
        "saved_bytes": saved, "saved_tt_bytes": saved_tt, "saved_storages": saved_n,
        "saved_formula_bytes": saved_formula(o.layers, o.heads, o.dim, 256, o.batch, o.ctx),
        "torch_version": torch.__version__, "blas_libraries": libs,
        "matmul_1024_gflops": round(gflops, 2), "blas_ok": blas_ok,
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    if o.gemm_share:
        share, gemm_ms, ops_ms, wall_ms = gemm_share(lambda: step())
        res.update({"gemm_share": share, "gemm_ms": gemm_ms, "ops_self_ms": ops_ms,
                    "profiled_step_ms": wall_ms})
    return res


def describe(r):
    lines = [
        f"torch {r['torch_version']} gpt {r['layers']}x{r['heads']}h d{r['dim']}, T {r['ctx']}, "
        f"batch {r['batch']}, adamw, {r['threads']} threads: {r['params']} parameters",
        f"  BLAS: {', '.join(r['blas_libraries']) or 'none mapped'}; 1024x1024 matmul "
        f"{r['matmul_1024_gflops']:.1f} GFLOP/s" + ("" if r["blas_ok"] else "  (SLOW: reference BLAS?)"),
        f"  {r['steps']} steps after {r['warmup']} warm-up: median {r['median_ms']:.1f} ms/step "
        f"(min {r['min_ms']:.1f}, max {r['max_ms']:.1f}); loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}",
        f"  peak RSS {r['peak_rss_bytes'] / 2**20:.1f} MiB ({r['rss_after_import_bytes'] / 2**20:.1f} MiB "
        f"after import torch)",
        f"  saved for backward {r['saved_bytes'] / 1e6:.1f} MB = {r['saved_bytes'] / 2**20:.1f} MiB in "
        f"{r['saved_storages']} storages, {r['saved_tt_bytes'] / 2**20:.1f} MiB of it (B, heads, T, T); "
        f"by hand {r['saved_formula_bytes']} bytes, measured {r['saved_bytes']}",
    ]
    if "gemm_share" in r:
        lines.append(f"  GEMM share {100 * r['gemm_share']:.1f}% of ops' self CPU time "
                     f"({r['gemm_ms']:.0f} of {r['ops_self_ms']:.0f} ms; the step took "
                     f"{r['profiled_step_ms']:.0f} ms under the profiler)")
    return "\n".join(lines)


def sweep(o):
    """Each T in a fresh process of this script, B = tokens // T."""
    out = []
    for t in (int(v) for v in o.sweep.split(",")):
        if o.tokens % t:
            sys.exit(f"torch_gpt.py: --tokens {o.tokens} is not a multiple of T = {t}")
        cmd = [sys.executable, os.path.abspath(__file__), "--data", o.data, "--layers", str(o.layers),
               "--heads", str(o.heads), "--dim", str(o.dim), "--ctx", str(t), "--batch", str(o.tokens // t),
               "--steps", str(o.steps), "--warmup", str(o.warmup), "--threads", str(o.threads),
               "--seed", str(o.seed), "--lr", str(o.lr), "--weight-decay", str(o.weight_decay), "--json"]
        p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
        if p.returncode:
            sys.exit(f"torch_gpt.py: the run at T = {t} exited with {p.returncode}")
        r = json.loads(p.stdout.strip().splitlines()[-1])
        out.append(r)
        print(f"torch_gpt.py: T {t:5d} B {r['batch']}: {r['median_ms']:.0f} ms/step, peak RSS "
              f"{r['peak_rss_bytes'] / 2**20:.0f} MiB, saved {r['saved_bytes'] / 2**20:.1f} MiB "
              f"({r['saved_tt_bytes'] / 2**20:.1f} MiB T x T)", file=sys.stderr)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="a text file, or a directory of them")
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=6)
    ap.add_argument("--dim", type=int, default=384)
    ap.add_argument("--ctx", type=int, default=256, help="the context (and sequence) length T")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-4)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--gemm-share", action="store_true", help="profile one more step")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--sweep", help="comma-separated context lengths, each at B = --tokens // T")
    ap.add_argument("--tokens", type=int, default=2048, help="B x T of every --sweep point")
    ap.add_argument("--out", help="also write the result(s) to this JSON file")
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()

    if o.sweep:
        res = sweep(o)
        text = json.dumps(res)
        if not o.json:
            print("| T | batch | ms/step | peak RSS MiB | saved MiB | of it T x T MiB |")
            print("|---:|---:|---:|---:|---:|---:|")
            for r in res:
                print(f"| {r['ctx']} | {r['batch']} | {r['median_ms']:.0f} | {r['peak_rss_bytes'] / 2**20:.0f} | "
                      f"{r['saved_bytes'] / 2**20:.1f} | {r['saved_tt_bytes'] / 2**20:.1f} |")
    else:
        res = run_one(o)
        text = json.dumps(res)
        if not o.json:
            print(describe(res))
    if o.json:
        print(text)
    if o.out:
        os.makedirs(os.path.dirname(os.path.abspath(o.out)), exist_ok=True)
        with open(o.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
