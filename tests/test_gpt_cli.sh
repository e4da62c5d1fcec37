#!/usr/bin/env bash
# test_gpt_cli.sh — language models as a user meets them on the command
# line: a small GPT trained on text (the loss falls; JSON eval lines with
# nats and bits per byte; the predicted step peak is the measured one), --steps stopping any model, a run stopped mid-epoch
# and resumed giving the uninterrupted run's loss bit for bit, --init with
# --freeze keeping a block's bytes, GPT-2's estimate (124,439,808 parameters,
# 124,475,904 with llm.c's padded vocabulary), and every bad input the issue
# names refused with a message naming the file, the position and the fault:
# --seq past the context, a text shorter than a window, ids past the
# vocabulary, a shard with the wrong magic, a count that disagrees with the
# size, a truncated shard. Shards and .npy files are written by hand in
# python3 (struct); the numbers they hold are the test's.
source "$(dirname "$0")/lib.sh"

cp "$src/tests/data/small_gpt.model" "$tmp/g.model" # 2 layers, context 32, d 32
# Text: a few sentences repeated (about 40 KB), so a small model learns fast.
python3 - "$tmp/text.txt" <<'PY'
import sys
s = "the quick brown fox jumps over the lazy dog. a frugal engine counts every byte.\n"
open(sys.argv[1], "w").write(s * 500)
PY
run() { "$bin" train --model "$tmp/g.model" --data "$tmp/text.txt" --batch 8 --threads 2 --json "$@"; }

# ---- learning ----
run --steps 60 --lr 3e-3 --optimizer adamw --test-limit 16 >"$tmp/l.json" 2>"$tmp/l.err" || no "train the small GPT: $(tail -2 "$tmp/l.err")"
python3 - "$tmp/l.json" >"$tmp/l.out" 2>&1 <<'PY' && ok || no "learning: $(cat "$tmp/l.out")"
import json, math, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
evals = [e for e in ev if e["event"] == "eval"]
summ = [e for e in ev if e["event"] == "summary"][0]
assert evals, "no eval line"
v = evals[-1]
assert v["step"] == 60 and summ["steps"] == 60, (v["step"], summ["steps"])
# the loss of a uniform guess over 256 bytes is ln 256 = 5.545; repeated text is learnt far below it
assert v["val_loss"] < 2.5, v["val_loss"]
assert abs(v["val_bits_per_byte"] - v["val_loss"] / math.log(2)) < 1e-9
# the step's predicted reserved bytes against the allocator's measured peak: the
# data term beyond the step (the loader's queue, the evaluation) is small here
p, m = summ["predicted_step_reserved"], summ["measured_reserved_peak"]
assert p <= m <= p * 1.02 + (1 << 20), (p, m)
print("val loss", v["val_loss"], "predicted", p, "measured", m)
PY

# Adafactor learns the same text (its relative step capped at --lr 0.1), stepped
# inside backward, the predicted step peak the measured one.
run --steps 60 --lr 0.1 --optimizer adafactor --test-limit 16 >"$tmp/af.json" 2>"$tmp/af.err" || no "adafactor: $(tail -2 "$tmp/af.err")"
python3 - "$tmp/af.json" >"$tmp/af.out" 2>&1 <<'PY' && ok || no "adafactor learning: $(cat "$tmp/af.out")"
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
v = [e for e in ev if e["event"] == "eval"][-1]
summ = [e for e in ev if e["event"] == "summary"][0]
assert v["step"] == 60 and v["val_loss"] < 2.5, v
p, m = summ["predicted_step_reserved"], summ["measured_reserved_peak"]
assert p <= m <= p * 1.02 + (1 << 20), (p, m)
print("adafactor val loss", v["val_loss"])
PY

# ---- --steps stops any model (the CNN here, if Fashion-MNIST is there) ----
if [ -d "$data" ]; then
    "$bin" train --model cnn --data "$data" --limit 512 --test-limit 64 --batch 64 --steps 3 --json >"$tmp/m.json" 2>&1
    grep -q '"steps": 3' "$tmp/m.json" && ok || no "--steps 3 for the CNN: $(tail -1 "$tmp/m.json")"
fi

# ---- stopped at step 7 (mid-epoch), resumed to 12: the same as 12 straight ----
run --steps 12 --seed 3 --test-limit 8 >"$tmp/a.json" 2>/dev/null
run --steps 7 --seed 3 --test-limit 8 --save "$tmp/c.safetensors" >/dev/null 2>&1
run --steps 12 --seed 3 --test-limit 8 --resume "$tmp/c.safetensors" >"$tmp/b.json" 2>"$tmp/b.err"
a=$(grep '"event": "eval"' "$tmp/a.json" | tail -1 | grep -o '"val_loss": [^,]*')
b=$(grep '"event": "eval"' "$tmp/b.json" | tail -1 | grep -o '"val_loss": [^,]*')
[ -n "$a" ] && [ "$a" = "$b" ] && ok || no "resume mid-epoch: '$a' vs '$b' $(tail -2 "$tmp/b.err")"

# ---- --init + --freeze: a frozen block keeps the file's bytes ----
run --steps 2 --seed 5 --test-limit 8 --save "$tmp/w.safetensors" >/dev/null 2>&1
run --steps 3 --init "$tmp/w.safetensors" --freeze transformer.h.0 --test-limit 8 \
    --save "$tmp/f.safetensors" >/dev/null 2>"$tmp/f.err" || no "init+freeze: $(tail -2 "$tmp/f.err")"
