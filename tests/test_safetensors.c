/* test_safetensors.c — the safetensors reader and writer and atomic writes:
 * byte-exact output against the reference layout (compact JSON,
 * "__metadata__" first, spaces to a multiple of 8, worked out by hand with
 * Python's json.dumps), round trips of every dtype, each corruption the
 * reader must reject (with its message), atomic-write failures that must
 * leave the old file and no temporary, and every allocation failing in turn;
 * the lazy reader (a sparse 8 GiB file costs its header only; offsets are
 * checked against the file's size; a file that shrinks after opening is an
 * error), FIFOs and directories refused without blocking, the check before
 * a save, and the removal of stale temporaries of dead writers; a
 * weights-only file (fr_ckpt_save_weights) read back by hand: nanoGPT's
 * state_dict names and shapes written out below, no optimizer entry, the
 * tied lm_head's bytes, and with nanoGPT's masks their (1, 1, T, T)
 * lower-triangular ones. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "check.h"
#include "io/safetensors.h"
#include "model/model.h"
#include "model/modelfile.h"
#include "scratch.h"
#include "run/checkpoint.h"

static void path_in(char *out, size_t cap, const char *name) {
    snprintf(out, cap, "%s/%s", tmpdir, name);
}

static size_t slurp(const char *path, unsigned char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return (size_t)-1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return n;
}

static void spit(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return;
    fwrite(buf, 1, n, f);
    fclose(f);
}

static int exists(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0;
}

static size_t live_bytes(fr_ctx *ctx) {
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    return s.allocated_total;
}

/* The writer's output for two tensors and one metadata entry, byte for byte. */
static void test_exact_bytes(fr_ctx *ctx) {
    const char hdr[] =
        "{\"__metadata__\":{\"format\":\"pt\"},\"w\":{\"dtype\":\"F32\",\"shape\":[2],"
        "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":"
        "[8,16]}}      ";
    _Static_assert(sizeof hdr - 1 == 144, "138 bytes of JSON and 6 of padding");
    unsigned char want[8 + 144 + 16];
    memcpy(want, "\x90\0\0\0\0\0\0\0", 8);
    memcpy(want + 8, hdr, 144);
    float w[2] = {1.0f, 2.0f};
    int64_t b = 7;
    memcpy(want + 152, w, 8);
    memcpy(want + 160, &b, 8);

    fr_st_entry e[2];
    memset(e, 0, sizeof e);
    strcpy(e[0].name, "w");
    e[0].dtype = FR_F32;
    e[0].shape = fr_shape1(2);
    e[0].data = w;
    e[0].nbytes = 8;
    strcpy(e[1].name, "b");
    e[1].dtype = FR_I64;
    e[1].shape.ndim = 0;
    e[1].data = &b;
    e[1].nbytes = 8;
    fr_st_meta m = {"format", "pt"};
    char p[512];
    path_in(p, sizeof p, "exact.safetensors");
    fr_status st = fr_st_write(ctx, p, e, 2, &m, 1);
    CHECK(st == FR_OK, "%s", fr_last_error(ctx));
    unsigned char got[512];
    size_t n = slurp(p, got, sizeof got);
    CHECK(n == sizeof want && !memcmp(got, want, sizeof want),
          "file differs from the reference layout (%zu bytes)", n);

    fr_st_file f;
    st = fr_st_read(ctx, p, &f, FR_MEM_PARAMS);
    CHECK(st == FR_OK, "%s", fr_last_error(ctx));
    if (!st) {
        CHECK(f.n == 2 && !strcmp(f.entries[0].name, "w") && !strcmp(f.entries[1].name, "b"),
              "order");
        const fr_st_entry *fb = fr_st_find(&f, "b");
        int64_t bv = 0;
        CHECK(fb && fb->data == NULL, "fr_st_read read tensor data before it was asked for");
        if (fb) CHECK(fr_st_load(ctx, &f, fb, &bv) == FR_OK, "%s", fr_last_error(ctx));
        CHECK(fb && fb->dtype == FR_I64 && fb->shape.ndim == 0 && bv == 7, "scalar b");
        CHECK(fr_st_find(&f, "nope") == NULL, "find of a missing name");
        const char *fmt = fr_st_meta_get(&f, "format");
        CHECK(fmt && !strcmp(fmt, "pt"), "metadata");
        fr_mem_stats s;
        fr_mem_get_stats(ctx, &s);
        /* the entry table and the path are in the category given */
        CHECK(s.allocated[FR_MEM_PARAMS] > 0 && s.allocated[FR_MEM_PARAMS] < 8192,
              "reading counted as params: %zu", s.allocated[FR_MEM_PARAMS]);
        fr_st_close(ctx, &f);
    }
    CHECK(live_bytes(ctx) == 0, "leak");
}

