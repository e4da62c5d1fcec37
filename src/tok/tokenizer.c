/* tokenizer.c — which tokenizer a path names, the special tokens its
 * configuration files give, and the dispatch to bpe.c or spm.cc; the
 * streaming decoder. It owns no algorithm.
 *
 * A directory holds tokenizer.model, tokenizer.json or vocab.json (the first
 * found in that order). A file is SentencePiece when its name ends in
 * ".model", or when it is not JSON (its first non-blank byte is not '{');
 * a JSON file whose name ends in "vocab.json" is GPT-2's vocabulary (with
 * merges.txt beside it), any other a tokenizer.json.
 *
 * Special tokens, beside the file: tokenizer_config.json (bos_token,
 * eos_token, add_bos_token, added_tokens_decoder), then
 * special_tokens_map.json (bos_token, eos_token); a value is a string or an
 * object with "content". Without them a BPE's BOS is the one its
 * tokenizer.json's TemplateProcessing puts first, and `<|endoftext|>`, when
 * it is a token, is BOS and EOS (GPT-2's). Those of a vocab.json are
 * matched before pre-tokenization (Hugging Face's GPT2Tokenizer does).
 * SentencePiece's come from the model; add_bos_token defaults to 1 there
 * (Llama's), to 0 for BPE unless a template adds BOS. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "core/mem.h"
#include "io/file.h"
#include "io/json.h"
#include "tok/bpe.h"
#include "tok/spm.h"
#include "tok/tokenizer.h"

#define MAX_FILE (2ull << 30) /* tokenizer files above 2 GiB are refused */

struct fr_tokenizer {
    fr_ctx *ctx;
    fr_bpe *bpe;
    fr_spm *spm;
    int vocab, bos, eos, adds_bos;
    char path[4096];
};

/* The whole file (accounted, NUL-terminated) or NULL with a message. */
static char *read_all(fr_ctx *ctx, const char *path, const char *what, size_t *len) {
    char *buf = NULL;
    return fr_read_small(ctx, path, what, MAX_FILE, &buf, len) ? NULL : buf;
}

