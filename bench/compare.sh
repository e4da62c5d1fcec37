#!/usr/bin/env bash
# compare.sh — frugal against PyTorch, step time and peak RSS, on the seed's
# configurations. Installs python3-torch and Debian's OpenMP OpenBLAS if they
# are missing, builds bench_step, then measures every configuration in fresh
# processes, alternating frugal and PyTorch runs (rounds in the order AB, BA,
# AB, ... with the configurations inside each round) because the medians of
# separate runs drift by tens of percent on shared machines. Each cell of the
# table is the median over the rounds of the per-run median ms/step (and of
# the per-run peak RSS). Not part of the test suite.
#
#   bench/compare.sh                 # 3 rounds, 2 threads
#   ROUNDS=5 THREADS=4 bench/compare.sh
#
# Environment: ROUNDS [3], THREADS [2], BUILD [/tmp/build-bench],
# RESULTS [/tmp/frugal-bench.jsonl] (every run's JSON line), STEPS_SCALE [1]
# (multiplies the steps of every configuration), ONLY [all] (an extended
# regular expression: only the configurations whose name matches),
# TORCH_CORETYPE [unset] (OPENBLAS_CORETYPE for PyTorch's runs: the peer on
# the core frugal restarts on, where OpenBLAS picks a narrower one itself).
set -euo pipefail
# Both engines use OpenMP; passive waiting keeps idle threads from spinning on
# this shared 2-core machine (spinning made step times vary 10x here).
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
cd "$(dirname "$0")/.."
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-2}
BUILD=${BUILD:-/tmp/build-bench}
RESULTS=${RESULTS:-/tmp/frugal-bench.jsonl}
STEPS_SCALE=${STEPS_SCALE:-1}
PY=/usr/bin/python3
OPENBLAS_OMP=/usr/lib/x86_64-linux-gnu/openblas-openmp

# name model batch optimizer steps (timed steps per run, after 3 warm-up steps)
CONFIGS=(
    "mlp-b32-sgd     mlp    32   sgd  100"
    "mlp-b32-adam    mlp    32   adam 100"
    "mlp-b1024-sgd   mlp    1024 sgd  20"
    "cnn-b128-adam   cnn    128  adam 20"
    "resnet-b128-adam resnet 128 adam 6"
)

missing=()
for p in python3-torch libopenblas0-openmp cmake build-essential libopenblas-openmp-dev zlib1g-dev; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "installing: ${missing[*]}" >&2
    SUDO=""
    [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    $SUDO apt-get update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y --no-install-recommends "${missing[@]}"
fi
if [ ! -e "$OPENBLAS_OMP/libblas.so.3" ]; then
    echo "compare.sh: $OPENBLAS_OMP/libblas.so.3 is missing; PyTorch would run nn.Linear on" \
        "the reference BLAS" >&2
    exit 1
fi

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target bench_step frugal_cli >/dev/null

run_frugal() { # model batch optimizer steps
    OMP_NUM_THREADS=$THREADS "$BUILD/bench_step" --model "$1" --batch "$2" --optimizer "$3" \
        --steps "$4" --threads "$THREADS" --json
}
run_torch() {
    env OMP_NUM_THREADS="$THREADS" ${TORCH_CORETYPE:+OPENBLAS_CORETYPE=$TORCH_CORETYPE} LD_LIBRARY_PATH="$OPENBLAS_OMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
        "$PY" bench/torch_step.py --model "$1" --batch "$2" --optimizer "$3" --steps "$4" \
        --threads "$THREADS" --json
}

started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- src include models 2>/dev/null)" ] && commit="$commit+dirty"
: >"$RESULTS"
# what runs on this host, for the table's header: the CPU, frugal's GEMM
# and convolution providers and their probe (after frugal's BLAS restart)
cpu_json=$(mktemp)
trap 'rm -f "$cpu_json"' EXIT
OMP_NUM_THREADS=$THREADS "$BUILD/frugal" devices --json >"$cpu_json" 2>/dev/null || echo '{}' >"$cpu_json"
t_start=$SECONDS
for ((r = 0; r < ROUNDS; r++)); do
    for cfg in "${CONFIGS[@]}"; do
        read -r name model batch opt steps <<<"$cfg"
        [ -n "${ONLY:-}" ] && ! [[ $name =~ $ONLY ]] && continue
        steps=$((steps * STEPS_SCALE))
        order="frugal torch"
        [ $((r % 2)) -eq 1 ] && order="torch frugal"
        for impl in $order; do
            echo "round $((r + 1))/$ROUNDS: $name $impl" >&2
            if ! line=$("run_$impl" "$model" "$batch" "$opt" "$steps"); then
                echo "compare.sh: $impl $name failed" >&2
                line="{\"impl\": \"$impl\", \"failed\": true}"
            fi
            echo "{\"config\": \"$name\", \"round\": $((r + 1)), \"run\": $line}" >>"$RESULTS"
        done
    done