/* Every dtype, odd shapes (scalar, zero-size), names that need escaping. */
static void test_round_trip(fr_ctx *ctx) {
    float f32[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
    uint16_t f16[4] = {0x3C00, 0xC000, 0x7BFF, 0x0001};
    uint16_t bf16[3] = {0x3F80, 0x4000, 0xBF80};
    int32_t i32[2] = {-5, 2147483647};
    uint8_t u8[5] = {0, 1, 2, 254, 255};
    int64_t i64[1] = {-1234567890123LL};
    fr_st_entry e[7];
    memset(e, 0, sizeof e);
    strcpy(e[0].name, "fc1.weight");
    e[0].dtype = FR_F32, e[0].shape = fr_shape2(2, 3), e[0].data = f32, e[0].nbytes = 24;
    strcpy(e[1].name, "half \"quoted\"\\");
    e[1].dtype = FR_F16, e[1].shape = fr_shape4(1, 2, 1, 2), e[1].data = f16, e[1].nbytes = 8;
    strcpy(e[2].name, "bf\tö");
    e[2].dtype = FR_BF16, e[2].shape = fr_shape1(3), e[2].data = bf16, e[2].nbytes = 6;
    strcpy(e[3].name, "i32");
    e[3].dtype = FR_I32, e[3].shape = fr_shape1(2), e[3].data = i32, e[3].nbytes = 8;
    strcpy(e[4].name, "u8");
    e[4].dtype = FR_U8, e[4].shape = fr_shape1(5), e[4].data = u8, e[4].nbytes = 5;
    strcpy(e[5].name, "step");
    e[5].dtype = FR_I64, e[5].shape.ndim = 0, e[5].data = i64, e[5].nbytes = 8;
    strcpy(e[6].name, "empty");
    e[6].dtype = FR_F32, e[6].shape = fr_shape2(0, 3), e[6].data = NULL, e[6].nbytes = 0;
    fr_st_meta m[2] = {{"format", "pt"}, {"note", "a \"value\" with\nnewline"}};
    char p[512];
    path_in(p, sizeof p, "rt.safetensors");
    fr_status st = fr_st_write(ctx, p, e, 7, m, 2);
    CHECK(st == FR_OK, "%s", fr_last_error(ctx));
    fr_st_file f;
    st = fr_st_read(ctx, p, &f, FR_MEM_OTHER);
    CHECK(st == FR_OK, "%s", fr_last_error(ctx));
    if (st) return;
    CHECK(f.n == 7 && f.n_meta == 2, "counts %d %d", f.n, f.n_meta);
    for (int k = 0; k < 7 && k < f.n; k++) {
        const fr_st_entry *g = &f.entries[k];
        CHECK(!strcmp(g->name, e[k].name), "name %d: '%s'", k, g->name);
        CHECK(g->dtype == e[k].dtype && fr_shape_eq(&g->shape, &e[k].shape) &&
                  g->nbytes == e[k].nbytes,
              "meta of %s", e[k].name);
        unsigned char got[32] = {0};
        CHECK(g->nbytes <= sizeof got && fr_st_load(ctx, &f, g, got) == FR_OK, "load %s: %s",
              e[k].name, fr_last_error(ctx));
        CHECK(g->nbytes == 0 || !memcmp(got, e[k].data, g->nbytes), "data of %s", e[k].name);
    }
    const char *note = fr_st_meta_get(&f, "note");
    CHECK(note && !strcmp(note, m[1].value), "escaped metadata value");
    fr_st_close(ctx, &f);

    /* Writer arguments it must refuse. */
    strcpy(e[1].name, "fc1.weight");
    CHECK(fr_st_write(ctx, p, e, 2, NULL, 0) == FR_ERR_ARG, "duplicate name accepted");
    strcpy(e[1].name, "__metadata__");
    CHECK(fr_st_write(ctx, p, e, 2, NULL, 0) == FR_ERR_ARG, "reserved name accepted");
    strcpy(e[1].name, "ok");
    e[1].nbytes = 7;
    CHECK(fr_st_write(ctx, p, e, 2, NULL, 0) == FR_ERR_ARG, "size mismatch accepted");
    CHECK(live_bytes(ctx) == 0, "leak");
}

typedef struct bad {
    const char *what;
    const char *json; /* header; NULL: use raw */
    size_t data_len;  /* zero bytes appended after the header */
    const char *msg;  /* expected substring of the message */
} bad;

static size_t make_file(unsigned char *buf, const char *json, size_t data_len) {
    size_t h = strlen(json);
    for (int k = 0; k < 8; k++) buf[k] = (unsigned char)((uint64_t)h >> (8 * k));
    memcpy(buf + 8, json, h);
    memset(buf + 8 + h, 0, data_len);
    return 8 + h + data_len;
}

static void test_corruptions(fr_ctx *ctx) {
    static const bad cases[] = {
        {"not an object", "[1]", 0, "byte 8: expected '{'"},
        {"empty header", "", 0, "header ends where '{' was expected"},
        {"unterminated string", "{\"a", 0, "unterminated string"},
        {"missing colon", "{\"a\" {}}", 0, "expected ':'"},
        {"trailing comma", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},}", 1,
         "expected a string"},
        {"trailing garbage", "{} x", 0, "byte 11: unexpected characters after the header object"},
        {"unknown dtype", "{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
         "tensor 'a': unsupported dtype \"F64\""},
        {"negative dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
         "negative number"},
        {"fractional dim", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}}", 1,
         "expected an integer"},
        {"leading zero", "{\"a\":{\"dtype\":\"U8\",\"shape\":[01],\"data_offsets\":[0,1]}}", 1,
         "leading zero"},
        {"huge number",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1,
         "number too large"},
        {"five dims", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
         "more than 4 values"},
        {"shape overflow",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":["
         "0,1]}}",
         1, "tensor 'a': shape's element count overflows"},
        {"bytes overflow",
         "{\"a\":{\"dtype\":\"I64\",\"shape\":[4611686018427387904],\"data_offsets\":[0,1]}}", 1,
         "tensor 'a': shape's byte count overflows"},
        {"end past data",
         "{\"fc1.weight\":{\"dtype\":\"F32\",\"shape\":[10,10],\"data_offsets\":[0,400]}}", 320,
         "tensor 'fc1.weight': data_offsets [0, 400] end past the data (320 bytes)"},
        {"end before begin", "{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 4,
         "end before begin"},
        {"size mismatch", "{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,16]}}", 16,
         "tensor 'a': data_offsets [0, 16] hold 16 bytes but F32 (2, 3) needs 24"},
        {"three offsets", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}}", 2,
         "more than 2 values"},
        {"one offset", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
         "needs 2 values, has 1"},
        {"overlap",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
         6, "tensor 'b': data_offsets [2, 6] overlap tensor 'a'"},
        {"gap",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
         "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]}}",
         6, "tensor 'b': data_offsets [4, 6] leave a gap of 2 bytes"},
        {"gap at start", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}", 3,
         "leave a gap of 1 bytes"},
        {"uncovered tail", "{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 5,
         "the tensors cover 2 bytes of data but the file has 5"},
        {"data without tensors", "{}", 3, "no tensors but 3 bytes of data"},
        {"duplicate tensor",
         "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
         "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
         2, "tensor 'a' appears twice"},
        {"duplicate key",
         "{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
         "duplicate \"dtype\""},
        {"missing key", "{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
         "tensor 'a': missing \"shape\""},
        {"unknown key", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}}",
         1, "tensor 'a': unknown key \"x\""},
        {"tensor not an object", "{\"a\":[1]}", 0, "expected '{' to open a tensor"},
        {"metadata not a string", "{\"__metadata__\":{\"k\":1}}", 0,
         "metadata 'k': value is not a string"},
        {"duplicate metadata", "{\"__metadata__\":{},\"__metadata__\":{}}", 0,
         "duplicate \"__metadata__\""},
        {"control char", "{\"a\tb\":{}}", 0, "control character 0x09"},
        {"bad escape", "{\"a\\qb\":{}}", 0, "unknown escape '\\q'"},
        {"nul escape", "{\"a\\u0000\":{}}", 0, "\\u0000 in a string"},
        {"lone surrogate", "{\"\\udc00\":{}}", 0, "lone low surrogate"},
        {"bad utf-8", "{\"\xff\":{}}", 0, "invalid UTF-8"},
        {"overlong utf-8", "{\"\xc0\xaf\":{}}", 0, "invalid UTF-8"},
        {"name too long",
         "{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
         "aaaaaaa"
         "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":{}}",
         0, "a tensor name longer than 159 bytes"},
        {"cut inside object", "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}", 1,
         "header ends inside the top-level object"},
    };
    unsigned char buf[1024];
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = make_file(buf, cases[c].json, cases[c].data_len);
        fr_st_file f;
        fr_status st = fr_st_parse(ctx, "t.safetensors", buf, n, &f);
        CHECK(st == FR_ERR_FORMAT, "%s: accepted (status %d)", cases[c].what, st);
        CHECK(strstr(fr_last_error(ctx), cases[c].msg) &&
                  !strncmp(fr_last_error(ctx), "t.safetensors: ", 15),
              "%s: message \"%s\" lacks \"%s\"", cases[c].what, fr_last_error(ctx), cases[c].msg);
        CHECK(f.n == 0 && f.entries == NULL, "%s: out not cleared", cases[c].what);
    }
    /* The exact message for the brief's example. */
    size_t n = make_file(buf, cases[14].json, 320);
    fr_st_file f;
    fr_st_parse(ctx, "ckpt.safetensors", buf, n, &f);
    CHECK(!strcmp(fr_last_error(ctx), "ckpt.safetensors: tensor 'fc1.weight': data_offsets [0, "
                                      "400] end past the data (320 bytes)"),
          "got \"%s\"", fr_last_error(ctx));

    /* Header length faults. */
    CHECK(fr_st_parse(ctx, "s", "\1\0\0", 3, &f) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "too short"),
          "%s", fr_last_error(ctx));
    memcpy(buf, "\x40\0\0\0\0\0\0\0{}", 10);
    CHECK(fr_st_parse(ctx, "s", buf, 10, &f) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx),
                     "header length 64 runs past the end of the file (2 bytes follow it)"),
          "%s", fr_last_error(ctx));
    memcpy(buf, "\0\0\0\0\0\0\0\x80{}", 10);
    CHECK(fr_st_parse(ctx, "s", buf, 10, &f) == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "exceeds the limit"),
          "%s", fr_last_error(ctx));
    /* Valid oddities: padding, whitespace, any order of keys and tensors, unicode escapes. */
    n = make_file(
        buf,
        " { \"b\" : {\"data_offsets\":[2,3], \"shape\":[], \"dtype\":\"U8\"},\n"
        "\"\\u00e9\\ud83d\\ude00\":{\"shape\":[2],\"dtype\":\"U8\",\"data_offsets\":[0,2]} }   ",
        3);
    fr_status st = fr_st_parse(ctx, "s", buf, n, &f);
    CHECK(st == FR_OK, "%s", fr_last_error(ctx));
    if (!st) {
        CHECK(f.n == 2 && fr_st_find(&f, "\xc3\xa9\xf0\x9f\x98\x80") &&
                  fr_st_find(&f, "b")->shape.ndim == 0,
              "escaped names");
        fr_st_close(ctx, &f);
    }
    n = make_file(buf, "{}", 0);
    CHECK(fr_st_parse(ctx, "s", buf, n, &f) == FR_OK && f.n == 0, "empty file: %s",
          fr_last_error(ctx));
    fr_st_close(ctx, &f);

    /* Through the file reader too: a corrupt file on disk and a missing one. */
    char p[512];
    path_in(p, sizeof p, "corrupt.safetensors");
    n = make_file(buf, cases[14].json, 320);
    spit(p, buf, n);
    st = fr_st_read(ctx, p, &f, FR_MEM_PARAMS);
    CHECK(st == FR_ERR_FORMAT &&
              strstr(fr_last_error(ctx), "corrupt.safetensors: tensor 'fc1.weight'"),
          "%s", fr_last_error(ctx));
    path_in(p, sizeof p, "missing.safetensors");
    st = fr_st_read(ctx, p, &f, FR_MEM_PARAMS);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "missing.safetensors: cannot open"), "%s",
          fr_last_error(ctx));
    CHECK(live_bytes(ctx) == 0, "leak");
}

