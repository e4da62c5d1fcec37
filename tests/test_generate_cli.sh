#!/usr/bin/env bash
# test_generate_cli.sh — `frugal generate` as a user meets it: a small byte
# GPT trained for a few seconds on one repeated sentence, then text streamed
# from it. Checked: the prompt then exactly --tokens new bytes on stdout; the
# same seed the same bytes, greedy (temperature 0) continuing the sentence it
# learnt; tokens/s and the kv cache bytes (2 layers x K, V x 32 positions x 32
# x 4 bytes = 16384, worked out by hand) on stderr; a prompt longer than the
# context cropped with a note naming the count; ids: prompts; the two rules
# past the context, --window half (the default) and slide, against a float64
# decode of the checkpoint in plain Python (ref.py below): the same bytes
# while the sequence fits the context, each rule's own bytes past it; and the
# bad inputs: no --weights, a model that does not read tokens, an id past the
# vocabulary, a malformed ids: list. With an OpenCL device, --device opencl
# makes the CPU's greedy bytes under both rules, its caches in the device's
# memory.
source "$(dirname "$0")/lib.sh"

cp "$src/tests/data/small_gpt.model" "$tmp/g.model" # 2 layers, context 32, d 32
python3 - "$tmp/text.txt" <<'PY'
import sys
open(sys.argv[1], "w").write("the quick brown fox jumps over the lazy dog. " * 1000)
PY
"$bin" train --model "$tmp/g.model" --data "$tmp/text.txt" --batch 16 --threads 2 --steps 80 \
    --lr 1e-2 --optimizer adamw --test-limit 8 --save "$tmp/g.st" >/dev/null 2>"$tmp/t.err" ||
    no "train the small GPT: $(tail -2 "$tmp/t.err")"

gen() { "$bin" generate --model "$tmp/g.model" --weights "$tmp/g.st" --threads 2 "$@"; }

# ---- the stream ----
gen --prompt 'the quick ' --tokens 40 --seed 3 >"$tmp/a.out" 2>"$tmp/a.err" || no "generate: $(cat "$tmp/a.err")"
gen --prompt 'the quick ' --tokens 40 --seed 3 >"$tmp/b.out" 2>/dev/null
python3 - "$tmp/a.out" "$tmp/b.out" "$tmp/a.err" >"$tmp/r" 2>&1 <<'PY' && ok || no "stream: $(cat "$tmp/r")"
import re, sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
err = open(sys.argv[3]).read()
assert a.startswith(b"the quick "), a[:20]
assert len(a) == len("the quick ") + 40 + 1 and a.endswith(b"\n"), len(a)  # prompt, 40 bytes, newline
assert a == b, "the same seed gave other bytes"
assert re.search(r"40 tokens in [0-9.]+ s: [0-9.]+ tokens/s", err), err
assert "kv_cache 16.0 KiB (16384 bytes)" in err, err
PY
gen --prompt 'the quick ' --tokens 40 --seed 4 >"$tmp/c.out" 2>/dev/null
cmp -s "$tmp/a.out" "$tmp/c.out" && no "another seed gave the same 40 bytes" || ok

# greedy continues the sentence it learnt, across a context wrap (10 + 60 > 32)
gen --prompt 'the quick ' --tokens 60 --temperature 0 >"$tmp/g.out" 2>"$tmp/g.err" || no "greedy: $(cat "$tmp/g.err")"
grep -qF "the quick brown fox jumps over the lazy dog" "$tmp/g.out" && ok ||
    no "greedy did not continue the learnt sentence: $(cat "$tmp/g.out")"

# a prompt of 50 bytes: the context (32) keeps the last 32, 18 dropped
gen --prompt "$(printf 'the quick brown fox jumps over the lazy dog. the')" --tokens 5 \
    --temperature 0 >"$tmp/l.out" 2>"$tmp/l.err" || no "long prompt: $(cat "$tmp/l.err")"
grep -qF "the prompt has 48 tokens, the context 32: the first 16 are dropped" "$tmp/l.err" && ok ||
    no "long prompt note: $(cat "$tmp/l.err")"

# ids: a byte model takes them too (116 104 101 = "the"), and prints bytes
gen --prompt ids:116,104,101 --tokens 4 --temperature 0 >"$tmp/i.out" 2>"$tmp/i.err" || no "ids: $(cat "$tmp/i.err")"
head -c 3 "$tmp/i.out" | grep -qx "the" && ok || no "ids prompt echoed: $(cat "$tmp/i.out")"

