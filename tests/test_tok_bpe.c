/* test_tok_bpe.c — byte-level BPE (src/tok/bpe.c) against OpenAI's
 * encoder.py algorithm: tests/ref/tok_ref.py trained a vocabulary of 300
 * merges on the fortunes text and encoded texts of Unicode, digits,
 * contractions, runs of spaces and <|endoftext|> with encoder.py's bpe()
 * (tests/data/tok/bpe_cases.txt). Each of the three files frugal reads
 * (vocab.json + merges.txt, a ByteLevel tokenizer.json, SmolLM's Digits +
 * ByteLevel tokenizer.json) must give exactly those ids and decode them to
 * the text. Then: decode(encode(x)) == x for random bytes (invalid UTF-8
 * included), invalid bytes as their own pieces, the streaming decoder, a
 * multi-megabyte vocab.json with \u escapes, and one clear message for each
 * malformed file; nothing stays allocated. */
#include <sys/stat.h>
#include "check.h"
#include "fault_sweep.h"
#include "scratch.h"
#include "tok/tokenizer.h"
#include "tok_cases.h"

static const char *src_dir(void) {
    const char *s = getenv("FR_SOURCE_DIR");
    return s && *s ? s : ".";
}

/* The id tok_ref.py gives byte b: its place in bytes_to_unicode's order
 * (the printable bytes first, then the others in increasing order). */
static int byte_id(int b) {
    int k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int c = 0; c < 256; c++) {
            int printable = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE;
            if (printable == !pass) {
                if (c == b) return k;
                k++;
            }
        }
    return -1;
}

static void check_cases(fr_ctx *ctx, fr_tokenizer *t, const char *label, tok_case *cases, int nc,
                        const char *key) {
    for (int i = 0; i < nc; i++) {
        const tok_list *want = tok_case_list(&cases[i], key);
        int32_t *ids;
        size_t n;
        fr_status st = fr_tokenizer_encode(t, cases[i].text, cases[i].len, 0, &ids, &n);
        CHECK(st == FR_OK, "%s %s: %s", label, cases[i].name, fr_last_error(ctx));
        if (st) continue;
        size_t first = 0;
        while (first < n && first < want->n && ids[first] == want->ids[first]) first++;
        CHECK(n == want->n && first == n, "%s %s: %zu ids, encoder.py %zu; first difference at %zu",
              label, cases[i].name, n, want->n, first);
        char *text;
        size_t len;
        st = fr_tokenizer_decode(t, want->ids, want->n, &text, &len);
        CHECK(!st && len == cases[i].len && !memcmp(text, cases[i].text, len),
              "%s %s: decode gives the text back", label, cases[i].name);
        free(text);
        free(ids);
    }
}

/* decode(encode(x)) == x for random byte strings: uniform bytes, and
 * mixtures of ASCII, valid multi-byte characters and broken sequences. */
static void round_trips(fr_ctx *ctx, fr_tokenizer *t, const char *label) {
    static const char *parts[] = {"a",
                                  "Z",
                                  " ",
                                  "  ",
                                  "\n",
                                  "\t",
                                  "'s",
                                  "'ll",
                                  "7",
                                  "42",
                                  "\xc3\xa9",
                                  "\xe4\xb8\xad",
                                  "\xf0\x9f\x98\x80",
                                  "\xc2\xa0",
                                  "\xc2\x85",
                                  "\xe3\x80\x80",
                                  "\x80",
                                  "\xbf",
                                  "\xc3",
                                  "\xe4\xb8",
                                  "\xf0\x9f",
                                  "\xed\xa0\x80",
                                  "\xf5",
                                  "\xff",
                                  "\xfe",
                                  "\xc0\xaf",
                                  "<|endoftext|>",
                                  "<|endof",
                                  "!?",
                                  "..."};
    uint64_t s = 12345;
    int bad = 0;
    for (int k = 0; k < 3000; k++) {
        char buf[1200];
        size_t len = 0;
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int mode = (int)(s >> 60) & 1, n = (int)((s >> 33) % 200);
        for (int i = 0; i < n && len < 1100; i++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            if (mode) {
                const char *p = parts[(s >> 33) % (sizeof parts / sizeof *parts)];
                memcpy(buf + len, p, strlen(p)), len += strlen(p);
            } else buf[len++] = (char)(s >> 40);
        }
        int32_t *ids;
        size_t nid, dl;
        char *d;
        if (fr_tokenizer_encode(t, buf, len, 0, &ids, &nid) ||
            fr_tokenizer_decode(t, ids, nid, &d, &dl)) {
            CHECK(0, "%s: random string %d: %s", label, k, fr_last_error(ctx));
            return;
        }
        bad += dl != len || memcmp(d, buf, len);
        free(ids);
        free(d);
    }
    CHECK(bad == 0, "%s: %d of 3000 random byte strings do not come back", label, bad);
}

