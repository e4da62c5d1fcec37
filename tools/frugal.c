/* frugal.c — the command-line tool: train, eval, estimate. It parses
 * options, calls the library and prints; every failure is one message on
 * stderr naming what went wrong and a non-zero exit. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "data/dataset.h"
#include "report/timeline.h"
#include "train/trainer.h"

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"

static const char *usage_main =
    "frugal " FR_VERSION " - train neural networks in C within a memory budget you can see\n"
    "\n"
    "usage: frugal <command> [options]\n"
    "\n"
    "commands:\n"
    "  train     train a model on an IDX dataset (Fashion-MNIST by default)\n"
    "  eval      accuracy and loss of saved weights (no backward state is allocated)\n"
    "  estimate  bytes per layer and category, and the predicted peak of one step\n"
    "  plan      the plan that fits a memory budget: what is kept, recomputed, split\n"
    "  profile   run a few steps and write the memory timeline (Chrome trace + SVG)\n"
    "  help      this text; `frugal <command> --help` for a command's options\n"
    "\n"
    "examples:\n"
    "  frugal train --model cnn --epochs 3 --batch 128 --optimizer adam --save cnn.safetensors\n"
    "  frugal estimate --model models/mlp.model --batch 32 --optimizer sgd\n"
    "  frugal eval --model cnn --weights cnn.safetensors\n"
    "  frugal plan --model resnet --batch 128 --budget 64MiB\n"
    "  frugal train --model resnet --budget 128MiB --batch auto\n";

static const char *usage_train =
    "usage: frugal train [options]\n"
    "\n"
    "  --model FILE|NAME   model file (see models/README.md) or built-in: mlp, cnn, resnet [cnn]\n"
    "  --data DIR          directory with {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]\n"
    "                      [" DEFAULT_DATA "]\n"
    "  --epochs N          passes over the training set [3]\n"
    "  --batch B           samples per step [128]\n"
    "  --optimizer NAME    sgd | adam | adamw [adam]\n"
    "  --lr X              learning rate [sgd 0.01, adam/adamw 0.001]\n"
    "  --momentum X        SGD momentum [0]\n"
    "  --nesterov          SGD Nesterov momentum\n"
    "  --dampening X       SGD dampening [0]\n"
    "  --weight-decay X    L2 (sgd, adam) or decoupled (adamw) [0; adamw 0.01]\n"
    "  --eps X             Adam/AdamW epsilon [1e-8]\n"
    "  --zero-grad MODE    none (release gradient buffers after each step, PyTorch's\n"
    "                      set_to_none=True) or zero (keep them) [none]\n"
    "  --keep-grads        store every gradient; by default, without clipping, a loss\n"
    "                      scaler or accumulation, each f32 parameter is stepped inside\n"
    "                      backward as soon as its gradient is made, which then dies\n"
    "                      (plain SGD in the Linear kernel; momentum SGD, Adam and AdamW\n"
    "                      by a step node), so gradients are never all stored at once\n"
    "  --seed N            seed for initialisation, shuffling and dropout [0]\n"
    "  --threads N         threads for OpenMP and OpenBLAS [all cores]\n"
    "  --save PATH         write weights + optimizer state (safetensors) after each epoch\n"
    "  --resume PATH       continue from a checkpoint; losses equal an uninterrupted run\n"
    "  --limit N           use only the first N training samples\n"
    "  --test-limit N      use only the first N test samples\n"
    "  --json              JSON lines on stdout (one per epoch, then a summary)\n"
    "  --no-progress       no progress bar or log lines\n"
    "\n"
    "memory (the planner; see `frugal plan --help`):\n"
    "  --budget SIZE       a hard limit on the bytes the engine reserves (48MiB, 1.5GiB);\n"
    "                      the planner picks the least recompute that fits\n"
    "  --checkpoint MODE   none | marks (the model file's `checkpoint` marks, default) | all |\n"
    "                      sqrt | every:N | revolve:SLOTS | auto (least recompute within --budget)\n"
    "  --segments N        PyTorch's checkpoint_sequential(N): segments of floor(n/N) layers,\n"
    "                      the last segment not checkpointed\n"
    "  --accumulate K      split each batch into K micro-batches; gradients accumulate\n"
    "  --micro-batch M     the same, by micro-batch size (must divide --batch)\n"
    "  --freeze LAYERS     no gradients, no optimizer state, nothing saved for these layers:\n"
    "                      indices, ranges or names, e.g. 0-3,fc1\n"
    "  --batch auto        the largest batch whose plan fits --budget\n"
    "\n"
    "precision:\n"
    "  --precision P       fp32 | bf16-mixed | fp16-mixed (fp32 master weights and optimizer\n"
    "                      state, activations saved for backward in 16 bits) | bf16 | fp16\n"
    "                      (weights in 16 bits too) | auto (mixed only if the budget needs it)\n"
    "  --optimizer-state S fp32 | bf16 | int8 (Adam/AdamW moments; int8 is block-wise dynamic\n"
    "                      quantization, tensors under 2048 values keep fp32) [fp32]\n"
    "  --loss-scale MODE   dynamic (PyTorch's GradScaler: 65536, x2 every 2000 clean steps,\n"
    "                      x0.5 and skip the step on inf/NaN) | none [dynamic for fp16*]\n"
    "  --clip-grad-norm X  clip the global L2 norm of the gradients (after unscaling)\n";

static const char *usage_eval =
    "usage: frugal eval --model FILE|NAME --weights CKPT [--data DIR] [--batch B] [--json]\n"
    "\n"
    "Runs the forward pass only: no gradients, no saved activations, no optimizer state\n"
    "(PyTorch's model.eval() under torch.no_grad()). BatchNorm uses its running stats and\n"
    "dropout is off. Reports test-set accuracy and mean loss, and the memory it took.\n";

static const char *usage_plan =
    "usage: frugal plan --model FILE|NAME --batch B|auto [--optimizer O] --budget SIZE\n"
    "                   [--checkpoint MODE] [--segments N] [--accumulate K | --micro-batch M]\n"
    "                   [--freeze LAYERS] [--json]\n"
    "\n"
    "Prints the plan of one training step that fits the budget: which layers keep their\n"
    "activations for backward and which are recomputed before their backward, the\n"
    "micro-batch and accumulation steps, how many ops run in place, the predicted peak\n"
    "by category and the extra compute as a fraction of one step's FLOPs. If nothing fits\n"
    "it says the smallest budget that does and with which options.\n"
    "\n"
    "How it chooses: every candidate (keep everything; checkpoint_sequential segments;\n"
    "binomial checkpointing with s slots, Griewank's revolve, the least recomputation for\n"
    "s stored states; each at the full batch or split into micro-batches) is planned\n"
    "exactly, as it would run; of those that fit, the one with the least extra compute\n"
    "wins. Splitting the batch costs no FLOPs but smaller GEMMs run slower (counted as 3%\n"
    "per halving) and it changes BatchNorm's statistics (a model with BatchNorm splits\n"
    "only when nothing else fits).\n";

static const char *usage_profile =
    "usage: frugal profile --model FILE|NAME [--batch B] [--optimizer O] [--steps N]\n"
    "                      [--trace trace.json] [--svg memory.svg] [planner options]\n"
    "\n"
    "Runs N training steps (default 3) on random data and writes every allocation and\n"
    "free with its op and category: Chrome Trace Event JSON (open it in Perfetto or\n"
    "chrome://tracing) and a self-contained SVG chart, stacked by category over time,\n"
    "with the peak marked (and the budget, if given).\n";

static const char *usage_estimate =
    "usage: frugal estimate --model FILE|NAME [--batch B] [--optimizer NAME] [--momentum X]\n"
    "                       [--keep-grads] [--eval] [--json]\n"
    "\n"
    "Builds and plans one step without running it and prints, per layer, the bytes of\n"
    "weights, biases and buffers, gradients, optimizer state, the layer's output, what is\n"
    "saved for backward and workspace; then the predicted peak by category. fp32 throughout.\n"
    "SGD keeps no state (momentum one copy of the weights), Adam and AdamW two.\n";

enum {
    O_MODEL = 1000, O_DATA, O_EPOCHS, O_BATCH, O_OPT, O_LR, O_MOM, O_NESTEROV, O_DAMP, O_WD, O_SEED,
    O_THREADS, O_SAVE, O_RESUME, O_LIMIT, O_TLIMIT, O_JSON, O_NOPROG, O_WEIGHTS, O_EVAL, O_HELP,
    O_ZERO, O_EPS, O_PREC, O_OSTATE, O_CLIP, O_LSCALE, O_BUDGET, O_CKPT, O_SEGMENTS, O_ACCUM, O_MICRO, O_FREEZE, O_TRACE, O_SVG, O_STEPS, O_KEEPG
};

static const struct option long_opts[] = {
    {"model", required_argument, 0, O_MODEL}, {"data", required_argument, 0, O_DATA},
    {"epochs", required_argument, 0, O_EPOCHS}, {"batch", required_argument, 0, O_BATCH},
    {"optimizer", required_argument, 0, O_OPT}, {"lr", required_argument, 0, O_LR},
    {"momentum", required_argument, 0, O_MOM}, {"nesterov", no_argument, 0, O_NESTEROV},
    {"dampening", required_argument, 0, O_DAMP}, {"weight-decay", required_argument, 0, O_WD},
    {"seed", required_argument, 0, O_SEED}, {"threads", required_argument, 0, O_THREADS},
    {"save", required_argument, 0, O_SAVE}, {"resume", required_argument, 0, O_RESUME},
    {"limit", required_argument, 0, O_LIMIT}, {"test-limit", required_argument, 0, O_TLIMIT},
    {"json", no_argument, 0, O_JSON}, {"no-progress", no_argument, 0, O_NOPROG},
    {"weights", required_argument, 0, O_WEIGHTS}, {"eval", no_argument, 0, O_EVAL},
    {"zero-grad", required_argument, 0, O_ZERO}, {"budget", required_argument, 0, O_BUDGET},
    {"eps", required_argument, 0, O_EPS}, {"precision", required_argument, 0, O_PREC}, {"optimizer-state", required_argument, 0, O_OSTATE},
    {"clip-grad-norm", required_argument, 0, O_CLIP}, {"loss-scale", required_argument, 0, O_LSCALE},
    {"checkpoint", required_argument, 0, O_CKPT}, {"segments", required_argument, 0, O_SEGMENTS},
    {"accumulate", required_argument, 0, O_ACCUM}, {"micro-batch", required_argument, 0, O_MICRO},
    {"freeze", required_argument, 0, O_FREEZE}, {"trace", required_argument, 0, O_TRACE},
    {"svg", required_argument, 0, O_SVG}, {"steps", required_argument, 0, O_STEPS},
    {"keep-grads", no_argument, 0, O_KEEPG},
    {"help", no_argument, 0, O_HELP}, {0, 0, 0, 0}};

typedef struct cli {
    fr_train_cfg t;
    const char *trace, *svg;
    int steps, accumulate;
    const char *weights;
    int threads, eval_only, lr_set, wd_set;
    float lr, wd, momentum, dampening, eps;
    int eps_set;
    int nesterov, zero_keep;
} cli;

static int bad(const char *cmd, const char *fmt, const char *arg) {
    fprintf(stderr, "frugal %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see `frugal %s --help`)\n", cmd);
    return 2;
}

static int parse_num(const char *cmd, const char *name, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
        fprintf(stderr, "frugal %s: --%s '%s': expected a number in [%g, %g]\n", cmd, name, s, lo, hi);
        return 2;
    }
    *out = v;
    return 0;
}

static int parse(int argc, char **argv, const char *cmd, const char *usage, cli *c) {
    memset(c, 0, sizeof *c);
    c->t.model = "cnn";
    c->t.data = DEFAULT_DATA;
    c->t.epochs = 3;
    c->t.batch = 128;
    c->t.optim = fr_optim_defaults(FR_OPTIM_ADAM);
    c->t.progress = isatty(STDERR_FILENO) ? 1 : 0;
    c->t.queue = 2;
    c->t.eval_batch = 0; /* the training micro-batch */
    const char *opt_name = "adam";
    optind = 1;
    int o;
    double v;
    while ((o = getopt_long(argc, argv, "h", long_opts, NULL)) != -1) {
        switch (o) {
        case O_MODEL: c->t.model = optarg; break;
        case O_DATA: c->t.data = optarg; break;
        case O_EPOCHS: if (parse_num(cmd, "epochs", optarg, 1, 1e6, &v)) return 2; c->t.epochs = (int)v; break;
        case O_BATCH:
            if (!strcmp(optarg, "auto")) { c->t.batch_auto = 1; break; }
            if (parse_num(cmd, "batch", optarg, 1, 1 << 20, &v)) return 2;
            c->t.batch = (int)v;
            break;
        case O_OPT: opt_name = optarg; break;
        case O_LR: if (parse_num(cmd, "lr", optarg, 0, 1e6, &v)) return 2; c->lr = (float)v; c->lr_set = 1; break;
        case O_MOM: if (parse_num(cmd, "momentum", optarg, 0, 1, &v)) return 2; c->momentum = (float)v; break;
        case O_NESTEROV: c->nesterov = 1; break;
        case O_DAMP: if (parse_num(cmd, "dampening", optarg, 0, 1, &v)) return 2; c->dampening = (float)v; break;
        case O_WD: if (parse_num(cmd, "weight-decay", optarg, 0, 1e6, &v)) return 2; c->wd = (float)v; c->wd_set = 1; break;
        case O_SEED: if (parse_num(cmd, "seed", optarg, 0, 1e18, &v)) return 2; c->t.seed = (uint64_t)v; break;
        case O_THREADS: if (parse_num(cmd, "threads", optarg, 0, 1024, &v)) return 2; c->threads = (int)v; break;
        case O_SAVE: c->t.save = optarg; break;
        case O_RESUME: c->t.resume = optarg; break;
        case O_LIMIT: if (parse_num(cmd, "limit", optarg, 1, 1e12, &v)) return 2; c->t.limit_train = (int64_t)v; break;
        case O_TLIMIT: if (parse_num(cmd, "test-limit", optarg, 1, 1e12, &v)) return 2; c->t.limit_test = (int64_t)v; break;
        case O_JSON: c->t.json = 1; break;
        case O_NOPROG: c->t.progress = -1; break;
        case O_WEIGHTS: c->weights = optarg; break;
        case O_EVAL: c->eval_only = 1; break;
        case O_EPS: if (parse_num(cmd, "eps", optarg, 0, 1, &v)) return 2; c->eps = (float)v; c->eps_set = 1; break;
        case O_PREC:
            if (fr_precision_parse(NULL, optarg, &c->t.precision))
                return bad(cmd, "--precision '%s': choose fp32, bf16, fp16, bf16-mixed, fp16-mixed or auto", optarg);
            break;
        case O_OSTATE:
            if (!strcmp(optarg, "fp32")) c->t.optim_state = FR_OPTIM_STATE_FP32;
            else if (!strcmp(optarg, "bf16")) c->t.optim_state = FR_OPTIM_STATE_BF16;
            else if (!strcmp(optarg, "int8")) c->t.optim_state = FR_OPTIM_STATE_INT8;
            else return bad(cmd, "--optimizer-state '%s': choose fp32, bf16 or int8", optarg);
            break;
        case O_KEEPG: c->t.keep_grads = 1; break;
        case O_CLIP: if (parse_num(cmd, "clip-grad-norm", optarg, 0, 1e30, &v)) return 2; c->t.clip_grad_norm = (float)v; break;
        case O_LSCALE:
            if (!strcmp(optarg, "dynamic")) c->t.loss_scaling = FR_LOSS_SCALE_DYNAMIC;
            else if (!strcmp(optarg, "none")) c->t.loss_scaling = FR_LOSS_SCALE_NONE;
            else return bad(cmd, "--loss-scale '%s': choose dynamic or none", optarg);
            break;
        case O_BUDGET: {
            char err[160];
            if (fr_parse_bytes(optarg, &c->t.budget, err, sizeof err)) return bad(cmd, "--budget: %s", err);
            break;
        }
        case O_CKPT: {
            char err[160];
            if (fr_parse_checkpoint(optarg, &c->t.checkpoint, &c->t.ckpt_arg, err, sizeof err))
                return bad(cmd, "--checkpoint: %s", err);
            break;
        }
        case O_SEGMENTS: if (parse_num(cmd, "segments", optarg, 1, 1e6, &v)) return 2;
            c->t.checkpoint = FR_CKPT_SEGMENTS; c->t.ckpt_arg = (int)v; break;
        case O_ACCUM: if (parse_num(cmd, "accumulate", optarg, 1, 1 << 20, &v)) return 2; c->accumulate = (int)v; break;
        case O_MICRO: if (parse_num(cmd, "micro-batch", optarg, 1, 1 << 20, &v)) return 2; c->t.micro_batch = (int)v; break;
        case O_FREEZE: c->t.freeze = optarg; break;
        case O_TRACE: c->trace = optarg; break;
        case O_SVG: c->svg = optarg; break;
        case O_STEPS: if (parse_num(cmd, "steps", optarg, 1, 1e6, &v)) return 2; c->steps = (int)v; break;
        case O_ZERO:
            if (strcmp(optarg, "none") && strcmp(optarg, "zero"))
                return bad(cmd, "--zero-grad '%s': expected none or zero", optarg);
            c->zero_keep = !strcmp(optarg, "zero");
            break;
        case 'h':
        case O_HELP: fputs(usage, stdout); exit(0);
        default: fprintf(stderr, "(see `frugal %s --help`)\n", cmd); return 2;
        }
    }
    if (optind < argc) return bad(cmd, "unexpected argument '%s'", argv[optind]);
    if (c->accumulate) {
        if (c->t.micro_batch) return bad(cmd, "%s", "give --accumulate or --micro-batch, not both");
        if (c->t.batch % c->accumulate)
            return bad(cmd, "--accumulate %s does not divide the batch", argv[0]);
        c->t.micro_batch = c->t.batch / c->accumulate;
    }
    if (c->t.batch_auto && !c->t.budget)
        return bad(cmd, "%s", "--batch auto needs --budget (the largest batch that fits it)");
    fr_optim_kind kind;
    if (fr_optim_parse(NULL, opt_name, &kind)) return bad(cmd, "unknown optimizer '%s' (choose sgd, adam or adamw)", opt_name);
    c->t.optim = fr_optim_defaults(kind);
    if (c->lr_set) c->t.optim.lr = c->lr;
    if (c->wd_set) c->t.optim.weight_decay = c->wd;
    if (c->eps_set) c->t.optim.eps = c->eps;
    c->t.optim.momentum = c->momentum;
    c->t.optim.dampening = c->dampening;
    c->t.optim.nesterov = c->nesterov;
    c->t.optim.zero_grad_to_none = !c->zero_keep;
    if (kind != FR_OPTIM_SGD && (c->momentum || c->nesterov || c->dampening))
        return bad(cmd, "--momentum, --nesterov and --dampening are SGD options, not %s", opt_name);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return bad(cmd, "%s", "Nesterov momentum requires a momentum and zero dampening (as in PyTorch)");
    return 0;
}

