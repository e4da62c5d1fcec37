/* bpe.c — byte-level BPE exactly as OpenAI's GPT-2 encoder.py defines it:
 *
 *   bytes_to_unicode   byte b is the character b for the printable bytes
 *                      '!'..'~', 0xA1..0xAC, 0xAE..0xFF, and 256 + k for the
 *                      k-th other byte in increasing order
 *   pre-tokenizer      the pieces of
 *                      's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *                      (PCRE2, UTF + UCP; \s is Unicode's White_Space, as in
 *                      Python's `regex` module and Oniguruma: PCRE2's \s and
 *                      U+0085). PCRE2_MATCH_INVALID_UTF: no alternative
 *                      matches a byte of an invalid UTF-8 sequence, so each
 *                      maximal run of such bytes is one piece.
 *   bpe(piece)         the piece's bytes as symbols; while some adjacent pair
 *                      has a merge rank, take the pair of lowest rank and
 *                      merge each of its occurrences left to right
 *
 * Special (added) tokens are matched first, leftmost-longest, as Hugging
 * Face's tokenizers do; the text between them is pre-tokenized. Pieces up to
 * 256 bytes and their ids are cached (encoder.py's cache).
 *
 * What it reads: vocab.json + merges.txt; tokenizer.json with model type
 * BPE, normalizer null, pre_tokenizer ByteLevel or a Sequence of Split
 * (a Regex or String pattern, behavior Isolated, not inverted) and Digits
 * ending in ByteLevel; decoder ByteLevel or null; added_tokens; a
 * TemplateProcessing post_processor's leading special token (BOS). Anything
 * else is refused by its name. A merge's parts and result must be in the
 * vocabulary (as Hugging Face requires); of repeated merges the last rank
 * counts (encoder.py's dict). Tables are accounted on the context
 * (FR_MEM_OTHER); the ids and bytes returned are malloc'd. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "core/mem.h"
#include "io/json.h"
#include "tok/bpe.h"

#define MAX_ID (1 << 24)      /* ids above are refused (a vocabulary of 16M) */
#define CACHE_PIECE 256       /* pieces cached up to this many bytes */
#define CACHE_ENTRIES 1000000 /* and this many pieces */
#define MAX_STEPS 8

/* ---- a map of byte strings to int32 ---------------------------------------- */

typedef struct sent {
    uint64_t h;
    uint32_t off, len;
    int32_t val;
} sent;

typedef struct smap {
    char *pool;
    size_t plen, pcap;
    sent *ent;
    size_t n, ecap;
    uint32_t *slot; /* entry index + 1; 0 empty */
    size_t cap;     /* a power of two */
} smap;

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static int64_t smap_find(const smap *m, const char *s, size_t n, uint64_t h) {
    if (!m->cap) return -1;
    for (size_t i = h & (m->cap - 1);; i = (i + 1) & (m->cap - 1)) {
        uint32_t e = m->slot[i];
        if (!e) return -1;
        const sent *x = &m->ent[e - 1];
        if (x->h == h && x->len == n && !memcmp(m->pool + x->off, s, n)) return e - 1;
    }
}

