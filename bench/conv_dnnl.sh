#!/usr/bin/env bash
# conv_dnnl.sh — the CNN and the ResNet training step (batch 128, Adam) with
# convolutions on oneDNN's primitives against im2col / shifted GEMMs
# (FRUGAL_CONV=dnnl|gemm), fp32 and the CNN in bf16-mixed (cnn-bf16: native
# bf16 primitives on oneDNN's path where the CPU has them), alternated in fresh processes (rounds AB, BA, ...)
# because medians of separate runs drift on shared machines. Each cell is the
# median over rounds of bench_step's per-run median ms/step. Writes
# bench/out/conv_dnnl.txt (the CPU named in its header). Not a test.
#
#   bench/conv_dnnl.sh                       # 3 rounds, 2 threads, build-h3
#   ROUNDS=5 THREADS=1 BUILD=build bench/conv_dnnl.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
BUILD=${BUILD:-build-h3}
STEPS=${STEPS:-8}
OUT=bench/out/conv_dnnl.txt
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cmake --build "$BUILD" -j2 --target bench_step > /dev/null
load0=$(cut -d' ' -f1-3 /proc/loadavg)
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
for r in $(seq 1 "$ROUNDS"); do
    order="gemm dnnl"
    [ $((r % 2)) -eq 0 ] && order="dnnl gemm"
    for cfg in cnn:fp32 resnet:fp32 cnn:bf16-mixed; do
        model=${cfg%%:*}
        [ "${cfg#*:}" = fp32 ] || model=$model-bf16
        for path in $order; do
            ms=$(FRUGAL_CONV=$path "$BUILD/bench_step" --model "${cfg%%:*}" --batch 128 \
                 --optimizer adam --precision "${cfg#*:}" --threads "$THREADS" --steps "$STEPS" --json |
                 sed -n 's/.*"median_ms": *\([0-9.]*\).*/\1/p')
            echo "$model $path $ms" >> "$tmp"
        done
    done
done
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
{
    echo "# bench/conv_dnnl.sh: CNN and ResNet step, batch 128, Adam, $THREADS threads, $ROUNDS rounds"
    echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores;" \
         "load average before: $load0; $(date -u +%Y-%m-%d)"
    echo "# oneDNN: $(ls /usr/lib/x86_64-linux-gnu/libdnnl.so.* 2>/dev/null | sed -n 's/.*libdnnl.so.//p' | sort | tail -1);" \
         "each cell the median over rounds of the per-run median ms/step"
    echo "# (the ranges: the fastest and slowest run of each path)"
    printf '%-8s %12s %12s %10s %16s %16s\n' model gemm_ms dnnl_ms dnnl/gemm gemm_range dnnl_range
    for model in cnn resnet cnn-bf16; do
        runs() { awk -v m=$model -v p=$1 '$1 == m && $2 == p {print $3}' "$tmp"; }
        g=$(runs gemm | median)
        d=$(runs dnnl | median)
        printf '%-8s %12.1f %12.1f %10.2f %16s %16s\n' "$model" "$g" "$d" "$(echo "$d / $g" | bc -l)" \
            "$(runs gemm | sort -n | sed -n '1p;$p' | xargs printf '%.1f-' | sed 's/-$//')" \
            "$(runs dnnl | sort -n | sed -n '1p;$p' | xargs printf '%.1f-' | sed 's/-$//')"
    done
    echo "# runs (model path ms):"
    sed 's/^/#   /' "$tmp"
} | tee "$OUT"
