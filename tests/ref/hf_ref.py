#!/usr/bin/python3
"""hf_ref.py — the PyTorch reference for tests/test_hf_ref.c: tiny Hugging
Face models (LlamaForCausalLM, GPT2LMHeadModel) as hub directories, and what
PyTorch computes on them.

transformers is not installed here, so the two models' forwards are written
out by hand below exactly as Hugging Face's modeling_llama.py and
modeling_gpt2.py (transformers 4.4x) define them:
  Llama: LlamaRMSNorm (variance in float32, eps rms_norm_eps), the rotary
    embedding of LlamaRotaryEmbedding (inv_freq = 1 / theta^(arange(0, HS, 2)
    / HS) in float32, from modeling_rope_utils.py's default, linear and
    llama3 rules; cos/sin of cat(freqs, freqs)), apply_rotary_pos_emb with
    rotate_half, repeat_kv (query head h reads key/value head h // (NH/NKV)),
    causal softmax attention in float32 scaled by HS^-0.5, the MLP
    down_proj(silu(gate_proj(x)) * up_proj(x)), no biases, lm_head (or the
    embedding when tie_word_embeddings).
  GPT-2: wte + wpe, blocks x + attn(ln_1(x)), x + mlp(ln_2(x)) with Conv1D
    layers (weight stored [in, out], y = addmm(bias, x, weight)), attention
    scaled by HS^-0.5 with the causal mask, gelu_new (the tanh form),
    LayerNorm(eps layer_norm_epsilon), ln_f, the head tied to wte.

Self-checks (the script stops if one fails): the Llama forward equals, in
float64, Meta's reference formulation (llama/model.py: interleaved complex
rotary pairs via view_as_complex, its own apply_scaling for llama3) run on
the weights un-permuted as convert_llama_weights_to_hf.py's permute()
defines, so the rotate_half convention and the q/k layout are HF's (linear
scaling: Meta's forward at positions t / factor); the
GPT-2 forward equals one built from torch.nn modules (nn.Linear with the
Conv1D weights transposed, nn.MultiheadAttention, nn.GELU('tanh'),
nn.LayerNorm); the float32 logits and gradients are within 1e-6 and 2e-6
of the tensor's largest of those computed in float64 (so PyTorch's float32
is well within the test's 1e-5 of exact arithmetic); every
greedy step's top-two logit gap is far above the test's tolerance.

Writes, under tests/data/hf/:
  <name>/config.json          the hub's keys (HF's defaults written out)
  <name>/model.safetensors    the weights with the hub's names (GPT-2 as the
                              hub's gpt2 file: no "transformer." prefix,
                              Conv1D weights [in, out], h.N.attn.bias mask
                              buffers; tied heads left out as save_pretrained
                              does), metadata {"format": "pt"}
  <name>.ref.safetensors      the reference (beside the directory, so that a
                              loader given the directory sees only what a hub
                              directory holds):
    x, y           I32 (2, 16): tokens and next-token targets (one random
                   sequence of 17 per row)
    loss           F32 (1): mean cross-entropy over all 32 positions
    logits         F32 (2, 16, V)
    grad.<p>       F32: each parameter's gradient, by the name and in the
                   layout of HF's named_parameters() (GPT-2: Conv1D weights
                   [in, out], "transformer." names; the tied weight once)
    adamw3.<p>     F32: the parameter after 3 torch.optim.AdamW steps on the
                   same batch (lr 1e-3, betas (0.9, 0.999), eps 1e-8,
                   weight_decay 1e-2: PyTorch's and frugal's defaults; one
                   param group, decay on every parameter, foreach=False)
    adamw3.loss    F32 (3): the loss of each of those steps (before its update)
    gen.prompt     I32 (2, 5): two prompts
    gen.tokens     I32 (2, 10): greedy continuation of each: 10 tokens, each
                   the argmax of the last position's logits of a full forward
                   over the sequence so far (no cache)
  (llama-tiny-rope3: the same but for adamw3.*; llama-tiny-linear: x, y,
  loss, logits, gen.*; llama-tiny-bf16: x, y, loss, logits of the bf16
  weights widened to float32.)

Models: llama-tiny (vocab 64, hidden 32, 2 layers, 4 heads, 2 KV heads,
intermediate 48, rope_theta 10000, rms_norm_eps 1e-6, 32 positions,
untied); llama-tiny-rope3 (the same with tie_word_embeddings and llama3
rope_scaling factor 8, low/high_freq_factor 1/4, original context 64, so
that the head's four frequencies fall in all three of llama3's bands: kept,
smoothed, divided by the factor); llama-tiny-linear (one layer, tied,
linear rope_scaling factor 2); gpt2-tiny (vocab 64, n_embd 32, 2 layers,
4 heads, 32 positions, dropouts 0); llama-tiny-bf16 (llama-tiny's weights
rounded to bf16 and stored BF16, "torch_dtype": "bfloat16"); llama-tiny-
sharded (llama-tiny's float32 weights in two shards with
model.safetensors.index.json as save_pretrained writes it).
Weights, from a seeded torch.Generator: embeddings and biases N(0, 0.1^2),
norm weights 1 + N(0, 0.1^2), the layers' matrices N(0, std^2) with std 0.1
(llama-tiny), 0.2 (llama-tiny-rope3), 0.3 (gpt2-tiny): with 0.1 the tied
models' greedy continuations repeat one token, and larger ones make
llama-tiny's float32 gradients stray from float64 by more than the 2e-6
(of the tensor's largest) that the self-check allows.

Rerun (deterministic: the same bytes each run, torch 1.13 CPU):
    /usr/bin/python3 tests/ref/hf_ref.py
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.set_num_threads(1)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "hf")
B, T, PROMPT, NEW = 2, 16, 5, 10
LR, BETAS, EPS, WD, STEPS = 1e-3, (0.9, 0.999), 1e-8, 1e-2, 3

DTYPES = {torch.float32: "F32", torch.int32: "I32", torch.bfloat16: "BF16"}


def st_bytes(tensors, metadata=None):
    """safetensors: 8-byte little-endian header length, JSON header padded
    with spaces to a multiple of 8, the raw little-endian data in order"""
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = (t.view(torch.int16) if t.dtype == torch.bfloat16 else t).numpy().tobytes()
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    header["__metadata__"] = metadata or {"format": "pt"}
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    return struct.pack("<Q", len(h)) + h + b"".join(blobs)


def write(path, data):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb" if isinstance(data, bytes) else "w") as f:
        f.write(data)


# ---- Llama, as modeling_llama.py ----------------------------------------------

LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 32,
    "initializer_range": 0.02,
    "intermediate_size": 48,
    "max_position_embeddings": 32,
    "mlp_bias": False,
    "model_type": "llama",
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "float32",
    "transformers_version": "4.44.2",
    "use_cache": True,
    "vocab_size": 64,
}
LLAMA_LINEAR = dict(LLAMA, num_hidden_layers=1, tie_word_embeddings=True,
                    rope_scaling={"factor": 2.0, "rope_type": "linear"})
LLAMA3 = dict(LLAMA, tie_word_embeddings=True,
              rope_scaling={"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 64, "rope_type": "llama3"})


def llama_names(cfg):
    """(name, shape) as LlamaForCausalLM.state_dict() lists them"""
    C, I, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    HS = cfg["head_dim"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    out = [("model.embed_tokens.weight", (V, C))]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        out += [(p + "self_attn.q_proj.weight", (NH * HS, C)),
                (p + "self_attn.k_proj.weight", (NKV * HS, C)),
                (p + "self_attn.v_proj.weight", (NKV * HS, C)),
                (p + "self_attn.o_proj.weight", (C, NH * HS)),
                (p + "mlp.gate_proj.weight", (I, C)),
                (p + "mlp.up_proj.weight", (I, C)),
                (p + "mlp.down_proj.weight", (C, I)),
                (p + "input_layernorm.weight", (C,)),
                (p + "post_attention_layernorm.weight", (C,))]
    out.append(("model.norm.weight", (C,)))
    if not cfg["tie_word_embeddings"]:
        out.append(("lm_head.weight", (V, C)))
    return out


def rope_inv_freq(cfg):
    """modeling_rope_utils.py: _compute_default_rope_parameters and the
    linear / llama3 rules, in float32"""
    HS, base = cfg["head_dim"], cfg["rope_theta"]
    inv_freq = 1.0 / (base ** (torch.arange(0, HS, 2, dtype=torch.int64).float() / HS))
    sc = cfg.get("rope_scaling")
    kind = sc and sc.get("rope_type", sc.get("type"))
    if kind == "linear":
        inv_freq = inv_freq / sc["factor"]
    elif kind == "llama3":
        factor, low, high = sc["factor"], sc["low_freq_factor"], sc["high_freq_factor"]
        old = sc["original_max_position_embeddings"]
        low_freq_wavelen, high_freq_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv_freq
        inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
        smooth_factor = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
        is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
        inv_freq = torch.where(is_medium, smoothed, inv_freq_llama)
    elif kind:
        raise SystemExit("rope_type %s not written here" % kind)
    return inv_freq


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def llama_forward(cfg, P, ids):
    """LlamaForCausalLM(input_ids).logits, eager attention, dtype of P"""
    dt = P["model.embed_tokens.weight"].dtype
    C, HS = cfg["hidden_size"], cfg["head_dim"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    Bn, Tn = ids.shape

    def rmsnorm(x, w):  # LlamaRMSNorm
        h = x.to(torch.float32 if dt == torch.float32 else dt)
        var = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(var + eps)
        return w * h.to(dt)

    # LlamaRotaryEmbedding.forward: inv_freq @ positions, cat(freqs, freqs)
    inv_freq = rope_inv_freq(cfg).to(dt)
    pos = torch.arange(Tn, dtype=dt)
    freqs = (inv_freq[None, :, None] @ pos[None, None, :]).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]  # (1, 1, T, HS)
    mask = torch.full((Tn, Tn), torch.finfo(dt).min, dtype=dt).triu(1)

    h = F.embedding(ids, P["model.embed_tokens.weight"])
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        res = h
        x = rmsnorm(h, P[p + "input_layernorm.weight"])
        q = F.linear(x, P[p + "self_attn.q_proj.weight"]).view(Bn, Tn, NH, HS).transpose(1, 2)
        k = F.linear(x, P[p + "self_attn.k_proj.weight"]).view(Bn, Tn, NKV, HS).transpose(1, 2)
        v = F.linear(x, P[p + "self_attn.v_proj.weight"]).view(Bn, Tn, NKV, HS).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin  # apply_rotary_pos_emb
        k = k * cos + rotate_half(k) * sin
        rep = NH // NKV  # repeat_kv
        k = k[:, :, None].expand(Bn, NKV, rep, Tn, HS).reshape(Bn, NH, Tn, HS)
        v = v[:, :, None].expand(Bn, NKV, rep, Tn, HS).reshape(Bn, NH, Tn, HS)
        w = torch.matmul(q, k.transpose(2, 3)) * HS ** -0.5 + mask
        w = F.softmax(w, dim=-1, dtype=torch.float32 if dt == torch.float32 else dt).to(dt)
        a = torch.matmul(w, v).transpose(1, 2).reshape(Bn, Tn, NH * HS)
        h = res + F.linear(a, P[p + "self_attn.o_proj.weight"])
        res = h
        x = rmsnorm(h, P[p + "post_attention_layernorm.weight"])
        x = F.linear(F.silu(F.linear(x, P[p + "mlp.gate_proj.weight"])) *
                     F.linear(x, P[p + "mlp.up_proj.weight"]), P[p + "mlp.down_proj.weight"])
        h = res + x
    h = rmsnorm(h, P["model.norm.weight"])
    head = P["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return F.linear(h, head)


def meta_llama_forward(cfg, P, ids, pos_scale=1.0):
    """Meta's llama/model.py (Transformer.forward) in float64 on HF weights
    un-permuted: a check of the HF forward above, not a reference"""
    C, HS = cfg["hidden_size"], cfg["head_dim"]
    NH, NKV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    eps = cfg["rms_norm_eps"]
    Bn, Tn = ids.shape
    D = {k: v.detach().double() for k, v in P.items()}

    def unpermute(w, heads):  # inverse of convert_llama_weights_to_hf.permute
        return w.view(heads, 2, HS // 2, w.shape[1]).transpose(1, 2).reshape(w.shape)

    freqs = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, HS, 2)[: HS // 2].double() / HS))
    sc = cfg.get("rope_scaling")
    if sc:  # llama 3.1's apply_scaling, its constants from the config
        new = []
        old, low, high = (sc["original_max_position_embeddings"], sc["low_freq_factor"],
                          sc["high_freq_factor"])
        for f in freqs.tolist():
            wavelen = 2 * math.pi / f
            if wavelen < old / high:
                new.append(f)
            elif wavelen > old / low:
                new.append(f / sc["factor"])
            else:
                s = (old / wavelen - low) / (high - low)
                new.append((1 - s) * f / sc["factor"] + s * f)
        freqs = torch.tensor(new, dtype=torch.float64)
    # HF computes inv_freq in float32: Meta's in float64 differs by its rounding
    freqs = freqs.float().double()
    fcis = torch.polar(torch.ones(Tn, HS // 2, dtype=torch.float64),
                       torch.outer(torch.arange(Tn).double() * pos_scale, freqs))

    def rot(x):
        xc = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
        return torch.view_as_real(xc * fcis[None, :, None]).flatten(3)

    def norm(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    mask = torch.full((Tn, Tn), float("-inf"), dtype=torch.float64).triu(1)
    h = D["model.embed_tokens.weight"][ids]
    for l in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % l
        x = norm(h, D[p + "input_layernorm.weight"])
        q = (x @ unpermute(D[p + "self_attn.q_proj.weight"], NH).T).view(Bn, Tn, NH, HS)
        k = (x @ unpermute(D[p + "self_attn.k_proj.weight"], NKV).T).view(Bn, Tn, NKV, HS)
        v = (x @ D[p + "self_attn.v_proj.weight"].T).view(Bn, Tn, NKV, HS)
        q, k = rot(q), rot(k)
        k = torch.repeat_interleave(k, NH // NKV, dim=2)
        v = torch.repeat_interleave(v, NH // NKV, dim=2)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        s = F.softmax(q @ k.transpose(2, 3) / math.sqrt(HS) + mask, dim=-1)
        a = (s @ v).transpose(1, 2).reshape(Bn, Tn, NH * HS)
        h = h + a @ D[p + "self_attn.o_proj.weight"].T
        x = norm(h, D[p + "post_attention_layernorm.weight"])
        w1, w3 = D[p + "mlp.gate_proj.weight"], D[p + "mlp.up_proj.weight"]
        h = h + (F.silu(x @ w1.T) * (x @ w3.T)) @ D[p + "mlp.down_proj.weight"].T
    h = norm(h, D["model.norm.weight"])
    head = D["model.embed_tokens.weight" if cfg["tie_word_embeddings"] else "lm_head.weight"]
    return h @ head.T


def meta_linear_forward(cfg, P, ids):
    """Meta's forward at positions t / factor: linear scaling as the older
    LlamaLinearScalingRotaryEmbedding defined it (t = t / scaling_factor),
    where modeling_rope_utils.py divides inv_freq instead (the same angles)"""
    f = cfg["rope_scaling"]["factor"]
    return meta_llama_forward(dict(cfg, rope_scaling=None), P, ids, pos_scale=1.0 / f)


# ---- GPT-2, as modeling_gpt2.py ------------------------------------------------

GPT2 = {
    "activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"],
    "attn_pdrop": 0.0,
    "bos_token_id": 63,
    "embd_pdrop": 0.0,
    "eos_token_id": 63,
    "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05,
    "model_type": "gpt2",
    "n_ctx": 32,
    "n_embd": 32,
    "n_head": 4,
    "n_inner": None,
    "n_layer": 2,
    "n_positions": 32,
    "reorder_and_upcast_attn": False,
    "resid_pdrop": 0.0,
    "scale_attn_by_inverse_layer_idx": False,
    "scale_attn_weights": True,
    "summary_activation": None,
    "summary_first_dropout": 0.1,
    "summary_proj_to_labels": True,
    "summary_type": "cls_index",
    "summary_use_proj": True,
    "tie_word_embeddings": True,
    "torch_dtype": "float32",
    "transformers_version": "4.44.2",
    "use_cache": True,
    "vocab_size": 64,
}
CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")


def gpt2_names(cfg):
    """(name, shape) of GPT2LMHeadModel.named_parameters() (the tied head once)"""
    C, V, Pn = cfg["n_embd"], cfg["vocab_size"], cfg["n_positions"]
    out = [("transformer.wte.weight", (V, C)), ("transformer.wpe.weight", (Pn, C))]
    for l in range(cfg["n_layer"]):
        p = "transformer.h.%d." % l
        out += [(p + "ln_1.weight", (C,)), (p + "ln_1.bias", (C,)),
                (p + "attn.c_attn.weight", (C, 3 * C)), (p + "attn.c_attn.bias", (3 * C,)),
                (p + "attn.c_proj.weight", (C, C)), (p + "attn.c_proj.bias", (C,)),
                (p + "ln_2.weight", (C,)), (p + "ln_2.bias", (C,)),
                (p + "mlp.c_fc.weight", (C, 4 * C)), (p + "mlp.c_fc.bias", (4 * C,)),
                (p + "mlp.c_proj.weight", (4 * C, C)), (p + "mlp.c_proj.bias", (C,))]
    out += [("transformer.ln_f.weight", (C,)), ("transformer.ln_f.bias", (C,))]
    return out


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


def gpt2_forward(cfg, P, ids):
    """GPT2LMHeadModel(input_ids).logits, eager attention"""
    C, NH, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    HS = C // NH
    Bn, Tn = ids.shape
    dt = P["transformer.wte.weight"].dtype

    def conv1d(x, p):
        return torch.addmm(P[p + ".bias"], x.view(-1, x.size(-1)), P[p + ".weight"]).view(
            *x.shape[:-1], -1)

    def ln(x, p):
        return F.layer_norm(x, (C,), P[p + ".weight"], P[p + ".bias"], eps)

    def heads(x):
        return x.view(Bn, Tn, NH, HS).permute(0, 2, 1, 3)

    causal = torch.ones(Tn, Tn, dtype=torch.bool).tril()
    h = F.embedding(ids, P["transformer.wte.weight"]) + \
        F.embedding(torch.arange(Tn)[None], P["transformer.wpe.weight"])
    for l in range(cfg["n_layer"]):
        p = "transformer.h.%d." % l
        q, k, v = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn").split(C, dim=2)
        q, k, v = heads(q), heads(k), heads(v)
        w = torch.matmul(q, k.transpose(-1, -2)) / torch.full([], HS ** 0.5, dtype=dt)
        w = torch.where(causal, w, torch.full([], torch.finfo(dt).min, dtype=dt))
        w = F.softmax(w, dim=-1).type(v.dtype)
        a = torch.matmul(w, v).permute(0, 2, 1, 3).contiguous().view(Bn, Tn, C)
        h = h + conv1d(a, p + "attn.c_proj")
        h = h + conv1d(gelu_new(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
    h = ln(h, "transformer.ln_f")
    return F.linear(h, P["transformer.wte.weight"])


class NNBlock(nn.Module):
    def __init__(self, C, NH, eps):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(C, eps=eps), nn.LayerNorm(C, eps=eps)
        self.attn = nn.MultiheadAttention(C, NH, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(C, 4 * C), nn.GELU(approximate="tanh"),
                                 nn.Linear(4 * C, C))

    def forward(self, x, mask):
        y = self.ln_1(x)
        x = x + self.attn(y, y, y, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln_2(x))


def gpt2_nn_forward(cfg, P, ids):
    """the same GPT-2 from torch.nn modules (a check of gpt2_forward)"""
    C, NH, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    Tn = ids.shape[1]
    wte = nn.Embedding(cfg["vocab_size"], C)
    wpe = nn.Embedding(cfg["n_positions"], C)
    blocks = [NNBlock(C, NH, eps) for _ in range(cfg["n_layer"])]
    ln_f = nn.LayerNorm(C, eps=eps)
    for mod in [wte, wpe, ln_f] + blocks:
        mod.to(P["transformer.wte.weight"].dtype)
    with torch.no_grad():
        wte.weight.copy_(P["transformer.wte.weight"])
        wpe.weight.copy_(P["transformer.wpe.weight"])
        for l, b in enumerate(blocks):
            p = "transformer.h.%d." % l
            for ln_name in ("ln_1", "ln_2"):
                getattr(b, ln_name).weight.copy_(P[p + ln_name + ".weight"])
                getattr(b, ln_name).bias.copy_(P[p + ln_name + ".bias"])
            b.attn.in_proj_weight.copy_(P[p + "attn.c_attn.weight"].T)
            b.attn.in_proj_bias.copy_(P[p + "attn.c_attn.bias"])
            b.attn.out_proj.weight.copy_(P[p + "attn.c_proj.weight"].T)
            b.attn.out_proj.bias.copy_(P[p + "attn.c_proj.bias"])
            b.mlp[0].weight.copy_(P[p + "mlp.c_fc.weight"].T)
            b.mlp[0].bias.copy_(P[p + "mlp.c_fc.bias"])
            b.mlp[2].weight.copy_(P[p + "mlp.c_proj.weight"].T)
            b.mlp[2].bias.copy_(P[p + "mlp.c_proj.bias"])
        ln_f.weight.copy_(P["transformer.ln_f.weight"])
        ln_f.bias.copy_(P["transformer.ln_f.bias"])
        mask = torch.ones(Tn, Tn, dtype=torch.bool).triu(1)
        h = wte(ids) + wpe(torch.arange(Tn))[None]
        for b in blocks:
            h = b(h, mask)
        return ln_f(h) @ wte.weight.T


# ---- the runs ----------------------------------------------------------------

def init_params(names, seed, std):
    g = torch.Generator().manual_seed(seed)
    P = {}
    for name, shape in names:
        embedding = "embed" in name or "wte" in name or "wpe" in name
        t = torch.randn(shape, generator=g) * (std if len(shape) == 2 and not embedding else 0.1)
        if name.endswith("norm.weight") or (".ln_" in name and name.endswith(".weight")):
            t = t + 1.0
        P[name] = t
    return P


def batch(V, seed):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, V, (B, T + 1), generator=g)
    return seq[:, :T].contiguous(), seq[:, 1:].contiguous()


def loss_of(forward, cfg, P, x, y):
    logits = forward(cfg, P, x)
    return logits, F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def close(a, b, rel, what):
    a, b = a.detach().double(), b.detach().double()
    err, scale = (a - b).abs().max().item(), b.abs().max().item()
    print("  %-40s max |diff| %.3g of scale %.3g" % (what, err, scale))
    if not err <= rel * scale:
        raise SystemExit("self-check failed: %s: %g > %g * %g" % (what, err, rel, scale))


def greedy(forward, cfg, P, V, seed):
    """the first two random prompts whose greedy continuations hold 6 or more
    distinct tokens (random weights tend to repeat one token) and whose
    steps all have a top-two logit gap of 1e-3 or more"""
    g = torch.Generator().manual_seed(seed)
    prompts, outs, gaps = [], [], []
    with torch.no_grad():
        for _ in range(1000):
            if len(prompts) == 2:
                break
            seq = torch.randint(0, V, (1, PROMPT), generator=g)
            prompt, new, gap = seq[0].clone(), [], 1e9
            for _ in range(NEW):
                last = forward(cfg, P, seq)[0, -1]
                top = torch.topk(last, 2).values
                gap = min(gap, (top[0] - top[1]).item())
                nxt = int(torch.argmax(last))
                new.append(nxt)
                seq = torch.cat([seq, torch.tensor([[nxt]])], dim=1)
            if gap >= 1e-3 and len(set(new)) >= 6:
                prompts.append(prompt)
                outs.append(torch.tensor(new))
                gaps.append(gap)
    if len(prompts) < 2:
        raise SystemExit("no two prompts in 1000 continue into 6 distinct tokens")
    print("  greedy: smallest top-two gaps %s: %s" % (["%.3g" % v for v in gaps],
                                                     [o.tolist() for o in outs]))
    return torch.stack(prompts).int(), torch.stack(outs).int()


def reference(name, cfg, names, forward, seed, std, adamw=True, check=None, grads=True):
    V = cfg["vocab_size"]
    print(name)
    P = init_params(names, seed, std)
    x, y = batch(V, seed + 1)
    ref = {"x": x.int(), "y": y.int()}
    # float32 forward and gradients
    P32 = {k: v.clone().requires_grad_(True) for k, v in P.items()}
    logits, loss = loss_of(forward, cfg, P32, x, y)
    loss.backward()
    ref["loss"] = loss.detach().reshape(1)
    ref["logits"] = logits.detach()
    # float64: the self-checks and grad64
    P64 = {k: v.double().requires_grad_(True) for k, v in P.items()}
    logits64, loss64 = loss_of(forward, cfg, P64, x, y)
    loss64.backward()
    close(logits, logits64, 1e-6, "logits float32 vs float64")
    if check:  # (forward, tolerance), in float64
        close(check[0](cfg, {k: v.double() for k, v in P.items()}, x), logits64, check[1],
              "logits vs %s" % check[0].__name__)
    for k, _ in names:
        close(P32[k].grad, P64[k].grad, 2e-6, "grad %s f32 vs f64" % k)
        if grads:
            ref["grad." + k] = P32[k].grad.detach()
    if adamw:
        Pa = {k: v.clone().requires_grad_(True) for k, v in P.items()}
        opt = torch.optim.AdamW([Pa[k] for k, _ in names], lr=LR, betas=BETAS, eps=EPS,
                                weight_decay=WD, foreach=False)
        losses = []
        for _ in range(STEPS):
            opt.zero_grad()
            _, l = loss_of(forward, cfg, Pa, x, y)
            l.backward()
            opt.step()
            losses.append(l.item())
        ref["adamw3.loss"] = torch.tensor(losses, dtype=torch.float32)
        for k, _ in names:
            ref["adamw3." + k] = Pa[k].detach()
    ref["gen.prompt"], ref["gen.tokens"] = greedy(forward, cfg, P, V, seed + 2)
    return P, ref


def llama_file(P):
    return P  # the hub's names are the state_dict's


def gpt2_file(cfg, P):
    """as the hub's gpt2 model.safetensors: no "transformer." prefix, Conv1D
    weights [in, out] (as the parameters are), the mask buffers h.N.attn.bias"""
    out = {}
    n = cfg["n_positions"]
    for k, v in P.items():
        short = k[len("transformer."):]
        out[short] = v
        if short.endswith("attn.c_attn.weight"):
            out[short.replace("c_attn.weight", "bias")] = \
                torch.ones(n, n).tril().view(1, 1, n, n)
    return out


def dump(name, cfg, weights, ref):
    d = os.path.join(OUT, name)
    write(os.path.join(d, "config.json"), json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    write(os.path.join(d, "model.safetensors"), st_bytes(weights))
    write(os.path.join(OUT, name + ".ref.safetensors"), st_bytes(ref, {"source": "hf_ref.py"}))


def main():
    torch.manual_seed(0)
    # llama-tiny: untied, default rope
    P, ref = reference("llama-tiny", LLAMA, llama_names(LLAMA), llama_forward, 1000, 0.1,
                       check=(meta_llama_forward, 1e-6))
    dump("llama-tiny", LLAMA, llama_file(P), ref)

    # llama-tiny-bf16: the same weights rounded to bf16 (round to nearest even)
    cfg16 = dict(LLAMA, torch_dtype="bfloat16")
    P16 = {k: v.to(torch.bfloat16) for k, v in P.items()}
    wide = {k: v.float() for k, v in P16.items()}
    logits16, loss16 = loss_of(llama_forward, LLAMA, wide, ref["x"].long(), ref["y"].long())
    print("llama-tiny-bf16: loss %.7g (float32 weights: %.7g)" % (loss16, ref["loss"]))
    d = os.path.join(OUT, "llama-tiny-bf16")
    write(os.path.join(d, "config.json"), json.dumps(cfg16, indent=2, sort_keys=True) + "\n")
    write(os.path.join(d, "model.safetensors"), st_bytes(P16))
    write(os.path.join(OUT, "llama-tiny-bf16.ref.safetensors"),
          st_bytes({"x": ref["x"], "y": ref["y"], "loss": loss16.detach().reshape(1),
                    "logits": logits16.detach()}, {"source": "hf_ref.py"}))

    # llama-tiny-sharded: llama-tiny's weights in two shards and an index
    d = os.path.join(OUT, "llama-tiny-sharded")
    write(os.path.join(d, "config.json"), json.dumps(LLAMA, indent=2, sort_keys=True) + "\n")
    names = list(P)
    half = len(names) // 2
    shards = [names[:half], names[half:]]
    wmap, total = {}, 0
    for i, part in enumerate(shards):
        fn = "model-%05d-of-%05d.safetensors" % (i + 1, len(shards))
        write(os.path.join(d, fn), st_bytes({k: P[k] for k in part}))
        for k in part:
            wmap[k] = fn
            total += P[k].numel() * 4
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))}
    write(os.path.join(d, "model.safetensors.index.json"), json.dumps(index, indent=2) + "\n")

    # llama-tiny-rope3: tied, llama3 rope scaling; forward and gradients
    P, ref = reference("llama-tiny-rope3", LLAMA3, llama_names(LLAMA3), llama_forward, 2000, 0.2,
                       adamw=False, check=(meta_llama_forward, 1e-6))
    dump("llama-tiny-rope3", LLAMA3, llama_file(P), ref)

    # llama-tiny-linear: one layer, tied, linear rope scaling; forward only
    P, ref = reference("llama-tiny-linear", LLAMA_LINEAR, llama_names(LLAMA_LINEAR),
                       llama_forward, 4000, 0.2, adamw=False, grads=False,
                       check=(meta_linear_forward, 1e-6))
    dump("llama-tiny-linear", LLAMA_LINEAR, llama_file(P), ref)

    # gpt2-tiny
    P, ref = reference("gpt2-tiny", GPT2, gpt2_names(GPT2), gpt2_forward, 3000, 0.3,
                       check=(gpt2_nn_forward, 1e-12))
    dump("gpt2-tiny", GPT2, gpt2_file(GPT2, P), ref)


if __name__ == "__main__":
    main()
