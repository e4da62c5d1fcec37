#!/usr/bin/env bash
# golden.sh — the fixed set of runs issue 22 (the training floor rebuilt)
# must reproduce bit for bit: for each, every loss the run prints (its JSON
# lines' train/test/val losses, %.17g) and the SHA-256 of the saved
# checkpoint's tensors (names and bytes, metadata left out), plus greedy
# generate's text. Run it with the build before a refactor and after, on
# the same host, threads and device, and diff the two files: any line that
# differs is a result the refactor changed.
#
# Usage: bash bench/golden.sh [build-dir] > golden.txt
# Needs Fashion-MNIST and Debian's fortunes (scripts/deps.sh installs both);
# the OpenCL runs need a device (skipped, and said, without one), the MPI
# runs mpirun.
set -uo pipefail
# lscpu's labels follow the locale; the header names the model in the C locale's
export LC_ALL=C
cd "$(dirname "$0")/.."
bin=$(realpath "${1:-build}")/frugal
data=/usr/share/datasets/fashion-mnist
text=/usr/share/games/fortunes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# FRUGAL_CONV=gemm FRUGAL_GEMM=openblas: the defaults, named so that an
# environment which opts into oneDNN's convolutions or its f32 matmul for
# linear layers (issue 23; other bits) does not change the record's runs.
export FRUGAL_CONV=gemm FRUGAL_GEMM=openblas
export OMP_NUM_THREADS=2 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp

# the losses of a run's JSON lines and the hash of its checkpoint's tensors
digest() { # name json-file checkpoint
    python3 - "$@" <<'PY'
import hashlib, json, struct, sys
name, out, ckpt = sys.argv[1:4]
losses = []
for l in open(out):
    if not l.startswith("{"):
        continue
    e = json.loads(l)
    for k in ("train_loss", "test_loss", "val_loss"):
        if k in e and e[k] is not None:
            losses.append("%s:%s=%.17g" % (e.get("event"), k, e[k]))
h = hashlib.sha256()
try:
    b = open(ckpt, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    hd = json.loads(b[8:8 + n]); hd.pop("__metadata__", None)
    for k in sorted(hd):
        o0, o1 = hd[k]["data_offsets"]
        h.update(k.encode() + b"\0" + b[8 + n + o0:8 + n + o1])
    w = h.hexdigest()
except OSError:
    w = "no checkpoint"
print("%s weights=%s losses=%s" % (name, w, " ".join(losses)))
PY
}
run() { # name frugal-train-args...
    local name=$1; shift
    if "$bin" train "$@" --json --no-progress --save "$tmp/$name.st" >"$tmp/$name.json" 2>"$tmp/$name.err"; then
        digest "$name" "$tmp/$name.json" "$tmp/$name.st"
    else
        echo "$name FAILED: $(tail -1 "$tmp/$name.err")"
    fi
}
cnn=(--model cnn --data "$data" --limit 2048 --test-limit 512 --epochs 1 --batch 64 --seed 1 --threads 2)
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, OMP_NUM_THREADS=2; $(git rev-parse --short HEAD 2>/dev/null)"
run cnn-sgd-momentum "${cnn[@]}" --optimizer sgd --lr 0.05 --momentum 0.9
run cnn-adam "${cnn[@]}" --optimizer adam
run cnn-adamw-int8 "${cnn[@]}" --optimizer adamw --optimizer-state int8
run cnn-budget-revolve "${cnn[@]}" --optimizer adam --budget 24MiB --checkpoint revolve:2
run cnn-bf16-mixed "${cnn[@]}" --optimizer adam --precision bf16-mixed
run cnn-fp16-mixed "${cnn[@]}" --optimizer adam --precision fp16-mixed --loss-scale dynamic
run gpt-tiny-adamw --model gpt-tiny --data "$text" --seq 64 --batch 4 --steps 20 --optimizer adamw \
    --lr 1e-3 --test-limit 16 --seed 2 --threads 2
if "$bin" devices >/dev/null 2>&1; then
    run cnn-opencl "${cnn[@]}" --optimizer adam --device opencl
    run cnn-opencl-offload "${cnn[@]}" --optimizer adam --device opencl --offload optimizer,activations
else
    echo "cnn-opencl skipped: no OpenCL device"
fi
if command -v mpirun >/dev/null; then
    for n in 2 3; do
        for z in 0 1 2 3; do
            name=mpi-$n-zero$z
            if mpirun --oversubscribe -np $n "$bin" train --model tests/data/mlp3.model --data "$data" \
                --limit 640 --test-limit 128 --epochs 1 --batch 64 --optimizer adam --threads 1 \
                --zero $z --json --no-progress --save "$tmp/$name.st" >"$tmp/$name.json" 2>"$tmp/$name.err"; then
                digest "$name" "$tmp/$name.json" "$tmp/$name.st"
            else
                echo "$name FAILED: $(tail -1 "$tmp/$name.err")"
            fi
        done
    done
else
    echo "mpi skipped: no mpirun"
fi
printf 'generate-greedy text-sha256=%s\n' "$("$bin" generate --model gpt-tiny --weights "$tmp/gpt-tiny-adamw.st" \
    --prompt 'The ' --tokens 64 --temperature 0 --threads 2 2>/dev/null | sha256sum | cut -c1-64)"