python3 - "$tmp/w.safetensors" "$tmp/f.safetensors" >"$tmp/f.out" 2>&1 <<'PY' && ok || no "freeze: $(cat "$tmp/f.out")"
import json, struct, sys
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None); d = b[8 + n:]
    return {k: d[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items()}
w, f = read(sys.argv[1]), read(sys.argv[2])
frozen = [k for k in w if k.startswith("transformer.h.0.")]
assert len(frozen) == 12, frozen
for k in frozen: assert w[k] == f[k], k
assert w["transformer.h.1.mlp.c_fc.weight"] != f["transformer.h.1.mlp.c_fc.weight"]
# the tied head is saved under both names, one tensor
assert f["lm_head.weight"] == f["transformer.wte.weight"]
PY

# ---- GPT-2's estimate ----
"$bin" estimate --model gpt2 --batch 4 --seq 1024 --optimizer adamw >"$tmp/e.out" 2>&1
grep -q "124439808 trainable parameters" "$tmp/e.out" && ok || no "gpt2 estimate: $(head -2 "$tmp/e.out")"
# Adafactor's state for GPT-2 124M: a row and a column vector per matrix, a
# vector's own size, summed here from GPT-2's shapes (the tied head counted once).
"$bin" estimate --model gpt2 --batch 1 --seq 64 --optimizer adafactor --json >"$tmp/e.json" 2>&1
python3 - "$tmp/e.json" <<'PY' && ok || no "gpt2 adafactor state: $(head -c 300 "$tmp/e.json")"
import json, sys
d, V, T, L = 768, 50257, 1024, 12
mats = [(V, d), (T, d)] + L * [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)]
vecs = L * [d, d, 3 * d, d, d, d, 4 * d, d] + [d, d]
floats = sum(r + c for r, c in mats) + sum(vecs)
e = json.loads(open(sys.argv[1]).read())
assert e["predicted_peak"]["optimizer"] == 4 * floats, (e["predicted_peak"]["optimizer"], 4 * floats)
assert e["optimizer_state_bytes"]["adafactor"] == 4 * floats
assert e["optimizer_state_bytes"]["adam/adamw fp32"] == 8 * 124439808
print("adafactor", 4 * floats, "bytes against adamw's", 8 * 124439808)
PY
sed 's/50257/50304/g' "$src/models/gpt2.model" >"$tmp/gpt2p.model"
"$bin" estimate --model "$tmp/gpt2p.model" --batch 1 --seq 64 >"$tmp/e.out" 2>&1
grep -q "124475904 trainable parameters" "$tmp/e.out" && ok || no "padded gpt2: $(head -2 "$tmp/e.out")"

# ---- bad input ----
expect_fail "--seq past the context" 1 "--seq 33 is outside [1, 32]" run --seq 33 --steps 1
printf 'tiny' >"$tmp/short.txt"
expect_fail "text shorter than a window" 1 "short.txt" \
    "$bin" train --model "$tmp/g.model" --data "$tmp/short.txt" --steps 1
python3 - "$tmp" <<'PY'
import struct, sys
d = sys.argv[1]
def shard(path, toks, magic=20240520, version=1, count=None, cut=0):
    h = [0] * 256
    h[0], h[1], h[2] = magic, version, len(toks) if count is None else count
    b = struct.pack("<256i", *h) + struct.pack("<%dH" % len(toks), *toks)
    open(path, "wb").write(b[:len(b) - cut])
ok = [(i * 7) % 256 for i in range(4000)]
shard(d + "/bad_magic.bin", ok, magic=20240521)
shard(d + "/bad_count.bin", ok, count=5000)
shard(d + "/cut.bin", ok, cut=3)
big = list(ok); big[1234] = 300
shard(d + "/big_id.bin", big)
def npy(path, arr):
    hdr = "{'descr': '<u2', 'fortran_order': False, 'shape': (%d,), }" % len(arr)
    hdr += " " * (63 - len(hdr) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode() + struct.pack("<%dH" % len(arr), *arr))
npy(d + "/big_id.npy", big)
PY
expect_fail "shard with the wrong magic" 1 "bad_magic.bin" run --data "$tmp/bad_magic.bin" --steps 1
grep -qF "magic 20240521 is not llm.c's shard magic 20240520" "$tmp/err" && ok || no "the magic is named: $(head -2 "$tmp/err")"
expect_fail "count against the size" 1 "bad_count.bin" run --data "$tmp/bad_count.bin" --steps 1
expect_fail "truncated shard" 1 "cut.bin" run --data "$tmp/cut.bin" --steps 1
expect_fail "id past the vocabulary (shard)" 1 "big_id.bin" run --data "$tmp/big_id.bin" --steps 1
grep -qF "token 1234 (byte 3492), stream position 1234" "$tmp/err" && ok || no "the position of the bad id is named: $(head -2 "$tmp/err")"
expect_fail "id past the vocabulary (npy)" 1 "big_id.npy" run --data "$tmp/big_id.npy" --steps 1
expect_fail "no such shards" 1 "nothing_*.bin" run --data "$tmp/nothing_*.bin" --steps 1
finish
