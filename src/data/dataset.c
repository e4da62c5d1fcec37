/* dataset.c — IDX and NumPy .npy datasets read lazily from disk (see
 * dataset.h). Owns the IDX header parser, which .npy element types and
 * shapes a dataset takes (io/npy.c parses the .npy header), the size and
 * label checks done once at open, the inflation of a .gz into an unlinked
 * temporary file, and reading samples with pread. It keeps no sample in
 * memory: a dataset holds two file descriptors and its shapes. Shuffling
 * and batching are loader.c's.
 *
 * Accepted files: IDX u8 images (magic 0x00000803, n x h x w) and labels
 * (0x00000801, n), raw or gzip; .npy v1/v2/v3, C order (Fortran order only
 * for 1-D labels and targets, the same bytes), little-endian:
 * images '|u1', '<f4' or '<f8' of shape (n, d), (n, h, w) or (n, c, h, w),
 * labels '|u1', '<i4' or '<i8' of shape (n), or regression targets '<f4' or
 * '<f8' of shape (n,) or (n, outputs). u8 pixels come out as x / 255.0f, f32
 * pixels and targets as they are, f64 ones (numpy's default float) rounded
 * to f32 as they are read, as `torch.from_numpy(a).float()` would (a note
 * on stderr says so once per file; nothing is converted ahead). Labels must
 * lie in [0, 256), targets be finite, in f32 too. A file whose magic is
 * neither format is described as the format its name claims (a *.npy as
 * .npy, anything else as IDX). A gzip stream is stopped at the first byte
 * past the size its header implies, so a small .gz cannot fill the
 * temporary directory. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "core/tensor.h"
#include "data/dataset.h"
#include "io/file.h"
#include "io/npy.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "f32 .npy pixels are read as they lie");

#define LABEL_LIMIT 256
#define GZ_CHUNK (64u << 10)

/* What a header says: element type, shape and where the elements start. */
typedef struct layout {
    int npy;        /* 0: IDX, 1: .npy */
    fr_dtype dtype; /* FR_U8, FR_F32, FR_I32 or FR_I64 */
    int f64;        /* '<f8' on disk: dtype is FR_F32, each value rounded as it is read */
    int ndim;
    int64_t d[4];
    uint64_t off;   /* byte of element 0 */
    uint64_t bytes; /* off + numel * element size: the file's exact length */
} layout;

typedef struct src {
    char *path; /* for messages */
    int fd;     /* the raw file, or the unlinked inflated temporary */
    layout L;
    uint64_t size;
} src;

struct fr_dataset {
    fr_ctx *ctx;
    src img, lab;
    int64_t n;
    int c, h, w;
    size_t sample; /* c * h * w */
    int classes;   /* class labels: max label + 1 */
    int outputs;   /* regression targets: values per sample; 0 for class labels */
};

static fr_status ffail(fr_ctx *ctx, const char *name, fr_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static fr_status ffail(fr_ctx *ctx, const char *name, fr_status st, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fr_fail(ctx, st, "%s: %s", name, msg);
}

static uint32_t be32(const unsigned char *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | b[3];
}

/* Bytes an element takes on disk, and the dtype's name as the file has it. */
static size_t disk_size(const layout *L) { return L->f64 ? 8 : fr_dtype_size(L->dtype); }
static const char *disk_name(const layout *L) { return L->f64 ? "f64" : fr_dtype_name(L->dtype); }

/* numel * element size + off, or an overflow fault. */
static fr_status layout_bytes(fr_ctx *ctx, const char *name, layout *L) {
    uint64_t b = disk_size(L);
    for (int k = 0; k < L->ndim; k++)
        if (__builtin_mul_overflow(b, (uint64_t)L->d[k], &b))
            return ffail(ctx, name, FR_ERR_FORMAT, "dimensions overflow 64 bits");
    if (__builtin_add_overflow(b, L->off, &L->bytes))
        return ffail(ctx, name, FR_ERR_FORMAT, "dimensions overflow 64 bits");
    return FR_OK;
}

/* ---- IDX ---------------------------------------------------------------- */

/* The header from the first `have` bytes of a file of `size` bytes. */
static fr_status idx_header(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                            layout *L) {
    memset(L, 0, sizeof *L);
    if (have < 4)
        return ffail(ctx, name, FR_ERR_FORMAT, "%zu bytes: too short for an IDX magic", have);
    uint32_t magic = be32(b);
    if (magic != 0x00000803 && magic != 0x00000801)
        return ffail(
            ctx, name, FR_ERR_FORMAT,
            "byte 0: IDX magic 0x%08x is not 0x00000803 (u8 images) or 0x00000801 (u8 labels)",
            magic);
    L->dtype = FR_U8;
    L->ndim = magic & 0xFF;
    L->off = 4 + 4 * (uint64_t)L->ndim;
    if (have < L->off)
        return ffail(ctx, name, FR_ERR_FORMAT, "%zu bytes: too short for a %d-dimension IDX header",
                     have, L->ndim);
    for (int k = 0; k < L->ndim; k++) L->d[k] = be32(b + 4 + 4 * k);
    return layout_bytes(ctx, name, L);
}

static fr_status size_fault(fr_ctx *ctx, const char *name, const layout *L, uint64_t size) {
    if (!L->npy && L->ndim == 3)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "expected %" PRIu64 " bytes for %" PRId64 "x%" PRId64 "x%" PRId64
                     " images, found %" PRIu64,
                     L->bytes, L->d[0], L->d[1], L->d[2], size);
    if (!L->npy)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "expected %" PRIu64 " bytes for %" PRId64 " labels, found %" PRIu64, L->bytes,
                     L->d[0], size);
    fr_shape s = {L->ndim, {L->d[0], L->d[1], L->d[2], L->d[3]}};
    char sh[96];
    return ffail(ctx, name, FR_ERR_FORMAT,
                 "expected %" PRIu64 " bytes for %s of shape %s, found %" PRIu64, L->bytes,
                 disk_name(L), fr_shape_str(&s, sh, sizeof sh), size);
}

