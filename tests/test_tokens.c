/* test_tokens.c — token streams (src/data/tokens.h) over files this test
 * writes into a scratch directory: llm.c shards by glob, .npy of each
 * integer dtype, and a tree of text files (with the entries a walk skips:
 * *.dat, dot names, symlinks, a FIFO). Every token read back is compared
 * with the array it was written from; windows cross file boundaries. Then
 * each bad input gives its one message (file, position, fault) and leaks
 * neither memory nor a descriptor; the split's sizes against floor(); the
 * loader's windows, its order against Fisher-Yates on fr_rng and against
 * bench/token_order.py's output, prefetch, resume, the DATA bound and the
 * reserved bytes it promises, an id that changes on disk, a file that
 * shrinks under the prefetch thread, and every allocation failing in turn. */
#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <ftw.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "core/rng.h"
#include "data/tokens.h"
#include "scratch.h"

/* ---- writing files ------------------------------------------------------ */

static char *path_of(const char *name) {
    static char buf[8][600];
    static int k;
    char *p = buf[k++ % 8];
    snprintf(p, 600, "%s/%s", tmpdir, name);
    return p;
}

static void put(const char *name, const void *data, size_t len) {
    FILE *f = fopen(path_of(name), "wb");
    if (!f || (len && fwrite(data, 1, len, f) != len)) fprintf(stderr, "cannot write %s\n", name);
    if (f) fclose(f);
}

static void put_le32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)v, b[1] = (unsigned char)(v >> 8), b[2] = (unsigned char)(v >> 16),
    b[3] = (unsigned char)(v >> 24);
}

/* An llm.c shard: header (magic, version, count), then the n tokens, then
 * `extra` zero bytes (negative: that many bytes cut off the end). */
static void put_shard(const char *name, const uint16_t *tok, int n, int32_t magic, int32_t version,
                      int32_t count, int extra) {
    size_t len = 1024 + 2 * (size_t)n + (extra > 0 ? (size_t)extra : 0);
    unsigned char *b = calloc(len, 1);
    put_le32(b, (uint32_t)magic), put_le32(b + 4, (uint32_t)version),
        put_le32(b + 8, (uint32_t)count);
    for (int i = 0; i < n; i++) b[1024 + 2 * i] = tok[i] & 0xFF, b[1025 + 2 * i] = tok[i] >> 8;
    put(name, b, len - (extra < 0 ? (size_t)-extra : 0));
    free(b);
}

/* A .npy v1: the dict padded with spaces to a 64-byte boundary, '\n' last. */
static void put_npy(const char *name, const char *descr, const char *shape, const void *data,
                    size_t bytes) {
    char dict[256];
    int n = snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                     descr, shape);
    int total = (10 + n + 1 + 63) / 64 * 64;
    memset(dict + n, ' ', (size_t)(total - 10 - n));
    dict[total - 11] = '\n';
    unsigned char *b = malloc((size_t)total + bytes);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)((total - 10) & 0xFF), b[9] = (unsigned char)((total - 10) >> 8);
    memcpy(b + 10, dict, (size_t)(total - 10));
    if (bytes) memcpy(b + total, data, bytes);
    put(name, b, (size_t)total + bytes);
    free(b);
}

/* Empties tmpdir of its nested directories (remove_tree then takes the
 * rest: it goes one level deep). */
static int rm_entry(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb, (void)flag;
    return f->level > 0 ? remove(p) : 0;
}

static void remove_all(void) {
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    remove_tree();
}

/* The tokens the shards hold: stream position i -> id (some above 50000). */
static uint16_t shard_tok(int64_t i) { return (uint16_t)((i * 7919 + 13) % 65521); }

/* ---- helpers ------------------------------------------------------------ */

/* Reads [start, start + n) and compares with want[start..]; returns mismatches. */
static int compare_read(fr_tokens *t, int64_t start, int n, const int32_t *want) {
    static int32_t got[8192];
    char err[FR_ERR_LEN];
    if (fr_tokens_read(t, start, n, got, err, sizeof err)) {
        fprintf(stderr, "read %lld+%d: %s\n", (long long)start, n, err);
        return n ? n : 1;
    }
    int bad = 0;
    for (int j = 0; j < n; j++) bad += got[j] != want[start + j];
    return bad;
}

static void check_no_leak(fr_ctx *ctx, int fds0, int line) {
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK_AT(line, s.allocated_total == 0, "%zu bytes still allocated", s.allocated_total);
    CHECK_AT(line, open_fds() == fds0, "%d descriptors open, %d before", open_fds(), fds0);
}

/* fr_tokens_open(path) must fail with a message holding each of the
 * (up to three) fragments. */
static void expect_open_fails(fr_ctx *ctx, const char *path, const char *a, const char *b,
                              const char *c, int line) {
    int fds0 = open_fds();
    fr_tokens *t = fr_tokens_open(ctx, path);
    const char *m = fr_last_error(ctx);
    CHECK_AT(line, t == NULL, "%s opened", path);
    fr_tokens_close(t);
    CHECK_AT(line,
             fr_last_error(ctx) == m && (a == NULL || strstr(m, a)) &&
                 (b == NULL || strstr(m, b)) && (c == NULL || strstr(m, c)),
             "message '%s' lacks '%s' / '%s' / '%s'", m, a ? a : "", b ? b : "", c ? c : "");
    check_no_leak(ctx, fds0, line);
}

/* ---- shards ------------------------------------------------------------- */

enum { S0 = 1000, S1 = 1, S2 = 2500, SN = S0 + S1 + S2 };
static int32_t shard_want[SN];

