/* safetensors.c — the safetensors reader and writer, and atomic file writes
 * (see safetensors.h). Owns a small strict JSON scanner that knows exactly
 * the header's grammar (one object of tensor objects, string-valued
 * "__metadata__", arrays of non-negative integers) and rejects everything
 * else with the byte position in the file. Does not own what the tensors
 * mean: callers (checkpoints, model weights) look entries up by name and
 * copy out only the tensors they need (fr_st_load: pread from the file, or
 * memcpy from fr_st_parse's buffer, where data need not be aligned). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/file.h"
#include "io/safetensors.h"

#define ST_MAX_HEADER 100000000ULL /* the reference implementation's limit */

/* One table of dtype names: the enum order of frugal.h. */
static const char *const st_dtype_names[FR_DTYPE_COUNT] = {"F32", "F16", "BF16",
                                                           "I32", "U8",  "I64"};
_Static_assert(FR_DTYPE_COUNT == 6, "safetensors dtype table must cover every dtype");

/* ---- UTF-8 ------------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s[0..n), or 0 if it is not one
 * (overlong forms, surrogates and code points past U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t k;
    uint32_t cp;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) k = 2, cp = c & 0x1F;
    else if (c >= 0xE0 && c <= 0xEF) k = 3, cp = c & 0x0F;
    else if (c >= 0xF0 && c <= 0xF4) k = 4, cp = c & 0x07;
    else return 0;
    if (k > n) return 0;
    for (size_t i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = cp << 6 | (s[i] & 0x3F);
    }
    if ((k == 3 && cp < 0x800) || (k == 4 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
        return 0;
    return k;
}

static int utf8_valid(const char *s) {
    size_t n = strlen(s);
    for (size_t i = 0; i < n;) {
        size_t k = utf8_seq((const unsigned char *)s + i, n - i);
        if (!k) return 0;
        i += k;
    }
    return 1;
}

/* ---- the JSON scanner --------------------------------------------------- */

typedef struct jscan {
    fr_ctx *ctx;
    const char *file;
    const unsigned char *s; /* the header's bytes */
    size_t n, i;            /* length and cursor; file position is 8 + i */
} jscan;