/* ---- .npy --------------------------------------------------------------- */

/* The layout of a .npy from its first `have` bytes (io/npy.c parses the
 * header; the element types an array here may have are decided here). */
static fr_status npy_header(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                            layout *L) {
    memset(L, 0, sizeof *L);
    L->npy = 1;
    fr_npy h;
    fr_status st = fr_npy_parse(ctx, name, b, have, FR_NPY_HEADER_MAX, &h);
    if (st) return st;
    switch (h.type) {
    case FR_NPY_U1: L->dtype = FR_U8; break;
    case FR_NPY_F4: L->dtype = FR_F32; break;
    case FR_NPY_F8: L->dtype = FR_F32, L->f64 = 1; break;
    case FR_NPY_I4: L->dtype = FR_I32; break;
    case FR_NPY_I8: L->dtype = FR_I64; break;
    case FR_NPY_U2:
    case FR_NPY_OTHER:
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "byte %zu: unsupported dtype '%s' (supported: |u1, <f4, <f8, <i4, <i8)",
                     h.descr_at, h.descr);
    }
    L->ndim = h.ndim;
    for (int k = 0; k < h.ndim; k++) L->d[k] = h.shape[k];
    L->off = h.off;
    L->bytes = h.bytes;
    return FR_OK;
}

/* ---- either format ------------------------------------------------------ */

/* Whether path's name claims .npy: it ends in ".npy" or ".npy.gz". */
static int claims_npy(const char *path) {
    size_t n = strlen(path);
    if (n >= 3 && !strcmp(path + n - 3, ".gz")) n -= 3;
    return n >= 4 && !memcmp(path + n - 4, ".npy", 4);
}

static int idx_magic(const unsigned char *b, size_t have) {
    return have >= 4 && b[0] == 0 && b[1] == 0 && b[2] == 8 && (b[3] == 1 || b[3] == 3);
}

/* The header of either format from its first `have` bytes, told apart by
 * the magic; a magic of neither is a fault in the terms of the format the
 * name claims (a *.npy named as .npy, anything else as IDX). */
static fr_status any_header(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                            layout *L) {
    if ((have >= 6 && !memcmp(b, "\x93NUMPY", 6)) || (claims_npy(name) && !idx_magic(b, have)))
        return npy_header(ctx, name, b, have, L);
    return idx_header(ctx, name, b, have, L);
}

/* ---- roles -------------------------------------------------------------- */

static int is_images(const layout *L) {
    if (!L->npy) return L->ndim == 3;
    return (L->dtype == FR_U8 || L->dtype == FR_F32) && L->ndim >= 2 && L->ndim <= 4;
}

static int is_labels(const layout *L) {
    return L->ndim == 1 && L->dtype != FR_F32 && L->dtype != FR_F16 && L->dtype != FR_BF16;
}

/* Regression targets: f32 .npy of shape (n,) (one output) or (n, outputs). */
static int is_targets(const layout *L) {
    return L->npy && L->dtype == FR_F32 && (L->ndim == 1 || L->ndim == 2);
}

/* Decodes label k of a little-endian array of integers. */
static int64_t label_at(const unsigned char *b, fr_dtype dt) {
    if (dt == FR_U8) return b[0];
    if (dt == FR_I32) {
        uint32_t u = b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
        return (int32_t)u;
    }
    uint64_t u = 0;
    for (int k = 7; k >= 0; k--) u = u << 8 | b[k];
    return (int64_t)u;
}

/* Checks labels [first, first + count) held in b against [0, 256), and,
 * when classes > 0, against a model's [0, classes); updates *max. */
static fr_status check_labels(fr_ctx *ctx, const char *name, const unsigned char *b, int64_t first,
                              int64_t count, fr_dtype dt, int classes, int64_t *max) {
    size_t es = fr_dtype_size(dt);
    for (int64_t k = 0; k < count; k++) {
        int64_t v = label_at(b + (size_t)k * es, dt);
        if (v < 0 || v >= LABEL_LIMIT)
            return ffail(ctx, name, FR_ERR_FORMAT,
                         "label %" PRId64 " at index %" PRId64 " is out of range [0, %d)", v,
                         first + k, LABEL_LIMIT);
        if (classes > 0 && v >= classes)
            return ffail(ctx, name, FR_ERR_SHAPE,
                         "label %" PRId64 " at index %" PRId64
                         " is out of range for a model with %d classes",
                         v, first + k, classes);
        if (v > *max) *max = v;
    }
    return FR_OK;
}

