#!/usr/bin/env bash
# gpt.sh — the GPT benchmark: frugal against PyTorch 1.13 (nanoGPT's model,
# bench/torch_gpt.py) on gpt-tiny (6 layers, 6 heads, d 384, T 256, bytes,
# batch 8, AdamW lr 3e-4 wd 0.1), both on the same text, in one run:
#
# 1. gpt-tiny, ROUNDS rounds in fresh processes, the engines alternating
#    (A B, B A, A B, ...): step time, process peak RSS, and the bytes held for
#    backward (PyTorch: what saved_tensors_hooks packs in one forward;
#    frugal: the activations category's peak, memory.allocated_peak.activations
#    of its --json summary, from one more run); the ratios against the goals (time <= 0.8,
#    RSS <= 0.25, held <= 0.3), and PyTorch's GEMM share of a profiled step;
# 2. the context sweep, T = 256, 512, 1024, 2048 at B x T = 2048 tokens, the
#    engines alternating per T;
# 3. GPT-2 124M under --budget 4G (frugal only): estimate, plan, one real
#    step, the predicted and the measured peak side by side.
#
# It writes OUT/gpt_runs.jsonl (every run's output), OUT/gpt.json,
# OUT/gpt.md (the tables, also printed) and OUT/gpt_context.svg (held bytes
# against T, bench/gpt_chart.py). Not part of the test suite.
#
#   bench/gpt.sh                  # both engines
#   bench/gpt.sh --torch-only     # the PyTorch side alone (parts 1 and 2)
#   ROUNDS=4 STEPS=10 bench/gpt.sh
#
# Environment: ROUNDS [2] (gpt-tiny runs per engine), STEPS [8] (timed steps
# per run, after WARMUP [2]), SWEEP [256 512 1024 2048], TOKENS [2048],
# SWEEP_STEPS [2] (after 1 warm-up), THREADS [2], BUILD [/tmp/build-gpt],
# OUT [bench/out], DATA [the fortunes in /usr/share/games/fortunes joined into
# one file, /tmp/frugal-gpt-fortunes.txt], PARTS [tiny sweep gpt2] (which
# parts run), FRUGAL_ARGS [none] (more options for frugal's gpt-tiny and
# sweep runs, e.g. "--budget 236MiB"), OMP_WAIT_POLICY [passive] (idle OpenMP threads sleep instead of spinning,
# which on this shared 2-core machine made steps scatter several-fold).
# About 3 minutes for the PyTorch side on 2 quiet cores.
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_ONLY=0
for a in "$@"; do
    case $a in
        --torch-only) TORCH_ONLY=1 ;;
        -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "gpt.sh: unknown argument '$a' (--torch-only, --help)" >&2; exit 2 ;;
    esac
