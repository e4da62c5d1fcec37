#!/usr/bin/env bash
# test_mpi_zero.sh — `mpirun -np N frugal train --zero 1|2|3` (optimizer
# state sharded; at 2, gradients too; at 3, weights too) against one process with the same
# global batch: the MLP of test_mpi.sh, 10 steps of SGD with momentum, Adam
# and AdamW, on 2 and 3 ranks. Losses, weights and the optimizer state of
# the checkpoint (gathered from the shards) within test_mpi.sh's bound,
# T*2(B-1)*u*100 of each tensor's scale (the sums are the same B terms in
# another order; the update is elementwise, so sharding it changes no
# arithmetic); two runs bit-identical; per-rank bytes measured, predicted
# by `frugal estimate --ranks N --zero K` and ZeRO's formulas by hand
# (E = 52650 trainable floats, P = G = 4E, each rank's shard ceil(E/N)
# elements: optimizer state 4*states*ceil(E/N); gradients G at stage 1,
# one bucket (here all of G: DDP's first cap, 1 MiB, holds it) at stages
# 2 and 3, where each bucket's share takes its step as its sums arrive
# (with --keep-grads G/N + the bucket, the same bits); weights P below stage 3, at 3 the shard 4*ceil(E/N) plus
# the gathered blocks at the step's worst position: fc1's (200960 B) while
# fc2's (8320 B) is prefetched — the walk, unit by unit: forward holds fc1
# with fc2 prefetched, then fc2 with fc3, fc3 stays into backward (its
# backward gather would start while its forward block is held), then fc3
# with fc2, fc2 with fc1, fc1 alone: the worst is fc1 + fc2); a checkpoint saved by 3
# ranks at stage 1 resumed on 2 (stages 1, 2 and 3) and on 1, and one saved
# at stage 3 resumed on 2 at stage 3 and on 1, with an
# uninterrupted run's losses; bf16 Adam state at each stage (int8's blocks
# refused); accumulation, clipping and the dynamic loss scaler composed with
# several buckets (a shard crossing buckets) at each stage. Skipped (77) without mpirun or an MPI build.
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"
[ -d "$data" ] || { echo "no dataset at $data: skipping"; exit 77; }

cp "$(dirname "$0")/data/mlp3.model" "$tmp/m.model" # 784-64-32-10, no BatchNorm
E=$((784 * 64 + 64 + 64 * 32 + 32 + 32 * 10 + 10))
P=$((E * 4))
fc1=$(((784 * 64 + 64) * 4)) fc2=$(((64 * 32 + 32) * 4))

cat >"$tmp/st.py" <<'PY'
import json, sys
from st_tools import run  # tensors, field, close
if sys.argv[1] == "stage":  # estimate-json zero: parameters, gradients+buckets, optimizer
    d = json.loads(open(sys.argv[2]).read())  # one document
    s = [s for s in d["stages"] if s["zero"] == int(sys.argv[3])][0]
    print(s["parameters"], s["gradients"] + s["buckets"], s["optimizer"])
else:
    run(sys.argv)
PY
st() { PYTHONPATH="$src/tests" python3 "$tmp/st.py" "$@"; }
resumed() { # saved ranks zero straight what args...: the checkpoint saved.st resumed on
    # `ranks` (1: one process; else at --zero `zero`) with args, its losses within REL of
    # the uninterrupted run straight.json's
    local saved=$1 n=$2 z=$3 straight=$4 what=$5 f a b msg
    shift 5
    cp "$tmp/$saved.st" "$tmp/r.st"
    if [ "$n" = 1 ]; then
        "$bin" "${common[@]}" "$@" --resume "$tmp/r.st" >"$tmp/res.json" 2>"$tmp/err"
    else
        mpi "$n" "$bin" "${common[@]}" "$@" --zero "$z" --resume "$tmp/r.st" >"$tmp/res.json" 2>"$tmp/err"
    fi || no "$what resumed on $n at --zero $z: $(head -3 "$tmp/err")"
    for f in train_loss test_loss; do
        a=$(st field "$tmp/$straight.json" epoch $f) b=$(st field "$tmp/res.json" epoch $f)
        if msg=$(st close "$a" "$b" "$REL" 2>&1); then ok; else no "$what resumed on $n at --zero $z, $f: $msg"; fi
    done
}
like_one() { # one run: run's losses and checkpoint (weights, the gathered optimizer
    # state; names and layouts a single process's) within REL of the one process's
    local one=$1 run=$2 f a b msg
    for f in train_loss test_loss; do
        a=$(st field "$tmp/$one.json" epoch $f) b=$(st field "$tmp/$run.json" epoch $f)
        if msg=$(st close "$a" "$b" "$REL" 2>&1); then ok; else no "$run $f: $msg"; fi
    done
    if msg=$(st tensors "$tmp/$one.st" "$tmp/$run.st" "$REL" 2>&1); then ok; else
        no "$run checkpoint: $msg"
    fi
}
REL=$(python3 -c 'print(10 * 2 * 63 * 2.0**-24 * 100)')
common=(train --model "$tmp/m.model" --data "$data" --epochs 1 --batch 64 --limit 640
    --test-limit 200 --threads 1 --json)

