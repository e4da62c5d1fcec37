#!/usr/bin/env bash
# step_ab.sh — step time of two builds side by side (a refactor's "within
# noise" check, issue 22): the CNN's training step (bench_step: median ms of
# STEPS timed steps after warm-up, Adam, batch 128) and gpt-tiny's (frugal
# train: seconds per step of a short run, AdamW, batch 8, T 256, evaluation
# off the clock), the builds alternating A B, B A, ... in fresh processes
# so that the host's drift falls on both. Prints each run and the ratio of
# the medians (B / A) per model, and names the CPU.
#
#   bash bench/step_ab.sh OLD_BUILD_DIR NEW_BUILD_DIR [ROUNDS]
set -uo pipefail
a=$(realpath "$1") b=$(realpath "$2") rounds=${3:-4}
steps=${STEPS:-20}
text=/usr/share/games/fortunes
export OMP_NUM_THREADS=2
echo "# $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; A=$a B=$b; $rounds rounds"
cnn() { "$1/bench_step" --model cnn --batch 128 --optimizer adam --steps "$steps" --threads 2 --json |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.read().strip().splitlines()[-1])["median_ms"])'; }
gpt() { # seconds of 2+N steps minus seconds of 2 steps: N steps' time without start-up
    local t0 t1
    t0=$( { /usr/bin/time -f %e "$1/frugal" train --model gpt-tiny --data "$text" --steps 2 --batch 8 \
        --optimizer adamw --test-limit 1 --threads 2 --no-progress --quiet >/dev/null; } 2>&1 | tail -1)
    t1=$( { /usr/bin/time -f %e "$1/frugal" train --model gpt-tiny --data "$text" --steps $((2 + steps / 4)) \
        --batch 8 --optimizer adamw --test-limit 1 --threads 2 --no-progress --quiet >/dev/null; } 2>&1 | tail -1)
    python3 -c "print(round(1000 * ($t1 - $t0) / $((steps / 4)), 1))"
}
declare -A res
for r in $(seq 1 "$rounds"); do
    if [ $((r % 2)) -eq 1 ]; then order="A B"; else order="B A"; fi
    for w in $order; do
        dir=$a; [ "$w" = B ] && dir=$b
        c=$(cnn "$dir"); g=$(gpt "$dir")
        res[$w.cnn]="${res[$w.cnn]:-} $c"; res[$w.gpt]="${res[$w.gpt]:-} $g"
        echo "round $r $w: cnn ${c} ms/step, gpt-tiny ${g} ms/step"
    done
done
python3 - "${res[A.cnn]}" "${res[B.cnn]}" "${res[A.gpt]}" "${res[B.gpt]}" <<'PY'
import statistics as s, sys
v = [list(map(float, x.split())) for x in sys.argv[1:]]
for name, a, b in (("cnn (bench_step, adam, batch 128)", v[0], v[1]), ("gpt-tiny (train, adamw, batch 8)", v[2], v[3])):
    print("%s: A median %.1f ms, B median %.1f ms, B/A %.3f" % (name, s.median(a), s.median(b), s.median(b) / s.median(a)))
PY