static int count_tmp_files(void) {
    DIR *d = opendir(tmpdir);
    int n = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (strstr(de->d_name, ".tmp.")) n++;
    if (d) closedir(d);
    return n;
}

static void test_atomic(fr_ctx *ctx) {
    char p[512], q[512], dirp[512];
    unsigned char got[64];
    path_in(p, sizeof p, "atomic.bin");
    CHECK(fr_write_atomic(ctx, p, "old contents", 12) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(fr_write_atomic(ctx, p, "new contents!", 13) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(slurp(p, got, sizeof got) == 13 && !memcmp(got, "new contents!", 13), "replace");
    CHECK(count_tmp_files() == 0, "a temporary remains after success");

    /* A directory that does not exist: nothing is created. */
    path_in(q, sizeof q, "no/such/dir/x.bin");
    fr_status st = fr_write_atomic(ctx, q, "x", 1);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "cannot create"), "%s", fr_last_error(ctx));
    CHECK(!exists(q), "file created");

    /* The target is a directory: the rename fails after the temporary was
     * written; the temporary must be gone and the directory untouched. */
    path_in(dirp, sizeof dirp, "isdir");
    mkdir(dirp, 0755);
    st = fr_write_atomic(ctx, dirp, "x", 1);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "rename"), "%s", fr_last_error(ctx));
    CHECK(count_tmp_files() == 0, "temporary left after a failed rename");
    struct stat sb;
    CHECK(stat(dirp, &sb) == 0 && S_ISDIR(sb.st_mode), "directory replaced");

    /* A write that fails part way (the file-size limit makes write() return
     * EFBIG): the old file keeps its contents and no temporary remains. */
    struct rlimit old;
    getrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim = {4096, old.rlim_max};
    static char big[10000];
    memset(big, 'z', sizeof big);
    if (setrlimit(RLIMIT_FSIZE, &lim) == 0) {
        st = fr_write_atomic(ctx, p, big, sizeof big);
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "write of") &&
                  strstr(fr_last_error(ctx), "the old file is unchanged"),
              "%s", fr_last_error(ctx));
        CHECK(slurp(p, got, sizeof got) == 13 && !memcmp(got, "new contents!", 13),
              "old file damaged");
        CHECK(count_tmp_files() == 0, "temporary left after a failed write");
        /* fr_st_write goes through the same path. */
        fr_st_entry e;
        memset(&e, 0, sizeof e);
        strcpy(e.name, "big");
        e.dtype = FR_U8, e.shape = fr_shape1(sizeof big), e.data = big, e.nbytes = sizeof big;
        setrlimit(RLIMIT_FSIZE, &lim);
        st = fr_st_write(ctx, p, &e, 1, NULL, 0);
        setrlimit(RLIMIT_FSIZE, &old);
        CHECK(st == FR_ERR_IO, "fr_st_write past the size limit: %d", st);
        CHECK(slurp(p, got, sizeof got) == 13 && !memcmp(got, "new contents!", 13),
              "old file damaged");
        CHECK(count_tmp_files() == 0, "temporary left after a failed fr_st_write");
    }
    signal(SIGXFSZ, SIG_DFL);

    /* A directory without write permission (root ignores it: skipped then). */
    path_in(dirp, sizeof dirp, "readonly");
    mkdir(dirp, 0755);
    path_in(q, sizeof q, "readonly/f.bin");
    CHECK(fr_write_atomic(ctx, q, "keep", 4) == FR_OK, "%s", fr_last_error(ctx));
    chmod(dirp, 0555);
    if (geteuid() != 0) {
        st = fr_write_atomic(ctx, q, "lost", 4);
        CHECK(st == FR_ERR_IO, "wrote into a read-only directory");
        CHECK(slurp(q, got, sizeof got) == 4 && !memcmp(got, "keep", 4), "old file damaged");
    }
    chmod(dirp, 0755);
    unlink(q);
    rmdir(dirp);
    CHECK(live_bytes(ctx) == 0, "leak");
}