/* Adds s (absent) with val; its entry index in *at. */
static fr_status smap_add(fr_ctx *ctx, smap *m, const char *s, size_t n, uint64_t h, int32_t val,
                          size_t *at) {
    if (m->plen + n > UINT32_MAX) return fr_fail(ctx, FR_ERR_NOMEM, "token strings over 4 GiB");
    if (fr_grow(ctx, (void **)&m->pool, &m->pcap, m->plen + n + 1, 1, FR_MEM_OTHER) ||
        fr_grow(ctx, (void **)&m->ent, &m->ecap, m->n + 1, sizeof *m->ent, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    if ((m->n + 1) * 2 > m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 64;
        uint32_t *slot = fr_calloc(ctx, cap * sizeof *slot, FR_MEM_OTHER);
        if (!slot) return FR_ERR_NOMEM;
        for (size_t e = 0; e < m->n; e++) {
            size_t i = m->ent[e].h & (cap - 1);
            while (slot[i]) i = (i + 1) & (cap - 1);
            slot[i] = (uint32_t)e + 1;
        }
        fr_free(ctx, m->slot);
        m->slot = slot, m->cap = cap;
    }
    memcpy(m->pool + m->plen, s, n);
    m->pool[m->plen + n] = 0;
    m->ent[m->n] = (sent){h, (uint32_t)m->plen, (uint32_t)n, val};
    m->plen += n + 1;
    size_t i = h & (m->cap - 1);
    while (m->slot[i]) i = (i + 1) & (m->cap - 1);
    m->slot[i] = (uint32_t)++m->n;
    if (at) *at = m->n - 1;
    return FR_OK;
}

static void smap_free(fr_ctx *ctx, smap *m) {
    fr_free(ctx, m->pool);
    fr_free(ctx, m->ent);
    fr_free(ctx, m->slot);
    memset(m, 0, sizeof *m);
}

/* ---- the tokenizer ----------------------------------------------------------- */

typedef struct step {
    int prefix_space; /* ByteLevel's add_prefix_space: a space before a piece without one */
    pcre2_code *re;   /* NULL: no split */
    pcre2_match_data *md;
} step;

struct fr_bpe {
    fr_ctx *ctx;
    char name[512];
    smap vocab;        /* token string (bytes_to_unicode form) -> id */
    smap added;        /* added token content -> id */
    int32_t *id_vocab; /* [nvocab] vocab entry of an id, -1 */
    int32_t *id_added; /* [nvocab] added entry of an id, -1 */
    size_t id_cap;
    int nvocab;     /* largest id + 1 */
    uint64_t *mkey; /* merges: (a << 32 | b) + 1, 0 empty */
    int32_t *mrank, *mres;
    size_t mcap, mn;
    int32_t byte_tok[256]; /* the id of each byte's symbol, -1 */
    char b2u[256][2];      /* each byte's character, UTF-8 */
    unsigned char b2u_len[256];
    int16_t cp2byte[324]; /* the inverse, -1 */
    unsigned char added_first[256];
    int ignore_merges;
    int template_bos;
    int user_split; /* a tokenizer.json's Split pattern among the steps */
    step steps[MAX_STEPS];
    int nsteps;
    smap cache; /* piece -> offset in cids: [count, ids...] */
    int32_t *cids;
    size_t cn, ccap;
    int32_t *sym;
    size_t symcap;
    char *scratch;
    size_t scap;
    /* the output of the encode in progress */
    int32_t **out;
    size_t *out_n, *out_cap;
};

static void bytes_to_unicode(fr_bpe *b) {
    int n = 0;
    for (int i = 0; i < 324; i++) b->cp2byte[i] = -1;
    for (int c = 0; c < 256; c++) {
        int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
        unsigned cp = printable ? (unsigned)c : 256u + (unsigned)n++;
        if (cp < 0x80) b->b2u[c][0] = (char)cp, b->b2u_len[c] = 1;
        else {
            b->b2u[c][0] = (char)(0xC0 | cp >> 6), b->b2u[c][1] = (char)(0x80 | (cp & 63));
            b->b2u_len[c] = 2;
        }
        b->cp2byte[cp] = (int16_t)c;
    }
}

static fr_bpe *bpe_new(fr_ctx *ctx, const char *name) {
    fr_bpe *b = fr_calloc(ctx, sizeof *b, FR_MEM_OTHER);
    if (!b) return NULL;
    b->ctx = ctx;
    snprintf(b->name, sizeof b->name, "%s", name);
    b->template_bos = -1;
    bytes_to_unicode(b);
    return b;
}

void fr_bpe_free(fr_bpe *b) {
    if (!b) return;
    fr_ctx *ctx = b->ctx;
    smap_free(ctx, &b->vocab);
    smap_free(ctx, &b->added);
    smap_free(ctx, &b->cache);
    fr_free(ctx, b->id_vocab);
    fr_free(ctx, b->id_added);
    fr_free(ctx, b->mkey);
    fr_free(ctx, b->mrank);
    fr_free(ctx, b->mres);
    fr_free(ctx, b->cids);
    fr_free(ctx, b->sym);
    fr_free(ctx, b->scratch);
    for (int i = 0; i < b->nsteps; i++) {
        pcre2_match_data_free(b->steps[i].md);
        pcre2_code_free(b->steps[i].re);
    }
    fr_free(ctx, b);
}

/* Make ids 0..id valid slots. */
static fr_status hold_id(fr_bpe *b, int id) {
    if (id < b->nvocab) return FR_OK;
    size_t old = b->id_cap;
    int32_t *v = b->id_vocab, *a = b->id_added;
    size_t cap = old;
    if (fr_grow(b->ctx, (void **)&v, &cap, (size_t)id + 1, sizeof *v, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    b->id_vocab = v;
    cap = old;
    if (fr_grow(b->ctx, (void **)&a, &cap, (size_t)id + 1, sizeof *a, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    b->id_added = a, b->id_cap = cap;
    for (int i = b->nvocab; i <= id; i++) b->id_vocab[i] = b->id_added[i] = -1;
    b->nvocab = id + 1;
    return FR_OK;
}

/* An integer in [0, MAX_ID) (the range checked before any cast). */
static int is_id(double v) { return v >= 0 && v < MAX_ID && v == (double)(int)v; }

/* The vocabulary entry tok -> id (where: the file and member, for messages). */
static fr_status add_vocab(fr_bpe *b, const char *where, const char *tok, double idv) {
    if (!is_id(idv))
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: token '%s': id %g is not an integer in [0, %d)",
                       where, tok, idv, MAX_ID);
    int id = (int)idv;
    size_t n = strlen(tok), e;
    if (!n) return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: an empty token (id %d)", where, id);
    uint64_t h = hash_bytes(tok, n);
    if (smap_find(&b->vocab, tok, n, h) >= 0)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: token '%s' appears twice", where, tok);
    if (hold_id(b, id)) return FR_ERR_NOMEM;
    if (b->id_vocab[id] >= 0)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: id %d is given to both '%s' and '%s'", where, id,
                       b->vocab.pool + b->vocab.ent[b->id_vocab[id]].off, tok);
    if (smap_add(b->ctx, &b->vocab, tok, n, h, id, &e)) return FR_ERR_NOMEM;
    b->id_vocab[id] = (int32_t)e;
    return FR_OK;
}

static int vocab_id(const fr_bpe *b, const char *s, size_t n) {
    int64_t e = smap_find(&b->vocab, s, n, hash_bytes(s, n));
    return e < 0 ? -1 : b->vocab.ent[e].val;
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33, x *= 0xff51afd7ed558ccdull, x ^= x >> 33, x *= 0xc4ceb9fe1a85ec53ull;
    return x ^ (x >> 33);
}

static int merge_find(const fr_bpe *b, int32_t a, int32_t c, int32_t *res) {
    if (!b->mcap) return -1;
    uint64_t k = ((uint64_t)(uint32_t)a << 32 | (uint32_t)c) + 1;
    for (size_t i = mix(k) & (b->mcap - 1);; i = (i + 1) & (b->mcap - 1)) {
        if (!b->mkey[i]) return -1;
        if (b->mkey[i] == k) return *res = b->mres[i], b->mrank[i];
    }
}

/* The merge (a, c) of rank `rank`: a, c and a+c must be tokens (where names
 * the file and line). A repeated pair takes the later rank. */
static fr_status add_merge(fr_bpe *b, const char *where, const char *a, size_t na, const char *c,
                           size_t nc, int rank) {
    char buf[1024];
    if (!na || !nc) return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: a merge with an empty part", where);
    if (na + nc >= sizeof buf)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: a merge over %zu bytes", where, sizeof buf - 1);
    int ia = vocab_id(b, a, na), ic = vocab_id(b, c, nc);
    memcpy(buf, a, na), memcpy(buf + na, c, nc), buf[na + nc] = 0;
    int ir = vocab_id(b, buf, na + nc);
    if (ia < 0 || ic < 0 || ir < 0) {
        const char *what = ia < 0 ? a : ic < 0 ? c : buf;
        int wn = ia < 0 ? (int)na : ic < 0 ? (int)nc : (int)(na + nc);
        return fr_fail(b->ctx, FR_ERR_FORMAT,
                       "%s: merge '%.*s %.*s': '%.*s' is not in the vocabulary", where, (int)na, a,
                       (int)nc, c, wn, what);
    }
    if ((b->mn + 1) * 2 > b->mcap) {
        size_t cap = b->mcap ? b->mcap * 2 : 1024;
        uint64_t *key = fr_calloc(b->ctx, cap * sizeof *key, FR_MEM_OTHER);
        int32_t *rk = fr_alloc(b->ctx, cap * sizeof *rk, FR_MEM_OTHER);
        int32_t *rs = fr_alloc(b->ctx, cap * sizeof *rs, FR_MEM_OTHER);
        if (!key || !rk || !rs) {
            fr_free(b->ctx, key), fr_free(b->ctx, rk), fr_free(b->ctx, rs);
            return FR_ERR_NOMEM;
        }
        for (size_t j = 0; j < b->mcap; j++) {
            if (!b->mkey[j]) continue;
            size_t i = mix(b->mkey[j]) & (cap - 1);
            while (key[i]) i = (i + 1) & (cap - 1);
            key[i] = b->mkey[j], rk[i] = b->mrank[j], rs[i] = b->mres[j];
        }
        fr_free(b->ctx, b->mkey), fr_free(b->ctx, b->mrank), fr_free(b->ctx, b->mres);
        b->mkey = key, b->mrank = rk, b->mres = rs, b->mcap = cap;
    }
    uint64_t k = ((uint64_t)(uint32_t)ia << 32 | (uint32_t)ic) + 1;
    size_t i = mix(k) & (b->mcap - 1);
    while (b->mkey[i] && b->mkey[i] != k) i = (i + 1) & (b->mcap - 1);
    if (!b->mkey[i]) b->mn++;
    b->mkey[i] = k, b->mrank[i] = rank, b->mres[i] = ir;
    return FR_OK;
}

fr_status fr_bpe_add_special(fr_bpe *b, const char *content, int id) {
    size_t n = strlen(content), e;
    if (!n) return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: an empty added token (id %d)", b->name, id);
    if (id < 0 || id >= MAX_ID)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: added token '%s': id %d out of [0, %d)", b->name,
                       content, id, MAX_ID);
    uint64_t h = hash_bytes(content, n);
    int64_t old = smap_find(&b->added, content, n, h);
    if (old >= 0) {
        if (b->added.ent[old].val == id) return FR_OK;
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: added token '%s' has ids %d and %d", b->name,
                       content, b->added.ent[old].val, id);
    }
    if (hold_id(b, id)) return FR_ERR_NOMEM;
    if (b->id_added[id] >= 0)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: id %d is given to added tokens '%s' and '%s'",
                       b->name, id, b->added.pool + b->added.ent[b->id_added[id]].off, content);
    if (smap_add(b->ctx, &b->added, content, n, h, id, &e)) return FR_ERR_NOMEM;
    b->id_added[id] = (int32_t)e;
    b->added_first[(unsigned char)content[0]] = 1;
    return FR_OK;
}

int fr_bpe_lookup(const fr_bpe *b, const char *s) {
    size_t n = strlen(s);
    int64_t e = smap_find(&b->added, s, n, hash_bytes(s, n));
    return e >= 0 ? b->added.ent[e].val : vocab_id(b, s, n);
}

int fr_bpe_vocab(const fr_bpe *b) { return b->nvocab; }
int fr_bpe_template_bos(const fr_bpe *b) { return b->template_bos; }

int fr_bpe_cuttable(const fr_bpe *b) {
    for (int i = 0; i < b->nsteps; i++)
        if (b->steps[i].prefix_space) return 0;
    return !b->user_split;
}

/* Every byte's symbol must be a token (a byte-level vocabulary). */
static fr_status finish(fr_bpe *b) {
    if (!b->nvocab) return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: an empty vocabulary", b->name);
    for (int c = 0; c < 256; c++) {
        b->byte_tok[c] = vocab_id(b, b->b2u[c], b->b2u_len[c]);
        if (b->byte_tok[c] < 0)
            return fr_fail(b->ctx, FR_ERR_FORMAT,
                           "%s: byte 0x%02x's symbol '%.*s' is not in the vocabulary (not a "
                           "byte-level BPE)",
                           b->name, c, (int)b->b2u_len[c], b->b2u[c]);
    }
    return FR_OK;
}

/* ---- pre-tokenizer steps ----------------------------------------------------- */

static const char *gpt2_pattern =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\x{85}\\p{L}\\p{N}]+"
    "|[\\s\\x{85}]+(?![^\\s\\x{85}])|[\\s\\x{85}]+";