/* Checks `count` f32 (f64: f64) targets held in b, value `first` onwards,
 * for NaN and infinities, and an f64 one for overflowing f32; a fault names
 * the sample (value / width) and the column. */
static fr_status check_targets(fr_ctx *ctx, const char *name, const unsigned char *b, int64_t first,
                               int64_t count, int64_t width, int f64) {
    for (int64_t k = 0; k < count; k++) {
        double v;
        float f;
        if (f64) {
            memcpy(&v, b + (size_t)k * 8, 8);
            f = (float)v;
        } else {
            memcpy(&f, b + (size_t)k * 4, 4);
            v = f;
        }
        if (!isfinite(v))
            return ffail(ctx, name, FR_ERR_FORMAT,
                         "target %g at index %" PRId64 " (column %" PRId64 ") is not finite", v,
                         (first + k) / width, (first + k) % width);
        if (!isfinite(f))
            return ffail(ctx, name, FR_ERR_FORMAT,
                         "f64 target %g at index %" PRId64 " (column %" PRId64
                         ") overflows float32",
                         v, (first + k) / width, (first + k) % width);
    }
    return FR_OK;
}

/* The per-sample shape of an images layout: (n, d) -> (1, 1, d),
 * (n, h, w) -> (1, h, w), (n, c, h, w) -> (c, h, w). */
static void sample_shape(const layout *L, int64_t *c, int64_t *h, int64_t *w) {
    *c = L->ndim == 4 ? L->d[1] : 1;
    *h = L->ndim >= 3 ? L->d[L->ndim - 2] : 1;
    *w = L->d[L->ndim - 1];
}

static int64_t target_width(const layout *L) { return L->ndim == 2 ? L->d[1] : 1; }

/* Images of per-sample shape (c, h, w) and dtype dt against what a model
 * takes: a flat input (h = w = 1) takes any sample of as many values;
 * otherwise (c, h, w) must match exactly. */
static fr_status images_fit(fr_ctx *ctx, const char *name, fr_dtype dt, int64_t c, int64_t h,
                            int64_t w, const fr_data_spec *spec) {
    if (dt != FR_U8 && dt != FR_F32)
        return ffail(ctx, name, FR_ERR_SHAPE, "images are %s; a model takes u8 or f32 pixels",
                     fr_dtype_name(dt));
    int flat = spec->h == 1 && spec->w == 1;
    int64_t n; /* values a sample; -1: more than 64 bits count (an empty IDX may say so) */
    if (__builtin_mul_overflow(c, h, &n) || __builtin_mul_overflow(n, w, &n)) n = -1;
    if (flat ? n != spec->c : c != spec->c || h != spec->h || w != spec->w) {
        if (flat)
            return ffail(ctx, name, FR_ERR_SHAPE,
                         "samples of %" PRId64 "x%" PRId64 "x%" PRId64 " hold %" PRId64
                         " values but the model takes %d",
                         c, h, w, n, spec->c);
        return ffail(ctx, name, FR_ERR_SHAPE,
                     "samples are %" PRId64 "x%" PRId64 "x%" PRId64 " but the model takes %dx%dx%d",
                     c, h, w, spec->c, spec->h, spec->w);
    }
    return FR_OK;
}

/* Class labels or targets (layout L) against what a model's loss needs. */
static fr_status kind_fits(fr_ctx *ctx, const char *name, const layout *L,
                           const fr_data_spec *spec) {
    if (is_labels(L) && spec->classes <= 0)
        return ffail(ctx, name, FR_ERR_SHAPE,
                     "holds class labels but the model's loss (mse) needs "
                     "float targets: a f32 .npy of shape (n, %d)",
                     spec->outputs);
    if (!is_labels(L) && spec->outputs <= 0) /* as torch's cross_entropy refuses float indices */
        return ffail(ctx, name, FR_ERR_SHAPE,
                     "holds float targets but the model's loss (cross_entropy) needs integer "
                     "class labels%s",
                     L->ndim == 1 ? ": save them with labels.astype(np.int64)" : "");
    if (!is_labels(L) && target_width(L) != spec->outputs)
        return ffail(ctx, name, FR_ERR_SHAPE,
                     "targets have %" PRId64 " values a sample but the "
                     "model has %d outputs",
                     target_width(L), spec->outputs);
    return FR_OK;
}

/* ---- checks on memory (fuzzers, tests) --------------------------------- */

