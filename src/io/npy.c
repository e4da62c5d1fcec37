/* npy.c — the .npy header parser (see npy.h): preamble, then the dict as a
 * small scanner over Python literal syntax (quoted strings without escapes,
 * True/False, tuples of non-negative integers), every fault named by its
 * byte in the file. Faults of syntax read "malformed .npy header dict: ...";
 * what is well formed but not taken (big-endian, Fortran order, more than
 * FR_NPY_DIMS_MAX dimensions) says so plainly. It reads no file itself. */
#include "io/npy.h"
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const struct {
    const char *descr;
    fr_npy_type type;
    unsigned size;
} known[] = {{"|u1", FR_NPY_U1, 1}, {"<u2", FR_NPY_U2, 2}, {"<i4", FR_NPY_I4, 4},
             {"<i8", FR_NPY_I8, 8}, {"<f4", FR_NPY_F4, 4}, {"<f8", FR_NPY_F8, 8}};

/* The dict being scanned: s[0..n) is file bytes [base, base + n). */
typedef struct scan {
    fr_ctx *ctx;
    const char *name;
    const unsigned char *s;
    size_t n, i, base;
} scan;

static fr_status vfault(scan *p, size_t at, const char *what, const char *fmt, va_list ap) {
    char msg[320];
    vsnprintf(msg, sizeof msg, fmt, ap);
    return fr_fail(p->ctx, FR_ERR_FORMAT, "%s: byte %zu: %s%s", p->name, p->base + at, what, msg);
}

