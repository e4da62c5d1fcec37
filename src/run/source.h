/* source.h — the batches a run trains and evaluates on, from either kind of
 * data: images with labels or targets (fr_dataset through fr_loader), or,
 * for a token model, one token stream (fr_tokens through fr_token_loader)
 * whose last val_fraction is held out for validation. The trainer and the
 * budget see one interface; what the data is stays here. */
#ifndef FR_SOURCE_H
#define FR_SOURCE_H

#include "data/batches.h"
#include "data/loader.h"
#include "data/tokens.h"
#include "run/trainer.h"

typedef struct fr_source {
    fr_ctx *ctx;
    fr_dataset *train, *test; /* image data */
    fr_tokens *tokens;        /* token data */
    fr_token_split split;
    int seq;           /* tokens a window (the model's --seq); 0 for image data */
    size_t handles;    /* bytes the open data holds, measured */
    int rank, ranks;   /* data parallel: the loaders give this rank's slice (0 ranks: all) */
    int eval_progress; /* 1: an evaluation redraws its progress on stderr (a terminal) */
    int head_rows;     /* the eval step's fused head (fr_step_opts.head_rows) */
} fr_source;

/* Open what cfg names for model m (a token model reads cfg->data as text,
 * shards or .npy, split at cfg->val_fraction) and check it against the
 * model: sample shapes and labels, or every token id below the vocabulary
 * and both parts at least one window plus one. train = 0: only the test
 * split (image data; a token stream is opened whole either way). Training
 * files without test files and without a directory the user named
 * (cfg->data NULL or cfg->data_default): no test split (see
 * fr_source_has_test), never the default directory's. */
fr_status fr_source_open(fr_ctx *ctx, const fr_train_cfg *cfg, const fr_model *m, int train,
                         fr_source *s);
void fr_source_close(fr_source *s);
/* Whether there is a test (or validation) split to evaluate on: not when
 * training files were named without test files and without a --data the
 * user chose (cfg->data_default); fr_source_open then said so on stderr,
 * s->test is NULL, and fr_batches_open refuses the test split (FR_ERR_ARG). */
int fr_source_has_test(const fr_source *s);
/* The data's terms of a budget (sizes, counts, the open handles). */
void fr_source_budget(const fr_source *s, const fr_train_cfg *cfg, fr_budget_data *bd);

/* train = 1: the training split, shuffled with seed; 0: the test or
 * validation split, in order. limit: the first N samples or windows (0: all). */
fr_status fr_batches_open(fr_source *s, int train, int batch, uint64_t seed, int queue,
                          int64_t limit, fr_batches *b);

/* An evaluation's totals over the batches this process scored (with ranks,
 * its slices, with an eval step of the largest slice): summed over the ranks
 * element by element, they are the one process's. Doubles, so that one fr_comm_sum_f64 adds them. */
typedef struct fr_eval_sums {
    double loss; /* sum over samples of the sample's mean loss (per token for a token model) */
    double hits; /* argmax hits: samples, or token positions */
    double seen; /* samples (token windows) */
    double rows; /* positions a sample scores: 1, or the window's T (the same on every rank) */
} fr_eval_sums;
fr_status fr_source_evaluate_sums(fr_source *s, fr_model *m, int batch, int64_t limit,
                                  fr_eval_sums *out);
/* Mean loss (nats per sample, or per token, weighted by the tokens: every
 * window has T) and accuracy (per sample, or per token; NaN for MSE). */
void fr_eval_sums_result(const fr_model *m, const fr_eval_sums *t, double *acc, double *loss);
/* Mean loss and accuracy as above over the test or validation split, with
 * an eval step of `batch` (this process's batches only). */
fr_status fr_source_evaluate(fr_source *s, fr_model *m, int batch, int64_t limit, double *acc,
                             double *loss);

#endif
