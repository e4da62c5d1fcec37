#!/usr/bin/env bash
# gemm_linear.sh — the linear layers' f32 GEMMs on OpenBLAS (the default)
# against oneDNN's f32 matmul (FRUGAL_GEMM=onednn; issue 23 item 1:
# "whichever measures faster on that host"), as whole training steps: the seed MLP at
# batch 1024 (SGD) and 32 (SGD, Adam) and the CNN at batch 128 (Adam), each
# the median ms/step of bench_step, alternated in fresh processes (rounds
# AB, BA, ...) so that the host's drift falls on both. Writes
# bench/out/gemm_f32_linear.txt with the CPU in its header. Not a test.
#
#   bash bench/gemm_linear.sh [build-dir]     # ROUNDS=3 THREADS=2 by default
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
OUT=bench/out/gemm_f32_linear.txt
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cmake --build "$BUILD" -j2 --target bench_step frugal_cli > /dev/null
load0=$(cut -d' ' -f1-3 /proc/loadavg)
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
configs=("mlp 1024 sgd 20" "mlp 32 sgd 100" "mlp 32 adam 100" "cnn 128 adam 10")
for r in $(seq 1 "$ROUNDS"); do
    order="openblas onednn"
    [ $((r % 2)) -eq 0 ] && order="onednn openblas"
    for cfg in "${configs[@]}"; do
        read -r model batch opt steps <<<"$cfg"
        for g in $order; do
            ms=$(FRUGAL_GEMM=$g "$BUILD/bench_step" --model "$model" --batch "$batch" --optimizer "$opt" \
                 --threads "$THREADS" --steps "$steps" --json | sed -n 's/.*"median_ms": *\([0-9.]*\).*/\1/p')
            echo "$model-b$batch-$opt $g $ms" >> "$tmp"
        done
    done
done
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
{
    echo "# bench/gemm_linear.sh: linear layers' f32 GEMMs, OpenBLAS against oneDNN's f32 matmul; $THREADS threads, $ROUNDS rounds"
    echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores;" \
         "load average before: $load0; $(date -u +%Y-%m-%d)"
    echo "# $("$BUILD/frugal" devices 2>/dev/null | head -1)"
    echo "# each cell the median over rounds of bench_step's median ms/step (ranges: fastest-slowest run)"
    printf '%-16s %12s %12s %14s %16s %16s\n' config openblas_ms onednn_ms onednn/openblas openblas_range onednn_range
    for cfg in "${configs[@]}"; do
        read -r model batch opt _ <<<"$cfg"
        k="$model-b$batch-$opt"
        runs() { awk -v k="$k" -v g="$1" '$1 == k && $2 == g {print $3}' "$tmp"; }
        a=$(runs openblas | median) b=$(runs onednn | median)
        printf '%-16s %12.2f %12.2f %14.2f %16s %16s\n' "$k" "$a" "$b" "$(echo "$b / $a" | bc -l)" \
            "$(runs openblas | sort -n | sed -n '1p;$p' | xargs printf '%.2f-' | sed 's/-$//')" \
            "$(runs onednn | sort -n | sed -n '1p;$p' | xargs printf '%.2f-' | sed 's/-$//')"
    done
} | tee "$OUT"
