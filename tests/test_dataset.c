/* test_dataset.c — IDX and .npy datasets: values read back against the
 * bytes the test wrote (pixels as x / 255 computed in double), .npy headers
 * exactly as numpy 1.24's np.save writes them (copied from its output),
 * every fault the opener must reject with a message naming the file,
 * truncated and corrupt gzip, every allocation failing in turn, and the real
 * Fashion-MNIST files when present (first labels, class counts and pixel sums
 * worked out with Python's gzip module); datasets against a model's spec
 * (shape, label range by index in the file, labels vs targets), regression
 * targets read back, a gzip bomb stopped at its header's size, a FIFO
 * refused without waiting; float64 images and targets rounded to f32 on
 * read (against the test's own (float) casts), and a bad magic described in
 * the terms of the format the file's name claims. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "check.h"
#include "data/dataset.h"
#include "scratch.h"
#include "run/source.h"
#include "run/trainer.h"

/* .npy headers as numpy 1.24 writes them for 3 samples (np.save; version
 * (2,0) and (3,0) via np.lib.format.write_array). Each is 128 bytes. */
#define F4IMG                                                                                      \
    "\x93"                                                                                         \
    "NUMPY\x01"                                                                                    \
    "\x00"                                                                                         \
    "v\x00"                                                                                        \
    "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 1, 2, 3), }                           " \
    "                         \x0a"
#define U1IMG                                                                                      \
    "\x93"                                                                                         \
    "NUMPY\x01"                                                                                    \
    "\x00"                                                                                         \
    "v\x00"                                                                                        \
    "{'descr': '|u1', 'fortran_order': False, 'shape': (3, 4, 5), }                              " \
    "                         \x0a"
#define F4VEC                                                                                      \
    "\x93"                                                                                         \
    "NUMPY\x01"                                                                                    \
    "\x00"                                                                                         \
    "v\x00"                                                                                        \
    "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }                                 " \
    "                         \x0a"
#define I8LAB                                                                                      \
    "\x93"                                                                                         \
    "NUMPY\x01"                                                                                    \
    "\x00"                                                                                         \
    "v\x00"                                                                                        \
    "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }                                   " \
    "                         \x0a"
#define I4LAB_V2                                                                                   \
    "\x93"                                                                                         \
    "NUMPY\x02"                                                                                    \
    "\x00"                                                                                         \
    "t\x00"                                                                                        \
    "\x00"                                                                                         \
    "\x00"                                                                                         \
    "{'descr': '<i4', 'fortran_order': False, 'shape': (3,), }                                   " \
    "                       \x0a"
#define U1LAB_V3                                                                                   \
    "\x93"                                                                                         \
    "NUMPY\x03"                                                                                    \
    "\x00"                                                                                         \
    "t\x00"                                                                                        \
    "\x00"                                                                                         \
    "\x00"                                                                                         \
    "{'descr': '|u1', 'fortran_order': False, 'shape': (3,), }                                   " \
    "                       \x0a"
#define NPY_HDR 128

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

static void spit(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(buf, 1, n, f);
    fclose(f);
}

static void spit_gz(const char *path, const void *buf, size_t n) {
    gzFile g = gzopen(path, "wb");
    if (!g) return;
    gzwrite(g, buf, (unsigned)n);
    gzclose(g);
}

static size_t slurp(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static fr_mem_stats stats(fr_ctx *ctx) {
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    return s;
}

static void be32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)(v >> 24), b[1] = (unsigned char)(v >> 16),
    b[2] = (unsigned char)(v >> 8), b[3] = (unsigned char)v;
}

/* The synthetic IDX set: 5 images of 3x4, pixel j of image i is
 * (37 i + 11 j) mod 256; labels 3 0 7 1 2. */
enum { N = 5, H = 3, W = 4 };
static const unsigned char labels5[N] = {3, 0, 7, 1, 2};
static unsigned pixel(int i, int j) { return (unsigned)(37 * i + 11 * j) % 256; }

static size_t idx_images(unsigned char *b, int n, int h, int w) {
    be32(b, 0x803), be32(b + 4, (uint32_t)n), be32(b + 8, (uint32_t)h), be32(b + 12, (uint32_t)w);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < h * w; j++) b[16 + i * h * w + j] = (unsigned char)pixel(i, j);
    return 16 + (size_t)n * h * w;
}

static size_t idx_labels(unsigned char *b, const unsigned char *lab, int n) {
    be32(b, 0x801), be32(b + 4, (uint32_t)n);
    memcpy(b + 8, lab, (size_t)n);
    return 8 + (size_t)n;
}

static void expect_fail(fr_ctx *ctx, fr_dataset *ds, const char *what, const char *file,
                        const char *msg) {
    CHECK(ds == NULL, "%s: opened", what);
    if (ds) fr_dataset_close(ds);
    const char *e = fr_last_error(ctx);
    CHECK(strstr(e, file) && strstr(e, msg), "%s: message \"%s\" lacks \"%s\" or \"%s\"", what, e,
          file, msg);
}

static void check_synthetic(fr_ctx *ctx, fr_dataset *ds, const char *what) {
    CHECK(ds != NULL, "%s: %s", what, fr_last_error(ctx));
    if (!ds) return;
    int c, h, w;
    fr_dataset_sample_shape(ds, &c, &h, &w);
    CHECK(fr_dataset_len(ds) == N && c == 1 && h == H && w == W, "%s: shape", what);
    CHECK(fr_dataset_classes(ds) == 8, "%s: classes %d", what, fr_dataset_classes(ds));
    CHECK(stats(ctx).allocated[FR_MEM_DATA] == 0, "%s: data bytes held after open", what);
    int64_t idx[3] = {4, 0, 2};
    float x[3 * H * W];
    int32_t y[3];
    fr_status st = fr_dataset_read(ds, idx, 3, x, y, NULL);
    CHECK(st == FR_OK, "%s: %s", what, fr_last_error(ctx));
    int bad = 0;
    for (int s = 0; s < 3; s++) {
        for (int j = 0; j < H * W; j++)
            if (fabs(x[s * H * W + j] - pixel((int)idx[s], j) / 255.0) > 1e-7) bad++;
        if (y[s] != labels5[idx[s]]) bad++;
    }
    CHECK(bad == 0, "%s: %d wrong values", what, bad);
    int64_t out_of_range = N;
    CHECK(fr_dataset_read(ds, &out_of_range, 1, x, y, NULL) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "out of range"),
          "%s: index past the end", what);
    fr_dataset_close(ds);
}

