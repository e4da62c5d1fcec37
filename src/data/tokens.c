/* tokens.c — token streams for language models (see tokens.h). Owns the
 * walk of a source (file, directory, glob) into an index of pieces (one per
 * non-empty file: its descriptor, element type, byte of token 0 and place in
 * the stream), the llm.c shard header parser, which .npy element types a
 * token file takes (io/npy.c parses the .npy header), reads of a window
 * across pieces with pread, the id check, the split, and the token loader
 * (window permutation, batch slots, prefetch thread: loader.c's pattern).
 * It keeps no token in memory beyond the loader's batch slots. The image
 * datasets (IDX, image .npy) are dataset.c's. */
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "data/loader.h"
#include "data/prefetch.h"
#include "data/tokens.h"
#include "io/file.h"
#include "io/npy.h"

#define NPY_TOKEN_HEADER_MAX 4096 /* a 1-D array's dict is about 80 bytes */
#define WALK_DEPTH_MAX 64
#define CHECK_CHUNK 4096 /* tokens a chunk of fr_tokens_check */

/* ---- element types (decoded byte by byte: little-endian on any host) ---- */

typedef enum elem { E_U8, E_U16, E_I32, E_I64 } elem;

static const unsigned elem_size[] = {1, 2, 4, 8}; /* bytes, by elem */

/* A file's tokens: n elements of type e from byte off of fd. */
typedef struct piece {
    char *path;
    int fd;
    elem e;
    uint64_t off;  /* byte of token 0 */
    int64_t first; /* stream position of token 0 */
    int64_t n;
} piece;

struct fr_tokens {
    fr_ctx *ctx;
    char *path; /* as given to open: for messages about the whole stream */
    fr_tokens_kind kind;
    piece *p; /* the non-empty files, in stream order */
    size_t np, cap;
    int files; /* files read, empty ones included */
    int64_t len;
    int vocab_hint;
};

static const char *kind_name(fr_tokens_kind k) {
    return k == FR_TOKENS_TEXT ? "text" : k == FR_TOKENS_SHARDS ? "llm.c shard" : ".npy";
}

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

static uint32_t le32(const unsigned char *b) {
    return b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* ---- llm.c shards ------------------------------------------------------- */

/* The header of a shard of `size` bytes from its first `have` bytes
 * (have >= min(size, 1024)): the token count in *n, or the first fault. */
static fr_status shard_header(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                              uint64_t size, int64_t *n) {
    if (have >= 4 && (int32_t)le32(b) != FR_SHARD_MAGIC)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "byte 0: magic %" PRId32 " is not llm.c's shard magic %d", (int32_t)le32(b),
                     FR_SHARD_MAGIC);
    if (have < FR_SHARD_HEADER_BYTES)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "truncated header: %" PRIu64 " bytes, a shard header is %d", size,
                     FR_SHARD_HEADER_BYTES);
    if ((int32_t)le32(b + 4) != FR_SHARD_VERSION)
        return ffail(ctx, name, FR_ERR_FORMAT, "byte 4: version %" PRId32 " is not %d",
                     (int32_t)le32(b + 4), FR_SHARD_VERSION);
    int32_t count = (int32_t)le32(b + 8);
    if (count < 0)
        return ffail(ctx, name, FR_ERR_FORMAT, "byte 8: token count %" PRId32 " is negative",
                     count);
    uint64_t want = FR_SHARD_HEADER_BYTES + 2 * (uint64_t)count;
    if (size < want)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "truncated: the header counts %" PRId32 " tokens (%" PRIu64
                     " bytes) but the file has %" PRIu64 " bytes (%" PRIu64 " whole tokens)",
                     count, want, size, (size - FR_SHARD_HEADER_BYTES) / 2);
    if (size > want)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "%" PRIu64 " trailing bytes: the header counts %" PRId32 " tokens (%" PRIu64
                     " bytes) but the file has %" PRIu64 " bytes",
                     size - want, count, want, size);
    *n = count;
    return FR_OK;
}

