#!/usr/bin/env bash
# test_mpi_batchnorm.sh — `mpirun -np 2 frugal train` of models with
# BatchNorm at ZeRO stages 0, 1, 2 and 3: the run saves its checkpoint, the
# checkpoint's running statistics are rank 0's, and every rank holds them
# (rank 0's buffers are broadcast at the end of each step, as DDP's
# broadcast_buffers broadcasts them before the next step's forward).
# Skipped (77) without mpirun or an MPI build. Needs Fashion-MNIST and
# python3 (no numpy: the IDX file and the checkpoints are read with gzip
# and struct).
#
# 1. BatchNorm on the input (`input 1 28 28`, `batchnorm`, `flatten`,
#    `linear 10`): its input is the data, so the running statistics follow
#    from the loader's documented order alone (data/prefetch.h: epoch e's
#    order is Fisher-Yates with fr_rng_make(seed, 1000 + e), splitmix64;
#    data/loader.h: batch k holds perm[k*B ..), rank r takes the samples
#    [r*n/R, (r+1)*n/R) of it; pixels x/255). st.py recomputes them in
#    float64, rounded to float32 after each step as the buffer stores them:
#    per step the mean m and the variance v over rank 0's 4 samples x 784
#    pixels (cnt = 3136), running_mean = 0.9 rm + 0.1 m, running_var =
#    0.9 rv + 0.1 v cnt/(cnt-1) (PyTorch's unbiased update), from 0 and 1.
#    The checkpoint must hold that within 1e-6 relative (the two differ by
#    the order of a sum in double: ~1e-12). The same chain over rank 1's
#    slices, or over the whole global batch, must miss by more than 100
#    times that: the check can tell rank 0's statistics from the others'.
# 2. The broadcast itself: each rank scores its slice of the test set with
#    its own buffers, so the run's test loss is the saved model's (scored by
#    one process, `frugal eval`) only when every rank holds rank 0's. The
#    two are the same per-sample losses summed in another grouping: each
#    eval batch's mean is a float sum of at most 64 terms, within
#    2*63*u*L of the exact one (u = 2^-24; the ranks add their slices in
#    double), and we allow 10 times that for logits computed in GEMM blocks
#    of another height: rel 7.5e-5. Without the broadcast rank 1's
#    statistics are its own (measured: the test loss then misses by 1.3e-2
#    relative for model 1, 2.2e-3 for the cnn of 3).
# 3. The built-in cnn (two BatchNorm layers after convolutions: the README's
#    MPI example), 32 steps of Adam at each stage: the save succeeds, the
#    test loss is the checkpoint's as in 2, its buffers finite and moved from
#    their start (0 and 1) with num_batches_tracked 32, and every F32 tensor
#    of the checkpoints of stages 1, 2 and 3 within test_mpi.sh's bound
#    T*2*(B-1)*u*100 (T = 32 steps, B = 8) of stage 0's.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
[ -d "$data" ] || { echo "no dataset at $data: skipping"; exit 77; }

cat >"$tmp/st.py" <<'PY'
import gzip, json, math, os, struct, sys
from st_tools import read, run, vals  # run: tensors, field, close
M64 = (1 << 64) - 1
def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]
def mix(z):  # splitmix64's finaliser (core/rng.c, as data/prefetch.h states)
    z = (z + 0x9e3779b97f4a7c15) & M64
    z = ((z ^ (z >> 30)) * 0xbf58476d1ce4e5b9) & M64
    z = ((z ^ (z >> 27)) * 0x94d049bb133111eb) & M64
    return z ^ (z >> 31)
def perm(n, seed, epoch):
    p, stream, i = list(range(n)), 1000 + epoch, 0
    for k in range(n - 1, 0, -1):
        m = k + 1
        lim = M64 - M64 % m
        while True:
            x = mix(mix(mix(seed) ^ stream) ^ i); i += 1
            if x < lim: break
        j = x % m
        p[k], p[j] = p[j], p[k]
    return p
def images(data, limit):
    b = gzip.open(os.path.join(data, "train-images-idx3-ubyte.gz")).read()
    n, h, w = struct.unpack(">III", b[4:16])
    px = h * w
    return [b[16 + s * px:16 + (s + 1) * px] for s in range(min(n, limit))], px
def chain(data, limit, batch, ranks, rank, seed):
    """running_mean, running_var after an epoch over `rank`'s slices (ranks 1:
    the whole batch), float64 sums rounded to float32 each step"""
    img, px = images(data, limit)
    order = perm(len(img), seed, 0)
    rm, rv = 0.0, 1.0
    for k in range(0, len(order), batch):
        b = order[k:k + batch]
        lo, hi = rank * len(b) // ranks, (rank + 1) * len(b) // ranks
        xs = [v / 255.0 for s in b[lo:hi] for v in img[s]]
        cnt = len(xs)
        m = sum(xs) / cnt
        v = sum((x - m) ** 2 for x in xs) / cnt
        rm = f32(0.9 * rm + 0.1 * m)
        rv = f32(0.9 * rv + 0.1 * v * cnt / (cnt - 1))
    return rm, rv