static void test_shards(fr_ctx *ctx) {
    static uint16_t tok[SN];
    for (int i = 0; i < SN; i++) tok[i] = shard_tok(i), shard_want[i] = tok[i];
    mkdir(path_of("sh"), 0755);
    put_shard("sh/train_000.bin", tok, S0, FR_SHARD_MAGIC, 1, S0, 0);
    put_shard("sh/train_001.bin", tok + S0, S1, FR_SHARD_MAGIC, 1, S1, 0);
    put_shard("sh/train_001a.bin", NULL, 0, FR_SHARD_MAGIC, 1, 0, 0); /* empty */
    put_shard("sh/train_002.bin", tok + S0 + S1, S2, FR_SHARD_MAGIC, 1, S2, 0);
    put_shard("sh/other.bin", tok, 10, FR_SHARD_MAGIC, 1, 10, 0); /* not matched */
    int fds0 = open_fds();
    fr_tokens *t = fr_tokens_open(ctx, path_of("sh/train_*.bin"));
    CHECK(t != NULL, "%s", fr_last_error(ctx));
    if (!t) return;
    CHECK(fr_tokens_len(t) == SN && fr_tokens_files(t) == 4 &&
              fr_tokens_get_kind(t) == FR_TOKENS_SHARDS,
          "len %lld, %d files", (long long)fr_tokens_len(t), fr_tokens_files(t));
    CHECK(compare_read(t, 0, SN, shard_want) == 0, "the whole stream differs");
    int bad = 0;
    /* Every window of 7 and 1003 tokens around the two boundaries, and some elsewhere. */
    for (int64_t s = S0 - 9; s <= S0 + 3; s++) bad += compare_read(t, s, 7, shard_want);
    for (int64_t s = 0; s + 1003 <= SN; s += 97) bad += compare_read(t, s, 1003, shard_want);
    bad += compare_read(t, SN - 1, 1, shard_want) + compare_read(t, 5, 0, shard_want);
    CHECK(bad == 0, "%d tokens differ in windows", bad);
    int32_t one;
    char err[FR_ERR_LEN];
    CHECK(fr_tokens_read(t, SN, 1, &one, err, sizeof err) == FR_ERR_ARG && strstr(err, "outside"),
          "a read past the end: %s", err);
    CHECK(fr_tokens_read(t, -1, 1, &one, err, sizeof err) == FR_ERR_ARG, "a read before 0");

    /* ids: the largest one, computed here, + 1 is the hint after a check. */
    int32_t max = 0;
    int64_t first_big = -1;
    for (int i = 0; i < SN; i++) {
        if (shard_want[i] > max) max = shard_want[i];
        if (first_big < 0 && shard_want[i] >= 50257) first_big = i;
    }
    CHECK(fr_tokens_vocab_hint(t) == 0, "hint before a check");
    CHECK(fr_tokens_check(ctx, t, 65536, 64) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_tokens_vocab_hint(t) == max + 1, "hint %d, max id %d", fr_tokens_vocab_hint(t), max);
    CHECK(first_big > 0 && first_big < S0, "the first id >= 50257 lies in shard 0 (%lld)",
          (long long)first_big);
    char want[128];
    snprintf(want, sizeof want,
             "train_000.bin: token %lld (byte %lld), stream position %lld: id %d",
             (long long)first_big, 1024 + 2 * (long long)first_big, (long long)first_big,
             shard_want[first_big]);
    CHECK(fr_tokens_check(ctx, t, 50257, 64) == FR_ERR_FORMAT && strstr(fr_last_error(ctx), want) &&
              strstr(fr_last_error(ctx), "50257"),
          "message '%s' lacks '%s'", fr_last_error(ctx), want);
    /* An id in the last shard: the file and the index inside it. vocab is
     * one past the largest id of the first two shards. */
    int32_t v = 0;
    for (int i = 0; i < S0 + S1; i++)
        if (shard_want[i] > v) v = shard_want[i];
    v++;
    int64_t last_big = -1;
    for (int i = S0 + S1; i < SN && last_big < 0; i++)
        if (shard_want[i] >= v) last_big = i;
    CHECK(last_big > 0, "no id of the last shard exceeds the first two's (%d)", v);
    snprintf(want, sizeof want, "train_002.bin: token %lld (byte %lld), stream position %lld",
             (long long)(last_big - S0 - S1), 1024 + 2 * (long long)(last_big - S0 - S1),
             (long long)last_big);
    CHECK(fr_tokens_check(ctx, t, v, 8) == FR_ERR_FORMAT && strstr(fr_last_error(ctx), want),
          "'%s' lacks '%s'", fr_last_error(ctx), want);
    CHECK(fr_tokens_check(ctx, t, 65536, SN) == FR_ERR_SHAPE &&
              strstr(fr_last_error(ctx), "3501 tokens in 4 files") &&
              strstr(fr_last_error(ctx), "needs at least 3502"),
          "%s", fr_last_error(ctx));
    CHECK(fr_tokens_check(ctx, t, 65536, SN - 1) == FR_OK, "T = len - 1 fits");
    fr_tokens_close(t);
    check_no_leak(ctx, fds0, __LINE__);

    /* The directory holds other.bin too: 3511 tokens, other.bin first. */
    t = fr_tokens_open(ctx, path_of("sh"));
    CHECK(t && fr_tokens_len(t) == SN + 10 && fr_tokens_files(t) == 5, "the directory: %s",
          t ? "wrong length" : fr_last_error(ctx));
    fr_tokens_close(t);
}

