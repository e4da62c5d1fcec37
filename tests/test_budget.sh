#!/usr/bin/env bash
# test_budget.sh — the budget as one accounting (budget.c) seen from the CLI:
# a model larger than the budget refused before its parameters are
# allocated, `estimate` and `plan` of a model far larger than the machine
# (nothing of it allocated), --threads reaching the plan, --batch auto
# searching the whole footprint, and `plan` without its data saying what it
# assumed. Byte counts are derived by hand from the shapes.
source "$(dirname "$0")/lib.sh"
run() { "$@" >"$tmp/out" 2>"$tmp/err"; }
# capped KB cmd...: run with at most KB of address space (not under the
# sanitizers, whose shadow memory needs terabytes of it: there the messages
# and byte counts are still checked).
capped() {
    local kb=$1
    shift
    if [ -n "${FR_SANITIZED:-}" ]; then "$@"; else (ulimit -v "$kb"; "$@"); fi
}

# A 3 GB Linear: 784 -> 1,000,000 -> 10. Tensors: 784e6 + 1e6 + 10e6 + 10
# floats = 795,000,010 * 4 = 3,180,000,040 bytes. With 1 GB of address space
# an attempt to allocate them fails loudly ("the system refused"); the
# budget must refuse first.
printf 'input 784\nlinear 1000000\nlinear 10\n' >"$tmp/big.model"
for cmd in train plan; do
    extra=(); [ $cmd = train ] && extra=(--epochs 1 --no-progress)
    capped 1000000 "$bin" $cmd --model "$tmp/big.model" --data "$data" --batch 8 --limit 256 \
        "${extra[@]}" --budget 64MiB >"$tmp/out" 2>"$tmp/err"
    rc=$?
    [ $rc -eq 1 ] && grep -q "cannot hold the model: its parameters alone take 3.0 GiB (3180000040 bytes of tensors)" "$tmp/err" &&
        grep -q "nothing was allocated" "$tmp/err" && ! grep -q "refused" "$tmp/err" && ok ||
        no "$cmd: a 3 GB model under a 64 MiB budget is refused before allocating (rc $rc): $(cat "$tmp/err")"
done

# Two wide layers: 784 -> 100,000 -> 20,000 -> 10 (SGD, batch 1):
# (784*100000 + 100000) + (100000*20000 + 20000) + (20000*10 + 10)
# = 78,500,000 + 2,000,020,000 + 200,010 = 2,078,720,010 floats
# = 8,314,880,040 bytes, under 2 GB of address space.
printf 'input 784\nlinear 100000\nrelu\nlinear 20000\nrelu\nlinear 10\n' >"$tmp/huge.model"
capped 2000000 "$bin" estimate --model "$tmp/huge.model" --batch 1 --optimizer sgd --json >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['trainable_param_bytes'] == 8314880040, d['trainable_param_bytes']
assert d['predicted_peak']['parameters'] == 8314880040, d['predicted_peak']
" "$tmp/out" && ok || no "estimate of an 8.3 GB model in 2 GB: $(cat "$tmp/err") $(head -c 300 "$tmp/out")"
capped 2000000 "$bin" plan --model "$tmp/huge.model" --batch 1 --optimizer sgd --json >"$tmp/out" 2>"$tmp/err"
[ $? -eq 0 ] && python3 -c "
import json, sys
d = json.load(open(sys.argv[1]))
assert d['predicted_peak']['parameters'] == 8314880040, d['predicted_peak']
" "$tmp/out" && ok || no "plan of an 8.3 GB model in 2 GB: $(cat "$tmp/err") $(head -c 300 "$tmp/out")"

# --threads reaches the plan: plain SGD updates Linear weights inside
# backward through one scratch tile per thread, the tiles balanced over the
# threads (linear.c). The MLP at batch 32: fc1 (2000 x 1000) takes tiles of
# 16 rows (FR_UPD_TILE / 1000), 125 of them, 126 on 2 threads (16 rows);
# fc2 (10 x 2000) one tile of 10 rows, two of 5 on 2 threads. The largest
# tile times the threads: 1 thread 10 x 2000 floats = 80000 B; 2 threads
# 2 x 16 x 1000 floats = 128000 B.
for cmd in plan estimate; do
    for t in 1 2; do
        run "$bin" $cmd --model mlp --batch 32 --optimizer sgd --threads $t --json
        cp "$tmp/out" "$tmp/$cmd$t.json"
    done
    python3 -c "
import json, sys
a, b = (json.load(open(f))['predicted_peak']['gradients'] for f in sys.argv[1:])
assert a == 80000 and b == 128000, (a, b)
" "$tmp/${cmd}1.json" "$tmp/${cmd}2.json" && ok || no "$cmd --threads 1 and 2: scratch tiles $(cat "$tmp/err")"
done

if [ -d "$data" ]; then
    # --batch auto on a small MLP (784-64-10): the largest batch whose whole
    # footprint fits 256 MiB. It trains within it, and one more sample
    # (a whole-batch plan of batch + 1) does not fit.
    printf 'input 784\nlinear 64\nrelu\nlinear 10\n' >"$tmp/mlp64.model"
    common=(--model "$tmp/mlp64.model" --data "$data" --limit 20000 --test-limit 64 --threads 1)
    run "$bin" train "${common[@]}" --epochs 1 --json --batch auto --budget 256MiB
    if [ $? -eq 0 ]; then
        b=$(python3 -c "
import json, sys
s = [json.loads(l) for l in open(sys.argv[1])][-1]
# the loader's queue alone holds 3 batches of 784 floats and a label each
assert 1000 < s['batch'] <= (256 << 20) // (3 * 3140) and s['measured_reserved_peak'] <= 256 << 20, s
print(s['batch'])" "$tmp/out") && ok || no "batch auto on the MLP: $(tail -1 "$tmp/out")"
        run "$bin" plan "${common[@]}" --batch $((b + 1)) --micro-batch $((b + 1)) --budget 256MiB
        [ $? -eq 1 ] && ok || no "a whole batch of $((b + 1)) fits 256 MiB too: batch auto stopped short"
        run "$bin" plan "${common[@]}" --batch auto --budget 256MiB --json
        python3 -c "import json,sys; assert json.load(open(sys.argv[1]))['batch'] == $b" "$tmp/out" && ok ||
            no "plan --batch auto chooses what train chose ($b): $(cat "$tmp/err")"
    else
        no "train --batch auto --budget 256MiB on a small MLP: $(cat "$tmp/err")"
    fi
fi

# Without its data, plan still plans and says what it assumed.
run "$bin" plan --model cnn --batch 64 --budget 16MiB --data "$tmp/nowhere"
[ $? -eq 0 ] && grep -q "counting the data as Fashion-MNIST would take" "$tmp/err" && grep -q "datasets" "$tmp/out" && ok ||
    no "plan without data: $(cat "$tmp/err")"

finish
