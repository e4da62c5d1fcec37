#!/usr/bin/env bash
# test_plan_cli.sh — the planner as a user drives it: `frugal plan` within a
# budget and its refusals, `frugal train --budget` never exceeding it (the
# allocator's measured peak), batch splitting and freezing from the command
# line, `--batch auto`, `--fused-head auto` weighed under a budget, and
# `frugal profile` writing a trace and a chart.
source "$(dirname "$0")/lib.sh"
run() { "$@" >"$tmp/out" 2>"$tmp/err"; }
model="$src/tests/data/tiny.model"

run "$bin" plan --model resnet --batch 128 --budget 1KiB
[ $? -eq 1 ] && grep -q "cannot hold the model: its parameters alone take" "$tmp/err" && ok || no "a budget below the parameters says so: $(cat "$tmp/err")"
run "$bin" plan --model resnet --batch 128 --budget 2MiB
[ $? -eq 1 ] && grep -q "no plan fits the budget of 2.0 MiB: data loading takes .*, leaving .* for the step, whose smallest plan needs .*; the smallest budget that fits is" "$tmp/err" && ok || no "a budget below the minimum names what takes it and the smallest: $(cat "$tmp/err")"
run "$bin" plan --model resnet --batch 100 --micro-batch 7
[ $? -eq 1 ] && grep -q "does not divide" "$tmp/err" && ok || no "micro-batch that does not divide: $(cat "$tmp/err")"
run "$bin" plan --model "$model" --freeze fc9
[ $? -eq 1 ] && grep -q "fc9" "$tmp/err" && ok || no "freezing a layer that does not exist: $(cat "$tmp/err")"
run "$bin" plan --model resnet --batch 16 --checkpoint every:0
[ $? -eq 2 ] && grep -q "positive" "$tmp/err" && ok || no "every:0 refused: $(cat "$tmp/err")"

for budget in 64MiB 24MiB 12MiB; do
    if run "$bin" plan --model resnet --batch 128 --budget $budget --json; then
        python3 - "$tmp/out" "$budget" <<'PY' && ok || no "plan fits $budget: $(cat "$tmp/out")"
import json, sys
p = json.load(open(sys.argv[1]))
b = int(sys.argv[2][:-3]) << 20
assert p["reserved_bytes"] <= b == p["budget"], p
assert p["batch"] == 128 and p["micro_batch"] * p["accumulate"] == 128, p
PY
    else
        no "plan --budget $budget: $(cat "$tmp/err")"
    fi
done

if [ -d "$data" ]; then
    common=(--model "$model" --data "$data" --limit 512 --test-limit 256 --epochs 1 --seed 3 --threads 2 --json)
    for budget in 12MiB 6MiB; do
        if run "$bin" train "${common[@]}" --batch 128 --budget $budget; then
            python3 - "$tmp/out" "$budget" <<'PY' && ok || no "train under $budget: $(tail -1 "$tmp/out")"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
b = int(sys.argv[2][:-3]) << 20
assert s["budget"] == b and s["measured_reserved_peak"] <= b, s
assert s["predicted_step_reserved"] <= b, s
PY
        else
            no "train --budget $budget failed: $(cat "$tmp/err")"
        fi
    done
    run "$bin" train "${common[@]}" --batch 64 --accumulate 4 --freeze 0-2
    [ $? -eq 0 ] && ok || no "train with --accumulate and --freeze: $(cat "$tmp/err")"
    run "$bin" train "${common[@]}" --batch auto --budget 8MiB
    if [ $? -eq 0 ]; then
        python3 -c "import json,sys; s=[json.loads(l) for l in open(sys.argv[1])][-1]; assert s['batch'] > 1 and s['measured_reserved_peak'] <= 8<<20, s" "$tmp/out" && ok || no "batch auto: $(tail -1 "$tmp/out")"
    else
        no "train --batch auto: $(cat "$tmp/err")"
    fi
