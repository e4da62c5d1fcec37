/* ctx.c — the context: creation, errors, threads, and the names of enums. */
#include <omp.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <cblas.h>
#include "core/ctx.h"

fr_ctx *fr_ctx_new(void) {
    fr_ctx *ctx = calloc(1, sizeof *ctx);
    if (!ctx) return NULL;
    if (fr_mem_init(&ctx->mem) != 0) {
        free(ctx);
        return NULL;
    }
    return ctx;
}

void fr_ctx_free(fr_ctx *ctx) {
    if (!ctx) return;
    fr_mem_destroy(&ctx->mem);
    free(ctx);
}

const char *fr_last_error(const fr_ctx *ctx) { return ctx ? ctx->err : "no context"; }

fr_status fr_fail(fr_ctx *ctx, fr_status st, const char *fmt, ...) {
    if (ctx) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(ctx->err, sizeof ctx->err, fmt, ap);
        va_end(ap);
        ctx->err_status = st;
    }
    return st;
}

void fr_set_threads(fr_ctx *ctx, int threads) {
    ctx->threads = threads > 0 ? threads : 0;
    if (threads > 0) {
        omp_set_num_threads(threads);
        openblas_set_num_threads(threads);
    }
}

int fr_get_threads(const fr_ctx *ctx) {
    return ctx->threads > 0 ? ctx->threads : omp_get_max_threads();
}

const char *fr_mem_cat_name(fr_mem_cat cat) {
    static const char *names[] = {"parameters", "gradients", "optimizer", "activations",
                                  "workspace",  "data",      "other",     "kv_cache"};
    _Static_assert(sizeof names / sizeof *names == FR_MEM_CAT_COUNT, "a name per category");
    return (unsigned)cat < FR_MEM_CAT_COUNT ? names[cat] : "?";
}

const char *fr_dtype_name(fr_dtype dt) {
    static const char *names[FR_DTYPE_COUNT] = {"f32", "f16", "bf16", "i32", "u8", "i64"};
    return (unsigned)dt < FR_DTYPE_COUNT ? names[dt] : "?";
}

size_t fr_dtype_size(fr_dtype dt) {
    static const size_t sizes[FR_DTYPE_COUNT] = {4, 2, 2, 4, 1, 8};
    return (unsigned)dt < FR_DTYPE_COUNT ? sizes[dt] : 0;
}
