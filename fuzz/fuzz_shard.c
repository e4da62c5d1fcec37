/* fuzz_shard.c — libFuzzer target for the token-file parsers of tokens.c:
 * fr_shard_check (llm.c shards) and fr_token_npy_check (1-D token .npy) on
 * every input. Either accepts or refuses with FR_ERR_FORMAT and a message
 * naming the input; what a parser accepts must be consistent with the bytes
 * (a shard is exactly 1024 + 2n bytes for the count in its header, with its
 * magic and version), and nothing may stay allocated. abort() reports a
 * fault. Seeds: fuzz/corpus/shard/. */
#include <string.h>
#include "data/tokens.h"
#include "fuzz_common.h"

static uint32_t le32(const uint8_t *b) {
    return b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_status st = fr_shard_check(ctx, "fuzz.bin", data, size);
    fuzz_expect_status(st);
    if (st == FR_OK) {
        if (size < FR_SHARD_HEADER_BYTES || (int32_t)le32(data) != FR_SHARD_MAGIC ||
            le32(data + 4) != FR_SHARD_VERSION ||
            size != FR_SHARD_HEADER_BYTES + 2 * (uint64_t)le32(data + 8))
            abort();
    } else if (!strstr(fr_last_error(ctx), "fuzz.bin: ")) {
        abort();
    }
    st = fr_token_npy_check(ctx, "fuzz.npy", data, size);
    fuzz_expect_status(st);
    if (st == FR_OK ? size < 10 || memcmp(data, "\x93NUMPY", 6)
                    : !strstr(fr_last_error(ctx), "fuzz.npy: "))
        abort();
    fuzz_end(ctx); /* aborts on a leak */
    return 0;
}
