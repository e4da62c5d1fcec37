/* dataset.c — IDX and NumPy .npy datasets read lazily from disk (see
 * dataset.h). Owns the two header parsers, the size and label checks done
 * once at open, the inflation of a .gz into an unlinked temporary file, and
 * reading samples with pread. It keeps no sample in memory: a dataset holds
 * two file descriptors and its shapes. Shuffling and batching are loader.c's.
 *
 * Accepted files: IDX u8 images (magic 0x00000803, n x h x w) and labels
 * (0x00000801, n), raw or gzip; .npy v1/v2/v3, C order, little-endian:
 * images '|u1' or '<f4' of shape (n, d), (n, h, w) or (n, c, h, w), labels
 * '|u1', '<i4' or '<i8' of shape (n). u8 pixels come out as x / 255.0f, f32
 * pixels as they are. Labels must lie in [0, 256). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include "core/tensor.h"
#include "data/dataset.h"

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "f32 .npy pixels are read as they lie");

#define LABEL_LIMIT 256
#define NPY_HEADER_MAX (1u << 20)
#define GZ_CHUNK (64u << 10)

/* What a header says: element type, shape and where the elements start. */
typedef struct layout {
    int npy;         /* 0: IDX, 1: .npy */
    fr_dtype dtype;  /* FR_U8, FR_F32, FR_I32 or FR_I64 */
    int ndim;
    int64_t d[4];
    uint64_t off;    /* byte of element 0 */
    uint64_t bytes;  /* off + numel * element size: the file's exact length */
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
    int classes;
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

/* numel * element size + off, or an overflow fault. */
static fr_status layout_bytes(fr_ctx *ctx, const char *name, layout *L) {
    uint64_t b = fr_dtype_size(L->dtype);
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
    if (have < 4) return ffail(ctx, name, FR_ERR_FORMAT, "%zu bytes: too short for an IDX magic", have);
    uint32_t magic = be32(b);
    if (magic != 0x00000803 && magic != 0x00000801)
        return ffail(ctx, name, FR_ERR_FORMAT,
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
    return ffail(ctx, name, FR_ERR_FORMAT, "expected %" PRIu64 " bytes for %s of shape %s, found %" PRIu64,
                 L->bytes, fr_dtype_name(L->dtype), fr_shape_str(&s, sh, sizeof sh), size);
}

/* ---- .npy --------------------------------------------------------------- */

typedef struct pyscan {
    fr_ctx *ctx;
    const char *name;
    const unsigned char *s;
    size_t n, i, base; /* base: file position of s[0] */
} pyscan;

static fr_status perr(pyscan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fr_status perr(pyscan *p, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fr_fail(p->ctx, FR_ERR_FORMAT, "%s: byte %zu: %s", p->name, p->base + p->i, msg);
}

static void pws(pyscan *p) {
    while (p->i < p->n && (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' ||
                           p->s[p->i] == '\r'))
        p->i++;
}

static int ppeek(pyscan *p) { return p->i < p->n ? p->s[p->i] : -1; }

/* A quoted Python string literal without escapes. */
static fr_status pstring(pyscan *p, char *out, size_t cap) {
    pws(p);
    int q = ppeek(p);
    if (q != '\'' && q != '"') return perr(p, "expected a quoted string in the header dict");
    size_t len = 0, start = p->i++;
    for (;;) {
        int c = ppeek(p);
        if (c < 0) {
            p->i = start;
            return perr(p, "unterminated string in the header dict");
        }
        p->i++;
        if (c == q) break;
        if (c == '\\' || c < 0x20 || c >= 0x7F) {
            p->i--;
            return perr(p, "unexpected character 0x%02x in a header string", (unsigned)c);
        }
        if (len + 1 >= cap) {
            p->i = start;
            return perr(p, "string longer than %zu bytes in the header dict", cap - 1);
        }
        out[len++] = (char)c;
    }
    out[len] = 0;
    return FR_OK;
}

static int pword(pyscan *p, const char *w) {
    size_t k = strlen(w);
    if (p->i + k > p->n || memcmp(p->s + p->i, w, k)) return 0;
    int c = p->i + k < p->n ? p->s[p->i + k] : ' ';
    if (c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return 0;
    p->i += k;
    return 1;
}

/* (a, b, ...) of non-negative integers; a one-element tuple needs its comma. */
static fr_status pshape(pyscan *p, layout *L) {
    pws(p);
    if (ppeek(p) != '(') return perr(p, "'shape' is not a tuple");
    p->i++;
    int commas = 0;
    L->ndim = 0;
    for (;;) {
        pws(p);
        int c = ppeek(p);
        if (c == ')') {
            p->i++;
            break;
        }
        if (c == '-') return perr(p, "negative dimension in 'shape'");
        if (c < '0' || c > '9') return perr(p, "expected a dimension or ')' in 'shape'");
        if (L->ndim == 4) return perr(p, "'shape' has more than 4 dimensions");
        if (c == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
            return perr(p, "dimension with a leading zero in 'shape'");
        uint64_t v = 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
            unsigned d = p->s[p->i] - '0';
            if (v > ((uint64_t)INT64_MAX - d) / 10) return perr(p, "dimension too large in 'shape'");
            v = v * 10 + d;
            p->i++;
        }
        if (ppeek(p) == 'L') p->i++; /* Python 2 longs, as old numpy wrote them */
        L->d[L->ndim++] = (int64_t)v;
        pws(p);
        c = ppeek(p);
        if (c == ',') {
            p->i++;
            commas++;
        } else if (c != ')') {
            return perr(p, "expected ',' or ')' in 'shape'");
        }
    }
    if (L->ndim == 1 && commas == 0) return perr(p, "'shape' (n) is not a tuple: write (n,)");
    return FR_OK;
}

/* The magic, version, header length and dict from the first `have` bytes. */
static fr_status npy_header(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                            layout *L) {
    memset(L, 0, sizeof *L);
    L->npy = 1;
    if (have < 10 || memcmp(b, "\x93NUMPY", 6))
        return ffail(ctx, name, FR_ERR_FORMAT, "byte 0: not a .npy file (no \\x93NUMPY magic)");
    if (b[6] < 1 || b[6] > 3 || b[7] != 0)
        return ffail(ctx, name, FR_ERR_FORMAT, "byte 6: unsupported .npy version %u.%u", b[6], b[7]);
    size_t pre = b[6] == 1 ? 10 : 12;
    if (have < pre) return ffail(ctx, name, FR_ERR_FORMAT, "%zu bytes: .npy preamble cut short", have);
    uint32_t hl = b[8] | (uint32_t)b[9] << 8;
    if (b[6] > 1) hl |= (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    if (hl > NPY_HEADER_MAX)
        return ffail(ctx, name, FR_ERR_FORMAT, "byte 8: header length %u exceeds %u", hl, NPY_HEADER_MAX);
    if (have < pre + hl)
        return ffail(ctx, name, FR_ERR_FORMAT, "byte 8: header length %u runs past the end (%zu bytes)",
                     hl, have);
    L->off = pre + hl;

    pyscan p = {ctx, name, b + pre, hl, 0, pre};
    fr_status st;
    int have_descr = 0, have_fortran = 0, have_shape = 0;
    pws(&p);
    if (ppeek(&p) != '{') return perr(&p, "expected '{' to open the header dict");
    p.i++;
    for (;;) {
        pws(&p);
        if (ppeek(&p) == '}') {
            p.i++;
            break;
        }
        char key[32], val[32];
        size_t at = p.i;
        if ((st = pstring(&p, key, sizeof key))) return st;
        pws(&p);
        if (ppeek(&p) != ':') return perr(&p, "expected ':' after '%s'", key);
        p.i++;
        pws(&p);
        if (!strcmp(key, "descr")) {
            if (have_descr++) return perr(&p, "duplicate 'descr'");
            size_t vat = p.i;
            if (ppeek(&p) != '\'' && ppeek(&p) != '"')
                return perr(&p, "'descr' is not a simple dtype string (structured arrays are not supported)");
            if ((st = pstring(&p, val, sizeof val))) return st;
            static const struct { const char *descr; fr_dtype dt; } known[] = {
                {"|u1", FR_U8}, {"<f4", FR_F32}, {"<i4", FR_I32}, {"<i8", FR_I64}};
            int found = 0;
            for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
                if (!strcmp(val, known[k].descr)) L->dtype = known[k].dt, found = 1;
            if (!found) {
                p.i = vat;
                if (val[0] == '>')
                    return perr(&p, "big-endian dtype '%s' is not supported", val);
                return perr(&p, "unsupported dtype '%s' (supported: |u1, <f4, <i4, <i8)", val);
            }
        } else if (!strcmp(key, "fortran_order")) {
            if (have_fortran++) return perr(&p, "duplicate 'fortran_order'");
            if (pword(&p, "True")) {
                p.i -= 4;
                return perr(&p, "fortran_order True is not supported (save a C-ordered array)");
            }
            if (!pword(&p, "False")) return perr(&p, "'fortran_order' is not True or False");
        } else if (!strcmp(key, "shape")) {
            if (have_shape++) return perr(&p, "duplicate 'shape'");
            if ((st = pshape(&p, L))) return st;
        } else {
            p.i = at;
            return perr(&p, "unknown key '%s' in the header dict", key);
        }
        pws(&p);
        int c = ppeek(&p);
        if (c == ',') {
            p.i++;
            continue;
        }
        if (c == '}') {
            p.i++;
            break;
        }
        return perr(&p, "expected ',' or '}' in the header dict");
    }
    pws(&p);
    if (p.i != p.n) return perr(&p, "unexpected characters after the header dict");
    if (!have_descr || !have_fortran || !have_shape)
        return ffail(ctx, name, FR_ERR_FORMAT, "header dict lacks '%s'",
                     !have_descr ? "descr" : !have_fortran ? "fortran_order" : "shape");
    return layout_bytes(ctx, name, L);
}

/* ---- roles -------------------------------------------------------------- */

static int is_images(const layout *L) {
    if (!L->npy) return L->ndim == 3;
    return (L->dtype == FR_U8 || L->dtype == FR_F32) && L->ndim >= 2 && L->ndim <= 4;
}

static int is_labels(const layout *L) {
    return L->ndim == 1 && L->dtype != FR_F32 && L->dtype != FR_F16 && L->dtype != FR_BF16;
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

/* Checks labels [first, first + count) held in b; updates *max. */
static fr_status check_labels(fr_ctx *ctx, const char *name, const unsigned char *b, int64_t first,
                              int64_t count, fr_dtype dt, int64_t *max) {
    size_t es = fr_dtype_size(dt);
    for (int64_t k = 0; k < count; k++) {
        int64_t v = label_at(b + (size_t)k * es, dt);
        if (v < 0 || v >= LABEL_LIMIT)
            return ffail(ctx, name, FR_ERR_FORMAT, "label %" PRId64 " at index %" PRId64
                         " is out of range [0, %d)", v, first + k, LABEL_LIMIT);
        if (v > *max) *max = v;
    }
    return FR_OK;
}

/* ---- checks on memory (fuzzers, tests) --------------------------------- */

static fr_status check_whole(fr_ctx *ctx, const char *name, const unsigned char *b, size_t len,
                             const layout *L) {
    if (L->bytes != len) return size_fault(ctx, name, L, len);
    if (!is_images(L) && !is_labels(L)) {
        if (L->npy && L->dtype != FR_U8 && L->dtype != FR_F32)
            return ffail(ctx, name, FR_ERR_FORMAT, "integer arrays are labels and need 1 dimension, not %d",
                         L->ndim);
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "%d dimensions of %s are neither images (2 to 4 dims, u8 or f32) nor labels (1 dim, integer)",
                     L->ndim, fr_dtype_name(L->dtype));
    }
    int64_t max = -1;
    if (is_labels(L)) return check_labels(ctx, name, b + L->off, 0, L->d[0], L->dtype, &max);
    return FR_OK;
}

fr_status fr_idx_check(fr_ctx *ctx, const char *name, const void *buf, size_t len) {
    layout L;
    fr_status st = idx_header(ctx, name, buf, len, &L);
    return st ? st : check_whole(ctx, name, buf, len, &L);
}

fr_status fr_npy_check(fr_ctx *ctx, const char *name, const void *buf, size_t len) {
    layout L;
    fr_status st = npy_header(ctx, name, buf, len, &L);
    return st ? st : check_whole(ctx, name, buf, len, &L);
}

/* ---- files -------------------------------------------------------------- */

static int pread_full(int fd, void *buf, size_t n, uint64_t off) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0; /* end of file */
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

static voidpf z_alloc(voidpf opaque, uInt items, uInt size) {
    if (size && items > SIZE_MAX / size) return Z_NULL;
    return fr_alloc((fr_ctx *)opaque, (size_t)items * size, FR_MEM_DATA);
}

static void z_free(voidpf opaque, voidpf p) { fr_free((fr_ctx *)opaque, p); }

/* Inflates the gzip file in_fd into an unlinked temporary (in $TMPDIR or
 * /tmp) and returns its descriptor and length. zlib's memory comes from the
 * accounting allocator. Truncated, corrupt or trailing data is a fault. */
static fr_status inflate_to_tmp(fr_ctx *ctx, const char *name, int in_fd, int *out_fd,
                                uint64_t *out_size) {
    const char *dir = getenv("TMPDIR");
    char tmpl[PATH_MAX];
    if (!dir || !*dir) dir = "/tmp";
    if ((size_t)snprintf(tmpl, sizeof tmpl, "%s/frugal-inflate-XXXXXX", dir) >= sizeof tmpl)
        return ffail(ctx, name, FR_ERR_IO, "temporary directory path too long");
    int fd = mkostemp(tmpl, O_CLOEXEC);
    if (fd < 0)
        return ffail(ctx, name, FR_ERR_IO, "cannot create a temporary file in %s to inflate into: %s",
                     dir, strerror(errno));
    unlink(tmpl);

    fr_status st = FR_OK;
    unsigned char *in = fr_alloc(ctx, GZ_CHUNK, FR_MEM_DATA);
    unsigned char *out = in ? fr_alloc(ctx, GZ_CHUNK, FR_MEM_DATA) : NULL;
    z_stream zs;
    int zinit = 0, ended = 0;
    uint64_t consumed = 0, produced = 0;
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
                           "trailing bytes after the gzip stream at compressed byte %" PRIu64, consumed);
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
            st = ffail(ctx, name, FR_ERR_FORMAT, "corrupt gzip stream near compressed byte %" PRIu64 ": %s",
                       consumed, zs.msg ? zs.msg : "inflate failed");
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
                               "cannot write the inflated copy into %s after %" PRIu64 " bytes: %s", dir,
                               produced, w < 0 ? strerror(errno) : "no progress");
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
 * length is exactly what the header implies. */
static fr_status src_open(fr_ctx *ctx, const char *path, src *s) {
    s->fd = -1;
    s->path = fr_strdup(ctx, path, FR_MEM_OTHER);
    if (!s->path) return ffail(ctx, path, FR_ERR_NOMEM, "out of memory opening the file");
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return ffail(ctx, path, FR_ERR_IO, "cannot open: %s", strerror(errno));
    s->fd = fd;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return ffail(ctx, path, FR_ERR_IO, "not a regular file");
    s->size = (uint64_t)sb.st_size;

    unsigned char head[16];
    size_t have = s->size < sizeof head ? (size_t)s->size : sizeof head;
    if (pread_full(fd, head, have, 0))
        return ffail(ctx, path, FR_ERR_IO, "cannot read the header: %s", errno ? strerror(errno) : "short file");
    if (have >= 2 && head[0] == 0x1f && head[1] == 0x8b) {
        int tfd;
        uint64_t tsize;
        fr_status st = inflate_to_tmp(ctx, path, fd, &tfd, &tsize);
        if (st) return st;
        close(fd);
        s->fd = fd = tfd;
        s->size = tsize;
        have = s->size < sizeof head ? (size_t)s->size : sizeof head;
        if (pread_full(fd, head, have, 0))
            return ffail(ctx, path, FR_ERR_IO, "cannot read the inflated header: %s",
                         errno ? strerror(errno) : "short file");
    }

    fr_status st;
    if (have >= 6 && !memcmp(head, "\x93NUMPY", 6)) {
        /* Read the whole .npy header: preamble plus the dict's declared length. */
        size_t pre = head[6] == 1 ? 10 : 12;
        uint64_t hl = have >= pre ? (uint64_t)(head[8] | (uint32_t)head[9] << 8) : 0;
        if (have >= pre && pre == 12) hl |= (uint64_t)head[10] << 16 | (uint64_t)head[11] << 24;
        uint64_t want = pre + hl;
        if (want > s->size) want = s->size;
        if (want > pre + NPY_HEADER_MAX) want = pre + NPY_HEADER_MAX;
        unsigned char *hb = fr_alloc(ctx, (size_t)want, FR_MEM_OTHER);
        if (!hb) return ffail(ctx, path, FR_ERR_NOMEM, "out of memory for the .npy header");
        if (pread_full(fd, hb, (size_t)want, 0)) {
            fr_free(ctx, hb);
            return ffail(ctx, path, FR_ERR_IO, "cannot read the .npy header");
        }
        st = npy_header(ctx, path, hb, (size_t)want, &s->L);
        fr_free(ctx, hb);
    } else {
        st = idx_header(ctx, path, head, have, &s->L);
    }
    if (st) return st;
    if (s->L.bytes != s->size) return size_fault(ctx, path, &s->L, s->size);
    return FR_OK;
}

/* Reads every label once in chunks: range [0, 256) and the largest. */
static fr_status scan_labels(fr_ctx *ctx, const src *s, int64_t *max) {
    unsigned char buf[8192];
    size_t es = fr_dtype_size(s->L.dtype);
    int64_t per = (int64_t)(sizeof buf / es), n = s->L.d[0];
    for (int64_t k = 0; k < n; k += per) {
        int64_t m = n - k < per ? n - k : per;
        if (pread_full(s->fd, buf, (size_t)m * es, s->L.off + (uint64_t)k * es))
            return ffail(ctx, s->path, FR_ERR_IO, "cannot read labels at index %" PRId64, k);
        fr_status st = check_labels(ctx, s->path, buf, k, m, s->L.dtype, max);
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
    if (src_open(ctx, images, &ds->img)) goto fail;
    const layout *I = &ds->img.L;
    if (!is_images(I)) {
        if (!I->npy)
            ffail(ctx, images, FR_ERR_FORMAT, "IDX magic 0x00000801 holds labels, not images");
        else
            ffail(ctx, images, FR_ERR_FORMAT,
                  "images must be u8 or f32 with 2 to 4 dimensions, not %s with %d",
                  fr_dtype_name(I->dtype), I->ndim);
        goto fail;
    }
    int64_t c = 1, h = 1, w = I->d[I->ndim - 1];
    if (I->ndim >= 3) h = I->d[I->ndim - 2];
    if (I->ndim == 4) c = I->d[1];
    if (I->d[0] == 0 || c == 0 || h == 0 || w == 0) {
        ffail(ctx, images, FR_ERR_FORMAT, "no samples or an empty sample shape");
        goto fail;
    }
    if (c > INT_MAX / h || c * h > INT_MAX / w) {
        ffail(ctx, images, FR_ERR_FORMAT, "a sample of %" PRId64 "x%" PRId64 "x%" PRId64 " is too large",
              c, h, w);
        goto fail;
    }
    ds->n = I->d[0];
    ds->c = (int)c, ds->h = (int)h, ds->w = (int)w;
    ds->sample = (size_t)(c * h * w);

    if (src_open(ctx, labels, &ds->lab)) goto fail;
    const layout *Y = &ds->lab.L;
    if (!is_labels(Y)) {
        if (!Y->npy)
            ffail(ctx, labels, FR_ERR_FORMAT, "IDX magic 0x00000803 holds images, not labels");
        else
            ffail(ctx, labels, FR_ERR_FORMAT, "labels must be integers with 1 dimension, not %s with %d",
                  fr_dtype_name(Y->dtype), Y->ndim);
        goto fail;
    }
    if (Y->d[0] != ds->n) {
        ffail(ctx, labels, FR_ERR_FORMAT, "%" PRId64 " labels for %" PRId64 " images in %s", Y->d[0],
              ds->n, images);
        goto fail;
    }
    int64_t max = -1;
    if (scan_labels(ctx, &ds->lab, &max)) goto fail;
    ds->classes = (int)max + 1;
    return ds;
fail:
    fr_dataset_close(ds);
    return NULL;
}

fr_dataset *fr_dataset_open_dir(fr_ctx *ctx, const char *dir, const char *split) {
    char img[PATH_MAX], lab[PATH_MAX];
    const char *kinds[2] = {"images-idx3", "labels-idx1"};
    char *out[2] = {img, lab};
    for (int k = 0; k < 2; k++) {
        int len = snprintf(out[k], PATH_MAX, "%s/%s-%s-ubyte", dir, split, kinds[k]);
        if (len < 0 || len + 3 >= PATH_MAX) {
            fr_fail(ctx, FR_ERR_ARG, "%s: path too long", dir);
            return NULL;
        }
        if (access(out[k], F_OK) != 0) {
            strcat(out[k], ".gz");
            if (access(out[k], F_OK) != 0) {
                out[k][len] = 0;
                fr_fail(ctx, FR_ERR_IO, "%s: neither %s nor %s.gz exists", dir, out[k], out[k]);
                return NULL;
            }
        }
    }
    return fr_dataset_open(ctx, img, lab);
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

/* fr_dataset_read with the message written to err instead of the context,
 * so the loader's prefetch thread never touches ctx->err. Not in dataset.h:
 * loader.c declares it. */
fr_status fr_dataset_read_r(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y, char *err,
                            size_t errlen);
fr_status fr_dataset_read_r(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y, char *err,
                            size_t errlen) {
    size_t xb = ds->sample * fr_dtype_size(ds->img.L.dtype), yb = fr_dtype_size(ds->lab.L.dtype);
    for (int i = 0; i < n; i++) {
        int64_t k = idx[i];
        if (k < 0 || k >= ds->n) {
            snprintf(err, errlen, "%s: sample index %" PRId64 " out of range [0, %" PRId64 ")",
                     ds->img.path, k, ds->n);
            return FR_ERR_ARG;
        }
        if (x) {
            float *xs = x + (size_t)i * ds->sample;
            if (pread_full(ds->img.fd, xs, xb, ds->img.L.off + (uint64_t)k * xb)) {
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
        if (y) {
            unsigned char b[8];
            if (pread_full(ds->lab.fd, b, yb, ds->lab.L.off + (uint64_t)k * yb)) {
                snprintf(err, errlen, "%s: cannot read label %" PRId64 ": %s", ds->lab.path, k,
                         errno ? strerror(errno) : "file shrank");
                return FR_ERR_IO;
            }
            int64_t v = label_at(b, ds->lab.L.dtype);
            if (v < 0 || v >= ds->classes) {
                snprintf(err, errlen, "%s: label %" PRId64 " at index %" PRId64
                         " changed on disk: out of range [0, %d)", ds->lab.path, v, k, ds->classes);
                return FR_ERR_FORMAT;
            }
            y[i] = (int32_t)v;
        }
    }
    return FR_OK;
}

fr_status fr_dataset_read(fr_dataset *ds, const int64_t *idx, int n, float *x, int32_t *y) {
    char err[FR_ERR_LEN];
    fr_status st = fr_dataset_read_r(ds, idx, n, x, y, err, sizeof err);
    return st ? fr_fail(ds->ctx, st, "%s", err) : FR_OK;
}