/* Pushing ids one at a time gives, with the flush, exactly decode(ids);
 * no piece but the flush ends inside a UTF-8 character. */
static void stream(fr_ctx *ctx, fr_tokenizer *t, const tok_case *c, const char *key) {
    const tok_list *l = tok_case_list(c, key);
    fr_tok_stream *s = fr_tok_stream_new(t);
    char *all = malloc(c->len + 1), *b;
    size_t at = 0, n;
    int split = 0;
    for (size_t i = 0; i < l->n; i++) {
        if (fr_tok_stream_push(s, l->ids[i], &b, &n)) {
            CHECK(0, "stream push: %s", fr_last_error(ctx));
            break;
        }
        if (at + n <= c->len) memcpy(all + at, b, n);
        at += n;
        if (n && ((unsigned char)b[n - 1] >= 0xC0)) split++;
        free(b);
    }
    CHECK(fr_tok_stream_flush(s, &b, &n) == FR_OK, "flush");
    if (at + n <= c->len) memcpy(all + at, b, n);
    at += n;
    free(b);
    CHECK(at == c->len && !memcmp(all, c->text, at),
          "stream %s: the pushes and the flush are the text", c->name);
    CHECK(split == 0, "stream %s: %d pieces end in a UTF-8 lead byte", c->name, split);
    fr_tok_stream_free(s);
    free(all);
}

/* Loading path must fail with a message holding each needle. */
static void refused(fr_ctx *ctx, const char *path, const char *n1, const char *n2) {
    fr_tokenizer *t = fr_tokenizer_load(ctx, path);
    const char *e = fr_last_error(ctx);
    CHECK(!t && strstr(e, n1) && (!n2 || strstr(e, n2)), "%s: wanted '%s' / '%s', got '%s'", path,
          n1, n2 ? n2 : "", t ? "(loaded)" : e);
    fr_tokenizer_free(t);
}

static void put_file(const char *dir, const char *name, const char *text) {
    char p[700];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    spit(p, text, strlen(text));
}

