#!/usr/bin/python3
"""torch_finetune.py — the PyTorch side of issue 24's fine-tuning benchmark:
GPT-2 124M fine-tuned in PyTorch 1.13 with LoRA adapters written by hand, or
in full with AdamW, timed and weighed (bench/finetune.sh runs it against
`frugal train`).

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \\
    /usr/bin/python3 bench/torch_finetune.py --mode lora|full [--seq 512] [--batch 4] \\
        [--steps 4] [--warmup 2] [--threads 2] [--rank 8] [--alpha 16] [--dropout 0.05] \\
        [--target attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj] [--saved] [--autocast bf16] [--json]
        [--layers 12 --heads 12 --dim 768 --vocab 50257: GPT-2 124M; smaller for a quick check]

The model is bench/torch_gpt.py's (nanoGPT's model.py, imported from it) with
GPT-2 124M's configuration: 12 layers, 12 heads, d_model 768, 1024 positions,
vocabulary 50257, the head tied to the token embedding (124,439,808
parameters), nanoGPT's initialisation. Attention is written out as in
torch_gpt.py (PyTorch 1.13 has no fused scaled_dot_product_attention), so
autograd keeps softmax's (B, 12, T, T) output of every layer; the head makes
the (B, T, 50257) logits and cross-entropy's log_softmax keeps a copy of
them: that is what PyTorch 1.13 does with this model, and what frugal's fused
head and tiled attention avoid.

Weights are random (nanoGPT's init) and the tokens are random ids below
50257 drawn from a generator seeded with --seed: for memory and speed that is
the same as fine-tuning the released GPT-2 on real text (the same shapes, the
same ops, the same bytes); only the loss values mean nothing.

--mode lora: every base parameter is frozen (requires_grad False: the
embeddings, LayerNorms, linears and the tied head); each nn.Linear named by
--target in every block (nanoGPT's names: attn.c_attn, attn.c_proj,
mlp.c_fc, mlp.c_proj) is wrapped by LoRALinear below, PEFT's LoRA written by
hand (PEFT is not packaged in Debian):

    y = base(x) + B(A(dropout(x))) * (alpha / r)

A is (r, in), initialised by kaiming_uniform_(a=sqrt(5)) as PEFT's
reset_lora_parameters does; B is (out, r), zeros; dropout is
nn.Dropout(p) (identity when p is 0). torch.optim.AdamW (lr --lr, weight
decay --weight-decay) updates the adapters only. The base stays fp32
(frugal's side keeps it in int8: PyTorch 1.13 has no int8 CPU linear that
trains an adapter beside it, so the fp32 base is what a PyTorch user runs).

--mode full: every parameter trains, torch.optim.AdamW in fp32 (frugal's
side runs Adafactor in bf16-mixed with the fused head; this is the PyTorch
baseline a user would start from).

One step is zero_grad(set_to_none=True), forward, cross-entropy over the
B x T next-token predictions, backward, optimizer.step(); the batch is drawn
before the step, outside the timed region.

What it reports (one process is one configuration, so the peak RSS is
this configuration's), as torch_gpt.py does:
- median_ms (and mean/min/max, every step's ms) over --steps timed steps
  after --warmup;
- peak_rss_bytes: getrusage's ru_maxrss after the timed steps, the whole
  process (interpreter and torch's libraries included: rss_after_import_bytes,
  about 230 MiB before the model exists); rss_after_model_bytes: the RSS
  with the model (and its adapters) built, before the first step;
- params (the tied weight once) and trainable_params;
- with --saved, one more forward to count the bytes it saves for the
  backward (torch_gpt.py's saved_for_backward: distinct storages packed by
  saved_tensors_hooks, parameters and the batch left out), after the peak RSS
  is read.
"""
import argparse
import contextlib
import json
import math
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # torch_gpt, torch_blas
from torch_blas import blas_report  # noqa: E402
from torch_gpt import GPT, saved_for_backward  # noqa: E402

RSS_AFTER_IMPORT = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

# GPT-2 124M (models/gpt2.model); --layers, --heads, --dim and --vocab change
# them for a quick check of the scripts only
LAYERS, HEADS, DIM, CTX, VOCAB = 12, 12, 768, 1024, 50257
TARGETS = "attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj"


