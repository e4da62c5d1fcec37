#!/usr/bin/env bash
# test_llama_cli.sh — a Hugging Face model directory as a user meets it on
# the command line (issue 25), beside test_hf_ref.c (the numbers against
# PyTorch) and test_hf_cli.sh (greedy generation):
#  - estimate from the configs in models/hf/: TinyLlama-1.1B's 1,100,048,384
#    parameters (embedding and untied head 2 x 32000 x 2048; per layer q and
#    o 2048^2 each, k and v 2048 x 256 each (4 KV heads of 64), gate, up and
#    down 2048 x 5632 each, two norms of 2048; 22 layers; the final norm) and
#    SmolLM-135M's 134,515,008 (tied head: 49152 x 576 once; per layer q, o
#    576^2, k, v 576 x 192, three 576 x 1536, two norms; 30 layers; the final
#    norm), worked out by hand; LoRA r=8 on q, k, v, o of TinyLlama trains
#    22 x (8 x 2048 + 2048 x 8 + 2 x (8 x 2048 + 256 x 8) + 8 x 2048 + 2048 x 8)
#    = 2,252,800 parameters.
#  - text data through the directory's tokenizer (a SentencePiece model
#    trained on fortunes, tests/data/tok/spm): tokenized once into a cache
#    beside the data (hidden, named by the key), read from the cache the next
#    run; the cache's first id is BOS (Llama's tokenizer adds it); a config
#    with a smaller vocabulary than the tokenizer's is refused naming both.
#  - generate with the directory's tokenizer: the prompt printed, the
#    continuation decoded, the summary's tokens/s, and the KV cache of
#    --max-context 16 positions: 2 layers x (K, V) x 2 KV heads x 16 x 8 x 4 B
#    = 4096 bytes (the grouped heads only).
#  - bad configs and weights, each one message naming the file and fault.
source "$(dirname "$0")/lib.sh"

# ---- estimate: parameter counts by hand ----
"$bin" estimate --model "$src/models/hf/tinyllama-1.1b" --batch 1 --seq 64 >"$tmp/e" 2>&1 &&
    head -1 "$tmp/e" | grep -qF ": 1100048384 trainable parameters" && ok ||
    no "TinyLlama's parameters: $(head -1 "$tmp/e")"
"$bin" estimate --model "$src/models/hf/smollm-135m/config.json" --batch 1 --seq 64 >"$tmp/e" 2>&1 &&
    head -1 "$tmp/e" | grep -qF ": 134515008 trainable parameters" && ok ||
    no "SmolLM's parameters: $(head -1 "$tmp/e")"
"$bin" estimate --model "$src/models/hf/tinyllama-1.1b" --batch 1 --seq 64 \
    --lora r=8,target=q_proj,k_proj,v_proj,o_proj --base-precision nf4 >"$tmp/e" 2>&1 &&
    head -1 "$tmp/e" | grep -qF "(2252800 trained" && grep -q "^frozen base: 155 linear weights stored in nf4" "$tmp/e" && ok ||
    no "TinyLlama LoRA: $(head -1 "$tmp/e") / $(grep 'frozen base' "$tmp/e")"

# ---- a small Llama with the fortunes SentencePiece tokenizer ----
mk() { # dir vocab [extra json]
    mkdir -p "$1"
    cat >"$1/config.json" <<EOF
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": $2,
 "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
 "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64,
 "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": false${3:-}}
EOF
}
mk "$tmp/m" 1000
cp "$src/tests/data/tok/spm/tokenizer.model" "$tmp/m/"
head -c 60000 /usr/share/games/fortunes/fortunes >"$tmp/text.txt" 2>/dev/null ||
    python3 -c "print('a frugal engine counts every byte. ' * 2000)" >"$tmp/text.txt"
train=(train --model "$tmp/m" --data "$tmp/text.txt" --batch 2 --seq 32 --steps 3 --threads 2
    --test-limit 2 --optimizer adamw --save "$tmp/w.safetensors" --save-weights-only)
"$bin" "${train[@]}" >"$tmp/o1" 2>"$tmp/e1" && ok || no "train with a tokenizer: $(tail -3 "$tmp/e1")"
cache=$(ls -A "$tmp" | grep -E '^\.text\.txt\.[0-9a-f]{16}\.tokens\.npy$')
[ -n "$cache" ] && grep -qF "cached in $tmp/$cache" "$tmp/e1" && ok ||
    no "the token cache beside the data: '$cache', $(grep tokens: "$tmp/e1")"
"$bin" "${train[@]}" >"$tmp/o2" 2>"$tmp/e2" && grep -qF "(cached:" "$tmp/e2" && ok ||
    no "the second run reads the cache: $(grep tokens: "$tmp/e2")"