static fr_status add_step(fr_bpe *b, const char *where, const char *pattern, size_t plen,
                          int literal, int prefix_space) {
    if (b->nsteps == MAX_STEPS)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: more than %d pre-tokenizers", where, MAX_STEPS);
    step *s = &b->steps[b->nsteps];
    memset(s, 0, sizeof *s);
    s->prefix_space = prefix_space;
    if (pattern) {
        int err;
        PCRE2_SIZE off;
        uint32_t opt =
            PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF | (literal ? PCRE2_LITERAL : 0);
        s->re = pcre2_compile((PCRE2_SPTR)pattern, plen, opt, &err, &off, NULL);
        if (!s->re) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(err, msg, sizeof msg);
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: pattern '%.*s': offset %zu: %s", where,
                           (int)plen, pattern, (size_t)off, (char *)msg);
        }
        (void)pcre2_jit_compile(s->re, PCRE2_JIT_COMPLETE); /* the interpreter if JIT is absent */
        s->md = pcre2_match_data_create_from_pattern(s->re, NULL);
        if (!s->md) {
            pcre2_code_free(s->re);
            return fr_fail(b->ctx, FR_ERR_NOMEM, "%s: out of memory for a pattern", where);
        }
    }
    b->nsteps++;
    return FR_OK;
}

