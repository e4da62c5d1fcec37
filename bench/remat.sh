#!/usr/bin/env bash
# remat.sh — activation checkpointing, frugal against PyTorch's
# checkpoint_sequential on the deep chain of the issue (32 x (Linear(1024,
# 1024) + ReLU), batch 256), then the largest batch of resnet and cnn that
# fits 64/128/256 MiB with and without the planner. Builds bench_remat, runs
# it; bench_remat runs bench/torch_remat.py between its groups of timed
# rounds (PyTorch, frugal, PyTorch, frugal, ...) so that drift on a shared
# machine hits both engines, and prints the combined tables. PyTorch is
# optional: without Debian's python3-torch and OpenMP OpenBLAS the PyTorch
# part is skipped. Not part of the test suite.
#
#   bench/remat.sh                    # 4 PyTorch runs between 8 frugal rounds
#   ROUNDS=2 STEPS=4 bench/remat.sh   # quicker, noisier
#
# Environment: ROUNDS [4] (PyTorch runs, alternating with groups of frugal
# rounds), STEPS [8] (timed steps per frugal configuration, one per round),
# WARMUP [1], TORCH_STEPS [3] (timed steps per PyTorch configuration and
# run), THREADS [2], AUTO [8] (planner budgets), BUILD [/tmp/build-remat],
# OUT [bench/out]: remat.json, remat.svg, torch_remat.json, remat.md (the
# tables), WAIT_IDLE [0]: wait up to that many seconds for the 1-minute load
# average to fall below the number of cores before starting,
# OMP_WAIT_POLICY [passive] for both engines: OpenMP threads sleep instead of
# spinning while they wait. On a shared machine spinning threads make single
# steps scatter by 2-5x (load 5 on 2 cores: keep-everything steps of 1.1 to
# 4.5 s with the default policy, 625 to 712 ms with passive); on an idle one
# passive costs both engines a little wake-up latency per parallel region.
# About 3.5 minutes on 2 cores at load 4 (passive); the time ratios pair each
# step with the keep-everything steps around it, so they hold up better than
# the ms/step on a busy machine.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-4}
STEPS=${STEPS:-8}
WARMUP=${WARMUP:-1}
TORCH_STEPS=${TORCH_STEPS:-3}
THREADS=${THREADS:-2}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
AUTO=${AUTO:-8}
BUILD=${BUILD:-/tmp/build-remat}
OUT=${OUT:-bench/out}
PY=/usr/bin/python3
OPENBLAS_OMP=/usr/lib/x86_64-linux-gnu/openblas-openmp

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target bench_remat >/dev/null
mkdir -p "$OUT"
rm -f "$OUT/torch_remat.json"

torch_args=()
if [ -x "$PY" ] && "$PY" -c 'import torch' 2>/dev/null && [ -e "$OPENBLAS_OMP/libblas.so.3" ]; then
    torch_args=(--rounds "$ROUNDS" --torch-cmd "OMP_NUM_THREADS=$THREADS \
LD_LIBRARY_PATH=$OPENBLAS_OMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} $PY bench/torch_remat.py --append \
--steps $TORCH_STEPS --warmup 1 --threads $THREADS --out $OUT/torch_remat.json 1>&2")
else
    echo "remat.sh: no python3-torch or no $OPENBLAS_OMP/libblas.so.3: frugal only" >&2
fi

cores=$(nproc)
busy() { awk -v c="$cores" '{ exit !($1 >= c) }' /proc/loadavg; }
waited=0
while busy && [ "$waited" -lt "${WAIT_IDLE:-0}" ]; do
    sleep 10
    waited=$((waited + 10))
done
if busy; then
    echo "remat.sh: load average $(cut -d' ' -f1 /proc/loadavg) on $cores cores: steps will scatter;" \
        "trust the per-round time ratios over the ms/step (or set WAIT_IDLE=600)" >&2
fi
started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- src include 2>/dev/null)" ] && commit="$commit+dirty"
t0=$SECONDS
OMP_NUM_THREADS=$THREADS "$BUILD/bench_remat" --steps "$STEPS" --warmup "$WARMUP" --threads "$THREADS" \
    --auto "$AUTO" --out "$OUT" "${torch_args[@]}" | tee "$OUT/remat.md"
{
    echo
    echo "$started, commit $commit, $THREADS threads, $(nproc) cores; load average $load_start at the" \
        "start, $(cut -d' ' -f1-3 /proc/loadavg) at the end; OMP_WAIT_POLICY=$OMP_WAIT_POLICY; $((SECONDS - t0)) s"
} | tee -a "$OUT/remat.md"
