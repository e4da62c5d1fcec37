#!/usr/bin/env bash
# test_resume.sh — checkpoints as a user meets them: --init from a
# weights-only file (with --freeze: the frozen layers keep the file's bytes),
# --resume refusing a weights-only file, any changed setting (named, both
# values), malformed metadata (key and value named) and a counter or the
# position missing from it (named), a checkpoint already
# at the final epoch evaluated, --save checked before training, stale
# temporaries of a killed save removed, FIFOs and directories refused
# without hanging, and a huge sparse file refused without reading it.
# Safetensors files are read and rewritten by hand in python3 (8-byte
# header length, JSON, raw little-endian data). Needs Fashion-MNIST.
source "$(dirname "$0")/lib.sh"
if [ ! -d "$data" ]; then
    echo "no dataset at $data: skipping"
    finish; exit
fi

# st.py: read and write safetensors by hand.
cat >"$tmp/st.py" <<'PY'
import json, struct
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n])
    meta = h.pop("__metadata__", {})
    data = b[8 + n:]
    return h, meta, {k: data[v["data_offsets"][0]:v["data_offsets"][1]] for k, v in h.items()}
def write(path, h, meta, tensors):
    out, blob = {}, b""
    if meta:
        out["__metadata__"] = meta
    for k, v in h.items():
        t = tensors[k]
        out[k] = {"dtype": v["dtype"], "shape": v["shape"], "data_offsets": [len(blob), len(blob) + len(t)]}
        blob += t
    j = json.dumps(out, separators=(",", ":")).encode()
    j += b" " * ((8 - len(j) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(j)) + j + blob)
PY
st() { PYTHONPATH="$tmp" python3 - "$@"; }

model="$src/tests/data/tiny.model"
common=(--model "$model" --data "$data" --batch 64 --limit 512 --test-limit 256 --seed 7 --threads 2 --json)
adam=("${common[@]}" --optimizer adam)
ck="$tmp/ck.safetensors"
expect "adam 1 epoch, saved" "$bin" train "${adam[@]}" --epochs 1 --save "$ck"
grep '"event": "epoch"' "$tmp/out" >"$tmp/e1"

# ---- every setting a bit-exact resume depends on is stored and compared ----
mismatch() { # description, expected message, extra options...
    local d=$1 pat=$2; shift 2
    expect_fail "resume with $d" 1 "$pat" "$bin" train "${adam[@]}" --epochs 2 --resume "$ck" "$@"
    grep -q '"event": "epoch"' "$tmp/out" && no "resume with $d trained an epoch" || ok
}
mismatch "another batch" "--batch 32 differs from the checkpoint's 64" --batch 32
mismatch "another seed" "--seed 8 differs from the checkpoint's 7" --seed 8
mismatch "a frozen layer" "--freeze 0 differs from the checkpoint's none" --freeze 0
mismatch "another precision" "--precision bf16-mixed differs from the checkpoint's fp32" --precision bf16-mixed
mismatch "another state format" "--optimizer-state int8 differs from the checkpoint's fp32" --optimizer-state int8
mismatch "micro-batches" "--micro-batch 32 differs from the checkpoint's 64" --micro-batch 32
mismatch "clipping" "--clip-grad-norm 1 differs from the checkpoint's 0" --clip-grad-norm 1
mismatch "loss scaling" "--loss-scale dynamic differs from the checkpoint's none" --loss-scale dynamic
mismatch "another eps" "--eps 1e-06 differs from the checkpoint's 1e-08" --eps 1e-6
mismatch "weight decay" "--weight-decay 0.1 differs from the checkpoint's 0" --weight-decay 0.1
expect_fail "resume with another optimizer" 1 "saved with optimizer adam, resuming with adamw" \
    "$bin" train "${common[@]}" --optimizer adamw --epochs 2 --resume "$ck"
sgd=("${common[@]}" --optimizer sgd --momentum 0.9)
expect "sgd 1 epoch, saved" "$bin" train "${sgd[@]}" --epochs 1 --save "$tmp/sgd.safetensors"
expect_fail "resume with another momentum" 1 "--momentum 0.8 differs from the checkpoint's 0.9" \
    "$bin" train "${common[@]}" --optimizer sgd --momentum 0.8 --epochs 2 --resume "$tmp/sgd.safetensors"