static fr_status jerr(jscan *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fr_status jerr(jscan *j, const char *fmt, ...) {
    char msg[320];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fr_fail(j->ctx, FR_ERR_FORMAT, "%s: byte %zu: %s", j->file, j->i + 8, msg);
}

static void jws(jscan *j) {
    while (j->i < j->n &&
           (j->s[j->i] == ' ' || j->s[j->i] == '\t' || j->s[j->i] == '\n' || j->s[j->i] == '\r'))
        j->i++;
}

static int jpeek(jscan *j) { return j->i < j->n ? j->s[j->i] : -1; }

static fr_status jexpect(jscan *j, char c, const char *where) {
    jws(j);
    if (jpeek(j) != c) {
        if (j->i >= j->n) return jerr(j, "header ends where '%c' was expected %s", c, where);
        return jerr(j, "expected '%c' %s", c, where);
    }
    j->i++;
    return FR_OK;
}

static int hex4(const unsigned char *s, uint32_t *v) {
    *v = 0;
    for (int k = 0; k < 4; k++) {
        int c = s[k], d;
        if (c >= '0' && c <= '9') d = c - '0';
        else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
        else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
        else return 0;
        *v = *v << 4 | (uint32_t)d;
    }
    return 1;
}

/* A JSON string into out (NUL-terminated, at most cap-1 bytes). */
static fr_status jstring(jscan *j, char *out, size_t cap, const char *what) {
    size_t len = 0;
    jws(j);
    if (jpeek(j) != '"') return jerr(j, "expected a string (%s)", what);
    j->i++;
    for (;;) {
        if (j->i >= j->n) return jerr(j, "unterminated string (%s)", what);
        unsigned c = j->s[j->i];
        unsigned char enc[4];
        size_t k = 0;
        if (c == '"') {
            j->i++;
            break;
        }
        if (c < 0x20) return jerr(j, "control character 0x%02x in a string", c);
        if (c == '\\') {
            if (j->i + 1 >= j->n) return jerr(j, "unterminated escape in a string");
            unsigned e = j->s[j->i + 1];
            const char *simple = strchr("\"\\/bfnrt", (int)e);
            if (e && simple) {
                static const char repl[] = "\"\\/\b\f\n\r\t";
                enc[k++] = (unsigned char)repl[simple - "\"\\/bfnrt"];
                j->i += 2;
            } else if (e == 'u') {
                uint32_t cp, lo;
                if (j->i + 6 > j->n || !hex4(j->s + j->i + 2, &cp))
                    return jerr(j, "bad \\u escape in a string");
                if (cp >= 0xDC00 && cp <= 0xDFFF) return jerr(j, "lone low surrogate in a string");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    if (j->i + 12 > j->n || j->s[j->i + 6] != '\\' || j->s[j->i + 7] != 'u' ||
                        !hex4(j->s + j->i + 8, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                        return jerr(j, "high surrogate without its low half in a string");
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    j->i += 6;
                }
                if (cp == 0) return jerr(j, "\\u0000 in a string");
                j->i += 6;
                if (cp < 0x80) enc[k++] = (unsigned char)cp;
                else if (cp < 0x800) {
                    enc[k++] = (unsigned char)(0xC0 | cp >> 6);
                    enc[k++] = (unsigned char)(0x80 | (cp & 0x3F));
                } else if (cp < 0x10000) {
                    enc[k++] = (unsigned char)(0xE0 | cp >> 12);
                    enc[k++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    enc[k++] = (unsigned char)(0x80 | (cp & 0x3F));
                } else {
                    enc[k++] = (unsigned char)(0xF0 | cp >> 18);
                    enc[k++] = (unsigned char)(0x80 | ((cp >> 12) & 0x3F));
                    enc[k++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
                    enc[k++] = (unsigned char)(0x80 | (cp & 0x3F));
                }
            } else {
                return jerr(j, "unknown escape '\\%c' in a string",
                            e >= 0x20 && e < 0x7F ? e : '?');
            }
        } else {
            k = utf8_seq(j->s + j->i, j->n - j->i);
            if (!k) return jerr(j, "invalid UTF-8 in a string");
            memcpy(enc, j->s + j->i, k);
            j->i += k;
        }
        if (len + k >= cap) return jerr(j, "%s longer than %zu bytes", what, cap - 1);
        memcpy(out + len, enc, k);
        len += k;
    }
    out[len] = 0;
    return FR_OK;
}

/* A non-negative JSON integer (no sign, fraction or exponent) below 2^63. */
static fr_status juint(jscan *j, uint64_t *v, const char *what) {
    jws(j);
    int c = jpeek(j);
    if (c == '-') return jerr(j, "negative number in %s", what);
    if (c < '0' || c > '9') return jerr(j, "expected a non-negative integer in %s", what);
    if (c == '0' && j->i + 1 < j->n && j->s[j->i + 1] >= '0' && j->s[j->i + 1] <= '9')
        return jerr(j, "number with a leading zero in %s", what);
    uint64_t x = 0;
    while (j->i < j->n && j->s[j->i] >= '0' && j->s[j->i] <= '9') {
        unsigned d = j->s[j->i] - '0';
        if (x > ((uint64_t)INT64_MAX - d) / 10) return jerr(j, "number too large in %s", what);
        x = x * 10 + d;
        j->i++;
    }
    c = jpeek(j);
    if (c == '.' || c == 'e' || c == 'E') return jerr(j, "expected an integer in %s", what);
    *v = x;
    return FR_OK;
}

/* [a, b, ...] of at most max non-negative integers. */
static fr_status juint_array(jscan *j, uint64_t *out, int max, int *count, const char *what) {
    fr_status st;
    *count = 0;
    if ((st = jexpect(j, '[', what))) return st;
    jws(j);
    if (jpeek(j) == ']') {
        j->i++;
        return FR_OK;
    }
    for (;;) {
        if (*count == max) return jerr(j, "more than %d values in %s", max, what);
        if ((st = juint(j, &out[(*count)++], what))) return st;
        jws(j);
        int c = jpeek(j);
        j->i++;
        if (c == ']') return FR_OK;
        if (c != ',') {
            j->i--;
            return jerr(j, "expected ',' or ']' in %s", what);
        }
    }
}

/* ---- the header's grammar ---------------------------------------------- */

static fr_status parse_meta(jscan *j, fr_st_file *out) {
    fr_status st;
    if ((st = jexpect(j, '{', "to open \"__metadata__\""))) return st;
    jws(j);
    if (jpeek(j) == '}') {
        j->i++;
        return FR_OK;
    }
    for (;;) {
        if (out->n_meta == FR_ST_META_MAX)
            return jerr(j, "more than %d \"__metadata__\" entries", FR_ST_META_MAX);
        fr_st_meta *m = &out->meta[out->n_meta];
        if ((st = jstring(j, m->key, sizeof m->key, "a metadata key"))) return st;
        for (int k = 0; k < out->n_meta; k++)
            if (!strcmp(out->meta[k].key, m->key))
                return jerr(j, "duplicate metadata key '%s'", m->key);
        if ((st = jexpect(j, ':', "after a metadata key"))) return st;
        jws(j);
        if (jpeek(j) != '"') return jerr(j, "metadata '%s': value is not a string", m->key);
        if ((st = jstring(j, m->value, sizeof m->value, "a metadata value"))) return st;
        out->n_meta++;
        jws(j);
        int c = jpeek(j);
        j->i++;
        if (c == '}') return FR_OK;
        if (c != ',') {
            j->i--;
            return jerr(j, "expected ',' or '}' in \"__metadata__\"");
        }
    }
}

/* {"dtype": .., "shape": [..], "data_offsets": [b, e]} for entry e, whose
 * name is set; checks the offsets against the data section's length (the
 * file's size less the header when reading a file). */
static fr_status parse_tensor(jscan *j, fr_st_entry *e, uint64_t data_len) {
    fr_status st;
    int have_dtype = 0, have_shape = 0, have_off = 0;
    uint64_t off[2] = {0, 0}, dims[FR_MAX_DIMS];
    if ((st = jexpect(j, '{', "to open a tensor"))) return st;
    for (;;) {
        char key[32], val[16];
        if ((st = jstring(j, key, sizeof key, "a tensor key"))) return st;
        if ((st = jexpect(j, ':', "after a tensor key"))) return st;
        if (!strcmp(key, "dtype")) {
            if (have_dtype++) return jerr(j, "tensor '%s': duplicate \"dtype\"", e->name);
            size_t at = j->i;
            if ((st = jstring(j, val, sizeof val, "a dtype"))) return st;
            int dt = -1;
            for (int k = 0; k < FR_DTYPE_COUNT; k++)
                if (!strcmp(val, st_dtype_names[k])) dt = k;
            if (dt < 0) {
                j->i = at;
                jws(j);
                return jerr(j, "tensor '%s': unsupported dtype \"%s\"", e->name, val);
            }
            e->dtype = (fr_dtype)dt;
        } else if (!strcmp(key, "shape")) {
            if (have_shape++) return jerr(j, "tensor '%s': duplicate \"shape\"", e->name);
            int nd;
            if ((st = juint_array(j, dims, FR_MAX_DIMS, &nd, "a shape"))) return st;
            e->shape.ndim = nd;
            for (int k = 0; k < nd; k++) e->shape.d[k] = (int64_t)dims[k];
        } else if (!strcmp(key, "data_offsets")) {
            if (have_off++) return jerr(j, "tensor '%s': duplicate \"data_offsets\"", e->name);
            int k;
            if ((st = juint_array(j, off, 2, &k, "data_offsets"))) return st;
            if (k != 2)
                return jerr(j, "tensor '%s': data_offsets needs 2 values, has %d", e->name, k);
        } else {
            return jerr(j, "tensor '%s': unknown key \"%s\"", e->name, key);
        }
        jws(j);
        int c = jpeek(j);
        j->i++;
        if (c == '}') break;
        if (c != ',') {
            j->i--;
            return jerr(j, "expected ',' or '}' in tensor '%s'", e->name);
        }
    }
    const char *missing = !have_dtype   ? "dtype"
                          : !have_shape ? "shape"
                          : !have_off   ? "data_offsets"
                                        : NULL;
    if (missing)
        return fr_fail(j->ctx, FR_ERR_FORMAT, "%s: tensor '%s': missing \"%s\"", j->file, e->name,
                       missing);

    uint64_t numel = 1, need;
    for (int k = 0; k < e->shape.ndim; k++)
        if (__builtin_mul_overflow(numel, (uint64_t)e->shape.d[k], &numel))
            return fr_fail(j->ctx, FR_ERR_FORMAT,
                           "%s: tensor '%s': shape's element count overflows", j->file, e->name);
    if (__builtin_mul_overflow(numel, (uint64_t)fr_dtype_size(e->dtype), &need) || need > INT64_MAX)
        return fr_fail(j->ctx, FR_ERR_FORMAT, "%s: tensor '%s': shape's byte count overflows",
                       j->file, e->name);
    if (off[1] < off[0])
        return fr_fail(j->ctx, FR_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] end before begin",
                       j->file, e->name, off[0], off[1]);
    if (off[1] > data_len)
        return fr_fail(j->ctx, FR_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                       "] end past the data (%" PRIu64 " bytes)",
                       j->file, e->name, off[0], off[1], data_len);
    if (off[1] - off[0] != need) {
        char sh[96];
        return fr_fail(j->ctx, FR_ERR_FORMAT,
                       "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] hold %" PRIu64
                       " bytes but %s %s needs %" PRIu64,
                       j->file, e->name, off[0], off[1], off[1] - off[0], st_dtype_names[e->dtype],
                       fr_shape_str(&e->shape, sh, sizeof sh), need);
    }
    if (need > SIZE_MAX)
        return fr_fail(j->ctx, FR_ERR_FORMAT,
                       "%s: tensor '%s': %" PRIu64 " bytes do not fit in memory", j->file, e->name,
                       need);
    e->offset = off[0];
    e->nbytes = (size_t)need;
    return FR_OK;
}

typedef struct st_span {
    uint64_t begin, end;
    const char *name;
} st_span;

static int span_by_name(const void *a, const void *b) {
    return strcmp(((const st_span *)a)->name, ((const st_span *)b)->name);
}

static int span_by_offset(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* No two tensors share a name; sorted by offset they tile the data section
 * exactly: no overlap, no gap, nothing after the last. */
static fr_status check_layout(fr_ctx *ctx, const char *file, const fr_st_file *f, uint64_t data_len,
                              fr_mem_cat cat) {
    if (f->n == 0) {
        if (data_len)
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: no tensors but %" PRIu64 " bytes of data", file,
                           data_len);
        return FR_OK;
    }
    st_span *sp = fr_alloc(ctx, (size_t)f->n * sizeof *sp, cat);
    if (!sp) return FR_ERR_NOMEM;
    for (int k = 0; k < f->n; k++) {
        const fr_st_entry *e = &f->entries[k];
        sp[k].begin = e->offset;
        sp[k].end = sp[k].begin + e->nbytes;
        sp[k].name = e->name;
    }
    fr_status st = FR_OK;
    qsort(sp, (size_t)f->n, sizeof *sp, span_by_name);
    for (int k = 1; k < f->n && !st; k++)
        if (!strcmp(sp[k].name, sp[k - 1].name))
            st = fr_fail(ctx, FR_ERR_FORMAT, "%s: tensor '%s' appears twice", file, sp[k].name);
    if (!st) qsort(sp, (size_t)f->n, sizeof *sp, span_by_offset);
    uint64_t at = 0;
    const char *prev = NULL;
    for (int k = 0; k < f->n && !st; k++) {
        if (sp[k].begin < at)
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] overlap tensor '%s' (which ends at %" PRIu64 ")",
                         file, sp[k].name, sp[k].begin, sp[k].end, prev, at);
        else if (sp[k].begin > at)
            st = fr_fail(ctx, FR_ERR_FORMAT,
                         "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                         "] leave a gap of %" PRIu64 " bytes before them",
                         file, sp[k].name, sp[k].begin, sp[k].end, sp[k].begin - at);
        at = sp[k].end;
        prev = sp[k].name;
    }
    if (!st && at != data_len)
        st = fr_fail(ctx, FR_ERR_FORMAT,
                     "%s: the tensors cover %" PRIu64 " bytes of data but the file has %" PRIu64,
                     file, at, data_len);
    fr_free(ctx, sp);
    return st;
}

