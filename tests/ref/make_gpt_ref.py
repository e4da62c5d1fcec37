#!/usr/bin/python3
"""make_gpt_ref.py — the PyTorch reference for tests/test_gpt_ref.c.

A nanoGPT-style GPT (the structure of Karpathy's nanoGPT model.py: Block,
CausalSelfAttention with the attention written out by hand, MLP with
GELU(approximate='tanh'), LayerNorm with bias, lm_head tied to wte, no
dropout), equal to the frugal model files tests/ref/gpt_small.model and
tests/ref/gpt_t70.model. For each config it writes:

  tests/ref/<name>.safetensors     the initial state_dict exactly as
                                   GPT.state_dict() gives it: both
                                   transformer.wte.weight and lm_head.weight
                                   (the same tensor, so the same bytes)
  tests/ref/<name>_io.safetensors  the batch and what PyTorch computes on it:
    x, y                 (B, T) I32: token ids and next-token targets
    train.logits         (B, T, V) the forward's logits
    train.loss           () F.cross_entropy over all B*T positions
    grad.<param>         every parameter's gradient after backward(); the
                         tied weight once, under transformer.wte.weight (the
                         sum of the embedding's and the lm_head's parts)
    grad64.<param>       the same gradient computed in float64 (stored as
                         F32): tells the test which elements are zero in
                         exact arithmetic (see below)
    adamw3.<param>       the weights after three AdamW(lr=1e-3, betas
                         default, weight_decay=0.1, one param group,
                         foreach=False) steps on the same batch
    adamw3.loss          (3) the loss of each of those steps
  tests/ref/<name>_hf.safetensors  the same initial weights as Hugging
                         Face's GPT-2 checkpoints hold them: names without
                         the "transformer." prefix, Conv1D weights
                         (attn.c_attn, attn.c_proj, mlp.c_fc, mlp.c_proj)
                         stored [in, out], the attention buffers
                         h.N.attn.bias (1, 1, n_ctx, n_ctx) and
                         h.N.attn.masked_bias (), no lm_head.weight (tied),
                         metadata {"format": "pt"}.

Init: nanoGPT's (_init_weights: Linear and Embedding N(0, 0.02), biases 0,
c_proj weights N(0, 0.02/sqrt(2 n_layer))), then the LayerNorm weights,
LayerNorm biases and Linear biases moved off 1 and 0 (1 + 0.1 N(0,1),
0.02 N(0,1)): with nanoGPT's exact init a bias that the forward ignored
would go unnoticed. The test loads this init, so its choice is free.

Why grad64: Adam divides by sqrt(v_hat), so an update carries the
gradient's error relative to the element's own gradient; the test widens
each weight's tolerance by what the gradient tolerance can move it through
the steps, computed from this float64 gradient (the key part of c_attn's
bias, which softmax ignores, has a gradient of 0 in exact arithmetic and
rounding noise in float32).

The configs are seeded one by one, so the files are the same bytes on every
run (torch 1.13, CPU, one thread). The test needs no torch. Rerun with

    /usr/bin/python3 tests/ref/make_gpt_ref.py

(Debian's python3-torch; no safetensors package: the writer is below.)
"""
import copy
import json
import math
import os
import struct
from dataclasses import dataclass

import torch
import torch.nn as nn
from torch.nn import functional as F

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


# ---- the model: nanoGPT's model.py without dropout and flash attention ----

@dataclass
class GPTConfig:
    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 2
    n_head: int = 2
    n_embd: int = 32


class CausalSelfAttention(nn.Module):

    def __init__(self, config):
        super().__init__()
        assert config.n_embd % config.n_head == 0
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.n_head = config.n_head
        self.n_embd = config.n_embd
        # the causal mask, not part of the state_dict
        self.register_buffer("bias", torch.tril(torch.ones(config.block_size, config.block_size))
                             .view(1, 1, config.block_size, config.block_size), persistent=False)

    def forward(self, x):
        B, T, C = x.size()  # batch, sequence length, embedding dim (n_embd)
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)  # (B, nh, T, hs)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v  # (B, nh, T, T) x (B, nh, T, hs) -> (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd)
        self.gelu = nn.GELU(approximate="tanh")
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd)

    def forward(self, x):
        return self.c_proj(self.gelu(self.c_fc(x)))