/* A shard image in memory: the same faults through fr_shard_check. */
static void test_shard_check(fr_ctx *ctx) {
    unsigned char b[1024 + 8] = {0};
    put_le32(b, FR_SHARD_MAGIC), put_le32(b + 4, 1), put_le32(b + 8, 4);
    CHECK(fr_shard_check(ctx, "m.bin", b, sizeof b) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_shard_check(ctx, "m.bin", b, sizeof b - 1) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "m.bin: truncated: the header counts 4 tokens"),
          "%s", fr_last_error(ctx));
    put_le32(b + 8, 3);
    CHECK(fr_shard_check(ctx, "m.bin", b, sizeof b) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "m.bin: 2 trailing bytes"),
          "%s", fr_last_error(ctx));
    put_le32(b + 8, (uint32_t)-1);
    CHECK(fr_shard_check(ctx, "m.bin", b, sizeof b) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "byte 8: token count -1 is negative"),
          "%s", fr_last_error(ctx));
    put_le32(b + 4, 2);
    CHECK(fr_shard_check(ctx, "m.bin", b, sizeof b) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "byte 4: version 2 is not 1"),
          "%s", fr_last_error(ctx));
    put_le32(b, 20240521);
    CHECK(fr_shard_check(ctx, "m.bin", b, sizeof b) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "byte 0: magic 20240521"),
          "%s", fr_last_error(ctx));
    put_le32(b, FR_SHARD_MAGIC);
    CHECK(fr_shard_check(ctx, "m.bin", b, 1000) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "truncated header: 1000 bytes"),
          "%s", fr_last_error(ctx));
    CHECK(fr_shard_check(ctx, "m.bin", b, 2) == FR_ERR_FORMAT, "2 bytes");
    CHECK(fr_shard_check(ctx, "m.bin", b, 0) == FR_ERR_FORMAT, "0 bytes");
}

/* ---- .npy --------------------------------------------------------------- */

static void test_npy(fr_ctx *ctx) {
    enum { N = 300 };
    static int32_t want[4 * N];
    uint8_t u1[N];
    uint16_t u2[N];
    int32_t i4[N];
    int64_t i8[N];
    for (int i = 0; i < N; i++) {
        u1[i] = (uint8_t)(i * 31 + 5), u2[i] = (uint16_t)(i * 977 + 3);
        i4[i] = i * 1000003 + 17, i8[i] = (int64_t)i * 7000001 + 11;
        want[i] = u1[i], want[N + i] = u2[i], want[2 * N + i] = i4[i];
        want[3 * N + i] = (int32_t)i8[i];
    }
    mkdir(path_of("np"), 0755);
    char shape[32];
    snprintf(shape, sizeof shape, "(%d,)", N);
    put_npy("np/a.npy", "|u1", shape, u1, sizeof u1);
    put_npy("np/b.npy", "<u2", shape, u2, sizeof u2);
    put_npy("np/c.npy", "<i4", shape, i4, sizeof i4);
    put_npy("np/d.npy", "<i8", shape, i8, sizeof i8);
    int fds0 = open_fds();
    fr_tokens *t = fr_tokens_open(ctx, path_of("np/*.npy"));
    CHECK(t != NULL, "%s", fr_last_error(ctx));
    if (!t) return;
    CHECK(fr_tokens_len(t) == 4 * N && fr_tokens_get_kind(t) == FR_TOKENS_NPY, "len %lld",
          (long long)fr_tokens_len(t));
    int bad = compare_read(t, 0, 4 * N, want);
    for (int64_t s = 0; s + 333 <= 4 * N; s += 41) bad += compare_read(t, s, 333, want);
    CHECK(bad == 0, "%d npy tokens differ", bad);
    fr_tokens_close(t);
    /* One file alone, by its path. */
    t = fr_tokens_open(ctx, path_of("np/d.npy"));
    CHECK(t && fr_tokens_len(t) == N && compare_read(t, 0, N, want + 3 * N) == 0, "d.npy alone");
    fr_tokens_close(t);
    check_no_leak(ctx, fds0, __LINE__);

    /* An i8 id that does not fit int32 and a negative one: at read time, and in the check. */
    int64_t big[4] = {1, 2, 3000000000LL, 4}, neg[3] = {5, -3, 6};
    put_npy("np_big.npy", "<i8", "(4,)", big, sizeof big);
    put_npy("np_neg.npy", "<i8", "(3,)", neg, sizeof neg);
    t = fr_tokens_open(ctx, path_of("np_big.npy"));
    int32_t out[4];
    char err[FR_ERR_LEN];
    CHECK(t && fr_tokens_read(t, 0, 4, out, err, sizeof err) == FR_ERR_FORMAT &&
              strstr(err, "np_big.npy: token 2 (byte 144): id 3000000000"),
          "%s", t ? err : fr_last_error(ctx));
    fr_tokens_close(t);
    t = fr_tokens_open(ctx, path_of("np_neg.npy"));
    CHECK(t && fr_tokens_check(ctx, t, 100, 1) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "np_neg.npy: token 1 (byte 136): id -3"),
          "%s", fr_last_error(ctx));
    fr_tokens_close(t);

    /* Headers a token file cannot have. */
    float f4[3] = {1, 2, 3};
    put_npy("bad_f4.npy", "<f4", "(3,)", f4, sizeof f4);
    expect_open_fails(ctx, path_of("bad_f4.npy"), "bad_f4.npy: dtype '<f4'", "holds floats", NULL,
                      __LINE__);
    int32_t two[6] = {1, 2, 3, 4, 5, 6};
    put_npy("bad_2d.npy", "<i4", "(2, 3)", two, sizeof two);
    expect_open_fails(ctx, path_of("bad_2d.npy"), "bad_2d.npy", "has 2 dimensions", "1-D",
                      __LINE__);
    put_npy("bad_be.npy", ">i4", "(3,)", two, 12);
    expect_open_fails(ctx, path_of("bad_be.npy"), "bad_be.npy", "big-endian", NULL, __LINE__);
    put_npy("bad_short.npy", "<i4", "(7,)", two, sizeof two);
    expect_open_fails(ctx, path_of("bad_short.npy"), "bad_short.npy: truncated",
                      "7 tokens of <i4 need", "156 bytes, the file has 152", __LINE__);
    put_npy("bad_long.npy", "<i4", "(5,)", two, sizeof two);
    expect_open_fails(ctx, path_of("bad_long.npy"), "bad_long.npy: trailing bytes", NULL, NULL,
                      __LINE__);
    put_npy("bad_int.npy", "<i4", "(6)", two, sizeof two);
    expect_open_fails(ctx, path_of("bad_int.npy"), "bad_int.npy: byte ", "malformed .npy header",
                      NULL, __LINE__);

    /* The same on memory. */
    static const char img[] = "\x93NUMPY\x01\x00\x3a\x00{'descr': '<u2', 'fortran_order': False, "
                              "'shape': (2,), }\n\x01\x00\x02\x00";
    CHECK(fr_token_npy_check(ctx, "m.npy", img, sizeof img - 1) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_token_npy_check(ctx, "m.npy", img, sizeof img - 2) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "m.npy: truncated"),
          "%s", fr_last_error(ctx));
}