/* The JSON header h[0..hl) (file position 8) into out, offsets checked
 * against a data section of data_len bytes. On failure out is cleared. */
static fr_status parse_header(fr_ctx *ctx, const char *path, const unsigned char *h, size_t hl,
                              uint64_t data_len, fr_st_file *out, fr_mem_cat cat) {
    jscan j = {ctx, path, h, hl, 0};
    fr_status st;
    size_t cap = 0;
    int seen_meta = 0;
    if ((st = jexpect(&j, '{', "to open the header"))) return st;
    jws(&j);
    if (jpeek(&j) == '}') {
        j.i++;
    } else {
        for (;;) {
            char name[FR_ST_NAME_MAX];
            if ((st = jstring(&j, name, sizeof name, "a tensor name"))) goto fail;
            if ((st = jexpect(&j, ':', "after a tensor name"))) goto fail;
            if (!strcmp(name, "__metadata__")) {
                if (seen_meta++) {
                    st = jerr(&j, "duplicate \"__metadata__\"");
                    goto fail;
                }
                if ((st = parse_meta(&j, out))) goto fail;
            } else {
                if (out->n == INT_MAX) {
                    st = jerr(&j, "too many tensors");
                    goto fail;
                }
                if (fr_grow(ctx, (void **)&out->entries, &cap, (size_t)out->n + 1,
                            sizeof(fr_st_entry), cat)) {
                    st = FR_ERR_NOMEM;
                    goto fail;
                }
                fr_st_entry *e = &out->entries[out->n];
                memset(e, 0, sizeof *e);
                memcpy(e->name, name, sizeof name);
                if ((st = parse_tensor(&j, e, data_len))) goto fail;
                out->n++;
            }
            jws(&j);
            int c = jpeek(&j);
            if (c == '}') {
                j.i++;
                break;
            }
            if (c != ',') {
                st = jerr(&j, c < 0 ? "header ends inside the top-level object"
                                    : "expected ',' or '}' in the top-level object");
                goto fail;
            }
            j.i++;
        }
    }
    jws(&j);
    if (j.i != j.n) {
        st = jerr(&j, "unexpected characters after the header object");
        goto fail;
    }
    if ((st = check_layout(ctx, path, out, data_len, cat))) goto fail;
    return FR_OK;
fail:
    fr_free(ctx, out->entries);
    memset(out, 0, sizeof *out);
    return st;
}