/* Peak RSS of this process in KiB. */
static long peak_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_maxrss;
}

/* A sparse file: a valid header naming one 8 GiB tensor, then 8 GiB that
 * were never written. Reading it takes the header only; the tensor is read
 * when asked for, and a file that shrank since is an error naming it. */
static void test_lazy(fr_ctx *ctx) {
    char p[512], hdr[256];
    const uint64_t big = 8ULL << 30;
    path_in(p, sizeof p, "sparse.safetensors");
    int n = snprintf(hdr + 8, sizeof hdr - 8,
                     "{\"big\":{\"dtype\":\"F32\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
                     (unsigned long long)(big / 4), (unsigned long long)big);
    while (n % 8) hdr[8 + n++] = ' ';
    for (int k = 0; k < 8; k++) hdr[k] = (char)(((uint64_t)n >> (8 * k)) & 0xFF);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int made = fd >= 0 && write(fd, hdr, (size_t)n + 8) == n + 8 &&
               ftruncate(fd, (off_t)(8 + n + big)) == 0;
    if (fd >= 0) close(fd);
    CHECK(made, "cannot make the sparse file: %s", strerror(errno));
    if (!made) return;
    long before = peak_rss_kib();
    fr_st_file f;
    fr_status st = fr_st_read(ctx, p, &f, FR_MEM_PARAMS);
    long grew = peak_rss_kib() - before;
    CHECK(st == FR_OK, "%s", fr_last_error(ctx));
    CHECK(grew < 64 * 1024,
          "reading the header of a sparse 8 GiB file raised the peak RSS by %ld KiB", grew);
    if (!st) {
        const fr_st_entry *e = fr_st_find(&f, "big");
        CHECK(e && e->nbytes == big && e->data == NULL, "entry 'big'");
        /* the file shrinks under the reader: the load says so */
        CHECK(truncate(p, 8 + n + 16) == 0, "truncate");
        float four[4];
        fr_st_entry part = *e;
        part.nbytes = sizeof four; /* the first 16 bytes are still there */
        CHECK(fr_st_load(ctx, &f, &part, four) == FR_OK, "%s", fr_last_error(ctx));
        part.offset = 16;
        st = fr_st_load(ctx, &f, &part, four);
        CHECK(st == FR_ERR_IO &&
                  strstr(fr_last_error(ctx),
                         "sparse.safetensors: tensor 'big': cannot read 16 bytes") &&
                  strstr(fr_last_error(ctx), "shrank"),
              "%d: %s", st, fr_last_error(ctx));
        fr_st_close(ctx, &f);
    }
    /* Now the header promises more than the file holds: refused up front. */
    st = fr_st_read(ctx, p, &f, FR_MEM_PARAMS);
    CHECK(st == FR_ERR_FORMAT && strstr(fr_last_error(ctx), "end past the data (16 bytes)"),
          "%d: %s", st, fr_last_error(ctx));
    unlink(p);
    CHECK(live_bytes(ctx) == 0, "leak");
}