# ---- N ranks at stages 1 and 2 against one process; bytes per rank
for opt in "sgd --momentum 0.9 --lr 0.05" "adam" "adamw"; do
    tag=${opt%% *}
    states=$([ "$tag" = sgd ] && echo 1 || echo 2)
    # shellcheck disable=SC2086
    if ! "$bin" "${common[@]}" --optimizer $opt --save "$tmp/$tag.1.st" >"$tmp/$tag.1.json" 2>"$tmp/err"; then
        no "$tag, one process: $(head -3 "$tmp/err")"
        continue
    fi
    for n in 2 3; do
        c=$(((E + n - 1) / n)) # the shard: ceil(E/N) elements
        # shellcheck disable=SC2086
        "$bin" estimate --model "$tmp/m.model" --batch 64 --ranks $n --optimizer ${opt% --lr*} --json \
            >"$tmp/est.json" 2>"$tmp/err" || no "estimate --ranks $n: $(head -2 "$tmp/err")"
        for z in 1 2 3; do
            run=$tag.$n.z$z
            # shellcheck disable=SC2086
            if ! mpi $n "$bin" "${common[@]}" --optimizer $opt --zero $z --save "$tmp/$run.st" \
                >"$tmp/$run.json" 2>"$tmp/err"; then
                no "$run: $(head -5 "$tmp/err")"
                continue
            fi
            like_one "$tag.1" "$run"
            [ "$(st field "$tmp/$run.json" summary steps)" = 10 ] && ok || no "$run: not 10 steps"
            # ZeRO's formulas by hand
            g=$P # stage 1: G; 2 and 3: the one bucket, no shard (stepped as its sums arrive)
            w=$([ $z = 3 ] && echo $((4 * c + fc1 + fc2)) || echo $P)
            hand="$w $g $((4 * states * c))"
            [ "$(st stage "$tmp/est.json" $z)" = "$hand" ] && ok ||
                no "$run: estimate '$(st stage "$tmp/est.json" $z)', by hand '$hand'"
            set -- $hand
            for cat in parameters:$1 gradients:$2 optimizer:$3; do
                name=${cat%%:*} want=${cat#*:}
                hi=$(st field "$tmp/$run.json" summary "rank_peaks.$name.max")
                lo=$(st field "$tmp/$run.json" summary "rank_peaks.$name.min")
                # E is a multiple of 2 and 3: every rank's shard is c elements
                [ "$hi" = "$want" ] && [ "$lo" = "$want" ] && ok ||
                    no "$run: $name per rank min $lo max $hi, predicted $want"
            done
        done
    done
done

# ---- --keep-grads at stages 2 and 3: the gradient shard kept (G/N + the
# bucket), the update after backward: the same bits as the step inside
# backward of each bucket's share
n=3 c=$(((E + n - 1) / n))
for z in 2 3; do
    if mpi $n "$bin" "${common[@]}" --optimizer adam --zero $z --keep-grads --save "$tmp/kg.st" \
        >"$tmp/kg.json" 2>"$tmp/err"; then
        cmp -s "$tmp/kg.st" "$tmp/adam.$n.z$z.st" && ok ||
            no "--keep-grads at --zero $z: not the bits of the step inside backward"
        hi=$(st field "$tmp/kg.json" summary "rank_peaks.gradients.max")
        [ "$hi" = $((4 * c + P)) ] && ok || no "--keep-grads at --zero $z: gradients $hi, want $((4 * c + P))"
    else
        no "--keep-grads at --zero $z: $(head -3 "$tmp/err")"
    fi
done

# ---- the same run twice: the same bits
for z in 1 2 3; do
    if mpi 3 "$bin" "${common[@]}" --optimizer adam --zero $z --save "$tmp/again.st" \
        >"$tmp/again.json" 2>"$tmp/err" && cmp -s "$tmp/adam.3.z$z.st" "$tmp/again.st"; then
        ok
    else
        no "two 3-rank runs at --zero $z differ: $(head -2 "$tmp/err")"
    fi
done

# ---- a checkpoint of 3 ranks at stage 1 resumed on 2 (stages 1, 2, 3) and
# on 1; one of 3 ranks at stage 3 resumed on 2 at stage 3 and on 1
two=(--optimizer adam --epochs 2)
"$bin" "${common[@]}" "${two[@]}" >"$tmp/straight.json" 2>"$tmp/err" ||
    no "two epochs: $(head -3 "$tmp/err")"
for how in "2 1 1" "2 2 1" "2 3 1" "1 0 1" "2 3 3" "1 0 3"; do
    set -- $how
    resumed "adam.3.z$3" "$1" "$2" straight "stage $3" "${two[@]}"
done

# ---- bf16 Adam state (encoded element by element, so sharded at any
# element): N ranks at stages 1-3 against one process with bf16 state, the
# per-rank state 2 moments x 2 bytes x ceil(E/N) by hand and by estimate; a
# 3-rank checkpoint at stage 2 resumed on 2 at stage 1 and on 1 with the
# losses of an uninterrupted run; int8 state refused at stages 1-3
b16=(--optimizer adam --optimizer-state bf16)
"$bin" "${common[@]}" "${b16[@]}" --save "$tmp/b16.1.st" >"$tmp/b16.1.json" 2>"$tmp/err" ||
    no "bf16 state, one process: $(head -3 "$tmp/err")"
for n in 2 3; do
    c=$(((E + n - 1) / n))
    "$bin" estimate --model "$tmp/m.model" --batch 64 --ranks $n --optimizer adam \
        --optimizer-state bf16 --json >"$tmp/est.json" 2>"$tmp/err" || no "estimate bf16: $(head -2 "$tmp/err")"
    for z in 1 2 3; do
        run=b16.$n.z$z
        if ! mpi $n "$bin" "${common[@]}" "${b16[@]}" --zero $z --save "$tmp/$run.st" \
            >"$tmp/$run.json" 2>"$tmp/err"; then
            no "$run: $(head -5 "$tmp/err")"
            continue
        fi
        like_one b16.1 "$run"
        o=$(st field "$tmp/$run.json" summary "rank_peaks.optimizer.max")
        [ "$o" = $((2 * 2 * c)) ] && ok || no "$run: optimizer state per rank $o, by hand $((2 * 2 * c))"
        set -- $(st stage "$tmp/est.json" $z)
        [ "$3" = $((2 * 2 * c)) ] && ok || no "$run: estimate's optimizer state $3, by hand $((2 * 2 * c))"
    done
done
"$bin" "${common[@]}" "${b16[@]}" --epochs 2 >"$tmp/b16.straight.json" 2>"$tmp/err" ||
    no "bf16 state, two epochs: $(head -3 "$tmp/err")"
for how in "2 1" "1 0"; do
    set -- $how
    resumed b16.3.z2 "$1" "$2" b16.straight "bf16 state, stage 2" "${b16[@]}" --epochs 2
done
if mpi 2 "$bin" "${common[@]}" --optimizer adam --optimizer-state int8 --zero 1 >/dev/null 2>"$tmp/err"; then
    no "int8 state at --zero 1 was not refused"
else
    grep -q "int8 state is encoded by blocks of 2048 values" "$tmp/err" && ok ||
        no "int8 at --zero 1: $(head -3 "$tmp/err")"
fi

# ---- composed: accumulation, clipping (acting: the norm is above 0.5), the
# dynamic loss scaler, and buckets of 5 KB (shards crossing buckets)
opts=("${common[@]}" --test-limit 128 --optimizer sgd --momentum 0.9 --lr 0.05 --accumulate 2
    --clip-grad-norm 0.5 --loss-scale dynamic)
"$bin" "${opts[@]}" --save "$tmp/c1.st" >"$tmp/c1.json" 2>"$tmp/err" || no "composed, one process"
for z in 1 2 3; do
    mpi 3 "$bin" "${opts[@]}" --zero $z --bucket-cap-mb 0.005 --save "$tmp/c3.st" \
        >"$tmp/c3.json" 2>"$tmp/err" || no "composed at --zero $z: $(head -3 "$tmp/err")"
    grep -q '"buckets": [2-9]' "$tmp/c3.json" && ok || no "composed: not several buckets"
    if msg=$(st tensors "$tmp/c1.st" "$tmp/c3.st" "$REL" 2>&1); then ok; else no "composed --zero $z: $msg"; fi
    a=$(st field "$tmp/c1.json" epoch train_loss) b=$(st field "$tmp/c3.json" epoch train_loss)
    if msg=$(st close "$a" "$b" "$REL" 2>&1); then ok; else no "composed --zero $z loss: $msg"; fi
done

finish