/* The 8-byte little-endian header length, checked against the limit and
 * against the `after` bytes that follow it. */
static fr_status header_length(fr_ctx *ctx, const char *path, const unsigned char b[8],
                               uint64_t after, uint64_t *hl) {
    *hl = 0;
    for (int k = 7; k >= 0; k--) *hl = *hl << 8 | b[k];
    if (*hl > ST_MAX_HEADER)
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: byte 0: header length %" PRIu64 " exceeds the limit of %llu bytes",
                       path, *hl, ST_MAX_HEADER);
    if (*hl > after)
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: byte 0: header length %" PRIu64
                       " runs past the end of the file (%" PRIu64 " bytes follow it)",
                       path, *hl, after);
    return FR_OK;
}

fr_status fr_st_parse(fr_ctx *ctx, const char *path, const void *buf, size_t len, fr_st_file *out) {
    const unsigned char *b = buf;
    memset(out, 0, sizeof *out);
    if (len < 8)
        return fr_fail(
            ctx, FR_ERR_FORMAT,
            "%s: %zu bytes: too short for a safetensors file (the header length alone is 8)", path,
            len);
    uint64_t hl;
    fr_status st = header_length(ctx, path, b, len - 8, &hl);
    if (st) return st;
    if ((st = parse_header(ctx, path, b + 8, (size_t)hl, len - 8 - hl, out, FR_MEM_OTHER)))
        return st;
    for (int k = 0; k < out->n; k++) out->entries[k].data = b + 8 + hl + out->entries[k].offset;
    return FR_OK;
}