/* ---- encode ------------------------------------------------------------------ */

static fr_status emit(fr_bpe *b, const int32_t *ids, size_t n) {
    if (*b->out_n + n > *b->out_cap) {
        size_t cap = *b->out_cap ? *b->out_cap : 256;
        while (cap < *b->out_n + n) cap *= 2;
        int32_t *p = realloc(*b->out, cap * sizeof *p);
        if (!p) return fr_fail(b->ctx, FR_ERR_NOMEM, "out of memory for %zu token ids", cap);
        *b->out = p, *b->out_cap = cap;
    }
    memcpy(*b->out + *b->out_n, ids, n * sizeof *ids);
    *b->out_n += n;
    return FR_OK;
}

/* bpe(piece): encoder.py's loop on ids. */
static fr_status bpe_piece(fr_bpe *b, const char *s, size_t n) {
    uint64_t h = hash_bytes(s, n);
    if (n <= CACHE_PIECE) {
        int64_t e = smap_find(&b->cache, s, n, h);
        if (e >= 0) {
            const int32_t *c = b->cids + b->cache.ent[e].val;
            return emit(b, c + 1, (size_t)c[0]);
        }
    }
    if (fr_grow(b->ctx, (void **)&b->sym, &b->symcap, n, sizeof *b->sym, FR_MEM_OTHER))
        return FR_ERR_NOMEM;
    int32_t *sym = b->sym;
    size_t m = 0;
    if (b->ignore_merges) { /* a piece that is a token is that token */
        if (fr_grow(b->ctx, (void **)&b->scratch, &b->scap, 2 * n, 1, FR_MEM_OTHER))
            return FR_ERR_NOMEM;
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            unsigned char c = (unsigned char)s[i];
            memcpy(b->scratch + k, b->b2u[c], b->b2u_len[c]), k += b->b2u_len[c];
        }
        int id = vocab_id(b, b->scratch, k);
        if (id >= 0) sym[m++] = id;
    }
    if (!m) {
        for (size_t i = 0; i < n; i++) {
            sym[m++] = b->byte_tok[(unsigned char)s[i]]; /* all 256 are tokens (finish) */
        }
        while (m > 1) {
            int best = INT_MAX;
            int32_t a = -1, c = -1, res = -1, r;
            for (size_t i = 0; i + 1 < m; i++) {
                int rk = merge_find(b, sym[i], sym[i + 1], &r);
                if (rk >= 0 && rk < best) best = rk, a = sym[i], c = sym[i + 1], res = r;
            }
            if (best == INT_MAX) break;
            size_t j = 0;
            for (size_t i = 0; i < m;) {
                if (i + 1 < m && sym[i] == a && sym[i + 1] == c) sym[j++] = res, i += 2;
                else sym[j++] = sym[i++];
            }
            m = j;
        }
    }
    if (n <= CACHE_PIECE && b->cache.n < CACHE_ENTRIES) {
        if (fr_grow(b->ctx, (void **)&b->cids, &b->ccap, b->cn + m + 1, sizeof *b->cids,
                    FR_MEM_OTHER) ||
            smap_add(b->ctx, &b->cache, s, n, h, (int32_t)b->cn, NULL))
            return FR_ERR_NOMEM;
        b->cids[b->cn] = (int32_t)m;
        memcpy(b->cids + b->cn + 1, b->sym, m * sizeof *b->sym);
        b->cn += m + 1;
    }
    return emit(b, b->sym, m);
}

