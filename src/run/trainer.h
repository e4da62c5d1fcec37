/* trainer.h — the training loop: data loader -> step -> optimizer ->
 * metrics -> atomic checkpoint, with progress on a terminal, log lines
 * otherwise, JSON lines for scripts, test accuracy after each epoch and the
 * memory summary at the end, one loop for every backend. Metrics are plain
 * numbers: nothing from a finished step stays allocated (the seeds'
 * `.item()` lesson). Declared here too, for the run's other files and the
 * CLI: the user's words for sizes and checkpoint modes (spec.c) and the
 * budget's split (budget.c). */
#ifndef FR_TRAINER_H
#define FR_TRAINER_H

#include <signal.h>
#include "data/dataset.h"
#include "train/step.h"

typedef struct fr_train_cfg {
    const char *model; /* file or built-in name */
    const char *data;  /* directory with {train,t10k}-{images,labels}-idx?-ubyte[.gz] */
    /* The step: batch (the global batch), optimizer, seed, budget (bytes the
     * engine may reserve, 0: no limit), checkpointing, micro-batches,
     * precision, optimizer state format, loss scaling, clipping, keep_grads,
     * offload, sync_upload, and under mpirun the ZeRO stage and the bucket
     * caps: one struct from the command line to the step. */
    fr_step_opts step;
    int epochs;
    const char *save;   /* checkpoint written after every epoch (atomically) */
    const char *resume; /* checkpoint to continue from */
    int json;           /* JSON lines on stdout instead of text */
    int progress;       /* 1 bar (terminal), 0 log lines, -1 none */
    int quiet; /* 0: results, notes and the summary; 1: warnings only; 2: nothing (another rank) */
    int64_t save_every;    /* > 0: also save every N optimizer steps (mid-epoch) */
    int save_weights_only; /* save a state_dict without optimizer state (fr_ckpt_save_weights) */
    int nanogpt_masks;     /* and with nanoGPT's attn.bias masks */
    /* set (by a signal handler) to a signal's number: save at the next step
     * boundary, then stop (res->stopped_by); NULL: never */
    volatile sig_atomic_t *stop;
    int64_t limit_train, limit_test; /* use only the first N samples (0: all) */
    int eval_batch;
    int queue;           /* prefetch depth */
    const char *freeze;  /* layers to freeze (fr_model_freeze) */
    const char *lora;    /* LoRA adapters, "r=8,alpha=16,...,target=..." (fr_model_lora_spec) */
    const char *adapter; /* PEFT adapter files to start from (run/adapter.h) */
    /* text data through a tokenizer (tok/tokenizer.h), tokenized once into a
     * cache (run/tokcache.h); tokenizer_default: it is the --model
     * directory's own, used only when the data is text */
    const char *tokenizer;
    int tokenizer_default;
    const char *save_adapter; /* after training: the adapters as PEFT's pair, in this directory */
    const char *merge;        /* after training: base + (alpha/r) B A as one state_dict */
    int batch_auto;           /* the largest batch that fits the budget */
    const char *init;         /* weights-only safetensors to start from, with a fresh optimizer */
    const char *train_images, *train_labels; /* explicit files instead of data's names */
    const char *test_images, *test_labels;
    int data_default;      /* 1: data is the CLI's default directory, not one the user named: with
                       * train_images and no test_images there is then no test split */
    int seq;               /* token models: positions a window (0: the model's context) */
    double val_fraction;   /* token data: the held-out tail (default 0.1) */
    int64_t steps;         /* stop after this many optimizer steps (0: the epochs decide) */
    int64_t eval_interval; /* token models: evaluate every N steps too (0: at the end) */
    /* Data parallel (parallel/comm.h; NULL: one process): step.batch is the
     * global batch, each rank trains on its slice of it (fr_loader_opts'
     * rule); the step's ranks, ZeRO stage and bucket caps are step's. */
    struct fr_comm *comm;
/* A language model evaluates this many validation windows unless --test-limit
 * says otherwise (nanoGPT estimates its loss on a sample of batches too). */
#define FR_LM_EVAL_WINDOWS 128
} fr_train_cfg;

/* The test samples (validation windows) an evaluation scores, 0 for all:
 * limit_test when given (-1: all, `--test-limit 0`), else every test
 * sample of an image set and FR_LM_EVAL_WINDOWS windows of a token stream. */
static inline int64_t fr_eval_limit(const fr_train_cfg *cfg, int tokens) {
    return cfg->limit_test > 0              ? cfg->limit_test
           : cfg->limit_test < 0 || !tokens ? 0
                                            : FR_LM_EVAL_WINDOWS;
}