fr_status fr_shard_check(fr_ctx *ctx, const char *name, const void *buf, size_t len) {
    int64_t n;
    return shard_header(ctx, name, buf, len, len, &n);
}

/* ---- token .npy --------------------------------------------------------- */

/* The header of a token .npy of `size` bytes from its first `have` bytes
 * (io/npy.c parses it; the element types and the rank are checked here):
 * element type, byte of token 0 and count, or the first fault. */
static fr_status npy_header(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                            uint64_t size, elem *e, uint64_t *off, int64_t *n) {
    fr_npy h;
    fr_status st = fr_npy_parse(ctx, name, b, have, NPY_TOKEN_HEADER_MAX, &h);
    if (st) return st;
    switch (h.type) {
    case FR_NPY_U1: *e = E_U8; break;
    case FR_NPY_U2: *e = E_U16; break;
    case FR_NPY_I4: *e = E_I32; break;
    case FR_NPY_I8: *e = E_I64; break;
    case FR_NPY_F4:
    case FR_NPY_F8:
    case FR_NPY_OTHER:
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "dtype '%s'%s: token ids are integers ('|u1', '<u2', '<i4' or '<i8')", h.descr,
                     h.descr[0] && h.descr[1] == 'f' ? " holds floats" : " is not supported");
    }
    if (h.ndim != 1)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "the array has %d dimensions: token ids are a 1-D array (n,)", h.ndim);
    *off = h.off;
    *n = h.shape[0];
    if (size != h.bytes)
        return ffail(ctx, name, FR_ERR_FORMAT,
                     "%s: %" PRId64 " tokens of %s need %" PRIu64 " bytes, the file has %" PRIu64,
                     size < h.bytes ? "truncated" : "trailing bytes", *n, h.descr, h.bytes, size);
    return FR_OK;
}

/* Token k of a little-endian array of type e at b. */
static int64_t elem_at(const unsigned char *b, elem e, int64_t k) {
    switch (e) {
    case E_U8: return b[k];
    case E_U16: return b[2 * k] | b[2 * k + 1] << 8;
    case E_I32: return (int32_t)le32(b + 4 * k);
    case E_I64: return (int64_t)((uint64_t)le32(b + 8 * k + 4) << 32 | le32(b + 8 * k));
    }
    return -1;
}

fr_status fr_token_npy_check(fr_ctx *ctx, const char *name, const void *buf, size_t len) {
    elem e;
    uint64_t off;
    int64_t n;
    fr_status st = npy_header(ctx, name, buf, len, len, &e, &off, &n);
    if (st) return st;
    const unsigned char *b = (const unsigned char *)buf + off;
    for (int64_t k = 0; k < n; k++) {
        int64_t v = elem_at(b, e, k);
        if (v < 0 || v > INT32_MAX)
            return ffail(ctx, name, FR_ERR_FORMAT,
                         "token %" PRId64 " (byte %" PRIu64 "): id %" PRId64
                         " is not in [0, 2^31 - 1]",
                         k, off + (uint64_t)k * elem_size[e], v);
    }
    return FR_OK;
}

/* ---- opening a source --------------------------------------------------- */

static int ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && !strcmp(s + n - k, suffix);
}

/* By extension first (a .bin is a shard, so a bad magic is reported as
 * one), then by content. */
static fr_tokens_kind kind_of(const char *path, const unsigned char *head, size_t have) {
    if (ends_with(path, ".bin")) return FR_TOKENS_SHARDS;
    if (ends_with(path, ".npy")) return FR_TOKENS_NPY;
    if (have >= 6 && !memcmp(head, "\x93NUMPY", 6)) return FR_TOKENS_NPY;
    if (have >= 4 && (int32_t)le32(head) == FR_SHARD_MAGIC) return FR_TOKENS_SHARDS;
    return FR_TOKENS_TEXT;
}