/* n bytes at file position at into dst; 0, or -1 with errno (0: the file
 * ends before them). */
static int pread_all(int fd, void *dst, size_t n, uint64_t at) {
    char *c = dst;
    while (n) {
        ssize_t r = pread(fd, c, n, (off_t)at);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0;
            return -1;
        }
        c += r;
        n -= (size_t)r;
        at += (uint64_t)r;
    }
    return 0;
}

fr_status fr_st_read(fr_ctx *ctx, const char *path, fr_st_file *out, fr_mem_cat cat) {
    memset(out, 0, sizeof *out);
    uint64_t size;
    int fd = fr_open_regular(ctx, path, "safetensors file", &size);
    if (fd < 0) return FR_ERR_IO;
    unsigned char lenb[8];
    uint64_t hl = 0;
    unsigned char *h = NULL;
    fr_status st = FR_OK;
    if (size < 8) {
        st = fr_fail(ctx, FR_ERR_FORMAT,
                     "%s: %" PRIu64
                     " bytes: too short for a safetensors file (the header length alone is 8)",
                     path, size);
        goto fail;
    }
    if (pread_all(fd, lenb, 8, 0)) {
        int e = errno;
        st = fr_fail(ctx, FR_ERR_IO, "%s: cannot read the header length: %s", path,
                     e ? strerror(e) : "the file shrank while reading");
        goto fail;
    }
    /* Everything is checked against the size before anything is allocated. */
    if ((st = header_length(ctx, path, lenb, size - 8, &hl))) goto fail;
    if (!(h = fr_alloc(ctx, (size_t)hl + 1, cat))) {
        st = FR_ERR_NOMEM;
        goto fail;
    }
    if (pread_all(fd, h, (size_t)hl, 8)) {
        int e = errno;
        st = fr_fail(ctx, FR_ERR_IO, "%s: cannot read the %" PRIu64 "-byte header: %s", path, hl,
                     e ? strerror(e) : "the file shrank while reading");
        goto fail;
    }
    if ((st = parse_header(ctx, path, h, (size_t)hl, size - 8 - hl, out, cat))) goto fail;
    fr_free(ctx, h);
    h = NULL;
    size_t pl = strlen(path) + 1;
    if (!(out->path = fr_alloc(ctx, pl, cat))) {
        fr_free(ctx, out->entries);
        memset(out, 0, sizeof *out);
        st = FR_ERR_NOMEM;
        goto fail;
    }
    memcpy(out->path, path, pl);
    out->fd = fd;
    out->data_at = 8 + hl;
    return FR_OK;
fail:
    fr_free(ctx, h);
    close(fd);
    return st;
}

