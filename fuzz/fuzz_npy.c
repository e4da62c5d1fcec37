/* fuzz_npy.c — libFuzzer target for the .npy checker (fr_npy_check): any
 * input is accepted or refused with FR_ERR_FORMAT, never crashes, and
 * allocates nothing that outlives the call. abort() reports a fault. */
#include <stdlib.h>
#include "data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_status st = fr_npy_check(ctx, "fuzz.npy", data, size);
    if (st != FR_OK && st != FR_ERR_FORMAT && st != FR_ERR_NOMEM) abort();
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    if (s.allocated_total != 0) abort();
    fr_ctx_free(ctx);
    return 0;
}
