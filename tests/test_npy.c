/* test_npy.c — the .npy header parser (io/npy.c) on headers the test lays
 * out byte by byte: magic, version, little-endian header length, the dict
 * padded with spaces to a 64-byte boundary and ending in '\n', as np.save
 * writes them (128 bytes for every dict here). Versions 1.0, 2.0 and 3.0; every element type the readers
 * take; Fortran order (taken for one dimension, where it is the same bytes,
 * refused for more); every fault with its whole message, each byte
 * position counted by hand in the comment beside it. Then the two readers
 * on one parser: the dataset's and the token file's checks of the same
 * bytes, each with its own element types and its own length message. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include "check.h"
#include "data/dataset.h"
#include "data/tokens.h"
#include "io/npy.h"

#define NAME "t.npy"

/* The preamble of version major.0 (10 bytes for 1.0: magic, version, u16
 * length; 12 for 2.0 and 3.0: u32 length), then dict, then spaces and '\n'
 * up to `total` bytes (the dict's length field counts all after the
 * preamble); total 0: the dict as it is, no padding. Returns the length. */
static size_t header(unsigned char *b, int major, const char *dict, size_t total) {
    size_t pre = major == 1 ? 10 : 12, n = strlen(dict);
    size_t end = total ? total : pre + n;
    if (total && total < pre + n + 1) return 0; /* no room: the caller's check fails */
    uint32_t hl = (uint32_t)(end - pre);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major, b[7] = 0;
    b[8] = hl & 0xFF, b[9] = hl >> 8 & 0xFF;
    if (major != 1) b[10] = hl >> 16 & 0xFF, b[11] = hl >> 24 & 0xFF;
    memcpy(b + pre, dict, n);
    if (total) {
        memset(b + pre + n, ' ', end - pre - n);
        b[end - 1] = '\n';
    }
    return end;
}

/* ---- accepted headers --------------------------------------------------- */

/* One v1.0 header of shape (2, 3) padded to 128 bytes, for each type: the
 * data starts at byte 128 and the file is 128 + 6 * size bytes. */
static void test_types(fr_ctx *ctx) {
    static const struct {
        const char *descr;
        fr_npy_type type;
        unsigned size;
        uint64_t bytes; /* 128 + 2 * 3 * size */
    } t[] = {{"|u1", FR_NPY_U1, 1, 134}, {"<u2", FR_NPY_U2, 2, 140}, {"<i4", FR_NPY_I4, 4, 152},
             {"<i8", FR_NPY_I8, 8, 176}, {"<f4", FR_NPY_F4, 4, 152}, {"<f8", FR_NPY_F8, 8, 176}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        char dict[96];
        snprintf(dict, sizeof dict, "{'descr': '%s', 'fortran_order': False, 'shape': (2, 3), }",
                 t[k].descr);
        unsigned char b[256];
        size_t n = header(b, 1, dict, 128);
        fr_npy h;
        fr_status st = fr_npy_parse(ctx, NAME, b, n, FR_NPY_HEADER_MAX, &h);
        CHECK(st == FR_OK, "%s: %s", t[k].descr, fr_last_error(ctx));
        if (st) continue;
        CHECK(h.type == t[k].type && h.size == t[k].size && !strcmp(h.descr, t[k].descr),
              "%s: type %d size %u descr %s", t[k].descr, h.type, h.size, h.descr);
        CHECK(h.ndim == 2 && h.shape[0] == 2 && h.shape[1] == 3 && !h.fortran,
              "%s: ndim %d (%lld, %lld) fortran %d", t[k].descr, h.ndim, (long long)h.shape[0],
              (long long)h.shape[1], h.fortran);
        CHECK(h.off == 128 && h.bytes == t[k].bytes, "%s: off %llu bytes %llu, not 128 and %llu",
              t[k].descr, (unsigned long long)h.off, (unsigned long long)h.bytes,
              (unsigned long long)t[k].bytes);
        /* "{'descr': " is 10 bytes after the 10-byte preamble: the quote is byte 20 */
        CHECK(h.descr_at == 20, "%s: descr at %zu", t[k].descr, h.descr_at);
    }
}

