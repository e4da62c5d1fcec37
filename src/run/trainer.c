/* trainer.c — the training loop (see trainer.h). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>
#include "backend/backend.h"
#include "data/loader.h"
#include "parallel/buckets.h"
#include "parallel/comm.h"
#include "core/names.h"
#include "io/safetensors.h"
#include "run/adapter.h"
#include "run/checkpoint.h"
#include "train/feed.h"
#include "train/place.h"
#include "run/source.h"
#include "run/trainer.h"

size_t fr_peak_rss_kib(void) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (size_t)ru.ru_maxrss;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fmt_time(double s, char *buf, size_t len) {
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, len, "%ld:%02ld", t / 60, t % 60);
}

/* One line of progress: a bar on a terminal (redrawn in place), plain log
 * lines every tenth of an epoch otherwise. */
static void progress(const fr_train_cfg *cfg, int epoch, int64_t i, int64_t nb, double loss,
                     double t0, int64_t tokens) {
    if (cfg->progress < 0 || cfg->json) return;
    double el = now_s() - t0, rate = i / (el > 0 ? el : 1e-9);
    char tps[48] = "";
    if (tokens > 0) snprintf(tps, sizeof tps, " %.0f tok/s", rate * (double)tokens);
    char eta[32], elapsed[32];
    fmt_time((nb - i) / (rate > 0 ? rate : 1e-9), eta, sizeof eta);
    fmt_time(el, elapsed, sizeof elapsed);
    if (cfg->progress > 0) {
        int w = 30, fill = (int)(w * i / (nb ? nb : 1));
        char bar[64];
        for (int k = 0; k < w; k++) bar[k] = k < fill ? '#' : '.';
        bar[w] = 0;
        fprintf(stderr, "\repoch %d/%d [%s] %lld/%lld %.1f it/s%s %s<%s loss %.4f  ", epoch + 1,
                cfg->epochs, bar, (long long)i, (long long)nb, rate, tps, elapsed, eta, loss);
        if (i == nb) fputc('\n', stderr);
        fflush(stderr);
    } else {
        int64_t every = nb / 10 > 0 ? nb / 10 : 1;
        if (i % every == 0 || i == nb)
            fprintf(stderr,
                    "epoch %d/%d step %lld/%lld loss %.4f %.1f ms/step%s elapsed %s eta %s\n",
                    epoch + 1, cfg->epochs, (long long)i, (long long)nb, loss, 1e3 / rate, tps,
                    elapsed, eta);
    }
}

fr_status fr_data_check(fr_ctx *ctx, const fr_model *m, const fr_dataset *ds) {
    const fr_shape *in = &m->in; /* (c) for a flat input, else (c, h, w) */
    fr_data_spec spec = {(int)in->d[0], in->ndim == 3 ? (int)in->d[1] : 1,
                         in->ndim == 3 ? (int)in->d[2] : 1, 0, 0};
    if (m->loss == FR_LOSS_CROSS_ENTROPY) spec.classes = fr_model_num_classes(m);
    else spec.outputs = fr_model_num_classes(m);
    return fr_dataset_check(ctx, ds, &spec);
}

/* ---- data parallel: what the ranks must agree on ------------------------ */

#define AGREE_ITEMS 9
#define AGREE_LEN 256

static uint64_t fnv1a(uint64_t h, const void *p, size_t n) {
    const unsigned char *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 0x100000001b3ull;
    return h;
}

/* FNV-1a of a file's bytes; 0 if it cannot be read (a built-in model's name) */
static uint64_t file_hash(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    uint64_t h = 0xcbf29ce484222325ull;
    char buf[1 << 14];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) h = fnv1a(h, buf, n);
    fclose(f);
    return h;
}

static uint64_t shapes_hash(const fr_model *m) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        h = fnv1a(h, p->name, strlen(p->name));
        h = fnv1a(h, p->shape.d, sizeof(p->shape.d[0]) * (size_t)p->shape.ndim);
        h = fnv1a(h, &p->dtype, sizeof p->dtype);
        h = fnv1a(h, &p->trainable, sizeof p->trainable);
    }
    return h;
}

/* Every rank's model, options and data, exchanged at start-up: a rank that
 * differs from rank 0 in any item is refused on every rank (all see the
 * same table), the message naming the item, the ranks and their values. */