fr_status fr_st_load(fr_ctx *ctx, const fr_st_file *f, const fr_st_entry *e, void *dst) {
    if (!e->nbytes) return FR_OK;
    if (f->parts) {
        if (e->part < 0 || e->part >= f->n_parts)
            return fr_fail(ctx, FR_ERR_ARG, "tensor '%s': no shard %d", e->name, e->part);
        return fr_st_load(ctx, &f->parts[e->part], e, dst);
    }
    if (e->data) {
        memcpy(dst, e->data, e->nbytes);
        return FR_OK;
    }
    if (!f->path)
        return fr_fail(ctx, FR_ERR_ARG, "tensor '%s': no data to load (the file is closed)",
                       e->name);
    uint64_t at = f->data_at + e->offset;
    if (pread_all(f->fd, dst, e->nbytes, at)) {
        int err = errno;
        return fr_fail(ctx, FR_ERR_IO,
                       "%s: tensor '%s': cannot read %zu bytes at byte %" PRIu64 ": %s", f->path,
                       e->name, e->nbytes, at,
                       err ? strerror(err) : "the file shrank since it was opened");
    }
    return FR_OK;
}

const fr_st_entry *fr_st_find(const fr_st_file *f, const char *name) {
    for (int k = 0; k < f->n; k++)
        if (!strcmp(f->entries[k].name, name)) return &f->entries[k];
    return NULL;
}

const char *fr_st_meta_get(const fr_st_file *f, const char *key) {
    for (int k = 0; k < f->n_meta; k++)
        if (!strcmp(f->meta[k].key, key)) return f->meta[k].value;
    return NULL;
}

void fr_st_close(fr_ctx *ctx, fr_st_file *f) {
    if (!f) return;
    for (int i = 0; f->parts && i < f->n_parts; i++) fr_st_close(ctx, &f->parts[i]);
    fr_free(ctx, f->parts);
    if (f->path) close(f->fd);
    fr_free(ctx, f->path);
    fr_free(ctx, f->entries);
    fr_free(ctx, f->blob);
    memset(f, 0, sizeof *f);
}

/* ---- writing ------------------------------------------------------------ */

/* Appends to the header; with buf NULL only counts (the first pass). */
typedef struct hdr {
    char *buf;
    size_t len;
} hdr;

static void put(hdr *h, const char *s, size_t k) {
    if (h->buf) memcpy(h->buf + h->len, s, k);
    h->len += k;
}

static void puts_raw(hdr *h, const char *s) { put(h, s, strlen(s)); }

static void put_json_string(hdr *h, const char *s) {
    put(h, "\"", 1);
    for (; *s; s++) {
        unsigned c = (unsigned char)*s;
        char esc[8];
        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            put(h, esc, 2);
        } else if (c < 0x20) {
            snprintf(esc, sizeof esc, "\\u%04x", c);
            put(h, esc, 6);
        } else {
            put(h, s, 1);
        }
    }
    put(h, "\"", 1);
}

static void put_u64(hdr *h, uint64_t v) {
    char num[24];
    int k = snprintf(num, sizeof num, "%" PRIu64, v);
    put(h, num, (size_t)k);
}

/* The JSON header in the reference's compact form, "__metadata__" first,
 * then the tensors in the order given, padded with spaces to a multiple of 8. */
static void build_header(hdr *h, const fr_st_entry *e, int n, const fr_st_meta *meta, int n_meta) {
    uint64_t off = 0;
    int first = 1;
    puts_raw(h, "{");
    if (n_meta > 0) {
        puts_raw(h, "\"__metadata__\":{");
        for (int k = 0; k < n_meta; k++) {
            if (k) puts_raw(h, ",");
            put_json_string(h, meta[k].key);
            puts_raw(h, ":");
            put_json_string(h, meta[k].value);
        }
        puts_raw(h, "}");
        first = 0;
    }
    for (int k = 0; k < n; k++) {
        if (!first) puts_raw(h, ",");
        first = 0;
        put_json_string(h, e[k].name);
        puts_raw(h, ":{\"dtype\":\"");
        puts_raw(h, st_dtype_names[e[k].dtype]);
        puts_raw(h, "\",\"shape\":[");
        for (int d = 0; d < e[k].shape.ndim; d++) {
            if (d) puts_raw(h, ",");
            put_u64(h, (uint64_t)e[k].shape.d[d]);
        }
        puts_raw(h, "],\"data_offsets\":[");
        put_u64(h, off);
        puts_raw(h, ",");
        off += e[k].nbytes;
        put_u64(h, off);
        puts_raw(h, "]}");
    }
    puts_raw(h, "}");
    while (h->len % 8) puts_raw(h, " ");
}

