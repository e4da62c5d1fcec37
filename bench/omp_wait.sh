#!/usr/bin/env bash
# omp_wait.sh — OpenMP's wait policy on an idle and on a loaded host: ms a
# training step (frugal profile, the steps after the first) with
# OMP_WAIT_POLICY=active, =passive, and passive with a short spin first
# (GOMP_SPINCOUNT=10000, libgomp's, what frugal sets), at 1 and 2 threads, for the seed MLP
# (batch 32: short kernels, many barriers) and the CNN (batch 128). The
# loaded host runs LOAD busy loops beside (default: as many as cores).
# Usage: bash bench/omp_wait.sh [build-dir]   (writes a markdown table on stdout)
set -euo pipefail
bin=${1:-build}/frugal
load=${LOAD:-$(nproc)}
rounds=${ROUNDS:-3}
ms() { # policy threads model batch steps (policy "short": passive after 10000 spins)
    local best= env=(OMP_WAIT_POLICY="$1")
    [ "$1" = short ] && env=(OMP_WAIT_POLICY=passive GOMP_SPINCOUNT=10000)
    for _ in $(seq "$rounds"); do
        v=$(env "${env[@]}" "$bin" profile --model "$3" --batch "$4" --steps "$5" --threads "$2" \
            --json --trace /dev/null --svg /dev/null 2>/dev/null | grep -o '"ms_per_step": [0-9.]*' | cut -d' ' -f2)
        best=$(awk -v a="$best" -v b="$v" 'BEGIN{print (a=="" || b<a) ? b : a}')
    done
    echo "$best"
}
table() {
    echo "| host | model | threads | active ms | passive ms | short spin ms | passive/active | short/active |"
    echo "|---|---|---:|---:|---:|---:|---:|---:|"
    for m in "mlp 32 60" "cnn 128 6"; do
        set -- $m
        for t in 1 2; do
            a=$(ms active $t "$1" "$2" "$3"); p=$(ms passive $t "$1" "$2" "$3")
            q=$(ms short $t "$1" "$2" "$3")
            echo "| $host | $1 b$2 | $t | $a | $p | $q | $(awk -v a="$a" -v p="$p" 'BEGIN{printf "%.2f", p/a}') | $(awk -v a="$a" -v p="$q" 'BEGIN{printf "%.2f", p/a}') |"
        done
    done
}
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; best of $rounds runs; $(date -u +%F)"
echo
host=idle table
pids=()
for _ in $(seq "$load"); do (while :; do :; done) & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' EXIT
host="loaded ($load busy loops)" table | tail -n +3