static fr_status ranks_agree(fr_ctx *ctx, const fr_comm *c, const fr_train_cfg *cfg,
                             const fr_model *m, const fr_source *src) {
    int n = fr_comm_size(c);
    char mine[AGREE_ITEMS][AGREE_LEN] = {{0}};
    static const char *what[AGREE_ITEMS] = {
        "the model (--model, the file's bytes)",
        "the parameters (names, shapes, dtypes)",
        "--batch",
        "the micro-batch (--accumulate, --micro-batch)",
        "the optimizer (--optimizer, --lr, --momentum, --weight-decay, --eps, ...)",
        "--seed",
        "--precision and --optimizer-state",
        "the data (--data and its sample or token counts, --limit, --test-limit, --seq)",
        ("the run's length and files (--epochs, --steps, --resume, --init, --save, --freeze, "
         "--lora, --adapter, --save-adapter, --merge)")};
    const fr_optim_opts *o = &cfg->step.optim;
    snprintf(mine[0], AGREE_LEN, "%s (%016llx)", cfg->model,
             (unsigned long long)file_hash(cfg->model));
    snprintf(mine[1], AGREE_LEN, "%zu tensors (%016llx)", m->n_params,
             (unsigned long long)shapes_hash(m));
    snprintf(mine[2], AGREE_LEN, "%d", cfg->step.batch);
    snprintf(mine[3], AGREE_LEN, "%d", cfg->step.micro_batch);
    snprintf(mine[4], AGREE_LEN,
             "kind %s lr %.9g momentum %.9g dampening %.9g nesterov %d wd %.9g betas %.9g,%.9g eps "
             "%.9g clip %.9g decay %.9g eps2 %.9g d %.9g",
             fr_optim_name(o->kind), o->lr, o->momentum, o->dampening, o->nesterov, o->weight_decay,
             o->beta1, o->beta2, o->eps, (double)cfg->step.clip_grad_norm, o->beta2_decay, o->eps2,
             o->clip_threshold);
    snprintf(mine[5], AGREE_LEN, "%llu", (unsigned long long)cfg->step.seed);
    snprintf(mine[6], AGREE_LEN, "precision %d state %d loss-scale %d", (int)cfg->step.precision,
             (int)cfg->step.optim_state, (int)cfg->step.loss_scaling);
    /* (a token stream: its length and split, and the window's T, --seq) */
    snprintf(mine[7], AGREE_LEN, "%s: %lld train, %lld test, limits %lld %lld, seq %d",
             cfg->train_images ? cfg->train_images : cfg->data,
             (long long)(src->train ? fr_dataset_len(src->train) : src->split.n_train),
             (long long)(src->test ? fr_dataset_len(src->test) : src->split.n_val),
             (long long)cfg->limit_train, (long long)cfg->limit_test, src->seq);
    uint64_t files = fnv1a(0xcbf29ce484222325ull, cfg->resume ? cfg->resume : "",
                           cfg->resume ? strlen(cfg->resume) : 0);
    files = fnv1a(files, cfg->init ? cfg->init : "", cfg->init ? strlen(cfg->init) : 0);
    files = fnv1a(files, cfg->save ? cfg->save : "", cfg->save ? strlen(cfg->save) : 0);
    files = fnv1a(files, cfg->freeze ? cfg->freeze : "", cfg->freeze ? strlen(cfg->freeze) : 0);
    const char *more[] = {cfg->lora, cfg->adapter, cfg->save_adapter, cfg->merge};
    for (int k = 0; k < 4; k++)
        files = fnv1a(files, more[k] ? more[k] : "", more[k] ? strlen(more[k]) : 0);
    snprintf(mine[8], AGREE_LEN, "epochs %d steps %lld files %016llx", cfg->epochs,
             (long long)cfg->steps, (unsigned long long)files);
    char(*all)[AGREE_ITEMS][AGREE_LEN] = fr_alloc(ctx, (size_t)n * sizeof *all, FR_MEM_OTHER);
    if (!all) return FR_ERR_NOMEM;
    fr_status st = fr_comm_allgather(ctx, c, mine, all, sizeof mine, "the start-up checksums");
    for (int k = 0; k < AGREE_ITEMS && !st; k++)
        for (int r = 1; r < n && !st; r++)
            if (strcmp(all[r][k], all[0][k]))
                st = fr_fail(ctx, FR_ERR_ARG,
                             "ranks disagree on %s: rank 0 has '%s', rank %d has '%s'; every "
                             "rank must be started with the same model, options and data",
                             what[k], all[0][k], r, all[r][k]);
    fr_free(ctx, all);
    return st;
}

/* The parameters of every rank the same before rank 0 saves them (stage 0
 * keeps a full copy on each): a difference is a fault, not a checkpoint.
 * Buffers (BatchNorm's running statistics) are not compared: each rank
 * updates them from its own samples, as under PyTorch's DDP, and rank 0's
 * are the ones broadcast before each forward and saved. */
static fr_status weights_agree(fr_ctx *ctx, const fr_comm *c, const fr_model *m) {
    int n = fr_comm_size(c);
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < m->n_params; i++) {
        const fr_param *p = &m->params[i];
        if (!p->trainable) continue; /* a buffer */
        h = fnv1a(h, p->data, (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype));
    }
    uint64_t *all = fr_alloc(ctx, (size_t)n * sizeof *all, FR_MEM_OTHER);
    if (!all) return FR_ERR_NOMEM;
    fr_status st = fr_comm_allgather(ctx, c, &h, all, sizeof h, "the weights' checksums");
    for (int r = 1; r < n && !st; r++)
        if (all[r] != all[0])
            st = fr_fail(ctx, FR_ERR_NUMERIC,
                         "the weights of rank %d differ from rank 0's before saving: the "
                         "ranks' gradient sums disagreed",
                         r);
    fr_free(ctx, all);
    return st;
}

/* Rank 0 writes the checkpoint (atomically, as one process does); the
 * others wait for it, and every rank learns whether it was written. */
static fr_status save_ranked(fr_ctx *ctx, const fr_comm *c, fr_step *s, const fr_train_cfg *cfg,
                             int epoch, int64_t batches) {
    /* (at ZeRO 3 each rank holds its own slice of the weights: nothing to compare) */
    fr_status st = fr_comm_size(c) > 1 && s->o.zero < 3 ? weights_agree(ctx, c, s->m) : FR_OK;
    if (st) return st;
    /* ZeRO: the optimizer state (at 3, the weights too) gathered whole on rank 0 */
    if (!st && s->o.zero >= 1) st = fr_step_state_whole(s, 1);
    if (!st && s->o.zero >= 3) st = fr_step_params_whole(s, 1);
    if (!st && fr_comm_rank(c) == 0)
        st = cfg->save_weights_only ? fr_ckpt_save_weights(s->m, cfg->save, cfg->nanogpt_masks)
                                    : fr_ckpt_save(s, cfg->save, cfg->freeze, epoch, batches);
    if (s->o.zero >= 3) fr_step_params_whole(s, 0);
    if (s->o.zero >= 1) fr_step_state_whole(s, 0);
    double failed = st != FR_OK;
    fr_status cs = fr_comm_sum_f64(ctx, c, &failed, 1, "the checkpoint's outcome");
    if (st || cs) return st ? st : cs;
    if (failed > 0)
        return fr_fail(ctx, FR_ERR_IO,
                       "rank 0 could not write the checkpoint %s (its message "
                       "says why)",
                       cfg->save);
    return FR_OK;
}

/* Test (or validation) accuracy and loss with an eval step that takes the
 * training arena's place while it runs. */
