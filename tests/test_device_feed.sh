#!/usr/bin/env bash
# test_device_feed.sh — batches uploaded by the feed (train/feed.c) into
# two device slots while the step before runs, through `frugal train` on the
# OpenCL device (PoCL in CI): the same losses bit for bit as --sync-upload
# (each batch written by its step), with whole batches, micro-batches (the
# step binds offsets into the slot), a last batch shorter than the rest and
# a token model;
# the device's data bytes grow by exactly one more batch of inputs and labels
# (a hand count), the prediction still meets the measurement; and every
# upload but an epoch's first started before the step beside it ended.
# Skipped (77) without a device.
. "$(dirname "$0")/lib.sh"

if ! "$bin" devices >/dev/null 2>&1; then
    echo "skipped: no OpenCL device (or built without OpenCL)"
    exit 77
fi

summary() { # file: the summary line's JSON, merged over the epochs' lines
    python3 -c 'import json,sys
out = {}
for l in open(sys.argv[1]):
    out.update(json.loads(l))
print(json.dumps(out))' "$1"
}

# 224 samples in batches of 64: 3 whole batches and one of 32, two epochs
run=(train --model cnn --data "$data" --epochs 2 --limit 224 --test-limit 64 --batch 64 --seed 4
    --threads 2 --json --device opencl)
for mb in 0 16; do
    extra=()
    [ "$mb" -gt 0 ] && extra=(--micro-batch "$mb")
    expect "two slots, micro-batch $mb" "$bin" "${run[@]}" "${extra[@]}"
    cp "$tmp/out" "$tmp/fed$mb.json"
    expect "synchronous, micro-batch $mb" "$bin" "${run[@]}" "${extra[@]}" --sync-upload
    cp "$tmp/out" "$tmp/sync$mb.json"
    python3 - "$tmp/fed$mb.json" "$tmp/sync$mb.json" "$mb" <<'EOF' && ok || no "micro-batch $mb: fed and synchronous runs differ"
import json, sys
def lines(p):
    return [json.loads(l) for l in open(p)]
a, b = lines(sys.argv[1]), lines(sys.argv[2])
bad = []
for x, y in zip(a, b):
    for k in ("train_loss", "train_acc", "test_loss", "test_acc"):
        if k in x and x[k] != y[k]:
            bad.append("%s %s: %r fed, %r synchronous" % (x.get("event"), k, x[k], y[k]))
print("\n".join(bad) or "micro-batch %s: the same %d losses bit for bit" % (sys.argv[3], sum(
    ("train_loss" in x) + ("test_loss" in x) for x in a)))
sys.exit(1 if bad or len(a) != len(b) else 0)
EOF
done

# A token model (a 2-layer GPT, i32 token ids and next-token labels in the
# slots): the same losses bit for bit.
python3 - "$tmp/text.txt" <<'PY'
import sys
s = "the quick brown fox jumps over the lazy dog. a frugal engine counts every byte.\n"
open(sys.argv[1], "w").write(s * 500)
PY
gpt=(train --model "$src/tests/data/small_gpt.model" --data "$tmp/text.txt" --batch 8 --steps 6
    --threads 2 --json --device opencl)
expect "gpt, two slots" "$bin" "${gpt[@]}"
cp "$tmp/out" "$tmp/gfed.json"
expect "gpt, synchronous" "$bin" "${gpt[@]}" --sync-upload
a=$(grep '"eval"' "$tmp/gfed.json" | sed 's/"seconds.*//') b=$(grep '"eval"' "$tmp/out" | sed 's/"seconds.*//')
[ -n "$a" ] && [ "$a" = "$b" ] && ok || no "gpt: fed '$a' synchronous '$b'"

# Device memory: the feed holds two whole batches where the step held one
# micro-batch (64 samples here). A sample is 1x28x28 f32 inputs and one i32
# label: 64 * (784 * 4 + 4) = 200960 bytes more in category data at the
# peak. The prediction equals what the allocator reserved at its peak, within
# the evaluation step's own buffers (as test_device_train.sh states).
python3 - "$tmp/fed0.json" "$tmp/sync0.json" <<'EOF' && ok || no "device memory of the slots"
import json, sys
def summ(p):
    for l in open(p):
        d = json.loads(l)
        if d.get("event") == "summary":
            return d
a, b = summ(sys.argv[1]), summ(sys.argv[2])
da, db = a["memory"]["device"], b["memory"]["device"]
extra = da["allocated_peak"]["data"] - db["allocated_peak"]["data"]
print("device data peak %d (two slots) vs %d (synchronous): +%d; predicted %d, measured %d" %
      (da["allocated_peak"]["data"], db["allocated_peak"]["data"], extra,
       a["predicted_step_reserved"], a["measured_reserved_peak"]))
assert extra == 64 * (784 * 4 + 4), extra
p, m = a["predicted_step_reserved"], a["measured_reserved_peak"]
assert p <= m <= p * 1.25
EOF

# Overlap: 4 batches an epoch, the first uploaded before any step; each of
# the other 3 is uploaded while the step before it runs (a CNN step of 64
# samples on this device takes far longer than a 200 KB upload).
text=(train --model cnn --data "$data" --epochs 1 --limit 256 --test-limit 64 --batch 64 --seed 4
    --threads 2 --device opencl)
expect "two slots, text" "$bin" "${text[@]}"
line=$(grep "^batch uploads:" "$tmp/out")
echo "$line"
[[ "$line" =~ ^batch\ uploads:\ 4\ into\ two\ device\ slots,\ 3\ of\ them ]] && ok ||
    no "uploads not overlapped: '$line'"
[[ "$line" =~ 4\ enqueued\ by\ the\ loader\'s\ thread\;\ the\ steps\ waited\ 4\ times ]] && ok ||
    no "uploads not all from the loader's thread, or steps not one wait each: '$line'"
expect "synchronous, text" "$bin" "${text[@]}" --sync-upload
grep -q "^batch uploads:" "$tmp/out" && no "a synchronous run reports uploads ahead" || ok
finish
