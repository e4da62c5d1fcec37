#!/usr/bin/env bash
# train_full.sh — the end-to-end benchmark: `frugal train` on the full
# Fashion-MNIST set (60000 training, 10000 test images), the CNN, 3 epochs,
# batch 128, Adam, 2 threads. Prints the test accuracy after each epoch, the
# wall time and the process peak RSS, read from frugal's JSON lines (one
# "epoch" event per epoch, then a "summary"). Extra arguments go to
# `frugal train` and override the defaults (e.g. --model resnet --epochs 1).
#
# Environment: BUILD [/tmp/build-bench], DATA [/usr/share/datasets/fashion-mnist],
# THREADS [2].
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-/tmp/build-bench}
DATA=${DATA:-/usr/share/datasets/fashion-mnist}
THREADS=${THREADS:-2}

cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build "$BUILD" -j"$(nproc)" --target frugal_cli >/dev/null

log=$(mktemp)
trap 'rm -f "$log"' EXIT
t0=$(date +%s.%N)
OMP_NUM_THREADS=$THREADS "$BUILD/frugal" train --model cnn --epochs 3 --batch 128 --optimizer adam \
    --threads "$THREADS" --data "$DATA" --json "$@" | tee "$log" >/dev/null
t1=$(date +%s.%N)

/usr/bin/python3 - "$log" "$t0" "$t1" <<'EOF'
import json, sys
log, t0, t1 = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
# One JSON object per event; decode them as a stream so that a line break
# inside an object (or text between objects) does not matter.
text, dec, at, events = open(log).read(), json.JSONDecoder(), 0, []
while True:
    at = text.find("{", at)
    if at < 0:
        break
    e, at = dec.raw_decode(text, at)
    events.append(e)
summary = None
for e in events:
    if e.get("event") == "epoch":
        print(f"epoch {e['epoch']}: test accuracy {100 * e['test_acc']:.2f}% "
              f"(test loss {e['test_loss']:.4f}, train loss {e['train_loss']:.4f}, "
              f"train accuracy {100 * e['train_acc']:.2f}%, {e['seconds']:.1f} s, "
              f"{e['samples']} samples)")
    elif e.get("event") == "summary":
        summary = e
if summary is None:
    sys.exit("train_full.sh: no summary line from frugal train")
mem = summary.get("memory", {})
peak_alloc = mem.get("allocated_total_peak") if isinstance(mem, dict) else None
print(f"final test accuracy {100 * summary['test_acc']:.2f}% after {summary['epochs']} epochs")
print(f"wall time {summary['seconds']:.1f} s (frugal's own clock; {t1 - t0:.1f} s for the process)")
print(f"peak RSS {summary['peak_rss_bytes'] / 2**20:.1f} MiB"
      + (f", engine peak allocated {peak_alloc / 2**20:.1f} MiB" if peak_alloc else ""))
EOF