/* ---- text --------------------------------------------------------------- */

/* tx/: a.txt, b/ (c.txt, d/e.txt), b.dat, .hidden, empty.txt, link.u8 -> a.txt,
 * linkdir -> b, fifo, z.txt. The stream: a.txt, b/c.txt, b/d/e.txt, z.txt. */
static char text_want_s[1024];
static int32_t text_want[1024];
static int text_len, text_len_a;

static void make_text(void) {
    static const char *a = "It is a truth universally acknowledged,", *c = "\n\t\x01\xff bytes ",
                      *e = "x", *z = "...and the end.\n";
    mkdir(path_of("tx"), 0755);
    mkdir(path_of("tx/b"), 0755);
    mkdir(path_of("tx/b/d"), 0755);
    put("tx/a.txt", a, strlen(a));
    put("tx/b/c.txt", c, strlen(c));
    put("tx/b/d/e.txt", e, 1);
    put("tx/b.dat", "index", 5);
    put("tx/.hidden", "hidden", 6);
    put("tx/empty.txt", "", 0);
    put("tx/z.txt", z, strlen(z));
    if (symlink("a.txt", path_of("tx/link.u8")) || symlink("b", path_of("tx/linkdir")))
        perror("symlink");
    if (mkfifo(path_of("tx/fifo"), 0644)) perror("mkfifo");
    text_len = snprintf(text_want_s, sizeof text_want_s, "%s%s%s%s", a, c, e, z);
    text_len_a = (int)strlen(a);
    for (int i = 0; i < text_len; i++) text_want[i] = (unsigned char)text_want_s[i];
}

static void test_text(fr_ctx *ctx) {
    make_text();
    int fds0 = open_fds();
    fr_tokens *t = fr_tokens_open(ctx, path_of("tx"));
    CHECK(t != NULL, "%s", fr_last_error(ctx));
    if (!t) return;
    CHECK(fr_tokens_len(t) == text_len && fr_tokens_files(t) == 5 &&
              fr_tokens_get_kind(t) == FR_TOKENS_TEXT && fr_tokens_vocab_hint(t) == 256,
          "len %lld (want %d), %d files", (long long)fr_tokens_len(t), text_len,
          fr_tokens_files(t));
    int bad = 0;
    for (int n = 1; n <= 12; n++)
        for (int64_t s = 0; s + n <= text_len; s++) bad += compare_read(t, s, n, text_want);
    CHECK(bad == 0, "%d text tokens differ", bad);
    CHECK(fr_tokens_check(ctx, t, 256, 8) == FR_OK, "%s", fr_last_error(ctx));
    /* A byte vocabulary smaller than 256: the first byte >= 200 is c.txt's 0xff. */
    char want[128];
    snprintf(want, sizeof want, "c.txt: token 3 (byte 3), stream position %d: id 255",
             text_len_a + 3);
    CHECK(fr_tokens_check(ctx, t, 200, 8) == FR_ERR_FORMAT && strstr(fr_last_error(ctx), want),
          "'%s' lacks '%s'", fr_last_error(ctx), want);
    snprintf(want, sizeof want, "%d tokens in 5 files; one window of T = %d needs at least %d",
             text_len, text_len, text_len + 1);
    CHECK(fr_tokens_check(ctx, t, 256, text_len) == FR_ERR_SHAPE &&
              strstr(fr_last_error(ctx), "tx: ") && strstr(fr_last_error(ctx), want),
          "'%s' lacks '%s'", fr_last_error(ctx), want);
    fr_tokens_close(t);

    /* One short text file: named in the message. */
    t = fr_tokens_open(ctx, path_of("tx/z.txt"));
    CHECK(t && fr_tokens_check(ctx, t, 256, 64) == FR_ERR_SHAPE &&
              strstr(fr_last_error(ctx), "z.txt: 16 tokens in 1 file; one window of T = 64 "
                                         "needs at least 65"),
          "%s", fr_last_error(ctx));
    fr_tokens_close(t);
    check_no_leak(ctx, fds0, __LINE__);
}

/* ---- bad sources -------------------------------------------------------- */

