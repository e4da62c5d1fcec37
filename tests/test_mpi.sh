#!/usr/bin/env bash
# test_mpi.sh — `mpirun -np N frugal train` (data parallel, ZeRO stage 0)
# against one process with the same global batch: an MLP without BatchNorm
# or dropout, 10 steps of SGD with momentum, Adam and AdamW, on 2 and 3
# ranks; two runs with the same N bit-identical; a checkpoint saved by 3
# ranks resumed on 2 and on 1; per-rank bytes of parameters, gradients and
# optimizer state against their formula; a rank given another --batch
# (MPMD) refused on every rank; kill -9 of one rank ending the others with
# a message and the checkpoint intact. Skipped (77) without
# mpirun or without an MPI build. Needs Fashion-MNIST and python3 (no
# numpy: the checkpoints are read with struct).
#
# The bound. One process sums a gradient element over the B samples of a
# batch; N ranks sum each slice, then the slices: the same B terms in
# another order. Each float sum of B terms is within (B-1)*u*sum|terms| of
# the exact one (u = 2^-24, recursive summation; any order, so GEMM's
# blocking too), so per element |g_N - g_1| <= 2*(B-1)*u*sum|terms|, and the
# loss (B positive terms) |L_N - L_1| <= 2*(B-1)*u*L. The weights take that
# difference once per step (SGD: times lr; Adam: through its normalised
# step) and carry it on through later steps; we allow an amplification of
# A = 100 over the T = 10 steps and the terms' magnitudes at the scale of
# the tensor's largest weight: per element
#     |w_N - w_1| <= T * 2*(B-1)*u * A * max|w|  (B = 64: 7.5e-3 * max|w|)
# and per loss |L_N - L_1| <= T * 2*(B-1)*u * A * L. (Measured on this
# machine: 1.5e-8 for SGD, 3e-6 for Adam at lr 1e-3; a wrong loss share or a
# missing rank's slice moves SGD's weights by about lr * |g| ~ 1e-2.)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
if [ ! -d "$data" ]; then
    echo "no dataset at $data: skipping"
    exit 77
fi

cp "$(dirname "$0")/data/mlp3.model" "$tmp/m.model" # 784-64-32-10, no BatchNorm
# parameters: 784*64+64 + 64*32+32 + 32*10+10 floats
P=$(((784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10) * 4))

cat >"$tmp/st.py" <<'PY'
import sys
from st_tools import run  # weights, field, close
run(sys.argv)
PY
st() { PYTHONPATH="$src/tests" python3 "$tmp/st.py" "$@"; }
# T * 2*(B-1) * u * A with T = 10, B = 64, u = 2^-24, A = 100
REL=$(python3 -c 'print(10 * 2 * 63 * 2.0**-24 * 100)')

common=(train --model "$tmp/m.model" --data "$data" --epochs 1 --batch 64 --limit 640
    --test-limit 200 --threads 1 --json)
run1() { "$bin" "${common[@]}" "$@"; }
runN() {
    local n=$1
    shift
    mpi "$n" "$bin" "${common[@]}" "$@"
}

