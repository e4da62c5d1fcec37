/* source.c — a run's data for the trainer: image datasets or a token
 * stream, opened, checked against the model and cut into batches. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <stdlib.h>
#include "run/source.h"
#include "run/tokcache.h"

static fr_status open_tokens(fr_ctx *ctx, const fr_train_cfg *cfg, const fr_model *m,
                             fr_source *s) {
    fr_status st;
    s->seq = fr_model_seq(m);
    /* the vocabulary: the rows of the first embedding's table */
    int vocab = 0;
    for (size_t i = 0; i < m->n_layers && !vocab; i++)
        if (m->layers[i].kind == FR_L_EMBEDDING)
            vocab = (int)m->params[m->layers[i].wparam].shape.d[0];
    char *cache = NULL;
    if (cfg->tokenizer) { /* text through the tokenizer, once, into a cache of ids */
        fr_tokens *probe = cfg->tokenizer_default ? fr_tokens_open(ctx, cfg->data) : NULL;
        const int text = !probe || fr_tokens_get_kind(probe) == FR_TOKENS_TEXT;
        fr_tokens_close(probe);
        fr_tokenizer *tok = text ? fr_tokenizer_load(ctx, cfg->tokenizer) : NULL;
        if (text && !tok) return FR_ERR_ARG;
        st = tok ? fr_tokenizer_check_vocab(ctx, tok, vocab) : FR_OK;
        if (tok && !st) st = fr_tokenize_cached(ctx, tok, cfg->data, &cache, cfg->quiet);
        fr_tokenizer_free(tok);
        if (st) return st;
    }
    s->tokens = fr_tokens_open(ctx, cache ? cache : cfg->data);
    free(cache);
    if (!s->tokens) return FR_ERR_IO;
    if ((st = fr_tokens_check(ctx, s->tokens, vocab, s->seq))) return st;
    return fr_tokens_split(ctx, s->tokens, cfg->val_fraction, s->seq, &s->split);
}

/* Training files named without test files and without a directory the
 * user chose: the test split is not taken from elsewhere (the default
 * directory holds another dataset); there is none, as in PyTorch without a
 * test loader. */
static int no_test_split(const fr_train_cfg *cfg, int train) {
    return train && cfg->train_images && !cfg->test_images && !cfg->test_labels &&
           (!cfg->data || cfg->data_default);
}

fr_status fr_source_open(fr_ctx *ctx, const fr_train_cfg *cfg, const fr_model *m, int train,
                         fr_source *s) {
    memset(s, 0, sizeof *s);
    s->ctx = ctx;
    /* what the open data holds, measured: blocks taken and still held (an
     * inflation buffer goes back to the system first) */
    fr_mem_stats m0, m1;
    fr_mem_empty_cache(ctx);
    fr_mem_get_stats(ctx, &m0);
    fr_status st = FR_OK;
    int no_test = no_test_split(cfg, train);
    if (fr_model_seq(m)) {
        st = open_tokens(ctx, cfg, m, s);
    } else if ((train && !(s->train = fr_dataset_open_split(
                               ctx, cfg->data, "train", cfg->train_images, cfg->train_labels))) ||
               (!no_test && !(s->test = fr_dataset_open_split(
                                  ctx, cfg->data, "t10k", cfg->test_images, cfg->test_labels)))) {
        st = FR_ERR_IO;
    } else if (!train || !(st = fr_data_check(ctx, m, s->train))) {
        if (s->test) st = fr_data_check(ctx, m, s->test);
    }
    if (!st && no_test)
        fprintf(stderr, "no test split given: no evaluation; give --test-images/--test-labels\n");
    fr_mem_empty_cache(ctx);
    fr_mem_get_stats(ctx, &m1);
    s->handles = (m1.reserved - m1.cached) - (m0.reserved - m0.cached);
    return st;
}

int fr_source_has_test(const fr_source *s) { return s->tokens || s->test; }

void fr_source_close(fr_source *s) {
    fr_dataset_close(s->train);
    fr_dataset_close(s->test);
    fr_tokens_close(s->tokens);
    memset(s, 0, sizeof *s);
}

static int64_t windows(const fr_source *s, int64_t tokens) {
    return tokens > 0 ? (tokens - 1) / s->seq : 0;
}