expect_fail "resume with nesterov" 1 "--nesterov 1 differs from the checkpoint's 0" \
    "$bin" train "${sgd[@]}" --nesterov --epochs 2 --resume "$tmp/sgd.safetensors"
# Adafactor (with its optional first moment and weight decay): 1 epoch + resume
# to 2 equals 2 epochs uninterrupted bit for bit; the state is saved under
# torch.optim.Adafactor's names and shapes (a conv's (8, 1, 3, 3) weight is
# factored over its kernel: row_var (8, 1, 3, 1), col_var (8, 1, 1, 3)); its
# own options are run settings.
af=("${common[@]}" --optimizer adafactor --beta1 0.9 --weight-decay 0.01)
expect "adafactor 2 epochs" "$bin" train "${af[@]}" --epochs 2
grep '"event": "epoch"' "$tmp/out" | sed 's/"seconds": [0-9.]*, //' | tail -1 >"$tmp/af_full"
expect "adafactor 1 epoch, saved" "$bin" train "${af[@]}" --epochs 1 --save "$tmp/af.safetensors"
expect "adafactor resumed to 2" "$bin" train "${af[@]}" --epochs 2 --resume "$tmp/af.safetensors"
grep '"event": "epoch"' "$tmp/out" | sed 's/"seconds": [0-9.]*, //' | tail -1 >"$tmp/af_res"
[ -s "$tmp/af_res" ] && cmp -s "$tmp/af_full" "$tmp/af_res" && ok ||
    no "adafactor resume differs: $(cat "$tmp/af_full") vs $(cat "$tmp/af_res")"
st "$tmp/af.safetensors" <<'PY' && ok || no "adafactor state names and shapes"
import sys, st
h, meta, t = st.read(sys.argv[1])
want = {"optimizer.0.weight.row_var": [8, 1, 3, 1], "optimizer.0.weight.col_var": [8, 1, 1, 3],
        "optimizer.0.weight.exp_avg": [8, 1, 3, 3], "optimizer.0.bias.variance": [8],
        "optimizer.6.weight.row_var": [32, 1], "optimizer.6.weight.col_var": [1, 392],
        "optimizer.8.weight.row_var": [10, 1], "optimizer.8.weight.col_var": [1, 32],
        "optimizer.8.bias.variance": [10], "optimizer.8.bias.exp_avg": [10]}
for k, shape in want.items():
    assert k in h and h[k]["shape"] == shape and h[k]["dtype"] == "F32", (k, h.get(k))
assert not [k for k in h if k.endswith("exp_avg_sq")], "no Adam state"
assert meta["optimizer"] == "adafactor" and meta["eps2"] == "0.001", meta
PY
expect_fail "adafactor resume with another --eps2" 1 "--eps2 0.01 differs from the checkpoint's 0.001" \
    "$bin" train "${af[@]}" --epochs 2 --eps2 0.01 --resume "$tmp/af.safetensors"
expect_fail "adafactor resume with another --clip-threshold" 1 "--clip-threshold 2 differs from the checkpoint's 1" \
    "$bin" train "${af[@]}" --epochs 2 --clip-threshold 2 --resume "$tmp/af.safetensors"
expect_fail "adafactor with bf16 state" 1 "--optimizer-state bf16: adafactor's factored state" \
    "$bin" train "${af[@]}" --epochs 1 --optimizer-state bf16
expect_fail "adafactor with pure bf16 weights" 1 "--precision bf16 stores the weights in 16 bits, and adafactor" \
    "$bin" train "${af[@]}" --epochs 1 --precision bf16
# The same frozen set by another name is the same run.
expect "freeze 0, saved" "$bin" train "${adam[@]}" --epochs 1 --freeze 0 --save "$tmp/fz0.safetensors"
expect "resume with --freeze 0-0" "$bin" train "${adam[@]}" --epochs 2 --freeze 0-0 --resume "$tmp/fz0.safetensors"
expect_fail "resume with --freeze 0-1" 1 "--freeze 0-1 differs from the checkpoint's 0" \
    "$bin" train "${adam[@]}" --epochs 2 --freeze 0-1 --resume "$tmp/fz0.safetensors"
