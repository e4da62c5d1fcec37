/* fuzz_tokenizer_json.c — libFuzzer target for the tokenizer.json reader
 * (tok/bpe.c over io/json.c): any input is accepted or refused, never
 * crashes, and leaves nothing allocated; a tokenizer that loads gives any
 * bytes back through encode and decode (byte-level BPE loses nothing). */
#include <string.h>
#include "fuzz_common.h"
#include "tok/bpe.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_bpe *b;
    fr_status st = fr_bpe_from_tokenizer_json(ctx, "tokenizer.json", (const char *)data, size, &b);
    fuzz_expect_status(st);
    if (!st) {
        static const char probe[] =
            "Hello, world! It's 2024:  caf\xc3\xa9 \xff\xfe <|endoftext|>\n";
        int32_t *ids = NULL;
        char *d = NULL;
        size_t n = 0, cap = 0, dl = 0, dcap = 0;
        st = fr_bpe_encode(b, probe, sizeof probe - 1, &ids, &n, &cap);
        if (!st) st = fr_bpe_decode(b, ids, n, &d, &dl, &dcap);
        /* a user's Split pattern may hit PCRE2's match limits: FR_ERR_ARG */
        if (st != FR_OK && st != FR_ERR_NOMEM && st != FR_ERR_ARG) abort();
        if (!st && (dl != sizeof probe - 1 || memcmp(d, probe, dl))) abort();
        free(ids);
        free(d);
        fr_bpe_free(b);
    }
    fuzz_end(ctx);
    return 0;
}
