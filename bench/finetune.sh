#!/usr/bin/env bash
# finetune.sh — issue 24's benchmark: fine-tuning GPT-2 124M on this CPU
# inside a stated budget, frugal against PyTorch 1.13 doing the same by hand
# (bench/torch_finetune.py), alternated in fresh processes over ROUNDS rounds
# (frugal then PyTorch in odd rounds, PyTorch then frugal in even ones, as
# bench/compare.sh and bench/gpt_autocast.sh do). Three parts:
#
#   lora  LoRA r=8, alpha=16, dropout 0.05 on attn.c_attn, attn.c_proj,
#         mlp.c_fc and mlp.c_proj of every block, batch 4, T 512: frugal with
#         an int8 base, the fused head and --budget 480MiB (its planner
#         chooses the checkpointing that fits), against torch_finetune.py
#         --mode lora (fp32 base frozen, a LoRA linear written by hand, AdamW
#         over the adapters). Goals: frugal's peak RSS <= 512 MiB and its step
#         <= 0.7x PyTorch's.
#   full  all parameters, batch 4, T 512: frugal with Adafactor, bf16-mixed,
#         the fused head and --budget 896MiB, against torch_finetune.py --mode
#         full (AdamW, fp32). Goal: frugal's peak RSS <= 1 GiB; PyTorch's peak
#         and step beside it.
#   head  the fused head alone (vocabulary 50257): frugal --fused-head off
#         against auto, same everything else (HEAD_OPTS, AdamW fp32 by
#         default): the predicted peak (`frugal estimate` and `frugal plan`,
#         --json), the measured peak (`frugal train --steps 3 --json`'s
#         measured_reserved_peak and peak_rss_bytes), the bytes saved, and the
#         step time of each, alternated.
#
# Weights are random (each side's GPT-2 init) and the tokens are random ids
# below 50257 from a seeded generator: for memory and speed that is the same
# as fine-tuning the released GPT-2 on real text (same shapes, same ops, same
# bytes); only the losses mean nothing. frugal reads them from an llm.c shard
# this script writes (256 int32 header words: magic 20240520, version 1, the
# count; then uint16 ids); PyTorch draws its own.
#
# Step times: PyTorch's is torch_finetune.py's median over N steps after
# WARMUP. frugal's comes from `frugal train`'s per-step progress lines (stderr
# not a terminal: "step i/n ... X ms/step", X the mean since the epoch's
# start, so step i took i*X_i - (i-1)*X_(i-1)): the median of steps
# WARMUP+1 .. WARMUP+N, start-up, the planner and the final evaluation
# (--test-limit 1) off the clock. Peak RSS: /usr/bin/time's maximum resident
# set size for frugal (getrusage of the child), torch_finetune.py's getrusage
# for PyTorch: whole processes both. Each cell is the median over the rounds.
#
# The options --lora, --base-precision, --fused-head and --optimizer
# adafactor are issue 24's; a frugal that rejects one (exit 2: a usage error)
# has its part skipped with the message, and the other parts still run.
#
#   bash bench/finetune.sh [build-dir]
#
# The budgets leave the process's own pages under the RSS goals (code,
# libraries, the token file; oneDNN's bf16 kernels and OpenBLAS's buffers:
# about 30 MiB beside the LoRA step, 67 to 91 MiB beside the full bf16-mixed
# one, which 960MiB took to 1026 MiB): LORA_BUDGET [480MiB], FULL_BUDGET [896MiB];
# LORA_EXTRA [--precision bf16-mixed]: more frugal options for the LoRA part
# (LORA_EXTRA=" " for none: frugal's LoRA step in fp32).
# The LoRA part also times PyTorch's own mixed precision (config lora-ac:
# torch_finetune.py --mode lora --autocast bf16, alternated with the others)
# and prints frugal against it beside the fp32 row: the mixed-against-mixed
# comparison. AUTOCAST=0 leaves it out.
# Environment: ROUNDS [3], N [4] timed steps, WARMUP [2], THREADS [2],
# PARTS ["lora full head"], HEAD_OPTS ["--optimizer adamw"],
# OUT [bench/out/finetune.md] (the table; every run's JSON beside it as
# finetune.jsonl). For a quick check of the script only: MODEL [gpt2] (a
# model file with vocabulary 50257) and TORCH_ARGS [none] (e.g. "--layers 1
# --heads 2 --dim 64" for torch_finetune.py); the table still says GPT-2.
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=$(realpath "${1:-build}")
FRUGAL=$BUILD/frugal
ROUNDS=${ROUNDS:-3}
N=${N:-4}
WARMUP=${WARMUP:-2}
THREADS=${THREADS:-2}
PARTS=${PARTS:-lora full head}
HEAD_OPTS=${HEAD_OPTS:---optimizer adamw}
OUT=${OUT:-bench/out/finetune.md}
MODEL=${MODEL:-gpt2}
read -r -a TORCH_ARR <<<"${TORCH_ARGS:-}"
PY=/usr/bin/python3
OPENBLAS_OMP=/usr/lib/x86_64-linux-gnu/openblas-openmp
export OMP_NUM_THREADS=$THREADS OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}

