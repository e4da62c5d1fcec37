#!/usr/bin/env bash
# test_cli_trips.sh — what a new user tripped over, each checked against a
# computation of this script's own:
#  - evaluation scores every window, the last partial batch's too, whatever
#    --batch (a bigram model whose loss this script computes in float64 over
#    every window, from the weights it wrote itself); `eval` and train's
#    validation score the first 128 windows unless --test-limit says (0: all);
#  - optimizer options reach the checkpoint as the user's doubles;
#  - a model file's `default batch N`, used when --batch is not given;
#  - `estimate --ranks N --zero K --json` is one JSON document;
#  - SIGINT saves at the next step boundary and exits 130; --save-every saves
#    mid-epoch; --resume from either equals the uninterrupted run bit for bit;
#  - --no-progress keeps results and the summary, --quiet keeps warnings only;
#  - OpenMP's idle threads spin briefly, then sleep, unless the user set
#    OMP_WAIT_POLICY or GOMP_SPINCOUNT.
source "$(dirname "$0")/lib.sh"

# A bigram language model: logits(t) = W e[x_t] + b, so each position's loss
# depends on its own token and target only.
cat >"$tmp/bigram.model" <<'EOF'
input tokens 4
embedding 256 8 name=emb
linear 256 name=head
loss cross_entropy
EOF
# tools.py: the weights (a safetensors file written by hand), the text, the
# float64 reference loss, a checkpoint's metadata and tensors.
cat >"$tmp/tools.py" <<'PY'
import json, math, struct, sys
def lcg(seed):
    x = seed
    while True:
        x = (x * 6364136223846793005 + 1442695040888963407) % 2**64
        yield x >> 33
def weights():
    g = lcg(7)
    f = lambda: ((next(g) % 20001) - 10000) / 10000.0 * 0.5  # in [-0.5, 0.5]
    emb = [[f() for _ in range(8)] for _ in range(256)]
    w = [[f() for _ in range(8)] for _ in range(256)]
    b = [f() * 0.2 for _ in range(256)]
    # as float32, as frugal holds them
    r = lambda v: struct.unpack("<f", struct.pack("<f", v))[0]
    return [[r(v) for v in row] for row in emb], [[r(v) for v in row] for row in w], [r(v) for v in b]
def write_weights(path):
    emb, w, b = weights()
    tensors = {"emb.weight": ([256, 8], sum(emb, [])), "head.weight": ([256, 8], sum(w, [])),
               "head.bias": ([256], b)}
    h, blob = {}, b""
    for k, (shape, vals) in tensors.items():
        d = struct.pack("<%df" % len(vals), *vals)
        h[k] = {"dtype": "F32", "shape": shape, "data_offsets": [len(blob), len(blob) + len(d)]}
        blob += d
    j = json.dumps(h).encode()
    j += b" " * ((8 - len(j) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + blob)
def write_text(path, n):
    g = lcg(11)
    open(path, "wb").write(bytes(97 + next(g) % 26 for _ in range(n)))
def ref_loss(text_path, val_fraction, T, windows):
    """mean cross-entropy per token over the first `windows` validation
    windows (all if 0), in float64: the split is the tail
    floor(len * val_fraction) tokens, a window T + 1 of them at stride T"""
    emb, w, b = weights()
    tok = open(text_path, "rb").read()
    n_val = int(len(tok) * val_fraction)
    val = tok[len(tok) - n_val:]
    nw = (len(val) - 1) // T
    if windows:
        nw = min(nw, windows)
    total, count = 0.0, 0
    for k in range(nw):
        for t in range(T):
            x, y = val[k * T + t], val[k * T + t + 1]
            z = [sum(w[o][i] * emb[x][i] for i in range(8)) + b[o] for o in range(256)]
            m = max(z)
            lse = m + math.log(sum(math.exp(v - m) for v in z))
            total += lse - z[y]
            count += 1
    return total / count, nw
def meta(path):
    bts = open(path, "rb").read()
    n = struct.unpack("<Q", bts[:8])[0]
    return json.loads(bts[8:8 + n]).get("__metadata__", {})
def tensors(path):
    bts = open(path, "rb").read()
    n = struct.unpack("<Q", bts[:8])[0]
    h = json.loads(bts[8:8 + n])
    h.pop("__metadata__", None)
    return {k: bts[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]] for k, v in h.items()}
