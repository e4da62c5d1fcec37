#!/usr/bin/env python3
"""make_gpt_learn.py — the learning comparison: frugal's gpt-tiny and a
PyTorch 1.13 nanoGPT trained from the same initial weights on the same
batches of Debian's fortunes; writes tests/ref/gpt_learn.json, which
tests/test_gpt_learn.sh (no torch) checks a fresh frugal run against.

The same initial weights without committing 43 MB: frugal makes them. A run
of `frugal train --steps 1 --lr 0 --save INIT` leaves its seeded init
untouched, because AdamW at lr 0 moves nothing: the decay multiplies by
1 - lr*wd = 1 exactly and the step adds (-0/bc1) * m/denom = 0. This script
checks that (a second lr-0 step from INIT saves the same bits, and a second
fresh run of the seed gives the same init), loads INIT's parameters
(ignoring its optimizer state) into the PyTorch model, and feeds it frugal's
batches:
  data   the files of /usr/share/games/fortunes walked as src/data/tokens.h
         says (byte order of names, no '.' names, no *.dat, no symlinks),
         concatenated as bytes: token = byte;
  split  the last floor(len * 0.1) tokens are validation;
  train  window w starts at w*T (x = tok[s:s+T], y = tok[s+1:s+T+1]);
         epoch e takes bench/token_order.py's batches(seed, e, W, B);
  eval   the first 128 validation windows in order, in batches of B; the
         loss is frugal's: the mean over batches, weighted by batch size, of
         each batch's mean token cross-entropy (float32), summed in double.
The model: make_gpt_ref.py's nanoGPT GPT (no dropout, GELU tanh, LayerNorm
with bias, the attention written out, lm_head tied to wte) as gpt-tiny: 6
layers, 6 heads, 384 wide, context 256, vocabulary 256. The optimizer:
torch.optim.AdamW, one parameter group holding every parameter (frugal's
AdamW decays all of them, biases and LayerNorms included), betas
(0.9, 0.999), eps 1e-8, foreach=False. float32, torch.set_num_threads(2).

Run from the repository root after building frugal:
    /usr/bin/python3 tests/ref/make_gpt_learn.py [--frugal build/frugal]
"""
import argparse
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..", "..", "bench")]
import token_order  # noqa: E402
from make_gpt_ref import GPT, GPTConfig  # noqa: E402

# gpt-tiny (models/gpt-tiny.model)
TINY = GPTConfig(block_size=256, vocab_size=256, n_layer=6, n_head=6, n_embd=384)
EVAL_WINDOWS = 128  # frugal train's default validation windows (--test-limit)


# ---- frugal's files ---------------------------------------------------------

