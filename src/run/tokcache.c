/* tokcache.c — text data for a model with a tokenizer (--tokenizer): the
 * text is tokenized once into a cache file, a 1-D int32 .npy the token
 * reader opens like any other, and later runs read the cache.
 *
 * Where: beside the data, as a hidden file (data file x: .x.<key>.tokens.npy
 * in its directory; data directory d: d/.frugal.<key>.tokens.npy, which the
 * directory walk skips as it skips every name starting with '.'); where
 * that directory cannot be written, in $XDG_CACHE_HOME/frugal (else
 * ~/.cache/frugal). The key is a 64-bit FNV-1a hash of the tokenizer's file
 * and of the data's bytes, so an edited text or another tokenizer makes a
 * new cache, never a stale one.
 *
 * What: the whole text (the files in the reader's order, concatenated),
 * BOS first when the tokenizer adds one (Llama), else nothing. A tokenizer
 * that may cut (fr_tokenizer_cuttable: GPT-2's pre-tokenizer) encodes it in
 * parts of about 1 MiB cut after a newline that a printable non-space byte
 * follows, which gives the ids of the whole; any other (SentencePiece's
 * dummy prefix) encodes it in one call, as `frugal tokenize` does. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/file.h"
#include "io/safetensors.h"
#include "run/tokcache.h"

#define PIECE_BYTES (1u << 20)
#define READ_CHUNK (1 << 16)

static uint64_t fnv(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

static fr_status hash_file(fr_ctx *ctx, const char *path, uint64_t *h) {
    char *b = NULL;
    size_t n = 0;
    fr_status st = fr_read_small(ctx, path, "tokenizer", 2ull << 30, &b, &n);
    if (!st) *h = fnv(*h, b, n);
    fr_free(ctx, b);
    return st;
}

static int writable_dir(const char *d) { return access(d, W_OK | X_OK) == 0; }

/* The cache's path for data `data` and key (NULL: out of memory). */
static char *cache_path(const char *data, uint64_t key) {
    char name[64], *p = NULL;
    struct stat sb;
    snprintf(name, sizeof name, "%016llx.tokens.npy", (unsigned long long)key);
    const int dir = stat(data, &sb) == 0 && S_ISDIR(sb.st_mode);
    char *copy = strdup(data);
    if (!copy) return NULL;
    const char *base = data, *parent = ".";
    char *slash = strrchr(copy, '/');
    if (!dir && slash) {
        *slash = 0;
        parent = slash == copy ? "/" : copy;
        base = data + (slash - copy) + 1;
    }
    size_t cap = strlen(data) + 2 * sizeof name + 32;
    if (dir && writable_dir(data) && (p = malloc(cap)))
        snprintf(p, cap, "%s/.frugal.%s", data, name);
    else if (!dir && writable_dir(parent) && (p = malloc(cap)))
        snprintf(p, cap, "%s/.%s.%s", parent, base, name);
    free(copy);
    if (p) return p;
    const char *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
    char root[4096];
    if (xdg && xdg[0] == '/') snprintf(root, sizeof root, "%s/frugal", xdg);
    else snprintf(root, sizeof root, "%s/.cache/frugal", home && home[0] ? home : "/tmp");
    /* make root and its parent (~/.cache) when missing */
    char up[4096];
    snprintf(up, sizeof up, "%s", root);
    char *s = strrchr(up, '/');
    if (s && s != up) *s = 0, mkdir(up, 0755);
    mkdir(root, 0755);
    cap = strlen(root) + sizeof name + 8;
    if ((p = malloc(cap))) snprintf(p, cap, "%s/%s", root, name);
    return p;
}

/* A 1-D little-endian int32 .npy of n ids, written atomically. */
static fr_status write_npy(fr_ctx *ctx, const char *path, const int32_t *ids, size_t n) {
    char hdr[128];
    int hl =
        snprintf(hdr, sizeof hdr, "{'descr': '<i4', 'fortran_order': False, 'shape': (%zu,), }", n);
    size_t total = 10 + (size_t)hl + 1, pad = (64 - total % 64) % 64;
    size_t hlen = (size_t)hl + pad + 1, bytes = 10 + hlen + n * 4;
    unsigned char *b = malloc(bytes);
    if (!b) return fr_fail(ctx, FR_ERR_NOMEM, "%s: out of memory for %zu tokens", path, n);
    memcpy(b, "\x93NUMPY\x01\x00", 8);
    b[8] = (unsigned char)(hlen & 0xff);
    b[9] = (unsigned char)(hlen >> 8);
    memcpy(b + 10, hdr, (size_t)hl);
    memset(b + 10 + hl, ' ', pad);
    b[10 + hl + pad] = '\n';
    memcpy(b + 10 + hlen, ids, n * 4); /* x86 and aarch64 hosts are little-endian */
    fr_status st = fr_write_atomic(ctx, path, b, bytes);
    free(b);
    return st;
}