static void test_idx(fr_ctx *ctx) {
    unsigned char img[16 + N * H * W], lab[8 + N];
    size_t ni = idx_images(img, N, H, W), nl = idx_labels(lab, labels5, N);
    char pi[512], pl[512], pig[512], plg[512];
    path_in(pi, sizeof pi, "img.idx");
    path_in(pl, sizeof pl, "lab.idx");
    path_in(pig, sizeof pig, "img.idx.gz");
    path_in(plg, sizeof plg, "lab.idx.gz");
    spit(pi, img, ni);
    spit(pl, lab, nl);
    spit_gz(pig, img, ni);
    spit_gz(plg, lab, nl);
    check_synthetic(ctx, fr_dataset_open(ctx, pi, pl), "raw");
    check_synthetic(ctx, fr_dataset_open(ctx, pig, plg), "gz");
    check_synthetic(ctx, fr_dataset_open(ctx, pi, plg), "raw images, gz labels");
    CHECK(fr_idx_check(ctx, "img", img, ni) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_idx_check(ctx, "lab", lab, nl) == FR_OK, "%s", fr_last_error(ctx));

    /* Two gzip members back to back, as `cat a.gz b.gz` makes, inflate to one file. */
    char pm[512];
    path_in(pm, sizeof pm, "multi.idx.gz");
    {
        gzFile g = gzopen(pm, "wb");
        gzwrite(g, img, 30);
        gzclose(g);
        unsigned char first[4096], second[4096];
        size_t n1 = slurp(pm, first, sizeof first);
        spit_gz(pm, img + 30, ni - 30);
        size_t n2 = slurp(pm, second, sizeof second);
        memcpy(first + n1, second, n2);
        spit(pm, first, n1 + n2);
    }
    check_synthetic(ctx, fr_dataset_open(ctx, pm, pl), "two gzip members");

    unsigned char bad[256];
    char pb[512];
    path_in(pb, sizeof pb, "bad.idx");
    /* Wrong magic. */
    memcpy(bad, img, ni);
    be32(bad, 0x802);
    spit(pb, bad, ni);
    expect_fail(ctx, fr_dataset_open(ctx, pb, pl), "wrong magic", "bad.idx",
                "byte 0: IDX magic 0x00000802 is not");
    CHECK(fr_idx_check(ctx, "m", bad, ni) == FR_ERR_FORMAT, "check: wrong magic");
    be32(bad, 0x0D03);
    CHECK(fr_idx_check(ctx, "m", bad, ni) == FR_ERR_FORMAT, "check: non-u8 IDX type");
    /* Truncated and overlong. */
    spit(pb, img, 50);
    fr_dataset *ds = fr_dataset_open(ctx, pb, pl);
    CHECK(!ds, "truncated opened");
    fr_dataset_close(ds);
    char want[700];
    snprintf(want, sizeof want, "%s: expected 76 bytes for 5x3x4 images, found 50", pb);
    CHECK(!strcmp(fr_last_error(ctx), want), "got \"%s\"", fr_last_error(ctx));
    CHECK(fr_idx_check(ctx, "t", img, 50) == FR_ERR_FORMAT &&
              !strcmp(fr_last_error(ctx), "t: expected 76 bytes for 5x3x4 images, found 50"),
          "%s", fr_last_error(ctx));
    memcpy(bad, img, ni);
    bad[ni] = 0;
    spit(pb, bad, ni + 1);
    expect_fail(ctx, fr_dataset_open(ctx, pb, pl), "one byte too many", "bad.idx",
                "expected 76 bytes for 5x3x4 images, found 77");
    CHECK(fr_idx_check(ctx, "l", lab, nl - 1) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "expected 13 bytes for 5 labels, found 12"),
          "%s", fr_last_error(ctx));
    CHECK(fr_idx_check(ctx, "s", img, 2) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "too short"),
          "2 bytes");
    CHECK(fr_idx_check(ctx, "s", img, 10) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "too short"),
          "10 bytes");
    CHECK(fr_idx_check(ctx, "s", img, 0) == FR_ERR_FORMAT, "0 bytes");
    /* Sizes that overflow 64 bits. */
    memcpy(bad, img, 16);
    be32(bad + 4, 0xFFFFFFFF), be32(bad + 8, 0xFFFFFFFF), be32(bad + 12, 0xFFFFFFFF);
    CHECK(fr_idx_check(ctx, "o", bad, 16) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "overflow"),
          "%s", fr_last_error(ctx));
    /* Labels and images swapped, counts that differ, no samples. */
    expect_fail(ctx, fr_dataset_open(ctx, pl, pi), "swapped", "lab.idx",
                "holds labels, not images");
    unsigned char lab4[8 + 4];
    idx_labels(lab4, labels5, 4);
    char p4[512];
    path_in(p4, sizeof p4, "lab4.idx");
    spit(p4, lab4, sizeof lab4);
    expect_fail(ctx, fr_dataset_open(ctx, pi, p4), "count mismatch", "lab4.idx",
                "4 labels for 5 images");
    unsigned char empty[16];
    idx_images(empty, 0, H, W);
    spit(pb, empty, 16);
    expect_fail(ctx, fr_dataset_open(ctx, pb, pl), "no samples", "bad.idx", "no samples");
    char pnone[512];
    path_in(pnone, sizeof pnone, "none.idx");
    expect_fail(ctx, fr_dataset_open(ctx, pnone, pl), "missing file", "none.idx", "cannot open");

    /* Gzip faults: truncated, a corrupt CRC, corrupt deflate data, trailing garbage. */
    unsigned char gz[4096];
    size_t ng = slurp(pig, gz, sizeof gz);
    char pg[512];
    path_in(pg, sizeof pg, "bad.idx.gz");
    spit(pg, gz, ng / 2);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "truncated gz", "bad.idx.gz",
                "truncated gzip stream");
    spit(pg, gz, ng - 1);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz missing its last byte", "bad.idx.gz",
                "truncated gzip stream");
    memcpy(bad, gz, ng);
    bad[ng - 8] ^= 0xFF; /* CRC-32 of the trailer */
    spit(pg, bad, ng);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz bad crc", "bad.idx.gz",
                "incorrect data check");
    memcpy(bad, gz, ng);
    bad[ng - 4] ^= 0x01; /* ISIZE of the trailer */
    spit(pg, bad, ng);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz bad length", "bad.idx.gz",
                "incorrect length check");
    memcpy(bad, gz, ng);
    bad[10] = 0xFF; /* first deflate block header: an invalid block type */
    spit(pg, bad, ng);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz corrupt data", "bad.idx.gz",
                "corrupt gzip stream");
    memcpy(bad, gz, ng);
    memcpy(bad + ng, "junk", 4);
    spit(pg, bad, ng + 4);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz trailing garbage", "bad.idx.gz",
                "trailing bytes after the gzip stream");
    spit(pg, "\x1f\x8b", 2);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz header only", "bad.idx.gz",
                "truncated gzip stream");
    /* A gzip file whose content is a truncated IDX. */
    spit_gz(pg, img, 40);
    expect_fail(ctx, fr_dataset_open(ctx, pg, pl), "gz of a short file", "bad.idx.gz",
                "expected 76 bytes for 5x3x4 images, found 40");
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* Writes header + data to name. */
static void npy_file(char *path, size_t cap, const char *name, const char *hdr, const void *data,
                     size_t n) {
    unsigned char buf[1024];
    memcpy(buf, hdr, NPY_HDR);
    memcpy(buf + NPY_HDR, data, n);
    path_in(path, cap, name);
    spit(path, buf, NPY_HDR + n);
}

static fr_status npy_check_str(fr_ctx *ctx, const char *hdr, const void *data, size_t n) {
    unsigned char buf[1024];
    memcpy(buf, hdr, NPY_HDR);
    memcpy(buf + NPY_HDR, data, n);
    return fr_npy_check(ctx, "a.npy", buf, NPY_HDR + n);
}

/* A copy of a header with `from` replaced by `to` (same length), in one of
 * 32 buffers used in turn so a table of patched headers can be built. */
static const char *patch(const char *hdr, const char *from, const char *to) {
    static char pool[32][NPY_HDR + 1];
    static int next;
    char *out = pool[next++ % 32];
    memcpy(out, hdr, NPY_HDR);
    out[NPY_HDR] = 0;
    char *p = memmem(out, NPY_HDR, from, strlen(from));
    if (p) memcpy(p, to, strlen(to));
    return out;
}