/* Versions 2.0 and 3.0 (a 4-byte length), other shapes and spellings. */
static void test_forms(fr_ctx *ctx) {
    static const struct {
        const char *what;
        int major;
        const char *dict;
        size_t total;
        int ndim;
        int64_t d[4];
        uint64_t bytes;
        int fortran;
    } t[] = {
        /* 128 + 5 * 8 */
        {"v2 (5,)",
         2,
         "{'descr': '<i8', 'fortran_order': False, 'shape': (5,), }",
         128,
         1,
         {5},
         168,
         0},
        /* 128 + 4 * 3 * 2 * 5 */
        {"v3 4-d",
         3,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (4, 3, 2, 5), }",
         128,
         4,
         {4, 3, 2, 5},
         608,
         0},
        /* a scalar: one element, 128 + 8 */
        {"scalar",
         1,
         "{'descr': '<f8', 'fortran_order': False, 'shape': (), }",
         128,
         0,
         {0},
         136,
         0},
        /* no elements: the file is the header */
        {"zero rows",
         1,
         "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 7), }",
         128,
         2,
         {0, 7},
         128,
         0},
        /* one dimension: either order is the same bytes; 128 + 7 * 2 */
        {"fortran 1-d",
         1,
         "{'descr': '<u2', 'fortran_order': True, 'shape': (7,), }",
         128,
         1,
         {7},
         142,
         1},
        /* keys in another order, double quotes, no trailing comma, Python 2
         * longs; 128 + 3 * 4 * 1 */
        {"spellings",
         1,
         "{\"shape\": (3L, 4L), \"fortran_order\": False, \"descr\": \"|u1\"}",
         128,
         2,
         {3, 4},
         140,
         0},
        /* no padding at all: the dict's 50 bytes after the 10 of the preamble;
         * 60 + 2 * 4 */
        {"unpadded", 1, "{'descr':'<i4','fortran_order':False,'shape':(2,)}", 0, 1, {2}, 68, 0},
        /* the largest dimension: (2^63 - 1) bytes + 128 still fits 64 bits */
        {"largest",
         1,
         "{'descr': '|u1', 'fortran_order': False, 'shape': (9223372036854775807,), }",
         128,
         1,
         {INT64_MAX},
         9223372036854775935ull,
         0},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        unsigned char b[256];
        size_t n = header(b, t[k].major, t[k].dict, t[k].total);
        fr_npy h;
        fr_status st = fr_npy_parse(ctx, NAME, b, n, FR_NPY_HEADER_MAX, &h);
        CHECK(st == FR_OK, "%s: %s", t[k].what, fr_last_error(ctx));
        if (st) continue;
        int same = h.ndim == t[k].ndim;
        for (int d = 0; same && d < h.ndim; d++) same = h.shape[d] == t[k].d[d];
        CHECK(same, "%s: ndim %d", t[k].what, h.ndim);
        CHECK(h.bytes == t[k].bytes && h.fortran == t[k].fortran, "%s: bytes %llu fortran %d",
              t[k].what, (unsigned long long)h.bytes, h.fortran);
    }
    /* the unpadded dict: 10 + 50 bytes, so its data starts at byte 60; a cap
     * of exactly 50 takes it */
    unsigned char b[256];
    fr_npy h;
    size_t n = header(b, 1, "{'descr':'<i4','fortran_order':False,'shape':(2,)}", 0);
    CHECK(n == 60 && fr_npy_parse(ctx, NAME, b, n, 50, &h) == FR_OK && h.off == 60 && h.bytes == 68,
          "unpadded: %zu bytes, off %llu", n, (unsigned long long)h.off);

    /* A descriptor no reader takes is the reader's to refuse: '<f2' parses
     * with no size and no length, its quote at byte 20. */
    n = header(b, 1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }", 128);
    CHECK(fr_npy_parse(ctx, NAME, b, n, FR_NPY_HEADER_MAX, &h) == FR_OK && h.type == FR_NPY_OTHER &&
              h.size == 0 && h.bytes == 0 && h.descr_at == 20 && !strcmp(h.descr, "<f2"),
          "'<f2': %s", fr_last_error(ctx));

    /* What a reader must read before parsing: the preamble plus the length
     * the header declares (118 here), capped, and 12 while fewer are seen. */
    n = header(b, 1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 128);
    CHECK(fr_npy_header_bytes(b, n, FR_NPY_HEADER_MAX) == 128, "v1 needs 128");
    CHECK(fr_npy_header_bytes(b, n, 100) == 110, "v1 capped at 100 needs 110");
    CHECK(fr_npy_header_bytes(b, 11, FR_NPY_HEADER_MAX) == 12, "11 bytes seen: 12");
    n = header(b, 2, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 128);
    b[10] = 1; /* length 116 + 65536 */
    CHECK(fr_npy_header_bytes(b, n, FR_NPY_HEADER_MAX) == 12 + 65652, "v2 needs 65664");
}

/* ---- refused headers ---------------------------------------------------- */