/* Opens one file, parses its header and appends it to the index. */
static fr_status add_file(fr_tokens *t, const char *path) {
    fr_ctx *ctx = t->ctx;
    if (t->files >= FR_TOKENS_MAX_FILES)
        return ffail(ctx, t->path, FR_ERR_ARG,
                     "more than %d files (each keeps a descriptor open): join them into fewer",
                     FR_TOKENS_MAX_FILES);
    uint64_t size;
    int fd = fr_open_regular(ctx, path, "token file", &size);
    if (fd < 0) return FR_ERR_IO;
    /* Enough for a shard header and for a token .npy's whole preamble and dict. */
    unsigned char head[NPY_TOKEN_HEADER_MAX + 12];
    _Static_assert(sizeof head >= FR_SHARD_HEADER_BYTES, "a shard header fits");
    size_t have = size < sizeof head ? (size_t)size : sizeof head;
    fr_status st = FR_OK;
    if (fr_pread_full(fd, head, have, 0)) {
        st = ffail(ctx, path, FR_ERR_IO, "cannot read the header: %s",
                   errno ? strerror(errno) : "the file shrank");
        goto fail;
    }
    fr_tokens_kind kind = kind_of(path, head, have);
    if (t->files > 0 && kind != t->kind) {
        st =
            ffail(ctx, path, FR_ERR_FORMAT, "a %s file among %s files (from %s): one kind a source",
                  kind_name(kind), kind_name(t->kind), t->np ? t->p[0].path : t->path);
        goto fail;
    }
    piece pc = {NULL, fd, E_U8, 0, t->len, (int64_t)size};
    if (kind == FR_TOKENS_SHARDS) {
        pc.e = E_U16;
        pc.off = FR_SHARD_HEADER_BYTES;
        st = shard_header(ctx, path, head, have, size, &pc.n);
    } else if (kind == FR_TOKENS_NPY) {
        st = npy_header(ctx, path, head, have, size, &pc.e, &pc.off, &pc.n);
    }
    if (st) goto fail;
    t->kind = kind;
    t->files++;
    if (pc.n == 0) {
        close(fd);
        return FR_OK;
    }
    if (pc.n > INT64_MAX - t->len) {
        st = ffail(ctx, path, FR_ERR_FORMAT, "the stream's length overflows 64 bits");
        goto fail;
    }
    if (fr_grow(ctx, (void **)&t->p, &t->cap, t->np + 1, sizeof *t->p, FR_MEM_OTHER) ||
        !(pc.path = fr_strdup(ctx, path, FR_MEM_OTHER))) {
        st = ffail(ctx, path, FR_ERR_NOMEM, "out of memory indexing the file");
        goto fail;
    }
    t->p[t->np++] = pc;
    t->len += pc.n;
    return FR_OK;
fail:
    close(fd);
    return st;
}

static fr_status add_path(fr_tokens *t, const char *path, int depth);

