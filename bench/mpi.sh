#!/usr/bin/env bash
# mpi.sh — data parallelism on one machine: `mpirun -np 2 frugal train` with
# one thread a rank against one process with two threads, the same global
# batch, for the CNN on Fashion-MNIST (Adam): seconds an epoch of LIMIT
# samples (the training loop's, from the epoch event), the 2-rank/1-process
# time ratio, and the share of rank 0's time spent waiting for the gradient
# sums (MPI_Waitall after backward), with the buckets started during
# backward (overlap) and all after it (--no-overlap). The CNN's gradients
# (about 1.7 MB) make two buckets with DDP's caps (1 MiB, then 25 MiB);
# BUCKET_MB=0.25 gives more, smaller ones.
#
# Then ZeRO: each rank's peak bytes of parameters, gradients, optimizer
# state and all allocated at once (min and max over the ranks) at stages 0-3
# on 2 and 4 ranks (4 oversubscribed), for ZMODEL, against `frugal estimate
# --ranks N --zero K --json` for the same run and ZeRO's formulas by hand.
# ZMODEL is GPT-2 124M by default, the largest model that runs here: gpt2-xl
# (1.5B) would need 16 x 1.56e9 = 25 GB a rank at stage 0 on this machine's
# 24 GiB. A language model runs ZSTEPS steps of global batch ZBATCH windows
# of ZSEQ tokens with AdamW (on 4 ranks one window each; at most 2.3 GiB
# a rank, 7-17 s a run); an image model (ZMODEL=resnet or cnn) one epoch
# of 2 x ZBATCH samples with Adam.
#
# On paper: `frugal estimate --ranks 64` for GPT-2 1.5B
# (models/gpt2-xl.model, AdamW, fp16-mixed, global batch 64 of 1024 tokens)
# at each stage, next to the ZeRO paper's formulas, into
# bench/out/mpi_zero_paper.md.
#
# The GPT part: gpt-tiny (6 layers, d 384: 10.7 M parameters, 43 MB of
# gradients, two buckets) on byte-level text, the same three runs for
# GPT_STEPS steps of global batch GPT_BATCH windows of GPT_SEQ tokens (AdamW);
# seconds are rank 0's training run (the summary's, a small validation at the
# end included), into bench/out/mpi_gpt.md.
#
#   bench/mpi.sh                 # writes bench/out/mpi.md and bench/out/mpi_gpt.md
#   LIMIT=2560 BATCH=128 bench/mpi.sh
#   PARTS=gpt bench/mpi.sh       # the GPT only
#   ONLY=zero bench/mpi.sh       # the ZeRO tables only (the timings kept)
#   ONLY=paper bench/mpi.sh      # the paper table only (no run)
#
# Environment: BIN [build/frugal], MODEL [cnn], LIMIT [3840], BATCH [128],
# REPEATS [3] (the fastest run of each counts), BUCKET_MB [25], OUT [bench/out],
# ZMODEL [gpt2], ZBATCH [4 windows; 32 images], ZSEQ [64], ZSTEPS [2],
# ONLY [all; zero; paper], PARTS [cnn gpt], GPT_STEPS [6],
# GPT_BATCH [8], GPT_SEQ [128], TEXT [the fortunes joined, as bench/gpt.sh makes
# them: /tmp/frugal-gpt-fortunes.txt].
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
bin=${BIN:-$root/build/frugal}
model=${MODEL:-cnn}
limit=${LIMIT:-3840}
batch=${BATCH:-128}
repeats=${REPEATS:-3}
parts=${PARTS:-cnn gpt}
event=epoch
bucket=${BUCKET_MB:-25}
out=${OUT:-$root/bench/out}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl=self,vader,tcp
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(train --model "$model" --epochs 1 --batch "$batch" --limit "$limit" --test-limit 256
    --optimizer adam --json --bucket-cap-mb "$bucket")

