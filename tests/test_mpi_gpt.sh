#!/usr/bin/env bash
# test_mpi_gpt.sh — a language model under `mpirun -np N frugal train`
# (data parallel, ZeRO stages 0 and 3) against one process with the same global
# batch: the small byte GPT (tests/data/small_gpt.model, no dropout) on a
# generated text, --seq 32, global batch 8, 10 steps of Adam, validation
# every 5 steps; on 2 ranks (slices of 4 windows) and 3 (slices of 2, 3
# and 3, so the sums must weight the ranks by their windows). Checked: the
# training and validation losses and bits per byte of every eval line, and
# every weight of the saved checkpoints, within the bound below; two 2-rank
# runs bit-identical (checkpoint and losses); each rank's data bytes are its
# slice's, not the global batch's (the batch slots of the loaders hold
# ceil(B/N) windows: less data per rank than one process holds); a rank
# started with another --seq refused on every rank. Skipped
# (77) without mpirun or an MPI build. python3 (no numpy) reads the JSON
# and the checkpoints.
#
# The bound (test_mpi.sh's, with the token model's terms): one process sums
# a gradient element over the B*T token positions of a batch, N ranks sum
# each slice's, then the slices: the same B*T terms in another order, each
# float sum within (B*T-1)*u*sum|terms| of the exact one (u = 2^-24). With
# the amplification A = 100 over the S = 10 steps, per loss
#     |L_N - L_1| <= S * 2*(B*T-1)*u * A * L     (B*T = 256: 3.0e-2 * L)
# and per weight the same factor times the tensor's largest |w|. (Measured
# here: at most 5e-8 relative on the losses; a rank's slice missing or
# counted twice, or the evaluation averaged per rank instead of per token,
# moves the losses by 1e-3 to 1e-1.)
source "$(dirname "$0")/lib.sh"
source "$(dirname "$0")/mpi_lib.sh"

cp "$src/tests/data/small_gpt.model" "$tmp/g.model" # 2 layers, context 32, d 32
# A text that is not one sentence repeated, so that every window differs.
python3 - "$tmp/text.txt" <<'PY'
import sys
words = "the quick brown fox jumps over lazy dog a frugal engine counts every byte".split()
out, x = [], 12345
for i in range(6000):
    x = (1103515245 * x + 12345) % 2**31
    out.append(words[x % len(words)])
    if x % 11 == 0:
        out.append(".\n")
open(sys.argv[1], "w").write(" ".join(out))
PY

cat >"$tmp/j.py" <<'PY'
import json, sys
from st_tools import run  # weights, field
def lines(path):
    return [json.loads(l) for l in open(path) if l.startswith("{")]
cmd = sys.argv[1]
if cmd == "losses":  # losses ONE N REL: every eval line's losses within REL
    a, b, rel = lines(sys.argv[2]), lines(sys.argv[3]), float(sys.argv[4])
    ea = [e for e in a if e["event"] == "eval"]
    eb = [e for e in b if e["event"] == "eval"]
    assert len(ea) == len(eb) == 2, (len(ea), len(eb))
    for x, y in zip(ea, eb):
        assert x["step"] == y["step"], (x["step"], y["step"])
        for f in ("train_loss", "val_loss", "val_bits_per_byte"):
            assert abs(x[f] - y[f]) <= rel * abs(x[f]), (x["step"], f, x[f], y[f], rel)
    sa = [e for e in a if e["event"] == "summary"][0]
    sb = [e for e in b if e["event"] == "summary"][0]
    assert sa["steps"] == sb["steps"] == 10, (sa["steps"], sb["steps"])
    assert sb["batch"] == 8, sb["batch"]
    assert abs(sa["test_acc"] - sb["test_acc"]) <= 1e-6, (sa["test_acc"], sb["test_acc"])
else:
    run(sys.argv)
PY
j() { PYTHONPATH="$src/tests" python3 "$tmp/j.py" "$@"; }
# S * 2*(B*T-1) * u * A with S = 10, B*T = 8*32, u = 2^-24, A = 100
REL=$(python3 -c 'print(10 * 2 * (8 * 32 - 1) * 2.0**-24 * 100)')

common=(train --model "$tmp/g.model" --data "$tmp/text.txt" --seq 32 --batch 8 --steps 10
    --eval-interval 5 --test-limit 24 --optimizer adam --lr 3e-3 --threads 1 --json)