static int cmp_names(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Every entry of dir in byte order of names: directories walked in place,
 * regular files added; dot names, *.dat and the rest (symlinks, FIFOs,
 * sockets, devices) skipped. */
static fr_status add_dir(fr_tokens *t, const char *dir, int depth) {
    fr_ctx *ctx = t->ctx;
    if (depth > WALK_DEPTH_MAX)
        return ffail(ctx, dir, FR_ERR_ARG, "directories nest deeper than %d", WALK_DEPTH_MAX);
    DIR *d = opendir(dir);
    if (!d) return ffail(ctx, dir, FR_ERR_IO, "cannot open the directory: %s", strerror(errno));
    char **names = NULL;
    size_t n = 0, cap = 0;
    fr_status st = FR_OK;
    struct dirent *de;
    for (;;) {
        errno = 0;
        if (!(de = readdir(d))) {
            if (errno) st = ffail(ctx, dir, FR_ERR_IO, "cannot list: %s", strerror(errno));
            break;
        }
        if (de->d_name[0] == '.' || ends_with(de->d_name, ".dat")) continue;
        if (fr_grow(ctx, (void **)&names, &cap, n + 1, sizeof *names, FR_MEM_OTHER) ||
            !(names[n] = fr_strdup(ctx, de->d_name, FR_MEM_OTHER))) {
            st = ffail(ctx, dir, FR_ERR_NOMEM, "out of memory listing the directory");
            break;
        }
        n++;
    }
    closedir(d);
    if (!st && n > 1) qsort(names, n, sizeof *names, cmp_names);
    size_t dl = strlen(dir);
    for (size_t k = 0; k < n && !st; k++) {
        size_t len = dl + 1 + strlen(names[k]) + 1;
        char *p = fr_alloc(ctx, len, FR_MEM_OTHER);
        if (!p) {
            st = ffail(ctx, dir, FR_ERR_NOMEM, "out of memory walking the directory");
            break;
        }
        snprintf(p, len, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", names[k]);
        struct stat sb;
        if (lstat(p, &sb) != 0) st = ffail(ctx, p, FR_ERR_IO, "cannot stat: %s", strerror(errno));
        else if (S_ISDIR(sb.st_mode)) st = add_path(t, p, depth + 1);
        else if (S_ISREG(sb.st_mode)) st = add_file(t, p);
        fr_free(ctx, p);
    }
    for (size_t k = 0; k < n; k++) fr_free(ctx, names[k]);
    fr_free(ctx, names);
    return st;
}

static fr_status add_path(fr_tokens *t, const char *path, int depth) {
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) return add_dir(t, path, depth);
    return add_file(t, path);
}

static fr_status add_glob(fr_tokens *t, const char *pattern) {
    glob_t g;
    int r = glob(pattern, 0, NULL, &g);
    if (r != 0) {
        globfree(&g); /* it holds what was matched before the fault, if anything */
        if (r == GLOB_NOMATCH)
            return ffail(t->ctx, pattern, FR_ERR_IO, "the pattern matches no file");
        return ffail(t->ctx, pattern, r == GLOB_NOSPACE ? FR_ERR_NOMEM : FR_ERR_IO,
                     "glob(3) failed while matching (%s)",
                     r == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
    }
    fr_status st = FR_OK;
    for (size_t k = 0; k < g.gl_pathc && !st; k++) st = add_path(t, g.gl_pathv[k], 0);
    globfree(&g);
    return st;
}

fr_tokens *fr_tokens_open(fr_ctx *ctx, const char *path) {
    fr_tokens *t = fr_calloc(ctx, sizeof *t, FR_MEM_OTHER);
    if (!t) return NULL;
    t->ctx = ctx;
    if (!(t->path = fr_strdup(ctx, path, FR_MEM_OTHER))) {
        ffail(ctx, path, FR_ERR_NOMEM, "out of memory opening the token source");
        goto fail;
    }
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    fr_status st = !exists && strpbrk(path, "*?[") ? add_glob(t, path) : add_path(t, path, 0);
    if (st) goto fail;
    if (t->files == 0) {
        ffail(ctx, path, FR_ERR_IO,
              "no files to read (directories are walked recursively; names starting with '.', "
              "*.dat and symlinks are skipped)");
        goto fail;
    }
    if (t->len == 0) {
        ffail(ctx, path, FR_ERR_FORMAT, "%d file%s but no tokens", t->files,
              t->files == 1 ? "" : "s");
        goto fail;
    }
    t->vocab_hint = t->kind == FR_TOKENS_TEXT ? 256 : 0;
    return t;
fail:
    fr_tokens_close(t);
    return NULL;
}

void fr_tokens_close(fr_tokens *t) {
    if (!t) return;
    for (size_t k = 0; k < t->np; k++) {
        close(t->p[k].fd);
        fr_free(t->ctx, t->p[k].path);
    }
    fr_free(t->ctx, t->p);
    fr_free(t->ctx, t->path);
    fr_free(t->ctx, t);
}

int64_t fr_tokens_len(const fr_tokens *t) { return t->len; }
fr_tokens_kind fr_tokens_get_kind(const fr_tokens *t) { return t->kind; }
int fr_tokens_files(const fr_tokens *t) { return t->files; }
int fr_tokens_vocab_hint(const fr_tokens *t) { return t->vocab_hint; }

/* ---- reading ------------------------------------------------------------ */

/* The piece holding stream position pos (0 <= pos < len). */
static size_t find_piece(const fr_tokens *t, int64_t pos) {
    size_t lo = 0, hi = t->np; /* p[lo].first <= pos < p[hi].first */
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->p[mid].first <= pos) lo = mid;
        else hi = mid;
    }
    return lo;
}

