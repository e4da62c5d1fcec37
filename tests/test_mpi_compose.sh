#!/usr/bin/env bash
# test_mpi_compose.sh — data parallelism composed with accumulation,
# clipping and the dynamic loss scaler: 3 ranks against one process, the
# same global batch 64 split into 2 micro-batches, momentum SGD, the global
# gradient norm clipped to 0.5 (clipping acts: the norm is above it), the
# loss scaled by 65536 and unscaled: losses and weights within the bound of
# test_mpi.sh (10 steps x 2(B-1)u x 100 of each tensor's scale), and small
# buckets (--bucket-cap-mb 0.005: two buckets) the same as one. Skipped (77)
# without mpirun or an MPI build.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
[ -d "$data" ] || { echo "no dataset at $data: skipping"; exit 77; }
cp "$(dirname "$0")/data/mlp3.model" "$tmp/m.model" # 784-64-32-10, no BatchNorm
cat >"$tmp/cmp.py" <<'PY'
import json, struct, sys
def read(path):
    b = open(path, "rb").read()
    n = struct.unpack("<Q", b[:8])[0]
    h = json.loads(b[8:8 + n]); h.pop("__metadata__", None)
    d = b[8 + n:]
    return {k: struct.unpack("<%df" % ((v["data_offsets"][1] - v["data_offsets"][0]) // 4),
                             d[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in h.items() if v["dtype"] == "F32" and not k.startswith("optimizer.")}
def loss(path):
    return [json.loads(l) for l in open(path) if '"epoch"' in l][-1]["train_loss"]
rel = 10 * 2 * 63 * 2.0**-24 * 100
a, b = read(sys.argv[1]), read(sys.argv[2])
assert sorted(a) == sorted(b), "names differ"
for k in a:
    scale = max(abs(v) for v in a[k])
    worst = max(abs(x - y) for x, y in zip(a[k], b[k]))
    assert worst <= rel * scale, "%s: %g > %g" % (k, worst, rel * scale)
la, lb = loss(sys.argv[3]), loss(sys.argv[4])
assert abs(la - lb) <= rel * abs(la), "loss %r vs %r" % (la, lb)
PY
opts=(train --model "$tmp/m.model" --data "$data" --epochs 1 --batch 64 --limit 640
    --test-limit 128 --threads 1 --json --optimizer sgd --momentum 0.9 --lr 0.05
    --accumulate 2 --clip-grad-norm 0.5 --loss-scale dynamic)
expect "one process" sh -c '"$@" >"$0"' "$tmp/one.json" "$bin" "${opts[@]}" --save "$tmp/one.st"
for extra in "" "--bucket-cap-mb 0.005"; do
    # shellcheck disable=SC2086
    ASAN_OPTIONS=$mpi_asan mpirun --oversubscribe -np 3 "$bin" "${opts[@]}" $extra \
        --save "$tmp/three.st" >"$tmp/three.json" 2>"$tmp/err" || no "3 ranks $extra: $(head -3 "$tmp/err")"
    if msg=$(python3 "$tmp/cmp.py" "$tmp/one.st" "$tmp/three.st" "$tmp/one.json" "$tmp/three.json" 2>&1); then
        ok
    else
        no "3 ranks $extra against one: $(echo "$msg" | tail -1)"
    fi
done
# the small cap makes two buckets
ASAN_OPTIONS=$mpi_asan mpirun --oversubscribe -np 2 "$bin" "${opts[@]}" --bucket-cap-mb 0.005 \
    >"$tmp/two.json" 2>"$tmp/err"
grep -q '"buckets": 2,' "$tmp/two.json" && ok || no "--bucket-cap-mb 0.005: $(grep -o '"buckets": [0-9]*' "$tmp/two.json")"
finish
