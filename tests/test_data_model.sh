#!/usr/bin/env bash
# test_data_model.sh — data that disagrees with the model, as the CLI meets
# it: a regression (`loss mse`) model trains from .npy inputs and float
# targets; test sets of 10x10 and 30x30 images against a 28x28 model, a label
# past the model's classes, a gzip bomb and a FIFO as a data file are refused
# before the first step with a message naming the file (and the label's
# index in it). float64 .npy files (numpy's default) train exactly as their
# float32 casts by numpy do, with one note a file; an .npz renamed .npy gets
# a .npy message; training files without test files and without --data
# evaluate on nothing (a note), never on the default Fashion-MNIST.
# Small IDX and .npy files are made here with numpy.
source "$(dirname "$0")/lib.sh"

py=
for p in python3 /usr/bin/python3; do
    if "$p" -c 'import numpy' 2>/dev/null; then py=$p; break; fi
done
if [ -z "$py" ]; then
    echo "no python3 with numpy: skipped"
    finish; exit
fi

refused() { # description, pattern in stderr, command...; expects exit 1
    local d=$1 pat=$2; shift 2
    "$@" >"$tmp/out" 2>"$tmp/err"
    local rc=$?
    if [ "$rc" -eq 1 ] && grep -qF -- "$pat" "$tmp/err"; then ok; else no "$d: exit $rc, stderr: $(head -3 "$tmp/err")"; fi
    # refused before the first step: no epoch reported, no step logged
    if grep -q '"epoch"' "$tmp/out" || grep -q ' step ' "$tmp/err"; then no "$d: a step ran"; else ok; fi
}

# Directories: img28 (28x28 train and test), img10 and img30 (28x28 train,
# 10x10 or 30x30 test), npy30 (30x30 .npy train), badlab (label 200 at index
# 8 of the train labels), reg (8 inputs -> 2 targets, a linear map).
"$py" - "$tmp" <<'PY' || no "making the data"
import numpy as np, os, struct, sys
t = sys.argv[1]
r = np.random.default_rng(3)
def idx3(d, split, a):
    open(f"{d}/{split}-images-idx3-ubyte", "wb").write(struct.pack(">IIII", 0x803, *a.shape) + a.tobytes())
def idx1(d, split, a):
    open(f"{d}/{split}-labels-idx1-ubyte", "wb").write(struct.pack(">II", 0x801, len(a)) + a.tobytes())
def images(n, h, w): return r.integers(0, 256, (n, h, w), dtype=np.uint8)
def labels(n): return r.integers(0, 10, n, dtype=np.uint8)
for name, test_hw in (("img28", 28), ("img10", 10), ("img30", 30)):
    d = f"{t}/{name}"; os.mkdir(d)
    idx3(d, "train", images(64, 28, 28)); idx1(d, "train", labels(64))
    idx3(d, "t10k", images(32, test_hw, test_hw)); idx1(d, "t10k", labels(32))
d = f"{t}/npy30"; os.mkdir(d)
np.save(f"{d}/train-images.npy", images(64, 30, 30)); np.save(f"{d}/train-labels.npy", labels(64).astype(np.int64))
idx3(d, "t10k", images(32, 28, 28)); idx1(d, "t10k", labels(32))
d = f"{t}/badlab"; os.mkdir(d)
lab = labels(64); lab[8] = 200; lab[20] = 11
idx3(d, "train", images(64, 28, 28)); idx1(d, "train", lab)
idx3(d, "t10k", images(32, 28, 28)); idx1(d, "t10k", labels(32))
d = f"{t}/reg"; os.mkdir(d)
W = r.standard_normal((8, 2)).astype(np.float32)
for split, n in (("train", 256), ("t10k", 64)):
    x = r.standard_normal((n, 8)).astype(np.float32)
    np.save(f"{d}/{split}-images.npy", x)
    np.save(f"{d}/{split}-targets.npy", (x @ W).astype(np.float32))
# reg64: float64 files as np.save writes them by default; reg32: numpy's casts of them
os.mkdir(f"{t}/reg64"); os.mkdir(f"{t}/reg32")
W64 = r.standard_normal((8, 2))
for split, n in (("train", 256), ("t10k", 64)):
    x = r.standard_normal((n, 8)) / 3
    for dd, dt in (("reg64", np.float64), ("reg32", np.float32)):
        np.save(f"{t}/{dd}/{split}-images.npy", x.astype(dt))
        np.save(f"{t}/{dd}/{split}-targets.npy", (x @ W64).astype(dt))
assert np.load(f"{t}/reg64/train-images.npy").dtype == np.float64
# an .npz renamed .npy
os.mkdir(f"{t}/npz")
np.savez(f"{t}/npz/x.npz", a=np.zeros((4, 8), np.float32))
os.rename(f"{t}/npz/x.npz", f"{t}/npz/train-images.npy")
PY

model="$src/tests/data/tiny.model"
run=(--model "$model" --epochs 1 --batch 16 --seed 1 --threads 1 --json)