/* "path: token k (byte b)": where stream position pos lies. */
static void where(const fr_tokens *t, int64_t pos, char *buf, size_t len) {
    const piece *p = &t->p[find_piece(t, pos)];
    int64_t k = pos - p->first;
    snprintf(buf, len, "%s: token %" PRId64 " (byte %" PRIu64 ")", p->path, k,
             p->off + (uint64_t)k * elem_size[p->e]);
}

/* Tokens [k, k + m) of piece p into out. u1 and u2 bytes are read into out
 * itself and widened from the end (element j's bytes lie at or before
 * out[j]'s, so none is overwritten before it is read); i4 as it lies; i8
 * through a small buffer on the stack. */
static fr_status read_piece(const piece *p, int64_t k, int64_t m, int32_t *out, char *err,
                            size_t errlen) {
    unsigned es = elem_size[p->e];
    unsigned char stage[2048];
    int64_t step = es == 8 ? (int64_t)(sizeof stage / 8) : m;
    for (int64_t d = 0; d < m; d += step) {
        int64_t c = m - d < step ? m - d : step;
        unsigned char *b = es == 8 ? stage : (unsigned char *)(out + d);
        uint64_t off = p->off + (uint64_t)(k + d) * es;
        if (fr_pread_full(p->fd, b, (size_t)c * es, off)) {
            snprintf(err, errlen, "%s: cannot read tokens %" PRId64 "..%" PRId64 ": %s", p->path,
                     k + d, k + d + c, errno ? strerror(errno) : "the file shrank");
            return FR_ERR_IO;
        }
        for (int64_t j = c; j-- > 0;) {
            int64_t v = elem_at(b, p->e, j);
            if (v < 0 || v > INT32_MAX) {
                snprintf(err, errlen,
                         "%s: token %" PRId64 " (byte %" PRIu64 "): id %" PRId64
                         " is not in [0, 2^31 - 1]",
                         p->path, k + d + j, off + (uint64_t)j * es, v);
                return FR_ERR_FORMAT;
            }
            out[d + j] = (int32_t)v;
        }
    }
    return FR_OK;
}

fr_status fr_tokens_read(fr_tokens *t, int64_t start, int n, int32_t *out, char *err,
                         size_t errlen) {
    if (n < 0 || start < 0 || start > t->len - n) {
        snprintf(err, errlen,
                 "%s: tokens [%" PRId64 ", %" PRId64 ") outside the %" PRId64 " of the stream",
                 t->path, start, start + n, t->len);
        return FR_ERR_ARG;
    }
    int64_t done = 0;
    for (size_t i = n ? find_piece(t, start) : 0; done < n; i++) {
        const piece *p = &t->p[i];
        int64_t k = start + done - p->first, m = p->n - k;
        if (m > n - done) m = n - done;
        fr_status st = read_piece(p, k, m, out + done, err, errlen);
        if (st) return st;
        done += m;
    }
    return FR_OK;
}

fr_status fr_tokens_check(fr_ctx *ctx, fr_tokens *t, int vocab, int T) {
    if (vocab < 1 || T < 1)
        return fr_fail(ctx, FR_ERR_ARG, "%s: a check needs vocab >= 1 and T >= 1 (got %d and %d)",
                       t->path, vocab, T);
    if (t->len < (int64_t)T + 1)
        return ffail(ctx, t->path, FR_ERR_SHAPE,
                     "%" PRId64
                     " tokens in %d file%s; one window of T = %d needs at least %" PRId64,
                     t->len, t->files, t->files == 1 ? "" : "s", T, (int64_t)T + 1);
    if (t->kind == FR_TOKENS_TEXT && vocab >= 256) return FR_OK; /* bytes: all below 256 */
    int32_t buf[CHECK_CHUNK];
    char err[FR_ERR_LEN];
    int32_t max = 0;
    for (int64_t pos = 0; pos < t->len; pos += CHECK_CHUNK) {
        int n = t->len - pos < CHECK_CHUNK ? (int)(t->len - pos) : CHECK_CHUNK;
        fr_status st = fr_tokens_read(t, pos, n, buf, err, sizeof err);
        if (st) return fr_fail(ctx, st, "%s", err);
        for (int j = 0; j < n; j++) {
            if (buf[j] >= vocab) {
                where(t, pos + j, err, sizeof err);
                return fr_fail(ctx, FR_ERR_FORMAT,
                               "%s, stream position %" PRId64 ": id %" PRId32
                               " is not below the vocabulary size %d",
                               err, pos + j, buf[j], vocab);
            }
            if (buf[j] > max) max = buf[j];
        }
    }
    if (t->kind != FR_TOKENS_TEXT) t->vocab_hint = max < INT32_MAX ? max + 1 : 0;
    return FR_OK;
}