/* The memory stats as JSON on the current line (fr_mem_json ends with a newline). */
static void mem_json_inline(fr_ctx *ctx) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) {
        printf("null");
        return;
    }
    fr_mem_json(ctx, f);
    fclose(f);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = 0;
    fputs(buf, stdout);
    free(buf);
}

static int cmd_train(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, "train", usage_train, &c);
    if (r) return r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads);
    if (!c.t.json && c.t.progress >= 0)
        fprintf(stderr, "training %s on %s: %d epochs, batch %d, %s lr %g, %d threads\n", c.t.model,
                c.t.data, c.t.epochs, c.t.batch,
                c.t.optim.kind == FR_OPTIM_SGD ? "sgd" : c.t.optim.kind == FR_OPTIM_ADAM ? "adam" : "adamw",
                (double)c.t.optim.lr, fr_get_threads(ctx));
    fr_train_result res;
    fr_status st = fr_train(ctx, &c.t, &res);
    if (st) {
        fprintf(stderr, "frugal train: %s\n", fr_last_error(ctx));
        fr_ctx_free(ctx);
        return 1;
    }
    if (c.t.json) {
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        printf("{\"event\": \"summary\", \"epochs\": %d, \"batch\": %d, \"test_acc\": %.6f, "
               "\"test_loss\": %.17g, \"seconds\": %.3f, \"peak_rss_bytes\": %zu, \"budget\": %zu, "
               "\"predicted_step_reserved\": %zu, \"measured_reserved_peak\": %zu, \"precision\": \"%s\", "
               "\"loss_scale\": %g, \"skipped_steps\": %llu, \"memory\": ",
               res.epochs_done, res.batch, res.test_acc, res.test_loss, res.seconds,
               res.peak_rss_kib * 1024, c.t.budget, res.predicted_reserved, res.measured_reserved_peak,
               fr_precision_name(c.t.precision), (double)res.loss_scale,
               (unsigned long long)res.skipped_steps);
        mem_json_inline(ctx);
        printf("}\n");
    } else if (c.t.progress >= 0) {
        printf("done in %.1f s: test accuracy %.2f%%\n", res.seconds, 100 * res.test_acc);
    }
    fr_ctx_free(ctx);
    return 0;
}

