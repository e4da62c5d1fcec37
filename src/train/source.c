/* source.c — a run's data for the trainer: image datasets or a token
 * stream, opened, checked against the model and cut into batches. */
#include <math.h>
#include <string.h>
#include "train/source.h"

static fr_status open_tokens(fr_ctx *ctx, const fr_train_cfg *cfg, const fr_model *m,
                             fr_source *s) {
    fr_status st;
    s->seq = fr_model_seq(m);
    if (!(s->tokens = fr_tokens_open(ctx, cfg->data))) return FR_ERR_IO;
    /* the vocabulary: the rows of the first embedding's table */
    int vocab = 0;
    for (size_t i = 0; i < m->n_layers && !vocab; i++)
        if (m->layers[i].kind == FR_L_EMBEDDING)
            vocab = (int)m->params[m->layers[i].wparam].shape.d[0];
    if ((st = fr_tokens_check(ctx, s->tokens, vocab, s->seq))) return st;
    return fr_tokens_split(ctx, s->tokens, cfg->val_fraction, s->seq, &s->split);
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
    if (fr_model_seq(m)) {
        st = open_tokens(ctx, cfg, m, s);
    } else if ((train && !(s->train = fr_dataset_open_split(
                               ctx, cfg->data, "train", cfg->train_images, cfg->train_labels))) ||
               !(s->test = fr_dataset_open_split(ctx, cfg->data, "t10k", cfg->test_images,
                                                 cfg->test_labels))) {
        st = FR_ERR_IO;
    } else if (!train || !(st = fr_data_check(ctx, m, s->train))) {
        st = fr_data_check(ctx, m, s->test);
    }
    fr_mem_empty_cache(ctx);
    fr_mem_get_stats(ctx, &m1);
    s->handles = (m1.reserved - m1.cached) - (m0.reserved - m0.cached);
    return st;
}

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
        bd->n_test = fr_dataset_len(s->test);
    }
    bd->limit_train = cfg->limit_train;
    bd->limit_test = cfg->limit_test;
    bd->queue = cfg->queue;
    bd->eval_batch = cfg->eval_batch;
    bd->handles = s->handles;
    bd->ranks = s->ranks; /* under mpirun: the budget is this rank's, at the stage it trains */
    bd->zero = s->ranks > 1 ? cfg->zero : 0;
}

fr_status fr_batches_open(fr_source *s, int train, int batch, uint64_t seed, int queue,
                          int64_t limit, fr_batches *b) {
    memset(b, 0, sizeof *b);
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
    fr_token_loader_opts to = {batch, s->seq, train, seed, queue, 0, begin, end, s->rank, s->ranks};
    b->tok = fr_token_loader_new(s->ctx, s->tokens, &to);
    b->batch = batch;
    return b->tok ? FR_OK : FR_ERR_ARG;
}

void fr_batches_close(fr_batches *b) {
    fr_loader_free(b->img);
    fr_token_loader_free(b->tok);
    memset(b, 0, sizeof *b);
}

int fr_batches_global_n(const fr_batches *b) {
    return b->img ? fr_loader_global_n(b->img) : b->batch; /* token batches are all whole */
}

int64_t fr_batches_count(const fr_batches *b) {
    return b->img ? fr_loader_num_batches(b->img) : fr_token_loader_num_batches(b->tok);
}

fr_status fr_batches_start(fr_batches *b, int epoch, int64_t skip) {
    return b->img ? fr_loader_start(b->img, epoch, skip)
                  : fr_token_loader_start(b->tok, epoch, skip);
}

void fr_batches_set_hand(fr_batches *b, fr_hand_fn hand, void *user, int lag) {
    if (b->img) fr_loader_set_hand(b->img, hand, user, lag);
    else if (b->tok) fr_token_loader_set_hand(b->tok, hand, user, lag);
}

fr_status fr_batches_next(fr_batches *b, fr_batch *out, int *done) {
    if (b->img) return fr_loader_next(b->img, out, done);
    fr_token_batch tb;
    fr_status st = fr_token_loader_next(b->tok, &tb, done);
    memset(out, 0, sizeof *out);
    if (!st && !*done) {
        out->n = tb.B;
        out->idx = tb.x;
        out->y = tb.y;
    }
    return st;
}

fr_status fr_source_evaluate_sums(fr_source *s, fr_model *m, int batch, int64_t limit,
                                  fr_eval_sums *out) {
    memset(out, 0, sizeof *out);
    fr_batches b;
    fr_status st = fr_batches_open(s, 0, batch, 0, FR_EVAL_QUEUE, limit, &b);
    if (st) return st;
    fr_step_opts so = {0};
    so.batch = b.batch; /* with ranks: the largest slice of it, ceil(batch/ranks) */
    if (s->ranks > 1) so.batch = (b.batch + s->ranks - 1) / s->ranks;
    fr_step *e = fr_step_compile(m, &so);
    if (!e) {
        fr_batches_close(&b);
        return FR_ERR_NOMEM;
    }
    st = fr_batches_start(&b, 0, 0);
    out->rows = s->tokens ? s->seq : 1;
    while (!st) {
        fr_batch bt;
        int done = 0;
        if ((st = fr_batches_next(&b, &bt, &done)) || done) break;
        float L;
        int c;
        if ((st = fr_step_run(e, &bt, &L, &c))) break;
        out->loss += (double)L * bt.n;
        out->hits += c;
        out->seen += bt.n;
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