typedef struct part {
    const void *p;
    size_t n;
} part;

static fr_status write_atomic_parts(fr_ctx *ctx, const char *path, const part *parts, int np);

fr_status fr_st_write(fr_ctx *ctx, const char *path, const fr_st_entry *e, int n,
                      const fr_st_meta *meta, int n_meta) {
    if (n < 0 || (n > 0 && !e) || n_meta < 0 || n_meta > FR_ST_META_MAX || (n_meta > 0 && !meta))
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: bad tensor or metadata count (%d, %d; at most %d metadata)", path, n,
                       n_meta, FR_ST_META_MAX);
    for (int k = 0; k < n; k++) {
        const fr_st_entry *t = &e[k];
        if (memchr(t->name, 0, FR_ST_NAME_MAX) == NULL || !t->name[0] ||
            !strcmp(t->name, "__metadata__") || !utf8_valid(t->name))
            return fr_fail(ctx, FR_ERR_ARG, "%s: tensor %d: bad name", path, k);
        if ((unsigned)t->dtype >= FR_DTYPE_COUNT || t->shape.ndim < 0 ||
            t->shape.ndim > FR_MAX_DIMS)
            return fr_fail(ctx, FR_ERR_ARG, "%s: tensor '%s': bad dtype or rank", path, t->name);
        uint64_t numel = 1;
        for (int d = 0; d < t->shape.ndim; d++)
            if (t->shape.d[d] < 0 || __builtin_mul_overflow(numel, (uint64_t)t->shape.d[d], &numel))
                return fr_fail(ctx, FR_ERR_ARG, "%s: tensor '%s': bad shape", path, t->name);
        if (numel > SIZE_MAX / fr_dtype_size(t->dtype) ||
            numel * fr_dtype_size(t->dtype) != t->nbytes || (t->nbytes && !t->data))
            return fr_fail(ctx, FR_ERR_ARG,
                           "%s: tensor '%s': %zu bytes do not match its shape and dtype", path,
                           t->name, t->nbytes);
        for (int q = 0; q < k; q++)
            if (!strcmp(e[q].name, t->name))
                return fr_fail(ctx, FR_ERR_ARG, "%s: tensor '%s' given twice", path, t->name);
    }
    for (int k = 0; k < n_meta; k++) {
        if (!memchr(meta[k].key, 0, sizeof meta[k].key) ||
            !memchr(meta[k].value, 0, sizeof meta[k].value) || !utf8_valid(meta[k].key) ||
            !utf8_valid(meta[k].value))
            return fr_fail(ctx, FR_ERR_ARG, "%s: metadata %d: bad key or value", path, k);
        for (int q = 0; q < k; q++)
            if (!strcmp(meta[q].key, meta[k].key))
                return fr_fail(ctx, FR_ERR_ARG, "%s: metadata key '%s' given twice", path,
                               meta[k].key);
    }

    hdr h = {NULL, 0};
    build_header(&h, e, n, meta, n_meta);
    size_t hlen = h.len;
    char *buf = fr_alloc(ctx, 8 + hlen, FR_MEM_OTHER);
    if (!buf) return FR_ERR_NOMEM;
    for (int k = 0; k < 8; k++) buf[k] = (char)(((uint64_t)hlen >> (8 * k)) & 0xFF);
    h.buf = buf + 8;
    h.len = 0;
    build_header(&h, e, n, meta, n_meta);

    part *parts = fr_alloc(ctx, ((size_t)n + 1) * sizeof *parts, FR_MEM_OTHER);
    if (!parts) {
        fr_free(ctx, buf);
        return FR_ERR_NOMEM;
    }
    parts[0] = (part){buf, 8 + hlen};
    for (int k = 0; k < n; k++) parts[k + 1] = (part){e[k].data, e[k].nbytes};
    fr_status st = write_atomic_parts(ctx, path, parts, n + 1);
    fr_free(ctx, parts);
    fr_free(ctx, buf);
    return st;
}

/* ---- atomic writes ------------------------------------------------------ */

static int write_all(int fd, const void *p, size_t n) {
    const char *c = p;
    while (n) {
        ssize_t w = write(fd, c, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return -1;
        }
        c += w;
        n -= (size_t)w;
    }
    return 0;
}

/* dir and the base name of path. */
static void split_path(const char *path, char *dir, const char **base) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        strcpy(dir, ".");
        *base = path;
    } else if (slash == path) {
        strcpy(dir, "/");
        *base = path + 1;
    } else {
        memcpy(dir, path, (size_t)(slash - path));
        dir[slash - path] = 0;
        *base = slash + 1;
    }
}

