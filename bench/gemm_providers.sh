#!/usr/bin/env bash
# gemm_providers.sh — GFLOP/s of each GEMM provider frugal can use, side by
# side, in one run: OpenBLAS on each x86-64 core that matters (the generic
# Prescott fallback kept with FRUGAL_BLAS_FIX=0, the same fallback fixed by
# frugal's restart, Haswell, SkylakeX, Cooperlake, the core OpenBLAS picks
# itself, and frugal's default: that core, or the one frugal restarts on), oneDNN's f32 sgemm and its bf16 matmul, each measured by the probe
# of `frugal devices --json` (a 512^3 GEMM, the best of >= 5 runs and 50 ms).
# The configurations are alternated over ROUNDS rounds (default 3) and the
# best of each is printed, so that a loaded host weighs on all alike.
# Usage: bash bench/gemm_providers.sh [build-dir]   (a table on stdout)
set -euo pipefail
bin=${1:-build}/frugal
rounds=${ROUNDS:-3}
configs=("default||" "OpenBLAS's pick||0" "Prescott kept|Prescott|0" "Prescott fixed|Prescott|1" "Haswell|Haswell|0"
         "SkylakeX|SkylakeX|0" "Cooperlake|Cooperlake|0")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$rounds"); do
    for i in "${!configs[@]}"; do
        IFS='|' read -r _ core fix <<<"${configs[$i]}"
        env ${core:+OPENBLAS_CORETYPE=$core} ${fix:+FRUGAL_BLAS_FIX=$fix} "$bin" devices --json \
            >"$tmp/$i.$r.json" 2>/dev/null || true
    done
done
python3 - "$tmp" "$rounds" "${configs[@]}" <<'PY'
import json, sys
tmp, rounds, configs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
first = json.load(open("%s/0.1.json" % tmp))["cpu"]
own = json.load(open("%s/1.1.json" % tmp))["cpu"]  # FRUGAL_BLAS_FIX=0: OpenBLAS's own pick
p = first["probe"]
print("# GEMM providers, %d^3 f32 and bf16 GEMMs, %d threads, best of %d alternated rounds"
      % (p["n"], p["threads"], rounds))
print("# cpu: %s (family %d model %d): %s" % (first["model"], first["family"], first["model_id"],
                                              " ".join(first["features"])))
print("# blas: %s, picks %s, frugal runs %s; oneDNN ISA %s; bf16: %s"
      % (first["blas"], own["blas_core"], first["blas_core"], first["onednn_isa"], first["gemm_bf16"]))
print("%-16s %-12s %14s %14s %14s" % ("configuration", "BLAS core", "OpenBLAS f32", "oneDNN f32",
                                      "oneDNN bf16"))
for i, c in enumerate(configs):
    runs = [json.load(open("%s/%d.%d.json" % (tmp, i, r)))["cpu"] for r in range(1, rounds + 1)]
    best = lambda k: max(x["probe"][k] for x in runs)
    print("%-16s %-12s %14.1f %14.1f %14.1f" % (c.split("|")[0], runs[0]["blas_core"],
          best("gflops_blas_f32"), best("gflops_onednn_f32"), best("gflops_bf16")))
PY