static int cmd_eval(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, "eval", usage_eval, &c);
    if (r) return r;
    if (!c.weights) return bad("eval", "%s", "--weights CKPT is required");
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads);
    fr_model *m = fr_model_load(ctx, c.t.model);
    fr_dataset *ds = NULL;
    double acc = 0, loss = 0;
    fr_status st = m ? fr_model_load_weights(m, c.weights) : FR_ERR_ARG;
    if (!st && !(ds = fr_dataset_open_dir(ctx, c.t.data, "t10k"))) st = FR_ERR_IO;
    if (!st) st = fr_evaluate(ctx, m, ds, c.t.batch, c.t.limit_test, &acc, &loss);
    if (st) {
        fprintf(stderr, "frugal eval: %s\n", fr_last_error(ctx));
    } else {
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        if (c.t.json) {
            printf("{\"accuracy\": %.6f, \"loss\": %.9g, \"gradients_bytes_peak\": %zu, "
                   "\"optimizer_bytes_peak\": %zu, \"memory\": ",
                   acc, loss, ms.allocated_peak[FR_MEM_GRADS], ms.allocated_peak[FR_MEM_OPTIM]);
            mem_json_inline(ctx);
            printf("}\n");
        } else {
            printf("test accuracy %.2f%%, loss %.4f (%lld samples)\n", 100 * acc, loss,
                   (long long)(c.t.limit_test ? c.t.limit_test : fr_dataset_len(ds)));
            fr_mem_summary(ctx, stdout);
        }
    }
    fr_dataset_close(ds);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return st ? 1 : 0;
}