/* Remove "<base>.tmp.<pid>" files in dir whose process no longer exists
 * (a writer killed between creating its temporary and the rename). Only
 * this exact path's temporaries are touched, never a live writer's. */
static void remove_stale_temporaries(const char *dir, const char *base) {
    DIR *d = opendir(dir);
    if (!d) return;
    size_t bl = strlen(base);
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *nm = de->d_name;
        if (strncmp(nm, base, bl) != 0 || strncmp(nm + bl, ".tmp.", 5) != 0) continue;
        const char *digits = nm + bl + 5;
        char *end;
        errno = 0;
        long pid = strtol(digits, &end, 10);
        if (!isdigit((unsigned char)digits[0]) || *end || errno || pid <= 0 || pid > INT_MAX ||
            pid == (long)getpid())
            continue;
        if (kill((pid_t)pid, 0) == 0 || errno != ESRCH) continue;
        char full[PATH_MAX + 300];
        if ((size_t)snprintf(full, sizeof full, "%s/%s", dir, nm) < sizeof full) unlink(full);
    }
    closedir(d);
}

fr_status fr_st_check_writable(fr_ctx *ctx, const char *path) {
    char dir[PATH_MAX];
    const char *base;
    size_t plen = path ? strlen(path) : 0;
    if (plen == 0 || plen >= PATH_MAX)
        return fr_fail(ctx, FR_ERR_ARG, "%s: bad path for writing", plen ? path : "(empty)");
    split_path(path, dir, &base);
    struct stat sb;
    if (!*base || (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)))
        return fr_fail(ctx, FR_ERR_ARG, "%s: is a directory: give a file name to write to", path);
    if (stat(path, &sb) == 0 && !S_ISREG(sb.st_mode))
        return fr_fail(ctx, FR_ERR_ARG, "%s: exists and is not a regular file", path);
    if (stat(dir, &sb) != 0) {
        int e = errno;
        return fr_fail(ctx, FR_ERR_IO, "%s: cannot write there: directory %s: %s", path, dir,
                       strerror(e));
    }
    if (!S_ISDIR(sb.st_mode))
        return fr_fail(ctx, FR_ERR_IO, "%s: cannot write there: %s is not a directory", path, dir);
    if (access(dir, W_OK | X_OK) != 0) {
        int e = errno;
        return fr_fail(ctx, FR_ERR_IO, "%s: cannot write there: directory %s: %s", path, dir,
                       strerror(e));
    }
    return FR_OK;
}

/* Writes "<path>.tmp.<pid>" beside path, fsyncs it, renames it over path
 * and fsyncs the directory. Any failure before the rename removes the
 * temporary and leaves path as it was. */
static fr_status write_atomic_parts(fr_ctx *ctx, const char *path, const part *parts, int np) {
    char tmp[PATH_MAX + 32], dir[PATH_MAX];
    size_t plen = strlen(path);
    if (plen == 0 || plen >= PATH_MAX)
        return fr_fail(ctx, FR_ERR_ARG, "%s: bad path for writing", plen ? path : "(empty)");
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    const char *base;
    split_path(path, dir, &base);
    if (*base) remove_stale_temporaries(dir, base);

    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666);
    if (fd < 0)
        return fr_fail(ctx, FR_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
    const char *step = NULL;
    for (int k = 0; k < np && !step; k++)
        if (parts[k].n && write_all(fd, parts[k].p, parts[k].n)) step = "write";
    if (!step && fsync(fd) != 0) step = "fsync";
    int e = errno;
    if (close(fd) != 0 && !step) {
        step = "close";
        e = errno;
    }
    if (!step && rename(tmp, path) != 0) {
        step = "rename";
        e = errno;
    }
    if (step) {
        unlink(tmp);
        return fr_fail(ctx, FR_ERR_IO, "%s: %s of %s failed: %s (the old file is unchanged)", path,
                       step, tmp, strerror(e));
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0)
        return fr_fail(ctx, FR_ERR_IO, "%s: written, but cannot open directory %s to fsync it: %s",
                       path, dir, strerror(errno));
    int r = fsync(dfd);
    e = errno;
    close(dfd);
    if (r != 0 && e != EINVAL) /* some file systems cannot fsync a directory */
        return fr_fail(ctx, FR_ERR_IO, "%s: written, but fsync of directory %s failed: %s", path,
                       dir, strerror(e));
    return FR_OK;
}

fr_status fr_write_atomic(fr_ctx *ctx, const char *path, const void *bytes, size_t len) {
    if (len && !bytes) return fr_fail(ctx, FR_ERR_ARG, "%s: no bytes to write", path);
    part p = {bytes, len};
    return write_atomic_parts(ctx, path, &p, 1);
}