if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "setup":
        write_weights(sys.argv[2]); write_text(sys.argv[3], int(sys.argv[4]))
    elif cmd == "ref":
        loss, nw = ref_loss(sys.argv[2], float(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
        print("%.12g %d" % (loss, nw))
    elif cmd == "meta":
        print(meta(sys.argv[2]).get(sys.argv[3], "MISSING"))
    elif cmd == "same":  # the same tensors, byte for byte
        a, b = tensors(sys.argv[2]), tensors(sys.argv[3])
        diff = [k for k in a if a[k] != b.get(k)]
        print("same" if a.keys() == b.keys() and not diff else "differ: %s" % diff[:5])
PY
py() { python3 "$tmp/tools.py" "$@"; }
py setup "$tmp/w.st" "$tmp/text.txt" 1000 # 100 held-out tokens: 24 windows of 4
py setup "$tmp/w.st" "$tmp/long.txt" 6000 # 600 held out: 149 windows
m=$tmp/bigram.model
close() { # got want relative-tolerance
    awk -v a="$1" -v b="$2" -v r="$3" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= r * (b < 0 ? -b : b)) }'
}
val_loss() { sed -n 's/^validation loss \([0-9.]*\) nats.*/\1/p' "$1"; }

# ---- 1. every window, whatever the batch ------------------------------------
read -r want nw <<<"$(py ref "$tmp/text.txt" 0.1 4 0)"
[ "$nw" = 24 ] && ok || no "the script's split: $nw windows, not 24"
for b in 1 5 7 12 24 64; do
    "$bin" eval --model "$m" --weights "$tmp/w.st" --data "$tmp/text.txt" --batch $b --test-limit 0 \
        --threads 1 >"$tmp/e.out" 2>"$tmp/e.err" || no "eval --batch $b: $(head -2 "$tmp/e.err")"
    got=$(sed -n 's/^validation loss \([0-9.]*\) nats.*/\1/p' "$tmp/e.out")
    # the line shows 4 decimals: within half a unit of the last one
    awk -v a="$got" -v b="$want" 'BEGIN { exit !((a - b < 5.0001e-5) && (b - a < 5.0001e-5)) }' && ok ||
        no "eval --batch $b: $got nats, the float64 sum over all 24 windows says $want"
    grep -q "24 windows of 4 (96 tokens) scored of the 24 held out" "$tmp/e.out" && ok ||
        no "eval --batch $b: the windows scored: $(head -1 "$tmp/e.out")"
    "$bin" eval --model "$m" --weights "$tmp/w.st" --data "$tmp/text.txt" --batch $b --test-limit 0 \
        --threads 1 --json >"$tmp/e.json" 2>/dev/null
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); w = float(sys.argv[2])
assert d["samples"] == 24 and d["tokens"] == 96, d
assert abs(d["loss"] - w) <= 2e-6 * w, (d["loss"], w)' "$tmp/e.json" "$want" && ok ||
        no "eval --batch $b --json: $(cat "$tmp/e.json" | cut -c1-200), want $want"
done
read -r want10 _ <<<"$(py ref "$tmp/text.txt" 0.1 4 10)"
"$bin" eval --model "$m" --weights "$tmp/w.st" --data "$tmp/text.txt" --batch 4 --test-limit 10 \
    --threads 1 --json >"$tmp/e.json" 2>/dev/null
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); w = float(sys.argv[2])
assert d["samples"] == 10 and abs(d["loss"] - w) <= 2e-6 * w, (d, w)' "$tmp/e.json" "$want10" && ok ||
    no "--test-limit 10 --batch 4: $(cut -c1-120 "$tmp/e.json"), want 10 windows, $want10"
# 10. eval's default: the first 128 windows (train's rule), and 0 for all
read -r want128 _ <<<"$(py ref "$tmp/long.txt" 0.1 4 128)"
read -r wantall nall <<<"$(py ref "$tmp/long.txt" 0.1 4 0)"
"$bin" eval --model "$m" --weights "$tmp/w.st" --data "$tmp/long.txt" --batch 10 --threads 1 \
    --json >"$tmp/e.json" 2>/dev/null
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); w = float(sys.argv[2])
assert d["samples"] == 128 and abs(d["loss"] - w) <= 2e-6 * w, (d, w)' "$tmp/e.json" "$want128" && ok ||
    no "eval's default: $(cut -c1-120 "$tmp/e.json"), want 128 windows, $want128"
"$bin" eval --model "$m" --weights "$tmp/w.st" --data "$tmp/long.txt" --batch 10 --threads 1 \
    --test-limit 0 --json >"$tmp/e.json" 2>/dev/null
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); w = float(sys.argv[2]); n = int(sys.argv[3])
assert d["samples"] == n and abs(d["loss"] - w) <= 2e-6 * w, (d, w)' "$tmp/e.json" "$wantall" "$nall" && ok ||
    no "eval --test-limit 0: $(cut -c1-120 "$tmp/e.json"), want $nall windows, $wantall"