# lr may differ (PyTorch users lower it on resume): a warning, and it trains.
expect "resume with another lr" "$bin" train "${adam[@]}" --epochs 2 --lr 0.0005 --resume "$ck"
grep -qF "warning: --lr 0.0005 differs from the checkpoint's 0.001" "$tmp/err" && ok || no "no lr warning: $(cat "$tmp/err")"
grep -q '"epoch": 2' "$tmp/out" && ok || no "resume with another lr did not train epoch 2"
# A checkpoint from before the settings were stored is resumed unchecked.
st "$ck" "$tmp/old.safetensors" <<'PY'
import sys, st
h, meta, t = st.read(sys.argv[1])
keep = ("format", "optimizer", "optimizer.step", "runs", "scaler", "epoch", "batch")
st.write(sys.argv[2], h, {k: v for k, v in meta.items() if k in keep}, t)
PY
expect "old checkpoint, another batch" "$bin" train "${adam[@]}" --epochs 2 --batch 32 --resume "$tmp/old.safetensors"

# ---- weights-only files: --resume refuses, --init starts from them ----
st "$ck" "$tmp/w.safetensors" <<'PY'
import sys, st
h, meta, t = st.read(sys.argv[1])
h = {k: v for k, v in h.items() if not k.startswith("optimizer.")}
st.write(sys.argv[2], h, {}, t)  # a PyTorch state_dict: no metadata, no optimizer
PY
expect_fail "resume from a weights-only file" 1 "use --init" \
    "$bin" train "${adam[@]}" --epochs 2 --resume "$tmp/w.safetensors"
expect_fail "--init with --resume" 2 "give --init or --resume, not both" \
    "$bin" train "${adam[@]}" --epochs 2 --init "$tmp/w.safetensors" --resume "$ck"
expect "--init --freeze 0" "$bin" train "${adam[@]}" --epochs 1 --init "$tmp/w.safetensors" --freeze 0 \
    --save "$tmp/ft.safetensors"
st "$tmp/w.safetensors" "$tmp/ft.safetensors" <<'PY' && ok || no "--init --freeze: frozen layer not the file's bytes, or the rest not trained"
import sys, st
_, _, w = st.read(sys.argv[1])
_, meta, f = st.read(sys.argv[2])
for k in ("0.weight", "0.bias"):  # layer 0 frozen: bit for bit the init file's
    assert f[k] == w[k], k
for k in ("6.weight", "8.weight"):  # trained from the file's values
    assert f[k] != w[k], k
assert "optimizer.0.weight.exp_avg" not in f  # no state for frozen parameters
assert meta["optimizer.step"] == "8", meta["optimizer.step"]  # a fresh optimizer: 512/64 steps
assert meta["frozen"] == "0-1" and meta["freeze"] == "0", meta
PY
# f32 weights into a model kept in bf16 (--precision bf16): converted as
# PyTorch's load_state_dict copies them, rounded to nearest even; the frozen
# layer keeps exactly those bf16 values.
expect "--init f32 weights into pure bf16" "$bin" train "${adam[@]}" --epochs 1 --precision bf16 \
    --init "$tmp/w.safetensors" --freeze 0 --save "$tmp/bf.safetensors"
st "$tmp/w.safetensors" "$tmp/bf.safetensors" <<'PY' && ok || no "--init into bf16: the frozen layer is not the file's values rounded to bf16"
import struct, sys, st
_, _, w = st.read(sys.argv[1])
h, _, f = st.read(sys.argv[2])
def bf16_rne(raw):  # f32 bytes -> bf16 bytes, round to nearest even (finite inputs)
    out = bytearray()
    for (u,) in struct.iter_unpack("<I", raw):
        out += struct.pack("<H", ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) & 0xFFFF)
    return bytes(out)
for k in ("0.weight", "0.bias"):
    assert h[k]["dtype"] == "BF16", h[k]
    assert f[k] == bf16_rne(w[k]), k
