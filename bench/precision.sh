#!/usr/bin/env bash
# precision.sh — peak bytes per category and step time for each precision and
# optimizer-state choice, on the CNN, the residual network and the deep chain
# (32 x Linear(1024,1024)+ReLU), Adam, against fp32 with fp32 state.
#
# Time: these shared machines drift by tens of percent over seconds, more
# than the differences measured here, so each configuration runs in one
# process with an fp32 twin (bench/bench_pair.c), their steps alternating;
# a cell's ratio is the median over rounds of the median per-pair ratio, the
# range is over rounds, and the quartiles are those of the pairs (the
# median over rounds of each). ms/step is the configuration's own median.
# Memory: the configuration's peak allocated bytes per category (its own
# context), against the fp32 twin's.
# Usage: bench/precision.sh [rounds]   (environment: THREADS, STEPS, BUILD,
# MODELS ["cnn resnet chain"], CONFIGS [all five, e.g. "fp32 int8,bf16-mixed fp32"]).
# Pure fp16 is not among them: with Adam it diverges here (frugal warns why:
# exp_avg_sq underflows in fp16) and the scaler then skips the steps, which
# makes them cheap; a cell whose runs skipped steps says so.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
threads=${THREADS:-2}
steps=${STEPS:-12}
build=${BUILD:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target bench_pair >/dev/null
chain=$(mktemp --suffix=.model)
out=$(mktemp)
trap 'rm -f "$chain" "$out"' EXIT
{ echo "input 1024"; for i in $(seq 32); do echo "linear 1024"; echo "relu"; done; echo "linear 10"; } >"$chain"
IFS=, read -r -a configs <<<"${CONFIGS:-bf16-mixed fp32,fp16-mixed fp32,bf16 fp32,fp32 bf16,fp32 int8}"
for r in $(seq "$rounds"); do
    for model in ${MODELS:-cnn resnet chain}; do
        file=$model; batch=128
        [ "$model" = chain ] && file=$chain && batch=256
        for cfg in "${configs[@]}"; do
            set -- $cfg
            "$build/bench_pair" --model "$file" --batch $batch --optimizer adam --steps "$steps" \
                --threads "$threads" --a fp32,fp32 --b "$1,$2" --json |
                sed "s|\"model\": \"[^\"]*\"|\"round\": $r, \"model\": \"$model\"|" >>"$out"
        done
    done
done
python3 - "$out" <<'PY'
import json, sys, statistics, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["model"], r["b"]["precision"], r["b"]["optimizer_state"])].append(r)
med = statistics.median
mib = lambda b: f"{b / 1048576:.1f} MiB"
print("| model | precision | Adam state | ms/step | time vs fp32 | range over rounds | pair quartiles | activations | vs fp32 | optimizer state | vs fp32 | peak allocated |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for model in ["cnn", "resnet", "chain"]:
    cells = [(k, rs) for k, rs in runs.items() if k[0] == model]
    if not cells:
        continue
    base = cells[0][1][0]["a"]
    ba, bo = base["peak_by_category"]["activations"], base["peak_by_category"]["optimizer"]
    fp32_ms = med(r["a"]["median_ms"] for _, rs in cells for r in rs)
    print(f"| {model} | fp32 | fp32 | {fp32_ms:.1f} | 1.00x | | | {mib(ba)} | 1.00x | {mib(bo)} | 1.00x | "
          f"{mib(base['peak_allocated_bytes'])} |")
    for (m, p, st), rs in cells:
        b = rs[0]["b"]
        c = b["peak_by_category"]
        ratios = [r["ratio_median"] for r in rs]
        skipped = sum(r["b"]["skipped_steps"] for r in rs)
        note = f" ({skipped} skipped)" if skipped else ""
        print(f"| {m} | {p} | {st} | {med(r['b']['median_ms'] for r in rs):.1f}{note} | {med(ratios):.2f}x | "
              f"{min(ratios):.2f}-{max(ratios):.2f} | {med(r['ratio_q1'] for r in rs):.2f}-"
              f"{med(r['ratio_q3'] for r in rs):.2f} | {mib(c['activations'])} | {c['activations'] / ba:.2f}x | "
              f"{mib(c['optimizer'])} | {c['optimizer'] / bo:.2f}x | {mib(b['peak_allocated_bytes'])} |")
PY