static fr_status evaluate_test(fr_ctx *ctx, const fr_train_cfg *cfg, fr_step *s, fr_source *src,
                               double *acc, double *loss) {
    fr_status st;
    if (!fr_source_has_test(src)) { /* training files named without test files */
        *acc = NAN, *loss = NAN;
        return FR_OK;
    }
    fr_step_arena_release(s);
    fr_mem_empty_cache(ctx);
    /* Evaluate at the training micro-batch: the eval arena then fits in
     * the training arena's place (a larger eval batch would raise the peak).
     * With ranks, at the global batch's micro-batch (B over the micro-batches
     * a step takes), each rank scoring its slice of every eval batch, about
     * its own micro-batch: the eval batches are one process's, so every
     * window is scored once, the last partial batch's too. */
    int eb = cfg->eval_batch > 0 ? cfg->eval_batch
             : src->ranks > 1    ? cfg->step.batch / s->sched.accumulate
                                 : s->sched.micro;
    int64_t limit = fr_eval_limit(cfg, src->tokens != NULL);
    fr_eval_sums t;
    if ((st = fr_source_evaluate_sums(src, s->m, eb, limit, &t))) return st;
    /* each rank scored its slices: the totals (loss times samples, hits,
     * samples) are summed, so the mean is weighted by samples, by tokens for
     * a token model (every window holds T) */
    if (src->ranks > 1) {
        double v[3] = {t.loss, t.hits, t.seen};
        if ((st = fr_comm_sum_f64(ctx, cfg->comm, v, 3, "the evaluation's totals"))) return st;
        t.loss = v[0], t.hits = v[1], t.seen = v[2];
    }
    fr_eval_sums_result(s->m, &t, acc, loss);
    fr_mem_empty_cache(ctx);
    return fr_step_arena_acquire(s);
}

/* A token model's evaluation line: validation loss in nats and in bits per
 * byte (byte-level text) or per token. */
static void report_val(const fr_train_cfg *cfg, const fr_source *src, int64_t step,
                       double train_loss, double val_loss, double secs) {
    const char *unit = fr_tokens_get_kind(src->tokens) == FR_TOKENS_TEXT ? "byte" : "token";
    double bits = val_loss / log(2.0);
    if (cfg->json)
        printf("{\"event\": \"eval\", \"step\": %lld, \"train_loss\": %.17g, \"val_loss\": "
               "%.17g, \"val_bits_per_%s\": %.17g, \"seconds\": %.3f}\n",
               (long long)step, train_loss, val_loss, unit, bits, secs);
    else if (!cfg->quiet)
        printf("step %lld: train loss %.4f | val loss %.4f nats, %.4f bits per %s | %.1f s\n",
               (long long)step, train_loss, val_loss, bits, unit, secs);
    fflush(stdout);
}

/* Without --budget on a device: the step's planned device reservation
 * against the device's global memory, before anything of the model is
 * allocated. Too much: *s freed and refused with the smallest plan and the
 * budget that lets the planner choose one that fits. */
static fr_status check_device_memory(fr_ctx *ctx, const fr_train_cfg *cfg, fr_model *m,
                                     const fr_step_opts *so, fr_step **s, const fr_source *src) {
    const fr_backend *be = fr_backend_of(ctx);
    if (!fr_place_second_memory(ctx) || !be->global_mem) return FR_OK;
    size_t want = fr_step_reserved(*s), have = be->global_mem(ctx);
    if (want <= have) return FR_OK;
    fr_step_free(*s); /* planned as a run under --budget plans at its start */
    *s = NULL;
    char w[32], h[32], n[32], b[32], how[128];
    fr_budget_data bd;
    fr_source_budget(src, cfg, &bd);
    fr_plan_need need;
    size_t smallest = fr_budget_smallest(m, so, &bd, &need);
    if (!smallest) return FR_ERR_BUDGET; /* (the message is set) */
    fr_plan_need_str(&need, how, sizeof how);
    fr_human_bytes(want, w, sizeof w), fr_human_bytes(have, h, sizeof h);
    fr_human_bytes(need.reserved, n, sizeof n), fr_human_bytes(smallest, b, sizeof b);
    if (need.reserved > have)
        return fr_fail(ctx, FR_ERR_BUDGET,
                       "the step's plan reserves %s (%zu bytes) on %s, more than its global memory "
                       "of %s (%zu bytes), and no plan fits it: the smallest needs %s (%zu bytes) "
                       "with %s; nothing was allocated: shrink --batch or the model",
                       w, want, ctx->dev_name, h, have, n, need.reserved, how);
    char upto[64] = "";
    if (smallest < have) snprintf(upto, sizeof upto, " (up to %zu, the device's memory)", have);
    return fr_fail(ctx, FR_ERR_BUDGET,
                   "the step's plan reserves %s (%zu bytes) on %s, more than its global memory of "
                   "%s (%zu bytes); nothing was allocated. The smallest plan needs %s on the "
                   "device (%s) and the smallest budget that fits is %s (%zu bytes): pass --budget "
                   "%zu%s and the planner picks a plan that fits",
                   w, want, ctx->dev_name, h, have, n, how, b, smallest, smallest, upto);
}

/* The category a device refusal's message names ("... bytes for <category>"),
 * or -1 (a refusal at first use names none). */
static int refused_cat(const char *msg) {
    for (int c = 0; c < FR_MEM_CAT_COUNT; c++) {
        char pat[48];
        snprintf(pat, sizeof pat, "bytes for %s", fr_mem_cat_name((fr_mem_cat)c));
        if (strstr(msg, pat)) return c;
    }
    return -1;
}

/* The tensor of category cat the step lacks: the one whose allocation was
 * refused (allocation stops at the first refusal). */
