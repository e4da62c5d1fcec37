"""llama_attn_ref.py — PyTorch's results for a Llama attention block's ops
(ROPE_QKV, grouped-query ATTENTION), written to tests/llama_attn_ref.h for
test_rope.c (which needs no torch).

As Hugging Face's transformers computes them (modeling_llama.py and
modeling_rope_utils.py, written here from their definitions: transformers is
not installed on this machine), float32 on the CPU:
  inv_freq (_compute_default_rope_parameters):
      1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
  llama3 (_compute_llama3_parameters), factor 8, low_freq_factor 1,
      high_freq_factor 4, original_max_position_embeddings 8192:
      low_freq_wavelen = old_context_len / low_freq_factor
      high_freq_wavelen = old_context_len / high_freq_factor
      wavelen = 2 * math.pi / inv_freq
      inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
      smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
      smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
      is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
      inv_freq_llama = torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)
  LlamaRotaryEmbedding.forward:
      freqs = (inv_freq[None, :, None].float().expand(B, -1, 1) @ position_ids[:, None, :].float()).transpose(1, 2)
      emb = torch.cat((freqs, freqs), dim=-1); cos = emb.cos(); sin = emb.sin()
  apply_rotary_pos_emb: q * cos + rotate_half(q) * sin,
      rotate_half(x) = torch.cat((-x[..., d/2:], x[..., :d/2]), dim=-1)
  repeat_kv: k[:, :, None].expand(B, NKV, NH // NKV, T, HS).reshape(B, NH, T, HS)
  eager_attention_forward: softmax(q k^T / sqrt(HS) + causal mask) v,
      y = attn.transpose(1, 2).reshape(B, T, NH * HS)
Inputs q (B,T,NH HS), k, v (B,T,NKV HS) as q_proj, k_proj, v_proj give them
(.view(B, T, -1, HS).transpose(1, 2) per head); the rotated, packed
[rot(q) | rot(k) | v] (B,T,(NH+2NKV)HS) is frugal's ROPE_QKV output. The
gradients are autograd's of L = sum(y * dy) for a fixed random dy. Two cases:
the default rope (theta 10000) at positions 0.., and llama3 (theta 500000,
HS 8: a frequency in each band) at positions 1000.. (generation's chunk).
Run: python3 tests/ref/llama_attn_ref.py > tests/llama_attn_ref.h
"""
import math
import torch

torch.manual_seed(25)
B, T, NH, NKV, HS = 2, 7, 4, 2, 8
out = []


def dump(name, t):
    t = t.detach().contiguous().view(-1)
    vals = ", ".join("%.9g" % v for v in t.float().tolist())
    out.append(f"static const float {name}[{t.numel()}] = {{{vals}}};")


def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))


def llama3_inv_freq(base, dim, factor, low_freq_factor, high_freq_factor, old_context_len):
    inv_freq = default_inv_freq(base, dim)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def case(prefix, inv_freq, pos0):
    q = torch.randn(B, T, NH * HS, requires_grad=True)
    k = torch.randn(B, T, NKV * HS, requires_grad=True)
    v = torch.randn(B, T, NKV * HS, requires_grad=True)
    position_ids = (pos0 + torch.arange(T)).unsqueeze(0).expand(B, T)
    inv_freq_expanded = inv_freq[None, :, None].float().expand(B, -1, 1)
    position_ids_expanded = position_ids[:, None, :].float()
    freqs = (inv_freq_expanded.float() @ position_ids_expanded.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().unsqueeze(1), emb.sin().unsqueeze(1)
    qh = q.view(B, T, NH, HS).transpose(1, 2)
    kh = k.view(B, T, NKV, HS).transpose(1, 2)
    vh = v.view(B, T, NKV, HS).transpose(1, 2)
    qr = qh * cos + rotate_half(qh) * sin
    kr = kh * cos + rotate_half(kh) * sin
    packed = torch.cat(
        (qr.transpose(1, 2).reshape(B, T, -1), kr.transpose(1, 2).reshape(B, T, -1), v), dim=-1
    )
    rep = NH // NKV
    kx = kr[:, :, None].expand(B, NKV, rep, T, HS).reshape(B, NH, T, HS)
    vx = vh[:, :, None].expand(B, NKV, rep, T, HS).reshape(B, NH, T, HS)
    att = (qr @ kx.transpose(2, 3)) * (1.0 / math.sqrt(HS))
    mask = torch.triu(torch.full((T, T), float("-inf")), diagonal=1)
    att = torch.softmax(att + mask, dim=-1, dtype=torch.float32)
    y = (att @ vx).transpose(1, 2).reshape(B, T, NH * HS)
    dy = torch.randn_like(y)
    (y * dy).sum().backward()
    for name, t in (("q", q), ("k", k), ("v", v), ("qkv", packed), ("y", y), ("dy", dy),
                    ("dq", q.grad), ("dk", k.grad), ("dv", v.grad)):
        dump(f"{prefix}_{name}", t)


case("ref_def", default_inv_freq(10000.0, HS), 0)
case("ref_l3", llama3_inv_freq(500000.0, HS, 8.0, 1.0, 4.0, 8192), 1000)
print(f"/* llama_attn_ref.h — generated by tests/ref/llama_attn_ref.py (PyTorch {torch.__version__}): do not edit. */")
print(f"#define REF_B {B}\n#define REF_T {T}\n#define REF_NH {NH}\n#define REF_NKV {NKV}\n#define REF_HS {HS}")
print("\n".join(out))
