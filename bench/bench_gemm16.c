/* bench_gemm16.c — the linear layer's GEMMs at GPT shapes, side by side in
 * one process: OpenBLAS's sgemm on f32 operands against the 16-bit GEMM
 * (backend/cpu/gemm16.c, oneDNN's bf16 matmul) on the same values rounded to
 * bf16. Prints GFLOP/s of each (best of --reps runs) and their ratio.
 *
 *   bench_gemm16 [--reps N] [--threads T] [--rows N]
 *
 * Shapes: rows N (B T, default 2048) by gpt-tiny's (d 384) and GPT-2's
 * (d 768) c_attn, c_proj, c_fc and mlp c_proj, forward (y = x W^T), dx
 * (dy W) and dW (dy^T x). */
#include <cblas.h>
#include <getopt.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "backend/cpu/gemm16.h"
#include "core/half.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* best seconds of reps runs of one GEMM, f32 (h == 0) or bf16 */
static double best(int h, int ta, int tb, int M, int N, int K, const float *A, const float *B,
                   const uint16_t *A16, const uint16_t *B16, float *C, void *ws, size_t wsb,
                   int reps, fr_ctx *ctx) {
    int lda = ta ? M : K, ldb = tb ? K : N;
    double b = 1e30;
    for (int r = 0; r < reps + 1; r++) { /* the first run warms up */
        double t0 = now();
        if (h) {
            if (fr_gemm16(ctx, ta, tb, M, N, K, A16, lda, B16, ldb, 0.0f, C, N, ws, wsb)) {
                fprintf(stderr, "bench_gemm16: %s\n", fr_last_error(ctx));
                exit(1);
            }
        } else {
            cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans,
                        tb ? CblasTrans : CblasNoTrans, M, N, K, 1.0f, A, lda, B, ldb, 0.0f, C, N);
        }
        double t = now() - t0;
        if (r > 0 && t < b) b = t;
    }
    return b;
}

int main(int argc, char **argv) {
    fr_cpu_setup(argv); /* OpenBLAS on the core the CPU calls for (frugal.h) */
    int reps = 10, threads = 0, rows = 2048;
    static const struct option lo[] = {{"reps", required_argument, 0, 'r'},
                                       {"threads", required_argument, 0, 't'},
                                       {"rows", required_argument, 0, 'n'},
                                       {0, 0, 0, 0}};
    for (int c; (c = getopt_long(argc, argv, "", lo, NULL)) != -1;) {
        if (c == 'r') reps = atoi(optarg);
        else if (c == 't') threads = atoi(optarg);
        else if (c == 'n') rows = atoi(optarg);
        else return 2;
    }
    if (threads > 0) omp_set_num_threads(threads);
    if (!fr_gemm16_native(FR_BF16)) {
        printf("no native bf16 GEMM in this build or on this CPU\n");
        return 0;
    }
    fr_ctx *ctx = fr_ctx_new();
    printf("rows %d, %d threads, best of %d\n\n", rows, omp_get_max_threads(), reps);
    printf("| d | GEMM | M x N x K | sgemm GFLOP/s | bf16 GFLOP/s | bf16 / sgemm |\n");
    printf("|---:|---|---|---:|---:|---:|\n");
    double tf = 0, th = 0;
    for (int di = 0; di < 2; di++) {
        int d = di ? 768 : 384;
        int outs[4][2] = {{3 * d, d}, {d, d}, {4 * d, d}, {d, 4 * d}}; /* (O, K) */
        for (int l = 0; l < 4; l++)
            for (int kind = 0; kind < 3; kind++) {
                int O = outs[l][0], K = outs[l][1], ta = 0, tb = 0, M, N, KK;
                const char *name;
                if (kind == 0) name = "y = x W^T", M = rows, N = O, KK = K, tb = 1;
                else if (kind == 1) name = "dx = dy W", M = rows, N = K, KK = O;
                else name = "dW = dy^T x", M = O, N = K, KK = rows, ta = 1;
                size_t na = (size_t)M * KK, nb = (size_t)KK * N;
                float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc((size_t)M * N * 4);
                uint16_t *A16 = malloc(na * 2), *B16 = malloc(nb * 2);
                for (size_t i = 0; i < na; i++)
                    A16[i] = fr_f32_to_bf16(A[i] = (float)(i % 7) * 0.1f);
                for (size_t i = 0; i < nb; i++)
                    B16[i] = fr_f32_to_bf16(B[i] = (float)(i % 5) * 0.1f);
                size_t wsb = fr_gemm16_ws(ta, tb, M, N, KK, ta ? M : KK, tb ? KK : N, 0.0f, N);
                void *ws = malloc(wsb ? wsb : 1);
                double f = best(0, ta, tb, M, N, KK, A, B, A16, B16, C, ws, wsb, reps, ctx);
                double h = best(1, ta, tb, M, N, KK, A, B, A16, B16, C, ws, wsb, reps, ctx);
                double fl = 2.0 * M * N * KK;
                tf += f, th += h;
                printf("| %d | %s | %d x %d x %d | %.1f | %.1f | %.2f |\n", d, name, M, N, KK,
                       fl / f * 1e-9, fl / h * 1e-9, f / h);
                free(A), free(B), free(C), free(A16), free(B16), free(ws);
            }
    }
    printf("\nall shapes: sgemm %.1f ms, bf16 %.1f ms, bf16 / sgemm speed %.2f\n", tf * 1e3,
           th * 1e3, tf / th);
    fr_ctx_free(ctx);
    return 0;
}
