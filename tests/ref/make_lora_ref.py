#!/usr/bin/python3
"""make_lora_ref.py — the PyTorch reference for tests/test_lora.c.

The GPT of tests/ref/gpt_small.model with the initial weights of
tests/ref/gpt_small.safetensors (make_gpt_ref.py's model and init, rebuilt
here from the same seed and checked against that file byte for byte), its
four linear layers of every block (attn.c_attn, attn.c_proj, mlp.c_fc,
mlp.c_proj) wrapped in a hand-written LoRA linear with PEFT's initialisation
and scaling (peft/tuners/lora/layer.py, Linear with r, lora_alpha,
lora_dropout = 0, bias "none"):

    y = base(x) + (x @ A.T @ B.T) * (alpha / r)
    A (r, in):  nn.init.kaiming_uniform_(a=sqrt(5))   (PEFT's init_lora_weights=True)
    B (out, r): zeros

and the base frozen (requires_grad False), as PEFT's get_peft_model leaves
it. r = 4, alpha = 8 (scale 2). PEFT's B = 0 makes the first forward the
base model's, which tests nothing of B; so B is drawn N(0, 0.05^2) here
(as after some training) and A kept as PEFT draws it. It writes

  tests/ref/lora_small_io.safetensors
    x, y                    (B, T) I32: token ids and next-token targets
    init.<adapter>          A and B as the test loads them (frugal's names:
                            <layer>.lora_A.weight, <layer>.lora_B.weight)
    train.logits, train.loss  the forward
    grad.<adapter>          the adapters' gradients (nothing else has one)
    grad64.<adapter>        the same in float64 (stored F32), for the AdamW
                            tolerance (see test_gpt_ref.c's adam_term)
    adamw3.<adapter>        the adapters after three AdamW(lr=1e-3,
                            weight_decay=0.1, foreach=False) steps on the batch
    adamw3.loss             (3) the loss of each step
  tests/ref/lora_small_adapter/adapter_model.safetensors, adapter_config.json
                          the same initial adapters as PEFT saves them
                          (base_model.model.<layer>.lora_A.weight, ...)

Rerun with /usr/bin/python3 tests/ref/make_lora_ref.py (torch 1.13, CPU, one
thread; the output is the same bytes every run).
"""
import copy
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_gpt_ref import GPT, GPTConfig, perturb, write_safetensors  # noqa: E402

R, ALPHA = 4, 8.0
TARGETS = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
B_STD = 0.05


class LoRALinear(nn.Module):
    """PEFT's lora.Linear without dropout: base(x) + lora_B(lora_A(x)) * scaling."""

    def __init__(self, base, r, alpha):
        super().__init__()
        self.base = base
        self.lora_A = nn.Linear(base.in_features, r, bias=False)
        self.lora_B = nn.Linear(r, base.out_features, bias=False)
        self.scaling = alpha / r
        nn.init.kaiming_uniform_(self.lora_A.weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B.weight)

    def forward(self, x):
        return self.base(x) + self.lora_B(self.lora_A(x)) * self.scaling


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        blob = f.read()
    out = {}
    for k, v in header.items():
        if k == "__metadata__":
            continue
        a, b = v["data_offsets"]
        dt = {"F32": np.float32, "I32": np.int32}[v["dtype"]]
        out[k] = torch.from_numpy(np.frombuffer(blob[a:b], dtype=dt).reshape(v["shape"]).copy())
    return out


def wrap(model):
    """The targets wrapped; returns [(frugal layer name, LoRALinear)] in model order."""
    out = []
    for i, block in enumerate(model.transformer.h):
        for t in TARGETS:
            owner = block
            parts = t.split(".")
            for p in parts[:-1]:
                owner = getattr(owner, p)
            lora = LoRALinear(getattr(owner, parts[-1]), R, ALPHA)
            setattr(owner, parts[-1], lora)
            out.append(("transformer.h.%d.%s" % (i, t), lora))
    return out


def main():
    torch.set_num_threads(1)
    config = GPTConfig(block_size=16)
    torch.manual_seed(1)  # make_gpt_ref.py's gpt_small
    model0 = GPT(config)
    perturb(model0)
    init = read_safetensors(os.path.join(HERE, "gpt_small.safetensors"))
    for k, v in model0.state_dict().items():
        assert torch.equal(v, init[k]), k  # the base is the committed file's

    torch.manual_seed(24)
    layers = wrap(model0)
    for p in model0.parameters():
        p.requires_grad_(False)
    adapters = {}
    for name, lora in layers:
        with torch.no_grad():
            lora.lora_B.weight.normal_(0.0, B_STD)
        lora.lora_A.weight.requires_grad_(True)
        lora.lora_B.weight.requires_grad_(True)
        adapters[name + ".lora_A.weight"] = lora.lora_A.weight
        adapters[name + ".lora_B.weight"] = lora.lora_B.weight
    B, T = 3, 16
    seq = torch.randint(0, config.vocab_size, (B, T + 1))
    x, y = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
    out = {"x": x.to(torch.int32), "y": y.to(torch.int32)}
    for k, v in adapters.items():
        out["init." + k] = v.detach().clone()

    def named_adapters(m):
        res = {}
        for n, p in m.named_parameters():
            if p.requires_grad:
                res[n] = p
        return res

    m = copy.deepcopy(model0)
    logits, loss = m(x, y)
    loss.backward()
    out["train.logits"] = logits.detach()
    out["train.loss"] = loss.detach().reshape(())
    trained = named_adapters(m)
    assert len(trained) == 2 * len(TARGETS) * config.n_layer
    for n, p in trained.items():
        out["grad." + n] = p.grad

    m64 = copy.deepcopy(model0).double()
    _, loss64 = m64(x, y)
    loss64.backward()
    for n, p in named_adapters(m64).items():
        out["grad64." + n] = p.grad.float()

    m = copy.deepcopy(model0)
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-3,
                            weight_decay=0.1, foreach=False)
    losses = []
    for _ in range(3):
        opt.zero_grad(set_to_none=True)
        _, loss = m(x, y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    for n, p in named_adapters(m).items():
        out["adamw3." + n] = p.detach()
    out["adamw3.loss"] = torch.stack(losses)
    for k, v in m.state_dict().items():  # the base untouched
        if "lora_" not in k:
            assert torch.equal(v, model0.state_dict()[k]), k

    # the wrapped model names its adapters <layer>.lora_A.weight, as frugal does
    for k in adapters:
        assert "grad." + k in out, k

    meta = {"generator": "tests/ref/make_lora_ref.py", "torch": torch.__version__,
            "base": "gpt_small.safetensors", "r": R, "alpha": ALPHA, "batch": B, "T": T}
    write_safetensors(os.path.join(HERE, "lora_small_io.safetensors"), out, meta)
    d = os.path.join(HERE, "lora_small_adapter")
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "adapter_model.safetensors"),
                      {"base_model.model." + k: v.detach() for k, v in adapters.items()},
                      {"format": "pt"})
    cfg = {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": R, "lora_alpha": ALPHA,
           "lora_dropout": 0.0, "target_modules": list(TARGETS), "bias": "none",
           "fan_in_fan_out": False, "use_rslora": False, "use_dora": False,
           "init_lora_weights": True, "modules_to_save": None, "rank_pattern": {},
           "alpha_pattern": {}, "base_model_name_or_path": None, "inference_mode": True}
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    print("lora_small: %d adapter tensors, loss %.6f, adamw3 losses %s" %
          (len(adapters), float(out["train.loss"]), " ".join("%.6f" % float(v) for v in losses)))


if __name__ == "__main__":
    main()