# A regression model: a linear map learnt by SGD; the loss goes down.
printf 'input 8\nlinear 2\nloss mse\n' >"$tmp/reg.model"
if "$bin" train --model "$tmp/reg.model" --data "$tmp/reg" --epochs 6 --batch 16 --optimizer sgd --lr 0.05 \
    --seed 1 --threads 1 --json --save "$tmp/reg.st" >"$tmp/out" 2>"$tmp/err"; then ok; else no "mse train: $(head -3 "$tmp/err")"; fi
"$py" - "$tmp/out" <<'PY' && ok || no "mse loss did not go down: $(grep '"epoch"' "$tmp/out")"
import json, sys
e = [json.loads(l) for l in open(sys.argv[1]) if '"event": "epoch"' in l]
assert len(e) == 6, e
first, last = e[0], e[-1]
# the targets are an exact linear map of the inputs: SGD drives the loss far down
assert last["train_loss"] < 0.1 * first["train_loss"], (first, last)
assert last["test_loss"] < 0.1 * first["test_loss"], (first, last)
assert "test_acc" not in last  # no accuracy for a regression model
s = [json.loads(l) for l in open(sys.argv[1]) if '"event": "summary"' in l][0]
assert s["test_acc"] is None and s["test_loss"] == last["test_loss"], s  # JSON null, not nan
PY

# float64 files: each value rounded to f32 as numpy's astype(np.float32)
# rounds it, so training on them is bit for bit training on reg32; one note
# for each of the four files.
f64run=(--model "$tmp/reg.model" --epochs 2 --batch 16 --optimizer sgd --lr 0.05 --seed 1 --threads 1 --json)
if "$bin" train "${f64run[@]}" --data "$tmp/reg64" >"$tmp/out64" 2>"$tmp/err64"; then ok; else no "f64 train: $(head -3 "$tmp/err64")"; fi
if "$bin" train "${f64run[@]}" --data "$tmp/reg32" >"$tmp/out32" 2>"$tmp/err32"; then ok; else no "f32 train: $(head -3 "$tmp/err32")"; fi
"$py" - "$tmp/out64" "$tmp/out32" <<'PY' && ok || no "f64 run differs from the f32 one: $(grep '"epoch"' "$tmp/out64" "$tmp/out32")"
import json, sys
def losses(path):
    return [(e["train_loss"], e["test_loss"]) for e in map(json.loads, open(path)) if e.get("event") == "epoch"]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
assert len(a) == 2 and a == b, (a, b)
PY
for f in train-images train-targets t10k-images t10k-targets; do
    n=$(grep -cF "$tmp/reg64/$f.npy: float64 converted to float32 on load" "$tmp/err64")
    [ "$n" -eq 1 ] && ok || no "$f.npy: $n float64 notes, not 1: $(cat "$tmp/err64")"
done
grep -q "float64" "$tmp/err32" && no "a note for float32 files: $(cat "$tmp/err32")" || ok

# An .npz renamed .npy: a .npy message with the zip magic's bytes, not an IDX one.
refused ".npz named .npy" "npz/train-images.npy: byte 0: not a .npy file: its first bytes are 50 4b 03 04"     "$bin" train "${run[@]}" --train-images "$tmp/npz/train-images.npy" --train-labels "$tmp/img28/train-labels-idx1-ubyte"     --test-images "$tmp/img28/t10k-images-idx3-ubyte" --test-labels "$tmp/img28/t10k-labels-idx1-ubyte"
grep -q "IDX" "$tmp/err" && no ".npz named .npy: an IDX message: $(cat "$tmp/err")" || ok

# Training files alone (no --test-images, no --data): no evaluation, said
# once; nothing read from the default directory (Fashion-MNIST, whose 28x28
# images this 8-input model would refuse).
"$bin" train --model "$tmp/reg.model" --train-images "$tmp/reg/train-images.npy"     --train-labels "$tmp/reg/train-targets.npy" --epochs 1 --batch 16 --seed 1 --threads 1 --json >"$tmp/out" 2>"$tmp/err"
rc=$?
n=$(grep -cF "no test split given: no evaluation; give --test-images/--test-labels" "$tmp/err")
[ "$rc" -eq 0 ] && [ "$n" -eq 1 ] && ok || no "train files only: exit $rc, $n notes: $(head -3 "$tmp/err")"
grep -qi "t10k\|fashion" "$tmp/out" "$tmp/err" && no "train files only: the default directory was read: $(cat "$tmp/err")" || ok
"$py" - "$tmp/out" <<'PY' && ok || no "train files only: a test loss: $(cat "$tmp/out")"
import json, sys
e = [json.loads(l) for l in open(sys.argv[1]) if '"event": "epoch"' in l]
assert len(e) == 1 and e[0].get("test_loss") is None, e  # trained, evaluated on nothing
PY

# Test images of another size: refused before the first step, naming the test file.
refused "10x10 test set" "$tmp/img10/t10k-images-idx3-ubyte: samples are 1x10x10 but the model takes 1x28x28" \
    "$bin" train "${run[@]}" --data "$tmp/img10"
