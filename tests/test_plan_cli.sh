#!/usr/bin/env bash
# test_plan_cli.sh — the planner as a user drives it: `frugal plan` within a
# budget and its refusals, `frugal train --budget` never exceeding it (the
# allocator's measured peak), batch splitting and freezing from the command
# line, `--batch auto`, and `frugal profile` writing a trace and a chart.
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

run "$bin" profile --model "$model" --batch 32 --steps 2 --trace "$tmp/t.json" --svg "$tmp/m.svg"
[ $? -eq 0 ] && ok || no "profile: $(cat "$tmp/err")"
python3 -c "import json,sys; t=json.load(open(sys.argv[1])); assert any(e.get('ph')=='C' for e in t['traceEvents'])" "$tmp/t.json" && ok || no "trace is Chrome Trace Event JSON with counters"
grep -q "peak" "$tmp/m.svg" && grep -q "activations" "$tmp/m.svg" && ok || no "the chart marks the peak and names the categories"

finish