/* A FIFO would block open() and read(); a directory has no bytes: both are
 * refused at once with their own reason, errno read where it failed. */
static void test_not_regular(fr_ctx *ctx) {
    char p[512];
    fr_st_file f;
    path_in(p, sizeof p, "fifo");
    CHECK(mkfifo(p, 0644) == 0, "mkfifo: %s", strerror(errno));
    fr_status st = fr_st_read(ctx, p, &f, FR_MEM_OTHER);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx),
                                    "fifo: the safetensors file is a FIFO, not a regular file"),
          "%d: %s", st, fr_last_error(ctx));
    unlink(p);
    path_in(p, sizeof p, "adir");
    mkdir(p, 0755);
    st = fr_st_read(ctx, p, &f, FR_MEM_OTHER);
    CHECK(st == FR_ERR_IO &&
              strstr(fr_last_error(ctx), "adir: the safetensors file is a directory") &&
              !strstr(fr_last_error(ctx), "ioctl"),
          "%d: %s", st, fr_last_error(ctx));
    rmdir(p);
    CHECK(live_bytes(ctx) == 0, "leak");
}

/* What a save can know before any work is done. */
static void test_check_writable(fr_ctx *ctx) {
    char p[512], d[512];
    path_in(p, sizeof p, "new.safetensors");
    CHECK(fr_st_check_writable(ctx, p) == FR_OK, "a new file in the scratch directory: %s",
          fr_last_error(ctx));
    CHECK(fr_st_check_writable(ctx, "plain.safetensors") == FR_OK, "a relative name: %s",
          fr_last_error(ctx));
    path_in(p, sizeof p, "no/such/x.safetensors");
    fr_status st = fr_st_check_writable(ctx, p);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "cannot write there") &&
              strstr(fr_last_error(ctx), "No such file or directory"),
          "%d: %s", st, fr_last_error(ctx));
    path_in(d, sizeof d, "wdir");
    mkdir(d, 0755);
    st = fr_st_check_writable(ctx, d);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(ctx), "wdir: is a directory"), "%d: %s", st,
          fr_last_error(ctx));
    path_in(p, sizeof p, "wdir/");
    st = fr_st_check_writable(ctx, p);
    CHECK(st == FR_ERR_ARG && strstr(fr_last_error(ctx), "is a directory"),
          "trailing slash: %d: %s", st, fr_last_error(ctx));
    path_in(p, sizeof p, "afile");
    spit(p, "x", 1);
    path_in(d, sizeof d, "afile/x.safetensors");
    st = fr_st_check_writable(ctx, d);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "is not a directory"), "%d: %s", st,
          fr_last_error(ctx));
    unlink(p);
    path_in(d, sizeof d, "wdir");
    rmdir(d);
}