[ -x "$FRUGAL" ] || { echo "finetune.sh: no frugal at $FRUGAL (build it, or give the build directory)" >&2; exit 1; }
[ -x /usr/bin/time ] || { echo "finetune.sh: /usr/bin/time is missing (apt-get install time)" >&2; exit 1; }
[ -e "$OPENBLAS_OMP/libblas.so.3" ] || { echo "finetune.sh: $OPENBLAS_OMP/libblas.so.3 is missing: PyTorch would run on the reference BLAS (apt-get install libopenblas0-openmp)" >&2; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
RUNS=$work/runs.jsonl
: >"$RUNS"

# 262144 random ids below 50257 (seed 0): 230 batches of 4 x 512 after the
# 10% validation split, so N + WARMUP steps stay inside the first epoch.
TOKENS=$work/tokens.bin
$PY - "$TOKENS" <<'EOF'
import array, random, struct, sys
n, rng = 1 << 18, random.Random(0)
ids = array.array("H", (rng.randrange(50257) for _ in range(n)))
if sys.byteorder != "little":
    ids.byteswap()
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(ids.tobytes())
EOF

LORA_OPTS=(--lora r=8,alpha=16,dropout=0.05,target=attn.c_attn,attn.c_proj,mlp.c_fc,mlp.c_proj
    --base-precision int8 --fused-head auto --budget "${LORA_BUDGET:-480MiB}")
FULL_OPTS=(--optimizer adafactor --precision bf16-mixed --fused-head auto --budget "${FULL_BUDGET:-896MiB}")
LORA_EXTRA=${LORA_EXTRA:---precision bf16-mixed}
read -r -a LORA_EXTRA_ARR <<<"$LORA_EXTRA"
LORA_OPTS+=("${LORA_EXTRA_ARR[@]}")
read -r -a HEAD_ARR <<<"$HEAD_OPTS"
COMMON=(--model "$MODEL" --data "$TOKENS" --seq 512 --batch 4 --threads "$THREADS" --test-limit 1)

opts_of() { # config -> the frugal options in OPTS
    case $1 in
    lora) OPTS=("${LORA_OPTS[@]}") ;;
    full) OPTS=("${FULL_OPTS[@]}") ;;
    head-off) OPTS=("${HEAD_ARR[@]}" --fused-head off) ;;
    head-auto) OPTS=("${HEAD_ARR[@]}" --fused-head auto) ;;
    esac
}

declare -A SKIP=()
skip() { # config message
    [ -n "${SKIP[$1]:-}" ] && return
    SKIP[$1]=$2
    echo "finetune.sh: SKIPPING $1: $2" >&2
}
rejected_msg() { # stderr file -> its usage error, one line
    grep -m1 -E '^frugal [a-z]+:' "$1" | tr -d '\n'
}

# A frugal that lacks an option says so at once: `train ... --help` parses
# every option (exit 2 on an unknown one) before printing the usage.
probe() { # config
    opts_of "$1"
    if ! "$FRUGAL" train "${COMMON[@]}" --steps 1 "${OPTS[@]}" --help >/dev/null 2>"$work/probe.err"; then
        skip "$1" "this frugal rejects its options ($(rejected_msg "$work/probe.err")); it needs issue 24's --lora, --base-precision, --fused-head and --optimizer adafactor"
    fi
}