# ---- N ranks against one process: losses and weights within the bound
for opt in "sgd --momentum 0.9 --lr 0.05" "adam" "adamw"; do
    tag=${opt%% *}
    # shellcheck disable=SC2086
    if ! run1 --optimizer $opt --save "$tmp/$tag.1.st" >"$tmp/$tag.1.json" 2>"$tmp/err"; then
        no "$tag, one process: $(head -3 "$tmp/err")"
        continue
    fi
    for n in 2 3; do
        # shellcheck disable=SC2086
        if ! runN $n --optimizer $opt --save "$tmp/$tag.$n.st" >"$tmp/$tag.$n.json" 2>"$tmp/err"; then
            no "$tag, $n ranks: $(head -5 "$tmp/err")"
            continue
        fi
        for f in train_loss test_loss; do
            a=$(st field "$tmp/$tag.1.json" epoch $f) b=$(st field "$tmp/$tag.$n.json" epoch $f)
            if msg=$(st close "$a" "$b" "$REL" 2>&1); then ok; else no "$tag $n ranks $f: $msg"; fi
        done
        [ "$(st field "$tmp/$tag.$n.json" epoch samples)" = 640 ] && ok ||
            no "$tag $n ranks: not 640 samples an epoch"
        [ "$(st field "$tmp/$tag.$n.json" summary steps)" = 10 ] && ok ||
            no "$tag $n ranks: not 10 steps"
        if msg=$(st weights "$tmp/$tag.1.st" "$tmp/$tag.$n.st" "$REL" 2>&1); then ok; else
            no "$tag $n ranks weights: $msg"
        fi
        # per-rank bytes (stage 0: every rank the whole model): parameters
        # and gradients P each, optimizer state P (momentum) or 2P (Adam)
        states=$([ "$tag" = sgd ] && echo 1 || echo 2)
        for cat in parameters:$P gradients:$P optimizer:$((states * P)); do
            name=${cat%%:*} want=${cat#*:}
            lo=$(st field "$tmp/$tag.$n.json" summary "rank_peaks.$name.min")
            hi=$(st field "$tmp/$tag.$n.json" summary "rank_peaks.$name.max")
            [ "$lo" = "$want" ] && [ "$hi" = "$want" ] && ok ||
                no "$tag $n ranks: $name per rank min $lo max $hi, formula $want"
        done
        [ "$(st field "$tmp/$tag.$n.json" summary ranks)" = $n ] && ok || no "$tag: ranks in JSON"
    done
done

# ---- the same N twice: the same bits (checkpoint and losses)
if runN 2 --optimizer adam --save "$tmp/again.st" >"$tmp/again.json" 2>"$tmp/err" &&
    cmp -s "$tmp/adam.2.st" "$tmp/again.st"; then ok; else no "two 2-rank runs differ"; fi
[ "$(st field "$tmp/adam.2.json" epoch train_loss)" = "$(st field "$tmp/again.json" epoch train_loss)" ] &&
    ok || no "two 2-rank runs: different losses"

# ---- a checkpoint of 3 ranks resumed on 2 and on 1: the second epoch's
# losses those of an uninterrupted run (one process, two epochs)
two=(--optimizer adam --epochs 2)
if "$bin" "${common[@]}" "${two[@]}" >"$tmp/straight.json" 2>"$tmp/err"; then ok; else
    no "two epochs: $(head -3 "$tmp/err")"
fi
cp "$tmp/adam.3.st" "$tmp/r3.st"
for n in 2 1; do
    if [ $n = 1 ]; then
        run1 "${two[@]}" --resume "$tmp/r3.st" >"$tmp/res$n.json" 2>"$tmp/err"
    else
        runN $n "${two[@]}" --resume "$tmp/r3.st" >"$tmp/res$n.json" 2>"$tmp/err"
    fi || no "resume on $n: $(head -3 "$tmp/err")"
    for f in train_loss test_loss; do
        a=$(st field "$tmp/straight.json" epoch $f) b=$(st field "$tmp/res$n.json" epoch $f)
        if msg=$(st close "$a" "$b" "$REL" 2>&1); then ok; else no "resumed on $n, $f: $msg"; fi
    done
done

# ---- ranks that disagree: one given another --batch (MPMD), refused on all
mpirun --oversubscribe -np 1 "$bin" "${common[@]}" : -np 1 "$bin" "${common[@]}" --batch 32 \
    >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && grep -q "ranks disagree on --batch: rank 0 has '64', rank 1 has '32'" "$tmp/err"; then
    ok
else
    no "--batch mismatch: exit $rc, $(grep -m2 frugal "$tmp/err")"
fi

# ---- kill -9 of one rank: the other ends non-zero with a message, the
# checkpoint of the last finished epoch still whole. The waits are generous
# (ranks under ASan on a loaded 2-core host start slowly) and only guard
# against a hang: the checks are the exit code, the message and the checkpoint.
ASAN_OPTIONS=$mpi_asan command mpirun --oversubscribe -np 2 "$bin" train --model "$tmp/m.model" --data "$data" --epochs 1000 \
    --batch 64 --limit 640 --test-limit 64 --threads 1 --no-progress --save "$tmp/k.st" \
    >"$tmp/kout" 2>"$tmp/kerr" &
mp=$!
for _ in $(seq 1500); do [ -s "$tmp/k.st" ] && break; kill -0 $mp 2>/dev/null || break; sleep 0.2; done
sleep 0.5
victim=$(pgrep -P $mp | tail -1)
if [ ! -s "$tmp/k.st" ]; then
    kill $mp 2>/dev/null
    wait $mp
    no "kill -9: no checkpoint k.st appeared (waited up to 300 s; mpirun exited $?), no rank killed: $(head -3 "$tmp/kerr") $(tail -2 "$tmp/kout")"
elif [ -n "$victim" ]; then
    kill -9 "$victim"
    for _ in $(seq 600); do kill -0 $mp 2>/dev/null || break; sleep 0.2; done
    if kill -0 $mp 2>/dev/null; then
        no "kill -9: the job still runs after 120 s"
        kill -9 $mp
    fi
    wait $mp
    rc=$?
    if [ $rc -ne 0 ] && grep -q "stopped by a signal" "$tmp/kerr"; then
        ok
    else
        no "kill -9: exit $rc: $(grep -m2 frugal "$tmp/kerr")"
    fi
    ls "$tmp"/k.st.* >/dev/null 2>&1 && echo "(a save's temporary left: $(ls "$tmp"/k.st.*))"
    if "$bin" eval --model "$tmp/m.model" --data "$data" --weights "$tmp/k.st" --test-limit 64 \
        --batch 64 >/dev/null 2>"$tmp/err"; then ok; else
        no "checkpoint after kill -9: $(head -2 "$tmp/err")"
    fi
else
    kill $mp 2>/dev/null
    wait $mp
    no "kill -9: no rank found under mpirun $mp (it exited $?; k.st $([ -s "$tmp/k.st" ] && echo saved || echo missing)): $(head -3 "$tmp/kerr") $(tail -2 "$tmp/kout")"
fi
finish