fr_status fr_tokens_split(fr_ctx *ctx, const fr_tokens *t, double val_fraction, int T,
                          fr_token_split *out) {
    if (!(val_fraction >= 0 && val_fraction < 1) || T < 1)
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: a split needs val_fraction in [0, 1) and T >= 1 (got %g and %d)",
                       t->path, val_fraction, T);
    int64_t n_val = (int64_t)((double)t->len * val_fraction), need = (int64_t)T + 1;
    if (n_val > t->len) n_val = t->len;
    out->n_val = n_val;
    out->n_train = t->len - n_val;
    if (out->n_train < need)
        return ffail(ctx, t->path, FR_ERR_ARG,
                     "the training part holds %" PRId64 " of %" PRId64
                     " tokens (val_fraction %g); one window of T = %d needs %" PRId64,
                     out->n_train, t->len, val_fraction, T, need);
    if (val_fraction > 0 && n_val < need)
        return ffail(ctx, t->path, FR_ERR_ARG,
                     "the validation part holds %" PRId64 " = floor(%" PRId64 " * %g) tokens; one "
                     "window of T = %d needs %" PRId64 ": raise val_fraction or lower T",
                     n_val, t->len, val_fraction, T, need);
    return FR_OK;
}

/* ---- the token loader ---------------------------------------------------- */

struct fr_token_loader {
    fr_ctx *ctx;
    fr_tokens *t;
    fr_token_loader_opts o;
    int64_t nw;             /* windows in the part */
    int64_t nb;             /* batches an epoch */
    int nslots;             /* queue + 1 */
    int first, n;           /* this rank's windows of each whole batch: [first, first + n) */
    int last_n, last_first; /* and of the last batch, a partial one under keep_last */
    int rows;               /* windows a slot holds: B, or ceil(B/ranks) */
    size_t slot;            /* int32 a slot: x (rows*T, and one past it), then y (rows*T) */
    int32_t *buf;           /* nslots * slot (DATA) */
    int64_t *perm;          /* nw window indices (OTHER); NULL without shuffle */
    fr_prefetch pf;
};

static int32_t *slot_x(const fr_token_loader *l, int64_t k) {
    return l->buf + (size_t)(k % l->nslots) * l->slot;
}

static int32_t *slot_y(const fr_token_loader *l, int64_t k) {
    return slot_x(l, k) + (size_t)l->rows * (size_t)l->o.T + 1;
}

/* Fills batch k (this rank's slice): row r is window w = perm[k*B + first + r]
 * (or k*B + first + r), its T + 1
 * tokens read into x from row r on (the last spills into row r + 1's first
 * place, or the spare one past x, until row r + 1 is read over it), and y's
 * row r copied from x's one place on. */
/* this rank's windows of batch k: [*first, *first + n) of the batch */
static int batch_rows(const fr_token_loader *l, int64_t k, int *first) {
    int last = k == l->nb - 1;
    *first = last ? l->last_first : l->first;
    return last ? l->last_n : l->n;
}