done
ROUNDS=${ROUNDS:-2}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-2}
SWEEP=${SWEEP:-256 512 1024 2048}
TOKENS=${TOKENS:-2048}
SWEEP_STEPS=${SWEEP_STEPS:-2}
THREADS=${THREADS:-2}
BUILD=${BUILD:-/tmp/build-gpt}
OUT=${OUT:-bench/out}
PARTS=${PARTS:-tiny sweep gpt2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
PY=/usr/bin/python3
OPENBLAS_OMP=/usr/lib/x86_64-linux-gnu/openblas-openmp

if ! "$PY" -c 'import torch' 2>/dev/null || [ ! -e "$OPENBLAS_OMP/libblas.so.3" ]; then
    echo "gpt.sh: needs Debian's python3-torch and libopenblas0-openmp ($OPENBLAS_OMP)" >&2
    exit 1
fi
if [ -z "${DATA:-}" ]; then
    DATA=/tmp/frugal-gpt-fortunes.txt
    if [ ! -s "$DATA" ]; then
        [ -d /usr/share/games/fortunes ] || {
            echo "gpt.sh: no DATA and no /usr/share/games/fortunes (apt-get install fortunes)" >&2
            exit 1
        }
        # the text files only, in a fixed order (fortune's .dat/.u8 are indexes)
        find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
            xargs -0 cat >"$DATA.tmp"
        mv "$DATA.tmp" "$DATA"
    fi
fi
mkdir -p "$OUT"
RUNS=$OUT/gpt_runs.jsonl

if [ "$TORCH_ONLY" = 0 ]; then
    cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
    cmake --build "$BUILD" -j"$(nproc)" --target frugal_cli >/dev/null
fi
FRUGAL=$BUILD/frugal

# Each run appends one line: {"part", "impl", "round", "seq", "batch", "steps", "rc", "lines": [...],
# "stderr": [...]}: the command's stdout lines (frugal's JSON events, or torch_gpt.py's object) and
# the last 5 lines of its stderr (the error of a failed run).
ERR=$(mktemp)
MODELS=$(mktemp -d)
trap 'rm -rf "$ERR" "$MODELS"' EXIT
record() { # part impl round seq batch steps -- command...
    local part=$1 impl=$2 round=$3 seq=$4 batch=$5 steps=$6 out rc=0
    shift 7
    echo "gpt.sh: $part $impl T $seq B $batch (round $round)" >&2
    out=$("$@" 2>"$ERR") || rc=$?
    [ "$rc" = 0 ] || echo "gpt.sh: $part $impl T $seq failed (exit $rc): $(head -n 1 "$ERR")" >&2
    printf '%s' "$out" | "$PY" -c '
import json, sys
part, impl, rnd, seq, batch, steps, rc, err = sys.argv[1:]
lines = [l for l in sys.stdin.read().splitlines() if l.strip()]
with open(err, errors="replace") as f:
    stderr = [l.rstrip() for l in f if l.strip()][-5:]
print(json.dumps({"part": part, "impl": impl, "round": int(rnd), "seq": int(seq), "batch": int(batch),
                  "steps": int(steps), "rc": int(rc), "lines": lines, "stderr": stderr}))' \
        "$part" "$impl" "$round" "$seq" "$batch" "$steps" "$rc" "$ERR" >>"$RUNS"
}
run_torch() { # seq batch steps warmup [extra...]
    local seq=$1 batch=$2 steps=$3 warmup=$4
    shift 4
    OMP_NUM_THREADS=$THREADS LD_LIBRARY_PATH="$OPENBLAS_OMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$PY" bench/torch_gpt.py --data "$DATA" --ctx "$seq" --batch "$batch" --steps "$steps" \
        --warmup "$warmup" --threads "$THREADS" --json "$@"
}
# frugal's --json prints no per-step times, so the timed runs are in text mode: its log lines (one
# per step up to 10 steps) carry the running mean ms/step, from which gpt_report.py takes each
# step's time, and its memory summary the activations peak and the process peak RSS (to 0.1 MiB);
# one --json run of gpt-tiny gives the exact bytes. --test-limit 8: the closing evaluation is one
# batch.
# gpt-tiny's context is 256 positions; a longer T gets a copy of its model file with `input tokens
# T` and a position table of T rows, as torch_gpt.py sizes wpe by --ctx.
model_for() { # seq
    [ "$1" -le 256 ] && { echo gpt-tiny; return; }
    sed -e "s/^input tokens 256\b/input tokens $1/" -e "s/^pos_embedding 256\b/pos_embedding $1/" \
        models/gpt-tiny.model >"$MODELS/gpt-tiny-$1.model"
    echo "$MODELS/gpt-tiny-$1.model"
}
run_frugal() { # seq batch steps warmup [--json]: frugal runs warmup + steps steps
    local seq=$1 batch=$2 steps=$(($3 + $4))
    shift 4
    # shellcheck disable=SC2086 # FRUGAL_ARGS: split into its words
    OMP_NUM_THREADS=$THREADS "$FRUGAL" train --model "$(model_for "$seq")" --data "$DATA" --seq "$seq" \
        --batch "$batch" --steps "$steps" --optimizer adamw --lr 3e-4 --weight-decay 0.1 \
        --threads "$THREADS" --test-limit 8 ${FRUGAL_ARGS:-} "$@" 2>&1
}

started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- src include models tools 2>/dev/null)" ] && commit="$commit+dirty"
engines="frugal torch"
[ "$TORCH_ONLY" = 1 ] && engines="torch"
: >"$RUNS"
t0=$SECONDS