/* A pid no process has now (kill(pid, 0) fails with ESRCH). */
static long dead_pid(void) {
    for (long pid = 999999; pid > 1; pid--)
        if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return pid;
    return -1;
}

/* A writer killed between creating "<path>.tmp.<pid>" and the rename leaves
 * the temporary; the next write of that path removes it, and nothing else:
 * not a live writer's, not another path's. */
static void test_stale_temporaries(fr_ctx *ctx) {
    char p[512], dead[600], live[600], other[600];
    long pid = dead_pid();
    CHECK(pid > 0, "no free pid");
    path_in(p, sizeof p, "ckpt.safetensors");
    snprintf(dead, sizeof dead, "%s.tmp.%ld", p, pid);
    snprintf(live, sizeof live, "%s.tmp.%ld", p, (long)getppid());
    path_in(other, sizeof other, "other.safetensors");
    snprintf(other + strlen(other), sizeof other - strlen(other), ".tmp.%ld", pid);
    spit(dead, "partial", 7);
    spit(live, "writing", 7);
    spit(other, "partial", 7);
    float w[2] = {1, 2};
    fr_st_entry e;
    memset(&e, 0, sizeof e);
    strcpy(e.name, "w");
    e.dtype = FR_F32, e.shape = fr_shape1(2), e.data = w, e.nbytes = 8;
    CHECK(fr_st_write(ctx, p, &e, 1, NULL, 0) == FR_OK, "%s", fr_last_error(ctx));
    CHECK(!exists(dead), "the dead writer's temporary is still there");
    CHECK(exists(live), "a live writer's temporary was removed");
    CHECK(exists(other), "another path's temporary was removed");
    unlink(live);
    unlink(other);
    unlink(p);
}

/* Each allocation fails in turn: a clean FR_ERR_NOMEM or success, no leak. */
static void test_alloc_failures(fr_ctx *ctx) {
    char p[512];
    path_in(p, sizeof p, "rt.safetensors");
    int fails = 0, n;
    for (n = 1; n < 1000; n++) {
        fr_mem_stats before, after;
        fr_mem_get_stats(ctx, &before);
        fr_mem_fail_at(ctx, (uint64_t)n);
        fr_st_file f;
        fr_status st = fr_st_read(ctx, p, &f, FR_MEM_PARAMS);
        fr_mem_fail_at(ctx, 0);
        fr_mem_get_stats(ctx, &after);
        int injected = after.num_ooms > before.num_ooms;
        if (st == FR_OK) fr_st_close(ctx, &f);
        if (st != FR_OK) {
            fails++;
            CHECK(st == FR_ERR_NOMEM && injected && strstr(fr_last_error(ctx), "out of memory"),
                  "read, fail at %d: status %d: %s", n, st, fr_last_error(ctx));
            CHECK(f.entries == NULL && f.blob == NULL, "out not cleared");
        }
        CHECK(live_bytes(ctx) == 0, "read, fail at %d: %zu bytes leaked", n, live_bytes(ctx));
        if (!injected) break;
    }
    CHECK(fails >= 2, "only %d read allocations failed", fails);

    float w[3] = {1, 2, 3};
    fr_st_entry e;
    memset(&e, 0, sizeof e);
    strcpy(e.name, "w");
    e.dtype = FR_F32, e.shape = fr_shape1(3), e.data = w, e.nbytes = 12;
    path_in(p, sizeof p, "nomem.safetensors");
    fails = 0;
    for (n = 1; n < 100; n++) {
        fr_mem_stats before, after;
        fr_mem_get_stats(ctx, &before);
        fr_mem_fail_at(ctx, (uint64_t)n);
        fr_status st = fr_st_write(ctx, p, &e, 1, NULL, 0);
        fr_mem_fail_at(ctx, 0);
        fr_mem_get_stats(ctx, &after);
        int injected = after.num_ooms > before.num_ooms;
        if (st) {
            fails++;
            CHECK(st == FR_ERR_NOMEM && !exists(p), "write, fail at %d: status %d", n, st);
        }
        CHECK(live_bytes(ctx) == 0, "write, fail at %d: leak", n);
        if (!injected) {
            CHECK(st == FR_OK && exists(p), "write without a fault failed: %s", fr_last_error(ctx));
            break;
        }
    }
    CHECK(fails >= 2, "only %d write allocations failed", fails);
    CHECK(count_tmp_files() == 0, "temporary left");
}

