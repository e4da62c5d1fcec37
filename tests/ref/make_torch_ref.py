#!/usr/bin/python3
"""make_torch_ref.py — the PyTorch reference for tests/test_torch_ref.c.

For each model below it builds the torch.nn.Sequential that frugal's builder
makes (same layer indices, so the same state_dict names), initialises it with
PyTorch's own init under torch.manual_seed, and runs one training step on one
fixed batch in float32 on the CPU. It writes two safetensors files:

  tests/ref/<name>.safetensors     the initial state_dict, exactly as
                                   model.state_dict() has it (what
                                   fr_model_load_weights reads)
  tests/ref/<name>_io.safetensors  the batch and the expected results:
    x, y (I32 labels) or target (F32 (n, classes))  the batch
    train.logits, train.loss      forward in train mode, mean loss
    grad.<param>                  every parameter's gradient after backward()
    step1.<buffer>                BatchNorm running stats and
                                  num_batches_tracked after the step
    sgd.<param>                   weights after one SGD(lr=0.1, momentum=0.9,
                                  weight_decay=1e-4) step
    sgd.momentum_buffer.<param>   its optimizer state
    adam.<param>, adamw.<param>   weights after one Adam(lr=1e-3) /
                                  AdamW(lr=1e-3, weight_decay=1e-2) step
    adam3.<state_dict entry>      every state_dict entry after THREE Adam
                                  steps on the same batch (forward, backward,
                                  step, zero_grad each time)
    adam3.loss                    (3) the loss of each of those steps
    adam3.exp_avg.<param>,
    adam3.exp_avg_sq.<param>      Adam's moments after the third step
    eval.logits, eval.loss        model.eval() forward after the SGD step
                                  (running stats of that step, SGD weights)

The models (see cnn, cnn_bias, mlp below; mlp_mse is mlp with MSELoss
against float targets) are seeded one by one, so the files are the same
bytes on every run. Optimizers run with foreach=False (the single-tensor
loop, the formulas frugal implements). The test needs no torch at run time.
Rerun with

    /usr/bin/python3 tests/ref/make_torch_ref.py

(Debian's python3-torch; no safetensors package: the writer is below.)
"""
import copy
import json
import os
import struct

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata):
    """8-byte little-endian header length, JSON header padded with spaces to a
    multiple of 8, then the raw little-endian bytes in header order."""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous().cpu()
        b = t.numpy().astype(t.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    header["__metadata__"] = {k: str(v) for k, v in metadata.items()}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def cnn():
    # frugal: conv2d(4, k3, s1, p1, no bias) batchnorm relu maxpool2d(2) flatten linear(10)
    # No conv bias: a bias straight before a training-mode BatchNorm has a
    # gradient of exactly zero (BN subtracts the channel mean), so both sides
    # would compute rounding noise (~1e-8) and Adam, which divides by |g|,
    # would turn that noise into lr-sized steps that no tolerance can compare.
    return nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1, bias=False), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))


def cnn_bias():
    # frugal: conv2d(4, k3, s1, p1, bias) relu avgpool2d(2) flatten linear(10):
    # the conv bias where its gradient is not zero
    return nn.Sequential(nn.Conv2d(1, 4, 3, 1, 1), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Flatten(),
                         nn.Linear(4 * 6 * 6, 10))


def mlp():
    # frugal: linear(16) tanh linear(16) gelu linear(5)
    return nn.Sequential(nn.Linear(20, 16), nn.Tanh(), nn.Linear(16, 16), nn.GELU(),
                         nn.Linear(16, 5))


# name, builder, seed, input shape (per sample), classes, batch, loss
MODELS = [
    ("cnn", cnn, 1, (1, 12, 12), 10, 8, "ce"),
    ("cnn_bias", cnn_bias, 4, (1, 12, 12), 10, 8, "ce"),
    ("mlp", mlp, 2, (20,), 5, 6, "ce"),
    ("mlp_mse", mlp, 3, (20,), 5, 6, "mse"),
]


def loss_fn(kind):
    return nn.CrossEntropyLoss() if kind == "ce" else nn.MSELoss()


def make_opt(kind, params):
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=1e-4, foreach=False)
    if kind == "adam":
        return torch.optim.Adam(params, lr=1e-3, foreach=False)
    return torch.optim.AdamW(params, lr=1e-3, weight_decay=1e-2, foreach=False)


def step(model, opt, x, t, lf):
    """One training step; returns (logits, loss) of its forward."""
    model.train()
    opt.zero_grad(set_to_none=True)
    z = model(x)
    loss = lf(z, t)
    loss.backward()
    opt.step()
    return z.detach(), loss.detach()


def main():
    torch.set_num_threads(1)
    for name, build, seed, shape, classes, n, lk in MODELS:
        torch.manual_seed(seed)
        model0 = build()  # PyTorch's own init under this seed
        x = torch.randn(n, *shape) * 1.5 + 0.5  # off-centre: running_mean moves visibly
        if lk == "ce":
            t = torch.randint(0, classes, (n,))
        else:
            t = torch.randn(n, classes)
        lf = loss_fn(lk)
        init = {k: v.clone() for k, v in model0.state_dict().items()}
        out = {"x": x}
        if lk == "ce":
            out["y"] = t.to(torch.int32)
        else:
            out["target"] = t
        trainable = [k for k, _ in model0.named_parameters()]
        buffers = [k for k, _ in model0.named_buffers()]

        # gradients and forward of the first step (the same for every optimizer)
        m = copy.deepcopy(model0)
        m.train()
        z = m(x)
        loss = lf(z, t)
        loss.backward()
        out["train.logits"] = z.detach()
        out["train.loss"] = loss.detach().reshape(())
        for k, p in m.named_parameters():
            out["grad." + k] = p.grad
        for k, b in m.named_buffers():
            out["step1." + k] = b

        for kind in ("sgd", "adam", "adamw"):
            m = copy.deepcopy(model0)
            opt = make_opt(kind, m.parameters())
            z1, l1 = step(m, opt, x, t, lf)
            assert torch.equal(z1, out["train.logits"]) and torch.equal(l1, out["train.loss"])
            sd = m.state_dict()
            for k in trainable:
                out[kind + "." + k] = sd[k]
            for k in buffers:
                assert torch.equal(sd[k], out["step1." + k])
            if kind == "sgd":
                for k, p in m.named_parameters():
                    out["sgd.momentum_buffer." + k] = opt.state[p]["momentum_buffer"]
                m.eval()
                with torch.no_grad():
                    ze = m(x)
                out["eval.logits"] = ze
                out["eval.loss"] = lf(ze, t).reshape(())

        m = copy.deepcopy(model0)
        opt = make_opt("adam", m.parameters())
        losses = [step(m, opt, x, t, lf)[1] for _ in range(3)]
        for k, v in m.state_dict().items():
            out["adam3." + k] = v
        out["adam3.loss"] = torch.stack(losses)
        for k, p in m.named_parameters():
            out["adam3.exp_avg." + k] = opt.state[p]["exp_avg"]
            out["adam3.exp_avg_sq." + k] = opt.state[p]["exp_avg_sq"]

        meta = {"generator": "tests/ref/make_torch_ref.py", "torch": torch.__version__,
                "model": name, "seed": seed, "batch": n, "loss": lk}
        write_safetensors(os.path.join(HERE, name + ".safetensors"), init, meta)
        write_safetensors(os.path.join(HERE, name + "_io.safetensors"), out, meta)
        print("%s: %d state_dict entries, %d reference tensors, loss %.6f" %
              (name, len(init), len(out), float(out["train.loss"])))


if __name__ == "__main__":
    main()