static void test_npy(fr_ctx *ctx) {
    float f4[3 * 6], vec[3 * 2];
    unsigned char u1[3 * 20];
    for (int k = 0; k < 18; k++) f4[k] = (float)k / 8 - 1;
    for (int k = 0; k < 6; k++) vec[k] = (float)k * 0.25f;
    for (int k = 0; k < 60; k++) u1[k] = (unsigned char)(k * 4);
    int64_t l8[3] = {1, 0, 2};
    int32_t l4[3] = {4, 0, 2};
    unsigned char l1[3] = {0, 9, 1};
    char pf4[512], pu1[512], pvec[512], p8[512], p4[512], p1[512];
    npy_file(pf4, sizeof pf4, "f4.npy", F4IMG, f4, sizeof f4);
    npy_file(pu1, sizeof pu1, "u1.npy", U1IMG, u1, sizeof u1);
    npy_file(pvec, sizeof pvec, "vec.npy", F4VEC, vec, sizeof vec);
    npy_file(p8, sizeof p8, "l8.npy", I8LAB, l8, sizeof l8);
    npy_file(p4, sizeof p4, "l4.npy", I4LAB_V2, l4, sizeof l4);
    npy_file(p1, sizeof p1, "l1.npy", U1LAB_V3, l1, sizeof l1);

    struct {
        const char *img, *lab;
        int c, h, w, classes;
        const int32_t want_y[3];
    } sets[] = {{pf4, p8, 1, 2, 3, 3, {1, 0, 2}},
                {pu1, p4, 1, 4, 5, 5, {4, 0, 2}},
                {pvec, p1, 1, 1, 2, 10, {0, 9, 1}}};
    for (int s = 0; s < 3; s++) {
        fr_dataset *ds = fr_dataset_open(ctx, sets[s].img, sets[s].lab);
        CHECK(ds != NULL, "npy set %d: %s", s, fr_last_error(ctx));
        if (!ds) continue;
        int c, h, w;
        fr_dataset_sample_shape(ds, &c, &h, &w);
        CHECK(fr_dataset_len(ds) == 3 && c == sets[s].c && h == sets[s].h && w == sets[s].w,
              "set %d shape %d %d %d", s, c, h, w);
        CHECK(fr_dataset_classes(ds) == sets[s].classes, "set %d classes %d", s,
              fr_dataset_classes(ds));
        int64_t idx[3] = {2, 0, 1};
        float x[60];
        int32_t y[3];
        CHECK(fr_dataset_read(ds, idx, 3, x, y, NULL) == FR_OK, "%s", fr_last_error(ctx));
        int d = c * h * w, bad = 0;
        for (int i = 0; i < 3; i++) {
            for (int j = 0; j < d; j++) {
                double want = s == 0   ? f4[idx[i] * d + j]
                              : s == 1 ? u1[idx[i] * d + j] / 255.0
                                       : vec[idx[i] * d + j];
                if (fabs(x[i * d + j] - want) > 1e-7) bad++;
            }
            if (y[i] != sets[s].want_y[idx[i]]) bad++;
        }
        CHECK(bad == 0, "set %d: %d wrong values", s, bad);
        fr_dataset_close(ds);
    }
    /* Mixed: IDX images with .npy labels of another count. */
    char pi[512];
    path_in(pi, sizeof pi, "img.idx");
    expect_fail(ctx, fr_dataset_open(ctx, pi, p8), "idx + npy count", "l8.npy",
                "3 labels for 5 images");

    /* Faults, in memory and through the opener. */
    CHECK(npy_check_str(ctx, F4IMG, f4, sizeof f4) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(npy_check_str(ctx, I4LAB_V2, l4, sizeof l4) == FR_OK, "%s", fr_last_error(ctx));
    struct {
        const char *what, *hdr;
        const void *data;
        size_t n;
        const char *msg;
    } faults[] = {
        {"fortran order", patch(F4IMG, "False", "True "), f4, sizeof f4,
         "a.npy: byte 44: fortran_order True is not supported"},
        {"big-endian", patch(F4IMG, "<f4", ">f4"), f4, sizeof f4,
         "big-endian dtype '>f4' is not supported"},
        {"unknown descr", patch(F4IMG, "<f4", "<f2"), f4, sizeof f4,
         "a.npy: byte 20: unsupported dtype '<f2' (supported: |u1, <f4, <f8, <i4, <i8)"},
        {"too little data", F4IMG, f4, sizeof f4 - 4,
         "expected 200 bytes for f32 of shape (3, 1, 2, 3), found 196"},
        {"too much data", I8LAB, l8, sizeof l8 + 0, NULL},
        {"not a tuple", patch(I8LAB, "(3,)", "(3) "), l8, sizeof l8, "'shape' (n) is not a tuple"},
        {"negative dim", patch(I8LAB, "(3,)", "(-3)"), l8, sizeof l8, "negative dimension"},
        {"missing key", patch(I8LAB, "'descr': '<i8', ", "                "), l8, sizeof l8,
         "header dict lacks 'descr'"},
        {"unknown key", patch(I8LAB, "'descr'", "'dtype'"), l8, sizeof l8, "unknown key 'dtype'"},
        {"bad magic", patch(I8LAB, "NUMPY", "NUMPX"), l8, sizeof l8, "not a .npy file"},
        {"version 4", patch(I8LAB, "NUMPY\x01", "NUMPY\x04"), l8, sizeof l8,
         "unsupported .npy version 4.0"},
        {"header past end", patch(I8LAB, "v\x00{", "\xff\x7f{"), l8, sizeof l8,
         "runs past the end"},
        {"garbage after dict", patch(I8LAB, "}    ", "} x  "), l8, sizeof l8,
         "unexpected characters after the header dict"},
        {"label 300", I4LAB_V2, (int32_t[]){1, 300, 2}, 12,
         "label 300 at index 1 is out of range [0, 256)"},
        {"label -1", I8LAB, (int64_t[]){1, 2, -1}, 24,
         "label -1 at index 2 is out of range [0, 256)"},
        {"2-d integers", patch(F4VEC, "<f4", "<i4"), vec, sizeof vec,
         "integer arrays are labels and need 1 dimension"},
        {"NaN target", patch(I8LAB, "<i8", "<f4"), (float[]){1, NAN, 2}, 12,
         "target nan at index 1 (column 0) is not finite"},
        {"3-d integers", patch(F4IMG, "<f4", "<i4"), f4, 72,
         "integer arrays are labels and need 1 dimension, not 4"},
        {"structured", patch(I8LAB, "'<i8'", "[1,2]"), l8, sizeof l8,
         "'descr' is not a simple dtype string"},
    };
    for (size_t k = 0; k < sizeof faults / sizeof faults[0]; k++) {
        unsigned char buf[1024];
        memcpy(buf, faults[k].hdr, NPY_HDR);
        memcpy(buf + NPY_HDR, faults[k].data, faults[k].n);
        size_t n = NPY_HDR + faults[k].n;
        if (!faults[k].msg) { /* one byte too many */
            buf[n++] = 0;
            faults[k].msg = "expected 152 bytes for i64 of shape (3), found 153";
        }
        fr_status st = fr_npy_check(ctx, "a.npy", buf, n);
        CHECK(st == FR_ERR_FORMAT, "%s: accepted", faults[k].what);
        CHECK(strstr(fr_last_error(ctx), faults[k].msg) &&
                  !strncmp(fr_last_error(ctx), "a.npy: ", 7),
              "%s: message \"%s\" lacks \"%s\"", faults[k].what, fr_last_error(ctx), faults[k].msg);
    }
    /* Through the opener: labels out of range, float labels, fortran images. */
    char pb[512];
    npy_file(pb, sizeof pb, "bad.npy", I4LAB_V2, (int32_t[]){1, 300, 2}, 12);
    expect_fail(ctx, fr_dataset_open(ctx, pf4, pb), "label 300", "bad.npy",
                "label 300 at index 1 is out of range [0, 256)");
    npy_file(pb, sizeof pb, "bad.npy", U1IMG, u1, sizeof u1);
    expect_fail(ctx, fr_dataset_open(ctx, pf4, pb), "images as labels", "bad.npy",
                "labels must be integers of shape (n) or f32 targets of shape (n) or (n, outputs), "
                "not u8 with 3");
    npy_file(pb, sizeof pb, "bad.npy", patch(F4IMG, "False", "True "), f4, sizeof f4);
    expect_fail(ctx, fr_dataset_open(ctx, pb, p8), "fortran images", "bad.npy",
                "fortran_order True");
    npy_file(pb, sizeof pb, "bad.npy", patch(F4IMG, "<f4", "<i4"), f4, sizeof f4);
    expect_fail(ctx, fr_dataset_open(ctx, pb, p8), "integer images", "bad.npy",
                "images must be u8, f32 or f64");
    npy_file(pb, sizeof pb, "bad.npy", F4IMG, f4, 40);
    expect_fail(ctx, fr_dataset_open(ctx, pb, p8), "short npy", "bad.npy",
                "expected 200 bytes for f32 of shape (3, 1, 2, 3), found 168");
    /* A gzip'd .npy works like a gzip'd IDX. */
    unsigned char raw[1024];
    size_t nr = slurp(pu1, raw, sizeof raw);
    char pz[512];
    path_in(pz, sizeof pz, "u1.npy.gz");
    spit_gz(pz, raw, nr);
    fr_dataset *ds = fr_dataset_open(ctx, pz, p4);
    CHECK(ds && fr_dataset_len(ds) == 3, "gz npy: %s", fr_last_error(ctx));
    fr_dataset_close(ds);
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

static void expect_unfit(fr_ctx *ctx, fr_status st, const char *what, const char *file,
                         const char *msg);

/* A .npy of any dtype and shape, with a header as numpy writes it (the
 * dict padded with spaces to 128 bytes, ending in a newline). */
static void npy_any(char *path, size_t cap, const char *name, const char *descr, const char *shape,
                    const void *data, size_t n) {
    char hdr[NPY_HDR + 1];
    int len = snprintf(hdr, sizeof hdr,
                       "\x93NUMPY\x01%c%c%c{'descr': '%s', 'fortran_order': False, 'shape': %s, }",
                       0, 0, 0, descr, shape); /* version 1.0, then the length set below */
    memset(hdr + len, ' ', NPY_HDR - (size_t)len);
    hdr[8] = (char)(NPY_HDR - 10), hdr[9] = 0; /* the dict's length, little-endian */
    hdr[NPY_HDR - 1] = '\n';
    path_in(path, cap, name);
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(hdr, 1, NPY_HDR, f);
    fwrite(data, 1, n, f);
    fclose(f);
}

/* stderr into a file between capture_begin and capture_end, which returns
 * how many lines printed in between hold `text`. */
static int capture_saved = -1;
static FILE *capture_file;
static void capture_begin(void) {
    char pe[512];
    path_in(pe, sizeof pe, "stderr.txt");
    fflush(stderr);
    capture_saved = dup(2);
    capture_file = fopen(pe, "w+");
    if (capture_file) dup2(fileno(capture_file), 2);
}
static int capture_end(const char *text) {
    char line[1024];
    int lines = 0;
    fflush(stderr);
    dup2(capture_saved, 2);
    close(capture_saved);
    if (!capture_file) return -1;
    rewind(capture_file);
    while (fgets(line, sizeof line, capture_file)) lines += strstr(line, text) != NULL;
    fclose(capture_file);
    return lines;
}

/* fr_dataset_open with stderr captured: *lines holding `text`. */
static fr_dataset *open_counting(fr_ctx *ctx, const char *img, const char *lab, const char *text,
                                 int *lines) {
    capture_begin();
    fr_dataset *ds = fr_dataset_open(ctx, img, lab);
    *lines = capture_end(text);
    return ds;
}

/* The run's splits (fr_source_open): training files without test files and
 * without a directory the user named (data NULL, or the CLI's default
 * directory: data_default) give no test split, said once on stderr, never
 * the directory's t10k (3 samples here, the training files 5); a directory
 * the user named, or test files, give their split; eval (train = 0) reads
 * the directory's. */
static void test_source_split(fr_ctx *ctx) {
    char dir[512], p[600], pi[512], pl[512];
    unsigned char b[16 + N * H * W];
    path_in(dir, sizeof dir, "split");
    mkdir(dir, 0700);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
    spit(p, b, idx_images(b, 3, H, W));
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
    spit(p, b, idx_labels(b, labels5, 3));
    path_in(pi, sizeof pi, "img.idx");
    path_in(pl, sizeof pl, "lab.idx");
    fr_model *m = fr_model_new(ctx, H * W, 1, 1);
    if (!m) return;
    fr_model_linear(m, 8, 1);
    const char *note = "no test split given: no evaluation; give --test-images/--test-labels";
    struct {
        const char *what, *data, *test_images;
        int data_default, train;
        int64_t n_test; /* -1: no test split */
    } cases[] = {
        {"default dir, train files only", dir, NULL, 1, 1, -1},
        {"no dir, train files only", NULL, NULL, 0, 1, -1},
        {"a dir the user named", dir, NULL, 0, 1, 3},
        {"default dir, test files given", dir, pi, 1, 1, N},
        {"eval from the default dir", dir, NULL, 1, 0, 3},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        fr_train_cfg cfg = {0};
        cfg.data = cases[k].data;
        cfg.data_default = cases[k].data_default;
        cfg.train_images = pi, cfg.train_labels = pl;
        cfg.test_images = cases[k].test_images;
        cfg.test_labels = cases[k].test_images ? pl : NULL;
        fr_source src;
        capture_begin();
        fr_status st = fr_source_open(ctx, &cfg, m, cases[k].train, &src);
        int notes = capture_end(note);
        CHECK(st == FR_OK, "%s: %s", cases[k].what, fr_last_error(ctx));
        if (st) {
            fr_source_close(&src);
            continue;
        }
        int none = cases[k].n_test < 0;
        CHECK(fr_source_has_test(&src) == !none && (src.test == NULL) == none, "%s: test split %s",
              cases[k].what, src.test ? "opened" : "absent");
        CHECK(notes == none, "%s: %d notes", cases[k].what, notes);
        if (src.test)
            CHECK(fr_dataset_len(src.test) == cases[k].n_test, "%s: %lld test samples",
                  cases[k].what, (long long)fr_dataset_len(src.test));
        if (none) {
            fr_budget_data bd;
            fr_source_budget(&src, &cfg, &bd);
            CHECK(bd.n_train == N && bd.n_test == 0, "%s: budget counts %lld test samples",
                  cases[k].what, (long long)bd.n_test);
            fr_batches bt;
            CHECK(fr_batches_open(&src, 0, 4, 0, 1, 0, &bt) == FR_ERR_ARG &&
                      strstr(fr_last_error(ctx), "no test split to evaluate on"),
                  "%s: test batches: %s", cases[k].what, fr_last_error(ctx));
        }
        fr_source_close(&src);
    }
    fr_model_free(m);
    snprintf(p, sizeof p, "%s/t10k-images-idx3-ubyte", dir);
    unlink(p);
    snprintf(p, sizeof p, "%s/t10k-labels-idx1-ubyte", dir);
    unlink(p);
    rmdir(dir);
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* float64 .npy files (numpy's default float): images and targets rounded
 * to f32 as they are read, each value equal to the C cast (float)v of the
 * double the test wrote, with one note a file on stderr and no data bytes
 * held; a sample of 900 values (more than one conversion buffer); float64
 * labels are targets, refused for cross-entropy with the way to save them
 * as integers; a target finite in f64 but not in f32 refused. */
static void test_f64(fr_ctx *ctx) {
    enum { NS = 3, D = 900 }; /* 3 samples of 1x30x30 */
    static double img[NS * D];
    double tg[NS * 2], lab[NS] = {1, 0, 2};
    for (int k = 0; k < NS * D; k++) img[k] = k / 3.0 - 0.7 + 1e-9 * k;
    for (int k = 0; k < NS * 2; k++) tg[k] = 1.0 / (k + 3) - 0.1;
    char pimg[512], ptg[512], plab[512];
    npy_any(pimg, sizeof pimg, "f8img.npy", "<f8", "(3, 30, 30)", img, sizeof img);
    npy_any(ptg, sizeof ptg, "f8tg.npy", "<f8", "(3, 2)", tg, sizeof tg);
    npy_any(plab, sizeof plab, "f8lab.npy", "<f8", "(3,)", lab, sizeof lab);
    int notes = 0, img_notes = 0;
    fr_dataset *ds = open_counting(ctx, pimg, ptg, "float64 converted to float32 on load", &notes);
    CHECK(ds != NULL, "f64 set: %s", fr_last_error(ctx));
    CHECK(notes == 2, "%d notes for two float64 files", notes);
    fr_dataset_close(ds);
    ds = open_counting(ctx, pimg, ptg, "f8img.npy: float64 converted to float32 on load",
                       &img_notes);
    CHECK(img_notes == 1, "%d notes naming f8img.npy", img_notes);
    if (!ds) return;
    int c, h, w;
    fr_dataset_sample_shape(ds, &c, &h, &w);
    CHECK(fr_dataset_len(ds) == NS && c == 1 && h == 30 && w == 30 && fr_dataset_outputs(ds) == 2 &&
              fr_dataset_dtype(ds) == FR_F32,
          "f64 set: %d %d %d, outputs %d", c, h, w, fr_dataset_outputs(ds));
    CHECK(stats(ctx).allocated[FR_MEM_DATA] == 0, "f64: data bytes held after open");
    CHECK(fr_dataset_check(ctx, ds, &(fr_data_spec){1, 30, 30, 0, 2}) == FR_OK, "%s",
          fr_last_error(ctx));
    static float x[2 * D];
    float t[2 * 2];
    int64_t idx[2] = {2, 0};
    CHECK(fr_dataset_read(ds, idx, 2, x, NULL, t) == FR_OK, "%s", fr_last_error(ctx));
    int bad = 0;
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < D; j++) bad += x[i * D + j] != (float)img[idx[i] * D + j];
        for (int j = 0; j < 2; j++) bad += t[i * 2 + j] != (float)tg[idx[i] * 2 + j];
    }
    CHECK(bad == 0, "f64: %d values differ from (float)v", bad);
    CHECK(x[D + 1] == (float)(1 / 3.0 - 0.7 + 1e-9) && x[D + 1] != 0, "f64: sample 0 value 1 %g",
          (double)x[D + 1]);
    CHECK(stats(ctx).allocated[FR_MEM_DATA] == 0, "f64: data bytes held after reading");
    fr_dataset_close(ds);

    /* float64 labels are float targets: refused for a cross-entropy model. */
    ds = fr_dataset_open(ctx, pimg, plab);
    CHECK(ds && fr_dataset_outputs(ds) == 1, "f64 (n,): %s", fr_last_error(ctx));
    if (ds) {
        expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, 30, 30, 3, 0}),
                     "f64 labels for ce", "f8lab.npy",
                     "needs integer class labels: save them with labels.astype(np.int64)");
        fr_dataset_close(ds);
    }
    /* Finite in f64, infinite in f32; NaN. */
    npy_any(plab, sizeof plab, "f8big.npy", "<f8", "(3,)", (double[]){1, 1e300, 2}, 24);
    expect_fail(ctx, fr_dataset_open(ctx, pimg, plab), "f64 overflow", "f8big.npy",
                "f64 target 1e+300 at index 1 (column 0) overflows float32");
    npy_any(plab, sizeof plab, "f8nan.npy", "<f8", "(3,)", (double[]){1, 2, NAN}, 24);
    expect_fail(ctx, fr_dataset_open(ctx, pimg, plab), "f64 NaN", "f8nan.npy",
                "target nan at index 2 (column 0) is not finite");
    /* In memory: a whole f64 array, then one cut short (128 + 18 * 8 = 272 bytes). */
    unsigned char buf[NPY_HDR + 18 * 8];
    memcpy(buf, patch(F4IMG, "<f4", "<f8"), NPY_HDR);
    memcpy(buf + NPY_HDR, img, 18 * 8);
    CHECK(fr_npy_check(ctx, "m.npy", buf, sizeof buf) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_npy_check(ctx, "m.npy", buf, NPY_HDR + 72) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx),
                     "expected 272 bytes for f64 of shape (3, 1, 2, 3), found 200"),
          "f64 short: %s", fr_last_error(ctx));
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* A file whose magic is neither format is described as the format its name
 * claims: a *.npy (or *.npy.gz) as .npy, with its first bytes (the zip
 * magic 50 4b 03 04 of an .npz renamed, say), not as a bad IDX magic; an IDX
 * name as IDX. A valid file of the other format opens whatever its name. */