def rss_now():
    """The current resident set size in bytes (/proc/self/statm)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class LoRALinear(nn.Module):
    """PEFT's LoRA Linear by hand: base(x) + lora_B(lora_A(dropout(x))) * alpha / r,
    the base frozen, A (r, in) kaiming_uniform_(a=sqrt(5)), B (out, r) zeros."""

    def __init__(self, base, r, alpha, dropout):
        super().__init__()
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)
        self.dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
        self.scaling = alpha / r

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(self.dropout(x))) * self.scaling


def add_lora(model, targets, r, alpha, dropout):
    """Freezes every parameter of the model, then wraps each targeted nn.Linear
    of every block in a LoRALinear; returns the adapters' parameters."""
    for p in model.parameters():
        p.requires_grad_(False)
    adapters, wrapped = [], 0
    for block in model.transformer.h:
        for t in targets:
            parent_name, _, leaf = t.rpartition(".")
            parent = block.get_submodule(parent_name) if parent_name else block
            base = getattr(parent, leaf, None)
            if not isinstance(base, nn.Linear):
                sys.exit(f"torch_finetune.py: --target {t}: no nn.Linear of that name in a block "
                         f"(nanoGPT's names: {TARGETS})")
            lora = LoRALinear(base, r, alpha, dropout)
            setattr(parent, leaf, lora)
            adapters += [lora.lora_A.weight, lora.lora_B.weight]
            wrapped += 1
    return adapters, wrapped


class RandomTokens:
    """B windows of T + 1 random ids below the vocabulary from a seeded generator:
    x the first T of each, y the last T."""

    def __init__(self, batch, seq, vocab, seed):
        self.gen = torch.Generator().manual_seed(seed)
        self.batch, self.seq, self.vocab = batch, seq, vocab

    def next(self):
        w = torch.randint(0, self.vocab, (self.batch, self.seq + 1), generator=self.gen)
        return w[:, :-1].contiguous(), w[:, 1:].contiguous()


def run(o):
    if o.threads > 0:
        torch.set_num_threads(o.threads)
    torch.manual_seed(o.seed)
    libs, gflops, blas_ok = blas_report("torch_finetune.py")
    if o.seq > CTX:
        sys.exit(f"torch_finetune.py: --seq {o.seq} is past GPT-2's {CTX} positions")
    if o.dim % o.heads:
        sys.exit(f"torch_finetune.py: --dim {o.dim} is not a multiple of --heads {o.heads}")
    gpt2 = (o.layers, o.heads, o.dim, o.vocab) == (LAYERS, HEADS, DIM, VOCAB)

    model = GPT(o.layers, o.heads, o.dim, CTX, o.vocab)
    params = sum(p.numel() for p in model.parameters())  # the tied weight once
    targets = [t for t in o.target.split(",") if t]
    wrapped = 0
    if o.mode == "lora":
        if o.rank < 1:
            sys.exit(f"torch_finetune.py: --rank {o.rank}: must be at least 1")
        trainable, wrapped = add_lora(model, targets, o.rank, o.alpha, o.dropout)
    else:
        trainable = list(model.parameters())
    model.train()
    n_trainable = sum(p.numel() for p in trainable)
    opt = torch.optim.AdamW(trainable, lr=o.lr, weight_decay=o.weight_decay)
    batches = RandomTokens(o.batch, o.seq, o.vocab, o.seed)
    rss_model = rss_now()

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
        if not o.json:
            print(f"step {i + 1}/{o.warmup + o.steps}: loss {v:.4f}, {ms:.0f} ms"
                  + (" (warm-up)" if i < o.warmup else ""), file=sys.stderr)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    res = {
        "impl": "torch", "mode": o.mode, "model": "gpt2" if gpt2 else f"gpt L{o.layers} H{o.heads} D{o.dim}",
        "layers": o.layers, "heads": o.heads, "dim": o.dim, "ctx": CTX, "vocab": o.vocab,
        "batch": o.batch, "seq": o.seq,
        "tokens": o.batch * o.seq, "optimizer": "adamw", "lr": o.lr, "weight_decay": o.weight_decay,
        "precision": "bf16-autocast" if o.autocast == "bf16" else "fp32", "autocast": o.autocast,
        "data": f"random ids below {o.vocab}, seeded", "weights": "random init",
        "threads": torch.get_num_threads(), "steps": o.steps, "warmup": o.warmup,
        "params": params, "trainable_params": n_trainable,
        "median_ms": statistics.median(times), "mean_ms": statistics.fmean(times),
        "min_ms": min(times), "max_ms": max(times), "step_ms": [round(t, 3) for t in times],
        "first_loss": losses[0], "last_loss": losses[-1],
        "peak_rss_bytes": rss, "rss_after_import_bytes": RSS_AFTER_IMPORT,
        "rss_after_model_bytes": rss_model,
        "torch_version": torch.__version__, "blas_libraries": libs,
        "matmul_1024_gflops": round(gflops, 2), "blas_ok": blas_ok,
        "loadavg": open("/proc/loadavg").read().split()[:3],
    }
    if o.mode == "lora":
        res.update({"lora_r": o.rank, "lora_alpha": o.alpha, "lora_dropout": o.dropout,
                    "lora_targets": targets, "lora_layers": wrapped})
    if o.saved:
        x, y = batches.next()
        saved, saved_tt, saved_n = saved_for_backward(model, x, y, o.batch, o.heads, o.seq)
        res.update({"saved_bytes": saved, "saved_tt_bytes": saved_tt, "saved_storages": saved_n})
    return res