static void missing_tensor(const fr_step *s, int cat, char *buf, size_t len) {
    const fr_model *m = s->m;
    int ns = s->o.offload & FR_OFFLOAD_OPTIMIZER ? 0 : fr_optim_states(&s->o.optim);
    snprintf(buf, len, "a buffer of %s", cat >= 0 ? fr_mem_cat_name((fr_mem_cat)cat) : "the step");
    if (cat == FR_MEM_PARAMS && !m->dblock) {
        snprintf(buf, len, "the parameter block (%zu bytes: every parameter)", m->pblock_bytes);
        return;
    }
    /* the optimizer's: one block a category (optim/optim.h) */
    const struct fr_optim *o = s->o.training ? m->optim : NULL;
    for (int k = 0; cat == FR_MEM_OPTIM && k < ns; k++)
        if (!o || !o->state[k].buf) {
            snprintf(buf, len, "optimizer state %d (one block of %zu bytes for every parameter)", k,
                     fr_step_state_block(s));
            return;
        }
    if (cat == FR_MEM_GRADS && fr_step_grads_block(s) && (!o || !o->grads.buf)) {
        snprintf(buf, len, "the gradients (one block of %zu bytes)", fr_step_grads_block(s));
        return;
    }
    if (cat == FR_MEM_DATA)
        snprintf(buf, len, "%s",
                 s->place.feed || !fr_feed_used(s) ? "the batch's inputs and labels"
                                                   : "the two batch slots");
    else if (s->plan.arena_bytes && !s->ex.arena)
        snprintf(buf, len, "the step's arena (%zu bytes of activations and workspace)",
                 s->plan.arena_bytes);
}

/* A device allocation refused, by the driver (CL_MEM_OBJECT_ALLOCATION_FAILURE,
 * CL_OUT_OF_RESOURCES) or the device's allocator: whether msg is one, and
 * the tensor it was for into what. */
static int device_refusal(const fr_step *s, const char *msg, char *what, size_t len) {
    if (!strstr(msg, "device") && !strstr(msg, "CL_")) return 0; /* the host's */
    int cat = refused_cat(msg);
    char t[232];
    missing_tensor(s, cat, t, sizeof t);
    snprintf(what, len, "for %s, category %s", t,
             cat >= 0 ? fr_mem_cat_name((fr_mem_cat)cat) : "unknown");
    return 1;
}

/* ... and the message with what and the smallest budget that fits, planned
 * as a run under --budget plans it at its start: a model as loaded beside
 * the open data, nothing else held (the run's step, loader and model are
 * freed first). */
static void device_oom(fr_ctx *ctx, const fr_train_cfg *cfg, const fr_step_opts *so,
                       const fr_source *src, const char *msg, const char *what) {
    char how[128], b[32];
    fr_model *m = fr_model_load(ctx, cfg->model);
    size_t smallest = 0;
    fr_plan_need need;
    if (m && (!cfg->seq || !fr_model_set_seq(m, cfg->seq)) &&
        (!cfg->freeze || !fr_model_freeze(m, cfg->freeze)) &&
        (!cfg->lora || !fr_model_lora_spec(m, cfg->lora, cfg->step.seed)) &&
        (!cfg->adapter || !fr_adapter_lora(m, cfg->adapter, cfg->step.seed))) {
        fr_budget_data bd;
        fr_source_budget(src, cfg, &bd);
        fr_step_opts o = *so;
        o.budget = 0;
        smallest = fr_budget_smallest(m, &o, &bd, &need);
    }
    fr_model_free(m);
    if (!smallest) {
        fr_fail(ctx, FR_ERR_NOMEM, "%s (%s)", msg, what);
        return;
    }
    fr_plan_need_str(&need, how, sizeof how);
    fr_fail(ctx, FR_ERR_NOMEM,
            "%s (%s); the smallest budget that fits is %s (%zu bytes, %s): pass --budget %zu or "
            "more, up to what the device has, and the planner picks a plan that fits",
            msg, what, fr_human_bytes(smallest, b, sizeof b), smallest, how, smallest);
}

/* --adapter's config made the adapters (not with --lora); --save-adapter
 * and --merge need adapters and a place to write, checked before training. */
static fr_status adapters_check(fr_ctx *ctx, const fr_train_cfg *cfg, fr_model *m) {
    fr_status st;
    if (cfg->adapter && cfg->lora)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--adapter %s: its adapter_config.json sets the adapters: give --lora or "
                       "--adapter, not both",
                       cfg->adapter);
    if (cfg->adapter && (st = fr_adapter_lora(m, cfg->adapter, cfg->step.seed))) return st;
    const char *opt = cfg->merge ? "--merge" : "--save-adapter";
    const char *path = cfg->merge ? cfg->merge : cfg->save_adapter;
    if (path && !fr_model_lora_rank(m))
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s %s: the model has no LoRA adapters (give --lora or --adapter)", opt,
                       path);
    if (cfg->merge && fr_st_check_writable(ctx, cfg->merge)) return FR_ERR_IO;
    return FR_OK;
}

/* The memory the step runs in: a device's when it runs on one. */
static void step_memory(const fr_ctx *ctx, fr_mem_stats *ms) {
    if (ctx->dmem) fr_mem_stats_of(ctx->dmem, ms);
    else fr_mem_get_stats(ctx, ms);
}

/* Refusals of what data parallelism does not do yet, before any work. */
static fr_status dist_check(fr_ctx *ctx, const fr_train_cfg *cfg, const fr_source *src, int ranks) {
    if (ctx->dmem)
        return fr_fail(ctx, FR_ERR_ARG,
                       "%d ranks with --device: data parallelism runs on the CPU backend only "
                       "for now (drop --device, or run one process)",
                       ranks);
    if (cfg->batch_auto)
        return fr_fail(ctx, FR_ERR_ARG, "--batch auto with %d ranks: give the global --batch",
                       ranks);
    if (cfg->step.batch < ranks)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--batch %d is the global batch: %d ranks need at least one sample each",
                       cfg->step.batch, ranks);
    if (src->tokens) return FR_OK; /* token batches are all whole (drop_last) */
    int64_t n = fr_dataset_len(src->train);
    if (cfg->limit_train > 0 && cfg->limit_train < n) n = cfg->limit_train;
    if (n % cfg->step.batch && n % cfg->step.batch < ranks)
        return fr_fail(ctx, FR_ERR_ARG,
                       "the last batch of an epoch has %lld samples (%lld %% %d), fewer than the "
                       "%d ranks: every rank needs a sample of every batch; change --batch or "
                       "--limit",
                       (long long)(n % cfg->step.batch), (long long)n, cfg->step.batch, ranks);
    return FR_OK;
}