/* Pre-tokenizer step k on s[0..n): its pieces go to step k + 1, the last
 * step's to bpe. A split keeps what lies between matches as pieces too
 * (Hugging Face's Isolated). */
static fr_status run_step(fr_bpe *b, int k, const char *s, size_t n) {
    if (!n) return FR_OK;
    if (k == b->nsteps) return bpe_piece(b, s, n);
    step *st = &b->steps[k];
    if (st->prefix_space && s[0] != ' ') {
        char *p = malloc(n + 1);
        if (!p) return fr_fail(b->ctx, FR_ERR_NOMEM, "out of memory for a piece of %zu bytes", n);
        p[0] = ' ', memcpy(p + 1, s, n);
        step saved = *st;
        st->prefix_space = 0; /* this piece now starts with one */
        fr_status r = run_step(b, k, p, n + 1);
        *st = saved;
        free(p);
        return r;
    }
    if (!st->re) return run_step(b, k + 1, s, n);
    size_t at = 0;
    fr_status r = FR_OK;
    while (at < n && !r) {
        int rc = pcre2_match(st->re, (PCRE2_SPTR)s, n, at, 0, st->md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return fr_fail(b->ctx, FR_ERR_ARG, "%s: pre-tokenizer: %s", b->name, (char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t m0 = ov[0], m1 = ov[1];
        if (m1 <= m0) { /* an empty match (a user's pattern): step over one byte */
            m1 = m0 + 1;
            if (m1 > n) break;
            r = run_step(b, k + 1, s + at, m1 - at);
            at = m1;
            continue;
        }
        if (m0 > at) r = run_step(b, k + 1, s + at, m0 - at);
        if (!r) r = run_step(b, k + 1, s + m0, m1 - m0);
        at = m1;
    }
    if (!r && at < n) r = run_step(b, k + 1, s + at, n - at);
    return r;
}

fr_status fr_bpe_encode(fr_bpe *b, const char *text, size_t len, int32_t **ids, size_t *n,
                        size_t *cap) {
    b->out = ids, b->out_n = n, b->out_cap = cap;
    size_t start = 0;
    fr_status r = FR_OK;
    for (size_t i = 0; i < len && !r; i++) {
        if (!b->added_first[(unsigned char)text[i]]) continue;
        int best = -1;
        size_t blen = 0;
        for (size_t e = 0; e < b->added.n; e++) { /* leftmost-longest */
            const sent *x = &b->added.ent[e];
            if (x->len > blen && x->len <= len - i &&
                !memcmp(text + i, b->added.pool + x->off, x->len))
                best = x->val, blen = x->len;
        }
        if (best < 0) continue;
        r = run_step(b, 0, text + start, i - start);
        int32_t id = best;
        if (!r) r = emit(b, &id, 1);
        start = i + blen;
        i = start - 1;
    }
    if (!r) r = run_step(b, 0, text + start, len - start);
    b->out = NULL, b->out_n = b->out_cap = NULL;
    return r;
}

/* ---- decode ------------------------------------------------------------------ */

static fr_status put(fr_bpe *b, char **out, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = *cap ? *cap : 256;
        while (c < *len + n + 1) c *= 2;
        char *p = realloc(*out, c);
        if (!p) return fr_fail(b->ctx, FR_ERR_NOMEM, "out of memory for %zu bytes of text", c);
        *out = p, *cap = c;
    }
    memcpy(*out + *len, s, n);
    *len += n;
    (*out)[*len] = 0;
    return FR_OK;
}

/* An added token decodes to its content; a vocabulary token to the bytes of
 * its characters through bytes_to_unicode's inverse (a character outside it
 * stays as its UTF-8, as Hugging Face's ByteLevel decoder keeps it). */
fr_status fr_bpe_decode(fr_bpe *b, const int32_t *ids, size_t n, char **out, size_t *len,
                        size_t *cap) {
    if (put(b, out, len, cap, "", 0)) return FR_ERR_NOMEM;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        if (id < 0 || id >= b->nvocab || (b->id_added[id] < 0 && b->id_vocab[id] < 0))
            return fr_fail(b->ctx, FR_ERR_ARG, "%s: id %d (at %zu) is not a token (vocabulary %d)",
                           b->name, id, i, b->nvocab);
        if (b->id_added[id] >= 0) {
            const sent *x = &b->added.ent[b->id_added[id]];
            if (put(b, out, len, cap, b->added.pool + x->off, x->len)) return FR_ERR_NOMEM;
            continue;
        }
        const sent *x = &b->vocab.ent[b->id_vocab[id]];
        const unsigned char *s = (const unsigned char *)b->vocab.pool + x->off;
        for (size_t j = 0; j < x->len;) {
            unsigned cp = s[j];
            size_t k = 1;
            if (cp >= 0xC0 && cp < 0xE0 && j + 1 < x->len)
                cp = (cp & 31) << 6 | (s[j + 1] & 63), k = 2;
            char c;
            if (cp < 324 && b->cp2byte[cp] >= 0) {
                c = (char)b->cp2byte[cp];
                if (put(b, out, len, cap, &c, 1)) return FR_ERR_NOMEM;
                j += k;
                continue;
            }
            k = 1; /* any other character: its own bytes */
            while (j + k < x->len && (s[j + k] & 0xC0) == 0x80) k++;
            if (put(b, out, len, cap, (const char *)s + j, k)) return FR_ERR_NOMEM;
            j += k;
        }
    }
    return FR_OK;
}

/* ---- readers ----------------------------------------------------------------- */

static fr_status read_vocab(fr_bpe *b, const char *where, const fr_json *v) {
    if (!v || v->kind != FR_JSON_OBJECT)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: not an object of token -> id", where);
    for (size_t i = 0; i < v->n; i++) {
        if (v->items[i].kind != FR_JSON_NUMBER)
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: token '%s': its id is not a number", where,
                           v->keys[i]);
        fr_status st = add_vocab(b, where, v->keys[i], v->items[i].number);
        if (st) return st;
    }
    return FR_OK;
}