static void test_bad_sources(fr_ctx *ctx) {
    uint16_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    put_shard("magic.bin", tok, 8, 12345, 1, 8, 0);
    expect_open_fails(ctx, path_of("magic.bin"),
                      "magic.bin: byte 0: magic 12345 is not llm.c's shard magic 20240520", NULL,
                      NULL, __LINE__);
    put_shard("version.bin", tok, 8, FR_SHARD_MAGIC, 3, 8, 0);
    expect_open_fails(ctx, path_of("version.bin"), "version.bin: byte 4: version 3 is not 1", NULL,
                      NULL, __LINE__);
    put_shard("count.bin", tok, 8, FR_SHARD_MAGIC, 1, 6, 0);
    expect_open_fails(ctx, path_of("count.bin"),
                      "count.bin: 4 trailing bytes: the header counts 6 tokens (1036 bytes) but "
                      "the file has 1040 bytes",
                      NULL, NULL, __LINE__);
    put_shard("cut.bin", tok, 8, FR_SHARD_MAGIC, 1, 8, -3);
    expect_open_fails(ctx, path_of("cut.bin"),
                      "cut.bin: truncated: the header counts 8 tokens (1040 bytes) but the file "
                      "has 1037 bytes (6 whole tokens)",
                      NULL, NULL, __LINE__);
    unsigned char head[100] = {0};
    put_le32(head, FR_SHARD_MAGIC);
    put("head.bin", head, sizeof head);
    expect_open_fails(ctx, path_of("head.bin"), "head.bin: truncated header: 100 bytes", NULL, NULL,
                      __LINE__);
    expect_open_fails(ctx, path_of("nothing_*.bin"), "nothing_*.bin: ", "matches no file", NULL,
                      __LINE__);
    expect_open_fails(ctx, path_of("missing.txt"), "missing.txt: cannot open", "No such file", NULL,
                      __LINE__);
    mkdir(path_of("empty"), 0755);
    expect_open_fails(ctx, path_of("empty"), "empty: no files to read", NULL, NULL, __LINE__);
    mkdir(path_of("onlydat"), 0755);
    put("onlydat/x.dat", "abc", 3);
    put("onlydat/.y", "abc", 3);
    expect_open_fails(ctx, path_of("onlydat"), "onlydat: no files to read", NULL, NULL, __LINE__);
    mkdir(path_of("zero"), 0755);
    put("zero/a.txt", "", 0);
    expect_open_fails(ctx, path_of("zero"), "zero: 1 file but no tokens", NULL, NULL, __LINE__);
    mkdir(path_of("mixed"), 0755);
    put("mixed/a.txt", "some text", 9);
    put_shard("mixed/b.bin", tok, 8, FR_SHARD_MAGIC, 1, 8, 0);
    expect_open_fails(ctx, path_of("mixed"), "b.bin: a llm.c shard file among text files", "a.txt",
                      NULL, __LINE__);
    /* A FIFO named directly is refused at once, never waited on. */
    expect_open_fails(ctx, path_of("tx/fifo"), "fifo: the token file is a FIFO", NULL, NULL,
                      __LINE__);
}

/* ---- split -------------------------------------------------------------- */

static void test_split(fr_ctx *ctx) {
    fr_tokens *t = fr_tokens_open(ctx, path_of("sh/train_*.bin")); /* 3501 tokens */
    if (!t) return;
    fr_token_split sp;
    CHECK(fr_tokens_split(ctx, t, 0.1, 64, &sp) == FR_OK && sp.n_val == 350 && sp.n_train == 3151,
          "0.1: floor(350.1) = 350, got %lld + %lld", (long long)sp.n_train, (long long)sp.n_val);
    CHECK(fr_tokens_split(ctx, t, 0.0, 64, &sp) == FR_OK && sp.n_val == 0 && sp.n_train == 3501,
          "no validation");
    CHECK(fr_tokens_split(ctx, t, 0.5, 1749, &sp) == FR_OK && sp.n_val == 1750, "0.5, T 1749");
    CHECK(fr_tokens_split(ctx, t, 0.5, 1750, &sp) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "validation part holds 1750 = floor(3501 * 0.5) tokens") &&
              strstr(fr_last_error(ctx), "T = 1750 needs 1751"),
          "%s", fr_last_error(ctx));
    CHECK(fr_tokens_split(ctx, t, 0.99, 64, &sp) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "training part holds 36 of 3501 tokens") &&
              strstr(fr_last_error(ctx), "needs 65"),
          "0.99: floor(3465.99) = 3465 val, 36 train: %s", fr_last_error(ctx));
    CHECK(fr_tokens_split(ctx, t, 1.0, 8, &sp) == FR_ERR_ARG, "fraction 1 accepted");
    CHECK(fr_tokens_split(ctx, t, -0.1, 8, &sp) == FR_ERR_ARG, "negative fraction accepted");
    fr_tokens_close(t);
}

/* ---- the loader --------------------------------------------------------- */

static void reference_order(uint64_t seed, int epoch, int64_t n, int64_t *perm) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    fr_rng r = fr_rng_make(seed, 1000 + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)fr_rng_below(&r, (uint64_t)i + 1), s = perm[i];
        perm[i] = perm[j];
        perm[j] = s;
    }
}

static fr_token_loader_opts lopts(int B, int T, int shuffle, uint64_t seed, int queue,
                                  int64_t begin, int64_t end) {
    fr_token_loader_opts o = {B, T, shuffle, seed, queue, 0, begin, end, 0, 0, 0};
    return o;
}

/* Runs an epoch; each row must be a window of want at a multiple of T past
 * begin, with y = x shifted by one; records the window indices. Returns
 * batches, or -1 on an error. */
