/* fuzz_merges.c — libFuzzer target for byte-level BPE's vocab.json and
 * merges.txt readers (tok/bpe.c): an input with a NUL byte is vocab.json's
 * text before it and merges.txt's after; without one it is merges.txt's
 * against a fixed vocabulary (the 256 byte symbols and a few merges).
 * Accepted or refused, never a crash, nothing left allocated; what loads
 * must give any bytes back through encode and decode. */
#include <stdio.h>
#include <string.h>
#include "fuzz_common.h"
#include "tok/bpe.h"

static char vocab[8192];
static size_t vlen;

static void make_vocab(void) {
    int k = 0, n = 0;
    vlen = (size_t)sprintf(vocab, "{");
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = printable ? b : 256 + n++;
        vlen += (size_t)sprintf(vocab + vlen, "%s\"\\u%04x\": %d", b ? ", " : "", cp, k++);
    }
    vlen += (size_t)sprintf(vocab + vlen,
                            ", \"ab\": 256, \"abc\": 257, \"\\u0120t\": 258, \"he\": 259, "
                            "\"\\u0120the\": 260, \"\\u0120th\": 261}");
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!vlen) make_vocab();
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    const char *v = vocab, *m = (const char *)data;
    size_t vl = vlen, ml = size;
    const uint8_t *nul = memchr(data, 0, size);
    if (nul)
        v = (const char *)data, vl = (size_t)(nul - data), m = (const char *)nul + 1,
        ml = size - vl - 1;
    fr_bpe *b;
    fr_status st = fr_bpe_from_vocab_merges(ctx, "vocab.json", v, vl, "merges.txt", m, ml, &b);
    fuzz_expect_status(st);
    if (!st) {
        static const char probe[] = "the abc 'll  \xff\xfe caf\xc3\xa9 42\n";
        int32_t *ids = NULL;
        char *d = NULL;
        size_t n = 0, cap = 0, dl = 0, dcap = 0;
        st = fr_bpe_encode(b, probe, sizeof probe - 1, &ids, &n, &cap);
        if (!st) st = fr_bpe_decode(b, ids, n, &d, &dl, &dcap);
        if (st != FR_OK && st != FR_ERR_NOMEM) abort();
        if (!st && (dl != sizeof probe - 1 || memcmp(d, probe, dl))) abort();
        free(ids);
        free(d);
        fr_bpe_free(b);
    }
    fuzz_end(ctx);
    return 0;
}