static fr_status parse_merges_text(fr_bpe *b, const char *name, const char *t, size_t len) {
    size_t line = 0, at = 0;
    int rank = 0;
    char where[600];
    while (at < len) {
        size_t e = at;
        while (e < len && t[e] != '\n') e++;
        size_t le = e;
        line++;
        if (le > at && t[le - 1] == '\r') le--;
        snprintf(where, sizeof where, "%s: line %zu", name, line);
        if (le - at >= 8 && !memcmp(t + at, "#version", 8)) {
            at = e + 1;
            continue;
        }
        if (le == at) {
            if (e >= len || e + 1 >= len) break; /* the end */
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: an empty line (a merge is 'a b')", where);
        }
        const char *sp = memchr(t + at, ' ', le - at);
        if (!sp || memchr(sp + 1, ' ', (size_t)(t + le - sp - 1)))
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: '%.*s' is not two tokens split by one space",
                           where, (int)(le - at > 80 ? 80 : le - at), t + at);
        if (memchr(t + at, 0, le - at))
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: a NUL byte", where);
        fr_status st = add_merge(b, where, t + at, (size_t)(sp - t - at), sp + 1,
                                 (size_t)(t + le - sp - 1), rank++);
        if (st) return st;
        at = e + 1;
    }
    return FR_OK;
}

fr_status fr_bpe_from_vocab_merges(fr_ctx *ctx, const char *vname, const char *vtext, size_t vlen,
                                   const char *mname, const char *mtext, size_t mlen,
                                   fr_bpe **out) {
    *out = NULL;
    fr_bpe *b = bpe_new(ctx, vname);
    if (!b) return FR_ERR_NOMEM;
    fr_json v;
    fr_status st = fr_json_parse(ctx, vname, vtext, vlen, &v);
    if (st) return fr_bpe_free(b), st;
    st = read_vocab(b, vname, &v);
    fr_json_free(ctx, &v);
    if (!st) st = parse_merges_text(b, mname, mtext, mlen);
    if (!st) st = add_step(b, vname, gpt2_pattern, PCRE2_ZERO_TERMINATED, 0, 0);
    if (!st) st = finish(b);
    if (st) return fr_bpe_free(b), st;
    *out = b;
    return FR_OK;
}