fi

# plan and train count the same things: bisect (to 1 KiB) the smallest budget
# `plan` accepts; `train` with the same options runs within it (the
# allocator's measured peak), and 1 KiB less is refused by both. Adam in
# fp32, and SGD on bf16 weights (its f32 working copies count too).
boundary() {
    local same=(--model cnn --data "$data" --limit 256 --test-limit 64 --threads 1 "$@")
    local lo=1024 hi=65536 mid # KiB: lo is refused, hi accepted
    run "$bin" plan "${same[@]}" --budget ${lo}KiB --json && no "plan accepts 1 MiB for the CNN ($*)"
    run "$bin" plan "${same[@]}" --budget ${hi}KiB --json || no "plan refuses 64 MiB ($*): $(cat "$tmp/err")"
    while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if run "$bin" plan "${same[@]}" --budget ${mid}KiB --json; then hi=$mid; else lo=$mid; fi
    done
    run "$bin" train "${same[@]}" --epochs 1 --json --budget ${hi}KiB
    if [ $? -eq 0 ]; then
        python3 - "$tmp/out" "$hi" <<'PY' && ok || no "train at plan's smallest budget ${hi} KiB ($*): $(tail -1 "$tmp/out")"
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
b = int(sys.argv[2]) << 10
assert s["budget"] == b and s["measured_reserved_peak"] <= b, s
PY
    else
        no "train refuses the budget plan accepts (${hi} KiB, $*): $(cat "$tmp/err")"
    fi
    run "$bin" plan "${same[@]}" --budget ${lo}KiB
    [ $? -eq 1 ] && grep -q "no plan fits the budget of" "$tmp/err" && ok || no "plan refuses ${lo} KiB ($*): $(cat "$tmp/err")"
    # the smallest budget the refusal names is the one the bisection found
    local named=$(grep -o "the smallest budget that fits is [^(]*([0-9]* bytes)" "$tmp/err" | grep -o "[0-9]* bytes" | cut -d' ' -f1)
    [ -n "$named" ] && [ "$named" -gt $((lo << 10)) ] && [ "$named" -le $((hi << 10)) ] && ok ||
        no "the refusal names ${named:-nothing} bytes, the bisection ($lo, $hi] KiB ($*)"
    run "$bin" train "${same[@]}" --epochs 1 --budget ${lo}KiB
    [ $? -eq 1 ] && grep -q "no plan fits the budget of" "$tmp/err" && ok || no "train refuses ${lo} KiB as plan does ($*): $(cat "$tmp/err")"
}
if [ -d "$data" ]; then
    boundary --batch 64
    boundary --batch 32 --precision bf16 --optimizer sgd
fi

# The table says what the plan recomputes, from the same decision as the
# count: gpt-tiny keeping every block (its selective pass still remakes the
# GELU and LayerNorm outputs, which are no unit recomputation) shows no layer
# recomputed; with every:2 exactly the units of all segments but the last
# (checkpoint_sequential: segments of 2 units from the first unit with a
# backward) are, each once.
for ck in none every:2; do
    if run "$bin" plan --model gpt-tiny --batch 8 --seq 32 --checkpoint $ck --threads 2 --json; then
        python3 - "$tmp/out" "$ck" <<'PY' && ok || no "gpt-tiny --checkpoint $ck: the table against the count: $(head -c 600 "$tmp/out")"
import json, sys
p, ck = json.load(open(sys.argv[1])), sys.argv[2]
layers = p["layers"]
units = sorted({l["unit"] for l in layers})
first = min(l["unit"] for l in layers if l["activations"] != "none")
n = units[-1] + 1
if ck == "none":
    want = set()
