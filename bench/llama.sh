#!/usr/bin/env bash
# llama.sh — issue 25's benchmark: the Llama family on this CPU.
#
#   tinyllama  TinyLlama-1.1B's shape (models/hf/tinyllama-1.1b/config.json:
#              1,100,048,384 parameters), LoRA r=8, alpha 16 on q_proj, k_proj,
#              v_proj and o_proj, the base in NF4, batch 1, context 512,
#              --budget 2GiB: `frugal plan` (the predicted peak) and `frugal
#              train` for WARMUP + N steps (the measured peak: the allocator's
#              reserved peak and the process's peak RSS from /usr/bin/time;
#              the step time, the median of the timed steps; tokens/s).
#              Goal: plan and train inside 2 GiB, while the bf16 weights alone
#              are 2.2 GB.
#   smollm     SmolLM-135M's shape (models/hf/smollm-135m), full fine-tune,
#              AdamW, bf16-mixed, batch 2, context 256: frugal against PyTorch
#              1.13 doing the same by hand (bench/torch_llama.py:
#              tests/ref/hf_ref.py's Llama under torch.autocast(bfloat16)),
#              alternated in fresh processes over ROUNDS rounds; the median
#              step times and peak RSS of each, and their ratios.
#
# Weights are random in the real shapes (each side's initialisation), the
# tokens random ids below the vocabulary from a seeded generator: for memory
# and speed the same as fine-tuning the released models; the losses mean
# nothing. The tokenizers' throughput is bench/tokenizer.sh's.
#
#   bash bench/llama.sh [build-dir]
# Environment: ROUNDS [3], N [3] timed steps, WARMUP [1], THREADS [2],
# PARTS ["tinyllama smollm"], OUT [bench/out/llama.md].
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
FRUGAL=$BUILD/frugal
ROUNDS=${ROUNDS:-3}
N=${N:-3}
WARMUP=${WARMUP:-1}
THREADS=${THREADS:-2}
PARTS=${PARTS:-tinyllama smollm}
OUT=${OUT:-bench/out/llama.md}
PY=/usr/bin/python3
OPENBLAS_OMP=/usr/lib/x86_64-linux-gnu/openblas-openmp
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
[ -x "$FRUGAL" ] || { echo "llama.sh: no frugal at $FRUGAL" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "llama.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
RUNS=$work/runs.jsonl
: >"$RUNS"
ids() { # file vocab n: a 1-D int32 .npy of n random ids below vocab (seed 0)
    $PY - "$@" <<'EOF'
import random, struct, sys
path, V, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
r = random.Random(0)
hdr = "{'descr': '<i4', 'fortran_order': False, 'shape': (%d,), }" % n
hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<%di" % n, *(r.randrange(V) for _ in range(n))))
EOF
}
# frugal's step times from its per-step lines ("step i/n loss L X ms/step",
# X the mean since the epoch's start), the memory line and /usr/bin/time
parse() { # name base rc
    $PY - "$1" "$2" "$3" "$WARMUP" "$N" >>"$RUNS" <<'EOF'
import json, re, statistics, sys
name, base, rc, warmup, n = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
err, out = open(base + ".err").read(), open(base + ".out").read()
run = {"config": name, "impl": "frugal", "rc": rc}
try:
    kib, wall = open(base + ".time").read().split()[-2:]
    run["peak_rss_bytes"], run["wall_s"] = int(kib) * 1024, float(wall)
except (OSError, ValueError):
    pass
steps, prev = [], (0, 0.0)
for m in re.finditer(r"step (\d+)/\d+ loss \S+ ([0-9.]+) ms/step", err):
    i, x = int(m.group(1)), float(m.group(2))
    if i > prev[0]:
        steps += [(i * x - prev[1]) / (i - prev[0])] * (i - prev[0])
        prev = (i, i * x)
timed = steps[warmup:warmup + n]
if timed:
    run["median_ms"], run["step_ms"] = statistics.median(timed), [round(v, 1) for v in timed]
m = re.search(r"predicted for the training step ([0-9.]+) MiB reserved.*?measured peak reserved ([0-9.]+) MiB", out, re.S)
if m:
    run["predicted_mib"], run["measured_mib"] = float(m.group(1)), float(m.group(2))
run["within_budget"] = "(within the budget)" in out
if rc:
    run["error"] = (err.strip().splitlines() or ["?"])[-1]
print(json.dumps(run))
EOF
}

if [[ " $PARTS " == *" tinyllama "* ]]; then
    ids "$work/t32k.npy" 32000 40000
    T=(--model models/hf/tinyllama-1.1b --data "$work/t32k.npy" --batch 1 --seq 512 --threads "$THREADS"
        --lora r=8,alpha=16,target=q_proj,k_proj,v_proj,o_proj --base-precision nf4 --budget 2GiB)
    "$FRUGAL" plan "${T[@]}" --json >"$work/t.plan" 2>"$work/t.plan.err"
    echo "{\"config\": \"tinyllama\", \"impl\": \"plan\", \"rc\": $?, \"plan\": $(tail -1 "$work/t.plan" 2>/dev/null || echo null)}" >>"$RUNS"
    echo "tinyllama: frugal train (several minutes)" >&2
    /usr/bin/time -f '%M %e' -o "$work/t.time" "$FRUGAL" train "${T[@]}" --steps $((WARMUP + N)) \
        --test-limit 1 >"$work/t.out" 2>"$work/t.err"
    parse tinyllama "$work/t" $?
fi

if [[ " $PARTS " == *" smollm "* ]]; then
    ids "$work/s49k.npy" 49152 40000
    S=(--model models/hf/smollm-135m --data "$work/s49k.npy" --batch 2 --seq 256 --threads "$THREADS"
        --optimizer adamw --lr 1e-4 --weight-decay 0.01 --precision bf16-mixed --test-limit 1)
    for r in $(seq 1 "$ROUNDS"); do
        order="frugal torch"
        [ $((r % 2)) -eq 0 ] && order="torch frugal"
        for impl in $order; do
            echo "smollm round $r/$ROUNDS: $impl" >&2
            if [ "$impl" = frugal ]; then
                /usr/bin/time -f '%M %e' -o "$work/s$r.time" "$FRUGAL" train "${S[@]}" \
                    --steps $((WARMUP + N)) >"$work/s$r.out" 2>"$work/s$r.err"
                parse smollm "$work/s$r" $?
            else
                line=$(LD_LIBRARY_PATH="$OPENBLAS_OMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" $PY bench/torch_llama.py \
                    --config models/hf/smollm-135m/config.json --seq 256 --batch 2 --steps "$N" \
                    --warmup "$WARMUP" --threads "$THREADS" | tail -1)
                echo "{\"config\": \"smollm\", \"impl\": \"torch\", \"run\": ${line:-null}}" >>"$RUNS"
            fi
        done
    done
fi

mkdir -p "$(dirname "$OUT")"
cp "$RUNS" "${OUT%.md}.jsonl"
$PY - "$RUNS" "$(lscpu | sed -n 's/^Model name: *//p')" "$(git rev-parse --short HEAD)" "$ROUNDS" "$N" "$WARMUP" "$THREADS" >"$OUT" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
cpu, commit, rounds, n, warm, thr = sys.argv[2:8]
mib = lambda b: b / 2**20
print("# Llama family on this CPU (bench/llama.sh)\n")
print(f"CPU: {cpu}; {thr} threads; commit {commit}; {n} timed steps after {warm}; random weights in the real shapes.\n")
t = [r for r in runs if r["config"] == "tinyllama" and r["impl"] == "frugal"]
p = [r for r in runs if r["config"] == "tinyllama" and r["impl"] == "plan"]
if t:
    r = t[0]
    print("## TinyLlama-1.1B shape: LoRA r=8 on q,k,v,o, NF4 base, batch 1, context 512, --budget 2GiB\n")
    print("| | value |\n|---|---:|")
    if p and p[0].get("plan"):
        pl = p[0]["plan"]
        for k in ("reserved_bytes",):
            if isinstance(pl, dict) and k in pl:
                print(f"| plan: predicted reserved | {mib(pl[k]):.1f} MiB |")
                break
    if "predicted_mib" in r:
        print(f"| train: predicted step reserved | {r['predicted_mib']:.1f} MiB |")
        print(f"| train: measured reserved peak | {r['measured_mib']:.1f} MiB |")
    if "peak_rss_bytes" in r:
        print(f"| process peak RSS | {mib(r['peak_rss_bytes']):.1f} MiB ({r['peak_rss_bytes'] / 2**30:.2f} GiB) |")
    print(f"| within the 2 GiB budget | {r.get('within_budget')} |")
    if "median_ms" in r:
        print(f"| step (median) | {r['median_ms'] / 1e3:.1f} s |")
        print(f"| tokens/s | {512 / (r['median_ms'] / 1e3):.1f} |")
    if r.get("rc"):
        print(f"| failed | {r.get('error')} |")
    print()
f = [r for r in runs if r["config"] == "smollm" and r["impl"] == "frugal" and "median_ms" in r]
q = [r["run"] for r in runs if r["config"] == "smollm" and r["impl"] == "torch" and r.get("run")]
if f and q:
    fm, qm = statistics.median(r["median_ms"] for r in f), statistics.median(r["median_ms"] for r in q)
    fr, qr = statistics.median(r["peak_rss_bytes"] for r in f), statistics.median(r["peak_rss_bytes"] for r in q)
    print(f"## SmolLM-135M shape: full fine-tune, AdamW, bf16-mixed, batch 2, context 256 ({rounds} rounds alternated)\n")
    print("| | frugal | PyTorch 1.13 | frugal / PyTorch |\n|---|---:|---:|---:|")
    print(f"| step (median of rounds' medians) | {fm:.0f} ms | {qm:.0f} ms | {fm / qm:.2f}x |")
    print(f"| peak RSS | {mib(fr):.0f} MiB | {mib(qr):.0f} MiB | {fr / qr:.2f}x |")
    print(f"\nrounds (ms): frugal {[round(r['median_ms']) for r in f]}, PyTorch {[round(r['median_ms']) for r in q]}")
EOF
cat "$OUT"