def describe(r):
    what = (f"LoRA r={r['lora_r']} alpha={r['lora_alpha']:g} dropout={r['lora_dropout']:g} on "
            f"{r['lora_layers']} linears, fp32 base frozen" if r["mode"] == "lora"
            else "full fine-tune, fp32") + (", bf16 autocast" if r.get("autocast") == "bf16" else "")
    lines = [
        f"torch {r['torch_version']} {'GPT-2 124M' if r['model'] == 'gpt2' else r['model']} (random init), {what}, AdamW, batch {r['batch']}, "
        f"T {r['seq']}, {r['threads']} threads: {r['params']} parameters, "
        f"{r['trainable_params']} trainable",
        f"  BLAS: {', '.join(r['blas_libraries']) or 'none mapped'}; 1024x1024 matmul "
        f"{r['matmul_1024_gflops']:.1f} GFLOP/s" + ("" if r["blas_ok"] else "  (SLOW: reference BLAS?)"),
        f"  {r['steps']} steps after {r['warmup']} warm-up: median {r['median_ms']:.0f} ms/step "
        f"(min {r['min_ms']:.0f}, max {r['max_ms']:.0f}); loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}",
        f"  peak RSS {r['peak_rss_bytes'] / 2**20:.1f} MiB ({r['rss_after_import_bytes'] / 2**20:.1f} MiB "
        f"after import torch, {r['rss_after_model_bytes'] / 2**20:.1f} MiB with the model built)",
    ]
    if "saved_bytes" in r:
        lines.append(f"  saved for backward {r['saved_bytes'] / 2**20:.1f} MiB in {r['saved_storages']} "
                     f"storages, {r['saved_tt_bytes'] / 2**20:.1f} MiB of it (B, heads, T, T)")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=["lora", "full"], required=True)
    ap.add_argument("--layers", type=int, default=LAYERS, help=f"[{LAYERS}: GPT-2 124M]")
    ap.add_argument("--heads", type=int, default=HEADS, help=f"[{HEADS}]")
    ap.add_argument("--dim", type=int, default=DIM, help=f"[{DIM}]")
    ap.add_argument("--vocab", type=int, default=VOCAB, help=f"[{VOCAB}]")
    ap.add_argument("--seq", type=int, default=512, help="the sequence length T [512]")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="timed steps [4]")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3, help="AdamW's lr [1e-3, frugal's default]")
    ap.add_argument("--weight-decay", type=float, default=0.01, help="AdamW's weight decay [0.01]")
    ap.add_argument("--rank", type=int, default=8, help="LoRA's r [8]")
    ap.add_argument("--alpha", type=float, default=16, help="LoRA's alpha [16]")
    ap.add_argument("--dropout", type=float, default=0.05, help="LoRA's dropout [0.05]")
    ap.add_argument("--target", default=TARGETS, help=f"the linears LoRA wraps [{TARGETS}]")
    ap.add_argument("--saved", action="store_true",
                    help="one more forward: the bytes it saves for the backward")
    ap.add_argument("--autocast", choices=["none", "bf16"], default="none",
                    help="bf16: the forward under torch.autocast('cpu', dtype=torch.bfloat16)")
    ap.add_argument("--json", action="store_true")
    o = ap.parse_args()
    if min(o.steps, o.batch, o.seq, o.layers, o.heads, o.dim, o.vocab) < 1 or o.warmup < 0:
        sys.exit("torch_finetune.py: --steps, --batch, --seq, --layers, --heads, --dim and --vocab "
                 "must be at least 1, --warmup at least 0")
    r = run(o)
    print(json.dumps(r) if o.json else describe(r))


if __name__ == "__main__":
    main()