refused "30x30 test set" "$tmp/img30/t10k-images-idx3-ubyte: samples are 1x30x30 but the model takes 1x28x28" \
    "$bin" train "${run[@]}" --data "$tmp/img30"
refused "30x30 npy train set" "$tmp/npy30/train-images.npy: samples are 1x30x30 but the model takes 1x28x28" \
    "$bin" train "${run[@]}" --data "$tmp/npy30"
# Targets for a classifier, labels for a regression model.
refused "vectors for an image model" "reg/train-images.npy: samples are 1x1x8 but the model takes 1x28x28" \
    "$bin" train "${run[@]}" --data "$tmp/reg"
printf 'input 8\nlinear 10\n' >"$tmp/ce8.model"
refused "targets for cross-entropy" "reg/train-targets.npy: holds float targets but the model's loss (cross_entropy) needs integer class labels" \
    "$bin" train --model "$tmp/ce8.model" --epochs 1 --batch 16 --threads 1 --json --data "$tmp/reg"
printf 'input 8\nlinear 3\nloss mse\n' >"$tmp/reg3.model"
refused "targets too narrow" "reg/train-targets.npy: targets have 2 values a sample but the model has 3 outputs" \
    "$bin" train --model "$tmp/reg3.model" --epochs 1 --batch 16 --threads 1 --json --data "$tmp/reg"
printf 'input 1 28 28\nflatten\nlinear 2\nloss mse\n' >"$tmp/reg28.model"
refused "labels for mse" "img28/train-labels-idx1-ubyte: holds class labels but the model's loss (mse) needs float targets" \
    "$bin" train --model "$tmp/reg28.model" --epochs 1 --batch 16 --threads 1 --json --data "$tmp/img28"
# The first label past the model's 10 classes, by its index in the file.
refused "label 200" "$tmp/badlab/train-labels-idx1-ubyte: label 200 at index 8 is out of range for a model with 10 classes" \
    "$bin" train "${run[@]}" --data "$tmp/badlab"

# A gzip bomb: a valid header for 64 28x28 images, then 64 MiB of zeros. It
# is stopped at the first byte past the 50192 bytes the header implies.
mkdir "$tmp/bomb"
cp "$tmp/img28/"* "$tmp/bomb/"
rm "$tmp/bomb/train-images-idx3-ubyte"
"$py" - "$tmp/bomb/train-images-idx3-ubyte.gz" <<'PY' || no "making the bomb"
import gzip, struct, sys
with gzip.open(sys.argv[1], "wb", compresslevel=9) as f:
    f.write(struct.pack(">IIII", 0x803, 64, 28, 28))
    z = bytes(1 << 20)
    for _ in range(64): f.write(z)
PY
refused "gzip bomb" "train-images-idx3-ubyte.gz: inflates past the 50192 bytes its IDX header implies" \
    "$bin" train "${run[@]}" --data "$tmp/bomb"

# A FIFO as the images file: refused at once (a blocking open() would wait forever).
mkdir "$tmp/fifo"
cp "$tmp/img28/"* "$tmp/fifo/"
rm "$tmp/fifo/train-images-idx3-ubyte"
mkfifo "$tmp/fifo/train-images-idx3-ubyte"
timeout 60 "$bin" train "${run[@]}" --data "$tmp/fifo" >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ "$rc" -eq 1 ] && grep -qF "train-images-idx3-ubyte: the images is a FIFO" "$tmp/err"; then ok; else no "fifo: exit $rc (124: hung), stderr: $(head -3 "$tmp/err")"; fi

# eval checks its test set the same way. It calls fr_data_check once the CLI
# reads --test-images (tools/frugal.c, merged separately): until then these
# cases are skipped.
if "$bin" eval --help 2>&1 | grep -q -- "--test-images"; then
    if "$bin" train "${run[@]}" --data "$tmp/img28" --save "$tmp/w.st" >"$tmp/out" 2>"$tmp/err"; then ok; else no "train for eval: $(head -3 "$tmp/err")"; fi
    for hw in 10 30; do
        "$bin" eval --model "$model" --weights "$tmp/w.st" --data "$tmp/img$hw" --threads 1 >"$tmp/out" 2>"$tmp/err"
        rc=$?
        if [ "$rc" -eq 1 ] && grep -qF "$tmp/img$hw/t10k-images-idx3-ubyte: samples are 1x${hw}x${hw} but the model takes 1x28x28" "$tmp/err"
        then ok; else no "eval ${hw}x${hw}: exit $rc, stderr: $(head -3 "$tmp/err")"; fi
    done
    if "$bin" eval --model "$tmp/reg.model" --weights "$tmp/reg.st" --data "$tmp/reg" --threads 1 --json >"$tmp/out" 2>"$tmp/err" &&
        "$py" -c 'import json, sys; e = json.load(open(sys.argv[1])); assert e["accuracy"] is None and e["loss"] < 1, e' "$tmp/out"
    then ok; else no "eval mse: $(head -3 "$tmp/err") $(head -c 200 "$tmp/out")"; fi
else
    echo "frugal eval has no --test-images yet: eval cases skipped"
fi
finish