frugal_run() { # config round
    local c=$1 r=$2 base=$work/$1.frugal.$2 rc
    opts_of "$c"
    echo "round $r/$ROUNDS: $c frugal" >&2
    /usr/bin/time -f '%M %e' -o "$base.time" "$FRUGAL" train "${COMMON[@]}" --steps $((WARMUP + N)) \
        "${OPTS[@]}" >"$base.out" 2>"$base.err"
    rc=$?
    if [ $rc -eq 2 ]; then
        skip "$c" "frugal rejected the command line: $(rejected_msg "$base.err")"
        return
    fi
    $PY - "$c" "$r" "$rc" "$base" "$WARMUP" "$N" >>"$RUNS" <<'EOF'
import json, re, statistics, sys
c, r, rc, base, warmup, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), int(sys.argv[6])
err, out = open(base + ".err").read(), open(base + ".out").read()
run = {"config": c, "impl": "frugal", "round": r, "rc": rc}
try:
    kib, wall = open(base + ".time").read().split()[-2:]
    run["peak_rss_bytes"], run["wall_s"] = int(kib) * 1024, float(wall)
except (OSError, ValueError):
    pass
# "epoch E/EE step i/n loss L X ms/step": X is the mean since the epoch's
# start, so the first i steps took i*X ms; one line a step up to 19 steps,
# every tenth of the epoch's steps past that (an interval's steps share its time)
step_ms, last = {}, {}
for m in re.finditer(r"^epoch (\d+)/\d+ step (\d+)/\d+ loss \S+ ([0-9.]+) ms/step", err, re.M):
    e, i, x = int(m.group(1)), int(m.group(2)), float(m.group(3))
    i0, t0 = last.get(e, (0, 0.0))
    t = i * x
    if i > i0:
        for k in range(i0 + 1, i + 1):
            step_ms[(e, k)] = (t - t0) / (i - i0)
    last[e] = (i, t)
timed = [v for k, v in sorted(step_ms.items())][warmup:warmup + n]
if timed:
    run["median_ms"] = statistics.median(timed)
    run["step_ms"] = [round(v, 1) for v in timed]
m = re.search(r"predicted for the training step ([0-9.]+) MiB reserved.*?measured peak reserved "
              r"([0-9.]+) MiB", out, re.S)
if m:
    run["predicted_reserved_mib"], run["measured_reserved_peak_mib"] = float(m.group(1)), float(m.group(2))
run["within_budget"] = "(within the budget)" in out if "budget" in out else None
if rc or not timed:
    tail = [l for l in err.strip().splitlines() if l.startswith("frugal")][-1:] or err.strip().splitlines()[-1:]
    run["failed"] = True
    run["error"] = tail[0] if tail else f"exit {rc}"
    print(f"finetune.sh: frugal {c} round {r} failed (exit {rc}): {run['error']}", file=sys.stderr)
print(json.dumps(run))
EOF
}

torch_run() { # config round
    local c=$1 r=$2 line
    echo "round $r/$ROUNDS: $c torch" >&2
    local ac=()
    [ "$c" = lora-ac ] && ac=(--autocast bf16)
    if line=$(LD_LIBRARY_PATH="$OPENBLAS_OMP${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" $PY bench/torch_finetune.py \
        --mode "${c%-ac}" "${ac[@]}" --seq 512 --batch 4 --steps "$N" --warmup "$WARMUP" --threads "$THREADS" "${TORCH_ARR[@]}" --json | tail -1) &&
        [ -n "$line" ]; then
        echo "{\"config\": \"$c\", \"impl\": \"torch\", \"round\": $r, \"run\": $line}" >>"$RUNS"
    else
        echo "finetune.sh: torch $c round $r failed" >&2
        echo "{\"config\": \"$c\", \"impl\": \"torch\", \"round\": $r, \"failed\": true}" >>"$RUNS"
    fi
}