python3 - "$tmp/$cache" <<'PY' && ok || no "the cache's ids"
import struct, sys
b = open(sys.argv[1], "rb").read()
assert b[:6] == b"\x93NUMPY", b[:10]
hl = struct.unpack("<H", b[8:10])[0]
assert "'<i4'" in b[10:10 + hl].decode()
ids = struct.unpack("<%di" % ((len(b) - 10 - hl) // 4), b[10 + hl:])
assert ids[0] == 1, ids[:5]  # BOS (spm_train's default id 1), added by a Llama tokenizer
assert 1000 < len(ids) < 60000 and max(ids) < 1000 and min(ids) >= 0, (len(ids), max(ids))
PY
# a model whose vocabulary is smaller than the tokenizer's
mk "$tmp/small" 500
cp "$src/tests/data/tok/spm/tokenizer.model" "$tmp/small/"
expect_fail "vocabulary mismatch" 1 "the tokenizer and the model disagree" "$bin" train --model "$tmp/small" --data "$tmp/text.txt" \
    --batch 2 --seq 32 --steps 1 --threads 2
grep -qF "the tokenizer has 1000 ids, the model's embedding only 500 rows" "$tmp/err" && ok || no "the mismatch names both sizes: $(head -2 "$tmp/err")"

# ---- generate with the directory's tokenizer ----
"$bin" generate --model "$tmp/m" --weights "$tmp/w.safetensors" --prompt "Q: What" --tokens 8 \
    --max-context 16 --temperature 0 --threads 2 >"$tmp/g" 2>"$tmp/ge" && ok ||
    no "generate: $(tail -2 "$tmp/ge")"
head -c 7 "$tmp/g" | grep -qF "Q: What" && ok || no "the prompt first: $(head -c 40 "$tmp/g")"
grep -qE "tokens in [0-9.]+ s: [0-9.]+ tokens/s" "$tmp/ge" && grep -qF "(4096 bytes) for 16 positions" "$tmp/ge" &&
    ok || no "generate's summary: $(tail -1 "$tmp/ge")"
expect_fail "--stop-at-eos without a tokenizer" 1 "no end-of-sequence token" \
    "$bin" generate --model "$src/tests/data/hf/llama-tiny" --prompt ids:1,2 --tokens 2 --stop-at-eos on

# ---- bad configs ----
bad() { # description, text in stderr, config.json text
    mkdir -p "$tmp/bad"
    printf '%s' "$3" >"$tmp/bad/config.json"
    expect_fail "$1" 1 "$2" "$bin" estimate --model "$tmp/bad" --batch 1 --seq 8
    grep -qF "$tmp/bad/config.json" "$tmp/err" && ok || no "$1: the message names the file: $(head -1 "$tmp/err")"
}
base='"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4'
bad "architecture" 'architecture "BertForMaskedLM" is not supported (supported: LlamaForCausalLM, MistralForCausalLM, GPT2LMHeadModel)' \
    "{\"architectures\": [\"BertForMaskedLM\"], $base}"
bad "missing key" '"hidden_size" is missing' \
    '{"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4}'
bad "rope scaling" 'rope_scaling type "dynamic" is not supported (supported: default, linear, llama3)' \
    "{\"architectures\": [\"LlamaForCausalLM\"], $base, \"rope_scaling\": {\"type\": \"dynamic\", \"factor\": 2.0}}"
bad "kv heads" "the kv heads must divide the heads" \
    "{\"architectures\": [\"LlamaForCausalLM\"], $base, \"num_key_value_heads\": 3}"
bad "activation" 'hidden_act "gelu" is not supported' \
    "{\"architectures\": [\"LlamaForCausalLM\"], $base, \"hidden_act\": \"gelu\"}"
bad "malformed json" "byte" "{\"architectures\": [\"LlamaForCausalLM\"], $base,"
bad "a negative size" '"hidden_size" must be an integer' \
    '{"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": -32, "intermediate_size": 48, "num_hidden_layers": 1, "num_attention_heads": 4}'

# ---- bad weights: strict, as load_state_dict(strict=True) ----
hf="$src/tests/data/hf/llama-tiny"
edit() { # out, python expression over dict t (name -> (dtype, shape, bytes))
    python3 - "$src/tests" "$hf/model.safetensors" "$1" "$2" <<'PY'
import sys
sys.path.insert(0, sys.argv[1])
import st_tools
t = st_tools.read(sys.argv[2])
exec(sys.argv[4])
import json, struct
hdr, off, data = {}, 0, b""
for k, (d, s, b) in t.items():
    hdr[k] = {"dtype": d, "shape": list(s), "data_offsets": [off, off + len(b)]}
    off += len(b)
    data += b
h = json.dumps(hdr).encode()
h += b" " * (-len(h) % 8)
open(sys.argv[3], "wb").write(struct.pack("<Q", len(h)) + h + data)
PY
}
wbad() { # description, text, python edit
    mkdir -p "$tmp/wb"
    cp "$hf/config.json" "$tmp/wb/"
    edit "$tmp/wb/model.safetensors" "$3" || { no "$1: the edit"; return; }
    expect_fail "$1" 1 "$2" "$bin" eval --model "$tmp/wb" --data "$tmp/text.txt" --threads 2
    rm -rf "$tmp/wb"
}
wbad "missing tensor" "missing tensor 'model.layers.1.mlp.up_proj.weight'" 'del t["model.layers.1.mlp.up_proj.weight"]'
wbad "extra tensor" "unexpected tensor 'model.layers.2.mlp.up_proj.weight'" \
    't["model.layers.2.mlp.up_proj.weight"] = t["model.layers.1.mlp.up_proj.weight"]'
wbad "wrong shape" "tensor 'model.layers.0.self_attn.k_proj.weight' has shape" \
    'd, s, b = t["model.layers.0.self_attn.k_proj.weight"]; t["model.layers.0.self_attn.k_proj.weight"] = (d, [s[1], s[0]], b)'
wbad "wrong dtype" "tensor 'model.norm.weight' is i32, the model needs f32" \
    'd, s, b = t["model.norm.weight"]; t["model.norm.weight"] = ("I32", s, b)'

finish
