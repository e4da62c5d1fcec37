#!/usr/bin/env bash
# gpt_autocast.sh — gpt-tiny (batch 8, T 256, AdamW, 2 threads) in mixed
# precision against PyTorch 1.13's own: frugal --precision bf16-mixed
# against the same nanoGPT model under torch.autocast('cpu',
# dtype=torch.bfloat16) (bench/torch_gpt.py --autocast bf16), and both in
# fp32, alternated in fresh processes over ROUNDS rounds (issue 23's "honest
# mixed-against-mixed comparison"). frugal's ms/step is the training
# loop's time (the JSON summary's seconds) of 2+N steps less that of 2, so
# start-up and the first steps are off the clock as they are for PyTorch,
# whose figure is torch_gpt.py's median after 2 warm-up steps. (Until
# 2026-12 frugal's was the processes' wall times, whose start-up alone
# moved by tenths of a second on this host: +-80 ms a step.) Prints a
# table (and writes it to OUT, bench/out/gpt_autocast.md by default).
# TORCH_CORETYPE [unset]: OPENBLAS_CORETYPE for PyTorch's runs (its OpenBLAS
# on the core frugal restarts on, where OpenBLAS picks a narrower one).
#
#   bash bench/gpt_autocast.sh [build-dir]     # ROUNDS=3 N=6
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
ROUNDS=${ROUNDS:-3}
N=${N:-6}
OUT=${OUT:-bench/out/gpt_autocast.md}
text=/usr/share/games/fortunes
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
frugal_ms() { # precision
    local t0 t1
    t0=$(frugal_s "$1" 2) t1=$(frugal_s "$1" $((2 + N)))
    python3 -c "print(round(1000 * ($t1 - $t0) / $N, 1))"
}
frugal_s() { # precision steps: the training loop's seconds (the JSON summary's)
    "$BUILD/frugal" train --model gpt-tiny --data "$text" --steps "$2" --batch 8 --seq 256 \
        --optimizer adamw --precision "$1" --test-limit 1 --threads 2 --no-progress --quiet --json |
        python3 -c 'import json,sys; print([json.loads(l) for l in sys.stdin if "\"summary\"" in l][0]["seconds"])'
}
torch_ms() { # none|bf16
    env ${TORCH_CORETYPE:+OPENBLAS_CORETYPE=$TORCH_CORETYPE} \
        LD_LIBRARY_PATH=/usr/lib/x86_64-linux-gnu/openblas-openmp /usr/bin/python3 bench/torch_gpt.py \
        --data "$text" --batch 8 --ctx 256 --steps "$N" --warmup 2 --threads 2 --autocast "$1" --json |
        tail -1 | python3 -c 'import json,sys; print(round(json.loads(sys.stdin.read())["median_ms"], 1))'
}
for r in $(seq 1 "$ROUNDS"); do
    echo "frugal-bf16 $(frugal_ms bf16-mixed)" >> "$tmp"
    echo "torch-bf16 $(torch_ms bf16)" >> "$tmp"
    echo "frugal-fp32 $(frugal_ms fp32)" >> "$tmp"
    echo "torch-fp32 $(torch_ms none)" >> "$tmp"
done
med() { awk -v k="$1" '$1 == k {print $2}' "$tmp" | sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2] + v[NR/2+1]) / 2}'; }
{
    echo "# bench/gpt_autocast.sh: gpt-tiny, batch 8, T 256, AdamW, 2 threads, $ROUNDS rounds, $(date -u +%Y-%m-%d)"
    echo "# CPU: $(lscpu | sed -n 's/^Model name: *//p') (family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p')), $(nproc) cores; $(git rev-parse --short HEAD)"
    echo "# PyTorch's OpenBLAS core: ${TORCH_CORETYPE:-its own choice}"
    echo "# frugal: $("$BUILD/frugal" devices 2>/dev/null | head -1 | sed 's/^cpu *//; s/^[^;]*; //')"
    echo
    echo "| precision | frugal ms/step | PyTorch 1.13 ms/step | frugal / PyTorch |"
    echo "|---|---:|---:|---:|"
    for p in bf16 fp32; do
        f=$(med frugal-$p) t=$(med torch-$p)
        printf '| %s | %s | %s | %.2f |\n' "$([ $p = bf16 ] && echo 'bf16-mixed / autocast bf16' || echo fp32)" "$f" "$t" "$(echo "$f / $t" | bc -l)"
    done
    echo
    echo "runs (name ms): $(tr '\n' ';' < "$tmp")"
} | tee "$OUT"
