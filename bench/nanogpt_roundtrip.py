#!/usr/bin/python3
"""nanogpt_roundtrip.py — a frugal GPT checkpoint in nanoGPT, by hand (not a test).

    /usr/bin/python3 bench/nanogpt_roundtrip.py CKPT --heads H --frugal-loss L \\
        [--io tests/ref/gpt_small_io.safetensors |
         --tokens FILE [--val-fraction 0.1] [--seq T] [--batch B]]

Loads CKPT (a safetensors that `frugal train --save` or fr_save wrote) into
the nanoGPT-style GPT of tests/ref/make_gpt_ref.py with
load_state_dict(strict=True): every name of nanoGPT's state_dict must be in
the file (lm_head.weight included, as the tie's second name) and nothing else
but the optimizer state ("optimizer.*", which is not a state_dict entry and
is left out here, as nanoGPT keeps its optimizer in a separate dict). The
config comes from the shapes (vocab and n_embd from wte, block_size from
wpe, n_layer from the h.N count); the head count is not in the weights.

It then runs the forward in float32 on a batch and prints the loss beside
frugal's (--frugal-loss, the loss frugal printed for the same weights and
batch) and their relative difference; exit 1 above --rtol (default 1e-5).
The batch: x and y of an *_io.safetensors (--io), or the first B validation
windows of a token file (--tokens: a 1-D integer .npy, or any other file as
bytes), as `frugal eval --data FILE --batch B --test-limit B` reads them
(src/data/tokens.h): the last floor(len * val_fraction) tokens are
validation, window k starts k*T into them, x = tokens[s, s+T), y =
tokens[s+1, s+T+1); T is --seq, by default the context (block_size).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "ref"))
from make_gpt_ref import GPT, GPTConfig  # noqa: E402

NP = {"F32": np.float32, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    """{name: torch tensor}; BF16 widened to float32 through its bits."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        raw = data[b:end]
        if e["dtype"] == "BF16":
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            a = bits.view(np.float32)
        else:
            a = np.frombuffer(raw, dtype=np.dtype(NP[e["dtype"]]).newbyteorder("<"))
        out[name] = torch.from_numpy(a.copy()).reshape(e["shape"])
    return out


def config_of(sd, heads):
    vocab, n_embd = sd["transformer.wte.weight"].shape
    block = sd["transformer.wpe.weight"].shape[0]
    n_layer = len({k.split(".")[2] for k in sd if k.startswith("transformer.h.")})
    return GPTConfig(block_size=block, vocab_size=vocab, n_layer=n_layer, n_head=heads,
                     n_embd=n_embd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--frugal-loss", type=float, required=True)
    ap.add_argument("--io")
    ap.add_argument("--tokens")
    ap.add_argument("--val-fraction", type=float, default=0.1)
    ap.add_argument("--seq", type=int, default=0)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--rtol", type=float, default=1e-5)
    a = ap.parse_args()

    torch.set_num_threads(1)
    f = read_safetensors(a.ckpt)
    sd = {k: v.float() for k, v in f.items() if not k.startswith("optimizer.")}
    config = config_of(sd, a.heads)
    model = GPT(config)
    model.load_state_dict(sd, strict=True)  # raises on a missing or unexpected name
    model.eval()
    tied = model.lm_head.weight.data_ptr() == model.transformer.wte.weight.data_ptr()
    print("loaded %s: %d entries (%d optimizer entries left out), %s, tie kept: %s" %
          (a.ckpt, len(sd), len(f) - len(sd), config, tied))

    if a.io:
        io = read_safetensors(a.io)
        x, y = io["x"].long(), io["y"].long()
    else:
        t = a.seq or config.block_size
        if a.tokens.endswith(".npy"):
            tok = np.load(a.tokens).astype(np.int64)
        else:
            tok = np.fromfile(a.tokens, dtype=np.uint8).astype(np.int64)
        n_val = int(math.floor(len(tok) * a.val_fraction))
        start = len(tok) - n_val
        assert (n_val - 1) // t >= a.batch, "fewer validation windows than --batch"
        x = torch.tensor(np.stack([tok[start + k * t:start + k * t + t] for k in range(a.batch)]))
        y = torch.tensor(np.stack([tok[start + k * t + 1:start + k * t + t + 1]
                                   for k in range(a.batch)]))
    with torch.no_grad():
        _, loss = model(x, y)
    loss = float(loss)
    rel = abs(loss - a.frugal_loss) / abs(loss)
    print("nanoGPT loss %.7f, frugal %.7f, relative difference %.3g (%s %.0e)" %
          (loss, a.frugal_loss, rel, "within" if rel <= a.rtol else "OVER", a.rtol))
    return 0 if rel <= a.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
