#!/usr/bin/env bash
# gemm_share.sh — how much of a GPT training step is GEMM, at d_model 768:
# GPT-2 124M (models/gpt2.model: 12 layers, 12 heads, d 768, vocabulary
# 50257), AdamW, batch 2 x T 512, THREADS threads, random tokens. Two
# `frugal profile` runs, of SHORT and LONG steps, each sampled by `perf
# record -e cpu-clock`; bench/gemm_share.py reads the difference (the extra
# steps alone). Writes OUT/gemm_share.md (also printed). Needs perf (Debian's
# linux-perf) able to record here. Not part of the test suite; about a
# minute and a half on 2 cores.
#
# Environment: MODEL [gpt2], BATCH [2], SEQ [512], SHORT [2], LONG [5],
# THREADS [2], HZ [997], BUILD [/tmp/build-gpt], OUT [bench/out].
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-gpt2}
BATCH=${BATCH:-2}
SEQ=${SEQ:-512}
SHORT=${SHORT:-2}
LONG=${LONG:-5}
THREADS=${THREADS:-2}
HZ=${HZ:-997}
BUILD=${BUILD:-/tmp/build-gpt}
OUT=${OUT:-bench/out}
export OMP_WAIT_POLICY=passive # a waiting thread sleeps: a sample is work
if ! perf record -e cpu-clock -o /dev/null -- true >/dev/null 2>&1; then
    echo "gemm_share.sh: perf cannot record here (apt-get install linux-perf)" >&2
    exit 1
fi
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target frugal_cli >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
args=(--model "$MODEL" --batch "$BATCH" --seq "$SEQ" --threads "$THREADS" --optimizer adamw)
for n in "$SHORT" "$LONG"; do
    perf record -e cpu-clock -F "$HZ" -o "$tmp/$n.data" -- "$BUILD/frugal" profile "${args[@]}" \
        --steps "$n" --trace "$tmp/$n.json" --svg "$tmp/$n.svg" >"$tmp/$n.log" 2>&1
    perf report -i "$tmp/$n.data" -n --no-children --sort dso,symbol --stdio 2>/dev/null >"$tmp/$n.txt"
done
mkdir -p "$OUT"
{
    echo "# GEMM share of a training step: $MODEL, batch $BATCH x T $SEQ, AdamW, $THREADS threads"
    echo
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)," \
        "load average $(cut -d' ' -f1-3 /proc/loadavg) at the end: \`frugal profile ${args[*]} --steps N\`" \
        "for N = $SHORT and $LONG under \`perf record -e cpu-clock -F $HZ\`, OMP_WAIT_POLICY=passive."
    echo
    python3 bench/gemm_share.py "$tmp/$SHORT.txt" "$tmp/$LONG.txt" $((LONG - SHORT)) "$tmp/$LONG.json" \
        "$THREADS" "$HZ"
} | tee "$OUT/gemm_share.md"