static void test_claimed_format(fr_ctx *ctx) {
    static const unsigned char zip[32] = {0x50, 0x4b, 0x03, 0x04, 0x14, 0x00, 0x00, 0x00, 0x08};
    char pz[512], pzg[512], pt[512], pe[512], pi[512], pl[512], pidx[512], pnpy[512];
    path_in(pz, sizeof pz, "npz-renamed.npy");
    spit(pz, zip, sizeof zip);
    path_in(pzg, sizeof pzg, "npz-renamed.npy.gz");
    spit_gz(pzg, zip, sizeof zip);
    path_in(pt, sizeof pt, "three.npy");
    spit(pt, "abc", 3);
    path_in(pe, sizeof pe, "empty.npy");
    spit(pe, "", 0);
    path_in(pi, sizeof pi, "img.idx");
    path_in(pl, sizeof pl, "lab.idx");
    const char *npy_msg = "byte 0: not a .npy file: its first bytes are 50 4b 03 04 14 00, not the "
                          "magic 93 4e 55 4d 50 59";
    expect_fail(ctx, fr_dataset_open(ctx, pz, pl), "zip named .npy", "npz-renamed.npy", npy_msg);
    CHECK(!strstr(fr_last_error(ctx), "IDX"), "zip named .npy: %s", fr_last_error(ctx));
    expect_fail(ctx, fr_dataset_open(ctx, pi, pz), "zip named .npy as labels", "npz-renamed.npy",
                npy_msg);
    expect_fail(ctx, fr_dataset_open(ctx, pzg, pl), "zip named .npy.gz", "npz-renamed.npy.gz",
                npy_msg);
    expect_fail(ctx, fr_dataset_open(ctx, pt, pl), "3-byte .npy", "three.npy",
                "its first bytes are 61 62 63 (the file ends there)");
    expect_fail(ctx, fr_dataset_open(ctx, pe, pl), "empty .npy", "empty.npy",
                "empty file: not a .npy file");
    /* An IDX name with the zip bytes: an IDX message. */
    path_in(pidx, sizeof pidx, "bad-images-idx3-ubyte");
    spit(pidx, zip, sizeof zip);
    expect_fail(ctx, fr_dataset_open(ctx, pidx, pl), "zip named IDX", "bad-images-idx3-ubyte",
                "byte 0: IDX magic 0x504b0304 is not 0x00000803");
    /* Valid IDX under a .npy name, and valid .npy under an IDX name: opened. */
    unsigned char raw[1024];
    size_t n = slurp(pi, raw, sizeof raw);
    path_in(pnpy, sizeof pnpy, "idx-inside.npy");
    spit(pnpy, raw, n);
    fr_dataset *ds = fr_dataset_open(ctx, pnpy, pl);
    CHECK(ds && fr_dataset_len(ds) == N, "IDX named .npy: %s", fr_last_error(ctx));
    fr_dataset_close(ds);
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* A spec's refusal: status, and the message naming `file` and holding msg. */
static void expect_unfit(fr_ctx *ctx, fr_status st, const char *what, const char *file,
                         const char *msg) {
    CHECK(st == FR_ERR_SHAPE, "%s: status %d (%s)", what, st, fr_last_error(ctx));
    const char *e = fr_last_error(ctx);
    CHECK(strstr(e, file) && strstr(e, msg), "%s: message \"%s\" lacks \"%s\" or \"%s\"", what, e,
          file, msg);
}

/* Datasets against what a model asks (fr_dataset_check and the in-memory
 * checkers): shapes, the first label past the model's classes by its index
 * in the file (labels5 = 3 0 7 1 2: with 5 classes label 7 at index 2),
 * class labels for an MSE model and targets for a cross-entropy one, the
 * targets' width; and a regression set's targets read back. */
static void test_model_fit(fr_ctx *ctx) {
    char pi[512], pl[512];
    path_in(pi, sizeof pi, "img.idx");
    path_in(pl, sizeof pl, "lab.idx");
    fr_dataset *ds = fr_dataset_open(ctx, pi, pl);
    CHECK(ds != NULL, "%s", fr_last_error(ctx));
    if (!ds) return;
    CHECK(fr_dataset_outputs(ds) == 0 && fr_dataset_dtype(ds) == FR_U8, "class set");
    CHECK(!strcmp(fr_dataset_images_path(ds), pi) && !strcmp(fr_dataset_labels_path(ds), pl),
          "paths");
    fr_data_spec ok = {1, H, W, 8, 0}, flat = {H * W, 1, 1, 10, 0};
    CHECK(fr_dataset_check(ctx, ds, &ok) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_dataset_check(ctx, ds, &flat) == FR_OK, "flat: %s", fr_last_error(ctx));
    expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, H, W, 5, 0}),
                 "label past classes", "lab.idx",
                 "lab.idx: label 7 at index 2 is out of range for a model with 5 classes");
    expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, W, H, 10, 0}), "transposed",
                 "img.idx", "img.idx: samples are 1x3x4 but the model takes 1x4x3");
    expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, 28, 28, 10, 0}), "small images",
                 "img.idx", "samples are 1x3x4 but the model takes 1x28x28");
    expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){H * W + 1, 1, 1, 10, 0}),
                 "flat count", "img.idx", "samples of 1x3x4 hold 12 values but the model takes 13");
    expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, H, W, 0, 1}), "labels for mse",
                 "lab.idx", "holds class labels but the model's loss (mse) needs float targets");
    fr_dataset_close(ds);

    /* The same checks on memory, as the fuzzers run them. */
    unsigned char img[16 + N * H * W], lab[8 + N];
    size_t ni = idx_images(img, N, H, W), nl = idx_labels(lab, labels5, N);
    CHECK(fr_idx_check_for(ctx, "i", img, ni, &ok, FR_ROLE_IMAGES) == FR_OK, "%s",
          fr_last_error(ctx));
    CHECK(fr_idx_check_for(ctx, "l", lab, nl, &ok, FR_ROLE_LABELS) == FR_OK, "%s",
          fr_last_error(ctx));
    expect_unfit(
        ctx, fr_idx_check_for(ctx, "l", lab, nl, &(fr_data_spec){1, H, W, 5, 0}, FR_ROLE_LABELS),
        "memory: label past classes",
        "l: ", "label 7 at index 2 is out of range for a model with 5 classes");
    expect_unfit(
        ctx, fr_idx_check_for(ctx, "i", img, ni, &(fr_data_spec){1, 28, 28, 10, 0}, FR_ROLE_IMAGES),
        "memory: small images", "i: ", "samples are 1x3x4 but the model takes 1x28x28");
    /* No samples of 4294967295x4294965244: the values a sample overflow 64
     * bits (found by fuzz_idx; undefined behaviour before). */
    static const unsigned char huge[16] = {0,    0,    8,    3,    0,    0,    0,    0,
                                           0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xf7, 0xfc};
    expect_unfit(
        ctx,
        fr_idx_check_for(ctx, "h", huge, 16, &(fr_data_spec){784, 1, 1, 10, 0}, FR_ROLE_IMAGES),
        "memory: huge empty sample", "h: ", "but the model takes 784");
    CHECK(fr_idx_check_for(ctx, "i", img, ni, &ok, FR_ROLE_LABELS) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "holds images, not labels"),
          "memory: images as labels: %s", fr_last_error(ctx));

    /* A regression set: f32 images (3, 1, 2, 3) with targets (3, 2), then (3,). */
    float f4[3 * 6], vec[3 * 2] = {0.5f, -1.0f, 2.25f, 3.0f, -0.125f, 7.0f},
                             one[3] = {1.5f, -2.0f, 0.25f};
    for (int k = 0; k < 18; k++) f4[k] = (float)k / 8 - 1;
    char pf4[512], pt2[512], pt1[512];
    npy_file(pf4, sizeof pf4, "rf4.npy", F4IMG, f4, sizeof f4);
    npy_file(pt2, sizeof pt2, "t2.npy", F4VEC, vec, sizeof vec);
    npy_file(pt1, sizeof pt1, "t1.npy", patch(I8LAB, "<i8", "<f4"), one, sizeof one);
    ds = fr_dataset_open(ctx, pf4, pt2);
    CHECK(ds != NULL, "regression set: %s", fr_last_error(ctx));
    if (!ds) return;
    CHECK(fr_dataset_outputs(ds) == 2 && fr_dataset_dtype(ds) == FR_F32, "outputs %d",
          fr_dataset_outputs(ds));
    int64_t idx[2] = {2, 0};
    float x[2 * 6], t[2 * 2];
    int32_t y[2] = {-7, -7};
    CHECK(fr_dataset_read(ds, idx, 2, x, y, t) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(t[0] == -0.125f && t[1] == 7.0f && t[2] == 0.5f && t[3] == -1.0f && x[0] == f4[12] &&
              y[0] == -7,
          "targets %g %g %g %g", t[0], t[1], t[2], t[3]);
    CHECK(fr_dataset_check(ctx, ds, &(fr_data_spec){1, 2, 3, 0, 2}) == FR_OK, "%s",
          fr_last_error(ctx));
    expect_unfit(ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, 2, 3, 0, 3}), "width", "t2.npy",
                 "targets have 2 values a sample but the model has 3 outputs");
    expect_unfit(
        ctx, fr_dataset_check(ctx, ds, &(fr_data_spec){1, 2, 3, 10, 0}), "targets for ce", "t2.npy",
        "holds float targets but the model's loss (cross_entropy) needs integer class labels");
    fr_dataset_close(ds);
    ds = fr_dataset_open(ctx, pf4, pt1);
    CHECK(ds && fr_dataset_outputs(ds) == 1, "(n,) targets: %s", fr_last_error(ctx));
    if (ds) {
        CHECK(fr_dataset_read(ds, idx, 2, NULL, NULL, t) == FR_OK && t[0] == 0.25f && t[1] == 1.5f,
              "(n,) values");
        fr_dataset_close(ds);
    }
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* A gzip whose IDX (or .npy) header implies 10x28x28 = 7856 (+ header)
 * bytes, followed by 64 MiB of zeros: refused at the first chunk past the
 * implied size, so the compressed bytes read stay in the hundreds, not the
 * whole ~65 KB stream (inflating it whole would also write 64 MiB). */