static int64_t run_epoch(fr_ctx *ctx, fr_token_loader *l, const fr_token_loader_opts *o,
                         const int32_t *want, int epoch, int64_t skip, int64_t *order,
                         int64_t *count, int *bad) {
    *count = 0;
    if (fr_token_loader_start(l, epoch, skip)) return -1;
    int64_t nb = 0, nw = fr_token_loader_num_windows(l);
    for (;;) {
        fr_token_batch b;
        int done;
        if (fr_token_loader_next(l, &b, &done)) {
            fprintf(stderr, "next: %s\n", fr_last_error(ctx));
            return -1;
        }
        if (done) break;
        if (b.B != o->batch || b.T != o->T) (*bad)++;
        for (int r = 0; r < b.B; r++) {
            const int32_t *x = b.x + (size_t)r * b.T, *y = b.y + (size_t)r * b.T;
            int64_t w = -1; /* the window whose tokens these are */
            for (int64_t c = 0; c < nw && w < 0; c++) {
                const int32_t *s = want + o->begin + c * o->T;
                if (!memcmp(x, s, (size_t)o->T * 4) && !memcmp(y, s + 1, (size_t)o->T * 4)) w = c;
            }
            if (w < 0) (*bad)++;
            order[(*count)++] = w;
        }
        nb++;
    }
    return nb;
}

static void test_loader(fr_ctx *ctx) {
    fr_tokens *t = fr_tokens_open(ctx, path_of("sh/train_*.bin"));
    if (!t) return;
    fr_token_split sp;
    fr_tokens_split(ctx, t, 0.1, 16, &sp); /* 3151 + 350 */
    static int64_t order[4096], order2[4096], ref[4096];
    int64_t n;
    int bad = 0;
    /* Train: (3151 - 1) / 16 = 196 windows, 49 batches of 4. */
    for (int q = 0; q <= 2; q += 2) {
        fr_token_loader_opts o = lopts(4, 16, 1, 42, q, 0, sp.n_train);
        fr_token_loader *l = fr_token_loader_new(ctx, t, &o);
        CHECK(l && fr_token_loader_num_windows(l) == 196 && fr_token_loader_num_batches(l) == 49,
              "%s", l ? "window count" : fr_last_error(ctx));
        if (!l) continue;
        for (int epoch = 0; epoch < 2; epoch++) {
            int64_t nb = run_epoch(ctx, l, &o, shard_want, epoch, 0, order, &n, &bad);
            reference_order(42, epoch, 196, ref);
            CHECK(nb == 49 && n == 196 && bad == 0, "queue %d epoch %d: %lld batches, %d bad", q,
                  epoch, (long long)nb, bad);
            CHECK(!memcmp(order, ref, 196 * sizeof *ref),
                  "queue %d epoch %d: not Fisher-Yates on fr_rng_make(42, 1000 + epoch)", q, epoch);
            static unsigned char seen[196];
            memset(seen, 0, sizeof seen);
            int dup = 0;
            for (int k = 0; k < 196; k++) dup += order[k] < 0 || seen[order[k]]++;
            CHECK(dup == 0, "not a permutation: %d repeats", dup);
            if (epoch == 1) CHECK(memcmp(order, order2, 196 * 8) != 0, "epochs 0 and 1 agree");
            memcpy(order2, order, sizeof order2);
        }
        /* Resume at batch 30: the tail of the same epoch. */
        run_epoch(ctx, l, &o, shard_want, 1, 0, order2, &n, &bad);
        int64_t nb = run_epoch(ctx, l, &o, shard_want, 1, 30, order, &n, &bad);
        CHECK(nb == 19 && n == 76 && !memcmp(order, order2 + 120, 76 * 8), "resume at 30");
        CHECK(fr_token_loader_start(l, 1, 50) == FR_ERR_ARG, "skip past the epoch accepted");
        fr_token_loader_free(l);
    }

    /* The order bench/token_order.py prints for seed 1234, epoch 3, 20 windows. */
    static const int64_t py[20] = {0, 19, 9, 7,  18, 10, 8, 4,  3, 13,
                                   2, 11, 6, 12, 14, 16, 1, 15, 5, 17};
    fr_token_loader_opts o = lopts(5, 8, 1, 1234, 1, 100, 100 + 20 * 8 + 1);
    fr_token_loader *l = fr_token_loader_new(ctx, t, &o);
    CHECK(l && fr_token_loader_num_windows(l) == 20, "20 windows of 8 in 161 tokens");
    int64_t nb = l ? run_epoch(ctx, l, &o, shard_want, 3, 0, order, &n, &bad) : 0;
    CHECK(nb == 4 && bad == 0 && !memcmp(order, py, sizeof py), "not token_order.py's order");
    fr_token_loader_free(l);

    /* Validation: the 350 tokens at the end, windows in order; (350-1)/16 = 21, 5 batches of 4. */
    o = lopts(4, 16, 0, 0, 1, sp.n_train, fr_tokens_len(t));
    l = fr_token_loader_new(ctx, t, &o);
    nb = l ? run_epoch(ctx, l, &o, shard_want, 7, 0, order, &n, &bad) : 0;
    int inorder = n == 20;
    for (int k = 0; k < n; k++) inorder &= order[k] == k;
    CHECK(l && fr_token_loader_num_windows(l) == 21 && nb == 5 && inorder && bad == 0,
          "validation windows in order: %lld batches", (long long)nb);
    fr_token_loader_free(l);

    /* The last window ends exactly at the last token: 33 tokens, T 16 -> 2 windows. */
    o = lopts(2, 16, 0, 0, 0, 1000 - 16, 1000 + 17);
    l = fr_token_loader_new(ctx, t, &o);
    nb = l ? run_epoch(ctx, l, &o, shard_want, 0, 0, order, &n, &bad) : 0;
    CHECK(nb == 1 && n == 2 && order[0] == 0 && order[1] == 1 && bad == 0,
          "2 windows across the shard boundary");
    fr_token_loader_free(l);

    /* Refusals. */
    o = lopts(4, 16, 1, 0, 1, 0, 16 * 3 + 1);
    CHECK(!fr_token_loader_new(ctx, t, &o) &&
              strstr(fr_last_error(ctx), "holds 3 windows of T = 16") &&
              strstr(fr_last_error(ctx), "fewer than a batch of 4"),
          "%s", fr_last_error(ctx));
    o = lopts(1, 16, 1, 0, 1, 3000, 3502);
    CHECK(!fr_token_loader_new(ctx, t, &o) && strstr(fr_last_error(ctx), "runs past"), "%s",
          fr_last_error(ctx));
    o = lopts(0, 16, 1, 0, 1, 0, 100);
    CHECK(!fr_token_loader_new(ctx, t, &o) && strstr(fr_last_error(ctx), "bad options"), "B 0");
    CHECK(fr_token_loader_reserved(&o) == 0, "reserved for refused options");
    fr_tokens_close(t);
}