# field of the last JSON line with this event
field() { python3 -c 'import json,sys
ev=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print([e for e in ev if e.get("event")==sys.argv[2]][-1].get(sys.argv[3], 0))' "$@"; }

best() { # label, command...: the fastest of REPEATS runs; prints "seconds wait"
    local b="" w=""
    shift # the label only names the run for a reader
    for _ in $(seq "$repeats"); do
        "$@" >"$tmp/run.json" 2>"$tmp/err" || { cat "$tmp/err" >&2; exit 1; }
        local s
        s=$(field "$tmp/run.json" "$event" seconds)
        if [ -z "$b" ] || python3 -c "import sys; sys.exit(not $s < $b)"; then
            b=$s
            w=$(field "$tmp/run.json" summary comm_wait_seconds)
        fi
    done
    echo "$b $w"
}

# the three runs of one model: sets one, ov, wov, no, wno
three() {
    read -r one _ < <(best one env OMP_NUM_THREADS=2 "$bin" "${common[@]}" --threads 2)
    read -r ov wov < <(best overlap mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" \
        "${common[@]}" --threads 1)
    read -r no wno < <(best no-overlap mpirun --oversubscribe -np 2 -x OMP_NUM_THREADS=1 "$bin" \
        "${common[@]}" --threads 1 --no-overlap)
}

rows() { # the two 2-rank rows of the table
    python3 - "$one" "$ov" "$wov" "$no" "$wno" <<'PY'
import sys
one, ov, wov, no, wno = map(float, sys.argv[1:])
for name, s, w in (("2 ranks x 1 thread, overlap", ov, wov), ("2 ranks x 1 thread, --no-overlap", no, wno)):
    print("| %s | %.3f | %.2f | %.3f s | %.1f%% |" % (name, s, s / one, w, 100 * w / s if s else 0))
PY
}

# the text for the GPTs: TEXT, or Debian's fortunes joined as bench/gpt.sh makes them
text_file() {
    text=${TEXT:-/tmp/frugal-gpt-fortunes.txt}
    if [ ! -s "$text" ]; then
        [ -d /usr/share/games/fortunes ] || {
            echo "mpi.sh: no TEXT and no /usr/share/games/fortunes (apt-get install fortunes)" >&2
            exit 1
        }
        find /usr/share/games/fortunes -type f ! -name '*.dat' ! -name '*.u8' -print0 | sort -z |
            xargs -0 cat >"$text.tmp"
        mv "$text.tmp" "$text"
    fi
}

gpt_part() {
    text_file
    gsteps=${GPT_STEPS:-6} gbatch=${GPT_BATCH:-8} gseq=${GPT_SEQ:-128}
    saved=("${common[@]}")
    common=(train --model gpt-tiny --data "$text" --seq "$gseq" --batch "$gbatch" --steps "$gsteps"
        --test-limit 8 --optimizer adamw --lr 6e-4 --json --bucket-cap-mb "$bucket")
    event=summary
    load0=$(cut -d' ' -f1 /proc/loadavg)
    three
    load1=$(cut -d' ' -f1 /proc/loadavg)
    {
        echo "# Data parallelism on one machine ($(nproc) cores): gpt-tiny, AdamW, global batch $gbatch x $gseq tokens, $gsteps steps"
        echo
        echo "$(date -u +%Y-%m-%d), $(mpirun --version | head -1), fastest of $repeats runs each;"
        echo "seconds are rank 0's training run (the summary's: $gsteps steps and a validation"
        echo "of 8 windows), wait is rank 0's time in MPI_Waitall for the gradient buckets"
        echo "(bucket cap $bucket MiB); text: $(basename "$text"), byte-level. The load average"
        echo "(1 min) was $load0 at the start and $load1 at the end on these $(nproc) cores (these"
        echo "runs add up to 2). A load above that means other work shared the machine, which"
        echo "punishes two OpenMP threads most (their barriers wait for a descheduled thread),"
        echo "so then the ratio flatters the 2-rank runs."
        echo
        echo "| run | s / run | ratio to 1 process | waiting for sums | share of the run |"
        echo "|---|---:|---:|---:|---:|"
        echo "| 1 process x 2 threads | $one | 1.00 | - | - |"
        rows
    } | tee "$out/mpi_gpt.md"
    common=("${saved[@]}")
    event=epoch
}

timings() {
    local load0 load1
    load0=$(cut -d' ' -f1 /proc/loadavg)
    three
    load1=$(cut -d' ' -f1 /proc/loadavg)
    echo "# Data parallelism on one machine ($(nproc) cores): $model, Adam, global batch $batch, $limit samples"
    echo
    echo "$(date -u +%Y-%m-%d), $(mpirun --version | head -1), fastest of $repeats runs each;"
    echo "seconds are the training loop's for the epoch (the epoch event), wait is rank 0's"
    echo "time in MPI_Waitall for the gradient buckets (bucket cap $bucket MiB). The load"
    echo "average (1 min) was $load0 at the start and $load1 at the end on these $(nproc) cores"
    echo "(these runs add up to 2; above that, other work shared the machine)."
    echo
    echo "| run | s / epoch | ratio to 1 process | waiting for sums | share of the epoch |"
    echo "|---|---:|---:|---:|---:|"
    echo "| 1 process x 2 threads | $one | 1.00 | - | - |"
    rows
}

# a language model: a built-in GPT or a model file with `input tokens`
is_lm() { case $1 in gpt-tiny | gpt2) return 0 ;; esac; [ -f "$1" ] && grep -q '^input tokens' "$1"; }

zero_table() {
    local zmodel=${ZMODEL:-gpt2} zseq=${ZSEQ:-64} zsteps=${ZSTEPS:-2} desc
    local -a run est
    if is_lm "$zmodel"; then
        local zbatch=${ZBATCH:-4}
        text_file
        run=(--data "$text" --seq "$zseq" --batch "$zbatch" --steps "$zsteps" --test-limit "$zbatch"
            --optimizer adamw --lr 6e-4)
        est=(--seq "$zseq" --batch "$zbatch" --optimizer adamw)
        desc="AdamW, global batch $zbatch windows of $zseq tokens, $zsteps steps"
    else
        local zbatch=${ZBATCH:-32}
        run=(--epochs 1 --batch "$zbatch" --limit $((zbatch * 2)) --test-limit 32 --optimizer adam)
        est=(--batch "$zbatch" --optimizer adam)
        desc="Adam, global batch $zbatch, $((zbatch * 2)) samples"
    fi
    echo
    echo "## ZeRO: bytes per rank, $zmodel, $desc"
    echo
    echo "$(date -u +%Y-%m-%d), commit $(git -C "$root" rev-parse --short HEAD), one thread a rank,"
    echo "4 ranks oversubscribed on $(nproc) cores. Each rank's peak bytes of parameters,"
    echo "gradients (the shard and the buckets' blocks together, as the run counts them),"
    echo "optimizer state and everything allocated at once (the summary's \`rank_peaks\`:"
    echo "min-max over the ranks; one figure where all ranks agree), against"
    echo "\`frugal estimate --ranks N --zero K --json\` for the same run (P / G + buckets /"
    echo "O / total, the total a sum of the categories' peaks, which need not coincide)"
    echo "and ZeRO's formulas by hand: Ψ trainable values, 4Ψ bytes of fp32 weights P,"
    echo "4Ψ of gradients G, 8Ψ of Adam moments O: P + G + O at stage 0, P + G + O/N at 1,"
    echo "P + (G + O)/N at 2, (P + G + O)/N at 3 (weights without gradients, such as"
    echo "BatchNorm's statistics, added whole). The last column is the run's final"
    echo "validation (test) loss: every stage trains the same model, so it agrees to"
    echo "the summation order's rounding."
    echo
    echo "| ranks | stage | parameters | gradients | optimizer | allocated total | predicted P / G+B / O | predicted total | ZeRO P+G+O | loss |"
    echo "|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"
    : >"$out/mpi_zero_runs.jsonl"
    for n in 2 4; do
        "$bin" estimate --model "$zmodel" "${est[@]}" --ranks "$n" --threads 1 --json >"$tmp/est.json"
        for z in 0 1 2 3; do
            mpirun --oversubscribe -np "$n" -x OMP_NUM_THREADS=1 "$bin" train --model "$zmodel" \
                "${run[@]}" --threads 1 --json --zero "$z" >"$tmp/z.json" 2>"$tmp/err" ||
                { cat "$tmp/err" >&2; exit 1; }
            python3 - "$tmp/z.json" "$tmp/est.json" "$n" "$z" "$zmodel" "$out/mpi_zero_runs.jsonl" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
summ = [e for e in ev if e.get("event") == "summary"][-1]
rp = summ["rank_peaks"]
est = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
n, z = int(sys.argv[3]), int(sys.argv[4])
st = [s for s in est["stages"] if s["zero"] == z][0]
with open(sys.argv[6], "a") as f:  # the raw figures: the run's summary and the estimate's stage
    f.write(json.dumps({"model": sys.argv[5], "ranks": n, "zero": z, "rank_peaks": rp,
                        "rank0_memory": summ["memory"], "rank0_peak_rss_bytes": summ["peak_rss_bytes"],
                        "rank0_seconds": summ["seconds"], "test_loss": summ["test_loss"],
                        "estimate": st}) + "\n")
s0 = [s for s in est["stages"] if s["zero"] == 0][0]
psi = s0["gradients"] / 4  # fp32 gradients: one a trainable value
P, G, O = 4 * psi, 4 * psi, 8 * psi
fixed = s0["parameters"] - P  # weights without gradients (BatchNorm's statistics): replicated
zero = fixed + (P + G + O, P + G + O / n, P + (G + O) / n, (P + G + O) / n)[z]
def mm(k):
    lo, hi = rp[k]["min"], rp[k]["max"]
    return "%d" % hi if lo == hi else "%d-%d" % (lo, hi)
mib = lambda b: "%.1f MiB" % (b / 2**20)
pred = (st["parameters"], st["gradients"] + st["buckets"], st["optimizer"])
meas = (rp["parameters"]["max"], rp["gradients"]["max"], rp["optimizer"]["max"])
tot = rp["allocated_total"]
tots = mib(tot["max"])
if mib(tot["min"]) != tots:
    tots = "%s-%s" % (mib(tot["min"]), tots)
print("| %d | %d | %s | %s | %s | %s | %d / %d / %d%s | %s | %s | %.6f |" % (n, z,
      mm("parameters"), mm("gradients"), mm("optimizer"), tots, *pred,
      "" if pred == meas else " (differs)", mib(st["total"]), mib(zero), summ["test_loss"]))
PY
        done
    done
}

# ZeRO's Figure 1 on paper: per-rank bytes of GPT-2 1.5B on 64 ranks from
# `frugal estimate` next to the paper's mixed-precision formulas
paper_table() {
    local xl=$root/models/gpt2-xl.model
    "$bin" estimate --model "$xl" --ranks 64 --batch 64 --seq 1024 --optimizer adamw \
        --precision fp16-mixed --threads 1 --json >"$tmp/xl.json"
    python3 - "$tmp/xl.json" "$(git -C "$root" rev-parse --short HEAD)" <<'PY'
import json, sys
est = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
st = {s["zero"]: s for s in est["stages"]}
# GPT-2 1.5B by hand: wte V*d, wpe T*d, 48 blocks of 12d^2 + 13d (c_attn 3d^2+3d,
# c_proj d^2+d, c_fc 4d^2+4d, c_proj 4d^2+d, two layernorms 4d), ln_f 2d; lm_head tied
V, T, L, d = 50257, 1024, 48, 1600
psi = V * d + T * d + L * (12 * d * d + 13 * d) + 2 * d
assert st[0]["parameters"] == 4 * psi, (st[0]["parameters"], psi)
N, K = 64, 12
def paper(p):  # ZeRO paper, Figure 1: fp16 weights and gradients, K bytes of fp32 state
    return ((2 + 2 + K) * p, 2 * p + 2 * p + K * p / N, 2 * p + (2 + K) * p / N,
            (2 + 2 + K) * p / N)
def frugal_f(p):  # the same formulas for frugal's fp16-mixed: 4-byte weights and gradients
    P, G, O = 4 * p, 4 * p, 8 * p
    return (P + G + O, P + G + O / N, P + (G + O) / N, (P + G + O) / N)
gb = lambda b: "%.2f" % (b / 1e9)
print("# ZeRO on paper: GPT-2 1.5B on 64 ranks, per-rank bytes by stage")
print()
print("`frugal estimate --model models/gpt2-xl.model --ranks 64 --batch 64 --seq 1024")
print("--optimizer adamw --precision fp16-mixed --json` (commit %s), each rank's step" % sys.argv[2])
print("one window of 1024 tokens, against the ZeRO paper's per-device formulas (Rajbhandari")
print("et al. 2020, Figure 1: mixed-precision Adam, K = 12 bytes of fp32 state a parameter,")
print("N = 64). Ψ = %d, counted by hand from the model's shapes and equal to the" % psi)
print("estimate's count. GB are 10^9 bytes, as in the paper.")
print()
print("| stage | paper's formula | paper, Ψ = 7.5B | paper, this Ψ | frugal's layout, this Ψ | frugal P | G | O | buckets | step | frugal estimate |")
print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
forms = ("(2+2+K)Ψ", "2Ψ+2Ψ+KΨ/N", "2Ψ+(2+K)Ψ/N", "(2+2+K)Ψ/N")
for z in range(4):
    s = st[z]
    print("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s | **%s** |" % (z, forms[z],
          "%.1f" % (paper(7.5e9)[z] / 1e9), gb(paper(psi)[z]), gb(frugal_f(psi)[z]),
          gb(s["parameters"]), gb(s["gradients"]), gb(s["optimizer"]), gb(s["buckets"]),
          gb(s["rest"]), gb(s["total"])))
PY
}

case ${ONLY:-all} in
paper) ;;
zero)
    { # the timings above the ZeRO part kept, if there are any
        if [ -f "$out/mpi.md" ]; then
            sed '/^## ZeRO/,$d' "$out/mpi.md" | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'
        fi
        zero_table
    } >"$tmp/md"
    cp "$tmp/md" "$out/mpi.md"
    cat "$out/mpi.md"
    ;;
*)
    if [[ " $parts " == *" gpt "* ]]; then gpt_part; fi
    if [[ " $parts " == *" cnn "* ]]; then { timings; zero_table; } | tee "$out/mpi.md"; fi
    ;;
esac
paper_table | tee "$out/mpi_zero_paper.md"