static const char *type_of(const fr_json *v) {
    const fr_json *t = fr_json_get(v, "type");
    return t && t->kind == FR_JSON_STRING ? t->str : NULL;
}

static int truthy(const fr_json *v, const char *key, int dflt) {
    const fr_json *x = fr_json_get(v, key);
    return x && x->kind == FR_JSON_BOOL ? x->boolean : dflt;
}

static int is_null(const fr_json *v) { return !v || v->kind == FR_JSON_NULL; }

/* One pre-tokenizer of tokenizer.json (where: its path in the file). */
static fr_status read_pretok(fr_bpe *b, const char *where, const fr_json *p, int last) {
    const char *type = type_of(p);
    if (!type)
        return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: %s: a pre-tokenizer without a type", b->name,
                       where);
    if (!strcmp(type, "ByteLevel")) {
        if (!last)
            return fr_fail(b->ctx, FR_ERR_FORMAT,
                           "%s: %s: ByteLevel before another pre-tokenizer is not supported",
                           b->name, where);
        return add_step(b, b->name, truthy(p, "use_regex", 1) ? gpt2_pattern : NULL,
                        PCRE2_ZERO_TERMINATED, 0, truthy(p, "add_prefix_space", 0));
    }
    if (last)
        return fr_fail(b->ctx, FR_ERR_FORMAT,
                       "%s: %s: the pre-tokenizers end in %s, not ByteLevel (not a byte-level BPE)",
                       b->name, where, type);
    if (!strcmp(type, "Digits"))
        return add_step(b, b->name, truthy(p, "individual_digits", 0) ? "\\p{N}" : "\\p{N}+",
                        PCRE2_ZERO_TERMINATED, 0, 0);
    if (!strcmp(type, "Split")) {
        const fr_json *pat = fr_json_get(p, "pattern"), *beh = fr_json_get(p, "behavior");
        const fr_json *re = fr_json_get(pat, "Regex"), *lit = fr_json_get(pat, "String");
        const fr_json *s = re ? re : lit;
        if (!s || s->kind != FR_JSON_STRING)
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: %s: Split without a Regex or String pattern",
                           b->name, where);
        if (!beh || beh->kind != FR_JSON_STRING || strcmp(beh->str, "Isolated"))
            return fr_fail(b->ctx, FR_ERR_FORMAT,
                           "%s: %s: Split behavior '%s' is not supported (only Isolated)", b->name,
                           where, beh && beh->kind == FR_JSON_STRING ? beh->str : "?");
        if (truthy(p, "invert", 0))
            return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: %s: an inverted Split is not supported",
                           b->name, where);
        b->user_split = 1;
        return add_step(b, b->name, s->str, strlen(s->str), s == lit, 0);
    }
    return fr_fail(b->ctx, FR_ERR_FORMAT, "%s: %s: pre-tokenizer %s is not supported", b->name,
                   where, type);
}

