/* json.c — the strict JSON reader (see json.h). Recursive descent over the
 * text, depth bounded by FR_JSON_MAX_DEPTH, every allocation accounted
 * (FR_MEM_OTHER) and freed on refusal. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "core/mem.h"
#include "io/json.h"

typedef struct reader {
    fr_ctx *ctx;
    const char *name, *s;
    size_t len, at;
} reader;

static fr_status bad(reader *r, const char *what) {
    return fr_fail(r->ctx, FR_ERR_FORMAT, "%s: byte %zu: %s", r->name, r->at, what);
}

static void skip_ws(reader *r) {
    while (r->at < r->len && (r->s[r->at] == ' ' || r->s[r->at] == '\t' || r->s[r->at] == '\n' ||
                              r->s[r->at] == '\r'))
        r->at++;
}

static int hex4(const char *p, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static size_t put_utf8(char *o, unsigned cp) {
    if (cp < 0x80) return o[0] = (char)cp, 1;
    if (cp < 0x800) return o[0] = (char)(0xC0 | cp >> 6), o[1] = (char)(0x80 | (cp & 63)), 2;
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12), o[1] = (char)(0x80 | (cp >> 6 & 63));
        o[2] = (char)(0x80 | (cp & 63));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18), o[1] = (char)(0x80 | (cp >> 12 & 63));
    o[2] = (char)(0x80 | (cp >> 6 & 63)), o[3] = (char)(0x80 | (cp & 63));
    return 4;
}

/* A string at r->at (the opening quote): its decoded bytes in *out. */
static fr_status read_string(reader *r, char **out) {
    size_t start = ++r->at, end = start;
    while (end < r->len && r->s[end] != '"') end += r->s[end] == '\\' ? 2 : 1;
    if (end >= r->len) return bad(r, "a string without its closing quote");
    char *o = fr_alloc(r->ctx, end - start + 1, FR_MEM_OTHER); /* decoding never grows */
    if (!o) return FR_ERR_NOMEM;
    size_t k = 0;
    while (r->at < end) {
        unsigned char c = (unsigned char)r->s[r->at];
        if (c < 0x20) {
            fr_free(r->ctx, o);
            return bad(r, "a control character inside a string (escape it)");
        }
        if (c != '\\') {
            o[k++] = (char)c, r->at++;
            continue;
        }
        char e = r->s[r->at + 1];
        const char *simple = strchr("\"\\/bfnrt", e);
        if (e && simple) {
            static const char to[] = "\"\\/\b\f\n\r\t";
            o[k++] = to[simple - "\"\\/bfnrt"], r->at += 2;
            continue;
        }
        unsigned cp, lo;
        if (e != 'u' || r->at + 6 > end || hex4(r->s + r->at + 2, &cp)) {
            fr_free(r->ctx, o);
            return bad(r, "a bad escape in a string");
        }
        r->at += 6;
        if (cp >= 0xD800 && cp < 0xDC00) { /* a surrogate pair */
            if (r->at + 6 > end || r->s[r->at] != '\\' || r->s[r->at + 1] != 'u' ||
                hex4(r->s + r->at + 2, &lo) || lo < 0xDC00 || lo >= 0xE000) {
                fr_free(r->ctx, o);
                return bad(r, "a high surrogate without its low one");
            }
            r->at += 6;
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
        } else if (cp >= 0xDC00 && cp < 0xE000) {
            fr_free(r->ctx, o);
            return bad(r, "a low surrogate alone");
        }
        if (cp == 0) {
            fr_free(r->ctx, o);
            return bad(r, "a NUL character inside a string");
        }
        k += put_utf8(o + k, cp);
    }
    o[k] = 0;
    r->at = end + 1;
    *out = o;
    return FR_OK;
}