/* A fault of syntax at the scanner's position. */
static fr_status malformed(scan *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static fr_status malformed(scan *p, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fr_status st = vfault(p, p->i, "malformed .npy header dict: ", fmt, ap);
    va_end(ap);
    return st;
}

/* Something well formed that no reader takes, at dict byte `at`. */
static fr_status refused(scan *p, size_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static fr_status refused(scan *p, size_t at, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fr_status st = vfault(p, at, "", fmt, ap);
    va_end(ap);
    return st;
}

static void ws(scan *p) {
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static int peek(scan *p) { return p->i < p->n ? p->s[p->i] : -1; }

/* A quoted Python string literal without escapes, into out[cap]. */
static fr_status string(scan *p, char *out, size_t cap) {
    ws(p);
    int q = peek(p);
    if (q != '\'' && q != '"') return malformed(p, "expected a quoted string");
    size_t len = 0, start = p->i++;
    for (;;) {
        int c = peek(p);
        if (c < 0) {
            p->i = start;
            return malformed(p, "unterminated string");
        }
        p->i++;
        if (c == q) break;
        if (c == '\\' || c < 0x20 || c >= 0x7F) {
            p->i--;
            return malformed(p, "unexpected character 0x%02x in a string", (unsigned)c);
        }
        if (len + 1 >= cap) {
            p->i = start;
            return malformed(p, "string longer than %zu bytes", cap - 1);
        }
        out[len++] = (char)c;
    }
    out[len] = 0;
    return FR_OK;
}

/* The word w, not followed by a letter, digit or underscore. */
static int word(scan *p, const char *w) {
    size_t k = strlen(w);
    if (p->i + k > p->n || memcmp(p->s + p->i, w, k)) return 0;
    int c = p->i + k < p->n ? p->s[p->i + k] : ' ';
    if (c == '_' || (c >= '0' && c <= '9') || ((c | 0x20) >= 'a' && (c | 0x20) <= 'z')) return 0;
    p->i += k;
    return 1;
}

/* (a, b, ...) of non-negative integers; a one-element tuple needs its comma. */
static fr_status shape(scan *p, fr_npy *h) {
    if (peek(p) != '(') return malformed(p, "'shape' is not a tuple");
    p->i++;
    int commas = 0;
    h->ndim = 0;
    for (;;) {
        ws(p);
        int c = peek(p);
        if (c == ')') {
            p->i++;
            break;
        }
        if (c == '-') return malformed(p, "negative dimension in 'shape'");
        if (c < '0' || c > '9') return malformed(p, "expected a dimension or ')' in 'shape'");
        if (h->ndim == FR_NPY_DIMS_MAX)
            return refused(p, p->i, "'shape' has more than %d dimensions", FR_NPY_DIMS_MAX);
        if (c == '0' && p->i + 1 < p->n && p->s[p->i + 1] >= '0' && p->s[p->i + 1] <= '9')
            return malformed(p, "dimension with a leading zero in 'shape'");
        uint64_t v = 0;
        while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9') {
            unsigned d = p->s[p->i] - '0';
            if (v > ((uint64_t)INT64_MAX - d) / 10)
                return malformed(p, "dimension too large in 'shape'");
            v = v * 10 + d;
            p->i++;
        }
        if (peek(p) == 'L') p->i++; /* Python 2 longs, as old numpy wrote them */
        h->shape[h->ndim++] = (int64_t)v;
        ws(p);
        c = peek(p);
        if (c == ',') {
            p->i++;
            commas++;
        } else if (c != ')') {
            return malformed(p, "expected ',' or ')' in 'shape'");
        }
    }
    if (h->ndim == 1 && commas == 0) return malformed(p, "'shape' (n) is not a tuple: write (n,)");
    return FR_OK;
}

/* 'descr': a simple type string, looked up in `known`. */
static fr_status descr(scan *p, fr_npy *h) {
    h->descr_at = p->base + p->i;
    size_t at = p->i;
    if (peek(p) != '\'' && peek(p) != '"')
        return refused(
            p, at, "'descr' is not a simple dtype string (structured arrays are not supported)");
    fr_status st = string(p, h->descr, sizeof h->descr);
    if (st) return st;
    if (h->descr[0] == '>')
        return refused(p, at, "big-endian dtype '%s' is not supported", h->descr);
    for (size_t k = 0; k < sizeof known / sizeof known[0]; k++)
        if (!strcmp(h->descr, known[k].descr)) h->type = known[k].type, h->size = known[k].size;
    return FR_OK;
}

uint64_t fr_npy_header_bytes(const unsigned char *b, size_t have, uint32_t max_dict) {
    if (have < 12) return 12;
    uint32_t hl = b[8] | (uint32_t)b[9] << 8;
    if (b[6] != 1) hl |= (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    return (b[6] == 1 ? 10u : 12u) + (uint64_t)(hl < max_dict ? hl : max_dict);
}

fr_status fr_npy_parse(fr_ctx *ctx, const char *name, const unsigned char *b, size_t have,
                       uint32_t max_dict, fr_npy *h) {
    memset(h, 0, sizeof *h);
    if (have == 0) return fr_fail(ctx, FR_ERR_FORMAT, "%s: empty file: not a .npy file", name);
    if (have < 6 || memcmp(b, "\x93NUMPY", 6)) {
        char seen[32] = "";
        for (size_t k = 0, len = 0; k < have && k < 6; k++)
            len += (size_t)snprintf(seen + len, sizeof seen - len, "%s%02x", k ? " " : "", b[k]);
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: byte 0: not a .npy file: its first bytes are %s%s, not the magic "
                       "93 4e 55 4d 50 59 (\\x93NUMPY)",
                       name, seen, have < 6 ? " (the file ends there)" : "");
    }
    if (have < 10)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: %zu bytes: .npy preamble cut short", name, have);
    if (b[6] < 1 || b[6] > 3 || b[7] != 0)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: byte 6: unsupported .npy version %u.%u", name, b[6],
                       b[7]);
    size_t pre = b[6] == 1 ? 10 : 12; /* 2.0 and 3.0 (UTF-8 dict) count in 4 bytes */
    if (have < pre)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: %zu bytes: .npy preamble cut short", name, have);
    uint32_t hl = b[8] | (uint32_t)b[9] << 8;
    if (pre == 12) hl |= (uint32_t)b[10] << 16 | (uint32_t)b[11] << 24;
    if (hl > max_dict)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: byte 8: header length %" PRIu32 " exceeds %" PRIu32,
                       name, hl, max_dict);
    if (have < pre + hl)
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: byte 8: header length %" PRIu32 " runs past the end (%zu bytes)", name,
                       hl, have);
    h->off = pre + hl;

    scan p = {ctx, name, b + pre, hl, 0, pre};
    fr_status st;
    int have_descr = 0, have_fortran = 0, have_shape = 0;
    size_t fortran_at = 0, shape_at = 0;
    ws(&p);
    if (peek(&p) != '{') return malformed(&p, "expected '{'");
    p.i++;
    for (;;) {
        ws(&p);
        if (peek(&p) == '}') {
            p.i++;
            break;
        }
        char key[32];
        size_t at = p.i;
        if ((st = string(&p, key, sizeof key))) return st;
        ws(&p);
        if (peek(&p) != ':') return malformed(&p, "expected ':' after '%s'", key);
        p.i++;
        ws(&p);
        if (!strcmp(key, "descr")) {
            if (have_descr++) return malformed(&p, "duplicate 'descr'");
            if ((st = descr(&p, h))) return st;
        } else if (!strcmp(key, "fortran_order")) {
            if (have_fortran++) return malformed(&p, "duplicate 'fortran_order'");
            fortran_at = p.i;
            if (word(&p, "True")) h->fortran = 1;
            else if (!word(&p, "False"))
                return malformed(&p, "'fortran_order' is not True or False");
        } else if (!strcmp(key, "shape")) {
            if (have_shape++) return malformed(&p, "duplicate 'shape'");
            shape_at = p.i;
            if ((st = shape(&p, h))) return st;
        } else {
            p.i = at;
            return malformed(&p, "unknown key '%s'", key);
        }
        ws(&p);
        int c = peek(&p);
        if (c == ',') {
            p.i++;
            continue;
        }
        if (c == '}') {
            p.i++;
            break;
        }
        return malformed(&p, "expected ',' or '}'");
    }
    ws(&p);
    if (p.i != p.n) return malformed(&p, "unexpected characters after the header dict");
    if (!have_descr || !have_fortran || !have_shape)
        return refused(&p, 0, "the .npy header dict lacks '%s'",
                       !have_descr     ? "descr"
                       : !have_fortran ? "fortran_order"
                                       : "shape");
    /* With one dimension (or none) both orders are the same bytes. */
    if (h->fortran && h->ndim > 1)
        return refused(&p, fortran_at,
                       "fortran_order True is not supported with %d dimensions "
                       "(save a C-ordered array)",
                       h->ndim);
    if (h->type == FR_NPY_OTHER) return FR_OK;
    uint64_t n = h->size;
    for (int k = 0; k < h->ndim; k++)
        if (__builtin_mul_overflow(n, (uint64_t)h->shape[k], &n))
            return refused(&p, shape_at, "'shape' of %s elements overflows 64 bits", h->descr);
    if (__builtin_add_overflow(n, h->off, &h->bytes))
        return refused(&p, shape_at, "'shape' of %s elements overflows 64 bits", h->descr);
    return FR_OK;
}