static fr_status read_tokenizer_json(fr_bpe *b, const fr_json *root) {
    fr_ctx *ctx = b->ctx;
    const char *n = b->name;
    char where[600];
    if (root->kind != FR_JSON_OBJECT)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: not a JSON object", n);
    const fr_json *model = fr_json_get(root, "model");
    if (!model || model->kind != FR_JSON_OBJECT)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: no \"model\" object", n);
    const char *mt = type_of(model);
    if (mt && strcmp(mt, "BPE"))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: model type %s is not supported (only BPE)", n, mt);
    const fr_json *x = fr_json_get(model, "dropout");
    if (!is_null(x) && !(x->kind == FR_JSON_NUMBER && x->number == 0))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: BPE dropout is not supported", n);
    if (truthy(model, "byte_fallback", 0))
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: BPE with byte_fallback (SentencePiece-style) is not supported: use "
                       "the model's tokenizer.model",
                       n);
    const char *affix[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        x = fr_json_get(model, affix[i]);
        if (!is_null(x) && !(x->kind == FR_JSON_STRING && !x->str[0]))
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: BPE %s is not supported", n, affix[i]);
    }
    b->ignore_merges = truthy(model, "ignore_merges", 0);
    snprintf(where, sizeof where, "%s: model.vocab", n);
    fr_status st = read_vocab(b, where, fr_json_get(model, "vocab"));
    if (st) return st;
    const fr_json *m = fr_json_get(model, "merges");
    if (!m || m->kind != FR_JSON_ARRAY)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: model.merges is not an array", n);
    for (size_t i = 0; i < m->n; i++) {
        const fr_json *e = &m->items[i];
        snprintf(where, sizeof where, "%s: model.merges[%zu]", n, i);
        if (e->kind == FR_JSON_STRING) {
            const char *sp = strchr(e->str, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return fr_fail(ctx, FR_ERR_FORMAT, "%s: '%s' is not two tokens split by one space",
                               where, e->str);
            st = add_merge(b, where, e->str, (size_t)(sp - e->str), sp + 1, strlen(sp + 1), (int)i);
        } else if (e->kind == FR_JSON_ARRAY && e->n == 2 && e->items[0].kind == FR_JSON_STRING &&
                   e->items[1].kind == FR_JSON_STRING) {
            st = add_merge(b, where, e->items[0].str, strlen(e->items[0].str), e->items[1].str,
                           strlen(e->items[1].str), (int)i);
        } else st = fr_fail(ctx, FR_ERR_FORMAT, "%s: not \"a b\" or [\"a\", \"b\"]", where);
        if (st) return st;
    }
    x = fr_json_get(root, "normalizer");
    if (!is_null(x))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: normalizer %s is not supported (only null)", n,
                       type_of(x) ? type_of(x) : "?");
    const fr_json *pt = fr_json_get(root, "pre_tokenizer");
    if (is_null(pt))
        return fr_fail(ctx, FR_ERR_FORMAT,
                       "%s: no pre_tokenizer (a byte-level BPE needs ByteLevel)", n);
    const char *ptt = type_of(pt);
    if (ptt && !strcmp(ptt, "Sequence")) {
        const fr_json *l = fr_json_get(pt, "pretokenizers");
        if (!l || l->kind != FR_JSON_ARRAY || !l->n)
            return fr_fail(ctx, FR_ERR_FORMAT, "%s: a Sequence pre-tokenizer without a list", n);
        for (size_t i = 0; i < l->n; i++) {
            snprintf(where, sizeof where, "pre_tokenizer.pretokenizers[%zu]", i);
            if ((st = read_pretok(b, where, &l->items[i], i + 1 == l->n))) return st;
        }
    } else if ((st = read_pretok(b, "pre_tokenizer", pt, 1))) return st;
    x = fr_json_get(root, "decoder");
    if (!is_null(x) && (!type_of(x) || strcmp(type_of(x), "ByteLevel")))
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: decoder %s is not supported (only ByteLevel)", n,
                       type_of(x) ? type_of(x) : "?");
    const fr_json *at = fr_json_get(root, "added_tokens");
    if (!is_null(at) && at->kind != FR_JSON_ARRAY)
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: added_tokens is not an array", n);
    for (size_t i = 0; at && i < at->n; i++) {
        const fr_json *e = &at->items[i], *id = fr_json_get(e, "id"),
                      *c = fr_json_get(e, "content");
        if (!id || id->kind != FR_JSON_NUMBER || !is_id(id->number) || !c ||
            c->kind != FR_JSON_STRING)
            return fr_fail(ctx, FR_ERR_FORMAT,
                           "%s: added_tokens[%zu]: needs an integer \"id\" and a \"content\"", n,
                           i);
        const char *flags[] = {"single_word", "lstrip", "rstrip"};
        for (int k = 0; k < 3; k++)
            if (truthy(e, flags[k], 0))
                return fr_fail(ctx, FR_ERR_FORMAT,
                               "%s: added_tokens[%zu] ('%s'): %s is not supported", n, i, c->str,
                               flags[k]);
        if ((st = fr_bpe_add_special(b, c->str, (int)id->number))) return st;
    }
    const fr_json *pp = fr_json_get(root, "post_processor");
    if (!is_null(pp) && type_of(pp) && !strcmp(type_of(pp), "TemplateProcessing")) {
        const fr_json *single = fr_json_get(pp, "single");
        const fr_json *first =
            single && single->kind == FR_JSON_ARRAY && single->n ? &single->items[0] : NULL;
        const fr_json *sp = fr_json_get(first, "SpecialToken"), *sid = fr_json_get(sp, "id");
        if (sid && sid->kind == FR_JSON_STRING) {
            b->template_bos = fr_bpe_lookup(b, sid->str);
            if (b->template_bos < 0)
                return fr_fail(ctx, FR_ERR_FORMAT,
                               "%s: post_processor: special token '%s' is not a token", n,
                               sid->str);
        }
    }
    return finish(b);
}

fr_status fr_bpe_from_tokenizer_json(fr_ctx *ctx, const char *name, const char *text, size_t len,
                                     fr_bpe **out) {
    *out = NULL;
    fr_bpe *b = bpe_new(ctx, name);
    if (!b) return FR_ERR_NOMEM;
    fr_json root;
    fr_status st = fr_json_parse(ctx, name, text, len, &root);
    if (st) return fr_bpe_free(b), st;
    st = read_tokenizer_json(b, &root);
    fr_json_free(ctx, &root);
    if (st) return fr_bpe_free(b), st;
    *out = b;
    return FR_OK;
}