/* A nanoGPT GPT (bias=True) of 2 layers, 2 heads, n_embd 16, block_size 8,
 * vocab_size 32, as a model file. */
static const char gpt_text[] = "input tokens 8\n"
                               "embedding 32 16 name=transformer.wte\n"
                               "pos_embedding 8 name=transformer.wpe\n"
                               "repeat 2 name=transformer.h\n"
                               "  residual\n"
                               "    layernorm 16 name=ln_1\n"
                               "    linear 48 name=attn.c_attn\n"
                               "    attention heads=2\n"
                               "    linear 16 name=attn.c_proj\n"
                               "  end\n"
                               "  residual\n"
                               "    layernorm 16 name=ln_2\n"
                               "    linear 64 name=mlp.c_fc\n"
                               "    gelu approximate=tanh\n"
                               "    linear 16 name=mlp.c_proj\n"
                               "  end\n"
                               "end\n"
                               "layernorm 16 name=transformer.ln_f\n"
                               "linear 32 bias=false tie=transformer.wte name=lm_head\n";

/* The header's entry for name: its JSON from the opening quote, the start
 * of its data in the file (8 + header length + offset) and its length. */
static const char *st_entry(const char *json, const char *name, size_t *at, size_t *len,
                            size_t data_at) {
    char key[160];
    snprintf(key, sizeof key, "\"%s\":{", name);
    const char *e = strstr(json, key);
    if (!e) return NULL;
    const char *o = strstr(e, "\"data_offsets\":[");
    unsigned long a = 0, b = 0;
    if (!o || sscanf(o, "\"data_offsets\":[%lu,%lu]", &a, &b) != 2) return NULL;
    *at = data_at + a;
    *len = b - a;
    return e;
}

/* fr_ckpt_save_weights: nanoGPT's state_dict keys for the model above, from
 * its GPT class (transformer.wte, wpe, h.N.{ln_1, attn.c_attn, attn.c_proj,
 * ln_2, mlp.c_fc, mlp.c_proj}, ln_f, lm_head without bias), with their
 * shapes; attn.bias (1, 1, 8, 8) only when asked. Each entry is checked in
 * the file's JSON as written, and nothing else is there. */