/* Windows over the text tree: each crosses a file boundary somewhere. */
static void test_text_windows(fr_ctx *ctx) {
    fr_tokens *t = fr_tokens_open(ctx, path_of("tx"));
    if (!t) return;
    static int64_t order[256];
    int64_t n;
    int bad = 0;
    fr_token_loader_opts o = lopts(2, 5, 0, 0, 2, 0, text_len);
    fr_token_loader *l = fr_token_loader_new(ctx, t, &o);
    int64_t nw = (text_len - 1) / 5;
    int64_t nb = l ? run_epoch(ctx, l, &o, text_want, 0, 0, order, &n, &bad) : -1;
    CHECK(nb == nw / 2 && n == nb * 2 && bad == 0, "text: %lld batches, %d bad rows", (long long)nb,
          bad);
    /* The window holding a.txt's last byte and c.txt's first came, matched. */
    int64_t cross = (text_len_a - 1) / 5;
    CHECK(cross * 5 + 5 >= text_len_a && cross < n && order[cross] == cross, "boundary window %lld",
          (long long)cross);
    fr_token_loader_free(l);
    fr_tokens_close(t);
}

/* DATA while iterating is (queue + 1) slots of (2*B*T + 1) int32, whatever
 * the data size, and fr_token_loader_reserved is what a fresh context
 * reserves for the loader. */
static void test_memory(void) {
    enum { BIG = 1 << 21 };
    uint16_t *tok = malloc(BIG * sizeof *tok);
    for (int i = 0; i < BIG; i++) tok[i] = (uint16_t)(i % 50000);
    put_shard("big.bin", tok, BIG, FR_SHARD_MAGIC, 1, BIG, 0);
    free(tok);
    fr_ctx *ctx = fr_ctx_new();
    fr_tokens *t = fr_tokens_open(ctx, path_of("big.bin"));
    CHECK(t != NULL, "%s", fr_last_error(ctx));
    if (!t) {
        fr_ctx_free(ctx);
        return;
    }
    fr_mem_stats s0, s1, s;
    fr_mem_get_stats(ctx, &s0);
    CHECK(s0.allocated_total < 4096 && s0.allocated[FR_MEM_DATA] == 0,
          "an open 4 MiB shard holds %zu bytes", s0.allocated_total);
    const int B = 8, T = 64, q = 3;
    fr_token_loader_opts o = lopts(B, T, 1, 5, q, 0, BIG);
    size_t promised = fr_token_loader_reserved(&o);
    fr_token_loader *l = fr_token_loader_new(ctx, t, &o);
    fr_mem_get_stats(ctx, &s1);
    CHECK(l && s1.reserved - s0.reserved == promised, "reserved %zu, promised %zu",
          s1.reserved - s0.reserved, promised);
    const size_t data = (size_t)(q + 1) * (2 * B * T + 1) * 4;
    CHECK(data == 16400, "bound %zu", data);
    CHECK(s1.allocated[FR_MEM_DATA] == data, "DATA %zu", s1.allocated[FR_MEM_DATA]);
    /* The permutation: 8 bytes a window, (2^21 - 1) / 64 = 32767 windows. */
    CHECK(s1.allocated[FR_MEM_OTHER] - s0.allocated[FR_MEM_OTHER] < 32767 * 8 + 1024,
          "OTHER grew %zu", s1.allocated[FR_MEM_OTHER] - s0.allocated[FR_MEM_OTHER]);
    int over = 0, wrong = 0;
    if (l && !fr_token_loader_start(l, 0, 0)) {
        for (int k = 0; k < 200; k++) {
            fr_token_batch b;
            int done;
            if (fr_token_loader_next(l, &b, &done) || done) break;
            fr_mem_get_stats(ctx, &s);
            over += s.allocated[FR_MEM_DATA] != data;
            for (int j = 0; j < B * T; j++) wrong += (b.x[j] + 1) % 50000 != b.y[j];
        }
    }
    CHECK(over == 0 && wrong == 0, "%d batches over the bound, %d wrong targets", over, wrong);
    fr_token_loader_free(l);
    o.shuffle = 0;
    fr_mem_get_stats(ctx, &s0);
    l = fr_token_loader_new(ctx, t, &o);
    fr_mem_get_stats(ctx, &s1);
    CHECK(s1.allocated[FR_MEM_OTHER] - s0.allocated[FR_MEM_OTHER] < 1024,
          "no permutation without shuffle");
    fr_token_loader_free(l);
    fr_tokens_close(t);
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated_total == 0, "%zu bytes left", s.allocated_total);
    fr_ctx_free(ctx);
}

