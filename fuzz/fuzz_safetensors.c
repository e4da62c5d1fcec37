/* fuzz_safetensors.c — libFuzzer target for the safetensors header parser:
 * any input must parse or fail with FR_ERR_FORMAT, never crash, and leave
 * no allocation behind once the result is closed. abort() is the fuzzer's
 * way to report a fault; the library never calls it. */
#include <string.h>
#include "fuzz_common.h"
#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_st_file f;
    fr_status st = fr_st_parse(ctx, "fuzz.safetensors", data, size, &f);
    fuzz_expect_status(st);
    if (st == FR_OK) {
        /* Every entry must lie inside the input at its offset in the data
         * section and match its shape; fr_st_load copies exactly it. */
        uint64_t hl = 0;
        for (int k = 7; k >= 0; k--) hl = hl << 8 | data[k];
        for (int k = 0; k < f.n; k++) {
            const fr_st_entry *e = &f.entries[k];
            const uint8_t *p = e->data;
            if (p < data || p + e->nbytes > data + size || p != data + 8 + hl + e->offset) abort();
            if (e->nbytes && e->nbytes <= 64) {
                uint8_t copy[64];
                if (fr_st_load(ctx, &f, e, copy) != FR_OK || memcmp(copy, p, e->nbytes)) abort();
            }
            if ((size_t)fr_shape_numel(&e->shape) * fr_dtype_size(e->dtype) != e->nbytes) abort();
            if (fr_st_find(&f, e->name) == NULL) abort();
        }
    } else if (f.entries || f.n || !strchr(fr_last_error(ctx), ':')) {
        abort();
    }
    fr_st_close(ctx, &f);
    fuzz_end(ctx);
    return 0;
}
