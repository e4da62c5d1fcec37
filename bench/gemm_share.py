#!/usr/bin/env python3
"""gemm_share.py — how much of a GPT training step is GEMM, from perf
samples of two `frugal profile` runs of the same model that differ only in
their number of steps: the difference of their sample counts, symbol by
symbol, is the extra steps' work alone (initialisation, the first step and
the exit are the same in both). GEMM is OpenBLAS's sgemm code (its kernels,
packing and beta scaling: the linear layers' GEMMs and attention's tile
GEMMs alike). `perf record -e cpu-clock` samples running threads only, so
with OMP_WAIT_POLICY=passive a sample is work; the step's wall time comes
from the longer run's trace (from one step's first op to the next's).

  gemm_share.py SHORT_REPORT LONG_REPORT EXTRA_STEPS TRACE THREADS HZ

The reports are `perf report -n --no-children --sort dso,symbol --stdio`.
Prints a markdown summary and the top symbols.
"""
import collections
import json
import re
import sys


def counts(path):
    c = collections.Counter()
    for line in open(path, errors="replace"):
        m = re.match(r"\s*[\d.]+%\s+(\d+)\s+(\S+)\s+\[.\]\s+(\S+)", line)
        if m:
            c[(m.group(2), m.group(3))] += int(m.group(1))
    return c


def step_wall_ms(trace):
    t = json.load(open(trace))
    ev = t["traceEvents"] if isinstance(t, dict) else t
    starts = sorted(e["ts"] for e in ev if e.get("ph") == "X" and e["name"] == "embedding")
    gaps = [b - a for a, b in zip(starts[1:], starts[2:])]  # not the first step's
    return sum(gaps) / len(gaps) / 1000 if gaps else float("nan")


def main():
    if len(sys.argv) != 7:
        sys.exit(__doc__.strip())
    short, long_, extra, trace, threads, hz = sys.argv[1:]
    extra, threads, hz = int(extra), int(threads), float(hz)
    a, b = counts(short), counts(long_)
    d = collections.Counter({k: b[k] - a.get(k, 0) for k in b})
    d = collections.Counter({k: v for k, v in d.items() if v > 0})
    tot = sum(d.values())
    gemm = sum(v for (obj, sym), v in d.items() if "openblas" in obj and "gemm" in sym)
    cpu_ms = 1000 * tot / hz / extra  # CPU time sampled per step
    wall = step_wall_ms(trace)
    print("- steps counted: %d (the difference of the two runs); wall time %.0f ms a step "
          "(the trace's step starts, the longer run); CPU time sampled %.0f ms a step "
          "(%.2f threads busy on average of %d)" % (extra, wall, cpu_ms, cpu_ms / wall, threads))
    print("- **GEMM: %.1f%% of the CPU time sampled** (%.0f ms a step); as a share of all %d "
          "threads' wall time, idle included: %.1f%%" % (
              100 * gemm / tot, cpu_ms * gemm / tot, threads, 100 * (cpu_ms * gemm / tot) / (threads * wall)))
    print()
    print("| samples | share | object | symbol |")
    print("|---:|---:|---|---|")
    for (obj, sym), v in d.most_common(20):
        print("| %d | %.1f%% | %s | `%s` |" % (v, 100 * v / tot, obj, sym))


if __name__ == "__main__":
    main()