has() { [[ " $PARTS " == *" $1 "* ]]; }

# 1. gpt-tiny, alternating
for ((r = 1; r <= ROUNDS; r++)); do
    has tiny || break
    order=$engines
    [ $((r % 2)) = 0 ] && order=$(echo "$engines" | tr ' ' '\n' | tac | tr '\n' ' ')
    for impl in $order; do
        extra=()
        [ "$impl" = torch ] && [ "$r" -le 2 ] && extra=(--gemm-share)
        record tiny "$impl" "$r" 256 8 "$STEPS" -- "run_$impl" 256 8 "$STEPS" "$WARMUP" "${extra[@]}"
    done
done

# frugal's exact bytes for gpt-tiny (its plan does not change from step to step)
has tiny && [ "$TORCH_ONLY" = 0 ] && record tiny-json frugal 1 256 8 1 -- run_frugal 256 8 1 0 --json

# 2. the context sweep at B x T = TOKENS, alternating per T
i=0
for t in $SWEEP; do
    has sweep || break
    order=$engines
    [ $((i % 2)) = 1 ] && order=$(echo "$engines" | tr ' ' '\n' | tac | tr '\n' ' ')
    for impl in $order; do
        record sweep "$impl" 1 "$t" $((TOKENS / t)) "$SWEEP_STEPS" -- \
            "run_$impl" "$t" $((TOKENS / t)) "$SWEEP_STEPS" 1
    done
    i=$((i + 1))
done

# 3. GPT-2 124M under 4 GiB (frugal only)
if [ "$TORCH_ONLY" = 0 ] && has gpt2; then
    g2=(--model gpt2 --batch 4 --seq 1024 --optimizer adamw)
    record gpt2-estimate frugal 1 1024 4 0 -- "$FRUGAL" estimate "${g2[@]}" --json
    record gpt2-plan frugal 1 1024 4 0 -- "$FRUGAL" plan "${g2[@]}" --budget 4G --json
    record gpt2-train frugal 1 1024 4 1 -- env OMP_NUM_THREADS="$THREADS" "$FRUGAL" train "${g2[@]}" \
        --data "$DATA" --steps 1 --budget 4G --lr 3e-4 --weight-decay 0.1 --threads "$THREADS" --test-limit 4 --json
fi

{
    echo "# GPT benchmark: frugal against PyTorch $("$PY" -c 'import torch; print(torch.__version__)')"
    echo
    echo "$started, commit $commit, $THREADS threads on $(nproc) cores, OMP_WAIT_POLICY=$OMP_WAIT_POLICY;" \
        "load average $load_start at the start, $(cut -d' ' -f1-3 /proc/loadavg) at the end;" \
        "$((SECONDS - t0)) s; data $DATA ($(stat -c %s "$DATA") bytes)${FRUGAL_ARGS:+; the frugal runs with $FRUGAL_ARGS}."
    echo
    "$PY" bench/gpt_report.py --runs "$RUNS" --warmup "$WARMUP" --json-out "$OUT/gpt.json"
} | tee "$OUT/gpt.md"
"$PY" bench/gpt_chart.py "$OUT/gpt.json" "$OUT/gpt_context.svg"
echo "gpt.sh: wrote $OUT/gpt.md, $OUT/gpt.json, $OUT/gpt_context.svg ($RUNS: every run)" >&2
