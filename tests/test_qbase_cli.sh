#!/usr/bin/env bash
# test_qbase_cli.sh — --base-precision as a user meets it: a small GPT with a
# frozen block whose linear weights are stored in bf16, int8 or NF4.
#  - The frozen weights saved by --save-weights-only (dequantized, f32) are
#    the --init file's values through the format, checked here against the
#    format written out in Python from quant.h's definition: bf16 round to
#    nearest even and int8 (s = absmax / 127 in f32, q = round half to even
#    of w / s, w' = q s) bit for bit; NF4 within its bound (half the widest
#    gap of QLoRA's table, 0.152, times the block's absmax, plus the double
#    quantization's error of the absmax, under 1% of it here).
#  - The predicted step peak is the measured one (test_gpt_cli's margin),
#    and the parameters' bytes drop by what the format saves.
#  - A run stopped at step 3 and resumed to 6 gives the straight run's loss
#    bit for bit (the checkpoint keeps the quantized bytes themselves).
#  - --base-precision auto under --budget: the most precise format that fits,
#    at the boundaries each format's own refusal names.
#  - Bad input: an unknown format, nothing frozen, a resume with another
#    format: one message naming the option, non-zero exit.
source "$(dirname "$0")/lib.sh"

cp "$src/tests/data/small_gpt.model" "$tmp/g.model" # 2 layers, context 32, d 32
python3 - "$tmp/text.txt" <<'PY'
import sys
s = "the quick brown fox jumps over the lazy dog. a frugal engine counts every byte.\n"
open(sys.argv[1], "w").write(s * 500)
PY
run() { "$bin" train --model "$tmp/g.model" --data "$tmp/text.txt" --batch 8 --threads 2 --test-limit 8 "$@"; }
run --steps 2 --seed 5 --save "$tmp/w.safetensors" >/dev/null 2>&1 || no "the base weights"

for f in bf16 int8 nf4; do
    run --steps 2 --init "$tmp/w.safetensors" --freeze transformer.h.0 --base-precision $f --json \
        --save "$tmp/q_$f.safetensors" --save-weights-only >"$tmp/$f.json" 2>"$tmp/$f.err" ||
        no "train with --base-precision $f: $(tail -2 "$tmp/$f.err")"
done
run --steps 2 --init "$tmp/w.safetensors" --freeze transformer.h.0 --json >"$tmp/fp32.json" 2>&1

