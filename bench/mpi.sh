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
# Then ZeRO: each rank's peak bytes of parameters, gradients and optimizer
# state (min and max over the ranks) at stages 0, 1 and 2 on 2 and 4 ranks
# (4 oversubscribed), for ZMODEL (the ResNet by default: the GPT part above
# times gpt-tiny), against
# `frugal estimate --ranks N --zero K` (ZeRO's formulas).
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
#   ONLY=zero bench/mpi.sh       # the ZeRO table only (the timings kept)
#
# Environment: BIN [build/frugal], MODEL [cnn], LIMIT [3840], BATCH [128],
# REPEATS [3] (the fastest run of each counts), BUCKET_MB [25], OUT [bench/out],
# ZMODEL [resnet], ZBATCH [32], ONLY [all; zero], PARTS [cnn gpt], GPT_STEPS [6],
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
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
common=(train --model "$model" --epochs 1 --batch "$batch" --limit "$limit" --test-limit 256
    --optimizer adam --json --bucket-cap-mb "$bucket")

# field of the last JSON line with this event
field() { python3 -c 'import json,sys
ev=[json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
print([e for e in ev if e.get("event")==sys.argv[2]][-1].get(sys.argv[3], 0))' "$@"; }

best() { # label, command...: the fastest of REPEATS runs; prints "seconds wait"
    local label=$1 b="" w=""
    shift
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

gpt_part() {
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
        echo "(1 min) was $load0 at the start and $load1 at the end on these $(nproc) cores: other"
        echo "work shared the machine, which punishes two OpenMP threads most (their barriers"
        echo "wait for a descheduled thread), so the ratio flatters the 2-rank runs."
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
    three
    echo "# Data parallelism on one machine ($(nproc) cores): $model, Adam, global batch $batch, $limit samples"
    echo
    echo "$(date -u +%Y-%m-%d), $(mpirun --version | head -1), fastest of $repeats runs each;"
    echo "seconds are the training loop's for the epoch (the epoch event), wait is rank 0's"
    echo "time in MPI_Waitall for the gradient buckets (bucket cap $bucket MiB)."
    echo
    echo "| run | s / epoch | ratio to 1 process | waiting for sums | share of the epoch |"
    echo "|---|---:|---:|---:|---:|"
    echo "| 1 process x 2 threads | $one | 1.00 | - | - |"
    rows
}

zero_table() {
    local zmodel=${ZMODEL:-resnet} zbatch=${ZBATCH:-32}
    echo
    echo "## ZeRO: bytes per rank, $zmodel, Adam, global batch $zbatch"
    echo
    echo "Peak bytes of each rank (measured: min-max over the ranks; predicted:"
    echo "\`frugal estimate --ranks N --zero K\`, gradients including stage 2's bucket)."
    echo
    echo "| ranks | stage | parameters | gradients | optimizer | predicted P / G / O |"
    echo "|---:|---:|---:|---:|---:|---|"
    for n in 2 4; do
        "$bin" estimate --model "$zmodel" --batch "$zbatch" --ranks "$n" --optimizer adam --json \
            >"$tmp/est.json"
        for z in 0 1 2; do
            mpirun --oversubscribe -np "$n" -x OMP_NUM_THREADS=1 "$bin" train --model "$zmodel" \
                --epochs 1 --batch "$zbatch" --limit $((zbatch * 2)) --test-limit 32 --threads 1 \
                --optimizer adam --json --zero "$z" >"$tmp/z.json" 2>"$tmp/err" ||
                { cat "$tmp/err" >&2; exit 1; }
            python3 - "$tmp/z.json" "$tmp/est.json" "$n" "$z" <<'PY'
import json, sys
ev = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rp = [e for e in ev if e.get("event") == "summary"][-1]["rank_peaks"]
est = json.loads(open(sys.argv[2]).read().strip().splitlines()[-1])
st = [s for s in est["stages"] if s["zero"] == int(sys.argv[4])][0]
def mm(k):
    lo, hi = rp[k]["min"], rp[k]["max"]
    return "%d" % hi if lo == hi else "%d-%d" % (lo, hi)
pred = (st["parameters"], st["gradients"] + st["buckets"], st["optimizer"])
meas = (rp["parameters"]["max"], rp["gradients"]["max"], rp["optimizer"]["max"])
print("| %s | %s | %s | %s | %s | %d / %d / %d%s |" % (sys.argv[3], sys.argv[4], mm("parameters"),
      mm("gradients"), mm("optimizer"), *pred, "" if pred == meas else " (differs)"))
PY
        done
    done
}

if [ "${ONLY:-all}" = zero ]; then
    { sed '/^## ZeRO/,$d' "$out/mpi.md" 2>/dev/null | sed -e :a -e '/^\n*$/{$d;N;ba' -e '}'; zero_table; } >"$tmp/md"
    cp "$tmp/md" "$out/mpi.md"
    cat "$out/mpi.md"
else
    if [[ " $parts " == *" gpt "* ]]; then gpt_part; fi
    if [[ " $parts " == *" cnn "* ]]; then { timings; zero_table; } | tee "$out/mpi.md"; fi
fi
