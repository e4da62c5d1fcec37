#!/usr/bin/python3
"""make_weights_corpus.py — seeds for fuzz/fuzz_weights.c: the init of the
fuzzer's GPT (vocab 8, n_embd 8, block_size 4, one layer, two heads) as
nanoGPT's state_dict (lm_head.weight included), without lm_head.weight, with
a lm_head.weight that differs, with the causal mask as a buffer, and in
Hugging Face GPT-2 layout without and with the "transformer." prefix. Rerun with
/usr/bin/python3 fuzz/corpus/make_weights_corpus.py"""
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "ref"))
from make_gpt_ref import GPT, GPTConfig, hf_state_dict, write_safetensors  # noqa: E402

config = GPTConfig(block_size=4, vocab_size=8, n_layer=1, n_head=2, n_embd=8)
torch.manual_seed(7)
sd = {k: v.clone() for k, v in GPT(config).state_dict().items()}
out = os.path.join(HERE, "weights")
os.makedirs(out, exist_ok=True)
write_safetensors(os.path.join(out, "nanogpt.safetensors"), sd, {})
write_safetensors(os.path.join(out, "untied.safetensors"),
                  {k: v for k, v in sd.items() if k != "lm_head.weight"}, {})
bad = dict(sd)
bad["lm_head.weight"] = sd["lm_head.weight"] + 1.0
write_safetensors(os.path.join(out, "tie_differs.safetensors"), bad, {})
masks = dict(sd)
masks["transformer.h.0.attn.bias"] = torch.tril(torch.ones(4, 4)).view(1, 1, 4, 4)
write_safetensors(os.path.join(out, "nanogpt_masks.safetensors"), masks, {})
hf = hf_state_dict(sd, config)
write_safetensors(os.path.join(out, "hf.safetensors"), hf, {"format": "pt"})
write_safetensors(os.path.join(out, "hf_prefixed.safetensors"),
                  {"transformer." + k: v for k, v in hf.items()}, {"format": "pt"})