cmd = sys.argv[1]
if cmd == "rank0":  # ckpt data limit batch seed: the buffers are rank 0's chain
    ck, data, limit, batch, seed = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
    t = read(ck)
    got = (vals(t["0.running_mean"])[0], vals(t["0.running_var"])[0])
    want = chain(data, limit, batch, 2, 0, seed)
    tol = 1e-6
    miss = max(abs(g - w) / abs(w) for g, w in zip(got, want))
    if miss > tol:
        sys.exit("running (mean, var) %r, rank 0's by hand %r: off by %g relative" % (got, want, miss))
    if vals(t["0.num_batches_tracked"])[0] != limit // batch:
        sys.exit("num_batches_tracked %r, want %d" % (vals(t["0.num_batches_tracked"]), limit // batch))
    for what, other in (("rank 1's", chain(data, limit, batch, 2, 1, seed)),
                        ("the global batch's", chain(data, limit, batch, 1, 0, seed))):
        d = max(abs(g - w) / abs(w) for g, w in zip(got, other))
        if d <= 100 * tol:
            sys.exit("%s statistics %r are within %g of the checkpoint's: the check cannot tell them apart" % (what, other, d))
elif cmd == "moved":  # ckpt steps: every BatchNorm buffer finite, moved from its start
    t, steps = read(sys.argv[2]), int(sys.argv[3])
    names = [k for k in t if k.endswith(".running_mean")]
    if not names:
        sys.exit("no running_mean in the checkpoint")
    for k in names:
        base = k[:-len(".running_mean")]
        for suffix, start in ((".running_mean", 0.0), (".running_var", 1.0)):
            v = vals(t[base + suffix])
            if not all(math.isfinite(x) for x in v):
                sys.exit("%s%s: not finite" % (base, suffix))
            if all(x == start for x in v):
                sys.exit("%s%s: still %g everywhere" % (base, suffix, start))
            if suffix == ".running_var" and min(v) <= 0:
                sys.exit("%s.running_var: %g <= 0" % (base, min(v)))
        n = vals(t[base + ".num_batches_tracked"])[0]
        if n != steps:
            sys.exit("%s.num_batches_tracked %d, want %d" % (base, n, steps))
elif cmd == "evalloss":  # frugal eval --json output: its loss
    print(repr(json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])["loss"]))
else:
    run(sys.argv)
PY
st() { PYTHONPATH="$src/tests" python3 "$tmp/st.py" "$@"; }
EVAL_REL=$(python3 -c 'print(10 * 2 * 63 * 2.0**-24)')
REL=$(python3 -c 'print(32 * 2 * 7 * 2.0**-24 * 100)')

same_as_eval() { # model run.json ckpt test-limit what: the run's test loss is the checkpoint's
    local a b msg
    if ! "$bin" eval --model "$1" --weights "$3" --data "$data" --test-limit "$4" --batch 64 \
        --threads 1 --json >"$tmp/eval.json" 2>"$tmp/err"; then
        no "$5: eval of the checkpoint: $(head -3 "$tmp/err")"
        return
    fi
    a=$(st evalloss "$tmp/eval.json") b=$(st field "$2" epoch test_loss)
    if msg=$(st close "$a" "$b" "$EVAL_REL" 2>&1); then ok; else
        no "$5: test loss of the run vs one process's eval of its checkpoint: $msg"
    fi
}

# ---- 1 and 2: BatchNorm on the input, 32 steps of a global batch of 8
printf 'input 1 28 28\nbatchnorm\nflatten\nlinear 10\n' >"$tmp/bn.model"
for z in 0 1 2 3; do
    what="batchnorm on the input, --zero $z"
    if ! mpi 2 "$bin" train --model "$tmp/bn.model" --data "$data" --epochs 1 --batch 8 --limit 256 \
        --test-limit 256 --seed 7 --threads 1 --zero $z --save "$tmp/bn.$z.st" --json \
        >"$tmp/bn.$z.json" 2>"$tmp/err"; then
        no "$what: $(head -5 "$tmp/err")"
        continue
    fi
    if msg=$(st rank0 "$tmp/bn.$z.st" "$data" 256 8 7 2>&1); then ok; else no "$what: $msg"; fi
    same_as_eval "$tmp/bn.model" "$tmp/bn.$z.json" "$tmp/bn.$z.st" 256 "$what"
done

# ---- 3: the built-in cnn, 32 steps of a global batch of 8
for z in 0 1 2 3; do
    what="cnn, --zero $z"
    if ! mpi 2 "$bin" train --model cnn --data "$data" --epochs 1 --batch 8 --limit 256 \
        --test-limit 128 --threads 1 --zero $z --save "$tmp/cnn.$z.st" --json \
        >"$tmp/cnn.$z.json" 2>"$tmp/err"; then
        no "$what: $(head -5 "$tmp/err")"
        continue
    fi
    if msg=$(st moved "$tmp/cnn.$z.st" 32 2>&1); then ok; else no "$what: $msg"; fi
    same_as_eval cnn "$tmp/cnn.$z.json" "$tmp/cnn.$z.st" 128 "$what"
    if [ $z != 0 ] && [ -f "$tmp/cnn.0.st" ]; then
        if msg=$(st tensors "$tmp/cnn.0.st" "$tmp/cnn.$z.st" "$REL" 2>&1); then ok; else
            no "$what against --zero 0: $msg"
        fi
    fi
done

finish