/* A shard whose ids change on disk after the check, and one that shrinks
 * under the prefetch thread: next() reports either on the caller's side. */
static void test_read_errors(fr_ctx *ctx) {
    enum { N = 4000 };
    static uint16_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (uint16_t)(i % 90);
    put_shard("change.bin", tok, N, FR_SHARD_MAGIC, 1, N, 0);
    fr_tokens *t = fr_tokens_open(ctx, path_of("change.bin"));
    if (!t) return;
    CHECK(fr_tokens_check(ctx, t, 100, 16) == FR_OK, "%s", fr_last_error(ctx));
    tok[17] = 500;
    int fd = open(path_of("change.bin"), O_WRONLY);
    unsigned char b2[2] = {500 & 0xFF, 500 >> 8};
    if (fd < 0 || pwrite(fd, b2, 2, 1024 + 2 * 17) != 2) perror("pwrite");
    fr_token_loader_opts o = lopts(4, 16, 0, 0, 0, 0, N);
    o.vocab = 100;
    fr_token_loader *l = fr_token_loader_new(ctx, t, &o);
    fr_token_batch b;
    int done;
    CHECK(l && !fr_token_loader_start(l, 0, 0) &&
              fr_token_loader_next(l, &b, &done) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "change.bin: token 17 (byte 1058): id 500 is not below "
                                         "the vocabulary size 100: the file changed on disk"),
          "%s", fr_last_error(ctx));
    fr_token_loader_free(l);

    /* Shrinks: with prefetch, batches before the damage come, then the error. */
    o = lopts(4, 16, 0, 0, 2, 0, N);
    l = fr_token_loader_new(ctx, t, &o);
    fr_token_loader_start(l, 0, 0);
    CHECK(fr_token_loader_next(l, &b, &done) == FR_OK && b.x[0] == 0, "first batch");
    if (fd < 0 || ftruncate(fd, 1024 + 2 * 2000) != 0) perror("ftruncate");
    if (fd >= 0) close(fd);
    int64_t got = 1;
    fr_status st;
    while (!(st = fr_token_loader_next(l, &b, &done)) && !done) got++;
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "change.bin: cannot read tokens") &&
              strstr(fr_last_error(ctx), "the file shrank"),
          "status %d after %lld batches: %s", st, (long long)got, fr_last_error(ctx));
    CHECK(got == 31, "%lld batches before the error (2000 tokens hold 124 windows of 16 + 1)",
          (long long)got);
    CHECK(fr_token_loader_next(l, &b, &done) == FR_ERR_IO, "the error is not sticky");
    CHECK(fr_token_loader_start(l, 1, 0) == FR_OK, "restart after an error");
    fr_token_loader_free(l);
    fr_tokens_close(t);
}

/* Every allocation of open (the text tree) + new + start + two batches fails in turn. */
static void test_alloc_failures(fr_ctx *ctx) {
    int fails = 0, fds0 = open_fds();
    for (int queue = 0; queue <= 2; queue += 2) {
        for (int n = 1; n < 400; n++) {
            fr_mem_stats before, after;
            fr_mem_get_stats(ctx, &before);
            fr_mem_fail_at(ctx, (uint64_t)n);
            fr_tokens *t = fr_tokens_open(ctx, path_of("tx"));
            fr_token_loader *l = NULL;
            fr_status st = FR_OK;
            int got = 0;
            if (t) {
                fr_token_loader_opts o = lopts(2, 4, 1, 3, queue, 0, text_len);
                l = fr_token_loader_new(ctx, t, &o);
            }
            if (l && !(st = fr_token_loader_start(l, 0, 0))) {
                for (int k = 0; k < 2 && !st; k++) {
                    fr_token_batch b;
                    int done;
                    st = fr_token_loader_next(l, &b, &done);
                    got += !st && !done;
                }
            }
            fr_token_loader_free(l);
            fr_tokens_close(t);
            fr_mem_fail_at(ctx, 0);
            fr_mem_get_stats(ctx, &after);
            int injected = after.num_ooms > before.num_ooms;
            if (!t || !l) {
                fails++;
                CHECK(injected && strstr(fr_last_error(ctx), "out of memory"), "fail at %d: %s", n,
                      fr_last_error(ctx));
            } else {
                CHECK(st == FR_OK && got == 2, "fail at %d: %s", n, fr_last_error(ctx));
            }
            CHECK(after.allocated_total == 0, "fail at %d: %zu bytes leaked", n,
                  after.allocated_total);
            if (!injected) break;
        }
    }
    CHECK(fails >= 20, "only %d allocations failed", fails);
    CHECK(open_fds() == fds0, "descriptors leaked");
}

int main(void) {
    if (scratch_make("frugal-tokens")) {
        perror("mkdtemp");
        return 1;
    }
    fr_ctx *ctx = fr_ctx_new();
    test_shards(ctx);
    test_shard_check(ctx);
    test_npy(ctx);
    test_text(ctx);
    test_bad_sources(ctx);
    test_split(ctx);
    test_loader(ctx);
    test_text_windows(ctx);
    test_memory();
    test_read_errors(ctx);
    test_alloc_failures(ctx);
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated_total == 0, "%zu bytes left at the end", s.allocated_total);
    fr_ctx_free(ctx);
    remove_all();
    return check_done();
}