void fr_rank_step_opts(fr_step_opts *so, int ranks) {
    if (ranks <= 1 || !so->batch) return;
    int local = (so->batch + ranks - 1) / ranks;
    int k = so->micro_batch ? so->batch / so->micro_batch : 1;
    int micro = (local + k - 1) / k;
    so->batch = micro * k;
    so->micro_batch = so->micro_batch ? micro : 0;
    so->rank_step_in_backward = !so->keep_grads;
    so->keep_grads = 1;
}

fr_status fr_train(fr_ctx *ctx, const fr_train_cfg *cfg, fr_train_result *res) {
    memset(res, 0, sizeof *res);
    /* data parallel: progress, logs and JSON from rank 0 only */
    fr_comm *comm = cfg->comm;
    int rank = fr_comm_rank(comm), ranks = fr_comm_size(comm);
    fr_train_cfg quiet;
    if (rank > 0) {
        quiet = *cfg;
        quiet.progress = -1, quiet.json = 0, quiet.quiet = 2;
        cfg = &quiet;
    }
    res->ranks = ranks;
    /* Refusals that need no work come before any: a run must not train an
     * epoch to find out that it cannot save it. */
    if (cfg->init && cfg->resume)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--init and --resume together: --resume %s continues a "
                       "checkpoint (weights, optimizer state, position); --init %s starts from "
                       "weights with a fresh optimizer. Give one.",
                       cfg->resume, cfg->init);
    if (cfg->save && fr_st_check_writable(ctx, cfg->save)) return FR_ERR_IO;
    fr_status st = FR_OK;
    fr_model *m = NULL;
    fr_source src = {0};
    fr_step *s = NULL;
    fr_batches l = {0};
    double t_start = now_s();
    if (!(m = fr_model_load(ctx, cfg->model))) return FR_ERR_ARG;
    if (cfg->seq && (st = fr_model_set_seq(m, cfg->seq))) goto done;
    if ((st = fr_source_open(ctx, cfg, m, 1, &src))) goto done;
    if (ranks > 1) {
        if ((st = dist_check(ctx, cfg, &src, ranks))) goto done;
        if ((st = ranks_agree(ctx, comm, cfg, m, &src))) goto done;
        src.rank = rank, src.ranks = ranks;
    }
    src.eval_progress = cfg->progress > 0 && !cfg->json; /* a long evaluation's bar */
    src.head_rows = cfg->step.head_rows;
    int tokens = src.tokens != NULL;
    res->tokens = tokens;
    if (cfg->freeze && (st = fr_model_freeze(m, cfg->freeze))) goto done;
    if (cfg->lora && (st = fr_model_lora_spec(m, cfg->lora, cfg->step.seed))) goto done;
    if ((st = adapters_check(ctx, cfg, m))) goto done;
    fr_step_opts so = cfg->step;
    so.training = 1;
    so.ranks = ranks;
    so.zero = ranks > 1 ? so.zero : 0;
    fr_rank_step_opts(&so, ranks); /* this rank's step */
    if (cfg->step.precision == FR_PREC_FP16 && fr_optim_squares(&cfg->step.optim) &&
        !fr_optim_whole_tensor(&cfg->step.optim) && cfg->quiet < 2) /* (refused: fr_optim_check) */
        fprintf(stderr,
                "warning: Adam in pure fp16 keeps exp_avg_sq in fp16, where squares of gradients "
                "below 2.4e-4 underflow to 0 (smallest subnormal 6e-8) and eps=%g is not "
                "representable: steps blow up (the seeds' \"Adam may report an error with "
                "half\"). Use --precision fp16-mixed (fp32 master weights and state) or bf16, or "
                "raise --eps to 1e-4.\n",
                (double)cfg->step.optim.eps);
    fr_budget bud;
    if (cfg->step.budget) {
        /* One accounting of the budget (budget.c), the same `frugal plan`
         * uses: planned on shapes, nothing of the model allocated yet. */
        fr_budget_data bd;
        fr_source_budget(&src, cfg, &bd);
        if (!(s = fr_budget_plan(m, &so, &bd, cfg->batch_auto, &bud))) {
            st = FR_ERR_BUDGET;
            goto done;
        }
        so.batch = s->o.batch;
        if (cfg->batch_auto && !cfg->json && !cfg->quiet)
            fprintf(stderr, "--batch auto: %d is the largest batch whose whole footprint fits\n",
                    so.batch);
        /* From here the budget is a hard limit: the allocator refuses past
         * it, and the parameters are allocated only now. */
        if (ctx->dmem) fr_mem_set_limit_of(ctx->dmem, cfg->step.budget); /* a device's budget */
        else fr_mem_set_limit(ctx, cfg->step.budget);
        if (ranks > 1 && (st = fr_step_distribute(s, comm))) goto done;
        if ((st = fr_step_materialize(s))) goto done;
    } else {
        if (!(s = fr_step_prepare(m, &so))) {
            st = FR_ERR_ARG;
            goto done;
        }
        if ((st = check_device_memory(ctx, cfg, m, &so, &s, &src)) ||
            (ranks > 1 && (st = fr_step_distribute(s, comm))) || (st = fr_step_materialize(s)))
            goto done;
    }
    if (ranks > 1) s->dp.global_batch = cfg->step.batch;
    if (ranks <= 1 && cfg->step.zero > 0 && !cfg->quiet)
        fprintf(stderr,
                "note: --zero %d shards over the ranks of an mpirun launch; one process holds "
                "everything (`frugal estimate --ranks N --zero %d` shows a rank's bytes)\n",
                cfg->step.zero, cfg->step.zero);
    if (ranks > 1 && !cfg->json && !cfg->quiet) {
        char bk[256];
        fr_buckets_describe(s->dp.buckets, bk, sizeof bk);
        fprintf(stderr,
                "%d ranks (data parallel, ZeRO stage %d): global batch %d, each rank a slice of "
                "%d or %d samples in %d micro-batch%s; gradients %s in %s, %s; the "
                "optimizer steps %s %s\n",
                ranks, s->o.zero, cfg->step.batch, cfg->step.batch / ranks,
                (cfg->step.batch + ranks - 1) / ranks, s->sched.accumulate,
                s->sched.accumulate == 1 ? "" : "es", s->o.zero ? "reduce-scattered" : "summed", bk,
                cfg->step.no_overlap ? "all after backward"
                                     : "each started as backward completes it",
                s->dp.buckets->on_share ? "inside backward, each bucket's owned share as its sums "
                                          "arrive (no gradient shard kept),"
                                        : "after backward (the sums come first),",
                s->o.zero == 0   ? "on every rank"
                : s->o.zero == 1 ? "on each rank's shard (optimizer state sharded), the weights "
                                   "all-gathered"
                : s->o.zero == 2 ? "on each rank's shard (optimizer state and gradients sharded), "
                                   "the weights all-gathered"
                                 : "on each rank's shard of everything (weights too: each unit's "
                                   "gathered before its forward and its backward, the next one's "
                                   "prefetched)");
    }
    if (!cfg->json && !cfg->quiet &&
        (cfg->step.budget || so.checkpoint != FR_CKPT_MARKS || so.micro_batch)) {
        fr_step_describe_plan(s, stderr, 0);
        if (cfg->step.budget) fr_budget_describe(&bud, stderr, 0);
        fputc('\n', stderr);
    } else if (!cfg->json && !cfg->quiet && s->opt.n_fused) {
        fprintf(stderr,
                "optimizer step inside backward for %d tensors: their gradients are never "
                "all stored (--keep-grads to store them)\n",
                s->opt.n_fused);
    }
    /* bf16-mixed where the backend has no bf16 GEMM (a CPU without AVX512_BF16
     * or AMX): memory halves, time does not (the plan's line says it too) */
    const fr_backend *be = fr_backend_of(ctx);
    if (!cfg->json && !cfg->quiet && s->o.precision == FR_PREC_BF16_MIXED &&
        !(be->gemm16 && be->gemm16(FR_BF16)))
        fprintf(stderr,
                "precision: bf16-mixed on f32 GEMMs of bf16-rounded operands (no native "
                "bf16 GEMM here: %s): activations take half the memory, the step is no "
                "faster than fp32's\n",
                be->host_memory ? "the CPU has no AVX512_BF16 or AMX" : "the device's backend");
    /* --init: the weights of a state_dict (strict names and shapes, optimizer
     * tensors ignored) over the initialised ones; the optimizer starts fresh. */
    if (cfg->init && (st = fr_model_load_weights(m, cfg->init))) goto done;
    if (cfg->adapter && (st = fr_adapter_load(m, cfg->adapter))) goto done;
    fr_ckpt_pos pos = {0};
    if (cfg->resume) {
        if ((st = fr_ckpt_resume(s, cfg->resume, cfg->freeze, &pos))) goto done;
        if (pos.lr_differs && cfg->quiet < 2)
            fprintf(stderr,
                    "warning: --lr %g differs from the checkpoint's %g: resuming with %g "
                    "(the run is no longer the one the checkpoint continues)\n",
                    (double)cfg->step.optim.lr, pos.saved_lr, (double)cfg->step.optim.lr);
        if (!cfg->json && !cfg->quiet && pos.epoch < cfg->epochs)
            fprintf(stderr, "resuming from %s at epoch %d\n", cfg->resume, pos.epoch + 1);
    }
    int start_epoch = pos.epoch;
    int64_t skip = pos.batches_done;
    /* the loader cuts global batches (with ranks, this rank's slice of each) */
    if ((st = fr_batches_open(&src, 1, ranks > 1 ? cfg->step.batch : so.batch, cfg->step.seed,
                              cfg->queue, cfg->limit_train, &l)))
        goto done;
    int64_t nb = fr_batches_count(&l);
    if (skip > nb) {
        st = fr_fail(ctx, FR_ERR_FORMAT,
                     "%s: metadata 'batch' = %lld: more batches done than an "
                     "epoch has (%lld)",
                     cfg->resume, (long long)skip, (long long)nb);
        goto done;
    }
    if (cfg->resume && start_epoch >= cfg->epochs) {
        /* Nothing to train: say so and report the checkpoint's test accuracy. */
        if (!cfg->quiet)
            fprintf(stderr, "nothing left to train: %s is at epoch %d of %d\n", cfg->resume,
                    start_epoch, cfg->epochs);
        double acc = 0, tl = 0;
        if ((st = evaluate_test(ctx, cfg, s, &src, &acc, &tl))) goto done;
        res->test_acc = acc;
        res->test_loss = tl;
        res->epochs_done = start_epoch;
        if (!cfg->json && !cfg->quiet)
            printf("epoch %d/%d: test loss %.4f acc %.2f%%\n", start_epoch, cfg->epochs, tl,
                   100 * acc);
    }
    /* --steps N: the optimizer steps of the whole run, counted from the
     * start of training (a resumed run counts those done before) */
    int64_t step = (int64_t)start_epoch * nb + skip, t_rows = tokens ? src.seq : 1;
    int64_t step_end = cfg->steps > 0 ? cfg->steps : (int64_t)cfg->epochs * nb;
    double run_sum = 0;
    int64_t run_seen = 0;
    for (int epoch = start_epoch; epoch < cfg->epochs && step < step_end; epoch++) {
        double t0 = now_s(), sum = 0;
        int64_t seen = 0, hits = 0, i = skip;
        if ((st = s->place.feed ? fr_feed_start(s->place.feed, &l, epoch, skip)
                                : fr_batches_start(&l, epoch, skip)))
            goto done;
        skip = 0;
        int64_t ep_steps = nb < i + (step_end - step) ? nb : i + (step_end - step);
        for (; i < ep_steps;) {
            fr_batch b;
            int done_ = 0, c = 0;
            float L;
            if ((st = s->place.feed ? fr_feed_next(s->place.feed, &b, &done_)
                                    : fr_batches_next(&l, &b, &done_)))
                goto done;
            if (done_) break;
            if (ranks > 1) s->dp.global_n = fr_batches_global_n(&l);
            if ((st = fr_step_run(s, &b, &L, &c))) goto done;
            int gn = ranks > 1 ? s->dp.global_n : b.n; /* L and c are the global batch's */
            sum += (double)L * gn;
            seen += gn;
            hits += c;
            run_sum += (double)L * gn;
            run_seen += gn;
            step++;
            progress(cfg, epoch, ++i, ep_steps, sum / seen, t0, tokens ? t_rows * gn : 0);
            /* a signal: save where the run is (the epoch's position is in the
             * checkpoint) and stop; --save-every: save and go on. The end of
             * an epoch saves below. */
            int stop = cfg->stop && *cfg->stop;
            if (cfg->save && i < ep_steps &&
                (stop || (cfg->save_every > 0 && step % cfg->save_every == 0))) {
                if ((st = save_ranked(ctx, comm, s, cfg, epoch, i))) goto done;
                if (!cfg->json && !cfg->quiet && !stop)
                    fprintf(stderr, "%ssaved %s at step %lld (epoch %d, batch %lld of %lld)\n",
                            cfg->progress > 0 ? "\n" : "", cfg->save, (long long)step, epoch + 1,
                            (long long)i, (long long)nb);
            }
            if (stop && i < ep_steps) {
                res->stopped_by = (int)*cfg->stop;
                res->steps_done = step;
                res->epochs_done = epoch;
                if (cfg->quiet < 2)
                    fprintf(stderr,
                            "%sstopped by signal %d at step %lld (epoch %d, batch %lld of "
                            "%lld)%s%s%s\n",
                            cfg->progress > 0 ? "\n" : "", res->stopped_by, (long long)step,
                            epoch + 1, (long long)i, (long long)nb,
                            cfg->save ? ": saved to " : ": nothing saved (no --save)",
                            cfg->save ? cfg->save : "",
                            cfg->save ? "; --resume continues from here" : "");
                goto done;
            }
            if (tokens && cfg->eval_interval > 0 && step % cfg->eval_interval == 0 &&
                step < step_end) {
                double acc = 0, vl = 0;
                if ((st = evaluate_test(ctx, cfg, s, &src, &acc, &vl))) goto done;
                report_val(cfg, &src, step, run_sum / run_seen, vl, now_s() - t_start);
                run_sum = 0, run_seen = 0;
            }
        }
        double train_loss = seen ? sum / seen : 0;
        double train_acc = seen ? (double)hits / (seen * t_rows) : 0;
        double secs = now_s() - t0;
        int whole = i == nb; /* a run stopped by --steps saves where it stopped */
        if (cfg->save &&
            (st = save_ranked(ctx, comm, s, cfg, whole ? epoch + 1 : epoch, whole ? 0 : i)))
            goto done;
        double acc = 0, tl = 0;
        if ((st = evaluate_test(ctx, cfg, s, &src, &acc, &tl))) goto done;
        res->steps_done = step;
        res->final_loss = train_loss;
        res->test_acc = acc;
        res->test_loss = tl;
        res->epochs_done = whole ? epoch + 1 : epoch;
        if (tokens) {
            report_val(cfg, &src, step, run_seen ? run_sum / run_seen : train_loss, tl,
                       now_s() - t_start);
            run_sum = 0, run_seen = 0;
        } else if (cfg->json && !fr_source_has_test(&src))
            printf("{\"event\": \"epoch\", \"epoch\": %d, \"train_loss\": %.17g, "
                   "\"test_loss\": null, \"seconds\": %.3f, \"samples\": %lld}\n",
                   epoch + 1, train_loss, secs, (long long)seen);
        else if (cfg->json && isnan(acc)) /* MSE: no accuracy */
            printf("{\"event\": \"epoch\", \"epoch\": %d, \"train_loss\": %.17g, "
                   "\"test_loss\": %.17g, \"seconds\": %.3f, \"samples\": %lld}\n",
                   epoch + 1, train_loss, tl, secs, (long long)seen);
        else if (cfg->json)
            printf(
                "{\"event\": \"epoch\", \"epoch\": %d, \"train_loss\": %.17g, \"train_acc\": %.6f, "
                "\"test_loss\": %.17g, \"test_acc\": %.6f, \"seconds\": %.3f, \"samples\": %lld}\n",
                epoch + 1, train_loss, train_acc, tl, acc, secs, (long long)seen);
        else if (!cfg->quiet && !fr_source_has_test(&src))
            if (s->m->loss == FR_LOSS_CROSS_ENTROPY)
                printf("epoch %d/%d: train loss %.4f acc %.2f%% | no test split | %.1f s\n",
                       epoch + 1, cfg->epochs, train_loss, 100 * train_acc, secs);
            else
                printf("epoch %d/%d: train loss %.6g | no test split | %.1f s\n", epoch + 1,
                       cfg->epochs, train_loss, secs);
        else if (!cfg->quiet && isnan(acc))
            printf("epoch %d/%d: train loss %.6g | test loss %.6g | %.1f s\n", epoch + 1,
                   cfg->epochs, train_loss, tl, secs);
        else if (!cfg->quiet)
            printf("epoch %d/%d: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %.1f s\n",
                   epoch + 1, cfg->epochs, train_loss, 100 * train_acc, tl, 100 * acc, secs);
        fflush(stdout);
        if (cfg->stop && *cfg->stop && epoch + 1 < cfg->epochs && step < step_end) {
            res->stopped_by = (int)*cfg->stop; /* at an epoch's end: saved above */
            if (cfg->quiet < 2)
                fprintf(stderr, "stopped by signal %d at the end of epoch %d%s%s\n",
                        res->stopped_by, epoch + 1, cfg->save ? ": saved to " : "",
                        cfg->save ? cfg->save : "");
            goto done;
        }
    }
    /* after the last epoch: the adapters as PEFT's pair, the merged model (rank 0) */
    if (!st && rank == 0 && cfg->save_adapter && (st = fr_adapter_save(s->m, cfg->save_adapter)))
        goto done;
    if (!st && rank == 0 && cfg->merge && (st = fr_adapter_merge_save(s->m, cfg->merge))) goto done;