static fr_model *load_for(const char *cmd, fr_ctx *ctx, const cli *c) {
    fr_model *m = fr_model_load(ctx, c->t.model);
    if (m && c->t.freeze && fr_model_freeze(m, c->t.freeze)) {
        fr_model_free(m);
        m = NULL;
    }
    if (!m) fprintf(stderr, "frugal %s: %s\n", cmd, fr_last_error(ctx));
    return m;
}

static fr_step_opts step_opts(const cli *c, fr_model *m) {
    fr_step_opts so = {.batch = c->t.batch, .training = 1, .optim = c->t.optim, .seed = c->t.seed,
                       .checkpoint = c->t.checkpoint, .ckpt_arg = c->t.ckpt_arg,
                       .micro_batch = c->t.micro_batch, .budget = c->t.budget,
                       .precision = c->t.precision, .optim_state = c->t.optim_state,
                       .clip_grad_norm = c->t.clip_grad_norm, .loss_scaling = c->t.loss_scaling,
                       .keep_grads = c->t.keep_grads};
    if (c->t.batch_auto) {
        if (fr_batch_auto(m, &so, 1 << 16, &so.batch)) so.batch = 0;
        else fprintf(stderr, "--batch auto: %d is the largest batch that fits\n", so.batch);
    }
    return so;
}