if "$bin" "${common[@]}" --save "$tmp/one.st" >"$tmp/one.json" 2>"$tmp/err"; then ok; else
    no "one process: $(head -3 "$tmp/err")"
fi
for n in 2 3; do
    if ! mpi $n "$bin" "${common[@]}" --save "$tmp/r$n.st" >"$tmp/r$n.json" 2>"$tmp/err"; then
        no "$n ranks: $(head -5 "$tmp/err")"
        continue
    fi
    if msg=$(j losses "$tmp/one.json" "$tmp/r$n.json" "$REL" 2>&1); then ok; else
        no "$n ranks, losses: $(echo "$msg" | tail -1)"
    fi
    if msg=$(j weights "$tmp/one.st" "$tmp/r$n.st" "$REL" 2>&1); then ok; else
        no "$n ranks, weights: $(echo "$msg" | tail -1)"
    fi
    [ "$(j field "$tmp/r$n.json" summary ranks)" = $n ] && ok || no "$n ranks: ranks in JSON"
    # each rank reads its slice: its data peak below the one process's
    one=$(j field "$tmp/one.json" summary memory.allocated_peak.data)
    hi=$(j field "$tmp/r$n.json" summary rank_peaks.data.max)
    [ "$hi" -lt "$one" ] && ok || no "$n ranks: a rank's data peak $hi, one process's $one"
done

# ---- ZeRO 3 (weights, gradients and AdamW state sharded; each unit's
# weights gathered for its forward and its backward, the tied embedding
# held from the first forward use to the last backward one): the same
# losses and weights within the bound (sharding changes no arithmetic:
# the sums are stage 0's), and each rank's measured peaks of weights,
# gradients and optimizer state equal `estimate --ranks N --zero 3`'s
# prediction for the same run (the same walks over the same plan)
for n in 2 3; do
    if ! mpi $n "$bin" "${common[@]}" --zero 3 --save "$tmp/z$n.st" >"$tmp/z$n.json" 2>"$tmp/err"; then
        no "$n ranks at --zero 3: $(head -5 "$tmp/err")"
        continue
    fi
    if msg=$(j losses "$tmp/one.json" "$tmp/z$n.json" "$REL" 2>&1); then ok; else
        no "$n ranks at --zero 3, losses: $(echo "$msg" | tail -1)"
    fi
    if msg=$(j weights "$tmp/one.st" "$tmp/z$n.st" "$REL" 2>&1); then ok; else
        no "$n ranks at --zero 3, weights: $(echo "$msg" | tail -1)"
    fi
    "$bin" estimate --model "$tmp/g.model" --seq 32 --batch 8 --ranks $n --zero 3 \
        --optimizer adam --json >"$tmp/est.json" 2>"$tmp/err" || no "estimate: $(head -2 "$tmp/err")"
    want=$(cat "$tmp/est.json" | python3 -c 'import json, sys
s = json.loads(sys.stdin.read())["stages"][0]
print(s["parameters"], s["gradients"] + s["buckets"], s["optimizer"])')
    got=""
    for cat in parameters gradients optimizer; do
        got="$got $(j field "$tmp/z$n.json" summary "rank_peaks.$cat.max")"
    done
    [ "${got# }" = "$want" ] && ok || no "$n ranks at --zero 3: per-rank peaks '${got# }', predicted '$want'"
done

# ---- the same N twice: the same bits
if mpi 2 "$bin" "${common[@]}" --save "$tmp/again.st" >"$tmp/again.json" 2>"$tmp/err" &&
    cmp -s "$tmp/r2.st" "$tmp/again.st"; then ok; else no "two 2-rank runs: checkpoints differ"; fi
evals() { grep '"eval"' "$1" | sed 's/"seconds": [0-9.]*//'; }
[ "$(evals "$tmp/r2.json")" = "$(evals "$tmp/again.json")" ] && ok ||
    no "two 2-rank runs: different losses"

# ---- ranks that disagree on the window: one given another --seq, refused on all
ASAN_OPTIONS=$mpi_asan command mpirun --oversubscribe -np 1 "$bin" "${common[@]}" : \
    -np 1 "$bin" "${common[@]}" --seq 16 >"$tmp/out" 2>"$tmp/err"
rc=$?
if [ $rc -ne 0 ] && grep -q "ranks disagree on the data .*seq 32.*seq 16" "$tmp/err"; then ok; else
    no "--seq mismatch: exit $rc, $(grep -m2 frugal "$tmp/err")"
fi
finish