/* Each fault with its whole message. In the dicts below, the preamble is 10
 * bytes, so "{" is byte 10; "{'descr': '" puts descr's quote at 20,
 * "'<f4', 'fortran_order': " the value of fortran_order at 44, and
 * "False, 'shape': " the shape's "(" at 60. */
#define D(descr, order, shape) \
    "{'descr': '" descr "', 'fortran_order': " order ", 'shape': " shape ", }"

static void test_faults(fr_ctx *ctx) {
    static const struct {
        const char *what;
        int major;
        const char *dict;
        size_t total; /* bytes handed to the parser: the padded header */
        const char *msg;
    } t[] = {
        {"fortran 2-d", 1, D("<f4", "True", "(2, 3)"), 128,
         "t.npy: byte 44: fortran_order True is not supported with 2 dimensions (save a C-ordered "
         "array)"},
        {"big-endian", 1, D(">f4", "False", "(3,)"), 128,
         "t.npy: byte 20: big-endian dtype '>f4' is not supported"},
        {"structured", 1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 20: 'descr' is not a simple dtype string (structured arrays are not "
         "supported)"},
        /* "(3)" is the integer 3: the fault is seen after ")", byte 63 */
        {"(n)", 1, D("<f4", "False", "(3)"), 128,
         "t.npy: byte 63: malformed .npy header dict: 'shape' (n) is not a tuple: write (n,)"},
        {"negative", 1, D("<f4", "False", "(-3,)"), 128,
         "t.npy: byte 61: malformed .npy header dict: negative dimension in 'shape'"},
        {"leading zero", 1, D("<f4", "False", "(03,)"), 128,
         "t.npy: byte 61: malformed .npy header dict: dimension with a leading zero in 'shape'"},
        /* the fifth dimension: "(1, 1, 1, 1, " is bytes 60 to 72 */
        {"5 dims", 1, D("<f4", "False", "(1, 1, 1, 1, 1)"), 128,
         "t.npy: byte 73: 'shape' has more than 4 dimensions"},
        /* 2^63 does not fit int64: seen at its last digit, 61 + 18 */
        {"2^63", 1, D("|u1", "False", "(9223372036854775808,)"), 128,
         "t.npy: byte 79: malformed .npy header dict: dimension too large in 'shape'"},
        /* (2^63 - 1) * 4 bytes overflows 64 bits */
        {"overflow", 1, D("<f4", "False", "(9223372036854775807,)"), 128,
         "t.npy: byte 60: 'shape' of <f4 elements overflows 64 bits"},
        {"no tuple", 1, D("<f4", "False", "[3]"), 128,
         "t.npy: byte 60: malformed .npy header dict: 'shape' is not a tuple"},
        {"not a bool", 1, D("<f4", "Truer", "(3,)"), 128,
         "t.npy: byte 44: malformed .npy header dict: 'fortran_order' is not True or False"},
        {"missing shape", 1, "{'descr': '<f4', 'fortran_order': False, }", 128,
         "t.npy: byte 10: the .npy header dict lacks 'shape'"},
        {"missing descr", 1, "{'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 10: the .npy header dict lacks 'descr'"},
        {"missing order", 1, "{'descr': '<f4', 'shape': (3,), }", 128,
         "t.npy: byte 10: the .npy header dict lacks 'fortran_order'"},
        /* the second 'descr' value starts at byte 36 */
        {"duplicate", 1,
         "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 36: malformed .npy header dict: duplicate 'descr'"},
        {"unknown key", 1, "{'dtype': '<f4', 'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 11: malformed .npy header dict: unknown key 'dtype'"},
        /* "(3,)" is bytes 60 to 63, ", }" 64 to 66, then a space: "x" is byte 68 */
        {"garbage after", 1, D("<f4", "False", "(3,)") " x", 128,
         "t.npy: byte 68: malformed .npy header dict: unexpected characters after the header dict"},
        {"no brace", 1, "'descr': '<f4'", 128,
         "t.npy: byte 10: malformed .npy header dict: expected '{'"},
        /* the quote of "'descr" at byte 11 never closes (unpadded: the dict is 7 bytes) */
        {"unterminated", 1, "{'descr", 0,
         "t.npy: byte 11: malformed .npy header dict: unterminated string"},
        {"escape", 1, "{'de\\scr': '<f4', 'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 14: malformed .npy header dict: unexpected character 0x5c in a string"},
        /* after "'descr'" (bytes 11 to 17) comes a space, then "=" at 19 */
        {"no colon", 1, "{'descr' = '<f4', 'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 19: malformed .npy header dict: expected ':' after 'descr'"},
        /* after "'<f4'" (bytes 20 to 24): ";" at 25 */
        {"no comma", 1, "{'descr': '<f4'; 'fortran_order': False, 'shape': (3,), }", 128,
         "t.npy: byte 25: malformed .npy header dict: expected ',' or '}'"},
        {"v2 fortran", 2, D("<f8", "True", "(2, 2)"), 128,
         "t.npy: byte 46: fortran_order True is not supported with 2 dimensions (save a C-ordered "
         "array)"},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        unsigned char b[256];
        size_t n = header(b, t[k].major, t[k].dict, t[k].total);
        fr_npy h;
        fr_status st = fr_npy_parse(ctx, NAME, b, n, FR_NPY_HEADER_MAX, &h);
        CHECK(st == FR_ERR_FORMAT && !strcmp(fr_last_error(ctx), t[k].msg),
              "%s: status %d, message\n  \"%s\", not\n  \"%s\"", t[k].what, st, fr_last_error(ctx),
              t[k].msg);
    }
}

/* The preamble's faults, on bytes cut from one good v1.0 header. */
static void test_preamble(fr_ctx *ctx) {
    unsigned char b[256];
    size_t n = header(b, 1, D("<f4", "False", "(3,)"), 128);
    fr_npy h;
    static const struct {
        const char *what;
        size_t at;  /* byte to change, or SIZE_MAX */
        int value;  /* its new value */
        size_t cut; /* bytes handed over */
        uint32_t max;
        const char *msg;
    } t[] = {
        {"empty", SIZE_MAX, 0, 0, FR_NPY_HEADER_MAX, "t.npy: empty file: not a .npy file"},
        {"bad magic", 5, 'X', 128, FR_NPY_HEADER_MAX,
         "t.npy: byte 0: not a .npy file: its first bytes are 93 4e 55 4d 50 58, not the magic "
         "93 4e 55 4d 50 59 (\\x93NUMPY)"},
        {"3 bytes", SIZE_MAX, 0, 3, FR_NPY_HEADER_MAX,
         "t.npy: byte 0: not a .npy file: its first bytes are 93 4e 55 (the file ends there), not "
         "the magic 93 4e 55 4d 50 59 (\\x93NUMPY)"},
        {"8 bytes", SIZE_MAX, 0, 8, FR_NPY_HEADER_MAX, "t.npy: 8 bytes: .npy preamble cut short"},
        {"version 4.0", 6, 4, 128, FR_NPY_HEADER_MAX,
         "t.npy: byte 6: unsupported .npy version 4.0"},
        {"version 1.1", 7, 1, 128, FR_NPY_HEADER_MAX,
         "t.npy: byte 6: unsupported .npy version 1.1"},
        {"version 0.0", 6, 0, 128, FR_NPY_HEADER_MAX,
         "t.npy: byte 6: unsupported .npy version 0.0"},
        /* v2.0 reads a 4-byte length: 11 bytes do not hold it */
        {"v2 in 11 bytes", 6, 2, 11, FR_NPY_HEADER_MAX, "t.npy: 11 bytes: .npy preamble cut short"},
        /* the 118-byte dict ends at byte 128 */
        {"cut header", SIZE_MAX, 0, 100, FR_NPY_HEADER_MAX,
         "t.npy: byte 8: header length 118 runs past the end (100 bytes)"},
        /* 118 + 2 * 256 */
        {"long header", 9, 2, 128, FR_NPY_HEADER_MAX,
         "t.npy: byte 8: header length 630 runs past the end (128 bytes)"},
        {"past a cap", SIZE_MAX, 0, 128, 100, "t.npy: byte 8: header length 118 exceeds 100"},
    };
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++) {
        unsigned char c[256];
        memcpy(c, b, n);
        if (t[k].at != SIZE_MAX) c[t[k].at] = (unsigned char)t[k].value;
        fr_status st = fr_npy_parse(ctx, NAME, c, t[k].cut, t[k].max, &h);
        CHECK(st == FR_ERR_FORMAT && !strcmp(fr_last_error(ctx), t[k].msg),
              "%s: status %d, message\n  \"%s\", not\n  \"%s\"", t[k].what, st, fr_last_error(ctx),
              t[k].msg);
    }
    /* A v2.0 length's high bytes count: 116 + 65536 runs past 128 bytes. */
    n = header(b, 2, D("<f4", "False", "(3,)"), 128);
    b[10] = 1;
    CHECK(fr_npy_parse(ctx, NAME, b, n, FR_NPY_HEADER_MAX, &h) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx), "t.npy: byte 8: header length 65652 runs past the end "
                                          "(128 bytes)"),
          "v2 length: %s", fr_last_error(ctx));
    /* 116 + 16 * 65536 = 1048692: more than any reader takes (2^20) */
    b[10] = 16;
    CHECK(fr_npy_parse(ctx, NAME, b, n, FR_NPY_HEADER_MAX, &h) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx), "t.npy: byte 8: header length 1048692 exceeds 1048576"),
          "v2 length past 2^20: %s", fr_last_error(ctx));
    /* Every cut of a good header is refused, never read past. */
    n = header(b, 1, D("<f4", "False", "(3,)"), 128);
    int bad = 0;
    for (size_t cut = 0; cut < n; cut++)
        if (fr_npy_parse(ctx, NAME, b, cut, FR_NPY_HEADER_MAX, &h) != FR_ERR_FORMAT) bad++;
    CHECK(bad == 0, "%d cuts accepted", bad);
}

