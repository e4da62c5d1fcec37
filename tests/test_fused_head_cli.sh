#!/usr/bin/env bash
# test_fused_head_cli.sh — --fused-head as a user meets it: a small GPT
# (tests/data/small_gpt.model) trained with its head fused (chunks of 7
# rows, which do not divide the 8 x 32 rows) learns as the unfused run does
# (validation loss within 1e-5, relative), its predicted step reservation
# falls; a run saved after 3 steps and resumed to 6 gives the uninterrupted
# run's validation loss bit for bit; `frugal eval --fused-head` scores the
# saved weights as the unfused eval does (loss within 1e-6, the same
# accuracy); on the OpenCL device (PoCL in CI) with --checkpoint all the
# device's predicted reservation is what its allocator measured, exactly,
# and the losses are the device's unfused ones.
source "$(dirname "$0")/lib.sh"

python3 - "$tmp/text.txt" <<'PY'
import sys
s = "the quick brown fox jumps over the lazy dog. a frugal engine counts every byte.\n"
open(sys.argv[1], "w").write(s * 500)
PY
run=(train --model "$src/tests/data/small_gpt.model" --data "$tmp/text.txt" --batch 8 --threads 2
    --seed 1 --optimizer adamw --lr 3e-3 --test-limit 8 --json)
summary() { # file, key
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get("event") == "summary": print(repr(d[sys.argv[2]]))' "$1" "$2"
}

expect "unfused run" "$bin" "${run[@]}" --steps 6
cp "$tmp/out" "$tmp/off.json"
expect "fused run" "$bin" "${run[@]}" --steps 6 --fused-head 7
cp "$tmp/out" "$tmp/on.json"
python3 - "$tmp/off.json" "$tmp/on.json" <<'PY' && ok || no "fused vs unfused training"
import json, sys
off, on = ([json.loads(l) for l in open(f) if '"summary"' in l][0] for f in sys.argv[1:3])
assert abs(on["test_loss"] - off["test_loss"]) <= 1e-5 * abs(off["test_loss"]), (on, off)
assert on["predicted_step_reserved"] < off["predicted_step_reserved"], (on, off)
# the CPU's predicted step against its measured peak (the loader's queue and
# the evaluation beside it are small here: test_gpt_cli's bound)
p, m = on["predicted_step_reserved"], on["measured_reserved_peak"]
assert p <= m <= p * 1.02 + (1 << 20), (p, m)
PY

# under bf16-mixed: where the CPU has a native bf16 GEMM the fused head rounds W to
# bf16 a panel at a time, as the unfused head's linear layer rounds it whole, and
# both sum the same rounded products in f32 (in other orders): the validation
# losses agree within 1e-4 (relative; measured 4e-7 here), and the predicted step
# reservation is the measured one (test_gpt_cli's bound)
expect "unfused run, bf16-mixed" "$bin" "${run[@]}" --steps 6 --precision bf16-mixed
cp "$tmp/out" "$tmp/off16.json"
expect "fused run, bf16-mixed" "$bin" "${run[@]}" --steps 6 --fused-head 7 --precision bf16-mixed
python3 - "$tmp/off16.json" "$tmp/out" <<'PY' && ok || no "fused vs unfused training, bf16-mixed"
import json, sys
off, on = ([json.loads(l) for l in open(f) if '"summary"' in l][0] for f in sys.argv[1:3])
print("bf16-mixed: validation loss fused %.9g, unfused %.9g" % (on["test_loss"], off["test_loss"]))
assert abs(on["test_loss"] - off["test_loss"]) <= 1e-4 * abs(off["test_loss"]), (on, off)
p, m = on["predicted_step_reserved"], on["measured_reserved_peak"]
assert p <= m <= p * 1.02 + (1 << 20), (p, m)
PY

# save after 3 steps, resume to 6: the uninterrupted run's validation loss
expect "fused run, saved at 3" "$bin" "${run[@]}" --steps 3 --fused-head 7 --save "$tmp/ck.safetensors"
expect "fused run, resumed to 6" "$bin" "${run[@]}" --steps 6 --fused-head 7 --resume "$tmp/ck.safetensors"
a=$(summary "$tmp/on.json" test_loss) b=$(summary "$tmp/out" test_loss)
[ -n "$a" ] && [ "$a" = "$b" ] && ok || no "resumed fused run: validation loss $b, uninterrupted $a"

# eval of the saved weights, fused and not
ev=(eval --model "$src/tests/data/small_gpt.model" --weights "$tmp/ck.safetensors" --data "$tmp/text.txt"
    --batch 8 --threads 2 --test-limit 16 --json)
expect "eval unfused" "$bin" "${ev[@]}"
cp "$tmp/out" "$tmp/ev_off.json"
expect "eval fused" "$bin" "${ev[@]}" --fused-head auto
python3 - "$tmp/ev_off.json" "$tmp/out" <<'PY' && ok || no "fused vs unfused eval: $(cat "$tmp/out")"
import json, sys
off, on = (json.loads(open(f).readline()) for f in sys.argv[1:3])
assert on["accuracy"] == off["accuracy"] and on["tokens"] == off["tokens"] == 16 * 32, (on, off)
assert abs(on["loss"] - off["loss"]) <= 1e-6 * abs(off["loss"]), (on, off)
PY
expect_fail "a bad --fused-head" 2 "--fused-head 'x': expected off, auto or a number of rows" \
    "$bin" "${ev[@]}" --fused-head x

if "$bin" devices >/dev/null 2>&1; then
    dev=("${run[@]}" --steps 3 --device opencl --checkpoint all)
    expect "device run, unfused" "$bin" "${dev[@]}"
    cp "$tmp/out" "$tmp/doff.json"
    expect "device run, fused" "$bin" "${dev[@]}" --fused-head 7
    python3 - "$tmp/doff.json" "$tmp/out" <<'PY' && ok || no "fused head on the device"
import json, sys
off, on = ([json.loads(l) for l in open(f) if '"summary"' in l][0] for f in sys.argv[1:3])
print("device: predicted %d, measured %d reserved (unfused %d)" % (
    on["predicted_step_reserved"], on["measured_reserved_peak"], off["measured_reserved_peak"]))
assert on["predicted_step_reserved"] == on["measured_reserved_peak"], on
assert on["measured_reserved_peak"] < off["measured_reserved_peak"], (on, off)
assert abs(on["test_loss"] - off["test_loss"]) <= 1e-5 * abs(off["test_loss"]), (on, off)
PY
else
    echo "no OpenCL device: the device run is skipped"
fi
finish
