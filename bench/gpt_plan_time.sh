#!/usr/bin/env bash
# gpt_plan_time.sh — how long `frugal plan` takes for GPT-2 124M (12 blocks)
# and GPT-2 1.5B (48 blocks, models/gpt2-xl.model) at batch 4, context 1024,
# AdamW, under budgets that force recomputation (4 GiB and 30 GiB): the
# median wall time of REPEAT whole commands (process start, model parsing,
# opening the default text to count it, the search), and the plan chosen.
# Not part of the test suite.
#
#   bench/gpt_plan_time.sh            # REPEAT [5], BUILD [build], OUT [bench/out]
set -euo pipefail
cd "$(dirname "$0")/.."
REPEAT=${REPEAT:-5}
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j2 --target frugal_cli >/dev/null
mkdir -p "$OUT"
python3 - "$BUILD/frugal" "$REPEAT" "$OUT" <<'PY'
import json, statistics, subprocess, sys, time
frugal, repeat, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
cases = [("gpt2 (124M, 12 blocks)", "gpt2", "4GiB"),
         ("gpt2-xl (1.5B, 48 blocks)", "models/gpt2-xl.model", "30GiB")]
rows = []
for what, model, budget in cases:
    cmd = [frugal, "plan", "--model", model, "--batch", "4", "--seq", "1024",
           "--optimizer", "adamw", "--budget", budget, "--json"]
    times, plan = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        r = subprocess.run(cmd, capture_output=True, text=True)
        times.append(time.perf_counter() - t0)
        if r.returncode:
            sys.exit(f"{' '.join(cmd)} failed: {r.stderr}")
        plan = json.loads(r.stdout)
    rows.append((what, budget, statistics.median(times), plan))
lines = ["| model | budget | median wall s | plan chosen | extra compute |", "|---|---|---:|---|---:|"]
for what, budget, t, p in rows:
    mode = p.get("checkpoint", p.get("mode", "?"))
    arg = p.get("checkpoint_arg", "")
    extra = f"{100 * p.get('extra_compute', 0):.1f}%"
    lines.append(f"| {what} | {budget} | {t:.3f} | {mode} {arg} | {extra} |")
md = "\n".join(lines) + "\n"
print(md)
open(f"{out}/gpt_plan_time.md", "w").write(md)
PY