# train's validation: lr 0 keeps the weights, so it scores the same model
"$bin" train --model "$m" --init "$tmp/w.st" --data "$tmp/text.txt" --batch 5 --steps 1 --lr 0 \
    --test-limit 0 --threads 1 --json >"$tmp/t.json" 2>"$tmp/t.err" || no "train: $(head -2 "$tmp/t.err")"
python3 -c 'import json, sys; w = float(sys.argv[2])
e = [json.loads(l) for l in open(sys.argv[1]) if "\"eval\"" in l][-1]
assert abs(e["val_loss"] - w) <= 2e-6 * w, (e, w)' "$tmp/t.json" "$want" && ok ||
    no "train's validation at --batch 5: $(grep eval "$tmp/t.json" | cut -c1-160), want $want"

# ---- 2. the user's doubles in the checkpoint --------------------------------
"$bin" train --model "$m" --data "$tmp/text.txt" --batch 4 --steps 1 --optimizer adamw --lr 5e-4 \
    --weight-decay 0.013 --eps 3e-7 --threads 1 --save "$tmp/c.st" >/dev/null 2>"$tmp/t.err" ||
    no "train adamw: $(head -2 "$tmp/t.err")"
"$bin" train --model "$m" --data "$tmp/text.txt" --batch 4 --steps 1 --optimizer sgd --lr 0.1 \
    --momentum 0.9 --dampening 0.1 --threads 1 --save "$tmp/s.st" >/dev/null 2>"$tmp/t.err" ||
    no "train sgd: $(head -2 "$tmp/t.err")"
for kv in "c.st lr 5e-4" "c.st weight_decay 0.013" "c.st eps 3e-7" "s.st lr 0.1" \
    "s.st momentum 0.9" "s.st dampening 0.1"; do
    set -- $kv
    v=$(py meta "$tmp/$1" "$2")
    # python's float() of the stored text is the double nearest the decimal
    python3 -c 'import sys; assert float(sys.argv[1]) == float(sys.argv[2])' "$v" "$3" && ok ||
        no "$2 in the checkpoint: '$v', the user gave $3"
done

# ---- 16. --save-weights-only: a state_dict, nothing of the optimizer ---------
"$bin" train --model "$m" --data "$tmp/text.txt" --batch 4 --steps 1 --threads 1 --save "$tmp/wo.st" \
    --save-weights-only >/dev/null 2>"$tmp/t.err" || no "--save-weights-only: $(head -2 "$tmp/t.err")"
python3 -c 'import json, struct, sys
b = open(sys.argv[1], "rb").read(); h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
h.pop("__metadata__", None)
assert sorted(h) == ["emb.weight", "head.bias", "head.weight"], sorted(h)' "$tmp/wo.st" && ok ||
    no "--save-weights-only wrote other entries"
"$bin" train --model "$src/tests/data/small_gpt.model" --data "$tmp/long.txt" --batch 2 --steps 1 \
    --threads 1 --save "$tmp/ng.st" --save-weights-only --nanogpt-masks >/dev/null 2>"$tmp/t.err" ||
    no "--nanogpt-masks: $(head -2 "$tmp/t.err")"
python3 -c 'import json, struct, sys
b = open(sys.argv[1], "rb").read(); h = json.loads(b[8:8 + struct.unpack("<Q", b[:8])[0]])
assert all(not k.startswith("optimizer") for k in h), [k for k in h if k.startswith("optimizer")]
for i in range(2):
    assert h["transformer.h.%d.attn.bias" % i]["shape"] == [1, 1, 32, 32], h.get("transformer.h.%d.attn.bias" % i)
assert "lm_head.weight" in h' "$tmp/ng.st" && ok || no "--nanogpt-masks: the masks"
expect_fail "--nanogpt-masks alone" 2 "--nanogpt-masks goes with --save-weights-only" \
    "$bin" train --model "$m" --save "$tmp/x.st" --nanogpt-masks

# ---- 16. sizes up to the 1024 TiB the README promises ----------------------
expect "--budget 1TiB" "$bin" estimate --model mlp --batch 32 --budget 1TiB
expect "--budget 1024TiB" "$bin" estimate --model mlp --batch 32 --budget 1024TiB
expect_fail "--budget 1025TiB" 2 "is too large: a size is at most 1024 TiB" \
    "$bin" estimate --model mlp --batch 32 --budget 1025TiB