static fr_status check_whole(fr_ctx *ctx, const char *name, const unsigned char *b, size_t len,
                             const layout *L, const fr_data_spec *spec, fr_data_role role) {
    if (L->bytes != len) return size_fault(ctx, name, L, len);
    if (!is_images(L) && !is_labels(L) && !is_targets(L)) {
        if (L->npy && L->dtype != FR_U8 && L->dtype != FR_F32)
            return ffail(ctx, name, FR_ERR_FORMAT,
                         "integer arrays are labels and need 1 dimension, not %d", L->ndim);
        return ffail(
            ctx, name, FR_ERR_FORMAT,
            "%d dimensions of %s are neither images (2 to 4 dims, u8 or f32), labels (1 dim, "
            "integer) nor targets (1 or 2 dims, f32)",
            L->ndim, disk_name(L));
    }
    int64_t max = -1;
    fr_status st = FR_OK;
    if (is_labels(L)) st = check_labels(ctx, name, b + L->off, 0, L->d[0], L->dtype, 0, &max);
    else if (is_targets(L) && (L->ndim == 1 || L->d[1] > 0))
        st = check_targets(ctx, name, b + L->off, 0, L->d[0] * target_width(L), target_width(L),
                           L->f64);
    if (st || !spec) return st;
    if (role == FR_ROLE_IMAGES) {
        if (!is_images(L))
            return ffail(ctx, name, FR_ERR_FORMAT, "holds labels or targets, not images");
        int64_t c, h, w;
        sample_shape(L, &c, &h, &w);
        return images_fit(ctx, name, L->dtype, c, h, w, spec);
    }
    if (!is_labels(L) && !is_targets(L))
        return ffail(ctx, name, FR_ERR_FORMAT, "holds images, not labels or targets");
    if ((st = kind_fits(ctx, name, L, spec))) return st;
    if (is_labels(L))
        return check_labels(ctx, name, b + L->off, 0, L->d[0], L->dtype, spec->classes, &max);
    return FR_OK;
}

fr_status fr_idx_check(fr_ctx *ctx, const char *name, const void *buf, size_t len) {
    return fr_idx_check_for(ctx, name, buf, len, NULL, FR_ROLE_IMAGES);
}

fr_status fr_npy_check(fr_ctx *ctx, const char *name, const void *buf, size_t len) {
    return fr_npy_check_for(ctx, name, buf, len, NULL, FR_ROLE_IMAGES);
}

fr_status fr_idx_check_for(fr_ctx *ctx, const char *name, const void *buf, size_t len,
                           const fr_data_spec *spec, fr_data_role role) {
    layout L;
    fr_status st = idx_header(ctx, name, buf, len, &L);
    return st ? st : check_whole(ctx, name, buf, len, &L, spec, role);
}

fr_status fr_npy_check_for(fr_ctx *ctx, const char *name, const void *buf, size_t len,
                           const fr_data_spec *spec, fr_data_role role) {
    layout L;
    fr_status st = npy_header(ctx, name, buf, len, &L);
    return st ? st : check_whole(ctx, name, buf, len, &L, spec, role);
}

/* ---- files -------------------------------------------------------------- */

static voidpf z_alloc(voidpf opaque, uInt items, uInt size) {
    if (size && items > SIZE_MAX / size) return Z_NULL;
    return fr_alloc((fr_ctx *)opaque, (size_t)items * size, FR_MEM_DATA);
}

static void z_free(voidpf opaque, voidpf p) { fr_free((fr_ctx *)opaque, p); }

/* How many leading bytes the header starting with b (have bytes of it seen)
 * needs before the file's implied size is known: 6 to tell the formats
 * apart, then the IDX magic and dimensions, or the .npy preamble and dict
 * (a dict longer than FR_NPY_HEADER_MAX is refused by fr_npy_parse itself). */
static size_t header_need(const unsigned char *b, size_t have) {
    if (have < 12) return 12; /* every valid header is longer */
    if (memcmp(b, "\x93NUMPY", 6)) return 4 + 4 * (size_t)b[3];
    return (size_t)fr_npy_header_bytes(b, have, FR_NPY_HEADER_MAX);
}

/* The size the header of an inflating stream implies, once enough of it is
 * there: the first `produced` bytes are in fd, the next `got` in out.
 * *limit stays 0 while the header is incomplete; a malformed header is
 * refused now, with the message the opener would give after inflating. */
static fr_status stream_limit(fr_ctx *ctx, const char *name, int fd, uint64_t produced,
                              const unsigned char *out, size_t got, uint64_t *limit, int *npy) {
    unsigned char head[12];
    uint64_t total = produced + got;
    size_t hn = total < sizeof head ? (size_t)total : sizeof head;
    size_t ff = produced < hn ? (size_t)produced : hn;
    if (ff && fr_pread_full(fd, head, ff, 0))
        return ffail(ctx, name, FR_ERR_IO, "cannot read back the inflated header");
    memcpy(head + ff, out, hn - ff);
    size_t need = header_need(head, hn);
    if (total < need) return FR_OK;
    unsigned char *hb = fr_alloc(ctx, need, FR_MEM_OTHER);
    if (!hb) return ffail(ctx, name, FR_ERR_NOMEM, "out of memory for the header");
    ff = produced < need ? (size_t)produced : need;
    if (ff && fr_pread_full(fd, hb, ff, 0)) {
        fr_free(ctx, hb);
        return ffail(ctx, name, FR_ERR_IO, "cannot read back the inflated header");
    }
    memcpy(hb + ff, out, need - ff);
    layout L;
    fr_status st = any_header(ctx, name, hb, need, &L);
    *npy = L.npy;
    fr_free(ctx, hb);
    if (!st) *limit = L.bytes;
    return st;
}

/* Inflates the gzip file in_fd into an unlinked temporary (in $TMPDIR or
 * /tmp) and returns its descriptor and length. zlib's memory comes from the
 * accounting allocator. Truncated, corrupt or trailing data is a fault, and
 * so is a byte past the size the header implies: inflation stops there, so
 * a small bomb never fills the temporary directory. */