static void test_gzip_bomb(fr_ctx *ctx) {
    static const char *hdr_npy = "\x93"
                                 "NUMPY\x01"
                                 "\x00"
                                 "v\x00"
                                 "{'descr': '|u1', 'fortran_order': False, 'shape': (10, 28, 28), "
                                 "}                                                    \x0a";
    for (int kind = 0; kind < 2; kind++) {
        unsigned char head[NPY_HDR];
        size_t nh;
        if (kind == 0) {
            be32(head, 0x803), be32(head + 4, 10), be32(head + 8, 28), be32(head + 12, 28);
            nh = 16;
        } else {
            memcpy(head, hdr_npy, NPY_HDR);
            nh = NPY_HDR;
        }
        size_t zeros = (size_t)64 << 20, cap = (size_t)1 << 20, len = 0;
        unsigned char *gz = malloc(cap), *chunk = calloc(1, 1 << 20);
        z_stream zs;
        memset(&zs, 0, sizeof zs);
        CHECK(gz && chunk &&
                  deflateInit2(&zs, 9, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY) == Z_OK,
              "zlib");
        for (size_t fed = 0; fed <= zeros; fed += 1 << 20) {
            zs.next_in = fed == 0 ? head : chunk;
            zs.avail_in = fed == 0 ? (uInt)nh : 1u << 20;
            int last = fed + (1 << 20) > zeros;
            do {
                zs.next_out = gz + len;
                zs.avail_out = (uInt)(cap - len);
                deflate(&zs, last ? Z_FINISH : Z_NO_FLUSH);
                len = cap - zs.avail_out;
            } while (zs.avail_in || (last && zs.avail_out == 0));
        }
        deflateEnd(&zs);
        CHECK(len > 60000 && len < cap, "the bomb is %zu compressed bytes", len);
        char pb[512], pl[512];
        path_in(pb, sizeof pb, kind ? "bomb.npy.gz" : "bomb.idx.gz");
        path_in(pl, sizeof pl, "lab.idx");
        spit(pb, gz, len);
        free(gz);
        free(chunk);
        fr_dataset *ds = fr_dataset_open(ctx, pb, pl);
        CHECK(!ds, "bomb %d opened", kind);
        fr_dataset_close(ds);
        const char *want = kind ? "inflates past the 7968 bytes its .npy header implies"
                                : "inflates past the 7856 bytes its IDX header implies";
        const char *e = fr_last_error(ctx), *at = strstr(e, "compressed byte ");
        CHECK(strstr(e, pb) && strstr(e, want), "bomb %d: \"%s\"", kind, e);
        CHECK(at && atol(at + 16) < 4096, "bomb %d read too far: \"%s\"", kind, e);
    }
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* A FIFO or a directory as a data file is refused at once, not waited on. */
static void test_not_regular(fr_ctx *ctx) {
    char pf[512], pl[512];
    path_in(pf, sizeof pf, "fifo");
    path_in(pl, sizeof pl, "lab.idx");
    CHECK(mkfifo(pf, 0600) == 0, "mkfifo");
    expect_fail(ctx, fr_dataset_open(ctx, pf, pl), "fifo images", "fifo", "is a FIFO");
    char pi[512];
    path_in(pi, sizeof pi, "img.idx");
    expect_fail(ctx, fr_dataset_open(ctx, pi, pf), "fifo labels", "fifo", "is a FIFO");
    expect_fail(ctx, fr_dataset_open(ctx, tmpdir, pl), "directory images", tmpdir,
                "is a directory");
    unlink(pf);
}

/* fr_data_check: the model's input and loss turned into a spec (flat input
 * of 12, image input (1, 3, 4), MSE outputs), so a dataset that fits one
 * model is refused by another with the file named; and the step's own label
 * check, which reports a batch position, not a micro-batch's: with batches
 * of 8 in micro-batches of 4, label 7 at position 6 is position 2 of the
 * second micro-batch. */
static void test_data_check(fr_ctx *ctx) {
    char pi[512], pl[512];
    path_in(pi, sizeof pi, "img.idx");
    path_in(pl, sizeof pl, "lab.idx");
    fr_dataset *ds = fr_dataset_open(ctx, pi, pl);
    CHECK(ds != NULL, "%s", fr_last_error(ctx));
    fr_model *flat = fr_model_new(ctx, H * W, 1, 1), *img = fr_model_new(ctx, 1, H, W),
             *few = fr_model_new(ctx, 1, H, W), *mse = fr_model_new(ctx, H * W, 1, 1);
    CHECK(flat && img && few && mse, "models");
    if (!ds || !flat || !img || !few || !mse) return;
    fr_model_linear(flat, 8, 1);
    fr_model_flatten(img), fr_model_linear(img, 8, 1);
    fr_model_flatten(few), fr_model_linear(few, 6, 1);
    fr_model_linear(mse, 2, 1), fr_model_set_loss(mse, FR_LOSS_MSE);
    CHECK(fr_data_check(ctx, flat, ds) == FR_OK, "flat: %s", fr_last_error(ctx));
    CHECK(fr_data_check(ctx, img, ds) == FR_OK, "image: %s", fr_last_error(ctx));
    CHECK(fr_data_check(ctx, few, ds) == FR_ERR_SHAPE &&
              strstr(fr_last_error(ctx),
                     "lab.idx: label 7 at index 2 is out of range for a model with 6 classes"),
          "6 classes: %s", fr_last_error(ctx));
    CHECK(fr_data_check(ctx, mse, ds) == FR_ERR_SHAPE &&
              strstr(fr_last_error(ctx), "lab.idx: holds class labels"),
          "mse: %s", fr_last_error(ctx));
    fr_dataset_close(ds);
    fr_model_free(img), fr_model_free(few), fr_model_free(mse);

    fr_model_init(flat, 1);
    fr_step *s = fr_step_compile(flat, &(fr_step_opts){.batch = 8,
                                                       .training = 1,
                                                       .optim = fr_optim_defaults(FR_OPTIM_SGD),
                                                       .micro_batch = 4});
    CHECK(s != NULL, "%s", fr_last_error(ctx));
    if (s) {
        float x[8 * H * W] = {0}, loss;
        int32_t y[8] = {0, 1, 2, 3, 4, 5, 8, 0};
        fr_batch b = {8, x, y, NULL, NULL};
        fr_status st = fr_step_run(s, &b, &loss, NULL);
        CHECK(st == FR_ERR_ARG && strstr(fr_last_error(ctx),
                                         "label 8 at position 6 of the batch is outside [0, 8)"),
              "step: %d %s", st, fr_last_error(ctx));
        y[6] = 7;
        CHECK(fr_step_run(s, &b, &loss, NULL) == FR_OK, "%s", fr_last_error(ctx));
        fr_step_free(s);
    }
    fr_model_free(flat);
    CHECK(stats(ctx).allocated_total == 0, "leak: %zu", stats(ctx).allocated_total);
}

/* The dataset directory layout, and a missing split. */
static void test_open_dir(fr_ctx *ctx) {
    unsigned char img[16 + N * H * W], lab[8 + N];
    size_t ni = idx_images(img, N, H, W), nl = idx_labels(lab, labels5, N);
    char p[512];
    path_in(p, sizeof p, "train-images-idx3-ubyte.gz");
    spit_gz(p, img, ni);
    path_in(p, sizeof p, "train-labels-idx1-ubyte");
    spit(p, lab, nl);
    check_synthetic(ctx, fr_dataset_open_dir(ctx, tmpdir, "train"), "open_dir");
    fr_dataset *ds = fr_dataset_open_dir(ctx, tmpdir, "t10k");
    expect_fail(ctx, ds, "missing split", "t10k-images-idx3-ubyte[.gz]", "t10k-images.npy");
    /* The .npy names: images with labels, images with targets, and both. */
    float f4[3 * 6], vec[3 * 2] = {1, 2, 3, 4, 5, 6};
    for (int k = 0; k < 18; k++) f4[k] = (float)k;
    char q[512];
    npy_file(q, sizeof q, "reg-images.npy", F4IMG, f4, sizeof f4);
    expect_fail(
        ctx, fr_dataset_open_dir(ctx, tmpdir, "reg"), "no labels", "reg-images.npy",
        "looked for reg-labels-idx1-ubyte[.gz], reg-labels.npy (classes) and reg-targets.npy");
    npy_file(q, sizeof q, "reg-targets.npy", F4VEC, vec, sizeof vec);
    ds = fr_dataset_open_dir(ctx, tmpdir, "reg");
    CHECK(ds && fr_dataset_outputs(ds) == 2 &&
              strstr(fr_dataset_labels_path(ds), "reg-targets.npy"),
          "npy dir: %s", fr_last_error(ctx));
    fr_dataset_close(ds);
    npy_file(q, sizeof q, "reg-labels.npy", I8LAB, (int64_t[]){0, 1, 2}, 24);
    expect_fail(ctx, fr_dataset_open_dir(ctx, tmpdir, "reg"), "two label files", "reg-targets.npy",
                "keep one");
}

static void test_fashion(fr_ctx *ctx) {
    const char *dir = getenv("FR_DATA_DIR");
    if (!dir || !*dir) dir = "/usr/share/datasets/fashion-mnist";
    struct stat sb;
    if (stat(dir, &sb) != 0) {
        printf("fashion-mnist: %s not found, skipped\n", dir);
        return;
    }
    /* Reference values from Python: gzip.open(...).read(), then the first
     * labels, the per-class counts, and sums of the raw pixels. */
    struct {
        const char *split;
        int64_t n, per_class;
        int32_t first[3], last_label;
        long first_sum, last_sum;
        int center0; /* pixel (14, 14) of image 0 */
    } want[2] = {{"train", 60000, 6000, {9, 0, 0}, 5, 76247, 16684, 217},
                 {"t10k", 10000, 1000, {9, 2, 1}, 5, 33456, 24390, 110}};
    for (int s = 0; s < 2; s++) {
        fr_dataset *ds = fr_dataset_open_dir(ctx, dir, want[s].split);
        CHECK(ds != NULL, "%s: %s", want[s].split, fr_last_error(ctx));
        if (!ds) continue;
        int c, h, w;
        fr_dataset_sample_shape(ds, &c, &h, &w);
        CHECK(fr_dataset_len(ds) == want[s].n && c == 1 && h == 28 && w == 28, "%s: shape",
              want[s].split);
        CHECK(fr_dataset_classes(ds) == 10, "%s: classes %d", want[s].split,
              fr_dataset_classes(ds));
        int64_t idx[4] = {0, 1, 2, want[s].n - 1};
        float x[4 * 784];
        int32_t y[4];
        CHECK(fr_dataset_read(ds, idx, 4, x, y, NULL) == FR_OK, "%s", fr_last_error(ctx));
        CHECK(y[0] == want[s].first[0] && y[1] == want[s].first[1] && y[2] == want[s].first[2] &&
                  y[3] == want[s].last_label,
              "%s: labels %d %d %d .. %d", want[s].split, y[0], y[1], y[2], y[3]);
        double s0 = 0, s3 = 0;
        for (int j = 0; j < 784; j++) s0 += x[j] * 255.0, s3 += x[3 * 784 + j] * 255.0;
        CHECK(fabs(s0 - want[s].first_sum) < 0.01 && fabs(s3 - want[s].last_sum) < 0.01,
              "%s: pixel sums %.2f %.2f", want[s].split, s0, s3);
        CHECK(fabs(x[14 * 28 + 14] - want[s].center0 / 255.0) < 1e-7, "%s: center pixel",
              want[s].split);
        /* Every label, read one at a time without images. */
        int64_t count[10] = {0};
        int bad = 0;
        for (int64_t i = 0; i < want[s].n; i++) {
            int32_t l;
            if (fr_dataset_read(ds, &i, 1, NULL, &l, NULL) || l < 0 || l > 9) bad++;
            else count[l]++;
        }
        for (int k = 0; k < 10; k++)
            if (count[k] != want[s].per_class) bad++;
        CHECK(bad == 0, "%s: class counts", want[s].split);
        CHECK(stats(ctx).allocated[FR_MEM_DATA] == 0, "%s: the dataset holds data memory",
              want[s].split);
        fr_dataset_close(ds);
    }
    CHECK(stats(ctx).allocated_total == 0, "leak");
}

/* Every allocation of open + read fails in turn. */
static void test_alloc_failures(fr_ctx *ctx) {
    char pig[512], plg[512], pu1[512], p4[512];
    path_in(pig, sizeof pig, "img.idx.gz");
    path_in(plg, sizeof plg, "lab.idx.gz");
    path_in(pu1, sizeof pu1, "u1.npy");
    path_in(p4, sizeof p4, "l4.npy");
    const char *sets[2][2] = {{pig, plg}, {pu1, p4}};
    for (int s = 0; s < 2; s++) {
        int fails = 0;
        for (int n = 1; n < 1000; n++) {
            fr_mem_stats before = stats(ctx);
            fr_mem_fail_at(ctx, (uint64_t)n);
            fr_dataset *ds = fr_dataset_open(ctx, sets[s][0], sets[s][1]);
            fr_status st = FR_OK;
            if (ds) {
                int64_t idx[2] = {1, 0};
                float x[2 * 60];
                int32_t y[2];
                st = fr_dataset_read(ds, idx, 2, x, y, NULL);
                fr_dataset_close(ds);
            }
            fr_mem_fail_at(ctx, 0);
            int injected = stats(ctx).num_ooms > before.num_ooms;
            if (!ds) {
                fails++;
                CHECK(injected && strstr(fr_last_error(ctx), "out of memory"),
                      "set %d fail at %d: %s", s, n, fr_last_error(ctx));
            }
            CHECK(st == FR_OK, "read failed: %s", fr_last_error(ctx));
            CHECK(stats(ctx).allocated_total == 0, "set %d fail at %d: %zu bytes leaked", s, n,
                  stats(ctx).allocated_total);
            if (!injected) break;
        }
        CHECK(fails >= 3, "set %d: only %d allocations failed", s, fails);
    }
}

int main(void) {
    if (scratch_make("frugal-ds")) {
        perror("mkdtemp");
        return 1;
    }
    int fds = open_fds();
    fr_ctx *ctx = fr_ctx_new();
    test_idx(ctx);
    test_npy(ctx);
    test_open_dir(ctx);
    test_model_fit(ctx);
    test_f64(ctx);
    test_claimed_format(ctx);
    test_source_split(ctx);
    test_data_check(ctx);
    test_gzip_bomb(ctx);
    test_not_regular(ctx);
    test_alloc_failures(ctx);
    test_fashion(ctx);
    fr_ctx_free(ctx);
    CHECK(open_fds() == fds, "%d file descriptors leaked", open_fds() - fds);
    remove_tree();
    return check_done();
}