static fr_status fill(void *user, int64_t k, char *err, size_t errlen) {
    fr_token_loader *l = user;
    int B = l->o.batch, T = l->o.T, first, n = batch_rows(l, k, &first);
    int32_t *x = slot_x(l, k), *y = slot_y(l, k);
    for (int r = 0; r < n; r++) {
        int64_t i = k * B + first + r, w = l->perm ? l->perm[i] : i;
        int64_t s = l->o.begin + w * T;
        int32_t *row = x + (size_t)r * T;
        fr_status st = fr_tokens_read(l->t, s, T + 1, row, err, errlen);
        if (st) return st;
        if (l->o.vocab > 0)
            for (int j = 0; j <= T; j++)
                if (row[j] >= l->o.vocab) {
                    char pos[FR_ERR_LEN - 128];
                    where(l->t, s + j, pos, sizeof pos);
                    snprintf(err, errlen,
                             "%s: id %" PRId32 " is not below the vocabulary size %d: the file "
                             "changed on disk since it was checked",
                             pos, row[j], l->o.vocab);
                    return FR_ERR_FORMAT;
                }
        memcpy(y + (size_t)r * T, row + 1, (size_t)T * sizeof *row);
    }
    return FR_OK;
}

/* windows a slot holds: the largest slice of a batch, ceil(B/ranks) */
static int slot_rows(const fr_token_loader_opts *o) {
    return o->ranks > 1 ? (o->batch + o->ranks - 1) / o->ranks : o->batch;
}

/* Windows in o's part, or -1 for options new() refuses on their own
 * (before the stream's length is known); *slot_bytes the bytes of the
 * (queue + 1) slots. */
static int64_t plan_sizes(const fr_token_loader_opts *o, size_t *slot_bytes) {
    if (!o || o->batch < 1 || o->T < 1 || o->T == INT_MAX || o->queue < 0 || o->vocab < 0 ||
        o->begin < 0 || o->end <= o->begin || o->ranks < 0 ||
        (o->ranks > 0 && (o->rank < 0 || o->rank >= o->ranks)))
        return -1;
    size_t bt, slot, all;
    if (__builtin_mul_overflow((size_t)slot_rows(o), (size_t)o->T, &bt) ||
        __builtin_mul_overflow(bt, (size_t)2, &slot) || __builtin_add_overflow(slot, 1, &slot) ||
        __builtin_mul_overflow(slot, (size_t)o->queue + 1, &all) ||
        __builtin_mul_overflow(all, sizeof(int32_t), &all))
        return -1;
    *slot_bytes = all;
    return (o->end - o->begin - 1) / o->T;
}

size_t fr_token_loader_reserved(const fr_token_loader_opts *o) {
    size_t slots;
    int64_t nw = plan_sizes(o, &slots);
    if (nw < 0) return 0;
    return fr_mem_block_bytes(sizeof(fr_token_loader)) +
           (o->shuffle ? fr_mem_block_bytes((size_t)nw * sizeof(int64_t)) : 0) +
           fr_mem_block_bytes(slots);
}

/* batch k as next() hands it out (fr_batches_next's form: n windows, idx, y) */
static void view(void *user, int64_t k, fr_batch *out) {
    const fr_token_loader *l = user;
    int first;
    memset(out, 0, sizeof *out);
    out->n = batch_rows(l, k, &first);
    out->idx = slot_x(l, k);
    out->y = slot_y(l, k);
}