/* The 256 byte symbols as vocab.json members "sym": id, then `extra`. */
static char *byte_vocab(const char *extra) {
    size_t cap = 8192 + strlen(extra), len = 0;
    char *v = malloc(cap);
    len += (size_t)sprintf(v + len, "{");
    for (int b = 0; b < 256; b++) {
        /* the symbol of byte b: the byte itself or 256 + its rank among the others */
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        int cp = b;
        if (!printable) {
            cp = 256;
            for (int c = 0; c < b; c++)
                cp += !((c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE);
        }
        len += (size_t)sprintf(v + len, "%s\"\\u%04x\": %d", b ? ", " : "", cp, byte_id(b));
    }
    len += (size_t)sprintf(v + len, "%s}", extra);
    return v;
}

static void bad_files(fr_ctx *ctx) {
    char d[600], p[700];
    snprintf(d, sizeof d, "%s/bad", tmpdir);
    mkdir(d, 0777);
    snprintf(p, sizeof p, "%s/vocab.json", d);
    char *v = byte_vocab(", \"ab\": 256");
    put_file(d, "vocab.json", v);
    refused(ctx, p, "merges.txt", "No such file");
    put_file(d, "merges.txt", "#version: 0.2\na b\na c d\n");
    refused(ctx, p, "merges.txt: line 3", "not two tokens split by one space");
    put_file(d, "merges.txt", "a b\nb c\n");
    refused(ctx, p, "merges.txt: line 2", "'bc' is not in the vocabulary");
    put_file(d, "merges.txt", "a b\n\na b\n");
    refused(ctx, p, "line 2", "an empty line");
    put_file(d, "merges.txt", "a b\n");
    fr_tokenizer *t = fr_tokenizer_load(ctx, p);
    CHECK(t && fr_tokenizer_vocab(t) == 257 && fr_tokenizer_bos(t) == -1, "a minimal vocab: %s",
          t ? "" : fr_last_error(ctx));
    if (t) {
        int32_t *ids;
        size_t n;
        CHECK(!fr_tokenizer_encode(t, "abab", 4, 1, &ids, &n) && n == 2 && ids[0] == 256 &&
                  ids[1] == 256,
              "'abab' is the merge twice (no BOS to add)");
        free(ids);
        CHECK(fr_tokenizer_check_vocab(ctx, t, 256) == FR_ERR_ARG &&
                  strstr(fr_last_error(ctx), "257 ids") && strstr(fr_last_error(ctx), "only 256"),
              "a model of 256 rows refuses 257 ids: %s", fr_last_error(ctx));
        CHECK(fr_tokenizer_check_vocab(ctx, t, 300) == FR_OK, "a padded embedding takes them");
        char *text;
        size_t len;
        int32_t id = 999;
        CHECK(fr_tokenizer_decode(t, &id, 1, &text, &len) == FR_ERR_ARG &&
                  strstr(fr_last_error(ctx), "id 999"),
              "decoding an unknown id: %s", fr_last_error(ctx));
        fr_tokenizer_free(t);
    }
    put_file(d, "tokenizer_config.json", "{\"bos_token\": \"<s>\"}");
    refused(ctx, p, "tokenizer_config.json: bos_token '<s>' is not a token", NULL);
    put_file(d, "tokenizer_config.json", "{\"bos_token\": ");
    refused(ctx, p, "tokenizer_config.json: byte 14", NULL);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", d);
    unlink(p);
    snprintf(p, sizeof p, "%s/vocab.json", d);
    free(v);
    v = byte_vocab(", \"ab\": 2.5");
    put_file(d, "vocab.json", v);
    refused(ctx, p, "vocab.json: token 'ab': id 2.5 is not an integer", NULL);
    free(v);
    v = byte_vocab(", \"ab\": 0");
    put_file(d, "vocab.json", v);
    refused(ctx, p, "vocab.json: id 0 is given to both", NULL);
    put_file(d, "vocab.json", "{\"a\": 0, \"b\": 1, \"ab\": 2}");
    refused(ctx, p, "byte 0x00's symbol", "not a byte-level BPE");
    put_file(d, "vocab.json", "{\"a\": 0, ");
    refused(ctx, p, "vocab.json: byte 9", "expected a member name");
    free(v);

    /* tokenizer.json: from the good one, one fault at a time */
    char good[700];
    size_t len;
    snprintf(good, sizeof good, "%s/tests/data/tok/bpe/tokenizer.json", src_dir());
    char *tj = slurp(good, &len);
    snprintf(p, sizeof p, "%s/tokenizer.json", d);
    spit(p, tj, len / 2);
    refused(ctx, p, "tokenizer.json: byte", NULL);
    struct {
        const char *from, *to, *n1, *n2;
    } edits[] = {
        {"\"type\": \"BPE\"", "\"type\": \"WordPiece\"", "model type WordPiece is not supported",
         NULL},
        {"\"pre_tokenizer\": {\"type\": \"ByteLevel\"",
         "\"pre_tokenizer\": {\"type\": \"Metaspace\"",
         "pre_tokenizer: the pre-tokenizers end in Metaspace", NULL},
        {"\"normalizer\": null", "\"normalizer\": {\"type\": \"NFC\"}",
         "normalizer NFC is not supported", NULL},
        {"\"byte_fallback\": false", "\"byte_fallback\": true", "byte_fallback", "tokenizer.model"},
        {"\"merges\": [\"", "\"merges\": [\"\\u0120\\u0120 \\u0120q\", \"",
         "model.merges[0]: merge", "is not in the vocabulary"},
        {"\"lstrip\": false", "\"lstrip\": true", "added_tokens[0]", "lstrip is not supported"},
        {"\"decoder\": {\"type\": \"ByteLevel\"", "\"decoder\": {\"type\": \"WordPiece\"",
         "decoder WordPiece is not supported", NULL},
    };
    for (size_t k = 0; k < sizeof edits / sizeof *edits; k++) {
        char *at = strstr(tj, edits[k].from);
        CHECK(at != NULL, "edit %zu: '%s' is in tokenizer.json", k, edits[k].from);
        if (!at) continue;
        FILE *f = fopen(p, "wb");
        fwrite(tj, 1, (size_t)(at - tj), f);
        fputs(edits[k].to, f);
        fputs(at + strlen(edits[k].from), f);
        fclose(f);
        refused(ctx, p, edits[k].n1, edits[k].n2);
    }
    /* add_prefix_space: "Hello" encodes as " Hello" does without it, at
     * the start and after a special token; such a text cannot be cut */
    char *at = strstr(tj, "\"add_prefix_space\": false");
    CHECK(at && at < strstr(tj, "\"post_processor\""), "the pre-tokenizer's add_prefix_space");
    if (at) {
        FILE *f = fopen(p, "wb");
        fwrite(tj, 1, (size_t)(at - tj), f);
        fputs("\"add_prefix_space\": true", f);
        fputs(at + strlen("\"add_prefix_space\": false"), f);
        fclose(f);
        fr_tokenizer *ps = fr_tokenizer_load(ctx, p), *plain = fr_tokenizer_load(ctx, good);
        CHECK(ps && plain, "load: %s", fr_last_error(ctx));
        if (ps && plain) {
            static const char a[] = "Hello world<|endoftext|>again",
                              b[] = " Hello world<|endoftext|> again";
            int32_t *ia, *ib;
            size_t na, nb;
            CHECK(!fr_tokenizer_encode(ps, a, sizeof a - 1, 0, &ia, &na) &&
                      !fr_tokenizer_encode(plain, b, sizeof b - 1, 0, &ib, &nb) && na == nb &&
                      !memcmp(ia, ib, na * sizeof *ia),
                  "add_prefix_space adds a space to each part");
            free(ia), free(ib);
            CHECK(!fr_tokenizer_cuttable(ps) && fr_tokenizer_cuttable(plain),
                  "a prefix space makes a text uncuttable");
        }
        fr_tokenizer_free(ps);
        fr_tokenizer_free(plain);
    }
    free(tj);
    unlink(p);
    refused(ctx, "/nonexistent/tokenizer.json", "/nonexistent/tokenizer.json", "no such");
    snprintf(p, sizeof p, "%s/empty", tmpdir);
    mkdir(p, 0777);
    refused(ctx, p, "a directory without tokenizer.model, tokenizer.json or vocab.json", NULL);
    rmdir(p);
    snprintf(p, sizeof p, "%s/x.model", d);
    put_file(d, "x.model", "not a model at all");
    refused(ctx, p, "x.model: not a SentencePiece model", NULL);
    const char *names[] = {"vocab.json", "merges.txt", "x.model"};
    for (int i = 0; i < 3; i++) {
        snprintf(p, sizeof p, "%s/%s", d, names[i]);
        unlink(p);
    }
    rmdir(d);
}

/* A vocab.json of several megabytes (200k tokens with \u escapes): the JSON
 * reader and the tables take it; ids decode to the escaped characters. */
static void big_vocab(fr_ctx *ctx) {
    enum { N = 200000 };
    size_t cap = 40 * N + 10000, len;
    char *head = byte_vocab(""), *v = malloc(cap);
    len = strlen(head) - 1; /* without its '}' */
    memcpy(v, head, len);
    for (int i = 0; i < N; i++)
        len += (size_t)sprintf(v + len, ", \"\\u0120t\\u00e9%d\": %d", i, 256 + i);
    v[len++] = '}';
    char d[600], p[700];
    snprintf(d, sizeof d, "%s/big", tmpdir);
    mkdir(d, 0777);
    snprintf(p, sizeof p, "%s/vocab.json", d);
    spit(p, v, len);
    put_file(d, "merges.txt", "#version: 0.2\n");
    fr_tokenizer *t = fr_tokenizer_load(ctx, p);
    CHECK(t && fr_tokenizer_vocab(t) == 256 + N, "a %zu-byte vocab.json: %s", len,
          t ? "" : fr_last_error(ctx));
    if (t) {
        int32_t id = 256 + 123456;
        char *text;
        size_t n;
        /* U+0120 is byte 0x20; U+00E9 (printable) is byte 0xE9 */
        CHECK(!fr_tokenizer_decode(t, &id, 1, &text, &n) && n == 9 &&
                  !memcmp(text,
                          " t\xe9"
                          "123456",
                          9),
              "id %d decodes to ' t\\xe9123456'", id);
        free(text);
        fr_tokenizer_free(t);
    }
    unlink(p);
    snprintf(p, sizeof p, "%s/merges.txt", d);
    unlink(p);
    rmdir(d);
    free(v);
    free(head);
}

/* Load the three forms, encode and decode a text of Unicode and
 * <|endoftext|> with each (the allocation sweep's scenario). */
static fr_status load_encode(fr_ctx *ctx, void *arg) {
    const tok_case *c = arg;
    const char *files[] = {"bpe/vocab.json", "bpe/tokenizer.json", "bpe_digits/tokenizer.json"};
    for (int f = 0; f < 3; f++) {
        char p[700];
        snprintf(p, sizeof p, "%s/tests/data/tok/%s", src_dir(), files[f]);
        fr_tokenizer *t = fr_tokenizer_load(ctx, p);
        if (!t) return ctx->err_status;
        int32_t *ids;
        char *d;
        size_t n, dl;
        fr_status st = fr_tokenizer_encode(t, c->text, c->len, 1, &ids, &n);
        if (!st) st = fr_tokenizer_decode(t, ids, n, &d, &dl);
        if (!st) free(ids), free(d);
        fr_tokenizer_free(t);
        if (st) return st;
    }
    return FR_OK;
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    char p[700];
    tok_case cases[TOK_MAX_CASES];
    snprintf(p, sizeof p, "%s/tests/data/tok/bpe_cases.txt", src_dir());
    int nc = tok_cases_read(p, cases);
    CHECK(nc == 8, "%s: %d cases", p, nc);
    if (nc < 1) return check_done();
    if (scratch_make("tok_bpe")) return fprintf(stderr, "scratch dir\n"), 1;
    int fds = open_fds();

    const char *files[] = {"bpe/vocab.json", "bpe/tokenizer.json", "bpe",
                           "bpe_digits/tokenizer.json"};
    for (int f = 0; f < 4; f++) {
        snprintf(p, sizeof p, "%s/tests/data/tok/%s", src_dir(), files[f]);
        fr_tokenizer *t = fr_tokenizer_load(ctx, p);
        CHECK(t != NULL, "load %s: %s", p, fr_last_error(ctx));
        if (!t) continue;
        CHECK(!strcmp(fr_tokenizer_kind(t), "bpe") && fr_tokenizer_vocab(t) == 557 &&
                  fr_tokenizer_bos(t) == 556 && fr_tokenizer_eos(t) == 556 &&
                  !fr_tokenizer_adds_bos(t),
              "%s: bpe, 557 ids, <|endoftext|> (556) BOS and EOS, no BOS added: %s %d %d %d %d",
              files[f], fr_tokenizer_kind(t), fr_tokenizer_vocab(t), fr_tokenizer_bos(t),
              fr_tokenizer_eos(t), fr_tokenizer_adds_bos(t));
        check_cases(ctx, t, files[f], cases, nc, f == 3 ? "ids_digits" : "ids");
        round_trips(ctx, t, files[f]);
        int32_t *ids;
        size_t n;
        CHECK(!fr_tokenizer_encode(t, "x\xff\xfey", 4, 1, &ids, &n) && n == 5 && ids[0] == 556 &&
                  ids[1] == byte_id('x') && ids[2] == byte_id(0xff) && ids[3] == byte_id(0xfe) &&
                  ids[4] == byte_id('y'),
              "%s: BOS, then 'x', the invalid bytes FF FE, 'y' as byte tokens", files[f]);
        free(ids);
        CHECK(fr_tokenizer_cuttable(t), "%s: GPT-2's pre-tokenizer: a text may be cut", files[f]);
        stream(ctx, t, &cases[0], f == 3 ? "ids_digits" : "ids");
        stream(ctx, t, &cases[1], f == 3 ? "ids_digits" : "ids");
        fr_tokenizer_free(t);
    }
    fault_sweep("load, encode, decode", load_encode, &cases[1]);
    bad_files(ctx);
    big_vocab(ctx);
    tok_cases_free(cases, nc);
    CHECK(open_fds() == fds, "no descriptor left open");
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated_total == 0, "%zu bytes still allocated", s.allocated_total);
    fr_ctx_free(ctx);
    remove_tree();
    return check_done();
}