static int cmd_plan(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, "plan", usage_plan, &c);
    if (r) return r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_model *m = load_for("plan", ctx, &c);
    fr_step *s = NULL;
    if (m) {
        fr_model_init(m, c.t.seed);
        fr_step_opts so = step_opts(&c, m);
        if (so.batch == 0)
            fprintf(stderr, "frugal plan: not even a batch of 1 fits %zu bytes\n", c.t.budget);
        else if (!(s = fr_step_compile(m, &so)))
            fprintf(stderr, "frugal plan: %s\n", fr_last_error(ctx));
        else
            fr_step_describe_plan(s, stdout, c.t.json);
    }
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return s ? 0 : 1;
}

static int cmd_profile(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, "profile", usage_profile, &c);
    if (r) return r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads);
    fr_model *m = load_for("profile", ctx, &c);
    fr_step *s = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    int rc = 1;
    if (!m) goto out;
    fr_model_init(m, c.t.seed);
    if (c.t.budget) fr_mem_set_limit(ctx, c.t.budget);
    fr_mem_trace(ctx, 1);
    fr_step_opts so = step_opts(&c, m);
    if (!(s = fr_step_compile(m, &so))) {
        fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
        goto out;
    }
    fr_step_describe_plan(s, stderr, 0);
    size_t per = (size_t)fr_shape_numel(&s->g.vals[s->g.input].shape) / (size_t)s->micro;
    x = malloc(per * (size_t)so.batch * sizeof *x);
    y = malloc((size_t)so.batch * sizeof *y);
    if (!x || !y) goto out;
    for (size_t i = 0; i < per * (size_t)so.batch; i++) x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    for (int i = 0; i < so.batch; i++) y[i] = i % fr_model_num_classes(m);
    fr_batch b = {.n = so.batch, .x = x, .y = y};
    int steps = c.steps ? c.steps : 3;
    for (int i = 0; i < steps; i++) {
        float loss;
        if (fr_step_run(s, &b, &loss, NULL)) {
            fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
            goto out;
        }
    }
    const char *trace = c.trace ? c.trace : "memory-trace.json";
    const char *svg = c.svg ? c.svg : "memory.svg";
    if (fr_timeline_chrome(ctx, trace) || fr_timeline_svg(ctx, svg, c.t.model, c.t.budget)) {
        fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
        goto out;
    }
    fr_mem_stats ms;
    fr_mem_get_stats(ctx, &ms);
    printf("%d steps: peak allocated %.1f MiB, peak reserved %.1f MiB\nwrote %s (open in Perfetto) and %s\n",
           steps, ms.allocated_total_peak / 1048576.0, ms.reserved_peak / 1048576.0, trace, svg);
    rc = 0;
out:
    free(x);
    free(y);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return rc;
}

static int cmd_estimate(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, "estimate", usage_estimate, &c);
    if (r) return r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_model *m = load_for("estimate", ctx, &c);
    fr_step *s = NULL;
    if (m) {
        fr_step_opts so = step_opts(&c, m);
        so.training = !c.eval_only;
        s = so.batch ? fr_step_compile(m, &so) : NULL;
    }
    if (!s) {
        fprintf(stderr, "frugal estimate: %s\n", fr_last_error(ctx));
        fr_model_free(m);
        fr_ctx_free(ctx);
        return 1;
    }
    if (!c.t.json) {
        printf("model %s: %zu trainable parameters\n", c.t.model, fr_model_num_params(m));
    }
    fr_step_estimate_table(s, stdout, c.t.json);
    fr_step_free(s);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        fputs(usage_main, stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) return puts("frugal " FR_VERSION), 0;
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "estimate")) return cmd_estimate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "profile")) return cmd_profile(argc - 1, argv + 1);
    fprintf(stderr, "frugal: unknown command '%s' (commands: train, eval, estimate, plan, profile, help)\n", argv[1]);
    return 2;
}
