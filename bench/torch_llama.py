#!/usr/bin/python3
"""torch_llama.py — the PyTorch side of issue 25's Llama benchmark: a
SmolLM-135M-shaped LlamaForCausalLM fine-tuned in full, in PyTorch 1.13 with
bf16 autocast (torch.autocast("cpu", dtype=torch.bfloat16), the fp32 weights
and AdamW kept), timed and weighed; bench/llama.sh runs it against `frugal
train --precision bf16-mixed`.

    LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp \\
    /usr/bin/python3 bench/torch_llama.py --config models/hf/smollm-135m/config.json \\
        [--seq 256] [--batch 2] [--steps 4] [--warmup 2] [--threads 2] [--precision bf16-mixed|fp32]

The forward is tests/ref/hf_ref.py's llama_forward: Hugging Face's
modeling_llama.py written by hand (transformers is not packaged in Debian):
LlamaRMSNorm, rotary embeddings with rotate_half, repeat_kv for the grouped
heads, eager attention (PyTorch 1.13 has no fused scaled_dot_product_attention,
so autograd keeps each layer's (B, NH, T, T) softmax), the SwiGLU MLP, the
head (tied to the embedding when the config says so) and cross-entropy over
the B x T logits. Weights are random, N(0, initializer_range) with norms 1 as
_init_weights does, and the tokens random ids below the vocabulary: for memory
and speed the same as fine-tuning the released model.

One step: zero_grad(set_to_none=True), forward under autocast, cross-entropy,
backward, AdamW step (lr 1e-4, weight decay 0.01, torch.optim.AdamW). Reported
(JSON on stdout): median_ms over --steps after --warmup, peak_rss_bytes
(getrusage: the whole process), params.
"""
import argparse
import json
import os
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(here, "..", "tests", "ref"))
from hf_ref import llama_forward, llama_names  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--config", required=True)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed", "fp32"])
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cfg = json.load(open(a.config))
    cfg.setdefault("num_key_value_heads", cfg["num_attention_heads"])
    cfg.setdefault("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    cfg.setdefault("rope_theta", 10000.0)
    cfg.setdefault("tie_word_embeddings", False)
    std = cfg.get("initializer_range", 0.02)
    P = {}
    for name, shape in llama_names(cfg):
        t = torch.ones(shape) if name.endswith("norm.weight") else torch.randn(shape) * std
        P[name] = t.requires_grad_(True)
    params = list(P.values())
    opt = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)
    V = cfg["vocab_size"]
    g = torch.Generator().manual_seed(1)
    times = []
    for i in range(a.warmup + a.steps):
        ids = torch.randint(0, V, (a.batch, a.seq + 1), generator=g)
        x, y = ids[:, :-1], ids[:, 1:]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.precision == "bf16-mixed":
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = llama_forward(cfg, P, x)
        else:
            logits = llama_forward(cfg, P, x)
        loss = F.cross_entropy(logits.float().reshape(-1, V), y.reshape(-1))
        loss.backward()
        opt.step()
        dt = time.perf_counter() - t0
        if i >= a.warmup:
            times.append(dt * 1e3)
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"impl": "pytorch", "precision": a.precision, "median_ms": statistics.median(times),
                      "ms": times, "peak_rss_bytes": ru, "loss": float(loss),
                      "params": sum(p.numel() for p in params), "torch": torch.__version__}))


if __name__ == "__main__":
    main()