# the head's bytes: predicted (estimate, plan) and measured (train --json), once each: they
# do not vary from run to run
head_bytes() { # config
    local c=$1 base=$work/$1.bytes
    opts_of "$c"
    "$FRUGAL" estimate --model "$MODEL" --seq 512 --batch 4 "${OPTS[@]}" --json >"$base.est" 2>"$base.est.err"
    echo "{\"config\": \"$c\", \"impl\": \"estimate\", \"rc\": $?}" >>"$RUNS"
    "$FRUGAL" plan "${COMMON[@]}" "${OPTS[@]}" --json >"$base.plan" 2>"$base.plan.err"
    echo "{\"config\": \"$c\", \"impl\": \"plan\", \"rc\": $?}" >>"$RUNS"
    "$FRUGAL" train "${COMMON[@]}" --steps 3 "${OPTS[@]}" --json >"$base.train" 2>"$base.train.err"
    local rc=$?
    if [ $rc -eq 2 ]; then
        skip "$c" "frugal rejected the command line: $(rejected_msg "$base.train.err")"
        return
    fi
    $PY - "$c" "$base" "$rc" >>"$RUNS" <<'EOF'
import json, sys
c, base, rc = sys.argv[1], sys.argv[2], int(sys.argv[3])
def objects(path):
    try:
        text = open(path).read()
    except OSError:
        return []
    dec, at, out = json.JSONDecoder(), 0, []
    while (at := text.find("{", at)) >= 0:
        try:
            o, at = dec.raw_decode(text, at)
            out.append(o)
        except ValueError:
            at += 1
    return out
r = {"config": c, "impl": "bytes", "train_rc": rc}
est = [o for o in objects(base + ".est") if "predicted_peak_total" in o]
plan = [o for o in objects(base + ".plan") if "reserved_bytes" in o]
summ = [o for o in objects(base + ".train") if o.get("event") == "summary"]
if est:
    r["estimate_peak_total"] = est[-1]["predicted_peak_total"]
if plan:
    r["plan_peak_total"], r["plan_reserved"] = plan[-1]["predicted_peak_total"], plan[-1]["reserved_bytes"]
if summ:
    s = summ[-1]
    r.update({k: s[k] for k in ("predicted_step_reserved", "measured_reserved_peak", "peak_rss_bytes") if k in s})
for what, f in (("estimate", ".est.err"), ("plan", ".plan.err"), ("train", ".train.err")):
    lines = [l for l in open(base + f).read().splitlines() if l.startswith("frugal ")]
    if lines:
        r[what + "_error"] = lines[0]
print(json.dumps(r))
EOF
}

started=$(date -u '+%Y-%m-%d %H:%M UTC')
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain -- src include models tools 2>/dev/null)" ] && commit="$commit+dirty"
t_start=$SECONDS

CONFIGS=()
for p in $PARTS; do
    case $p in
    lora) CONFIGS+=(lora) && [ "${AUTOCAST:-1}" != 0 ] && CONFIGS+=(lora-ac) ;;
    full) CONFIGS+=("$p") ;;
    head) CONFIGS+=(head-off head-auto) ;;
    *) echo "finetune.sh: PARTS: unknown part '$p' (lora, full, head)" >&2; exit 1 ;;
    esac
done
for c in "${CONFIGS[@]}"; do [ "$c" = lora-ac ] || probe "$c"; done
# the fused head part needs both sides: one skipped skips the other
[ -n "${SKIP[head-off]:-}${SKIP[head-auto]:-}" ] && { skip head-off "${SKIP[head-off]:-its partner head-auto is skipped}"; skip head-auto "${SKIP[head-auto]:-its partner head-off is skipped}"; }
for c in head-off head-auto; do
    [[ " ${CONFIGS[*]} " == *" $c "* ]] && [ -z "${SKIP[$c]:-}" ] && head_bytes "$c"
done