static int is_file(const char *p) {
    struct stat s;
    return !stat(p, &s) && S_ISREG(s.st_mode);
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* A special token's name in a config: a string or {"content": string}. */
static const char *token_name(const fr_json *v) {
    if (v && v->kind == FR_JSON_OBJECT) v = fr_json_get(v, "content");
    return v && v->kind == FR_JSON_STRING ? v->str : NULL;
}

/* An optional JSON file beside the tokenizer: 1 read, 0 absent, -1 bad. */
static int read_beside(fr_ctx *ctx, const char *dir, const char *name, fr_json *out) {
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    if (!is_file(p)) return 0;
    size_t len;
    char *text = read_all(ctx, p, "tokenizer configuration", &len);
    if (!text) return -1;
    fr_status st = fr_json_parse(ctx, p, text, len, out);
    fr_free(ctx, text);
    if (!st && out->kind != FR_JSON_OBJECT) {
        fr_json_free(ctx, out);
        fr_fail(ctx, FR_ERR_FORMAT, "%s: not a JSON object", p);
        return -1;
    }
    return st ? -1 : 1;
}

/* The id of a special token named in a config file (BPE): -1 if it names
 * none; -2 with a message if the name is not a token. */
static int special_id(fr_tokenizer *t, const char *file, const char *key, const char *name) {
    if (!name) return -1;
    int id = fr_bpe_lookup(t->bpe, name);
    if (id < 0) {
        fr_fail(t->ctx, FR_ERR_FORMAT, "%s: %s '%s' is not a token of %s", file, key, name,
                t->path);
        return -2;
    }
    if (fr_bpe_add_special(t->bpe, name, id)) return -2;
    return id;
}

/* BOS, EOS and add_bos_token from the files beside the tokenizer. */
static fr_status read_specials(fr_tokenizer *t, const char *dir) {
    fr_ctx *ctx = t->ctx;
    fr_json cfg, map;
    int has_cfg = read_beside(ctx, dir, "tokenizer_config.json", &cfg);
    if (has_cfg < 0) return ctx->err_status ? ctx->err_status : FR_ERR_FORMAT;
    int has_map = read_beside(ctx, dir, "special_tokens_map.json", &map);
    if (has_map < 0) {
        if (has_cfg) fr_json_free(ctx, &cfg);
        return ctx->err_status ? ctx->err_status : FR_ERR_FORMAT;
    }
    fr_status st = FR_OK;
    int adds = -1;
    const char *bos = NULL, *eos = NULL, *bos_file = NULL, *eos_file = NULL;
    const char *files[2] = {"tokenizer_config.json", "special_tokens_map.json"};
    fr_json *docs[2] = {has_cfg ? &cfg : NULL, has_map ? &map : NULL};
    for (int i = 0; i < 2; i++) {
        if (!docs[i]) continue;
        if (!bos && (bos = token_name(fr_json_get(docs[i], "bos_token")))) bos_file = files[i];
        if (!eos && (eos = token_name(fr_json_get(docs[i], "eos_token")))) eos_file = files[i];
    }
    if (has_cfg) {
        const fr_json *a = fr_json_get(&cfg, "add_bos_token");
        if (a && a->kind == FR_JSON_BOOL) adds = a->boolean;
    }
    if (t->spm) {
        t->bos = fr_spm_bos(t->spm), t->eos = fr_spm_eos(t->spm);
        t->adds_bos = adds >= 0 ? adds : t->bos >= 0;
    } else {
        const fr_json *dec = has_cfg ? fr_json_get(&cfg, "added_tokens_decoder") : NULL;
        for (size_t i = 0; dec && dec->kind == FR_JSON_OBJECT && i < dec->n && !st; i++) {
            char *end;
            long id = strtol(dec->keys[i], &end, 10);
            const char *c = token_name(&dec->items[i]);
            if (*end || end == dec->keys[i] || id < 0 || id > INT32_MAX || !c)
                st = fr_fail(ctx, FR_ERR_FORMAT,
                             "tokenizer_config.json: added_tokens_decoder: entry '%s' is not "
                             "an id with a content",
                             dec->keys[i]);
            else st = fr_bpe_add_special(t->bpe, c, (int)id);
        }
        if (!st) {
            int b = special_id(t, bos_file, "bos_token", bos);
            int e = special_id(t, eos_file, "eos_token", eos);
            if (b == -2 || e == -2) st = FR_ERR_FORMAT;
            int eot = fr_bpe_lookup(t->bpe, "<|endoftext|>");
            if (!st && eot >= 0 && !bos && !eos) { /* GPT-2's */
                st = fr_bpe_add_special(t->bpe, "<|endoftext|>", eot);
                b = eot, e = eot;
            }
            if (b < 0) b = fr_bpe_template_bos(t->bpe);
            t->bos = b, t->eos = e;
            t->adds_bos = adds >= 0 ? adds : fr_bpe_template_bos(t->bpe) >= 0;
        }
        t->vocab = fr_bpe_vocab(t->bpe);
    }
    if (has_cfg) fr_json_free(ctx, &cfg);
    if (has_map) fr_json_free(ctx, &map);
    return st;
}

static fr_status load_file(fr_tokenizer *t, const char *path) {
    fr_ctx *ctx = t->ctx;
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    else snprintf(dir, sizeof dir, ".");
    size_t len;
    char *text = read_all(ctx, path, "tokenizer", &len);
    if (!text) return ctx->err_status ? ctx->err_status : FR_ERR_IO;
    size_t i = 0;
    while (i < len && (text[i] == ' ' || text[i] == '\n' || text[i] == '\r' || text[i] == '\t'))
        i++;
    int json = !ends_with(path, ".model") && i < len && text[i] == '{';
    fr_status st = FR_OK;
    if (!json) {
        char err[512] = "";
        t->spm = fr_spm_load(text, len, err, sizeof err);
        if (!t->spm)
            st = fr_fail(ctx, FR_ERR_FORMAT, "%s: not a SentencePiece model: %s", path, err);
        else t->vocab = fr_spm_vocab(t->spm);
    } else if (ends_with(path, "vocab.json")) {
        char mp[4200];
        snprintf(mp, sizeof mp, "%s/merges.txt", dir);
        size_t mlen;
        char *merges = read_all(ctx, mp, "merges.txt (beside vocab.json)", &mlen);
        if (!merges) st = ctx->err_status ? ctx->err_status : FR_ERR_IO;
        else st = fr_bpe_from_vocab_merges(ctx, path, text, len, mp, merges, mlen, &t->bpe);
        fr_free(ctx, merges);
    } else st = fr_bpe_from_tokenizer_json(ctx, path, text, len, &t->bpe);
    fr_free(ctx, text);
    if (!st) st = read_specials(t, dir);
    return st;
}

fr_tokenizer *fr_tokenizer_load(fr_ctx *ctx, const char *file_or_dir) {
    struct stat s;
    if (stat(file_or_dir, &s)) {
        fr_fail(ctx, FR_ERR_IO, "%s: no such tokenizer file or directory", file_or_dir);
        return NULL;
    }
    fr_tokenizer *t = fr_calloc(ctx, sizeof *t, FR_MEM_OTHER);
    if (!t) return NULL;
    t->ctx = ctx;
    snprintf(t->path, sizeof t->path, "%s", file_or_dir);
    if (S_ISDIR(s.st_mode)) {
        static const char *names[] = {"tokenizer.model", "tokenizer.json", "vocab.json"};
        int found = 0;
        for (int i = 0; i < 3 && !found; i++) {
            snprintf(t->path, sizeof t->path, "%s/%s", file_or_dir, names[i]);
            found = is_file(t->path);
        }
        if (!found) {
            fr_fail(ctx, FR_ERR_IO,
                    "%s: a directory without tokenizer.model, tokenizer.json or vocab.json",
                    file_or_dir);
            fr_free(ctx, t);
            return NULL;
        }
    }
    if (load_file(t, t->path)) {
        fr_tokenizer_free(t);
        return NULL;
    }
    return t;
}

void fr_tokenizer_free(fr_tokenizer *t) {
    if (!t) return;
    fr_bpe_free(t->bpe);
    fr_spm_free(t->spm);
    fr_free(t->ctx, t);
}

const char *fr_tokenizer_kind(const fr_tokenizer *t) { return t->spm ? "sentencepiece" : "bpe"; }
int fr_tokenizer_vocab(const fr_tokenizer *t) { return t->vocab; }
int fr_tokenizer_bos(const fr_tokenizer *t) { return t->bos; }
int fr_tokenizer_eos(const fr_tokenizer *t) { return t->eos; }
int fr_tokenizer_adds_bos(const fr_tokenizer *t) { return t->adds_bos; }
const char *fr_tokenizer_path(const fr_tokenizer *t) { return t->path; }
int fr_tokenizer_cuttable(const fr_tokenizer *t) { return t->bpe && fr_bpe_cuttable(t->bpe); }

size_t fr_tokenizer_next_cut(const char *t, size_t n, size_t from) {
    for (size_t i = from ? from : 1; i < n; i++)
        if (t[i - 1] == '\n' && t[i] > ' ' && t[i] < 127) return i;
    return n;
}

fr_status fr_tokenizer_check_vocab(fr_ctx *ctx, const fr_tokenizer *t, int model_vocab) {
    if (t->vocab <= model_vocab) return FR_OK;
    return fr_fail(ctx, FR_ERR_ARG,
                   "%s: the tokenizer has %d ids, the model's embedding only %d rows (the "
                   "tokenizer and the model disagree)",
                   t->path, t->vocab, model_vocab);
}

fr_status fr_tokenizer_encode(fr_tokenizer *t, const char *text, size_t len, int add_bos,
                              int32_t **ids, size_t *n) {
    size_t cap = 0;
    fr_status st = FR_OK;
    *ids = NULL, *n = 0;
    if (add_bos && t->bos >= 0) {
        if (!(*ids = malloc(256 * sizeof **ids)))
            return fr_fail(t->ctx, FR_ERR_NOMEM, "out of memory for token ids");
        cap = 256, (*ids)[(*n)++] = t->bos;
    }
    if (t->spm) {
        char err[512] = "";
        if (fr_spm_encode(t->spm, text, len, ids, n, &cap, err, sizeof err))
            st = fr_fail(t->ctx, FR_ERR_ARG, "%s: encode: %s", t->path, err);
    } else st = fr_bpe_encode(t->bpe, text, len, ids, n, &cap);
    if (st) free(*ids), *ids = NULL, *n = 0;
    return st;
}

fr_status fr_tokenizer_decode(fr_tokenizer *t, const int32_t *ids, size_t n, char **text,
                              size_t *len) {
    *text = NULL, *len = 0;
    fr_status st = FR_OK;
    if (t->spm) {
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= t->vocab)
                return fr_fail(t->ctx, FR_ERR_ARG,
                               "%s: id %d (at %zu) is not a token (vocabulary %d)", t->path, ids[i],
                               i, t->vocab);
        char err[512] = "";
        if (fr_spm_decode(t->spm, ids, n, text, len, err, sizeof err))
            st = fr_fail(t->ctx, FR_ERR_ARG, "%s: decode: %s", t->path, err);
    } else {
        size_t cap = 0;
        st = fr_bpe_decode(t->bpe, ids, n, text, len, &cap);
    }
    if (st) free(*text), *text = NULL, *len = 0;
    return st;
}