fr_token_loader *fr_token_loader_new(fr_ctx *ctx, fr_tokens *t, const fr_token_loader_opts *o) {
    size_t slots;
    int64_t nw = plan_sizes(o, &slots);
    if (!t || nw < 0) {
        fr_fail(ctx, FR_ERR_ARG,
                "token loader: bad options (batch %d, T %d, queue %d, vocab %d, part [%" PRId64
                ", %" PRId64 "), rank %d of %d)",
                o ? o->batch : 0, o ? o->T : 0, o ? o->queue : 0, o ? o->vocab : 0,
                o ? o->begin : 0, o ? o->end : 0, o ? o->rank : 0, o ? o->ranks : 0);
        return NULL;
    }
    if (o->end > t->len) {
        ffail(ctx, t->path, FR_ERR_ARG,
              "the part [%" PRId64 ", %" PRId64 ") runs past the stream's %" PRId64 " tokens",
              o->begin, o->end, t->len);
        return NULL;
    }
    if (nw < o->batch) {
        ffail(ctx, t->path, FR_ERR_ARG,
              "the part [%" PRId64 ", %" PRId64 ") of %" PRId64 " tokens holds %" PRId64
              " window%s of T = %d (each needs T + 1 tokens), fewer than a batch of %d",
              o->begin, o->end, o->end - o->begin, nw, nw == 1 ? "" : "s", o->T, o->batch);
        return NULL;
    }
    fr_token_loader *l = fr_calloc(ctx, sizeof *l, FR_MEM_OTHER);
    if (!l) return NULL;
    l->ctx = ctx;
    l->t = t;
    l->o = *o;
    l->nw = nw;
    l->nb = o->keep_last ? (nw + o->batch - 1) / o->batch : nw / o->batch;
    l->nslots = o->queue + 1;
    l->n = fr_loader_slice(o->batch, o->rank, o->ranks, &l->first);
    /* the last batch: whole, or under keep_last the windows left over,
     * sliced over the ranks as a batch of that size (a rank may get none) */
    l->last_n = l->n, l->last_first = l->first;
    if (o->keep_last)
        l->last_n =
            fr_loader_slice((int)(nw - (l->nb - 1) * o->batch), o->rank, o->ranks, &l->last_first);
    l->rows = slot_rows(o);
    l->slot = 2 * (size_t)l->rows * (size_t)o->T + 1;
    if (o->shuffle && !(l->perm = fr_alloc(ctx, (size_t)nw * sizeof *l->perm, FR_MEM_OTHER)))
        goto fail;
    if (!(l->buf = fr_alloc(ctx, slots, FR_MEM_DATA))) goto fail;
    if (fr_prefetch_init(&l->pf, ctx, "token loader", o->queue, fill, view, l)) goto fail;
    return l;
fail:
    fr_token_loader_free(l);
    return NULL;
}

void fr_token_loader_free(fr_token_loader *l) {
    if (!l) return;
    fr_prefetch_destroy(&l->pf);
    fr_ctx *ctx = l->ctx;
    fr_free(ctx, l->buf);
    fr_free(ctx, l->perm);
    fr_free(ctx, l);
}

void fr_token_loader_set_hand(fr_token_loader *l, fr_hand_fn hand, void *user, int lag) {
    fr_prefetch_set_hand(&l->pf, hand, user, lag);
}

int64_t fr_token_loader_num_windows(const fr_token_loader *l) { return l->nw; }
int64_t fr_token_loader_num_batches(const fr_token_loader *l) { return l->nb; }

fr_status fr_token_loader_start(fr_token_loader *l, int epoch, int64_t skip) {
    l->pf.started = 0;
    if (epoch < 0 || skip < 0 || skip > l->nb)
        return fr_fail(l->ctx, FR_ERR_ARG,
                       "token loader: cannot start epoch %d at batch %" PRId64
                       " (an epoch has %" PRId64 ")",
                       epoch, skip, l->nb);
    fr_prefetch_stop(&l->pf); /* before the order changes under it */
    if (l->perm) fr_shuffle(l->perm, l->nw, 1, l->o.seed, epoch);
    /* a rank without windows in a batch has none in any: an empty epoch */
    return fr_prefetch_start(&l->pf, l->n || l->last_n ? l->nb : 0, l->n || l->last_n ? skip : 0);
}

fr_status fr_token_loader_next(fr_token_loader *l, fr_token_batch *out, int *done) {
    memset(out, 0, sizeof *out);
    *done = 0;
    if (!l->pf.started)
        return fr_fail(l->ctx, FR_ERR_ARG,
                       "token loader: fr_token_loader_next before fr_token_loader_start");
    int64_t k = 0;
    fr_status st = fr_prefetch_next(&l->pf, &k, done);
    if (st || *done) return st;
    int first;
    out->B = batch_rows(l, k, &first);
    out->T = l->o.T;
    out->x = slot_x(l, k);
    out->y = slot_y(l, k);
    return FR_OK;
}
