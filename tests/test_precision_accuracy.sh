#!/usr/bin/env bash
# test_precision_accuracy.sh — issue 4's accuracy acceptance, on the real
# data: the built-in CNN trained for one epoch (batch 128, Adam, 2 threads)
# on the first 30,000 of Fashion-MNIST's training images in fp32,
# bf16-mixed and fp16-mixed, and with int8 Adam state; each one's test
# accuracy on all 10,000 test images must be within 0.5 points of fp32's
# with the same seeds, both as the mean over the seeds 0 to 2.
#
# Why a mean: one run's accuracy is one draw. Two runs of the same
# arithmetic that round differently (another OpenBLAS kernel, another
# precision) train two models that disagree on some of the test images:
# at seed 0 on 12,000 images fp32 gave 82.45% on OpenBLAS's Cooperlake
# kernels and 82.73% on its Prescott ones (AMD EPYC). The paired
# differences (the same seed in both precisions) had a standard deviation
# of about 0.25 points at 60,000 images and 2 epochs, and of 0.43 at
# 12,000 images (12 pairs): fewer images, less settled models, more
# disagreement. At 20,000 images int8 Adam state came out 0.89 points above
# fp32 in the mean of four seeds (84.95% against 85.83%, every seed higher:
# the models of one short epoch are not settled); at 30,000 the three
# paired differences were +0.21, +0.20 and +0.05 (fp32 87.45, 87.35, 87.37%).
#
# Why 30,000 images: the cost is the images trained on. All 60,000 in 12
# runs took 1,483 s on an Intel Xeon whose OpenBLAS picks its slow
# Prescott kernels; 12 runs of 30,000 are half of that work. The verdict
# depends on the bits, never on the time: each run is deterministic (same
# seed and threads, same bits), so on one host the verdict is too. Skipped
# under the sanitizers, whose build is ten times slower (the code paths are
# exercised there by test_precision and test_optim_state).
source "$(dirname "$0")/lib.sh"
if [ -n "${FR_SANITIZED:-}" ]; then
    echo "skipped under the sanitizers (12 one-epoch runs of the CNN)"
    echo "0 passed, 0 failed"
    exit 0
fi
seeds=(0 1 2)
common=(--model cnn --data "$data" --limit 30000 --epochs 1 --batch 128 --optimizer adam
        --threads 2 --no-progress --json)
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
