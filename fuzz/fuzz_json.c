/* fuzz_json.c — libFuzzer target for the JSON reader (io/json.c, read by
 * the LoRA adapter loader): any input is accepted or refused, never
 * crashes, and allocates nothing that outlives the call. */
#include "fuzz_common.h"
#include "io/json.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_json v;
    fr_status st = fr_json_parse(ctx, "fuzz.json", (const char *)data, size, &v);
    fuzz_expect_status(st);
    if (!st) {
        (void)fr_json_get(&v, "r");
        fr_json_free(ctx, &v);
    }
    fuzz_end(ctx);
    return 0;
}
