#!/usr/bin/env bash
# test_device_global.sh — without --budget, `frugal train` on the OpenCL
# device (PoCL in CI) checks the step's planned device reservation against
# the device's global memory before anything is allocated. The device is
# made to report 20 MB (FRUGAL_CL_GLOBAL_MEM, the testing knob `frugal
# devices --help` names; the check is the one real devices get): the CNN's
# plan at batch 64 (its reservation read from a run without the knob) is
# refused, naming the smallest budget that fits and --budget; under that
# budget the run fits within the 20 MB, and one byte less is refused. A
# knob above the device's memory changes nothing. Skipped (77) without a
# device.
. "$(dirname "$0")/lib.sh"

if ! "$bin" devices >/dev/null 2>&1; then
    echo "skipped: no OpenCL device (or built without OpenCL)"
    exit 77
fi

run=(train --model cnn --data "$data" --epochs 1 --limit 128 --test-limit 64 --batch 64 --seed 2
    --threads 2 --device opencl)
summary() { # file, key: the summary line's value
    python3 -c 'import json,sys
for l in open(sys.argv[1]):
    d = json.loads(l)
    if d.get("event") == "summary": print(d[sys.argv[2]])' "$1" "$2"
}

expect "the plan without the knob" "$bin" "${run[@]}" --json
want=$(summary "$tmp/out" predicted_step_reserved)
echo "the step's plan reserves $want bytes on the device"
[ -n "$want" ] && [ "$want" -gt 20000000 ] && ok || no "the plan ($want) is not above 20 MB"

export FRUGAL_CL_GLOBAL_MEM=20000000
expect_fail "a plan above the device's memory" 1 "more than its global memory of" "$bin" "${run[@]}"
cat "$tmp/err"
grep -qF "reserves $(python3 -c "print('%.1f MiB ($want bytes)' % ($want / 1048576))")" "$tmp/err" &&
    ok || no "the refusal does not name the plan's $want bytes"
grep -qF "nothing was allocated" "$tmp/err" && ok || no "the refusal does not say nothing was allocated"
smallest=$(sed -n 's/.*pass --budget \([0-9]*\) .*/\1/p' "$tmp/err")
[ -n "$smallest" ] && [ "$smallest" -le 20000000 ] && ok || no "no budget below 20 MB named: '$smallest'"

expect "under the budget named" "$bin" "${run[@]}" --budget "$smallest" --json
peak=$(summary "$tmp/out" measured_reserved_peak)
echo "--budget $smallest: device peak $peak bytes"
[ -n "$peak" ] && [ "$peak" -le "$smallest" ] && ok || no "device peak $peak over the budget $smallest"
expect_fail "one byte below the budget named" 1 "no plan fits the budget" \
    "$bin" "${run[@]}" --budget $((smallest - 1))

FRUGAL_CL_GLOBAL_MEM=$((1 << 60)) expect "a knob above the device's memory" "$bin" "${run[@]}"
finish