class Block(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(nn.Module):

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * config.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        assert t <= self.config.block_size
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        tok_emb = self.transformer.wte(idx)  # (b, t, n_embd)
        pos_emb = self.transformer.wpe(pos)  # (t, n_embd)
        x = tok_emb + pos_emb
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def perturb(model):
    """LayerNorm weights 1 + 0.1 N(0,1), LayerNorm and Linear biases 0.02 N(0,1)."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.LayerNorm):
                m.weight.add_(0.1 * torch.randn_like(m.weight))
                m.bias.copy_(0.02 * torch.randn_like(m.bias))
            elif isinstance(m, nn.Linear) and m.bias is not None:
                m.bias.copy_(0.02 * torch.randn_like(m.bias))


CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def hf_state_dict(sd, config):
    """The state_dict as Hugging Face's GPT-2 checkpoints name and lay it out."""
    out = {}
    for k, v in sd.items():
        if k == "lm_head.weight":
            continue  # tied to wte: not saved
        name = k[len("transformer."):]
        out[name] = v.t().contiguous() if name.endswith(CONV1D) else v
        if name.endswith("ln_1.bias"):  # the attention's buffers, beside its block
            i = name.split(".")[1]
            n = config.block_size
            out["h.%s.attn.bias" % i] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
            out["h.%s.attn.masked_bias" % i] = torch.tensor(-1e4)
    return out


# name, config, seed, batch, T
CONFIGS = [
    ("gpt_small", GPTConfig(block_size=16), 1, 3, 16),
    ("gpt_t70", GPTConfig(block_size=70), 2, 2, 70),
]


def main():
    torch.set_num_threads(1)
    for name, config, seed, B, T in CONFIGS:
        torch.manual_seed(seed)
        model0 = GPT(config)
        perturb(model0)
        seq = torch.randint(0, config.vocab_size, (B, T + 1))
        x, y = seq[:, :T].contiguous(), seq[:, 1:].contiguous()
        init = {k: v.clone() for k, v in model0.state_dict().items()}
        assert torch.equal(init["lm_head.weight"], init["transformer.wte.weight"])
        assert not any(k.endswith(".attn.bias") for k in init)  # the mask is no state
        out = {"x": x.to(torch.int32), "y": y.to(torch.int32)}

        m = copy.deepcopy(model0)
        logits, loss = m(x, y)
        loss.backward()
        out["train.logits"] = logits.detach()
        out["train.loss"] = loss.detach().reshape(())
        params = list(m.named_parameters())
        assert [k for k, _ in params].count("lm_head.weight") == 0  # tied: listed once
        for k, p in params:
            out["grad." + k] = p.grad

        m64 = copy.deepcopy(model0).double()
        _, loss64 = m64(x, y)
        loss64.backward()
        for k, p in m64.named_parameters():
            out["grad64." + k] = p.grad.float()

        m = copy.deepcopy(model0)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.1, foreach=False)
        losses = []
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            _, loss = m(x, y)
            loss.backward()
            opt.step()
            losses.append(loss.detach())
        for k, p in m.named_parameters():
            out["adamw3." + k] = p.detach()
        out["adamw3.loss"] = torch.stack(losses)

        meta = {"generator": "tests/ref/make_gpt_ref.py", "torch": torch.__version__,
                "model": name, "seed": seed, "batch": B, "T": T}
        write_safetensors(os.path.join(HERE, name + ".safetensors"), init, meta)
        write_safetensors(os.path.join(HERE, name + "_io.safetensors"), out, meta)
        write_safetensors(os.path.join(HERE, name + "_hf.safetensors"),
                          hf_state_dict(init, config), {"format": "pt"})
        kb = out["grad.transformer.h.0.attn.c_attn.bias"][config.n_embd:2 * config.n_embd]
        print("%s: %d state_dict entries, %d reference tensors, loss %.6f, adamw3 losses %s, "
              "max |grad k-bias| %.3g (float64 %.3g)" %
              (name, len(init), len(out), float(out["train.loss"]),
               " ".join("%.6f" % float(v) for v in losses), float(kb.abs().max()),
               float(out["grad64.transformer.h.0.attn.c_attn.bias"]
                     [config.n_embd:2 * config.n_embd].abs().max())))


if __name__ == "__main__":
    main()