python3 - "$tmp" >"$tmp/v.out" 2>&1 <<'PY' && ok || no "values: $(cat "$tmp/v.out")"
import json, math, struct, sys
d = sys.argv[1]
def read(p):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    h.pop("__metadata__", None); raw = b[8 + n:]
    out = {}
    for k, v in h.items():
        if v["dtype"] != "F32": continue
        t = raw[v["data_offsets"][0]:v["data_offsets"][1]]
        out[k] = (v["shape"], list(struct.unpack("<%df" % (len(t) // 4), t)))
    return out
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
def bf16(x):
    u = struct.unpack("<I", struct.pack("<f", x))[0]
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000
    return struct.unpack("<f", struct.pack("<I", u))[0]
def int8(w, K):
    out = []
    for r in range(0, len(w), K):
        row = w[r:r + K]; s = f32(max(abs(x) for x in row) / 127.0)
        out += [f32(max(-127, min(127, round(x / s))) * s) if s else 0.0 for x in row]
    return out
w = read(d + "/w.safetensors")
names = [k for k in w if k.startswith("transformer.h.0.") and k.endswith(".weight")
         and ("attn.c_" in k or "mlp.c_" in k)]
assert len(names) == 4, names
for f in ("bf16", "int8", "nf4"):
    q = read(d + "/q_%s.safetensors" % f)
    for k in names:
        shape, a = w[k]; _, b = q[k]
        assert q[k][0] == shape, (k, q[k][0], shape)
        if f == "bf16": assert b == [bf16(x) for x in a], (f, k)
        elif f == "int8": assert b == int8(a, shape[1]), (f, k)
        else:
            for i in range(0, len(a), 64):
                am = max(abs(x) for x in a[i:i + 64])
                err = max(abs(x - y) for x, y in zip(a[i:i + 64], b[i:i + 64]))
                assert err <= 0.152 * am * 1.01 + 1e-7, (k, i, err, am)
            assert b != a, k
    # the trained block moved, the frozen block's other tensors (LayerNorm) are the file's
    assert q["transformer.h.1.mlp.c_fc.weight"][1] != w["transformer.h.1.mlp.c_fc.weight"][1]
    assert q["transformer.h.0.ln_1.weight"][1] == w["transformer.h.0.ln_1.weight"][1]
    s = [json.loads(l) for l in open(d + "/%s.json" % f) if '"summary"' in l][0]
    p, m = s["predicted_step_reserved"], s["measured_reserved_peak"]
    assert p <= m <= p * 1.02 + (1 << 20), (f, p, m)
    print(f, "predicted", p, "measured", m)
PY

# parameters: the frozen block's four linear weights (32x96, 32x32, 32x128, 128x32:
# 12288 values) in 2 bytes, or 1 byte plus a scale a row (96+32+128+32 rows)
"$bin" estimate --model "$tmp/g.model" --batch 8 --freeze transformer.h.0 >"$tmp/e0" 2>&1
"$bin" estimate --model "$tmp/g.model" --batch 8 --freeze transformer.h.0 --base-precision int8 >"$tmp/e1" 2>&1
python3 - "$tmp/e0" "$tmp/e1" >"$tmp/e.out" 2>&1 <<'PY' && ok || no "estimate: $(cat "$tmp/e.out")"
import sys
def weights(p):
    rows = [l.rsplit(")", 1)[1].split() for l in open(p)
            if l.startswith("transformer.h.0.") and " linear " in l]
    return sum(int(r[0]) for r in rows)
a, b = weights(sys.argv[1]), weights(sys.argv[2])
assert a == 12288 * 4, a
assert b == 12288 + 4 * (96 + 32 + 128 + 32), b
PY

# ---- stopped at step 3, resumed to 6: the straight run's loss, bit for bit ----
q="--freeze transformer.h.0 --base-precision int8 --seed 3"
run --steps 6 $q --init "$tmp/w.safetensors" --json >"$tmp/a.json" 2>/dev/null
run --steps 3 $q --init "$tmp/w.safetensors" --save "$tmp/c.safetensors" >/dev/null 2>&1
run --steps 6 $q --resume "$tmp/c.safetensors" --json >"$tmp/b.json" 2>"$tmp/b.err"
a=$(grep '"event": "eval"' "$tmp/a.json" | tail -1 | grep -o '"val_loss": [^,]*')
b=$(grep '"event": "eval"' "$tmp/b.json" | tail -1 | grep -o '"val_loss": [^,]*')
[ -n "$a" ] && [ "$a" = "$b" ] && ok || no "resume: '$a' vs '$b' $(tail -2 "$tmp/b.err")"

# ---- on the OpenCL device (PoCL here): the CPU's losses within 1e-3, predicted = measured ----
if "$bin" devices >/dev/null 2>&1; then
    for f in int8 nf4; do
        for dev in cpu opencl; do
            run --steps 4 --seed 3 --freeze transformer.h.0 --base-precision $f --device $dev --json \
                >"$tmp/d_${f}_$dev.json" 2>"$tmp/d.err" || no "$f on $dev: $(tail -2 "$tmp/d.err")"
        done
    done
    python3 - "$tmp" >"$tmp/d.out" 2>&1 <<'PY' && ok || no "device: $(cat "$tmp/d.out")"
import json, sys
d = sys.argv[1]
for f in ("int8", "nf4"):
    r = {}
    for dev in ("cpu", "opencl"):
        ev = [json.loads(l) for l in open("%s/d_%s_%s.json" % (d, f, dev)) if l.startswith("{")]
        r[dev] = ([x for e in ev if e["event"] == "eval" for x in (e["train_loss"], e["val_loss"])],
                  [e for e in ev if e["event"] == "summary"][0])
    c, g = r["cpu"], r["opencl"]
    assert len(c[0]) == len(g[0]) >= 2, (c[0], g[0])
    assert all(abs(a - b) <= 1e-3 for a, b in zip(c[0], g[0])), (f, c[0], g[0])
    s = g[1]
    assert s["predicted_step_reserved"] == s["measured_reserved_peak"], (f, s)
    print(f, "device losses", g[0], "reserved", s["measured_reserved_peak"])
PY
fi

# ---- the planner's choice: --base-precision auto under --budget keeps the most
# precise format whose plan fits. Each format's smallest budget (from its own
# refusal) must fall fp32 > bf16 > int8 > nf4; auto at each one picks that
# format (at fp32's: none), one byte below nf4's it refuses naming nf4 ----
P=(plan --model "$tmp/g.model" --data "$tmp/text.txt" --batch 8 --freeze transformer.h.0-1)
declare -A least
for f in fp32 bf16 int8 nf4; do
    least[$f]=$("$bin" "${P[@]}" --base-precision $f --budget 200KiB 2>&1 |
        sed -n 's/.*the smallest budget that fits is [^(]*(\([0-9]*\) bytes).*/\1/p')
done
if [ -n "${least[nf4]}" ] && [ "${least[fp32]}" -gt "${least[bf16]}" ] &&
    [ "${least[bf16]}" -gt "${least[int8]}" ] && [ "${least[int8]}" -gt "${least[nf4]}" ]; then
    ok
else
    no "smallest budgets fp32 ${least[fp32]} bf16 ${least[bf16]} int8 ${least[int8]} nf4 ${least[nf4]}"
fi
auto() { "$bin" "${P[@]}" --base-precision auto --budget "$1" 2>&1; }
auto "${least[fp32]}" | grep -q "frozen base" && no "auto at fp32's budget stored the base in fewer bits" || ok
for f in bf16 int8 nf4; do
    auto "${least[$f]}" | grep -q "frozen base: 8 linear weights in $f" && ok ||
        no "auto at $f's smallest budget ${least[$f]}: $(auto "${least[$f]}" | grep 'frozen base')"
done
auto $((least[fp32] - 1)) | grep -q "frozen base: 8 linear weights in bf16" && ok || no "auto below fp32's budget"
expect_fail "auto below nf4's budget" 1 "--base-precision nf4); the smallest budget that fits is" \
    "$bin" "${P[@]}" --base-precision auto --budget $((least[nf4] - 1))
grep -qF "(${least[nf4]} bytes)" "$tmp/err" && ok || no "auto's refusal: $(cat "$tmp/err")"

# ---- with mixed and pure 16-bit precision: the quantized bytes are the op's own
# (the precision pass once cast them as a 16-bit weight: "cast from u8 to f32") ----
for p in bf16-mixed bf16; do
    run --steps 3 --freeze transformer.h.0 --base-precision int8 --precision $p --json \
        >"$tmp/p.json" 2>"$tmp/p.err" && grep -q '"event": "summary"' "$tmp/p.json" && ok ||
        no "--base-precision int8 --precision $p: $(tail -1 "$tmp/p.err")"
done

# ---- a wider model (d 256): the f32 values that random initialisation makes and
# quantizing frees (a megabyte and more) are not held as cached blocks beside the
# step's arena: the measured peak reserved is the predicted one within 128 KiB
# (it once exceeded it by 1.8 MiB, 9%), with the f32 and the bf16 GEMMs ----
sed -e 's/\b32\b/256/g; s/ 96 / 768 /; s/ 128 / 1024 /' \
    -e 's/^input tokens 256/input tokens 32/; s/^pos_embedding 256/pos_embedding 32/' \
    "$src/tests/data/small_gpt.model" >"$tmp/wide.model"
for p in fp32 bf16-mixed; do
    "$bin" train --model "$tmp/wide.model" --data "$tmp/text.txt" --batch 8 --threads 2 --test-limit 8 \
        --steps 2 --freeze transformer.h.0 --base-precision int8 --precision $p --json \
        >"$tmp/w.json" 2>"$tmp/w.err" || no "wide model, $p: $(tail -1 "$tmp/w.err")"
    python3 - "$tmp/w.json" $p <<'PY' && ok || no "wide model, $p: predicted against measured"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][0]
p, m = s["predicted_step_reserved"], s["measured_reserved_peak"]
print(sys.argv[2], "predicted", p, "measured", m)
assert p <= m <= p + (128 << 10), (p, m)
PY
done

# ---- bad input ----
expect_fail "unknown format" 2 "--base-precision 'q4': choose fp32, bf16, int8, nf4 or auto" \
    run --steps 1 --base-precision q4
expect_fail "nothing frozen" 1 "--base-precision int8: no frozen linear layer owns its weight" \
    run --steps 1 --base-precision int8
expect_fail "resume in another format" 1 "--base-precision nf4 differs from the checkpoint's int8" \
    run --steps 6 --freeze transformer.h.0 --base-precision nf4 --seed 3 --resume "$tmp/c.safetensors"
finish