/* A number by JSON's grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
static fr_status read_number(reader *r, double *out) {
    size_t i = r->at;
    const char *s = r->s;
#define DIGITS(n) (i < r->len && s[i] >= '0' && s[i] <= '9' ? (n) : 0)
    if (i < r->len && s[i] == '-') i++;
    if (i < r->len && s[i] == '0') i++;
    else if (DIGITS(1))
        while (DIGITS(1)) i++;
    else return bad(r, "a number without digits");
    if (i < r->len && s[i] == '.') {
        i++;
        if (!DIGITS(1)) return bad(r, "a number's fraction without digits");
        while (DIGITS(1)) i++;
    }
    if (i < r->len && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < r->len && (s[i] == '+' || s[i] == '-')) i++;
        if (!DIGITS(1)) return bad(r, "a number's exponent without digits");
        while (DIGITS(1)) i++;
    }
#undef DIGITS
    char buf[64];
    if (i - r->at >= sizeof buf) return bad(r, "a number over 63 characters");
    memcpy(buf, s + r->at, i - r->at);
    buf[i - r->at] = 0;
    *out = strtod(buf, NULL);
    if (!isfinite(*out)) return bad(r, "a number out of range");
    r->at = i;
    return FR_OK;
}

static fr_status read_value(reader *r, fr_json *v, int depth);

/* Append a zeroed item (and, for objects, its key) to v. */
static fr_status grow(reader *r, fr_json *v, size_t *cap) {
    if (fr_grow(r->ctx, (void **)&v->items, cap, v->n + 1, sizeof *v->items, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    memset(&v->items[v->n], 0, sizeof *v->items);
    return FR_OK;
}

static fr_status read_container(reader *r, fr_json *v, int depth) {
    int obj = r->s[r->at] == '{';
    char close = obj ? '}' : ']';
    size_t cap = 0, kcap = 0;
    v->kind = obj ? FR_JSON_OBJECT : FR_JSON_ARRAY;
    r->at++;
    skip_ws(r);
    if (r->at < r->len && r->s[r->at] == close) {
        r->at++;
        return FR_OK;
    }
    for (;;) {
        fr_status st;
        char *key = NULL;
        skip_ws(r);
        if (obj) {
            if (r->at >= r->len || r->s[r->at] != '"') return bad(r, "expected a member name");
            if ((st = read_string(r, &key))) return st;
            skip_ws(r);
            if (r->at >= r->len || r->s[r->at] != ':') {
                fr_free(r->ctx, key);
                return bad(r, "expected ':' after a member name");
            }
            r->at++;
            if (fr_grow(r->ctx, (void **)&v->keys, &kcap, v->n + 1, sizeof *v->keys,
                        FR_MEM_OTHER)) {
                fr_free(r->ctx, key);
                return FR_ERR_NOMEM;
            }
            v->keys[v->n] = NULL;
        }
        if ((st = grow(r, v, &cap))) {
            fr_free(r->ctx, key);
            return st;
        }
        if (obj) v->keys[v->n] = key;
        v->n++;
        if ((st = read_value(r, &v->items[v->n - 1], depth + 1))) return st;
        skip_ws(r);
        if (r->at < r->len && r->s[r->at] == ',') {
            r->at++;
            continue;
        }
        if (r->at < r->len && r->s[r->at] == close) {
            r->at++;
            return FR_OK;
        }
        return bad(r, obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
}

static fr_status read_value(reader *r, fr_json *v, int depth) {
    skip_ws(r);
    v->pos = r->at;
    if (depth > FR_JSON_MAX_DEPTH) return bad(r, "nested deeper than 64 levels");
    if (r->at >= r->len) return bad(r, "expected a value, found the end");
    char c = r->s[r->at];
    if (c == '{' || c == '[') return read_container(r, v, depth);
    if (c == '"') {
        v->kind = FR_JSON_STRING;
        return read_string(r, &v->str);
    }
    if (c == '-' || (c >= '0' && c <= '9')) {
        v->kind = FR_JSON_NUMBER;
        return read_number(r, &v->number);
    }
    static const char *words[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(words[k]);
        if (r->len - r->at >= n && !memcmp(r->s + r->at, words[k], n)) {
            v->kind = k < 2 ? FR_JSON_BOOL : FR_JSON_NULL;
            v->boolean = k == 0;
            r->at += n;
            return FR_OK;
        }
    }
    return bad(r, "expected a value");
}

fr_status fr_json_parse(fr_ctx *ctx, const char *name, const char *text, size_t len, fr_json *out) {
    reader r = {ctx, name, text, len, 0};
    memset(out, 0, sizeof *out);
    fr_status st = read_value(&r, out, 0);
    if (!st) {
        skip_ws(&r);
        if (r.at < r.len) st = bad(&r, "text after the value");
    }
    if (st) fr_json_free(ctx, out);
    return st;
}

void fr_json_free(fr_ctx *ctx, fr_json *v) {
    if (!v) return;
    for (size_t i = 0; i < v->n; i++) {
        if (v->items) fr_json_free(ctx, &v->items[i]);
        if (v->keys) fr_free(ctx, v->keys[i]);
    }
    fr_free(ctx, v->items);
    fr_free(ctx, v->keys);
    fr_free(ctx, v->str);
    memset(v, 0, sizeof *v);
}

const fr_json *fr_json_get(const fr_json *obj, const char *key) {
    const fr_json *hit = NULL;
    if (!obj || obj->kind != FR_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->n; i++)
        if (obj->keys[i] && !strcmp(obj->keys[i], key)) hit = &obj->items[i];
    return hit;
}