PY
expect "--init from a full checkpoint (optimizer tensors ignored)" \
    "$bin" train "${adam[@]}" --epochs 1 --init "$ck"
st "$tmp/w.safetensors" "$tmp/w_missing.safetensors" <<'PY'
import sys, st
h, meta, t = st.read(sys.argv[1])
del h["8.bias"]
st.write(sys.argv[2], h, meta, t)
PY
expect_fail "--init with a tensor missing" 1 "missing tensor '8.bias'" \
    "$bin" train "${adam[@]}" --epochs 1 --init "$tmp/w_missing.safetensors"
printf 'input 1 28 28\nflatten\nlinear 10\n' >"$tmp/other.model"
expect_fail "--init for another model" 1 "unexpected tensor '0.weight'" \
    "$bin" train "${adam[@]}" --model "$tmp/other.model" --epochs 1 --init "$tmp/w.safetensors"

# ---- a checkpoint at the final epoch: nothing to train, evaluated ----
expect "resume at the final epoch" "$bin" train "${adam[@]}" --epochs 1 --resume "$ck"
grep -qF "nothing left to train: $ck is at epoch 1 of 1" "$tmp/err" && ok || no "final epoch: $(cat "$tmp/err")"
python3 - "$tmp/out" "$tmp/e1" <<'PY' && ok || no "final-epoch summary: $(cat "$tmp/out")"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if '"summary"' in l][0]
e1 = json.loads(open(sys.argv[2]).readline())
assert s["epochs"] == 1 and s["test_acc"] == e1["test_acc"] and s["test_acc"] > 0, (s, e1)
assert not any('"event": "epoch"' in l for l in open(sys.argv[1]))
PY

# ---- --save is checked before training ----
expect_fail "--save into a missing directory" 1 "no/such/dir/x.safetensors: cannot write there" \
    "$bin" train "${adam[@]}" --epochs 1 --save "$tmp/no/such/dir/x.safetensors"
grep -q '"event": "epoch"' "$tmp/out" && no "trained before refusing --save" || ok
mkdir "$tmp/adir"
expect_fail "--save onto a directory" 1 "is a directory" "$bin" train "${adam[@]}" --epochs 1 --save "$tmp/adir"
grep -q '"event": "epoch"' "$tmp/out" && no "trained before refusing --save onto a directory" || ok

# ---- a killed save's temporary is removed by the next save of that path ----
# a PID above pid_max: no process can have it (a free PID could be reused)
dead=$(($(cat /proc/sys/kernel/pid_max) + 1))
: >"$tmp/ck2.safetensors.tmp.$dead"
: >"$tmp/ck2.safetensors.tmp.$$"            # a live process's: kept
: >"$tmp/other.safetensors.tmp.$dead"       # another path's: kept
expect "save beside stale temporaries" "$bin" train "${adam[@]}" --epochs 1 --save "$tmp/ck2.safetensors"
[ ! -e "$tmp/ck2.safetensors.tmp.$dead" ] && ok || no "stale temporary of a dead process not removed"
[ -e "$tmp/ck2.safetensors.tmp.$$" ] && ok || no "a live process's temporary was removed"
[ -e "$tmp/other.safetensors.tmp.$dead" ] && ok || no "another path's temporary was removed"