done:;
    char oom[FR_ERR_LEN], oom_what[320];
    if (st == FR_ERR_NOMEM && ctx->dmem && s &&
        device_refusal(s, fr_last_error(ctx), oom_what, sizeof oom_what)) {
        snprintf(oom, sizeof oom, "%s", fr_last_error(ctx));
        if (s->place.feed) fr_feed_drain(s->place.feed); /* before the loader's batches go */
        fr_batches_close(&l);
        fr_step_free(s);
        fr_model_free(m);
        s = NULL, m = NULL;
        device_oom(ctx, cfg, &so, &src, oom, oom_what);
    }
    res->seconds = now_s() - t_start;
    res->peak_rss_kib = fr_peak_rss_kib();
    if (s) {
        fr_plan_info info;
        fr_step_plan_info(s, &info);
        fr_mem_stats ms;
        step_memory(ctx, &ms);
        res->predicted_reserved = info.reserved;
        res->measured_reserved_peak = ms.reserved_peak;
        res->batch = ranks > 1 ? cfg->step.batch : s->o.batch; /* the global batch */
    }
    if (!st && s && ranks > 1) { /* every rank's peaks, as min and max over the ranks */
        fr_mem_stats ms;
        step_memory(ctx, &ms);
        uint64_t mine[FR_MEM_CAT_COUNT + 2], lo[FR_MEM_CAT_COUNT + 2], hi[FR_MEM_CAT_COUNT + 2];
        for (int c = 0; c < FR_MEM_CAT_COUNT; c++) mine[c] = ms.allocated_peak[c];
        mine[FR_MEM_CAT_COUNT] = ms.allocated_total_peak;
        mine[FR_MEM_CAT_COUNT + 1] = ms.reserved_peak;
        st = fr_comm_minmax_u64(ctx, comm, mine, lo, hi, FR_MEM_CAT_COUNT + 2, "the memory peaks");
        for (int c = 0; c < FR_MEM_CAT_COUNT + 2; c++)
            res->rank_peak_min[c] = lo[c], res->rank_peak_max[c] = hi[c];
        res->comm_wait_s = s->dp.buckets->wait_s;
        res->buckets = s->dp.buckets->n;
    }
    if (!st && !cfg->json && !cfg->quiet && !res->stopped_by) {
        size_t pred[FR_MEM_CAT_COUNT], total;
        fr_step_predicted(s, pred, &total);
        fr_mem_stats ms;
        step_memory(ctx, &ms);
        printf("\nmemory%s%s: predicted for the training step %.1f MiB reserved (%.1f MiB live at "
               "its peak); measured peak reserved %.1f MiB, peak allocated %.1f MiB; process peak "
               "RSS %.1f MiB%s\n",
               ctx->dmem ? " on " : "", ctx->dmem ? ctx->dev_name : "",
               res->predicted_reserved / 1048576.0, total / 1048576.0, ms.reserved_peak / 1048576.0,
               ms.allocated_total_peak / 1048576.0, res->peak_rss_kib / 1024.0,
               cfg->step.budget ? (ms.reserved_peak <= cfg->step.budget ? " (within the budget)"
                                                                        : " (OVER the budget)")
                                : "");
        if (s->opt.scaler.enabled)
            printf("loss scaler: scale %g, %llu steps skipped for inf/NaN gradients\n",
                   (double)s->opt.scaler.scale, (unsigned long long)s->opt.scaler.skipped);
        fr_mem_summary(ctx, stdout);
        if (ranks > 1) {
            fr_mem_ranks_summary(ranks, res->rank_peak_min, res->rank_peak_max, stdout, 0);
            printf("rank 0 waited %.3f s for the gradient sums over %lld steps (%s)\n",
                   res->comm_wait_s, (long long)s->dp.buckets->reductions,
                   cfg->step.no_overlap ? "started after backward" : "overlapping backward");
        }
    }
    if (s && s->place.feed) {
        fr_feed_stats fs;
        fr_feed_get_stats(s->place.feed, &fs);
        if (!st && !cfg->json && !cfg->quiet)
            printf("batch uploads: %lld into two device slots, %lld of them before the step "
                   "beside them ended (%.2f ms uploading, %.2f ms of it during a step); %lld "
                   "enqueued by the loader's thread; the steps waited %lld times, each for its "
                   "own batch\n",
                   (long long)fs.uploads, (long long)fs.overlapped, fs.upload_us / 1e3,
                   fs.overlap_us / 1e3, (long long)fs.from_loader, (long long)fs.waits);
        fr_status ds = fr_feed_drain(s->place.feed); /* before the loader's batches go */
        if (!st) st = ds;
    }
    if (s) {
        res->loss_scale = s->opt.scaler.enabled ? s->opt.scaler.scale : 1.0f;
        res->skipped_steps = s->opt.scaler.skipped;
    }
    fr_batches_close(&l);
    fr_step_free(s);
    fr_source_close(&src);
    fr_model_free(m);
    return st;
}
