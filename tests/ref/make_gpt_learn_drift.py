#!/usr/bin/env python3
"""make_gpt_learn_drift.py — how far float32 rounding alone moves the
val_loss that tests/test_gpt_learn.sh checks; writes
tests/ref/gpt_learn_drift.json, which gives that test its bound.

gpt_learn.json's run (gpt-tiny, 40 AdamW steps from frugal's seeded init on
Debian's fortunes) is repeated in PyTorch, with make_gpt_learn.py's model,
batches and loss:
  float64      the same arithmetic nearly exact (u = 2^-53): the val_loss an
               exact implementation of the run would give, to about 1e-12;
  float32      under several summation orders: OpenBLAS's kernels forced by
               OPENBLAS_CORETYPE (PyTorch's GEMMs are OpenBLAS's here, as
               frugal's are) and 1 or 2 threads.
Each float32 run's distance from float64 is what float32 rounding does to
this statistic after 40 steps (Adam divides each gradient by its own size,
so a step's rounding moves the weights by up to about lr times the
gradients' relative error, and 40 steps add these up). frugal in float32 is
one more such run: same ops, same precision, another summation order.
Different orders give independent roundings, so the spread of these
distances estimates frugal's own distance from float64, on any host.

Run from the repository root after building frugal (about 5 minutes):
    /usr/bin/python3 tests/ref/make_gpt_learn_drift.py [--frugal build/frugal]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "bench")]

ORDERS = [("default", 2), ("Prescott", 2), ("Haswell", 2), ("SkylakeX", 2), ("default", 1)]


def run_torch(ref, init, dtype, threads):
    """make_gpt_learn.py's PyTorch run in dtype from frugal's init: val_loss"""
    import torch
    import token_order
    from make_gpt_learn import TINY, EVAL_WINDOWS, fortunes_bytes, read_safetensors
    from make_gpt_ref import GPT
    torch.set_num_threads(threads)
    dt = {"float32": torch.float32, "float64": torch.float64}[dtype]
    T, B = ref["seq"], ref["batch"]
    w = read_safetensors(init)
    model = GPT(TINY).to(dt)
    with torch.no_grad():
        for k, p in model.named_parameters():
            p.copy_(torch.from_numpy(w[k].astype(np.float64)).to(dt))
    opt = torch.optim.AdamW(model.parameters(), lr=ref["lr"], betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=ref["weight_decay"], foreach=False)
    tok = np.frombuffer(fortunes_bytes(ref["data"]), dtype=np.uint8).astype(np.int64)
    n = len(tok)
    n_train = n - math.floor(n * 0.1)
    W = (n_train - 1) // T
    epoch, order = 0, token_order.batches(ref["seed"], 0, W, B)
    for step in range(ref["steps"]):
        b = step - epoch * len(order)
        if b == len(order):
            epoch, b = epoch + 1, 0
            order = token_order.batches(ref["seed"], epoch, W, B)
        starts = [wi * T for wi in order[b]]
        x = torch.from_numpy(np.stack([tok[s:s + T] for s in starts]))
        y = torch.from_numpy(np.stack([tok[s + 1:s + T + 1] for s in starts]))
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    total, seen = 0.0, 0
    with torch.no_grad():
        for k0 in range(0, EVAL_WINDOWS - EVAL_WINDOWS % B, B):
            starts = [n_train + k * T for k in range(k0, k0 + B)]
            x = torch.from_numpy(np.stack([tok[s:s + T] for s in starts]))
            y = torch.from_numpy(np.stack([tok[s + 1:s + T + 1] for s in starts]))
            total += model(x, y)[1].item() * B
            seen += B
    return total / seen


def child(ref, init, dtype, threads, coretype):
    env = dict(os.environ)
    if coretype != "default":
        env["OPENBLAS_CORETYPE"] = coretype
    else:
        env.pop("OPENBLAS_CORETYPE", None)
    p = subprocess.run([sys.executable, __file__, "--child", init, dtype, str(threads)],
                       env=env, stdout=subprocess.PIPE, text=True, check=True)
    return float(p.stdout.split()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frugal", default="build/frugal")
    ap.add_argument("--ref", default=os.path.join(HERE, "gpt_learn.json"))
    ap.add_argument("--out", default=os.path.join(HERE, "gpt_learn_drift.json"))
    ap.add_argument("--child", nargs=3, metavar=("INIT", "DTYPE", "THREADS"))
    a = ap.parse_args()
    ref = json.load(open(a.ref))
    if a.child:
        print(repr(run_torch(ref, a.child[0], a.child[1], int(a.child[2]))))
        return
    tmp = tempfile.mkdtemp()
    init = os.path.join(tmp, "init.safetensors")
    cmd = [a.frugal] + [init if x == "INIT" else x for x in ref["init_args"]]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    f64 = child(ref, init, "float64", 2, "default")
    print("float64: val_loss %.12f" % f64, flush=True)
    runs = []
    for coretype, threads in ORDERS:
        v = child(ref, init, "float32", threads, coretype)
        runs.append({"coretype": coretype, "threads": threads, "val_loss": v,
                     "minus_float64": v - f64})
        print("float32 %-9s %d threads: val_loss %.9f (float64 %+.3g)" %
              (coretype, threads, v, v - f64), flush=True)
    os.remove(init)
    os.rmdir(tmp)
    d = [r["minus_float64"] for r in runs]
    out = {
        "what": "PyTorch's val_loss for gpt_learn.json's run in float64 and in float32 under "
                "several summation orders (OPENBLAS_CORETYPE, threads), from frugal's init",
        "made_by": "tests/ref/make_gpt_learn_drift.py",
        "float64_val_loss": f64,
        "float32_runs": runs,
        "float32_max_drift": max(abs(x) for x in d),
        "float32_rms_drift": math.sqrt(sum(x * x for x in d) / len(d)),
    }
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print("max |float32 - float64| %.3g, rms %.3g; wrote %s" %
          (out["float32_max_drift"], out["float32_rms_drift"], a.out))


if __name__ == "__main__":
    main()