# ---- past the context: --window half (the default) and slide ----
cat >"$tmp/ref.py" <<'PY'
# A float64 decode of small_gpt.model from its checkpoint, in plain Python:
# for each byte frugal made, the reference's window under the rule, its
# logits, and the byte checked to be their argmax (a near tie, top two within
# TIE, may go either way). Usage: ref.py CKPT half|slide PROMPT_LEN OUT
import json, math, struct, sys
from operator import mul

T, C, NH, L, V, TIE = 32, 32, 2, 2, 256, 2e-3
HS = C // NH
ckpt, rule, n_prompt, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
raw = open(ckpt, "rb").read()
hlen = struct.unpack("<Q", raw[:8])[0]
head = json.loads(raw[8:8 + hlen])

def tensor(name):  # a list of rows (2-d) or a list (1-d)
    e = head[name]
    a, b = e["data_offsets"]
    v = struct.unpack("<%df" % ((b - a) // 4), raw[8 + hlen + a:8 + hlen + b])
    if len(e["shape"]) == 1:
        return list(v)
    n = e["shape"][1]
    return [list(v[i:i + n]) for i in range(0, len(v), n)]

p = "transformer."
wte, wpe, head_w = tensor(p + "wte.weight"), tensor(p + "wpe.weight"), tensor("lm_head.weight")
lnf = tensor(p + "ln_f.weight"), tensor(p + "ln_f.bias")
blocks = []
for l in range(L):
    q = "%sh.%d." % (p, l)
    blocks.append({k: tensor(q + k) for k in (
        "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
        "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
        "mlp.c_proj.weight", "mlp.c_proj.bias")})

def layernorm(x, w, b):  # biased variance, eps 1e-5
    m = sum(x) / len(x)
    r = 1.0 / math.sqrt(sum((v - m) ** 2 for v in x) / len(x) + 1e-5)
    return [(v - m) * r * wi + bi for v, wi, bi in zip(x, w, b)]

def linear(x, W, b=None):  # W (out, in) as PyTorch's Linear
    y = [sum(map(mul, row, x)) for row in W]
    return [v + bi for v, bi in zip(y, b)] if b else y

def gelu(v):
    return 0.5 * v * (1.0 + math.tanh(math.sqrt(2.0 / math.pi) * (v + 0.044715 * v ** 3)))

def logits(tok):  # tok at positions 0..len-1; the last position's logits
    x = [[a + b for a, b in zip(wte[t], wpe[i])] for i, t in enumerate(tok)]
    for B in blocks:
        qkv = [linear(layernorm(r, B["ln_1.weight"], B["ln_1.bias"]), B["attn.c_attn.weight"],
                      B["attn.c_attn.bias"]) for r in x]
        for t in range(len(x)):
            y = []
            for h in range(NH):
                q = qkv[t][h * HS:(h + 1) * HS]
                s = [sum(map(mul, q, qkv[u][C + h * HS:C + (h + 1) * HS])) / math.sqrt(HS)
                     for u in range(t + 1)]
                mx = max(s)
                e = [math.exp(v - mx) for v in s]
                z = sum(e)
                y += [sum(e[u] / z * qkv[u][2 * C + h * HS + j] for u in range(t + 1))
                      for j in range(HS)]
            x[t] = [a + b for a, b in zip(x[t], linear(y, B["attn.c_proj.weight"],
                                                       B["attn.c_proj.bias"]))]
        for t in range(len(x)):
            f = [gelu(v) for v in linear(layernorm(x[t], B["ln_2.weight"], B["ln_2.bias"]),
                                         B["mlp.c_fc.weight"], B["mlp.c_fc.bias"])]
            x[t] = [a + b for a, b in zip(x[t], linear(f, B["mlp.c_proj.weight"],
                                                       B["mlp.c_proj.bias"]))]
    return linear(layernorm(x[-1], *lnf), head_w)

seq = list(open(out, "rb").read()[:-1])  # the prompt, then the bytes made (then a newline)
start = max(0, n_prompt - T)  # the window is seq[start:k]
ties = moves = 0
margin = math.inf
for k in range(n_prompt, len(seq)):
    z = logits(seq[start:k])
    want = max(range(V), key=lambda v: z[v])
    gap = min(z[want] - z[v] for v in range(V) if v != want)
    got = seq[k]
    margin = min(margin, gap)
    if gap > TIE:
        assert got == want, "byte %d: frugal made %d, the reference's argmax is %d (margin %.3g), " \
            "window [%d, %d)" % (k - n_prompt, got, want, gap, start, k)
    else:
        ties += 1
        assert z[got] >= z[want] - TIE, "byte %d: %d is not within %g of the top" % (k, got, TIE)
    # the window for the next byte
    if rule == "slide":
        moves += k + 1 - start > T
        start = max(start, k + 1 - T)
    elif k + 1 - start > T:  # half: the last T/2, positions from 0 again
        start, moves = k + 1 - T // 2, moves + 1
print("%s: %d bytes as the reference, %d window moves, %d near ties, smallest margin %.3g" %
      (rule, len(seq) - n_prompt, moves, ties, margin))
PY
# 10 + 23 bytes: the last made from a full window of 32, none past it: the same
gen --prompt 'the quick ' --tokens 23 --temperature 0 >"$tmp/h0.out" 2>/dev/null
gen --prompt 'the quick ' --tokens 23 --temperature 0 --window slide >"$tmp/s0.out" 2>"$tmp/s0.err" ||
    no "--window slide: $(cat "$tmp/s0.err")"
cmp -s "$tmp/h0.out" "$tmp/s0.out" && ok || no "within the context, slide and half differ"
# a prompt of 39 bytes (cropped to 32) and 30 more: half moves its window
# twice, slide at every byte; each against the reference's decode
p='aaaa bbbb cccc dddd eeee ffff gggg hhhh'
gen --prompt "$p" --tokens 30 --temperature 0 >"$tmp/h1.out" 2>/dev/null
gen --prompt "$p" --tokens 30 --temperature 0 --window half >"$tmp/h2.out" 2>/dev/null
cmp -s "$tmp/h1.out" "$tmp/h2.out" && ok || no "--window half is not the default"
gen --prompt "$p" --tokens 30 --temperature 0 --window slide >"$tmp/s1.out" 2>/dev/null
for rule in half slide; do
    python3 "$tmp/ref.py" "$tmp/g.st" $rule ${#p} "$tmp/${rule:0:1}1.out" >"$tmp/r" 2>&1 && ok ||
        no "--window $rule against the float64 decode: $(tail -1 "$tmp/r")"
done
# and past the context the two rules part for this prompt (the reference's
# decodes differ at the second byte, by a margin of 1.7 in the logits)
cmp -s "$tmp/h1.out" "$tmp/s1.out" && no "past the context, slide made half's bytes: $(cat "$tmp/s1.out")" || ok
python3 "$tmp/ref.py" "$tmp/g.st" slide 10 "$tmp/s0.out" >"$tmp/r" 2>&1 && ok ||
    no "within the context against the float64 decode: $(tail -1 "$tmp/r")"

# ---- on an OpenCL device: the same greedy bytes as the CPU (both rules),
# the caches in the device's memory (its own line: 16384 bytes, as above)
if "$bin" devices >/dev/null 2>&1; then
    for rule in half slide; do
        gen --prompt "$p" --tokens 30 --temperature 0 --window $rule --device opencl \
            >"$tmp/d.out" 2>"$tmp/d.err" || no "generate --device opencl: $(tail -1 "$tmp/d.err")"
        cmp -s "$tmp/${rule:0:1}1.out" "$tmp/d.out" && ok ||
            no "--device opencl --window $rule: $(cat "$tmp/d.out"), the cpu: $(cat "$tmp/${rule:0:1}1.out")"
    done
    grep -q "^device memory peak: .*kv_cache 16.0 KiB (16384 bytes)" "$tmp/d.err" && ok ||
        no "the device's kv_cache line: $(cat "$tmp/d.err")"
else
    echo "no OpenCL device: the --device opencl runs are skipped"
fi

# ---- bad input ----
expect_fail "no --weights" 2 "--weights CKPT is required" \
    "$bin" generate --model "$tmp/g.model" --prompt x
expect_fail "a model without token input" 1 "does not read tokens" \
    "$bin" generate --model mlp --weights "$tmp/g.st" --prompt x
expect_fail "missing weights file" 1 "$tmp/none.st" \
    "$bin" generate --model "$tmp/g.model" --weights "$tmp/none.st" --prompt x
expect_fail "an id past the vocabulary" 1 "prompt token 1 is id 300, outside the vocabulary [0, 256)" \
    gen --prompt ids:5,300 --tokens 3
expect_fail "a malformed ids list" 2 "expected token ids separated by commas" \
    gen --prompt ids:5,,7 --tokens 3
expect_fail "ids past int32" 2 "expected token ids separated by commas" \
    gen --prompt ids:99999999999 --tokens 3
finish
