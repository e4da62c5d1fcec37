/* fuzz_common.h — what the libFuzzer targets in fuzz/ share: the entry
 * point's prototype, the statuses a parser of outside input may return, and
 * the closing check that nothing stays allocated. It owns no target. abort()
 * is how a target reports a fault; the library never calls it. */
#ifndef FR_FUZZ_COMMON_H
#define FR_FUZZ_COMMON_H

#include <stdint.h>
#include <stdlib.h>
#include "core/ctx.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Any input is accepted or refused as malformed (or memory runs out);
 * another status is a fault. */
static inline void fuzz_expect_status(fr_status st) {
    if (st != FR_OK && st != FR_ERR_FORMAT && st != FR_ERR_NOMEM) abort();
}

/* Ends one input: nothing the parser allocated may outlive it (a leak
 * aborts); then frees ctx. */
static inline void fuzz_end(fr_ctx *ctx) {
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    if (s.allocated_total != 0) abort();
    fr_ctx_free(ctx);
}

/* One input through a checker of a whole buffer (fr_idx_check,
 * fr_npy_check), named `name` in its messages. */
typedef fr_status (*fuzz_checker)(fr_ctx *ctx, const char *name, const void *buf, size_t len);

static inline int fuzz_check_buffer(fuzz_checker check, const char *name, const uint8_t *data,
                                    size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fuzz_expect_status(check(ctx, name, data, size));
    fuzz_end(ctx);
    return 0;
}

#endif