static fr_status inflate_to_tmp(fr_ctx *ctx, const char *name, int in_fd, int *out_fd,
                                uint64_t *out_size) {
    const char *dir = getenv("TMPDIR");
    char tmpl[PATH_MAX];
    if (!dir || !*dir) dir = "/tmp";
    if ((size_t)snprintf(tmpl, sizeof tmpl, "%s/frugal-inflate-XXXXXX", dir) >= sizeof tmpl)
        return ffail(ctx, name, FR_ERR_IO, "temporary directory path too long");
    int fd = mkostemp(tmpl, O_CLOEXEC);
    if (fd < 0)
        return ffail(ctx, name, FR_ERR_IO,
                     "cannot create a temporary file in %s to inflate into: %s", dir,
                     strerror(errno));
    unlink(tmpl);

    fr_status st = FR_OK;
    unsigned char *in = fr_alloc(ctx, GZ_CHUNK, FR_MEM_DATA);
    unsigned char *out = in ? fr_alloc(ctx, GZ_CHUNK, FR_MEM_DATA) : NULL;
    z_stream zs;
    int zinit = 0, ended = 0;
    uint64_t consumed = 0, produced = 0, limit = 0; /* limit 0: header not complete yet */
    int npy = 0;
    memset(&zs, 0, sizeof zs);
    zs.zalloc = z_alloc;
    zs.zfree = z_free;
    zs.opaque = ctx;
    if (!out) {
        st = ffail(ctx, name, FR_ERR_NOMEM, "out of memory for the inflation buffers");
        goto done;
    }
    int zr = inflateInit2(&zs, 16 + MAX_WBITS); /* gzip wrapper only */
    if (zr != Z_OK) {
        st = zr == Z_MEM_ERROR ? ffail(ctx, name, FR_ERR_NOMEM, "out of memory starting zlib")
                               : ffail(ctx, name, FR_ERR_IO, "zlib cannot start: %d", zr);
        goto done;
    }
    zinit = 1;
    for (;;) {
        if (zs.avail_in == 0) {
            ssize_t r;
            do r = read(in_fd, in, GZ_CHUNK);
            while (r < 0 && errno == EINTR);
            if (r < 0) {
                st = ffail(ctx, name, FR_ERR_IO, "read failed at compressed byte %" PRIu64 ": %s",
                           consumed, strerror(errno));
                goto done;
            }
            if (r == 0) {
                if (!ended)
                    st = ffail(ctx, name, FR_ERR_FORMAT,
                               "truncated gzip stream: input ends after %" PRIu64
                               " compressed bytes (%" PRIu64 " inflated)",
                               consumed, produced);
                break;
            }
            zs.next_in = in;
            zs.avail_in = (uInt)r;
        }
        if (ended) {
            /* Another gzip member may follow (as gzip -c a b > c writes); anything else is garbage. */
            if (zs.next_in[0] != 0x1f || (zs.avail_in > 1 && zs.next_in[1] != 0x8b)) {
                st = ffail(ctx, name, FR_ERR_FORMAT,
                           "trailing bytes after the gzip stream at compressed byte %" PRIu64,
                           consumed);
                goto done;
            }
            inflateReset(&zs);
            ended = 0;
        }
        zs.next_out = out;
        zs.avail_out = GZ_CHUNK;
        uInt before = zs.avail_in;
        zr = inflate(&zs, Z_NO_FLUSH);
        consumed += before - zs.avail_in;
        size_t got = GZ_CHUNK - zs.avail_out;
        if (zr == Z_MEM_ERROR) {
            st = ffail(ctx, name, FR_ERR_NOMEM, "out of memory inflating the gzip stream");
            goto done;
        }
        if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) {
            st = ffail(ctx, name, FR_ERR_FORMAT,
                       "corrupt gzip stream near compressed byte %" PRIu64 ": %s", consumed,
                       zs.msg ? zs.msg : "inflate failed");
            goto done;
        }
        if (got && !limit && (st = stream_limit(ctx, name, fd, produced, out, got, &limit, &npy)))
            goto done;
        if (limit && produced + got > limit) {
            st = ffail(ctx, name, FR_ERR_FORMAT,
                       "inflates past the %" PRIu64 " bytes its %s header implies (stopped at "
                       "compressed byte %" PRIu64 ")",
                       limit, npy ? ".npy" : "IDX", consumed);
            goto done;
        }
        if (got) {
            const unsigned char *p = out;
            size_t left = got;
            while (left) {
                ssize_t w = write(fd, p, left);
                if (w < 0 && errno == EINTR) continue;
                if (w <= 0) {
                    st = ffail(ctx, name, FR_ERR_IO,
                               "cannot write the inflated copy into %s after %" PRIu64 " bytes: %s",
                               dir, produced, w < 0 ? strerror(errno) : "no progress");
                    goto done;
                }
                p += w;
                left -= (size_t)w;
            }
            produced += got;
        }
        if (zr == Z_STREAM_END) ended = 1;
    }
done:
    if (zinit) inflateEnd(&zs);
    fr_free(ctx, out);
    fr_free(ctx, in);
    if (st) {
        close(fd);
        return st;
    }
    *out_fd = fd;
    *out_size = produced;
    return FR_OK;
}

static void src_close(fr_ctx *ctx, src *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    fr_free(ctx, s->path);
    s->path = NULL;
}

/* Opens path (inflating a gzip file), parses its header and checks that its
 * length is exactly what the header implies. what: "images" or "labels". */
