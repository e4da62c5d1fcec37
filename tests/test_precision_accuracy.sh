#!/usr/bin/env bash
# test_precision_accuracy.sh — issue 4's accuracy acceptance, on the real
# data: the built-in CNN trained on all 60,000 Fashion-MNIST images for one
# epoch (batch 128, Adam, 2 threads) in fp32, bf16-mixed and fp16-mixed,
# and with int8 Adam state; each one's test accuracy on the 10,000 test
# images must be within 0.5 points of fp32's with the same seeds and
# epochs, both as the mean over the seeds 0, 1 and 2.
#
# Why a mean: one run's accuracy is one draw. At 2 epochs fp32 alone gave
# 90.27, 89.63 and 90.62% at seeds 0-2 (AMD EPYC, OpenBLAS's Cooperlake
# kernels), a spread of 1.0 point, and a host whose OpenBLAS picks other kernels gets
# other bits: the single-seed test written first passed where it was
# written (fp32 90.13, bf16-mixed 90.27) and failed on that EPYC (90.32
# against 89.68). At 2 epochs the paired differences (the same seed in both
# precisions) had a spread of about 0.25 points, so a single seed's verdict
# fails about one time in twenty; the mean of three has about 1/sqrt(3) of
# it. One epoch keeps the 12 runs within CI's time. Each run is
# deterministic (same seed and threads, same bits), so on one host the
# verdict is too. About 18 s a run on 2 cores;
# skipped under the sanitizers, whose build is ten times slower (the code
# paths are exercised there by test_precision and test_optim_state).
source "$(dirname "$0")/lib.sh"
if [ -n "${FR_SANITIZED:-}" ]; then
    echo "skipped under the sanitizers (12 one-epoch runs of the CNN)"
    echo "0 passed, 0 failed"
    exit 0
fi
seeds=(0 1 2)
common=(--model cnn --data "$data" --epochs 1 --batch 128 --optimizer adam --threads 2
        --no-progress --json)
acc() { # name seed extra args...: prints the final test accuracy, in percent
    local name=$1 seed=$2; shift 2
    if "$bin" train "${common[@]}" --seed "$seed" "$@" >"$tmp/$name" 2>"$tmp/$name.err"; then
        python3 -c 'import json, sys
s = [json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][0]
print("%.2f" % (100 * s["test_acc"]))' "$tmp/$name"
    else
        echo "FAIL: train $name --seed $seed: $(head -3 "$tmp/$name.err")" >&2
        echo nan
    fi
}
mean_acc() { # name extra args...: "mean per-seed..." over the seeds
    local name=$1 runs=() s; shift
    for s in "${seeds[@]}"; do runs+=("$(acc "$name" "$s" "$@")"); done
    python3 -c 'import sys; v = [float(x) for x in sys.argv[1:]]
print("%.3f" % (sum(v) / len(v)), *sys.argv[1:])' "${runs[@]}"
}
read -r fp32 fp32_runs <<<"$(mean_acc fp32)"
echo "fp32: mean $fp32% over seeds ${seeds[*]} ($fp32_runs)"
for cfg in "bf16-mixed --precision bf16-mixed" "fp16-mixed --precision fp16-mixed" \
           "int8-state --optimizer-state int8"; do
    set -- $cfg
    name=$1; shift
    read -r a runs <<<"$(mean_acc "$name" "$@")"
    d=$(python3 -c "print('%.2f' % abs($a - $fp32))" 2>/dev/null || echo nan)
    echo "$name: mean $a% ($runs; fp32 $fp32%, difference $d points, bound 0.5)"
    python3 -c "import sys; sys.exit(0 if abs($a - $fp32) <= 0.5 else 1)" 2>/dev/null && ok ||
        no "$name's mean test accuracy $a% vs fp32's $fp32%: more than 0.5 points apart"
done
finish