void fr_source_budget(const fr_source *s, const fr_train_cfg *cfg, fr_budget_data *bd) {
    memset(bd, 0, sizeof *bd);
    if (s->tokens) {
        bd->seq = s->seq;
        bd->n_train = windows(s, s->split.n_train);
        bd->n_test = windows(s, s->split.n_val);
    } else {
        int c, h, w;
        fr_dataset_sample_shape(s->train, &c, &h, &w);
        bd->sample = (size_t)c * h * w;
        bd->n_train = fr_dataset_len(s->train);
        bd->n_test = s->test ? fr_dataset_len(s->test) : 0;
    }
    bd->limit_train = cfg->limit_train;
    bd->limit_test = fr_eval_limit(cfg, s->tokens != NULL);
    bd->queue = cfg->queue;
    bd->eval_batch = cfg->eval_batch;
    bd->handles = s->handles;
    bd->ranks = s->ranks; /* under mpirun: the budget is this rank's, at the stage it trains */
    bd->zero = s->ranks > 1 ? cfg->step.zero : 0;
}

fr_status fr_batches_open(fr_source *s, int train, int batch, uint64_t seed, int queue,
                          int64_t limit, fr_batches *b) {
    memset(b, 0, sizeof *b);
    if (!s->tokens && !train && !s->test)
        return fr_fail(s->ctx, FR_ERR_ARG,
                       "no test split to evaluate on: give --test-images/--test-labels");
    if (!s->tokens) {
        fr_loader_opts lo = {batch, train, 0, seed, queue, limit, s->rank, s->ranks};
        b->img = fr_loader_new(s->ctx, train ? s->train : s->test, &lo);
        b->batch = batch;
        return b->img ? FR_OK : FR_ERR_NOMEM;
    }
    int64_t begin = train ? 0 : s->split.n_train;
    int64_t end = train ? s->split.n_train : s->split.n_train + s->split.n_val;
    if (limit > 0 && limit < windows(s, end - begin)) end = begin + limit * s->seq + 1;
    /* validation takes what windows there are, even fewer than a batch */
    int64_t w = windows(s, end - begin);
    if (!train && w < batch) batch = (int)w;
    fr_token_loader_opts to = {batch, s->seq, train,   seed,     queue, 0,
                               begin, end,    s->rank, s->ranks, !train};
    b->tok = fr_token_loader_new(s->ctx, s->tokens, &to);
    b->batch = batch;
    return b->tok ? FR_OK : FR_ERR_ARG;
}

fr_status fr_source_evaluate_sums(fr_source *s, fr_model *m, int batch, int64_t limit,
                                  fr_eval_sums *out) {
    memset(out, 0, sizeof *out);
    fr_batches b;
    fr_status st = fr_batches_open(s, 0, batch, 0, FR_EVAL_QUEUE, limit, &b);
    if (st) return st;
    fr_step_opts so = {0};
    so.head_rows = s->head_rows;
    so.batch = b.batch; /* with ranks: the largest slice of it, ceil(batch/ranks) */
    if (s->ranks > 1) so.batch = (b.batch + s->ranks - 1) / s->ranks;
    fr_step *e = fr_step_compile(m, &so);
    if (!e) {
        fr_batches_close(&b);
        return FR_ERR_NOMEM;
    }
    st = fr_batches_start(&b, 0, 0);
    out->rows = s->tokens ? s->seq : 1;
    int64_t nb = fr_batches_count(&b), k = 0;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    double shown = 0;
    while (!st) {
        fr_batch bt;
        int done = 0;
        if ((st = fr_batches_next(&b, &bt, &done)) || done) break;
        if (!bt.n) continue; /* this rank's slice of a last batch smaller than the ranks */
        float L;
        int c;
        if ((st = fr_step_run(e, &bt, &L, &c))) break;
        out->loss += (double)L * bt.n;
        out->hits += c;
        out->seen += bt.n;
        k++;
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double el = (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec);
        if (s->eval_progress && (el - shown > 0.25 || k == nb) && el > 1.0) {
            shown = el;
            fprintf(stderr, "\revaluating: batch %lld/%lld, %.0f s, ETA %.0f s   ", (long long)k,
                    (long long)nb, el, el / (double)k * (double)(nb - k));
            if (k == nb) fputc('\n', stderr);
        }
    }
    fr_batches_close(&b);
    fr_step_free(e);
    return st;
}

void fr_eval_sums_result(const fr_model *m, const fr_eval_sums *t, double *acc, double *loss) {
    /* an MSE model has no classes: its accuracy is not a number */
    *acc = m->loss != FR_LOSS_CROSS_ENTROPY ? NAN : t->seen ? t->hits / (t->seen * t->rows) : 0;
    *loss = t->seen ? t->loss / t->seen : 0;
}

fr_status fr_source_evaluate(fr_source *s, fr_model *m, int batch, int64_t limit, double *acc,
                             double *loss) {
    fr_eval_sums t;
    fr_status st = fr_source_evaluate_sums(s, m, batch, limit, &t);
    if (!st) fr_eval_sums_result(m, &t, acc, loss);
    return st;
}