/* ---- streaming decode -------------------------------------------------------
 * The ids since the last point where all text was final (a window that
 * starts with the last id then emitted, so SentencePiece keeps the space it
 * strips from a first piece). After each id the window is decoded; what is
 * past the bytes emitted is final except a trailing U+FFFD (a byte-fallback
 * character still incomplete) and a trailing incomplete UTF-8 sequence. */
struct fr_tok_stream {
    fr_tokenizer *t;
    int32_t *win;
    size_t n, cap;
    size_t emitted; /* bytes of decode(win) given out */
};

fr_tok_stream *fr_tok_stream_new(fr_tokenizer *t) {
    fr_tok_stream *s = calloc(1, sizeof *s);
    if (!s) fr_fail(t->ctx, FR_ERR_NOMEM, "out of memory for a decode stream");
    else s->t = t;
    return s;
}

void fr_tok_stream_free(fr_tok_stream *s) {
    if (!s) return;
    free(s->win);
    free(s);
}

/* Bytes of d[0..n) that are final: without a trailing U+FFFD or an
 * incomplete UTF-8 sequence at the end. */
static size_t final_bytes(const char *d, size_t n) {
    const unsigned char *u = (const unsigned char *)d;
    while (n >= 3 && u[n - 3] == 0xEF && u[n - 2] == 0xBF && u[n - 1] == 0xBD) n -= 3;
    for (size_t k = 1; k <= 3 && k <= n; k++) {
        unsigned char c = u[n - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        size_t need = c >= 0xF0 && c < 0xF8 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        if (c >= 0xF8) need = 1;
        if (need > k) n -= k; /* a sequence still short of bytes */
        break;
    }
    return n;
}

static fr_status give(fr_tok_stream *s, const char *d, size_t from, size_t to, char **bytes,
                      size_t *len) {
    size_t n = to > from ? to - from : 0;
    *bytes = malloc(n + 1);
    if (!*bytes) return fr_fail(s->t->ctx, FR_ERR_NOMEM, "out of memory for decoded text");
    if (n) memcpy(*bytes, d + from, n);
    (*bytes)[n] = 0;
    *len = n;
    return FR_OK;
}

fr_status fr_tok_stream_push(fr_tok_stream *s, int32_t id, char **bytes, size_t *len) {
    *bytes = NULL, *len = 0;
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 16;
        int32_t *w = realloc(s->win, cap * sizeof *w);
        if (!w) return fr_fail(s->t->ctx, FR_ERR_NOMEM, "out of memory for a decode stream");
        s->win = w, s->cap = cap;
    }
    s->win[s->n++] = id;
    char *d;
    size_t dl;
    fr_status st = fr_tokenizer_decode(s->t, s->win, s->n, &d, &dl);
    if (st) {
        s->n--;
        return st;
    }
    size_t fin = final_bytes(d, dl);
    if (fin < s->emitted) fin = s->emitted;
    st = give(s, d, s->emitted, fin, bytes, len);
    free(d);
    if (st) return st;
    s->emitted = fin;
    if (fin == dl) { /* all final: the window restarts at this id */
        if ((st = fr_tokenizer_decode(s->t, &id, 1, &d, &dl)))
            return free(*bytes), *bytes = NULL, st;
        free(d);
        s->win[0] = id, s->n = 1, s->emitted = dl;
    }
    return FR_OK;
}

fr_status fr_tok_stream_flush(fr_tok_stream *s, char **bytes, size_t *len) {
    char *d = NULL;
    size_t dl = 0;
    *bytes = NULL, *len = 0;
    fr_status st = fr_tokenizer_decode(s->t, s->win, s->n, &d, &dl);
    if (st) return st;
    st = give(s, d ? d : "", s->emitted, dl, bytes, len);
    free(d);
    s->n = 0, s->emitted = 0;
    return st;
}