# ---- 5, 16. what --help and the README say ----------------------------------
"$bin" eval --help >"$tmp/h" 2>&1
grep -q "^Evaluation runs in fp32, whatever precision the model trained in" "$tmp/h" && ok ||
    no "eval --help does not say evaluation is fp32"
"$bin" generate --help >"$tmp/h" 2>&1
sed -n '/^generation:/,/^$/p' "$tmp/h" | grep -q -- "--seed N" && ok || no "generate --help: --seed is not under generation"
grep -q -- "--model FILE|NAME.*\[gpt-tiny\]" "$tmp/h" && ok || no "generate --help: --model's default is not gpt-tiny"
grep -q "^training:" "$tmp/h" && no "generate --help has a training section" || ok
# the README's CNN listing is the model file
awk '/^The default CNN|the default CNN:$/ { f = 1 } f && /^```text$/ { g = 1; next } g && /^```$/ { exit } g' \
    "$src/README.md" >"$tmp/readme_cnn"
cmp -s "$tmp/readme_cnn" "$src/models/cnn.model" && ok || no "the README's CNN listing differs from models/cnn.model"

# ---- 3. a model file's default batch ----------------------------------------
batch_of() { "$bin" estimate "$@" --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["batch"])'; }
[ "$(batch_of --model gpt-tiny)" = 8 ] && ok || no "gpt-tiny's default batch: $(batch_of --model gpt-tiny)"
[ "$(batch_of --model gpt2)" = 4 ] && ok || no "gpt2's default batch: $(batch_of --model gpt2)"
[ "$(batch_of --model cnn)" = 128 ] && ok || no "cnn's default batch: $(batch_of --model cnn)"
[ "$(batch_of --model gpt-tiny --batch 3)" = 3 ] && ok || no "--batch 3 over the model's default"
{ cat "$m"; echo "default batch 6"; } >"$tmp/d.model"
[ "$(batch_of --model "$tmp/d.model")" = 6 ] && ok || no "a file's default batch 6: $(batch_of --model "$tmp/d.model")"
"$bin" train --model gpt-tiny --help >"$tmp/h" 2>&1
grep -q "with --model gpt-tiny: --batch defaults to 8 (gpt-tiny's model file" "$tmp/h" && ok ||
    no "train --model gpt-tiny --help does not say where the batch comes from"
{ cat "$m"; echo "default batch 0"; } >"$tmp/d0.model"
expect_fail "default batch 0" 1 "d0.model:5:15: default batch '0'" "$bin" estimate --model "$tmp/d0.model"

# ---- 4. estimate --ranks --zero --json: one document ------------------------
"$bin" estimate --model mlp --batch 32 --ranks 2 --zero 1 --json >"$tmp/r.json" 2>"$tmp/err"
"$bin" estimate --model mlp --batch 32 --ranks 2 --zero 0 --json >"$tmp/u.json" 2>>"$tmp/err"
python3 -c 'import json, sys
t = open(sys.argv[1]).read()
d = json.loads(t)  # one document: a second would fail here
u = json.load(open(sys.argv[2]))
s = d["stages"]
assert d["ranks"] == 2 and d["zero"] == 1 and len(s) == 1 and s[0]["zero"] == 1, d
assert d["predicted_peak_total"] == s[0]["total"] == sum(d["predicted_peak"].values()), d
# the unsharded step: the step of one rank at stage 0 (its slice, nothing sharded)
assert d["unsharded"]["predicted_peak_total"] == u["predicted_peak_total"], (d["unsharded"], u)
assert d["unsharded"]["batch"] == d["rank_batch"] == 16, d["unsharded"]["batch"]
assert d["predicted_peak_total"] < u["predicted_peak_total"]' "$tmp/r.json" "$tmp/u.json" && ok ||
    no "estimate --ranks 2 --zero 1 --json: $(head -c 300 "$tmp/r.json") $(cat "$tmp/err")"