for ((r = 1; r <= ROUNDS; r++)); do
    for c in "${CONFIGS[@]}"; do
        [ -n "${SKIP[$c]:-}" ] && continue
        case $c in
        lora | full) order="frugal torch" && [ $((r % 2)) -eq 0 ] && order="torch frugal" ;;
        lora-ac) order="torch" ;;
        head-off | head-auto) # off then auto in odd rounds, auto then off in even ones
            [ $((r % 2)) -eq 0 ] && c=$([ $c = head-off ] && echo head-auto || echo head-off)
            order="frugal" ;;
        esac
        for impl in $order; do
            [ -n "${SKIP[$c]:-}" ] && break
            "${impl}_run" "$c" "$r"
        done
    done
done
elapsed=$((SECONDS - t_start))

skipped=$work/skipped.txt
: >"$skipped"
for c in "${!SKIP[@]}"; do echo "$c: ${SKIP[$c]}" >>"$skipped"; done

mkdir -p "$(dirname "$OUT")"
{
    echo "# bench/finetune.sh: GPT-2 124M (random init, random tokens), batch 4, T 512, $THREADS threads, $ROUNDS alternated rounds of $N steps after $WARMUP, $started"
    echo "# CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), $(nproc) cores; frugal $commit, PyTorch $($PY -c 'import torch; print(torch.__version__)' 2>/dev/null); ${elapsed}s, load average $load_start -> $(cut -d' ' -f1-3 /proc/loadavg)"
    echo
    LB="${LORA_BUDGET:-480MiB}${LORA_EXTRA:+ $LORA_EXTRA}" FB=${FULL_BUDGET:-896MiB} $PY - "$RUNS" "$skipped" <<'EOF'
import json, os, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
skipped = dict(l.rstrip("\n").split(": ", 1) for l in open(sys.argv[2]) if ": " in l)
MiB, GiB = 2**20, 2**30

def cells(c, impl):
    out = []
    for r in runs:
        if r["config"] != c or r["impl"] != impl or r.get("failed"):
            continue
        out.append(r.get("run", r))
    return out

def med(c, impl, key):
    v = [x[key] for x in cells(c, impl) if x.get(key) is not None]
    return statistics.median(v) if v else None

def f_ms(v):
    return "-" if v is None else f"{v:.0f}"

def f_mib(v):
    return "-" if v is None else f"{v / MiB:.0f} MiB"

names = {"lora": "LoRA r=8 (frugal: int8 base, fused head, --budget %s; PyTorch: fp32 base, AdamW)" % os.environ["LB"],
         "full": "full (frugal: Adafactor, bf16-mixed, fused head, --budget %s; PyTorch: AdamW fp32)" % os.environ["FB"]}
goals = {"lora": (512 * MiB, 0.7), "full": (1 * GiB, None)}
present = {r["config"] for r in runs} | set(skipped)
rows = [c for c in ("lora", "full") if c in present]
if rows:
    print("| fine-tune | frugal ms/step | PyTorch ms/step | frugal / PyTorch | frugal peak RSS | PyTorch peak RSS | goal | met |")
    print("|---|---:|---:|---:|---:|---:|---|---|")
for c in rows:
    if c in skipped:
        print(f"| {names[c]} | skipped | | | | | | |")
        continue
    ft, tt = med(c, "frugal", "median_ms"), med(c, "torch", "median_ms")
    fr, tr = med(c, "frugal", "peak_rss_bytes"), med(c, "torch", "peak_rss_bytes")
    rss_goal, t_goal = goals[c]
    ratio = ft / tt if ft and tt else None
    goal = f"RSS <= {rss_goal // MiB} MiB" + (f", time <= {t_goal}x" if t_goal else "")
    met = []
    if fr is not None:
        met.append(f"RSS {'yes' if fr <= rss_goal else 'NO'}")
    if t_goal and ratio is not None:
        met.append(f"time {'yes' if ratio <= t_goal else 'NO'}")
    print(f"| {names[c]} | {f_ms(ft)} | {f_ms(tt)} | {'-' if ratio is None else f'{ratio:.2f}'} | "
          f"{f_mib(fr)} | {f_mib(tr)} | {goal} | {', '.join(met) or '-'} |")
if "lora" in rows and "lora" not in skipped and cells("lora-ac", "torch"):
    ft, at = med("lora", "frugal", "median_ms"), med("lora-ac", "torch", "median_ms")
    fr, ar = med("lora", "frugal", "peak_rss_bytes"), med("lora-ac", "torch", "peak_rss_bytes")
    ratio = ft / at if ft and at else None
    print(f"| LoRA, mixed against mixed: the same frugal run against PyTorch's bf16 autocast "
          f"(torch.autocast('cpu', dtype=torch.bfloat16), fp32 base) | {f_ms(ft)} | {f_ms(at)} | "
          f"{'-' if ratio is None else f'{ratio:.2f}'} | {f_mib(fr)} | {f_mib(ar)} | (beside the goal) | - |")
if rows:
    print()

if "head-off" in present or "head-auto" in present:
    print("Fused head alone (vocabulary 50257, batch 4, T 512; frugal --fused-head off against auto):")
    print()
    if "head-off" in skipped or "head-auto" in skipped:
        print("skipped")
    else:
        b = {c: next((r for r in runs if r["config"] == c and r["impl"] == "bytes"), {}) for c in ("head-off", "head-auto")}
        print("| bytes | --fused-head off | --fused-head auto | saved |")
        print("|---|---:|---:|---:|")
        for key, what in (("estimate_peak_total", "predicted peak (estimate)"),
                          ("plan_reserved", "predicted reserved (plan)"),
                          ("predicted_step_reserved", "predicted reserved (train)"),
                          ("measured_reserved_peak", "measured reserved peak (train --steps 3)"),
                          ("peak_rss_bytes", "measured peak RSS (train --steps 3)")):
            off, auto = b["head-off"].get(key), b["head-auto"].get(key)
            saved = f"{off - auto} ({(off - auto) / MiB:.1f} MiB)" if off is not None and auto is not None else "-"
            print(f"| {what} | {'-' if off is None else off} | {'-' if auto is None else auto} | {saved} |")
        for c in ("head-off", "head-auto"):
            for k in ("estimate_error", "plan_error", "train_error"):
                if k in b[c]:
                    print(f"\n{c} {k.split('_')[0]}: {b[c][k]}")
        print()
        off, auto = med("head-off", "frugal", "median_ms"), med("head-auto", "frugal", "median_ms")
        print("| step | --fused-head off | --fused-head auto | auto / off |")
        print("|---|---:|---:|---:|")
        print(f"| median ms/step | {f_ms(off)} | {f_ms(auto)} | {f'{auto / off:.2f}' if off and auto else '-'} |")
    print()

for c, msg in sorted(skipped.items()):
    print(f"skipped {c}: {msg}")
fails = [r for r in runs if r.get("failed")]
for r in fails:
    print(f"failed: {r['config']} {r['impl']} round {r.get('round')}: {r.get('error', '')}")
print("Spread of the per-run medians (min-max ms/step) and frugal's reserved peak:")
for c in ("lora", "lora-ac", "full", "head-off", "head-auto"):
    parts = []
    for impl in ("frugal", "torch"):
        v = [x["median_ms"] for x in cells(c, impl) if x.get("median_ms") is not None]
        if v:
            parts.append(f"{impl} {min(v):.0f}-{max(v):.0f}")
    res = [x["measured_reserved_peak_mib"] for x in cells(c, "frugal") if "measured_reserved_peak_mib" in x]
    if res:
        parts.append(f"frugal measured reserved peak {max(res):.1f} MiB (predicted "
                     f"{cells(c, 'frugal')[0].get('predicted_reserved_mib')} MiB)")
    if parts:
        print(f"  {c}: {'; '.join(parts)}")
slow = [x for c in ("lora", "full") for x in cells(c, "torch") if x.get("blas_ok") is False]
if slow:
    print("WARNING: PyTorch ran on a slow BLAS.")
print("Weights are random (each side's GPT-2 init), tokens random ids below 50257 (seeded): "
      "for memory and speed the same as the released weights on real text.")
EOF
    echo
    echo "runs (JSON lines):"
    sed 's/^/    /' "$RUNS"
} | tee "$OUT"
cp "$RUNS" "${OUT%.md}.jsonl"