static fr_status src_open(fr_ctx *ctx, const char *path, const char *what, src *s) {
    s->fd = -1;
    s->path = fr_strdup(ctx, path, FR_MEM_OTHER);
    if (!s->path) return ffail(ctx, path, FR_ERR_NOMEM, "out of memory opening the file");
    int fd = fr_open_regular(ctx, path, what, &s->size);
    if (fd < 0) return FR_ERR_IO;
    s->fd = fd;

    unsigned char head[16];
    size_t have = s->size < sizeof head ? (size_t)s->size : sizeof head;
    if (fr_pread_full(fd, head, have, 0))
        return ffail(ctx, path, FR_ERR_IO, "cannot read the header: %s",
                     errno ? strerror(errno) : "short file");
    if (have >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
        int tfd;
        uint64_t tsize;
        fr_status st = inflate_to_tmp(ctx, path, fd, &tfd, &tsize);
        if (st) return st;
        close(fd);
        s->fd = fd = tfd;
        s->size = tsize;
        have = s->size < sizeof head ? (size_t)s->size : sizeof head;
        if (fr_pread_full(fd, head, have, 0))
            return ffail(ctx, path, FR_ERR_IO, "cannot read the inflated header: %s",
                         errno ? strerror(errno) : "short file");
    }

    fr_status st;
    if (have >= 6 && !memcmp(head, "\x93NUMPY", 6)) {
        /* Read the whole .npy header: preamble plus the dict's declared length. */
        uint64_t want = fr_npy_header_bytes(head, have, FR_NPY_HEADER_MAX);
        if (want > s->size) want = s->size;
        unsigned char *hb = fr_alloc(ctx, (size_t)want, FR_MEM_OTHER);
        if (!hb) return ffail(ctx, path, FR_ERR_NOMEM, "out of memory for the .npy header");
        if (fr_pread_full(fd, hb, (size_t)want, 0)) {
            fr_free(ctx, hb);
            return ffail(ctx, path, FR_ERR_IO, "cannot read the .npy header");
        }
        st = npy_header(ctx, path, hb, (size_t)want, &s->L);
        fr_free(ctx, hb);
    } else {
        st = any_header(ctx, path, head, have, &s->L);
    }
    if (st) return st;
    if (s->L.bytes != s->size) return size_fault(ctx, path, &s->L, s->size);
    return FR_OK;
}

/* Reads every label (or target) once in chunks: labels against [0, 256)
 * and, when classes > 0, a model's [0, classes), keeping the largest in
 * *max; targets for NaN and infinities. A fault names the index in the file. */
static fr_status scan_labels(fr_ctx *ctx, const src *s, int classes, int64_t *max) {
    unsigned char buf[8192];
    int targets = is_targets(&s->L);
    int64_t width = targets ? target_width(&s->L) : 1;
    size_t es = disk_size(&s->L);
    int64_t per = (int64_t)(sizeof buf / es), n = s->L.d[0] * width;
    for (int64_t k = 0; k < n; k += per) {
        int64_t m = n - k < per ? n - k : per;
        if (fr_pread_full(s->fd, buf, (size_t)m * es, s->L.off + (uint64_t)k * es))
            return ffail(ctx, s->path, FR_ERR_IO, "cannot read %s at index %" PRId64,
                         targets ? "targets" : "labels", k / width);
        fr_status st = targets ? check_targets(ctx, s->path, buf, k, m, width, s->L.f64)
                               : check_labels(ctx, s->path, buf, k, m, s->L.dtype, classes, max);
        if (st) return st;
    }
    return FR_OK;
}

void fr_dataset_close(fr_dataset *ds) {
    if (!ds) return;
    src_close(ds->ctx, &ds->img);
    src_close(ds->ctx, &ds->lab);
    fr_free(ds->ctx, ds);
}