static void test_weights_only(fr_ctx *ctx) {
    fr_model *m = fr_model_parse(ctx, "gpt.model", gpt_text, sizeof gpt_text - 1);
    CHECK(m != NULL, "%s", fr_last_error(ctx));
    if (!m) return;
    CHECK(fr_model_init(m, 3) == FR_OK, "%s", fr_last_error(ctx));
    static const struct {
        const char *name, *shape;
    } top[] = {{"transformer.wte.weight", "[32,16]"},
               {"transformer.wpe.weight", "[8,16]"},
               {"transformer.ln_f.weight", "[16]"},
               {"transformer.ln_f.bias", "[16]"},
               {"lm_head.weight", "[32,16]"}},
      block[] = {{"ln_1.weight", "[16]"},           {"ln_1.bias", "[16]"},
                 {"attn.c_attn.weight", "[48,16]"}, {"attn.c_attn.bias", "[48]"},
                 {"attn.c_proj.weight", "[16,16]"}, {"attn.c_proj.bias", "[16]"},
                 {"ln_2.weight", "[16]"},           {"ln_2.bias", "[16]"},
                 {"mlp.c_fc.weight", "[64,16]"},    {"mlp.c_fc.bias", "[64]"},
                 {"mlp.c_proj.weight", "[16,64]"},  {"mlp.c_proj.bias", "[16]"}};
    for (int masks = 0; masks <= 1; masks++) {
        char p[512];
        path_in(p, sizeof p, masks ? "nanogpt-pt1.safetensors" : "weights.safetensors");
        CHECK(fr_ckpt_save_weights(m, p, masks) == FR_OK, "%s", fr_last_error(ctx));
        CHECK(count_tmp_files() == 0, "a temporary remains");
        static unsigned char file[1 << 16];
        size_t n = slurp(p, file, sizeof file);
        CHECK(n != (size_t)-1 && n > 8 && n < sizeof file, "%s: %zu bytes", p, n);
        if (n == (size_t)-1 || n <= 8) continue;
        uint64_t hl = 0;
        for (int k = 7; k >= 0; k--) hl = hl << 8 | file[k];
        CHECK(8 + hl <= n, "header length %llu", (unsigned long long)hl);
        if (8 + hl > n) continue;
        static char json[1 << 16]; /* the header as a string */
        memcpy(json, file + 8, hl);
        json[hl] = 0;
        const char *meta = "{\"__metadata__\":{\"format\":\"pt\"},";
        CHECK(strncmp(json, meta, strlen(meta)) == 0, "metadata: %.60s", json);
        CHECK(!strstr(json, "optimizer") && !strstr(json, "\"runs\"") && !strstr(json, "epoch"),
              "an optimizer entry or counter: %s", json);
        int want = 5 + 2 * 12 + (masks ? 2 : 0), seen = 0, bad = 0;
        for (const char *q = json; (q = strstr(q, "\"dtype\"")); q++) seen++;
        CHECK(seen == want, "masks %d: %d entries, nanoGPT has %d", masks, seen, want);
        size_t at, len;
        char name[160], expect[200];
        for (int b = -1; b < 2; b++) {
            int count = b < 0 ? 5 : 12 + 1;
            for (int k = 0; k < count; k++) {
                const char *shape;
                if (b < 0) {
                    snprintf(name, sizeof name, "%s", top[k].name);
                    shape = top[k].shape;
                } else if (k < 12) {
                    snprintf(name, sizeof name, "transformer.h.%d.%s", b, block[k].name);
                    shape = block[k].shape;
                } else {
                    snprintf(name, sizeof name, "transformer.h.%d.attn.bias", b);
                    shape = "[1,1,8,8]";
                }
                const char *e = st_entry(json, name, &at, &len, 8 + hl);
                if (k == 12 && !masks) {
                    CHECK(e == NULL, "%s without masks asked", name);
                    continue;
                }
                snprintf(expect, sizeof expect, "\"%s\":{\"dtype\":\"F32\",\"shape\":%s,", name,
                         shape);
                CHECK(e && !strncmp(e, expect, strlen(expect)), "%s: %.80s", name,
                      e ? e : "absent");
                if (!e || k != 12) continue;
                /* torch.tril(torch.ones(8, 8)): 1 where key <= query, else 0 */
                CHECK(len == 64 * 4 && at + len <= n, "%s: %zu bytes", name, len);
                for (int q = 0; q < 8 && len == 256; q++)
                    for (int kk = 0; kk < 8; kk++) {
                        float v;
                        memcpy(&v, file + at + (size_t)(q * 8 + kk) * 4, 4);
                        bad += v != (kk <= q ? 1.0f : 0.0f);
                    }
            }
        }
        CHECK(bad == 0, "%d mask values wrong", bad);
        /* The bytes: every parameter's, and lm_head's are wte's (one tied parameter). */
        size_t at2, len2;
        for (size_t i = 0; i < m->n_params; i++) {
            const fr_param *pa = &m->params[i];
            size_t nb = (size_t)fr_shape_numel(&pa->shape) * 4;
            CHECK(st_entry(json, pa->name, &at, &len, 8 + hl) && len == nb && at + len <= n &&
                      !memcmp(file + at, pa->data, nb),
                  "%s: bytes differ", pa->name);
        }
        CHECK(st_entry(json, "lm_head.weight", &at, &len, 8 + hl) &&
                  st_entry(json, "transformer.wte.weight", &at2, &len2, 8 + hl) && len == len2 &&
                  !memcmp(file + at, file + at2, len),
              "lm_head.weight is not wte's bytes");
        /* frugal reads it back (the masks ignored), into a model of other values. */
        fr_model *m2 = fr_model_parse(ctx, "gpt.model", gpt_text, sizeof gpt_text - 1);
        CHECK(m2 && fr_model_init(m2, 4) == FR_OK && fr_model_load_weights(m2, p) == FR_OK, "%s",
              fr_last_error(ctx));
        for (size_t i = 0; m2 && i < m->n_params; i++)
            CHECK(!memcmp(m->params[i].data, m2->params[i].data,
                          (size_t)fr_shape_numel(&m->params[i].shape) * 4),
                  "%s differs after loading", m->params[i].name);
        fr_model_free(m2);
    }
    /* Masks for a model without nanoGPT blocks: refused, nothing written. */
    fr_model *mlp = fr_model_parse(ctx, "mlp.model", "input 4\nlinear 3\n", 17);
    CHECK(mlp && fr_model_init(mlp, 1) == FR_OK, "%s", fr_last_error(ctx));
    char p[512];
    path_in(p, sizeof p, "mlp.safetensors");
    CHECK(mlp && fr_ckpt_save_weights(mlp, p, 1) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "mlp.safetensors: nanoGPT masks asked for") && !exists(p),
          "masks for an MLP: %s", fr_last_error(ctx));
    CHECK(mlp && fr_ckpt_save_weights(mlp, p, 0) == FR_OK && exists(p), "%s", fr_last_error(ctx));
    /* Into a directory that does not exist: an error, no temporary. */
    path_in(p, sizeof p, "no/such/dir/w.safetensors");
    CHECK(fr_ckpt_save_weights(m, p, 0) != FR_OK && count_tmp_files() == 0, "missing directory");
    fr_model_free(mlp);
    fr_model_free(m);
    CHECK(live_bytes(ctx) == 0, "leak: %zu", live_bytes(ctx));
}

int main(void) {
    if (scratch_make("frugal-st")) {
        perror("mkdtemp");
        return 1;
    }
    int fds = open_fds();
    fr_ctx *ctx = fr_ctx_new();
    test_exact_bytes(ctx);
    test_round_trip(ctx);
    test_corruptions(ctx);
    test_atomic(ctx);
    test_alloc_failures(ctx);
    test_lazy(ctx);
    test_not_regular(ctx);
    test_check_writable(ctx);
    test_stale_temporaries(ctx);
    test_weights_only(ctx);
    fr_ctx_free(ctx);
    CHECK(open_fds() == fds, "%d file descriptors leaked", open_fds() - fds);
    remove_tree();
    return check_done();
}