done
elapsed=$((SECONDS - t_start))

echo
echo "frugal vs PyTorch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null), $THREADS threads," \
    "$ROUNDS alternating rounds; measured $started ($commit), ${elapsed}s," \
    "load average $load_start -> $(cut -d' ' -f1-3 /proc/loadavg)"
"$PY" - "$RESULTS" "$cpu_json" <<'EOF'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
cpu = json.load(open(sys.argv[2])).get("cpu")
if cpu:
    p = cpu["probe"]
    fell = " (OpenBLAS chose %s: restarted)" % cpu["fell_back_from"] if cpu["fell_back_from"] else ""
    print("CPU: %s (family %d model %d): %s" % (cpu["model"], cpu["family"], cpu["model_id"],
                                               " ".join(cpu["features"])))
    print("frugal: GEMM f32 %s%s %.0f GFLOP/s (oneDNN sgemm %.0f), bf16 %s %.0f GFLOP/s at %d^3; "
          "conv %s; linear f32 %s" % (cpu["gemm_f32"], fell, p["gflops_blas_f32"],
                                       p["gflops_onednn_f32"], cpu["gemm_bf16"], p["gflops_bf16"],
                                       p["n"], cpu["conv"], cpu["linear_f32"]))
tr = [x for r in runs if r["run"].get("impl") == "torch" and not r["run"].get("failed")
      for x in [r["run"]]]
if tr:
    print("PyTorch: OpenBLAS %s, %s" % (tr[0].get("blas_core"), tr[0].get("cpu_capability")))
print()
order, cells = [], {}
for r in runs:
    c = r["config"]
    if c not in order:
        order.append(c)
    cells.setdefault((c, r["run"]["impl"]), []).append(r["run"])

def med(c, impl, key):
    v = [x[key] for x in cells.get((c, impl), []) if not x.get("failed")]
    return statistics.median(v) if v else None

def fmt(v, f):
    return "failed" if v is None else f(v)

ms = lambda v: f"{v:.2f}"
mib = lambda v: f"{v / 2**20:.1f} MiB"
print("| config | frugal ms/step | torch ms/step | time ratio | frugal peak RSS | torch peak RSS | RSS ratio |")
print("|---|---:|---:|---:|---:|---:|---:|")
for c in order:
    ft, tt = med(c, "frugal", "median_ms"), med(c, "torch", "median_ms")
    fr, tr = med(c, "frugal", "peak_rss_bytes"), med(c, "torch", "peak_rss_bytes")
    tratio = f"{ft / tt:.2f}" if ft and tt else "-"
    rratio = f"{fr / tr:.3f}" if fr and tr else "-"
    print(f"| {c} | {fmt(ft, ms)} | {fmt(tt, ms)} | {tratio} | {fmt(fr, mib)} | {fmt(tr, mib)} | {rratio} |")
print()
print("time ratio = frugal / torch (issue 23's goals: cnn and resnet <= 0.6, mlp-b1024 <= 0.9, the "
      "others <= 0.8); RSS ratio = frugal / torch (<= 0.25).")
print("Spread of the per-run medians (min-max ms/step):")
for c in order:
    parts = []
    for impl in ("frugal", "torch"):
        v = [x["median_ms"] for x in cells.get((c, impl), []) if not x.get("failed")]
        if v:
            parts.append(f"{impl} {min(v):.2f}-{max(v):.2f}")
    print(f"  {c}: {', '.join(parts)}")
slow = {x.get("matmul_1024_gflops") for (c, i), xs in cells.items() if i == "torch"
        for x in xs if x.get("blas_ok") is False}
if slow:
    print(f"WARNING: PyTorch ran on a slow BLAS (1024x1024 matmul {sorted(slow)} GFLOP/s).")
else:
    g = [x["matmul_1024_gflops"] for (c, i), xs in cells.items() if i == "torch" for x in xs
         if "matmul_1024_gflops" in x]
    libs = {l for (c, i), xs in cells.items() if i == "torch" for x in xs
            for l in x.get("blas_libraries", [])}
    if g:
        print(f"PyTorch BLAS: {', '.join(sorted(libs))}; 1024x1024 matmul "
              f"{min(g):.0f}-{max(g):.0f} GFLOP/s.")
print(f"Every run's JSON: {sys.argv[1]}")
EOF