fr_dataset *fr_dataset_open(fr_ctx *ctx, const char *images, const char *labels) {
    fr_dataset *ds = fr_calloc(ctx, sizeof *ds, FR_MEM_OTHER);
    if (!ds) return NULL;
    ds->ctx = ctx;
    ds->img.fd = ds->lab.fd = -1;
    if (src_open(ctx, images, "images", &ds->img)) goto fail;
    const layout *I = &ds->img.L;
    if (!is_images(I)) {
        if (!I->npy)
            ffail(ctx, images, FR_ERR_FORMAT, "IDX magic 0x00000801 holds labels, not images");
        else
            ffail(ctx, images, FR_ERR_FORMAT,
                  "images must be u8, f32 or f64 with 2 to 4 dimensions, not %s with %d",
                  disk_name(I), I->ndim);
        goto fail;
    }
    int64_t c, h, w;
    sample_shape(I, &c, &h, &w);
    if (I->d[0] == 0 || c == 0 || h == 0 || w == 0) {
        ffail(ctx, images, FR_ERR_FORMAT, "no samples or an empty sample shape");
        goto fail;
    }
    if (c > INT_MAX / h || c * h > INT_MAX / w) {
        ffail(ctx, images, FR_ERR_FORMAT,
              "a sample of %" PRId64 "x%" PRId64 "x%" PRId64 " is too large", c, h, w);
        goto fail;
    }
    ds->n = I->d[0];
    ds->c = (int)c, ds->h = (int)h, ds->w = (int)w;
    ds->sample = (size_t)(c * h * w);

    if (src_open(ctx, labels, "labels", &ds->lab)) goto fail;
    const layout *Y = &ds->lab.L;
    if (!is_labels(Y) && !is_targets(Y)) {
        if (!Y->npy)
            ffail(ctx, labels, FR_ERR_FORMAT, "IDX magic 0x00000803 holds images, not labels");
        else
            ffail(
                ctx, labels, FR_ERR_FORMAT,
                "labels must be integers of shape (n) or f32 targets of shape (n) or (n, outputs), "
                "not %s with %d dimensions",
                disk_name(Y), Y->ndim);
        goto fail;
    }
    if (Y->d[0] != ds->n) {
        ffail(ctx, labels, FR_ERR_FORMAT, "%" PRId64 " %s for %" PRId64 " images in %s", Y->d[0],
              is_labels(Y) ? "labels" : "targets", ds->n, images);
        goto fail;
    }
    if (is_targets(Y) && (target_width(Y) < 1 || target_width(Y) > INT_MAX / 4)) {
        ffail(ctx, labels, FR_ERR_FORMAT, "targets of %" PRId64 " values a sample",
              target_width(Y));
        goto fail;
    }
    int64_t max = -1;
    if (scan_labels(ctx, &ds->lab, 0, &max)) goto fail;
    ds->classes = (int)max + 1;
    ds->outputs = is_targets(Y) ? (int)target_width(Y) : 0;
    /* what torch.from_numpy(a).float() does, said once per file */
    if (I->f64) fprintf(stderr, "%s: float64 converted to float32 on load\n", images);
    if (Y->f64 && strcmp(images, labels) != 0)
        fprintf(stderr, "%s: float64 converted to float32 on load\n", labels);
    return ds;
fail:
    fr_dataset_close(ds);
    return NULL;
}

/* dir/name, or dir/name.gz when gz and only that exists; 0 when neither
 * exists, -1 when the path is too long. */
static int find_file(const char *dir, const char *name, int gz, char *out) {
    int len = snprintf(out, PATH_MAX, "%s/%s", dir, name);
    if (len < 0 || len + 3 >= PATH_MAX) return -1;
    if (access(out, F_OK) == 0) return 1;
    if (!gz) return 0;
    strcat(out, ".gz");
    return access(out, F_OK) == 0;
}

fr_dataset *fr_dataset_open_dir(fr_ctx *ctx, const char *dir, const char *split) {
    /* Candidates in order: images, then labels or targets; gz: may end in .gz. */
    static const struct {
        const char *suffix;
        int gz, labels;
    } names[] = {{"images-idx3-ubyte", 1, 0},
                 {"images.npy", 0, 0},
                 {"labels-idx1-ubyte", 1, 1},
                 {"labels.npy", 0, 1},
                 {"targets.npy", 0, 1}};
    char found[2][PATH_MAX], p[PATH_MAX];
    int have[2] = {0, 0};
    for (size_t k = 0; k < sizeof names / sizeof names[0]; k++) {
        char name[64];
        snprintf(name, sizeof name, "%s-%s", split, names[k].suffix);
        int r = find_file(dir, name, names[k].gz, p);
        if (r < 0) {
            fr_fail(ctx, FR_ERR_ARG, "%s: path too long", dir);
            return NULL;
        }
        if (!r) continue;
        int role = names[k].labels;
        if (have[role]) {
            fr_fail(ctx, FR_ERR_ARG, "%s: both %s and %s exist for the %s split: keep one", dir,
                    found[role], p, split);
            return NULL;
        }
        memcpy(found[role], p, sizeof p);
        have[role] = 1;
    }
    if (!have[0] || !have[1]) {
        if (!have[0])
            fr_fail(ctx, FR_ERR_IO,
                    "%s: no %s images: looked for %s-images-idx3-ubyte[.gz] and "
                    "%s-images.npy",
                    dir, split, split, split);
        else
            fr_fail(ctx, FR_ERR_IO,
                    "%s: no %s labels for %s: looked for %s-labels-idx1-ubyte[.gz], "
                    "%s-labels.npy (classes) and %s-targets.npy (float targets)",
                    dir, split, found[0], split, split, split);
        return NULL;
    }
    return fr_dataset_open(ctx, found[0], found[1]);
}

fr_dataset *fr_dataset_open_split(fr_ctx *ctx, const char *dir, const char *split,
                                  const char *images, const char *labels) {
    if (images || labels) {
        if (!images || !labels) {
            fr_fail(ctx, FR_ERR_ARG, "the %s split needs both an images and a labels file", split);
            return NULL;
        }
        return fr_dataset_open(ctx, images, labels);
    }
    return fr_dataset_open_dir(ctx, dir, split);
}

int64_t fr_dataset_len(const fr_dataset *ds) { return ds->n; }

void fr_dataset_sample_shape(const fr_dataset *ds, int *c, int *h, int *w) {
    if (c) *c = ds->c;
    if (h) *h = ds->h;
    if (w) *w = ds->w;
}

