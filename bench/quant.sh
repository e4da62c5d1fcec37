#!/usr/bin/env bash
# quant.sh — the quantized frozen-weight GEMMs (src/quant) against the f32
# GEMM on GPT-2 124M's four projection shapes: the forward product and dx,
# at N = 2048 rows (batch 4 x context 512) and N = 1 (one generated token),
# each the median of several runs, alternated; plus each format's bytes and
# round-trip error on N(0, 0.02) weights (GPT-2's initialisation; random
# weights are fine for time and memory).
#
# Usage: bash bench/quant.sh [build-dir] [threads]   (build-dir: build)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$(realpath "${1:-build}")
threads=${2:-2}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cblas_inc=$(grep -m1 '^CBLAS_INCLUDE:' "$build/CMakeCache.txt" | cut -d= -f2)
# the internal API (src/quant) is not exported by libfrugal.so: link the static
# library with the dependencies its pkg-config file names
libs=$(sed -n 's/^Libs: \${libdir}\///p' "$build/frugal-static.pc")
cat >"$tmp/bench.c" <<'EOF'
#include <cblas.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "core/rng.h"
#include "quant/quant.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + 1e-9 * t.tv_nsec;
}
static int cmpd(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
static float *gauss(int64_t n, float sd, uint64_t seed) {
    float *p = malloc((size_t)n * sizeof(float));
    fr_rng r = fr_rng_make(seed, 1);
    for (int64_t i = 0; i < n; i++) {
        double u1 = fr_rng_next_uniform(&r) + 1e-12, u2 = fr_rng_next_uniform(&r);
        p[i] = (float)(sd * sqrt(-2 * log(u1)) * cos(2 * M_PI * u2));
    }
    return p;
}

int main(int argc, char **argv) {
    const int threads = argc > 1 ? atoi(argv[1]) : 2, reps = 7;
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, threads);
    const int64_t shapes[4][2] = {{2304, 768}, {768, 768}, {3072, 768}, {768, 3072}};
    const char *names[4] = {"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"};
    printf("threads %d; times in ms, median of %d, alternated; ratio = quantized / f32\n",
           threads, reps);
    printf("%-12s %6s %-4s %9s %9s %9s %7s %7s\n", "layer", "N", "fmt", "f32 fwd", "q fwd",
           "q dx", "fwd x", "dx x");
    for (int s = 0; s < 4; s++) {
        const int64_t O = shapes[s][0], K = shapes[s][1];
        float *w = gauss(O * K, 0.02f, 1 + s);
        for (int f = 0; f < FR_QFMT_COUNT; f++) {
            fr_qweight q;
            if (fr_quantize(ctx, (fr_qfmt)f, w, O, K, &q)) return fprintf(stderr, "%s\n", fr_last_error(ctx)), 1;
            if (s == 0 || s == 3) { /* error once per shape family */
                float *d = malloc((size_t)(O * K) * sizeof(float));
                fr_dequantize_rows(ctx, &q, 0, O, d);
                double e2 = 0, w2 = 0, emax = 0;
                for (int64_t i = 0; i < O * K; i++) {
                    double e = (double)w[i] - d[i];
                    e2 += e * e, w2 += (double)w[i] * w[i], emax = fmax(emax, fabs(e));
                }
                printf("%-12s %s: %zu bytes (f32 %lld, %.3f bits a value); rms error %.4f of rms "
                       "weight, max %.3g\n",
                       names[s], fr_qfmt_name((fr_qfmt)f), fr_quant_bytes((fr_qfmt)f, O, K),
                       (long long)(O * K * 4), 8.0 * fr_quant_bytes((fr_qfmt)f, O, K) / (O * K),
                       sqrt(e2 / w2), emax);
                free(d);
            }
            for (int64_t N = 2048; N >= 1; N = N == 2048 ? 1 : 0) {
                float *x = gauss(N * K, 1, 9), *y = malloc((size_t)(N * O) * 4);
                float *dy = gauss(N * O, 1, 10), *dx = malloc((size_t)(N * K) * 4);
                const size_t wsn = fr_qgemm_ws_floats(O, K, threads);
                float *ws = malloc(wsn * sizeof(float));
                double tf[16], tq[16], td[16];
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)N, (int)O, (int)K,
                                1.0f, x, (int)K, w, (int)K, 0.0f, y, (int)O);
                    double t1 = now();
                    fr_qgemm(ctx, &q, x, N, NULL, y, 0, ws, wsn);
                    double t2 = now();
                    fr_qgemm_dx(ctx, &q, dy, N, dx, 0, ws, wsn);
                    double t3 = now();
                    tf[r] = t1 - t0, tq[r] = t2 - t1, td[r] = t3 - t2;
                }
                /* the f32 dx, for its ratio */
                double tfd[16];
                for (int r = 0; r < reps; r++) {
                    double t0 = now();
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)N, (int)K, (int)O,
                                1.0f, dy, (int)O, w, (int)K, 0.0f, dx, (int)K);
                    tfd[r] = now() - t0;
                }
                qsort(tf, reps, 8, cmpd), qsort(tq, reps, 8, cmpd), qsort(td, reps, 8, cmpd);
                qsort(tfd, reps, 8, cmpd);
                const int m = reps / 2;
                printf("%-12s %6lld %-4s %9.3f %9.3f %9.3f %7.2f %7.2f\n", names[s], (long long)N,
                       fr_qfmt_name((fr_qfmt)f), 1e3 * tf[m], 1e3 * tq[m], 1e3 * td[m],
                       tq[m] / tf[m], td[m] / tfd[m]);
                free(x), free(y), free(dy), free(dx), free(ws);
            }
            fr_quant_free(ctx, &q);
        }
        free(w);
    }
    fr_ctx_free(ctx);
    return 0;
}
EOF
cc -O2 -std=c11 -D_GNU_SOURCE -I src -I include -I "$cblas_inc" "$tmp/bench.c" -o "$tmp/bench" \
    -fopenmp "$build"/$libs
OMP_NUM_THREADS=$threads "$tmp/bench" "$threads"
