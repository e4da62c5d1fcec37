/* test_tok_spm.c — SentencePiece through libsentencepiece (src/tok/spm.cc)
 * against the `sentencepiece` Python module (Debian's python3-sentencepiece,
 * which tests/ref/tok_ref.py ran to write tests/data/tok/spm_cases.txt): the
 * ids of the whole fortunes text and of texts with tabs, newlines, runs of
 * spaces and characters the model never saw (unknown), and the text each
 * decodes to. The model itself is trained here again with spm_train on the
 * same text and arguments (tests/data/tok/spm_train_args.txt) and must be
 * the committed file byte for byte (spm_train with one thread is
 * deterministic). Then: BOS, the streaming decoder, what invalid UTF-8
 * becomes (each bad byte U+FFFD, then unknown), and malformed models. */
#include <sys/stat.h>
#include "check.h"
#include "scratch.h"
#include "tok/tokenizer.h"
#include "tok_cases.h"

static const char *src_dir(void) {
    const char *s = getenv("FR_SOURCE_DIR");
    return s && *s ? s : ".";
}

static int32_t *encode(fr_ctx *ctx, fr_tokenizer *t, const char *s, size_t len, int bos,
                       size_t *n) {
    int32_t *ids = NULL;
    if (fr_tokenizer_encode(t, s, len, bos, &ids, n)) {
        CHECK(0, "encode: %s", fr_last_error(ctx));
        *n = 0;
    }
    return ids;
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    char p[900], model[700];
    if (scratch_make("tok_spm")) return fprintf(stderr, "scratch dir\n"), 1;
    int fds = open_fds();
    snprintf(model, sizeof model, "%s/tests/data/tok/spm/tokenizer.model", src_dir());

    /* spm_train again, in the scratch directory (the model records its prefix) */
    size_t alen, mlen, tlen;
    snprintf(p, sizeof p, "%s/tests/data/tok/spm_train_args.txt", src_dir());
    char *args = slurp(p, &alen), *committed = slurp(model, &mlen);
    CHECK(args && committed, "read %s and the model", p);
    if (args && committed) {
        char cmd[2000];
        args[strcspn(args, "\n")] = 0;
        snprintf(cmd, sizeof cmd, "cd %s && %s >/dev/null 2>&1", tmpdir, args);
        int rc = system(cmd);
        snprintf(p, sizeof p, "%s/spm.model", tmpdir);
        char *trained = slurp(p, &tlen);
        CHECK(rc == 0 && trained && tlen == mlen && !memcmp(trained, committed, mlen),
              "spm_train (rc %d) made the committed model byte for byte (%zu vs %zu bytes)", rc,
              trained ? tlen : 0, mlen);
        free(trained);
        unlink(p);
        snprintf(p, sizeof p, "%s/spm.vocab", tmpdir);
        unlink(p);
    }
    free(args);

    tok_case cases[TOK_MAX_CASES];
    snprintf(p, sizeof p, "%s/tests/data/tok/spm_cases.txt", src_dir());
    int nc = tok_cases_read(p, cases);
    CHECK(nc == 8, "%s: %d cases", p, nc);
    snprintf(p, sizeof p, "%s/tests/data/tok/spm", src_dir());
    const char *paths[] = {model, p};
    for (int f = 0; f < 2 && nc > 0; f++) {
        fr_tokenizer *t = fr_tokenizer_load(ctx, paths[f]);
        CHECK(t != NULL, "load %s: %s", paths[f], fr_last_error(ctx));
        if (!t) continue;
        CHECK(!strcmp(fr_tokenizer_kind(t), "sentencepiece") && fr_tokenizer_vocab(t) == 1000 &&
                  fr_tokenizer_bos(t) == 1 && fr_tokenizer_eos(t) == 2 &&
                  fr_tokenizer_adds_bos(t) == 1,
              "%s: sentencepiece, 1000 pieces, BOS 1, EOS 2, adds BOS (spm_train's defaults)",
              paths[f]);
        CHECK(!fr_tokenizer_cuttable(t), "SentencePiece: a text is encoded whole");
        for (int i = 0; i < nc; i++) {
            const tok_list *want = tok_case_list(&cases[i], "ids");
            const tok_list *dec = tok_case_list(&cases[i], "decoded");
            size_t n;
            int32_t *ids = encode(ctx, t, cases[i].text, cases[i].len, 0, &n);
            size_t first = 0;
            while (first < n && first < want->n && ids[first] == want->ids[first]) first++;
            CHECK(n == want->n && first == n, "%s: %zu ids, Python's %zu; first difference at %zu",
                  cases[i].name, n, want->n, first);
            free(ids);
            char *text;
            size_t len;
            fr_status st = fr_tokenizer_decode(t, want->ids, want->n, &text, &len);
            CHECK(!st && len == dec->n && !memcmp(text, dec->bytes, len),
                  "%s: decode as Python's (%zu bytes vs %zu)", cases[i].name, st ? 0 : len, dec->n);
            free(text);
            ids = encode(ctx, t, cases[i].text, cases[i].len, 1, &n);
            CHECK(n == want->n + 1 && ids[0] == 1 &&
                      (n < 2 || !memcmp(ids + 1, want->ids, (n - 1) * sizeof *ids)),
                  "%s: add_bos puts id 1 first", cases[i].name);
            free(ids);
        }
        /* unknown characters: the reference itself has unk (id 0) where the
         * fortunes text has tabs and newlines (spm_train reads lines) */
        const tok_list *fl = tok_case_list(&cases[0], "ids");
        int unk = 0;
        for (size_t i = 0; i < fl->n; i++) unk += fl->ids[i] == 0;
        CHECK(unk > 100, "the fortunes text has unknown pieces (%d)", unk);

        /* streaming: the pushes and the flush are decode(ids) */
        for (int c = 0; c < 2; c++) {
            const tok_list *l = tok_case_list(&cases[c], "ids");
            const tok_list *dec = tok_case_list(&cases[c], "decoded");
            fr_tok_stream *s = fr_tok_stream_new(t);
            size_t at = 0, n;
            char *all = malloc(dec->n + 1), *b;
            int ok = 1;
            for (size_t i = 0; i <= l->n && ok; i++) {
                ok = !(i < l->n ? fr_tok_stream_push(s, l->ids[i], &b, &n)
                                : fr_tok_stream_flush(s, &b, &n));
                if (ok && at + n <= dec->n) memcpy(all + at, b, n);
                if (ok) at += n, free(b);
            }
            CHECK(ok && at == dec->n && !memcmp(all, dec->bytes, at),
                  "stream %s: the pushes and the flush are the decoded text", cases[c].name);
            free(all);
            fr_tok_stream_free(s);
        }

        /* invalid UTF-8: each bad byte is U+FFFD before encoding */
        size_t n1, n2;
        static const char bad_utf8[] = "ab\xff\xfe"
                                       "cd \xc3";
        static const char fffd[] = "ab\xef\xbf\xbd\xef\xbf\xbd"
                                   "cd \xef\xbf\xbd";
        int32_t *a = encode(ctx, t, bad_utf8, sizeof bad_utf8 - 1, 0, &n1);
        int32_t *b = encode(ctx, t, fffd, sizeof fffd - 1, 0, &n2);
        CHECK(n1 == n2 && n1 && !memcmp(a, b, n1 * sizeof *a),
              "invalid bytes encode as U+FFFD each (%zu vs %zu ids)", n1, n2);
        free(a);
        free(b);
        int32_t bad = 1000;
        char *text;
        size_t len;
        CHECK(fr_tokenizer_decode(t, &bad, 1, &text, &len) == FR_ERR_ARG &&
                  strstr(fr_last_error(ctx), "id 1000"),
              "id 1000 is refused: %s", fr_last_error(ctx));
        CHECK(fr_tokenizer_check_vocab(ctx, t, 999) == FR_ERR_ARG &&
                  strstr(fr_last_error(ctx), "1000 ids"),
              "a 999-row model: %s", fr_last_error(ctx));
        fr_tokenizer_free(t);
    }
    tok_cases_free(cases, nc > 0 ? nc : 0);

    /* tokenizer_config.json beside the model: add_bos_token false (a
     * Hugging Face setting) wins over SentencePiece's default */
    if (committed) {
        snprintf(p, sizeof p, "%s/tokenizer.model", tmpdir);
        spit(p, committed, mlen);
        snprintf(p, sizeof p, "%s/tokenizer_config.json", tmpdir);
        spit(p, "{\"add_bos_token\": false, \"bos_token\": \"<s>\"}", 44);
        fr_tokenizer *t = fr_tokenizer_load(ctx, tmpdir);
        CHECK(t && !fr_tokenizer_adds_bos(t) && fr_tokenizer_bos(t) == 1,
              "add_bos_token false from tokenizer_config.json: %s", t ? "" : fr_last_error(ctx));
        fr_tokenizer_free(t);
        unlink(p);
    }

    /* malformed models: truncated, and text that is not a model */
    if (committed) {
        snprintf(p, sizeof p, "%s/tokenizer.model", tmpdir);
        spit(p, committed, mlen / 3);
        fr_tokenizer *t = fr_tokenizer_load(ctx, p);
        CHECK(!t && strstr(fr_last_error(ctx), "tokenizer.model: not a SentencePiece model"),
              "a truncated model: %s", t ? "loaded" : fr_last_error(ctx));
        fr_tokenizer_free(t);
        spit(p, "hello", 5);
        t = fr_tokenizer_load(ctx, p);
        CHECK(!t && strstr(fr_last_error(ctx), "tokenizer.model: not a SentencePiece model"),
              "'hello': %s", t ? "loaded" : fr_last_error(ctx));
        fr_tokenizer_free(t);
        spit(p, "", 0);
        t = fr_tokenizer_load(ctx, p);
        CHECK(!t && strstr(fr_last_error(ctx), "tokenizer.model"), "an empty file: %s",
              t ? "loaded" : fr_last_error(ctx));
        fr_tokenizer_free(t);
        unlink(p);
    }
    free(committed);
    CHECK(open_fds() == fds, "no descriptor left open");
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated_total == 0, "%zu bytes still allocated", s.allocated_total);
    fr_ctx_free(ctx);
    remove_tree();
    return check_done();
}