/* ---- the two readers ---------------------------------------------------- */

/* The same bytes through the dataset's and the token file's checks: each
 * takes its own element types and ranks, and compares the file's length
 * with the header's. */
static void test_readers(fr_ctx *ctx) {
    unsigned char b[256];
    /* u2 tokens (3,): 128 + 3 * 2 = 134 bytes */
    size_t n = header(b, 1, D("<u2", "False", "(3,)"), 128);
    memcpy(b + n, "\x01\x00\x02\x00\x03\x00", 6);
    CHECK(fr_token_npy_check(ctx, NAME, b, 134) == FR_OK, "u2 tokens: %s", fr_last_error(ctx));
    CHECK(fr_token_npy_check(ctx, NAME, b, 133) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx),
                      "t.npy: truncated: 3 tokens of <u2 need 134 bytes, the file has 133"),
          "u2 tokens, one byte short: %s", fr_last_error(ctx));
    CHECK(
        fr_npy_check(ctx, NAME, b, 134) == FR_ERR_FORMAT &&
            !strcmp(fr_last_error(ctx),
                    "t.npy: byte 20: unsupported dtype '<u2' (supported: |u1, <f4, <f8, <i4, <i8)"),
        "u2 as a dataset: %s", fr_last_error(ctx));
    /* i8 labels (3,) in Fortran order, the same bytes: 128 + 3 * 8 = 152 */
    n = header(b, 1, D("<i8", "True", "(3,)"), 128);
    memset(b + n, 0, 24);
    b[n] = 1, b[n + 8] = 2, b[n + 16] = 3;
    CHECK(fr_npy_check(ctx, NAME, b, 152) == FR_OK, "fortran labels: %s", fr_last_error(ctx));
    CHECK(fr_token_npy_check(ctx, NAME, b, 152) == FR_OK, "fortran tokens: %s", fr_last_error(ctx));
    CHECK(fr_npy_check(ctx, NAME, b, 153) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx),
                      "t.npy: expected 152 bytes for i64 of shape (3), found 153"),
          "labels, one byte over: %s", fr_last_error(ctx));
    CHECK(fr_token_npy_check(ctx, NAME, b, 153) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx),
                      "t.npy: trailing bytes: 3 tokens of <i8 need 152 bytes, the file has 153"),
          "tokens, one byte over: %s", fr_last_error(ctx));
    /* f8 (2, 2) images: 128 + 4 * 8 = 160; not tokens */
    n = header(b, 1, D("<f8", "False", "(2, 2)"), 128);
    memset(b + n, 0, 32);
    CHECK(fr_npy_check(ctx, NAME, b, 160) == FR_OK, "f8 images: %s", fr_last_error(ctx));
    CHECK(fr_token_npy_check(ctx, NAME, b, 160) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx), "t.npy: dtype '<f8' holds floats: token ids are "
                                          "integers ('|u1', '<u2', '<i4' or '<i8')"),
          "f8 tokens: %s", fr_last_error(ctx));
    /* A dict longer than a token file's 4096-byte cap is refused there, not
     * in a dataset (where it would fail on its length instead). */
    static unsigned char big[4200];
    n = header(big, 1, D("|u1", "False", "(0,)"), 4160);
    CHECK(fr_token_npy_check(ctx, NAME, big, n) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx), "t.npy: byte 8: header length 4150 exceeds 4096"),
          "long dict for tokens: %s", fr_last_error(ctx));
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 1;
    test_types(ctx);
    test_forms(ctx);
    test_faults(ctx);
    test_preamble(ctx);
    test_readers(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
