#!/usr/bin/env bash
# precision.sh — peak bytes per category and step time for each precision and
# optimizer-state choice, on the CNN, the residual network and the deep chain
# (32 x Linear(1024,1024)+ReLU). Runs are interleaved in rounds (A B C ...,
# then again) because these shared machines drift; each cell is the median
# of the per-run medians. Prints a markdown table with ratios against fp32:
# per round (each run over the same round's fp32 run, so drift cancels), the
# median over rounds and their range; and the fastest step of all rounds over
# fp32's fastest (a busy host only ever adds time, so the minima are the
# steadiest estimate of what a step costs).
# Usage: bench/precision.sh [rounds]   (environment: THREADS, STEPS, BUILD,
# MODELS ["cnn resnet chain"], CONFIGS [all six, e.g. "fp32 fp32,fp32 int8"]).
# Pure fp16 is not among them: with Adam it diverges here (frugal warns why:
# exp_avg_sq underflows in fp16) and the scaler then skips the steps, which
# makes them cheap; a cell whose runs skipped steps says so.
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-2}
threads=${THREADS:-2}
steps=${STEPS:-10}
build=${BUILD:-build}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$build" -j"$(nproc)" --target bench_step >/dev/null
chain=$(mktemp --suffix=.model)
trap 'rm -f "$chain" "$out"' EXIT
{ echo "input 1024"; for i in $(seq 32); do echo "linear 1024"; echo "relu"; done; echo "linear 10"; } >"$chain"
out=$(mktemp)
IFS=, read -r -a configs <<<"${CONFIGS:-fp32 fp32,bf16-mixed fp32,fp16-mixed fp32,bf16 fp32,fp32 bf16,fp32 int8}"
for r in $(seq "$rounds"); do
    for model in ${MODELS:-cnn resnet chain}; do
        file=$model; batch=128
        [ "$model" = chain ] && file=$chain && batch=256
        for cfg in "${configs[@]}"; do
            set -- $cfg
            "$build/bench_step" --model "$file" --batch $batch --optimizer adam --steps "$steps" \
                --threads "$threads" --precision "$1" --optimizer-state "$2" --json |
                sed "s|\"model\": \"[^\"]*\"|\"round\": $r, \"model\": \"$model\"|" >>"$out"
        done
    done
done
python3 - "$out" <<'PY'
import json, sys, statistics, collections
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["model"], r["precision"], r["optimizer_state"])].append(r)
# time vs fp32: the median over rounds of (this run / the same round's fp32
# run), so that drift between rounds cancels; the range is over the rounds
print("| model | precision | Adam state | ms/step | time vs fp32 | range | fastest vs fp32 | activations | vs fp32 | optimizer state | vs fp32 | peak allocated |")
print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
mib = lambda b: f"{b / 1048576:.1f} MiB"
for model in [m for m in ["cnn", "resnet", "chain"] if (m, "fp32", "fp32") in runs]:
    base = runs[(model, "fp32", "fp32")]
    bt = statistics.median(r["median_ms"] for r in base)
    bmin = min(r["min_ms"] for r in base)
    ba = base[0]["peak_by_category"]["activations"]
    bo = base[0]["peak_by_category"]["optimizer"]
    for (m, p, st), rs in runs.items():
        if m != model:
            continue
        t = statistics.median(r["median_ms"] for r in rs)
        per_round = {r["round"]: r["median_ms"] for r in base}
        ratios = [r["median_ms"] / per_round[r["round"]] for r in rs if r["round"] in per_round]
        rt = statistics.median(ratios) if ratios else t / bt
        rng = f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-"
        fastest = min(r["min_ms"] for r in rs) / bmin
        skipped = sum(r.get("skipped_steps", 0) for r in rs)
        note = f" ({skipped} skipped)" if skipped else ""
        c = rs[0]["peak_by_category"]
        print(f"| {m} | {p} | {st} | {t:.1f}{note} | {rt:.2f}x | {rng} | {fastest:.2f}x | {mib(c['activations'])} | "
              f"{c['activations'] / ba:.2f}x | {mib(c['optimizer'])} | {c['optimizer'] / bo:.2f}x | "
              f"{mib(rs[0]['peak_allocated_bytes'])} |")
PY