/* "48MiB", "1.5GiB", "500MB", "64M" (binary), "123456" (bytes). */
fr_status fr_parse_bytes(const char *s, size_t *out, char *err, size_t errlen);
/* none|marks|all|sqrt|auto|every:N|revolve:S */
fr_status fr_parse_checkpoint(const char *s, fr_ckpt_mode *mode, int *arg, char *err,
                              size_t errlen);

/* The data a budget must hold besides the model (budget.c). */
typedef struct fr_budget_data {
    size_t sample;                   /* floats per sample */
    int64_t n_train, n_test;         /* samples in each split */
    int64_t limit_train, limit_test; /* the loaders use only the first N (0: all) */
    int queue;                       /* the training loader's prefetch depth */
    int eval_batch;                  /* 0: evaluate at the training micro-batch */
    size_t handles;                  /* bytes the open datasets hold (measured) */
    int assumed;                     /* 1: the datasets are not open; the above are assumptions */
    int seq; /* token data: tokens a window; n_train, n_test count windows, sample is unused */
    /* data parallel: the budget is one rank's of `ranks` at ZeRO stage
     * `zero` (ranks 0 or 1: one process), the step planned for its slice */
    int ranks, zero;
} fr_budget_data;

/* The user's budget and what takes it, as the allocator reserves it. */
typedef struct fr_budget {
    size_t total;    /* the user's budget */
    size_t datasets; /* the open datasets and the training permutation */
    size_t queue;    /* the training loader's (queue + 1) batch buffers */
    int queue_batches, batch;
    size_t eval;        /* while evaluating: eval loader and step beyond the arena they replace */
    size_t model;       /* parameters and buffers, from their shapes */
    size_t meta;        /* the model's description and what else is held before planning */
    size_t step;        /* what is left for the step */
    size_t step_need;   /* what its plan needs (the smallest plan's, when nothing fits) */
    int ranks, zero;    /* one rank's budget (fr_budget_data's) */
    size_t zero_saving; /* bytes ZeRO's sharding takes off the rank's step (in step_need) */
} fr_budget;

/* Split opts->budget (the user's) and plan the step in what is left; with
 * batch_auto the largest batch whose whole footprint fits. Returns the step
 * built but not materialized (nothing of the model allocated; its
 * o.budget is the user's), or NULL with a message naming the budget and
 * what takes it. Refuses before planning when the parameters alone do not
 * fit. */
fr_step *fr_budget_plan(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                        int batch_auto, fr_budget *b);
/* The smallest budget any plan of opts->batch fits in, as a refusal names
 * it (the budget's terms outside the step plus the smallest plan's share),
 * with that plan in *need; 0 if none could be planned (message set). Plans
 * on shapes: nothing of the model is allocated. */
size_t fr_budget_smallest(fr_model *m, const fr_step_opts *opts, const fr_budget_data *d,
                          fr_plan_need *need);
/* The split as a table, or a JSON object (no newline). */
void fr_budget_describe(const fr_budget *b, FILE *out, int json);

typedef struct fr_train_result {
    double final_loss, test_acc, test_loss, seconds;
    int epochs_done, batch;
    int64_t steps_done;
    int tokens; /* a language model: test_* are the validation split's, per token */
    size_t peak_rss_kib;
    size_t predicted_reserved;     /* the step's plan: persistent + arena + batch */
    size_t measured_reserved_peak; /* the allocator's peak reserved over the run */
    float loss_scale;              /* the dynamic loss scale at the end (1: none) */
    uint64_t skipped_steps;        /* steps skipped for inf/NaN gradients */
    int ranks;                     /* processes of a data-parallel run (1: one) */
    /* over the ranks: each category's allocated peak, then the total
     * allocated peak and the reserved peak (min and max) */
    size_t rank_peak_min[FR_MEM_CAT_COUNT + 2], rank_peak_max[FR_MEM_CAT_COUNT + 2];
    double comm_wait_s; /* seconds this rank waited for the gradient sums */
    int buckets;        /* how many */
    int stopped_by;     /* the signal cfg->stop named, after saving (0: ran to the end) */
} fr_train_result;

/* Check a dataset against the model before the first step: the per-sample
 * shape and dtype, the label range (or the targets' width for MSE); the
 * message names the file. */
fr_status fr_data_check(fr_ctx *ctx, const fr_model *m, const fr_dataset *ds);

fr_status fr_train(fr_ctx *ctx, const fr_train_cfg *cfg, fr_train_result *res);
/* One rank of `ranks` (> 1; else nothing changes): so's global batch becomes
 * the rank's step, the largest slice ceil(B / N) in as many micro-batches
 * as one process would use for B, every gradient stored (the sums come
 * before the update; rank_step_in_backward keeps what keep_grads said). */
void fr_rank_step_opts(fr_step_opts *so, int ranks);
/* The eval loader's prefetch depth (fr_source_evaluate; the budget counts it). */
#define FR_EVAL_QUEUE 1
size_t fr_peak_rss_kib(void);

#endif