fr_status fr_tokenize_cached(fr_ctx *ctx, fr_tokenizer *tok, const char *data, char **out,
                             int quiet) {
    *out = NULL;
    fr_tokens *t = fr_tokens_open(ctx, data);
    if (!t) return FR_ERR_IO;
    fr_status st = FR_OK;
    char *text = NULL;
    int32_t *ids = NULL, *chunk = malloc(READ_CHUNK * sizeof *chunk);
    size_t n_ids = 0, cap_ids = 0;
    const int64_t len = fr_tokens_len(t);
    char err[256];
    if (fr_tokens_get_kind(t) != FR_TOKENS_TEXT) {
        st = fr_fail(ctx, FR_ERR_ARG,
                     "%s: --tokenizer applies to text data; these are already token ids (an "
                     "llm.c shard or .npy): leave --tokenizer out",
                     data);
        goto done;
    }
    if (!chunk || !(text = malloc((size_t)len + 1))) {
        st = fr_fail(ctx, FR_ERR_NOMEM, "%s: out of memory for %lld bytes of text", data,
                     (long long)len);
        goto done;
    }
    for (int64_t at = 0; at < len && !st;
         at += READ_CHUNK) { /* the bytes, as the reader gives them */
        const int n = len - at < READ_CHUNK ? (int)(len - at) : READ_CHUNK;
        if (fr_tokens_read(t, at, n, chunk, err, sizeof err))
            st = fr_fail(ctx, FR_ERR_IO, "%s", err);
        for (int i = 0; i < n && !st; i++) text[at + i] = (char)chunk[i];
    }
    if (st) goto done;
    uint64_t key = fnv(0xcbf29ce484222325ull, fr_tokenizer_kind(tok), 4);
    if ((st = hash_file(ctx, fr_tokenizer_path(tok), &key))) goto done;
    key = fnv(key, text, (size_t)len);
    if (!(*out = cache_path(data, key))) {
        st = fr_fail(ctx, FR_ERR_NOMEM, "out of memory");
        goto done;
    }
    struct stat sb;
    if (stat(*out, &sb) == 0 && S_ISREG(sb.st_mode)) {
        if (!quiet)
            fprintf(stderr, "tokens: %s (cached: %s tokenized by %s)\n", *out, data,
                    fr_tokenizer_path(tok));
        goto done;
    }
    /* parts of about PIECE_BYTES, where the tokenizer allows a cut */
    const int cut = fr_tokenizer_cuttable(tok);
    for (int64_t at = 0; at < len && !st;) {
        const int64_t end =
            cut ? at + (int64_t)fr_tokenizer_next_cut(text + at, (size_t)(len - at), PIECE_BYTES)
                : len;
        int32_t *p = NULL;
        size_t np = 0;
        st = fr_tokenizer_encode(tok, text + at, (size_t)(end - at),
                                 at == 0 && fr_tokenizer_adds_bos(tok), &p, &np);
        if (!st && n_ids + np > cap_ids) {
            size_t nc = (n_ids + np) * 2 + 1024;
            int32_t *g = realloc(ids, nc * sizeof *ids);
            if (!g) st = fr_fail(ctx, FR_ERR_NOMEM, "out of memory for %zu tokens", n_ids + np);
            else ids = g, cap_ids = nc;
        }
        if (!st) memcpy(ids + n_ids, p, np * sizeof *p), n_ids += np;
        free(p);
        at = end;
    }
    if (!st && !n_ids) st = fr_fail(ctx, FR_ERR_FORMAT, "%s: the text gave no tokens", data);
    if (!st) st = write_npy(ctx, *out, ids, n_ids);
    if (!st && !quiet)
        fprintf(stderr, "tokens: %s: %lld bytes -> %zu tokens by %s (%s), cached in %s\n", data,
                (long long)len, n_ids, fr_tokenizer_path(tok), fr_tokenizer_kind(tok), *out);
done:
    if (st) {
        free(*out);
        *out = NULL;
    }
    free(ids);
    free(chunk);
    free(text);
    fr_tokens_close(t);
    return st;
}
