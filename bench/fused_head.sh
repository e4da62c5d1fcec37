#!/usr/bin/env bash
# fused_head.sh — the fused head alone at GPT-2's vocabulary: a model that
# is GPT-2's embedding and its tied head and nothing else (wte 50257 x 768,
# T 256, batch 4: N = 1024 rows, logits 1024 x 50257 x 4 = 206 MB), trained
# with AdamW on 2 threads, with the logits stored (--fused-head off) and
# fused in chunks (auto: Liger's 16 rows; 64; 256). For each: the predicted
# step reservation and the allocator's measured peak (train's JSON summary),
# and the time a step takes: the time of 2+N steps less that of 2, in fresh
# processes, the variants alternated over ROUNDS rounds (bench/step_ab.sh's
# measure), the median printed. Writes bench/out/fused_head.md.
#
#   bash bench/fused_head.sh [build-dir]     # ROUNDS=3 N=3
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
ROUNDS=${ROUNDS:-3}
N=${N:-3}
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/head.model" <<'EOF'
# GPT-2's token embedding and its tied head, nothing between
input tokens 256
embedding 50257 768 std=0.02 name=transformer.wte
linear 50257 bias=false tie=transformer.wte name=lm_head
loss cross_entropy
EOF
/usr/bin/python3 - "$work/text.npy" <<'PY'
import numpy as np, sys
np.save(sys.argv[1], (np.arange(200000, dtype=np.int64) * 7919 % 50257).astype(np.uint16))
PY
variants=(off auto 64 256)
train() { # fused-head, steps, extra...
    local fh=$1 steps=$2
    shift 2
    "$BUILD/frugal" train --model "$work/head.model" --data "$work/text.npy" --batch 4 --steps "$steps" \
        --optimizer adamw --threads 2 --test-limit 1 --no-progress --fused-head "$fh" "$@"
}
for fh in "${variants[@]}"; do
    train "$fh" 1 --json 2>/dev/null | grep '"summary"' >"$work/mem-$fh.json"
done
for r in $(seq 1 "$ROUNDS"); do
    for fh in "${variants[@]}"; do
        t0=$( { /usr/bin/time -f %e "$BUILD/frugal" train --model "$work/head.model" --data "$work/text.npy" \
            --batch 4 --steps 2 --optimizer adamw --threads 2 --test-limit 1 --no-progress --quiet \
            --fused-head "$fh" >/dev/null; } 2>&1 | tail -1)
        t1=$( { /usr/bin/time -f %e "$BUILD/frugal" train --model "$work/head.model" --data "$work/text.npy" \
            --batch 4 --steps $((2 + N)) --optimizer adamw --threads 2 --test-limit 1 --no-progress --quiet \
            --fused-head "$fh" >/dev/null; } 2>&1 | tail -1)
        echo "$fh $t0 $t1" >>"$work/times"
    done
done
python3 - "$work" "$N" "${variants[@]}" <<'PY' | tee bench/out/fused_head.md
import json, statistics, sys
work, n, variants = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
times = {}
for l in open(work + "/times"):
    fh, t0, t1 = l.split()
    times.setdefault(fh, []).append(1000 * (float(t1) - float(t0)) / n)
print("# The fused head alone at V = 50257 (bench/fused_head.sh)\n")
print("GPT-2's wte (50257 x 768) and its tied head, batch 4, T 256 (1024 rows; logits "
      "1024 x 50257 x 4 = %.1f MB), AdamW, 2 threads; ms/step the median over the rounds "
      "of (2+%d steps - 2 steps) / %d.\n" % (1024 * 50257 * 4 / 1e6, n, n))
print("Load average when written: %s (a shared 2-core machine: ms/step is noisy).\n"
      % " ".join(open("/proc/loadavg").read().split()[:3]))
print("| --fused-head | predicted reserved | measured peak | saved vs off (pred / meas) | ms/step | vs off |")
print("|---|---|---|---|---|---|")
base = None
for fh in variants:
    d = json.loads(open("%s/mem-%s.json" % (work, fh)).readline())
    p, m = d["predicted_step_reserved"], d["measured_reserved_peak"]
    ms = statistics.median(times[fh])
    if base is None:
        base = (p, m, ms)
    print("| %s | %.1f MB | %.1f MB | %.1f / %.1f MB | %.0f | %.2fx |" % (
        fh, p / 1e6, m / 1e6, (base[0] - p) / 1e6, (base[1] - m) / 1e6, ms, ms / base[2]))
PY