# ---- metadata is parsed strictly: each fault names the key and the value ----
corrupt() { # key, value, expected message
    st "$ck" "$tmp/bad.safetensors" "$1" "$2" <<'PY'
import sys, st
h, meta, t = st.read(sys.argv[1])
meta[sys.argv[3]] = sys.argv[4]
st.write(sys.argv[2], h, meta, t)
PY
    expect_fail "metadata $1 = '$2'" 1 "$3" "$bin" train "${adam[@]}" --epochs 2 --resume "$tmp/bad.safetensors"
}
corrupt optimizer.step 99999999999999999999 "metadata 'optimizer.step' = '99999999999999999999': not an integer in [0, 2^62]"
corrupt optimizer.step -1 "metadata 'optimizer.step' = '-1': not an integer in [0, 2^62]"
corrupt optimizer.step 8x "metadata 'optimizer.step' = '8x': not an integer"
corrupt runs " 8" "metadata 'runs' = ' 8': not an integer"
corrupt epoch 1.5 "metadata 'epoch' = '1.5': not an integer in [0, 2147483647]"
corrupt epoch 2147483648 "metadata 'epoch' = '2147483648': not an integer in [0, 2147483647]"
corrupt batch abc "metadata 'batch' = 'abc': not an integer"
corrupt batch 9 "metadata 'batch' = 9: more batches done than an epoch has (8)"
corrupt scaler "1 0" "metadata 'scaler' = '1 0': not three fields"
corrupt scaler "x 0 0" "metadata 'scaler' = 'x 0 0': scale 'x' is not a positive finite float"
corrupt scaler "65536 -1 0" "growth tracker '-1' is not an integer"
corrupt scaler "65536 0 99999999999999999999" "skipped steps '99999999999999999999' is not an integer in [0, 2^62]"
corrupt batch_size sixty "metadata 'batch_size' = 'sixty': not an integer"
corrupt lr fast "metadata 'lr' = 'fast': not a finite number"
# A counter or the position removed from a checkpoint with optimizer state:
# refused by name (without optimizer.step Adam's bias correction would
# restart at step 1; without epoch and batch the run would restart at 0).
for key in optimizer.step runs epoch batch; do
    st "$ck" "$tmp/lacks.safetensors" "$key" <<'PY'
import sys, st
h, meta, t = st.read(sys.argv[1])
del meta[sys.argv[3]]
st.write(sys.argv[2], h, meta, t)
PY
    expect_fail "metadata without $key" 1 "lacks.safetensors: metadata '$key' is missing" \
        "$bin" train "${adam[@]}" --epochs 2 --resume "$tmp/lacks.safetensors"
    grep -q '"event": "epoch"' "$tmp/out" && no "resume without $key trained an epoch" || ok
done

# ---- FIFOs and directories are refused at once, with the right reason ----
mkfifo "$tmp/fifo"
for opt in --resume --init; do
    expect_fail "$opt FIFO" 1 "is a FIFO, not a regular file" timeout 60 "$bin" train "${adam[@]}" --epochs 1 "$opt" "$tmp/fifo"
    expect_fail "$opt directory" 1 "is a directory, not a regular file" timeout 60 "$bin" train "${adam[@]}" --epochs 1 "$opt" "$tmp/adir"
done
expect_fail "eval --weights FIFO" 1 "is a FIFO, not a regular file" timeout 60 "$bin" eval --model "$model" --data "$data" --weights "$tmp/fifo"
expect_fail "eval --weights directory" 1 "is a directory, not a regular file" timeout 60 "$bin" eval --model "$model" --data "$data" --weights "$tmp/adir"
grep -q "Inappropriate ioctl" "$tmp/err" && no "stale errno in: $(cat "$tmp/err")" || ok

# ---- a sparse 8 GiB file with a valid header: refused, never read ----
python3 - "$bin" "$model" "$data" "$tmp/sparse.safetensors" <<'PY' && ok || no "sparse 8 GiB weights"
import json, resource, struct, subprocess, sys
binary, model, data, path = sys.argv[1:]
size = 8 << 30
h = json.dumps({"big": {"dtype": "F32", "shape": [size // 4], "data_offsets": [0, size]}},
               separators=(",", ":")).encode()
h += b" " * ((8 - len(h) % 8) % 8)
with open(path, "wb") as f:
    f.write(struct.pack("<Q", len(h)) + h)
    f.truncate(8 + len(h) + size)
r = subprocess.run([binary, "eval", "--model", model, "--data", data, "--weights", path, "--test-limit", "64"],
                   capture_output=True, text=True, timeout=120)
rss_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print("sparse 8 GiB file: exit", r.returncode, "peak RSS", rss_kib // 1024, "MiB:", r.stderr.strip())
assert r.returncode == 1 and "unexpected tensor 'big'" in r.stderr, r.stderr
assert rss_kib < 64 * 1024, rss_kib
PY
rm -f "$tmp/sparse.safetensors"

finish
