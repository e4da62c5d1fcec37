/* bench_tok.c — tokenizer throughput: encode and decode MB/s of one
 * tokenizer on one text file (bench/tokenizer.sh runs it beside the Python
 * reference, bench/tok_bench.py). The first encode runs on a fresh
 * tokenizer (cold: byte-level BPE's piece cache empty); the next R are
 * warm, their median reported. Prints one JSON line.
 *
 * usage: bench_tok TOKENIZER TEXT [R] */
#define BENCH_NAME "bench_tok"
#include <string.h>
#include "bench_util.h"
#include "tok/tokenizer.h"

int main(int argc, char **argv) {
    int reps = 10;
    if (argc < 3 || (argc > 3 && parse_int("reps", argv[3], 1, 1000, &reps)))
        return fprintf(stderr, "usage: bench_tok TOKENIZER TEXT [REPEATS]\n"), 2;
    FILE *f = fopen(argv[2], "rb");
    if (!f) return perror(argv[2]), 1;
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)len + 1);
    if (!text || fread(text, 1, (size_t)len, f) != (size_t)len) return fprintf(stderr, "read\n"), 1;
    fclose(f);
    fr_ctx *ctx = fr_ctx_new();
    double t0 = now_ms();
    fr_tokenizer *t = fr_tokenizer_load(ctx, argv[1]);
    double load_ms = now_ms() - t0;
    if (!t) return fprintf(stderr, "bench_tok: %s\n", fr_last_error(ctx)), 1;
    double *enc = malloc(sizeof(double) * (size_t)reps),
           *dec = malloc(sizeof(double) * (size_t)reps);
    int32_t *ids;
    size_t n = 0;
    t0 = now_ms();
    if (fr_tokenizer_encode(t, text, (size_t)len, 0, &ids, &n))
        return fprintf(stderr, "bench_tok: %s\n", fr_last_error(ctx)), 1;
    double cold = now_ms() - t0;
    free(ids);
    for (int r = 0; r < reps; r++) {
        t0 = now_ms();
        fr_tokenizer_encode(t, text, (size_t)len, 0, &ids, &n);
        enc[r] = now_ms() - t0;
        char *d;
        size_t dl;
        t0 = now_ms();
        fr_tokenizer_decode(t, ids, n, &d, &dl);
        dec[r] = now_ms() - t0;
        free(d);
        free(ids);
    }
    qsort(enc, (size_t)reps, sizeof *enc, cmp_double);
    qsort(dec, (size_t)reps, sizeof *dec, cmp_double);
    double mb = (double)len / 1e6;
    printf("{\"impl\": \"frugal\", \"kind\": \"%s\", \"bytes\": %ld, \"tokens\": %zu, \"load_ms\": "
           "%.2f, "
           "\"encode_cold_mb_s\": %.3f, \"encode_mb_s\": %.3f, \"decode_mb_s\": %.3f}\n",
           fr_tokenizer_kind(t), len, n, load_ms, mb / (cold / 1e3), mb / (enc[reps / 2] / 1e3),
           mb / (dec[reps / 2] / 1e3));
    fr_tokenizer_free(t);
    fr_ctx_free(ctx);
    free(enc), free(dec), free(text);
    return 0;
}