int fr_dataset_classes(const fr_dataset *ds) { return ds->classes; }
int fr_dataset_outputs(const fr_dataset *ds) { return ds->outputs; }
const char *fr_dataset_images_path(const fr_dataset *ds) { return ds->img.path; }
const char *fr_dataset_labels_path(const fr_dataset *ds) { return ds->lab.path; }
fr_dtype fr_dataset_dtype(const fr_dataset *ds) { return ds->img.L.dtype; }

fr_status fr_dataset_check(fr_ctx *ctx, const fr_dataset *ds, const fr_data_spec *spec) {
    fr_status st = images_fit(ctx, ds->img.path, ds->img.L.dtype, ds->c, ds->h, ds->w, spec);
    if (st || (st = kind_fits(ctx, ds->lab.path, &ds->lab.L, spec))) return st;
    if (!ds->outputs && ds->classes > spec->classes) { /* find the first label past the model's */
        int64_t max = -1;
        if ((st = scan_labels(ctx, &ds->lab, spec->classes, &max))) return st;
        return ffail(ctx, ds->lab.path, FR_ERR_IO,
                     "label %d seen at open but not on a second read: "
                     "the file changed",
                     ds->classes - 1);
    }
    return FR_OK;
}

/* n f64 values at file position off into out as f32, through a buffer on
 * the stack: the conversion takes no memory that grows with the data. */
static int pread_f64(int fd, float *out, size_t n, uint64_t off) {
    double buf[512];
    for (size_t k = 0; k < n;) {
        size_t m = n - k < 512 ? n - k : 512;
        if (fr_pread_full(fd, buf, m * 8, off + (uint64_t)k * 8)) return -1;
        for (size_t j = 0; j < m; j++) out[k + j] = (float)buf[j];
        k += m;
    }
    return 0;
}

/* fr_dataset_read with the message written to err instead of the context,
 * so the loader's prefetch thread never touches ctx->err. */
fr_status fr_dataset_read_r(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y,
                            float *t, char *err, size_t errlen) {
    size_t xb = ds->sample * disk_size(&ds->img.L), yb = disk_size(&ds->lab.L);
    if (ds->outputs) {
        yb *= (size_t)ds->outputs;
        y = NULL;
    } else {
        t = NULL;
    }
    for (int i = 0; i < n; i++) {
        int64_t k = idx[i];
        if (k < 0 || k >= ds->n) {
            snprintf(err, errlen, "%s: sample index %" PRId64 " out of range [0, %" PRId64 ")",
                     ds->img.path, k, ds->n);
            return FR_ERR_ARG;
        }
        if (x) {
            float *xs = x + (size_t)i * ds->sample;
            uint64_t at = ds->img.L.off + (uint64_t)k * xb;
            if (ds->img.L.f64 ? pread_f64(ds->img.fd, xs, ds->sample, at)
                              : fr_pread_full(ds->img.fd, xs, xb, at)) {
                snprintf(err, errlen, "%s: cannot read sample %" PRId64 ": %s", ds->img.path, k,
                         errno ? strerror(errno) : "file shrank");
                return FR_ERR_IO;
            }
            if (ds->img.L.dtype == FR_U8) {
                /* The bytes lie at the start of the sample's floats; widen
                 * from the end so no byte is overwritten before it is read. */
                const unsigned char *b = (const unsigned char *)xs;
                for (size_t j = ds->sample; j-- > 0;) xs[j] = (float)b[j] / 255.0f;
            }
        }
        if (t) {
            float *ts = t + (size_t)i * (size_t)ds->outputs;
            uint64_t at = ds->lab.L.off + (uint64_t)k * yb;
            if (ds->lab.L.f64 ? pread_f64(ds->lab.fd, ts, (size_t)ds->outputs, at)
                              : fr_pread_full(ds->lab.fd, ts, yb, at)) {
                snprintf(err, errlen, "%s: cannot read the targets at index %" PRId64 ": %s",
                         ds->lab.path, k, errno ? strerror(errno) : "file shrank");
                return FR_ERR_IO;
            }
            for (int j = 0; j < ds->outputs; j++)
                if (!isfinite(ts[j])) {
                    snprintf(err, errlen,
                             "%s: target at index %" PRId64 " (column %d) changed on disk "
                             "to %g",
                             ds->lab.path, k, j, (double)ts[j]);
                    return FR_ERR_FORMAT;
                }
        }
        if (y) {
            unsigned char b[8];
            if (fr_pread_full(ds->lab.fd, b, yb, ds->lab.L.off + (uint64_t)k * yb)) {
                snprintf(err, errlen, "%s: cannot read label %" PRId64 ": %s", ds->lab.path, k,
                         errno ? strerror(errno) : "file shrank");
                return FR_ERR_IO;
            }
            int64_t v = label_at(b, ds->lab.L.dtype);
            if (v < 0 || v >= ds->classes) {
                snprintf(err, errlen,
                         "%s: label %" PRId64 " at index %" PRId64
                         " changed on disk: out of range [0, %d)",
                         ds->lab.path, v, k, ds->classes);
                return FR_ERR_FORMAT;
            }
            y[i] = (int32_t)v;
        }
    }
    return FR_OK;
}

fr_status fr_dataset_read(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y,
                          float *t) {
    char err[FR_ERR_LEN];
    fr_status st = fr_dataset_read_r(ds, idx, n, x, y, t, err, sizeof err);
    return st ? fr_fail(ds->ctx, st, "%s", err) : FR_OK;
}