# ---- 8. SIGINT, --save-every, and resuming mid-epoch ------------------------
py setup "$tmp/w.st" "$tmp/big.txt" 400000
# 360,000 training bytes: (360000 - 1) / 4 windows, in batches of 8
NB=$(((360000 - 1) / 4 / 8))
step_of() { echo $(($(py meta "$1" epoch) * NB + $(py meta "$1" batch))); }
args=(train --model "$m" --data "$tmp/big.txt" --batch 8 --seed 3 --threads 1 --test-limit 4 --epochs 100000)
run() { "$bin" "${args[@]}" "$@"; }
wait_for() { # file pattern: up to 60 s
    for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    return 1
}
unset OMP_WAIT_POLICY GOMP_SPINCOUNT
"$bin" "${args[@]}" --save "$tmp/sig.st" >"$tmp/sig.out" 2>"$tmp/sig.err" &
pid=$!
wait_for "$tmp/sig.err" " step [0-9]*/" || no "no step: $(tail -c 300 "$tmp/sig.err")"
# 11. the process runs with passive waiting (set before OpenMP started)
tr '\0' '\n' </proc/$pid/environ 2>/dev/null >"$tmp/environ"
grep -qx "OMP_WAIT_POLICY=passive" "$tmp/environ" && grep -qx "GOMP_SPINCOUNT=10000" "$tmp/environ" && ok ||
    no "OMP_WAIT_POLICY=passive and GOMP_SPINCOUNT=10000 are not in the running process's environment"
kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] && ok || no "SIGINT: exit $rc, not 130: $(tail -2 "$tmp/sig.err")"
grep -q "stopped by signal 2 at step [0-9]* (epoch [0-9]*, batch [0-9]* of $NB): saved to" "$tmp/sig.err" && ok ||
    no "SIGINT: $(tail -2 "$tmp/sig.err")"
S=$(step_of "$tmp/sig.st")
grep -q "stopped by signal 2 at step $S " "$tmp/sig.err" && ok || no "the SIGINT checkpoint is at step $S: $(tail -1 "$tmp/sig.err")"
N=$((S + 3))
run --steps $N --save "$tmp/ref.st" --no-progress >/dev/null 2>&1 || no "the uninterrupted run"
run --steps $N --resume "$tmp/sig.st" --save "$tmp/res.st" --no-progress >/dev/null 2>"$tmp/res.err" ||
    no "resume after SIGINT: $(tail -2 "$tmp/res.err")"
[ "$(py same "$tmp/ref.st" "$tmp/res.st")" = same ] && ok ||
    no "resumed after SIGINT at step $S: $(py same "$tmp/ref.st" "$tmp/res.st")"
OMP_WAIT_POLICY=active "$bin" "${args[@]}" --save "$tmp/ev.st" --save-every 5 \
    >"$tmp/ev.out" 2>"$tmp/ev.err" &
pid=$!
wait_for "$tmp/ev.err" "saved .*ev.st at step 10 " || no "--save-every 5: no save at step 10: $(tail -2 "$tmp/ev.err")"
tr '\0' '\n' </proc/$pid/environ 2>/dev/null | grep -qx "OMP_WAIT_POLICY=active" && ok ||
    no "the user's OMP_WAIT_POLICY=active was not kept"
kill -9 $pid
wait $pid 2>/dev/null
S=$(step_of "$tmp/ev.st")
[ $((S % 5)) = 0 ] && [ "$S" -ge 10 ] && ok || no "--save-every 5: the checkpoint is at step '$S'"
N=$((S + 2))
run --steps $N --save "$tmp/ref2.st" --no-progress >/dev/null 2>&1 || no "the uninterrupted run"
run --steps $N --resume "$tmp/ev.st" --save "$tmp/res2.st" --no-progress >/dev/null 2>&1 ||
    no "resume from --save-every"
[ "$(py same "$tmp/ref2.st" "$tmp/res2.st")" = same ] && ok ||
    no "resumed from --save-every's step $S: $(py same "$tmp/ref2.st" "$tmp/res2.st")"

# ---- 9. --no-progress keeps the results, --quiet only warnings --------------
run --steps 3 --save "$tmp/q.st" --no-progress >"$tmp/np.out" 2>"$tmp/np.err"
grep -q "^done in .* 3 steps: validation loss" "$tmp/np.out" && grep -q "^step 3: train loss" "$tmp/np.out" &&
    grep -q "frugal memory summary" "$tmp/np.out" && ok || no "--no-progress lost the results: $(cat "$tmp/np.out" | head -5)"
grep -q "step 1/" "$tmp/np.err" && no "--no-progress printed per-step lines" || ok
run --steps 4 --resume "$tmp/q.st" --lr 0.002 --quiet >"$tmp/qu.out" 2>"$tmp/qu.err"
[ ! -s "$tmp/qu.out" ] && ok || no "--quiet printed on stdout: $(head -3 "$tmp/qu.out")"
grep -q "warning: --lr 0.002 differs from the checkpoint's 0.001" "$tmp/qu.err" && ok ||
    no "--quiet dropped the warning: $(cat "$tmp/qu.err")"
[ "$(grep -vc "^warning" "$tmp/qu.err")" = 0 ] && ok || no "--quiet printed more than warnings: $(cat "$tmp/qu.err")"
finish