else:
    size = int(ck.split(":")[1])
    segs = -(-(n - first) // size)
    want = set(range(first, first + size * (segs - 1)))
shown = {l["unit"] for l in layers if l["activations"] == "recomputed"}
assert shown == want, (sorted(shown), sorted(want))
assert p["recomputed_unit_forwards"] == len(want), (p["recomputed_unit_forwards"], len(want))
# every layer of a recomputed unit is shown recomputed, none of another
assert all((l["activations"] == "recomputed") == (l["unit"] in want) for l in layers if l["activations"] != "none")
# the selective pass remakes outputs in blocks it does not recompute, and says so apart
remade = [l["name"] for l in layers if l["output_remade"]]
assert remade and p["remade_ops"] >= len(remade), (remade, p["remade_ops"])
assert all(l["unit"] not in want for l in layers if l["output_remade"]), remade
PY
    else
        no "plan gpt-tiny --checkpoint $ck: $(cat "$tmp/err")"
    fi
done
run "$bin" plan --model gpt-tiny --batch 8 --seq 32 --threads 2
grep -q "^checkpointing: marks -> 0 unit forwards recomputed" "$tmp/out" && ! grep -q "recomputed before its backward" "$tmp/out" &&
    grep -q "output remade before its backward (selective)" "$tmp/out" && ok ||
    no "gpt-tiny's text table lists no recomputed layer under 0 recomputed units: $(head -20 "$tmp/out")"

# What splitting the batch costs (planner.c's split_cost): the CNN at batch
# 128 under 10 MiB runs in k micro-batches. Every node runs k times and each
# linear GEMM has k times fewer rows; with a node run costing F0 = 2e5 FLOPs
# and a GEMM of M rows running at M / (M + H) of its rate, H = 8 rows:
#   split = (k - 1) (H G + N F0) / (S + H G + N F0)
# where S is the whole step's FLOPs, N = 22 nodes (11 forward: conv1 bn1
# pool conv2 bn2 pool flatten fc1 relu fc2 loss, the two ReLUs after
# BatchNorm folded into it; 11 backward: the two pooled ReLUs' backward
# folded into pooling's; plan/fold.h) and
# G the linear layers' FLOPs per GEMM row, forward (2 in out) and backward
# (4 in out): 6 (3136 x 128 + 128 x 10) = 2,416,128.
if run "$bin" plan --model cnn --batch 128 --budget 10MiB --threads 2 --json; then
    python3 - "$tmp/out" <<'PY' && ok || no "the CNN in micro-batches: split cost against the formula: $(head -c 600 "$tmp/out")"
import json, sys
p = json.load(open(sys.argv[1]))
k, S = p["accumulate"], p["step_flops"]
assert k > 1 and p["micro_batch"] * k == 128, p
# both folds of plan/fold.h, each twice: the two stages' ReLU into BatchNorm, their backward into pooling's
assert p["folded_relu_into_batchnorm"] == 2 and p["folded_relu_bwd_into_pool"] == 2, p
H, F0, N, G = 8.0, 2e5, 22, 6 * (3136 * 128 + 128 * 10)
want = (k - 1) * (H * G + N * F0) / (S + H * G + N * F0)
assert want > 0 and abs(p["split_cost"] - want) <= 1e-5 * want + 1e-6, (p["split_cost"], want)
assert abs(p["extra_cost"] - (p["extra_compute"] + want)) <= 1e-5 * want + 1e-6, p
PY
else
    no "plan the CNN under 10 MiB: $(cat "$tmp/err")"
fi
run "$bin" plan --model cnn --batch 128 --budget 10MiB --threads 2
grep -q "^extra cost: [0-9.]*% of the whole-batch step's time: 0.0% more FLOPs (recomputed) + [1-9][0-9.]*% from splitting" "$tmp/out" && ok ||
    no "the text names the split's cost: $(head -4 "$tmp/out")"

# --fused-head auto under a budget: the planner weighs the head fused with its
# loss (chunks of rows) against storing the logits. GPT-2 at batch 2, T 256:
# its 98 MiB of logits; at 1800 MiB storing them needs recomputed segments
# (21% more time), fusing the head in chunks of 128 rows fits without (13%:
# the logits made again, smaller GEMMs), so the fused plan is chosen; with
# room to keep everything nothing is fused; a refusal names the head's chunk.
# Liger's chunk by hand: N = 512 rows, ceil(50257 / 768) = 66, ceil(512 / 66)
# = 8, next power of 2: 8 rows.
gpt=(--model gpt2 --batch 2 --seq 256)
run "$bin" plan "${gpt[@]}" --budget 1800MiB --json && cp "$tmp/out" "$tmp/off.json"
run "$bin" plan "${gpt[@]}" --budget 1800MiB --json --fused-head auto
python3 - "$tmp/off.json" "$tmp/out" <<'PY' && ok || no "--fused-head auto under 1800 MiB: $(cat "$tmp/out" "$tmp/err")"
import json, sys
off, on = (json.load(open(f)) for f in sys.argv[1:3])
b = 1800 << 20
assert off["fused_head_rows"] == 0 and on["fused_head_rows"] > 0, (off, on)
assert off["reserved_bytes"] <= b and on["reserved_bytes"] <= b, (off, on)
assert on["extra_cost"] < off["extra_cost"], (off["extra_cost"], on["extra_cost"])
assert on["fused_head_cost"] > 0 and abs(on["extra_cost"] - on["split_cost"] - on["extra_compute"] - on["fused_head_cost"]) < 1e-5, on
# the logits a micro-batch: 2 x 256 x 50257 x 4 bytes
assert on["fused_head_logits_bytes"] == 2 * 256 * 50257 * 4, on
PY
run "$bin" plan "${gpt[@]}" --budget 3GiB --json --fused-head auto
python3 -c "import json,sys; p=json.load(open(sys.argv[1])); assert p['fused_head_rows'] == 0 and p['extra_cost'] < 0.01, p" "$tmp/out" && ok ||
    no "--fused-head auto with room to spare stores the logits: $(cat "$tmp/out")"
run "$bin" plan "${gpt[@]}" --budget 1800MiB --fused-head auto
grep -q "^fused head: lm_head and the loss in chunks of [0-9]* rows: its 98.2 MiB of logits" "$tmp/out" && ok ||
    no "plan names the fused head: $(cat "$tmp/out")"
run "$bin" plan "${gpt[@]}" --budget 500MiB --fused-head auto
[ $? -eq 1 ] && grep -q "smallest plan needs .*--fused-head [0-9]" "$tmp/err" && ok ||
    no "a refusal names the fused head: $(cat "$tmp/err")"
run "$bin" estimate "${gpt[@]}" --fused-head auto
grep -q "^fused head: lm_head and the loss in chunks of 8 rows" "$tmp/out" && ok ||
    no "estimate names Liger's chunk (8 rows): $(grep -i fused "$tmp/out")"

run "$bin" profile --model "$model" --batch 32 --steps 2 --trace "$tmp/t.json" --svg "$tmp/m.svg"
[ $? -eq 0 ] && ok || no "profile: $(cat "$tmp/err")"
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); assert any(e.get('ph')=='C' for e in t['traceEvents'])" "$tmp/t.json" && ok || no "trace is Chrome Trace Event JSON with counters"
grep -q "peak" "$tmp/m.svg" && grep -q "activations" "$tmp/m.svg" && ok || no "the chart marks the peak and names the categories"
# under a budget the run is bounded by it, the reports written after it are not
# (they once ran out of the budget's room copying the trace's events)
run "$bin" profile --model "$src/tests/data/small_gpt.model" --batch 8 --steps 2 --budget 800KiB \
    --trace "$tmp/tb.json" --svg "$tmp/mb.svg"
[ $? -eq 0 ] && [ -s "$tmp/tb.json" ] && grep -q "peak reserved 0.[0-9] MiB" "$tmp/out" && ok ||
    no "profile under --budget: $(tail -2 "$tmp/err")"

finish
