#!/usr/bin/env bash
# plan_time.sh — how the planner's time grows with the number of units: the
# chain `input 16`, (U-1) x (`linear 16`, `relu`), `linear 10` (U units: a
# Linear and its ReLU make one) at batch 64 with Adam, under a budget that
# forces recomputation: what every plan holds (parameters, Adam state, one
# batch, metadata) plus 40% of the arena of keeping everything. For each U it
# runs `frugal plan --json` REPEAT times and reports the median wall time of
# the whole command (process start and model parsing included), its CPU
# time, and the plan chosen. Not part of the test suite.
#
#   bench/plan_time.sh                  # U = 100 200 500 1000 2000 5000
#   UNITS="1000" REPEAT=5 bench/plan_time.sh
#
# Environment: UNITS, REPEAT [3], BUILD [build] (configured and built there
# with CMake, Release), OUT [bench/out]: plan_time.json, plan_time.md.
set -euo pipefail
cd "$(dirname "$0")/.."
UNITS=${UNITS:-"100 200 500 1000 2000 5000"}
REPEAT=${REPEAT:-3}
BUILD=${BUILD:-build}
OUT=${OUT:-bench/out}
cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j2 --target frugal_cli >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for u in $UNITS; do
    { echo "input 16"; for ((i = 1; i < u; i++)); do echo "linear 16"; echo "relu"; done; echo "linear 10"; } >"$tmp/chain$u.model"
done
mkdir -p "$OUT"
python3 - "$BUILD/frugal" "$tmp" "$OUT" "$REPEAT" $UNITS <<'PY'
import json, os, platform, re, resource, statistics, subprocess, sys, time

frugal, tmp, out, repeat = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
units = [int(u) for u in sys.argv[5:]]

def plan(model, *extra):
    cmd = [frugal, "plan", "--model", model, "--batch", "64", "--optimizer", "adam", "--json", *extra]
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)}: {p.stderr.strip()}")
    return json.loads(p.stdout), wall, cpu

rows = []
for u in units:
    model = f"{tmp}/chain{u}.model"
    keep, _, _ = plan(model, "--checkpoint", "none", "--budget", "1000GiB")
    r = subprocess.run([frugal, "plan", "--model", model, "--batch", "64", "--optimizer", "adam",
                        "--micro-batch", "64", "--budget", "1KiB"], capture_output=True, text=True)
    smallest = int(re.search(r"\((\d+) bytes\)", r.stderr).group(1))
    for frac in (0.5, 0.1):
        budget = smallest + int(frac * (keep["reserved_bytes"] - smallest))
        runs = [plan(model, "--budget", str(budget), "--micro-batch", "64") for _ in range(repeat)]
        p = runs[0][0]
        rows.append({
            "units": u, "budget": budget, "keep_all_reserved": keep["reserved_bytes"], "smallest": smallest,
            "wall_s": statistics.median(r[1] for r in runs), "cpu_s": statistics.median(r[2] for r in runs),
            "checkpoint": p["checkpoint"], "checkpoint_arg": p["checkpoint_arg"], "micro_batch": p["micro_batch"],
            "extra_compute": p["extra_compute"], "reserved": p["reserved_bytes"]})
    print(f"{u} units: {rows[-2]['wall_s']:.3f} s, {rows[-1]['wall_s']:.3f} s", file=sys.stderr)

# the issue's command: a refusal after the whole search
issue = f"{tmp}/issue.model"
with open(issue, "w") as f:
    f.write("input 16\n" + "linear 16\nrelu\n" * 500 + "linear 10\n")
times = []
for _ in range(repeat):
    cmd = [frugal, "plan", "--model", issue, "--batch", "64", "--optimizer", "adam", "--budget", "2MiB"]
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    times.append(time.perf_counter() - t0)
refusal = {"wall_s": statistics.median(times), "status": p.returncode, "message": p.stderr.strip()}

load = os.getloadavg()[0]
with open(f"{out}/plan_time.json", "w") as f:
    json.dump({"host": platform.node(), "cpus": os.cpu_count(), "load1": load, "repeat": repeat, "rows": rows,
               "issue_command": refusal}, f, indent=1)
with open(f"{out}/plan_time.md", "w") as f:
    f.write(f"Planning time against units: `frugal plan` on the chain of U units "
            f"(Linear(16,16)+ReLU, the last Linear(16,10)), batch 64, Adam, the whole batch at once "
            f"(`--micro-batch 64`), budgets halfway and a tenth of the way from the smallest plan to keeping "
            f"everything. "
            f"Median of {repeat} runs of the whole command; "
            f"{os.cpu_count()} CPUs, 1-minute load {load:.1f} at the end.\n\n")
    f.write("| units | smallest | keep-all reserved | budget | plan | micro-batch | extra compute | reserved | wall s | CPU s |\n")
    f.write("|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|\n")
    for r in rows:
        arg = f" {r['checkpoint_arg']}" if r["checkpoint_arg"] else ""
        f.write(f"| {r['units']} | {r['smallest']} | {r['keep_all_reserved']} | {r['budget']} | {r['checkpoint']}{arg} | "
                f"{r['micro_batch']} | {100 * r['extra_compute']:.1f}% | {r['reserved']} | "
                f"{r['wall_s']:.3f} | {r['cpu_s']:.3f} |\n")
    f.write(f"\nThe issue's command (`frugal plan --model <500 x (linear 16 + relu)> --batch 64 --optimizer adam "
            f"--budget 2MiB`, 501 units): exit status {refusal['status']} after {refusal['wall_s']:.3f} s, "
            f"\"{refusal['message'].splitlines()[0][:160]}...\"\n")
print(open(f"{out}/plan_time.md").read())
PY