def read_safetensors(path):
    """{name: float32 array} of an F32-only safetensors file."""
    with open(path, "rb") as f:
        buf = f.read()
    n = struct.unpack("<Q", buf[:8])[0]
    header = json.loads(buf[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (path, name, t["dtype"])
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(buf, dtype="<f4", count=(b - a) // 4,
                                  offset=8 + n + a).reshape(t["shape"])
    return out


def fortunes_bytes(path):
    """The token stream of tokens.h's directory walk."""
    if not os.path.isdir(path):
        with open(path, "rb") as f:
            return f.read()
    parts = []
    for e in sorted(os.scandir(path), key=lambda e: os.fsencode(e.name)):
        if e.name.startswith(".") or e.name.endswith(".dat"):
            continue
        if e.is_dir(follow_symlinks=False):
            parts.append(fortunes_bytes(e.path))
        elif e.is_file(follow_symlinks=False):
            with open(e.path, "rb") as f:
                parts.append(f.read())
    return b"".join(parts)


def run_frugal(cmd):
    """Runs frugal, returns its JSON eval events and the seconds it took."""
    t0 = time.time()
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    secs = time.time() - t0
    if p.returncode:
        sys.exit("frugal failed (%d): %s\n%s" % (p.returncode, " ".join(cmd), p.stderr))
    evals = [json.loads(l) for l in p.stdout.splitlines() if '"event": "eval"' in l]
    return evals, secs


def same_params(a, b):
    names = [k for k in a if not k.startswith("optimizer.")]
    return names == [k for k in b if not k.startswith("optimizer.")] and all(
        a[k].tobytes() == b[k].tobytes() for k in names)


# ---- the comparison -----------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--frugal", default="build/frugal")
    ap.add_argument("--data", default="/usr/share/games/fortunes")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default="tests/ref/gpt_learn.json")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    T, B = a.seq, a.batch

    common = ["--model", "gpt-tiny", "--data", a.data, "--seq", str(T), "--batch", str(B),
              "--optimizer", "adamw", "--weight-decay", str(a.weight_decay),
              "--seed", str(a.seed), "--threads", str(a.threads), "--json", "--no-progress"]
    # the init: one step at lr 0 (the 8 validation windows only make it quick)
    init_args = ["train"] + common + ["--steps", "1", "--lr", "0", "--test-limit", "8",
                                      "--save", "INIT"]
    train_args = ["train"] + common + ["--steps", str(a.steps), "--lr", repr(a.lr),
                                       "--init", "INIT"]
    tmp = tempfile.mkdtemp()

    def sub(args, path):
        return [a.frugal] + [path if x == "INIT" else x for x in args]

    init = os.path.join(tmp, "init.safetensors")
    run_frugal(sub(init_args, init))
    again = os.path.join(tmp, "again.safetensors")
    run_frugal(sub(init_args, again))
    step0 = os.path.join(tmp, "step0.safetensors")
    run_frugal(sub(["train"] + common + ["--steps", "1", "--lr", "0", "--test-limit", "8",
                                         "--init", init, "--save", "INIT"], step0))
    w = read_safetensors(init)
    if not same_params(w, read_safetensors(again)):
        sys.exit("two runs of seed %d made different inits" % a.seed)
    if not same_params(w, read_safetensors(step0)):
        sys.exit("an AdamW step at lr 0 changed the weights")
    print("init: %d tensors; a second run and an lr-0 step leave the same bits" %
          sum(not k.startswith("optimizer.") for k in w))

    evals, frugal_secs = run_frugal(sub(train_args, init))
    shutil.rmtree(tmp)  # three checkpoints of 130 MB
    fr = evals[-1]
    assert fr["step"] == a.steps, fr
    print("frugal: val_loss %.6f train_loss %.6f (%.1f s)" % (fr["val_loss"], fr["train_loss"],
                                                              frugal_secs))

    # PyTorch from the same weights
    model = GPT(TINY)  # its own random init, overwritten below
    sd = model.state_dict()
    for k in sd:
        src = "transformer.wte.weight" if k == "lm_head.weight" else k
        assert tuple(sd[k].shape) == w[src].shape, (k, sd[k].shape, w[src].shape)
    if "lm_head.weight" in w:  # saved beside wte: the same tensor
        assert w["lm_head.weight"].tobytes() == w["transformer.wte.weight"].tobytes()
    missing = set(k for k in w if not k.startswith("optimizer.")) - set(sd)
    assert not missing, missing
    with torch.no_grad():
        for k, p in model.named_parameters():  # lm_head.weight is wte's: listed once
            p.copy_(torch.from_numpy(w[k].copy()))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=a.weight_decay, foreach=False)

    tok = np.frombuffer(fortunes_bytes(a.data), dtype=np.uint8).astype(np.int64)
    n = len(tok)
    n_val = math.floor(n * 0.1)
    n_train = n - n_val
    W = (n_train - 1) // T
    t0 = time.time()
    losses = []
    epoch, order = 0, token_order.batches(a.seed, 0, W, B)
    for step in range(a.steps):
        b = step - epoch * len(order)
        if b == len(order):
            epoch, b = epoch + 1, 0
            order = token_order.batches(a.seed, epoch, W, B)
        starts = [wi * T for wi in order[b]]
        x = torch.from_numpy(np.stack([tok[s:s + T] for s in starts]))
        y = torch.from_numpy(np.stack([tok[s + 1:s + T + 1] for s in starts]))
        _, loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    total, seen = 0.0, 0
    with torch.no_grad():
        for k0 in range(0, EVAL_WINDOWS - EVAL_WINDOWS % B, B):
            starts = [n_train + k * T for k in range(k0, k0 + B)]
            x = torch.from_numpy(np.stack([tok[s:s + T] for s in starts]))
            y = torch.from_numpy(np.stack([tok[s + 1:s + T + 1] for s in starts]))
            total += model(x, y)[1].item() * B
            seen += B
    torch_val = total / seen
    torch_secs = time.time() - t0
    print("torch:  val_loss %.6f mean train loss %.6f (%.1f s)" % (torch_val, np.mean(losses),
                                                                   torch_secs))
    diff = abs(fr["val_loss"] - torch_val)
    print("difference %.6f nats" % diff)

    ref = {
        "what": "gpt-tiny on Debian's fortunes, frugal against PyTorch 1.13 from the same init "
                "(frugal's seeded init: init_args, one step at lr 0, which moves nothing; INIT is "
                "its --save path) on the same batches; val_loss over the first 128 validation "
                "windows after `steps` steps of train_args",
        "made_by": "tests/ref/make_gpt_learn.py",
        "seq": T, "batch": B, "steps": a.steps, "lr": a.lr, "weight_decay": a.weight_decay,
        "seed": a.seed, "threads": a.threads, "data": a.data, "data_bytes": n,
        "init_args": init_args, "train_args": train_args,
        "frugal_val_loss": fr["val_loss"], "frugal_train_loss": fr["train_loss"],
        "torch_val_loss": torch_val, "torch_train_loss": float(np.mean(losses)),
        "torch_first_loss": losses[0], "torch_last_loss": losses[-1],
        "difference": diff, "frugal_seconds": round(frugal_secs, 1),
        "torch_seconds": round(torch_secs, 1), "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
    }
    with open(a.out, "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print("wrote", a.out)


if __name__ == "__main__":
    main()
