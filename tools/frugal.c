/* frugal.c — the command-line tool: train, eval, estimate, plan, profile,
 * generate.
 * It parses options (one table says which command takes which), calls the
 * library and prints; every failure is one message on stderr naming what
 * went wrong and a non-zero exit (2 for a usage error). */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <stdio.h>
#include <time.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include "backend/cpu/cpuinfo.h"
#include "core/names.h"
#include "data/dataset.h"
#include "parallel/comm.h"
#include "infer/generate.h"
#include "tok/tokenizer.h"
#include "report/report.h"
#include "report/timeline.h"
#include "run/adapter.h"
#include "run/source.h"
#include "run/trainer.h"
#ifdef FR_HAVE_OPENCL
#include "backend/opencl/backend.h"
#endif

#define DEFAULT_DATA "/usr/share/datasets/fashion-mnist"
/* A token model's default text: Debian's fortunes package. */
#define DEFAULT_TEXT "/usr/share/games/fortunes"
/* What `plan` counts for two open datasets when it cannot open them. */
#define FR_PLAN_ASSUMED_HANDLES (8u << 10)

static const char *usage_main =
    "frugal " FR_VERSION " - train neural networks in C within a memory budget you can see\n"
    "\n"
    "usage: frugal <command> [options]\n"
    "\n"
    "commands:\n"
    "  train     train a model on IDX or .npy data (Fashion-MNIST by default)\n"
    "  eval      accuracy and loss of saved weights (no backward state is allocated)\n"
    "  estimate  bytes per layer and category, and the predicted peak of one step\n"
    "  plan      the plan that fits a memory budget: what is kept, recomputed, split\n"
    "  profile   run a few steps and write the memory timeline (Chrome trace + SVG)\n"
    "  generate  stream text from a trained language model (KV cache: O(T) a token)\n"
    "  devices   the CPU (features, GEMM kernels, GFLOP/s) and the OpenCL devices\n"
    "  tokenize  encode text with a model's tokenizer into llm.c token shards\n"
    "  help      this text; `frugal <command> --help` for a command's options\n"
    "\n"
    "examples:\n"
    "  frugal train --model cnn --epochs 3 --batch 128 --optimizer adam --save cnn.safetensors\n"
    "  frugal estimate --model models/mlp.model --batch 32 --optimizer sgd\n"
    "  frugal eval --model cnn --weights cnn.safetensors\n"
    "  frugal plan --model resnet --batch 128 --budget 64MiB\n"
    "  frugal train --model resnet --budget 128MiB --batch auto\n"
    "  frugal train --model gpt-tiny --data /usr/share/games/fortunes --steps 500 --save g.st\n"
    "  frugal generate --model gpt-tiny --weights g.st --prompt 'The ' --tokens 200\n"
    "  frugal estimate --model gpt2 --batch 4 --seq 1024 --optimizer adamw\n";

/* ---- commands and their options ----------------------------------------
 * One table of options says which commands take each one; one parser reads
 * them all and refuses an option its command does not use, and every
 * command's --help is printed from the same table, so what --help lists is
 * exactly what the command accepts. */

enum {
    C_TRAIN = 1,
    C_EVAL = 2,
    C_ESTIMATE = 4,
    C_PLAN = 8,
    C_PROFILE = 16,
    C_GENERATE = 32,
    C_ALL = 63
};
#define C_STEP (C_TRAIN | C_ESTIMATE | C_PLAN | C_PROFILE) /* commands that plan a training step */

typedef struct command {
    const char *name;
    unsigned bit;
    const char *synopsis; /* after "usage: frugal " */
    const char *about;    /* the paragraph between the synopsis and the options */
} command;

static const command commands[] = {
    {"train", C_TRAIN, "train [options]",
     "Trains a model on a dataset (Fashion-MNIST by default), evaluates the test set after\n"
     "each epoch and prints the memory it took.\n"
     "\n"
     "A language model (a model file with `input tokens N`, e.g. gpt-tiny) trains on text\n"
     "(bytes: any file or directory of files; Debian's fortunes by default), llm.c token\n"
     "shards (.bin, several by glob) or a 1-D integer .npy. The last --val-fraction of the\n"
     "tokens is held out; each evaluation prints its loss in nats and bits per byte.\n"
     "\n"
     "Many processes: `mpirun -np N frugal train ...` trains one model on N ranks (data\n"
     "parallel, every rank a full copy of the weights and optimizer state: ZeRO stage 0).\n"
     "--batch is the global batch: rank r of N takes samples [r*n/N, (r+1)*n/N) of each\n"
     "batch of n in the loader's order (the slices differ by at most one sample; the last\n"
     "batch of an epoch must have at least N), its loss weighted by its share of the batch;\n"
     "gradients are summed over the ranks in buckets (1 MiB first, then 25 MiB, last layer\n"
     "first) started while backward runs, so N ranks train the model one process would with\n"
     "the same --batch (up to the order of the sums). Progress, logs and JSON come from\n"
     "rank 0, which alone writes --save; the summary adds every rank's peak (min and max).\n"
     "Give each rank its threads (--threads, or OMP_NUM_THREADS); the CPU backend only.\n"},
    {"eval", C_EVAL, "eval --model FILE|NAME --weights CKPT [options]",
     "Runs the forward pass only: no gradients, no saved activations, no optimizer state\n"
     "(PyTorch's model.eval() under torch.no_grad()). BatchNorm uses its running stats and\n"
     "dropout is off. Reports test-set accuracy and mean loss, and the memory it took.\n"
     "A language model scores the first 128 validation windows (train's rule; --test-limit\n"
     "N, 0 for all), every one of them whatever --batch, and says how many it scored.\n"
     "\n"
     "Evaluation runs in fp32, whatever precision the model trained in (train's validation\n"
     "too): the weights a run keeps are fp32 (the master copy under *-mixed), so the loss is\n"
     "the model's and not the rounding's, comparable across precisions; and a forward pass\n"
     "without backward keeps no activations, so 16 bits would save little memory there.\n"},
    {"estimate", C_ESTIMATE, "estimate --model FILE|NAME [options]",
     "Builds and plans one step without running it and prints, per layer, the bytes of\n"
     "weights, biases and buffers, gradients, optimizer state, the layer's output, what is\n"
     "saved for backward and workspace; then the predicted peak by category.\n"
     "SGD keeps no state (momentum one copy of the weights), Adam and AdamW two.\n"},
    {"plan", C_PLAN, "plan --model FILE|NAME --batch B|auto --budget SIZE [options]",
     "Prints the plan of one training step that fits the budget: which layers keep their\n"
     "activations for backward and which are recomputed before their backward, the\n"
     "micro-batch and accumulation steps, how many ops run in place, the predicted peak\n"
     "by category and the extra compute as a fraction of one step's FLOPs. If nothing fits\n"
     "it says the smallest budget that does and with which options.\n"
     "\n"
     "The budget is counted as `frugal train` counts it: the datasets (--data, --limit,\n"
     "--test-limit, opened to count them), the loader's queue of batches, the model's\n"
     "parameters and metadata, and what is left for the step. A budget `plan` accepts is one\n"
     "`train` runs within, with the same options.\n"
     "\n"
     "How it chooses: the candidates are keeping everything, checkpoint_sequential\n"
     "segments and binomial checkpointing with s slots (Griewank's revolve, the least\n"
     "recomputation for s stored states), each at the full batch or split into\n"
     "micro-batches. A candidate is planned exactly, as it would run; a family of more\n"
     "than 48 arguments is sampled and bisected for the range that fits instead of\n"
     "enumerated. Of those that fit, the one with the least extra cost wins: the recomputed\n"
     "FLOPs as a fraction of the step's, plus what splitting the batch costs in time.\n"
     "Splitting costs no FLOPs, but every node then runs once per micro-batch (counted as\n"
     "2e5 FLOPs a run) and each linear layer's GEMM gets proportionally fewer rows (a GEMM\n"
     "of M rows counted at M/(M+8) of its rate), fitted to measured steps of the CNN, the\n"
     "MLP and gpt-tiny on two threads (bench/out/microbatch.md). Splitting also changes "
     "BatchNorm's\n"
     "statistics, so a model with BatchNorm splits only when nothing else fits. The plan\n"
     "reports both parts (\"extra cost\"; JSON extra_compute, split_cost, extra_cost), and its\n"
     "table marks a layer recomputed only where the plan recomputes it.\n"},
    {"profile", C_PROFILE, "profile --model FILE|NAME [options]",
     "Runs N training steps (default 3) on random data and writes every allocation and\n"
     "free with its op and category: Chrome Trace Event JSON (open it in Perfetto or\n"
     "chrome://tracing) and a self-contained SVG chart, stacked by category over time,\n"
     "with the peak marked (and the budget, if given).\n"},
    {"generate", C_GENERATE,
     "generate --model FILE|NAME|DIR [--weights CKPT] [--tokenizer T] --prompt TEXT [options]",
     "Streams text from a language model: the prompt's bytes, then --tokens new ones, each\n"
     "sampled from the model's distribution at --temperature among the --top-k likeliest\n"
     "(temperature 0: the argmax, greedy). Keys and values of past positions are kept in a\n"
     "cache (its own memory category), so a new token costs O(T), not O(T^2). A prompt\n"
     "longer than the context keeps its last context tokens, and says so.\n"
     "With a tokenizer (--tokenizer, or a Hugging Face --model directory's own) the prompt\n"
     "is encoded (with BOS where the tokenizer adds one) and new tokens are decoded and\n"
     "streamed as text, stopping at the end-of-sequence token (--stop-at-eos). Without one,\n"
     "a model whose vocabulary is not bytes (256) takes --prompt ids:464,3290 (token ids)\n"
     "and prints ids separated by spaces. The summary gives tokens/s and the KV cache's bytes.\n"},
};
#define N_COMMANDS (sizeof commands / sizeof commands[0])

/* How --data is laid out, for the commands that read data. */
static const char *data_layout =
    "\n"
    "data layout: --data DIR holds each split (train, t10k) as one of\n"
    "  {split}-images-idx3-ubyte[.gz] + {split}-labels-idx1-ubyte[.gz]   Fashion-MNIST's names\n"
    "  {split}-images.npy + {split}-labels.npy    integer class labels (cross-entropy models)\n"
    "  {split}-images.npy + {split}-targets.npy   float32 (n, outputs) targets (`loss mse` "
    "models)\n"
    "Images are IDX u8 (n,h,w) or .npy u8/f32/f64 (n,h,w), (n,c,h,w) or (n,d) (float64,\n"
    "numpy's default, is converted to float32 as it is read, with a note). --train-images with\n"
    "--train-labels, and --test-images with --test-labels, name a split's two files instead\n"
    "(both of a pair or neither; the labels may be a float .npy of targets for an MSE model);\n"
    "--data DIR then serves the other split. Training files without test files and without\n"
    "--data: no test split and no evaluation (said once), never another dataset's.\n";

enum {
    O_SECTION = 1, /* a heading in --help, not an option */
    O_BATCH_AUTO,  /* a line of --help about --batch, not an option of its own */
    O_MODEL,
    O_DATA,
    O_TRAIN_IMAGES,
    O_TRAIN_LABELS,
    O_TEST_IMAGES,
    O_TEST_LABELS,
    O_LIMIT,
    O_TLIMIT,
    O_EPOCHS,
    O_BATCH,
    O_SEED,
    O_THREADS,
    O_DEVICE,
    O_OFFLOAD,
    O_SYNC_UPLOAD,
    O_SAVE,
    O_RESUME,
    O_INIT,
    O_WEIGHTS,
    O_EVAL,
    O_OPT,
    O_LR,
    O_MOM,
    O_NESTEROV,
    O_DAMP,
    O_WD,
    O_EPS,
    O_BETA1,
    O_B2DECAY,
    O_EPS2,
    O_CLIPTH,
    O_ZERO,
    O_KEEPG,
    O_BUDGET,
    O_CKPT,
    O_SEGMENTS,
    O_ACCUM,
    O_MICRO,
    O_FUSED_HEAD,
    O_FREEZE,
    O_LORA,
    O_ADAPTER,
    O_SAVE_ADAPTER,
    O_MERGE,
    O_PREC,
    O_BASEPREC,
    O_OSTATE,
    O_LSCALE,
    O_CLIP,
    O_STEPS,
    O_SEQ,
    O_VALFRAC,
    O_EVALINT,
    O_PROMPT,
    O_TOKENS,
    O_TEMP,
    O_TOPK,
    O_TOPP,
    O_STOP_EOS,
    O_MAXCTX,
    O_TOKENIZER,
    O_TRACE,
    O_SVG,
    O_JSON,
    O_NOPROG,
    O_QUIET,
    O_SAVE_EVERY,
    O_SAVE_WEIGHTS,
    O_WINDOW,
    O_NANOGPT_MASKS,
    O_BUCKET_CAP,
    O_NO_OVERLAP,
    O_RANKS,
    O_ZERO_STAGE,
    O_HELP
};

typedef struct opt_row {
    const char *name; /* after "--"; a heading's text for O_SECTION */
    const char *arg;  /* the value's name in --help; NULL: a flag */
    int id;
    unsigned cmds;    /* the commands that take it */
    const char *help; /* '\n' continues on the next line */
} opt_row;

/* In --help order; a heading is printed when a command takes an option under it. */
static const opt_row opts[] = {
    {"model", "FILE|NAME", O_MODEL, C_ALL & ~C_GENERATE,
     "model file (see models/README.md), built-in: mlp, cnn, resnet,\n"
     "gpt-tiny, gpt2, or a Hugging Face model: its config.json or the\n"
     "directory holding it (Llama, Mistral, GPT-2) [cnn]"},
    {"model", "FILE|NAME", O_MODEL, C_GENERATE,
     "a language model's file or built-in (gpt-tiny, gpt2) [gpt-tiny];\n"
     "or a Hugging Face model directory or its config.json"},
    {"weights", "CKPT", O_WEIGHTS, C_EVAL | C_GENERATE,
     "the weights (safetensors: frugal's, nanoGPT's or Hugging Face's;\n"
     "a sharded model.safetensors.index.json; or a directory) [a\n"
     "Hugging Face --model directory's own]"},
    {"tokenizer", "FILE|DIR", O_TOKENIZER, C_TRAIN | C_EVAL | C_GENERATE,
     "text <-> token ids: tokenizer.model (SentencePiece), tokenizer.json\n"
     "or vocab.json + merges.txt (byte-level BPE), or a directory\n"
     "holding one [a Hugging Face --model directory's own; else bytes]"},
    {"batch", "B", O_BATCH, C_ALL & ~C_GENERATE,
     "samples per step [128, or the model file's `default batch N`:\n"
     "gpt-tiny 8, gpt2 4, models/gpt2-xl.model 1]"},
    {"threads", "N", O_THREADS, C_ALL,
     "threads for OpenMP and OpenBLAS (0: all cores) [all cores];\n"
     "idle threads spin 0.1 ms, then sleep (OMP_WAIT_POLICY=passive,\n"
     "GOMP_SPINCOUNT=10000) unless the environment sets either"},
    {"device", "NAME", O_DEVICE, C_STEP | C_EVAL | C_GENERATE,
     "cpu, or opencl[:N]: the whole step on OpenCL device N (see\n"
     "`frugal devices`): weights, gradients, optimizer state and\n"
     "activations in its memory [cpu]"},
    {"offload", "WHAT", O_OFFLOAD, C_STEP,
     "with --device: optimizer keeps the optimizer's state and step\n"
     "on the host (ZeRO-Offload: gradients down, weights up each step);\n"
     "activations moves what is saved for backward to the host after\n"
     "its forward and back before its backward; optimizer,activations\n"
     "both"},
    {"sync-upload", NULL, O_SYNC_UPLOAD, C_TRAIN,
     "with --device: upload each batch when its step starts, instead\n"
     "of into a second device slot while the step before runs"},
    {"eval", NULL, O_EVAL, C_ESTIMATE, "an eval step (forward only, no backward state)"},
    {"json", NULL, O_JSON, C_TRAIN | C_EVAL | C_ESTIMATE | C_PLAN | C_PROFILE,
     "JSON on stdout instead of text"},
    {"no-progress", NULL, O_NOPROG, C_TRAIN | C_EVAL,
     "no progress bar and no per-step log lines (results, notes,\n"
     "the memory summary and warnings still print)"},
    {"quiet", NULL, O_QUIET, C_TRAIN,
     "print nothing but warnings and errors (implies --no-progress;\n"
     "with --json the JSON lines still print)"},
    {"help", NULL, O_HELP, C_ALL, "this text"},

    {"data (see the layout below):", NULL, O_SECTION, 0, NULL},
    {"data", "DIR", O_DATA, C_TRAIN | C_EVAL | C_PLAN,
     "the dataset's directory [" DEFAULT_DATA "];\n"
     "for a language model: text, shards or .npy [" DEFAULT_TEXT "]"},
    {"seq", "T", O_SEQ, C_STEP | C_EVAL,
     "language models: positions a training window has [the context]"},
    {"val-fraction", "X", O_VALFRAC, C_TRAIN | C_EVAL | C_PLAN,
     "language models: the held-out tail of the tokens [0.1]"},
    {"train-images", "FILE", O_TRAIN_IMAGES, C_TRAIN | C_PLAN,
     "the training images, instead of --data's"},
    {"train-labels", "FILE", O_TRAIN_LABELS, C_TRAIN | C_PLAN,
     "the training labels (or float32 .npy targets)"},
    {"test-images", "FILE", O_TEST_IMAGES, C_TRAIN | C_EVAL | C_PLAN,
     "the test images, instead of --data's"},
    {"test-labels", "FILE", O_TEST_LABELS, C_TRAIN | C_EVAL | C_PLAN,
     "the test labels (or float32 .npy targets)"},
    {"limit", "N", O_LIMIT, C_TRAIN | C_PLAN, "use only the first N training samples"},
    {"test-limit", "N", O_TLIMIT, C_TRAIN | C_EVAL | C_PLAN,
     "score only the first N test samples (0: all) [all; language\n"
     "models: the first 128 validation windows, every one of them\n"
     "whatever --batch, the last batch a partial one]"},

    {"training:", NULL, O_SECTION, 0, NULL},
    {"epochs", "N", O_EPOCHS, C_TRAIN, "passes over the training set [3]"},
    {"seed", "N", O_SEED, C_TRAIN | C_PROFILE,
     "seed for initialisation, shuffling and dropout [0]"},
    {"save", "PATH", O_SAVE, C_TRAIN,
     "write weights + optimizer state (safetensors, atomically) after\n"
     "each epoch, and at the next step boundary on SIGINT or SIGTERM\n"
     "(Ctrl-C; a second one stops at once), then exit 128+signal"},
    {"save-every", "N", O_SAVE_EVERY, C_TRAIN,
     "with --save: also every N optimizer steps (the position inside\n"
     "the epoch is saved: --resume continues bit for bit)"},
    {"save-weights-only", NULL, O_SAVE_WEIGHTS, C_TRAIN,
     "with --save: weights and buffers only, a PyTorch state_dict\n"
     "(no optimizer.* entries): a GPT loads into nanoGPT with\n"
     "load_state_dict(strict=True) on PyTorch >= 2.0; not resumable\n"
     "(--init starts from it)"},
    {"nanogpt-masks", NULL, O_NANOGPT_MASKS, C_TRAIN,
     "with --save-weights-only: add nanoGPT's transformer.h.N.attn.bias\n"
     "causal masks, which its GPT registers on PyTorch < 2.0 (Debian 12's\n"
     "1.13): then strict=True loads there, and only there"},
    {"resume", "PATH", O_RESUME, C_TRAIN,
     "continue from a checkpoint; losses equal an uninterrupted run"},
    {"init", "WEIGHTS", O_INIT, C_TRAIN,
     "start from weights-only safetensors (e.g. `eval`'s or PyTorch's)\nwith a fresh optimizer"},
    {"steps", "N", O_STEPS, C_TRAIN | C_PROFILE,
     "optimizer steps to run (train: stop early; profile [3])"},
    {"eval-interval", "N", O_EVALINT, C_TRAIN,
     "language models: evaluate every N steps too [at the end of each epoch]"},
    {"trace", "FILE", O_TRACE, C_PROFILE, "the Chrome Trace Event JSON [memory-trace.json]"},
    {"svg", "FILE", O_SVG, C_PROFILE, "the chart [memory.svg]"},

    {"generation:", NULL, O_SECTION, 0, NULL},
    {"prompt", "TEXT", O_PROMPT, C_GENERATE, "the text to continue [\"\\n\"]"},
    {"tokens", "N", O_TOKENS, C_GENERATE, "new tokens to generate [256]"},
    {"temperature", "X", O_TEMP, C_GENERATE, "0: greedy (argmax); else sample [1.0]"},
    {"seed", "N", O_SEED, C_GENERATE, "seed of the sampling [0]"},
    {"top-k", "K", O_TOPK, C_GENERATE, "sample among the K likeliest (0: all) [0]"},
    {"top-p", "P", O_TOPP, C_GENERATE,
     "nucleus sampling: the likeliest tokens whose mass reaches P\n"
     "(after temperature and top-k, as Hugging Face's) [1: all]"},
    {"stop-at-eos", "on|off", O_STOP_EOS, C_GENERATE,
     "stop after the tokenizer's end-of-sequence token [on when the\n"
     "tokenizer has one]"},
    {"max-context", "N", O_MAXCTX, C_GENERATE,
     "hold at most N positions in the KV cache (a config allowing\n"
     "131072 generates in the memory of N) [the model's context]"},
    {"window", "MODE", O_WINDOW, C_GENERATE,
     "past the context: half (keep the last context/2 tokens, restart\n"
     "positions, go on with the KV cache: cheap) | slide (nanoGPT's\n"
     "crop to the last context tokens at every step: its output, a\n"
     "full forward over the window a token) [half]"},

    {"optimizer:", NULL, O_SECTION, 0, NULL},
    {"optimizer", "NAME", O_OPT, C_STEP, "[adam]"}, /* after the rules' names: print_usage */
    {"lr", "X", O_LR, C_TRAIN | C_PROFILE,
     "learning rate [sgd 0.01, adam/adamw 0.001; adafactor 0.01:\n"
     "the cap of its relative step min(lr, 1/sqrt(t)), which\n"
     "max(eps2, RMS(weights)) scales]"},
    {"momentum", "X", O_MOM, C_STEP, "SGD momentum (one state tensor per weight) [0]"},
    {"nesterov", NULL, O_NESTEROV, C_TRAIN | C_PROFILE, "SGD Nesterov momentum"},
    {"dampening", "X", O_DAMP, C_TRAIN | C_PROFILE, "SGD dampening [0]"},
    {"weight-decay", "X", O_WD, C_TRAIN | C_PROFILE,
     "L2 (sgd, adam) or decoupled (adamw, adafactor) [0; adamw 0.01]"},
    {"eps", "X", O_EPS, C_TRAIN | C_PROFILE,
     "Adam/AdamW epsilon [1e-8]; Adafactor's eps1, the floor of the\n"
     "second moment's row mean and (squared) of its estimate [float32's\n"
     "machine epsilon, 2^-23]"},
    {"beta1", "X", O_BETA1, C_STEP,
     "Adam/AdamW beta1 [0.9]; Adafactor: keep a first moment (exp_avg,\n"
     "Hugging Face's form, one more state tensor per weight) [none]"},
    {"beta2-decay", "X", O_B2DECAY, C_TRAIN | C_PROFILE,
     "Adafactor: the second moment's decay 1 - t^X at step t [-0.8]"},
    {"eps2", "X", O_EPS2, C_TRAIN | C_PROFILE,
     "Adafactor: the floor of the weights' RMS in the relative step [1e-3]"},
    {"clip-threshold", "D", O_CLIPTH, C_TRAIN | C_PROFILE,
     "Adafactor: the update's RMS is clipped to D (PyTorch's d) [1.0]"},
    {"zero-grad", "MODE", O_ZERO, C_TRAIN | C_PROFILE,
     "none (release gradient buffers after each step, PyTorch's\n"
     "set_to_none=True) or zero (keep them) [none]"},
    {"keep-grads", NULL, O_KEEPG, C_STEP,
     "store every gradient; by default, without clipping, a loss\n"
     "scaler or accumulation, each f32 parameter is stepped inside\n"
     "backward as soon as its gradient is made, which then dies\n"
     "(plain SGD in the Linear kernel; momentum SGD, Adam and AdamW\n"
     "by a step node), so gradients are never all stored at once;\n"
     "under mpirun at --zero 2|3, each bucket's owned share is stepped\n"
     "as its sums arrive and no gradient shard is kept"},

    {"memory (the planner; see `frugal plan --help`):", NULL, O_SECTION, 0, NULL},
    {"budget", "SIZE", O_BUDGET, C_STEP,
     "a hard limit on the bytes the engine reserves (48MiB, 1.5GiB);\n"
     "the planner picks the least recompute that fits"},
    {"batch auto", NULL, O_BATCH_AUTO, C_STEP, "the largest batch whose plan fits --budget"},
    {"checkpoint", "MODE", O_CKPT, C_STEP,
     "none | marks (the model file's `checkpoint` marks, default) | all |\n"
     "sqrt | every:N | revolve:SLOTS | auto (least recompute within --budget)"},
    {"segments", "N", O_SEGMENTS, C_STEP,
     "PyTorch's checkpoint_sequential(N): segments of floor(n/N) layers,\n"
     "the last segment not checkpointed"},
    {"accumulate", "K", O_ACCUM, C_STEP,
     "split each batch into K micro-batches; gradients accumulate"},
    {"micro-batch", "M", O_MICRO, C_STEP, "the same, by micro-batch size (must divide --batch)"},
    {"fused-head", "R", O_FUSED_HEAD, C_STEP | C_EVAL,
     "off | auto | ROWS: a language model's head (its last Linear) and the\n"
     "cross-entropy run fused, ROWS rows of logits at a time, turned into\n"
     "the loss and, made again in backward, into the head's gradients at\n"
     "once: the batch's B x T x V logits and their gradient never exist\n"
     "(Liger's FusedLinearCrossEntropy). auto: Liger's chunk, about the\n"
     "head input's size, or the planner's under --budget [off]"},
    {"freeze", "LAYERS", O_FREEZE, C_STEP,
     "no gradients, no optimizer state, nothing saved for these layers:\n"
     "top-level indices or ranges, names, or a range of a repeat's\n"
     "blocks, e.g. 0-3,fc1 or transformer.h.0-3"},
    {"lora", "SPEC", O_LORA, C_STEP,
     "LoRA adapters (PEFT's): r=8,alpha=16,dropout=0.05,target=attn.c_attn,\n"
     "mlp.c_fc (target last: layer names, name suffixes or globs); only\n"
     "the adapters train, every other parameter is frozen [alpha 8, dropout 0]"},
    {"adapter", "PATH", O_ADAPTER, C_TRAIN | C_EVAL | C_GENERATE,
     "LoRA adapters as PEFT saves them: a directory with adapter_config.json\n"
     "and adapter_model.safetensors (or that .safetensors file)"},
    {"save-adapter", "DIR", O_SAVE_ADAPTER, C_TRAIN,
     "after training: the adapters as PEFT's pair, in DIR (made if missing)"},
    {"merge", "FILE", O_MERGE, C_TRAIN | C_EVAL,
     "after training (eval: after loading): the base with the adapters\n"
     "merged in, W + (alpha/r) B A, as one weights-only state_dict"},

    {"precision:", NULL, O_SECTION, 0, NULL},
    {"precision", "P", O_PREC, C_STEP,
     "fp32 | bf16-mixed | fp16-mixed (fp32 master weights and optimizer\n"
     "state, activations saved for backward in 16 bits; with oneDNN on a CPU\n"
     "with AVX512_BF16 the linear layers' GEMMs run in bf16, about twice as\n"
     "fast) | bf16 | fp16 (weights in 16 bits too) | auto (under --budget:\n"
     "bf16-mixed if its step is faster at the host's measured GEMM rates,\n"
     "FRUGAL_GEMM_RATES=F32,BF16 to give them, or a cheaper fit)"},
    {"base-precision", "F", O_BASEPREC, C_STEP,
     "fp32 | bf16 | int8 | nf4 | auto: store the weights of frozen linear layers\n"
     "(--freeze, or the base under adapters) in 16 bits, in int8 with one\n"
     "absmax scale per output row, or in QLoRA's 4-bit NF4 (blocks of 64,\n"
     "double-quantized scales); their GEMMs widen a tile of rows at a time,\n"
     "no f32 copy exists. A tied head stays as it is. auto (under --budget):\n"
     "the most precise of the four whose plan fits [fp32]"},
    {"optimizer-state", "S", O_OSTATE, C_STEP,
     "fp32 | bf16 | int8 (Adam/AdamW moments; int8 is block-wise dynamic\n"
     "quantization, tensors under 2048 values keep fp32) [fp32]"},
    {"loss-scale", "MODE", O_LSCALE, C_STEP,
     "dynamic (PyTorch's GradScaler: 65536, x2 every 2000 clean steps,\n"
     "x0.5 and skip the step on inf/NaN) | none [dynamic for fp16*]"},
    {"clip-grad-norm", "X", O_CLIP, C_STEP,
     "clip the global L2 norm of the gradients (after unscaling)"},

    {"many processes (under mpirun):", NULL, O_SECTION, 0, NULL},
    {"bucket-cap-mb", "X", O_BUCKET_CAP, C_TRAIN,
     "gradient buckets summed over the ranks: close a bucket once it\n"
     "holds X MiB (the first at min(X, 1) MiB; PyTorch DDP's bucket_cap_mb) [25]"},
    {"no-overlap", NULL, O_NO_OVERLAP, C_TRAIN,
     "start the buckets' sums after backward instead of as backward\n"
     "completes each (to measure what the overlap saves)"},
    {"ranks", "N", O_RANKS, C_ESTIMATE | C_PLAN,
     "estimate or plan one rank of N: its slice of --batch, and per-rank\n"
     "bytes by category at each ZeRO stage (no process started); plan:\n"
     "--budget is one rank's"},
    {"zero", "K", O_ZERO_STAGE, C_TRAIN | C_ESTIMATE | C_PLAN,
     "ZeRO stage: under mpirun 0 (everything replicated), 1 (optimizer\n"
     "state sharded), 2 (+ gradients), 3 (+ parameters: each unit's\n"
     "weights gathered just before its forward and its backward, the\n"
     "next one's prefetched) [train and plan: 0; estimate: all]"},
};
#define N_OPTS (sizeof opts / sizeof opts[0])

static void print_usage(const command *cmd) {
    printf("usage: frugal %s\n\n%s", cmd->synopsis, cmd->about);
    const char *heading = "options:";
    for (size_t i = 0; i < N_OPTS; i++) {
        const opt_row *r = &opts[i];
        if (r->id == O_SECTION) {
            heading = r->name;
            continue;
        }
        if (!(r->cmds & cmd->bit)) continue;
        if (heading) printf("\n%s\n", heading);
        heading = NULL;
        char left[40];
        snprintf(left, sizeof left, "--%s%s%s", r->name, r->arg ? " " : "", r->arg ? r->arg : "");
        printf("  %-20s ", left);
        if (strlen(left) > 20) printf("\n  %-20s ", "");
        char names[128], list[160];
        const char *help = r->help;
        if (r->id == O_OPT) { /* the update rules' names, from their table (optim/rules.c) */
            snprintf(list, sizeof list, "%s %s", fr_optim_names(names, sizeof names, " | ", " | "),
                     r->help);
            help = list;
        }
        for (const char *h = help; *h; h++) {
            putchar(*h);
            if (*h == '\n') printf("  %-20s ", "");
        }
        putchar('\n');
    }
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].id == O_DATA && (opts[i].cmds & cmd->bit)) fputs(data_layout, stdout);
}

typedef struct cli {
    fr_train_cfg t;
    int data_set;
    const char *prompt;
    int tokens, top_k, stop_eos, max_context;
    double temperature, top_p;
    const char *trace, *svg;
    int steps, accumulate;
    const char *weights;
    int threads, eval_only, lr_set, wd_set;
    int device; /* -1: the CPU; N: OpenCL device N */
    double lr, wd, momentum, dampening, eps;
    int eps_set;
    double beta1, beta2_decay, eps2, clip_threshold; /* set when *_set */
    int beta1_set, b2decay_set, eps2_set, clipth_set;
    int nesterov, zero_keep;
    int ranks, zero; /* estimate --ranks N; --zero K (-1: not given) */
    int batch_set, model_set, help, window_slide;
    char batch_from[96]; /* where the batch came from, when not the command line */
} cli;

static int bad(const char *cmd, const char *fmt, const char *arg) {
    fprintf(stderr, "frugal %s: ", cmd);
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(see `frugal %s --help`)\n", cmd);
    return 2;
}

/* A whole number in [lo, hi]: decimal digits only (no sign, no fraction, no
 * exponent, no hex, no spaces), so "1.5", "0x20", "1e3" and "-1" are refused
 * instead of being truncated or read in another base. */
static int parse_int(const char *cmd, const char *name, const char *s, uint64_t lo, uint64_t hi,
                     uint64_t *out) {
    uint64_t v = 0;
    int ok = *s != 0;
    for (const char *p = s; ok && *p; p++) {
        unsigned d = (unsigned)(*p - '0');
        if (d > 9 || v > (UINT64_MAX - d) / 10) ok = 0;
        else v = 10 * v + d;
    }
    if (!ok || v < lo || v > hi) {
        fprintf(stderr, "frugal %s: --%s '%s': expected a whole number from %llu to %llu\n", cmd,
                name, s, (unsigned long long)lo, (unsigned long long)hi);
        return 2;
    }
    *out = v;
    return 0;
}

/* A finite decimal number in [lo, hi], the whole string (1e-3 and .5 are
 * numbers; "0.1x", "nan", "inf", hex floats and spaces are not). */
static int parse_real(const char *cmd, const char *name, const char *s, double lo, double hi,
                      double *out) {
    char *end;
    double v = 0;
    int ok = strspn(s, "0123456789.eE+-") == strlen(s) && *s;
    if (ok) {
        errno = 0;
        v = strtod(s, &end);
        ok = !errno && end != s && !*end && isfinite(v) && v >= lo && v <= hi;
    }
    if (!ok) {
        fprintf(stderr, "frugal %s: --%s '%s': expected a number from %g to %g\n", cmd, name, s, lo,
                hi);
        return 2;
    }
    *out = v;
    return 0;
}

#define INT_OPT(lo, hi, dst)                                               \
    do {                                                                   \
        uint64_t v_;                                                       \
        if (parse_int(cmd->name, r->name, val, (lo), (hi), &v_)) return 2; \
        dst = v_;                                                          \
    } while (0)
/* A number kept as the user's double, as Python keeps it (--lr 5e-4 is
 * 0.0005 in the update rule's arithmetic and in the checkpoint). */
#define REAL_OPT(lo, hi, dst)                                                \
    do {                                                                     \
        if (parse_real(cmd->name, r->name, val, (lo), (hi), &dst)) return 2; \
    } while (0)

/* The row of --name for the command `bit` (an option may have a row of
 * its own for some commands, with their own help), else its first row. */
static const opt_row *find_opt(const char *name, size_t len, unsigned bit) {
    const opt_row *first = NULL;
    for (size_t i = 0; i < N_OPTS; i++)
        if (opts[i].id > O_BATCH_AUTO && strlen(opts[i].name) == len &&
            !strncmp(opts[i].name, name, len)) {
            if (opts[i].cmds & bit) return &opts[i];
            if (!first) first = &opts[i];
        }
    return first;
}

/* What the model decides when the command line does not: its file's
 * `default batch N` (a language model's windows cost far more than an
 * image), and a language model's text (Debian's fortunes). A model that
 * does not load changes nothing: the command says why when it loads it. */
static void model_defaults(cli *c, unsigned bit) {
    int batch = !c->batch_set && bit != C_GENERATE;
    if (!batch && c->data_set) return;
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = ctx ? fr_model_load(ctx, c->t.model) : NULL;
    if (m && batch && m->default_batch > 0) {
        c->t.step.batch = m->default_batch;
        snprintf(c->batch_from, sizeof c->batch_from, "%s's model file: default batch %d",
                 c->t.model, m->default_batch);
    }
    if (m && !c->data_set && fr_model_context(m)) c->t.data = DEFAULT_TEXT;
    fr_model_free(m);
    fr_ctx_free(ctx);
}

/* Reads argv (argv[0] is the command) into c. Options are spelled in full,
 * "--name value" or "--name=value"; a value is never empty. Returns 0, 2 on
 * a usage error (with its message printed) or -1 after printing --help. */
static const char *hf_tok_files[] = {"tokenizer.model", "tokenizer.json", "vocab.json", NULL};
static const char *hf_weight_files[] = {"model.safetensors", "model.safetensors.index.json", NULL};

/* Whether dir is a directory holding one of names. */
static int hf_dir_has(const char *dir, const char **names) {
    struct stat sb;
    char f[4096];
    if (!dir || stat(dir, &sb) || !S_ISDIR(sb.st_mode)) return 0;
    for (; *names; names++) {
        snprintf(f, sizeof f, "%s/%s", dir, *names);
        if (access(f, F_OK) == 0) return 1;
    }
    return 0;
}

static int parse(int argc, char **argv, const command *cmd, cli *c) {
    memset(c, 0, sizeof *c);
    c->t.model = cmd->bit == C_GENERATE ? "gpt-tiny" : "cnn";
    c->t.data = DEFAULT_DATA;
    c->t.epochs = 3;
    c->t.step.batch = 128;
    c->t.step.optim = fr_optim_defaults(FR_OPTIM_ADAM);
    c->t.progress = isatty(STDERR_FILENO) ? 1 : 0;
    c->t.queue = 2;
    c->device = -1;
    c->t.eval_batch = 0; /* the training micro-batch */
    c->t.val_fraction = 0.1;
    c->tokens = 256;
    c->temperature = 1.0;
    c->stop_eos = -1; /* on when the tokenizer has an EOS */
    c->prompt = "\n";
    c->zero = -1;
    const char *opt_name = "adam", *cn = cmd->name;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h")) a = "--help";
        if (strncmp(a, "--", 2) || !a[2]) return bad(cn, "unexpected argument '%s'", a);
        const char *eq = strchr(a + 2, '=');
        size_t len = eq ? (size_t)(eq - (a + 2)) : strlen(a + 2);
        const opt_row *r = find_opt(a + 2, len, cmd->bit);
        if (!r) {
            const opt_row *like = NULL; /* the one option this is the start of, if any */
            int n_like = 0;
            for (size_t k = 0; k < N_OPTS; k++)
                if (opts[k].id > O_BATCH_AUTO && !strncmp(opts[k].name, a + 2, len) &&
                    n_like++ == 0)
                    like = &opts[k];
            fprintf(stderr, "frugal %s: unknown option '%.*s'", cn, (int)len + 2, a);
            if (n_like == 1 && len)
                fprintf(stderr, " (options are spelled in full: --%s?)", like->name);
            fprintf(stderr, "\n(see `frugal %s --help`)\n", cn);
            return 2;
        }
        unsigned takers = 0; /* the commands any row of this option serves */
        for (size_t k = 0; k < N_OPTS; k++)
            if (opts[k].id == r->id) takers |= opts[k].cmds;
        if (!(r->cmds & cmd->bit)) {
            fprintf(
                stderr,
                "frugal %s: --%s is not an option of %s (see `frugal %s --help`); it belongs to ",
                cn, r->name, cn, cn);
            int left = 0, k;
            for (k = 0; k < (int)N_COMMANDS; k++) left += !!(takers & commands[k].bit);
            for (k = 0; k < (int)N_COMMANDS; k++)
                if (takers & commands[k].bit)
                    fprintf(stderr, "%s%s", commands[k].name,
                            --left > 1  ? ", "
                            : left == 1 ? " and "
                                        : "\n");
            return 2;
        }
        const char *val = NULL;
        if (r->arg) {
            if (eq) val = eq + 1;
            else if (i + 1 < argc && !(strncmp(argv[i + 1], "--", 2) == 0 &&
                                       find_opt(argv[i + 1] + 2, strcspn(argv[i + 1] + 2, "="), 0)))
                val = argv[++i];
            else {
                fprintf(stderr, "frugal %s: --%s needs a value (%s)\n(see `frugal %s --help`)\n",
                        cn, r->name, r->arg, cn);
                return 2;
            }
            if (!*val) {
                fprintf(stderr,
                        "frugal %s: --%s '': the value is empty (expected %s)\n(see `frugal %s "
                        "--help`)\n",
                        cn, r->name, r->arg, cn);
                return 2;
            }
        } else if (eq) {
            fprintf(stderr, "frugal %s: --%s takes no value ('%s')\n", cn, r->name, a);
            return 2;
        }
        switch (r->id) {
        case O_MODEL:
            c->t.model = val;
            c->model_set = 1;
            break;
        case O_DATA:
            c->t.data = val;
            c->data_set = 1;
            break;
        case O_SEQ: INT_OPT(1, 1 << 20, c->t.seq); break;
        case O_VALFRAC: REAL_OPT(0, 0.9, c->t.val_fraction); break;
        case O_EVALINT: INT_OPT(1, 1000000000, c->t.eval_interval); break;
        case O_PROMPT: c->prompt = val; break;
        case O_TOKENS: INT_OPT(0, 1 << 24, c->tokens); break;
        case O_TEMP: REAL_OPT(0, 100, c->temperature); break;
        case O_TOPK: INT_OPT(0, 1 << 24, c->top_k); break;
        case O_TOPP: REAL_OPT(0, 1, c->top_p); break;
        case O_MAXCTX: INT_OPT(1, 1 << 24, c->max_context); break;
        case O_TOKENIZER: c->t.tokenizer = val; break;
        case O_STOP_EOS:
            if (!strcmp(val, "on")) c->stop_eos = 1;
            else if (!strcmp(val, "off")) c->stop_eos = 0;
            else return bad(cn, "--stop-at-eos '%s': choose on or off", val);
            break;
        case O_TRAIN_IMAGES: c->t.train_images = val; break;
        case O_TRAIN_LABELS: c->t.train_labels = val; break;
        case O_TEST_IMAGES: c->t.test_images = val; break;
        case O_TEST_LABELS: c->t.test_labels = val; break;
        case O_EPOCHS: INT_OPT(1, 1000000, c->t.epochs); break;
        case O_BATCH:
            if (!strcmp(val, "auto") && (cmd->bit & C_STEP)) c->t.batch_auto = 1;
            else INT_OPT(1, 1 << 20, c->t.step.batch);
            c->batch_set = 1;
            break;
        case O_OPT: opt_name = val; break;
        case O_LR:
            REAL_OPT(0, 1e6, c->lr);
            c->lr_set = 1;
            break;
        case O_MOM: REAL_OPT(0, 1, c->momentum); break;
        case O_NESTEROV: c->nesterov = 1; break;
        case O_DAMP: REAL_OPT(0, 1, c->dampening); break;
        case O_WD:
            REAL_OPT(0, 1e6, c->wd);
            c->wd_set = 1;
            break;
        case O_SEED: INT_OPT(0, UINT64_MAX, c->t.step.seed); break;
        case O_THREADS: INT_OPT(0, 1024, c->threads); break;
        case O_SYNC_UPLOAD: c->t.step.sync_upload = 1; break;
        case O_OFFLOAD:
            if (!strcmp(val, "optimizer")) c->t.step.offload = FR_OFFLOAD_OPTIMIZER;
            else if (!strcmp(val, "activations")) c->t.step.offload = FR_OFFLOAD_ACTIVATIONS;
            else if (!strcmp(val, "optimizer,activations") || !strcmp(val, "activations,optimizer"))
                c->t.step.offload = FR_OFFLOAD_OPTIMIZER | FR_OFFLOAD_ACTIVATIONS;
            else return bad(cmd->name, "--offload '%s': expected optimizer or activations", val);
            break;
        case O_DEVICE: {
            char *end = NULL;
            if (!strcmp(val, "cpu")) c->device = -1;
            else if (!strcmp(val, "opencl")) c->device = 0;
            else if (!strncmp(val, "opencl:", 7) && val[7] &&
                     (c->device = (int)strtol(val + 7, &end, 10)) >= 0 && !*end)
                ;
            else return bad(cmd->name, "--device '%s': expected cpu, opencl or opencl:N", val);
            break;
        }
        case O_SAVE: c->t.save = val; break;
        case O_RESUME: c->t.resume = val; break;
        case O_INIT: c->t.init = val; break;
        case O_LIMIT: INT_OPT(1, 1000000000000, c->t.limit_train); break;
        case O_TLIMIT:
            INT_OPT(0, 1000000000000, c->t.limit_test);
            if (!c->t.limit_test) c->t.limit_test = -1; /* 0: all */
            break;
        case O_JSON: c->t.json = 1; break;
        case O_NOPROG: c->t.progress = -1; break;
        case O_QUIET:
            c->t.progress = -1;
            c->t.quiet = 1;
            break;
        case O_SAVE_EVERY: INT_OPT(1, 1000000000, c->t.save_every); break;
        case O_SAVE_WEIGHTS: c->t.save_weights_only = 1; break;
        case O_NANOGPT_MASKS: c->t.nanogpt_masks = 1; break;
        case O_WINDOW:
            if (!strcmp(val, "slide")) c->window_slide = 1;
            else if (!strcmp(val, "half")) c->window_slide = 0;
            else return bad(cn, "--window '%s': choose half or slide", val);
            break;
        case O_WEIGHTS: c->weights = val; break;
        case O_EVAL: c->eval_only = 1; break;
        case O_EPS:
            REAL_OPT(0, 1, c->eps);
            c->eps_set = 1;
            break;
        case O_BETA1:
            REAL_OPT(0, 0.999999, c->beta1);
            c->beta1_set = 1;
            break;
        case O_B2DECAY:
            REAL_OPT(-1e3, 0, c->beta2_decay);
            c->b2decay_set = 1;
            break;
        case O_EPS2:
            REAL_OPT(0, 1, c->eps2);
            c->eps2_set = 1;
            break;
        case O_CLIPTH:
            REAL_OPT(1e-30, 1e30, c->clip_threshold);
            c->clipth_set = 1;
            break;
        case O_PREC:
            if (fr_precision_parse(NULL, val, &c->t.step.precision))
                return bad(
                    cn, "--precision '%s': choose fp32, bf16, fp16, bf16-mixed, fp16-mixed or auto",
                    val);
            break;
        case O_BASEPREC:
            if (fr_base_precision_parse(NULL, val, &c->t.step.base_precision))
                return bad(cn, "--base-precision '%s': choose fp32, bf16, int8, nf4 or auto", val);
            break;
        case O_OSTATE:
            if (!strcmp(val, "fp32")) c->t.step.optim_state = FR_OPTIM_STATE_FP32;
            else if (!strcmp(val, "bf16")) c->t.step.optim_state = FR_OPTIM_STATE_BF16;
            else if (!strcmp(val, "int8")) c->t.step.optim_state = FR_OPTIM_STATE_INT8;
            else return bad(cn, "--optimizer-state '%s': choose fp32, bf16 or int8", val);
            break;
        case O_KEEPG: c->t.step.keep_grads = 1; break;
        case O_CLIP: {
            double v;
            REAL_OPT(0, 1e30, v);
            c->t.step.clip_grad_norm = (float)v; /* fr_step_opts' is a float */
            break;
        }
        case O_LSCALE:
            if (!strcmp(val, "dynamic")) c->t.step.loss_scaling = FR_LOSS_SCALE_DYNAMIC;
            else if (!strcmp(val, "none")) c->t.step.loss_scaling = FR_LOSS_SCALE_NONE;
            else return bad(cn, "--loss-scale '%s': choose dynamic or none", val);
            break;
        case O_BUDGET: {
            char err[160];
            if (fr_parse_bytes(val, &c->t.step.budget, err, sizeof err))
                return bad(cn, "--budget %s", err);
            if (!c->t.step.budget)
                return bad(cn, "--budget '%s': a budget must be at least one byte", val);
            break;
        }
        case O_CKPT: {
            char err[160];
            if (fr_parse_checkpoint(val, &c->t.step.checkpoint, &c->t.step.ckpt_arg, err,
                                    sizeof err))
                return bad(cn, "--checkpoint %s", err);
            break;
        }
        case O_SEGMENTS:
            INT_OPT(1, 1000000, c->t.step.ckpt_arg);
            c->t.step.checkpoint = FR_CKPT_SEGMENTS;
            break;
        case O_ACCUM: INT_OPT(1, 1 << 20, c->accumulate); break;
        case O_MICRO: INT_OPT(1, 1 << 20, c->t.step.micro_batch); break;
        case O_FUSED_HEAD:
            if (!strcmp(val, "off")) c->t.step.head_rows = 0;
            else if (!strcmp(val, "auto")) c->t.step.head_rows = -1;
            else if (strspn(val, "0123456789") != strlen(val) || !*val)
                return bad(cmd->name, "--fused-head '%s': expected off, auto or a number of rows",
                           val);
            else INT_OPT(1, 1 << 24, c->t.step.head_rows);
            break;
        case O_FREEZE: c->t.freeze = val; break;
        case O_LORA: c->t.lora = val; break;
        case O_ADAPTER: c->t.adapter = val; break;
        case O_SAVE_ADAPTER: c->t.save_adapter = val; break;
        case O_MERGE: c->t.merge = val; break;
        case O_TRACE: c->trace = val; break;
        case O_SVG: c->svg = val; break;
        case O_STEPS:
            INT_OPT(1, 1000000000, c->steps);
            c->t.steps = c->steps;
            break;
        case O_ZERO:
            if (strcmp(val, "none") && strcmp(val, "zero"))
                return bad(cn, "--zero-grad '%s': expected none or zero", val);
            c->zero_keep = !strcmp(val, "zero");
            break;
        case O_BUCKET_CAP: {
            double mb;
            REAL_OPT(1e-3, 1024, mb);
            c->t.step.bucket_cap = (size_t)(mb * 1048576.0);
            c->t.step.bucket_first_cap =
                c->t.step.bucket_cap < ((size_t)1 << 20) ? c->t.step.bucket_cap : (size_t)1 << 20;
            break;
        }
        case O_NO_OVERLAP: c->t.step.no_overlap = 1; break;
        case O_RANKS: INT_OPT(1, 1 << 20, c->ranks); break;
        case O_ZERO_STAGE: INT_OPT(0, 3, c->zero); break;
        case O_HELP: c->help = 1; break;
        }
    }
    c->t.data_default = !c->data_set; /* no test split from a directory nobody named */
    model_defaults(c, cmd->bit);
    if (c->help) {
        print_usage(cmd);
        if (c->model_set && c->batch_from[0])
            printf("\nwith --model %s: --batch defaults to %d (%s)\n", c->t.model, c->t.step.batch,
                   c->batch_from);
        return -1;
    }
    if (!c->t.train_images != !c->t.train_labels)
        return bad(cn, "%s", "give --train-images and --train-labels together (or neither)");
    if (!c->t.test_images != !c->t.test_labels)
        return bad(cn, "%s", "give --test-images and --test-labels together (or neither)");
    if (c->t.init && c->t.resume)
        return bad(
            cn, "%s",
            "give --init or --resume, not both (--resume restores the weights and the optimizer)");
    /* a Hugging Face model directory brings its tokenizer (for text data) and,
     * to train from, its weights */
    if (hf_dir_has(c->t.model, hf_tok_files) && !c->t.tokenizer) {
        c->t.tokenizer = c->t.model;
        c->t.tokenizer_default = 1;
    }
    if (cmd->bit == C_TRAIN && !c->t.init && !c->t.resume &&
        hf_dir_has(c->t.model, hf_weight_files)) {
        c->t.init = c->t.model;
        if (!c->t.quiet)
            fprintf(stderr, "weights: %s's own (give --init to start elsewhere)\n", c->t.model);
    }
    if (c->accumulate) {
        char msg[96];
        if (c->t.step.micro_batch)
            return bad(cn, "%s", "give --accumulate or --micro-batch, not both");
        if (c->t.batch_auto)
            return bad(cn, "%s",
                       "--accumulate needs a fixed --batch; with --batch auto give --micro-batch");
        snprintf(msg, sizeof msg, "--accumulate %d does not divide the batch %d", c->accumulate,
                 c->t.step.batch);
        if (c->t.step.batch % c->accumulate) return bad(cn, "%s", msg);
        c->t.step.micro_batch = c->t.step.batch / c->accumulate;
    }
    if ((c->t.save_weights_only || c->t.nanogpt_masks) && !c->t.save)
        return bad(cn, "%s", "--save-weights-only and --nanogpt-masks need --save PATH");
    if (c->t.nanogpt_masks && !c->t.save_weights_only)
        return bad(cn, "%s", "--nanogpt-masks goes with --save-weights-only");
    if (c->t.batch_auto && !c->t.step.budget)
        return bad(cn, "%s", "--batch auto needs --budget (the largest batch that fits it)");
    fr_optim_kind kind;
    char names[128], unknown[160]; /* the rules' names, from their table (optim/rules.c) */
    snprintf(unknown, sizeof unknown, "unknown optimizer '%%s' (choose %s)",
             fr_optim_names(names, sizeof names, ", ", " or "));
    if (fr_optim_parse(NULL, opt_name, &kind)) return bad(cn, unknown, opt_name);
    c->t.step.optim = fr_optim_defaults(kind);
    if (c->lr_set) c->t.step.optim.lr = c->lr;
    if (c->wd_set) c->t.step.optim.weight_decay = c->wd;
    if (c->eps_set) c->t.step.optim.eps = c->eps;
    if (c->beta1_set) c->t.step.optim.beta1 = c->beta1;
    if (c->b2decay_set) c->t.step.optim.beta2_decay = c->beta2_decay;
    if (c->eps2_set) c->t.step.optim.eps2 = c->eps2;
    if (c->clipth_set) c->t.step.optim.clip_threshold = c->clip_threshold;
    if (kind != FR_OPTIM_ADAFACTOR && (c->b2decay_set || c->eps2_set || c->clipth_set))
        return bad(cn, "--beta2-decay, --eps2 and --clip-threshold are Adafactor options, not %s",
                   opt_name);
    if (fr_optim_whole_tensor(&c->t.step.optim) && c->zero >= 1) {
        char why[160];
        snprintf(why, sizeof why,
                 "--zero %d: %s's factored state belongs to whole matrices, which ZeRO shards at "
                 "any element; use --zero 0",
                 c->zero, fr_optim_name(kind));
        return bad(cn, "%s", why);
    }
    if (kind == FR_OPTIM_SGD && c->beta1_set)
        return bad(cn, "--beta1 is an Adam, AdamW and Adafactor option, not %s", opt_name);
    c->t.step.optim.momentum = c->momentum;
    c->t.step.optim.dampening = c->dampening;
    c->t.step.optim.nesterov = c->nesterov;
    c->t.step.optim.zero_grad_to_none = !c->zero_keep;
    if (!fr_optim_takes_momentum(kind) && (c->momentum || c->nesterov || c->dampening))
        return bad(cn, "--momentum, --nesterov and --dampening are SGD options, not %s", opt_name);
    if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
        return bad(cn, "%s",
                   "Nesterov momentum requires a momentum and zero dampening (as in PyTorch)");
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

/* An accuracy for JSON: null where there is none (an MSE model's is NaN). */
static const char *json_acc(double acc, char *buf, size_t len) {
    if (isnan(acc)) return "null";
    snprintf(buf, len, "%.6f", acc);
    return buf;
}

/* A number for JSON: null where there is none (no test split). */
static const char *json_real(double v, char *buf, size_t len) {
    if (isnan(v)) return "null";
    snprintf(buf, len, "%.17g", v);
    return buf;
}

static fr_model *load_for(const char *cmd, fr_ctx *ctx, const cli *c);

/* --device: run ctx on the OpenCL device the command line names (0: done,
 * 1: the error printed). */
static int use_device(fr_ctx *ctx, const cli *c, const char *cmd) {
    (void)ctx; /* used only by the OpenCL build */
    if (c->device < 0) return 0;
#ifdef FR_HAVE_OPENCL
    ctx->notices = !c->t.json && c->t.progress >= 0; /* "compiling OpenCL kernels" */
    if (fr_cl_use(ctx, c->device) == FR_OK) return 0;
    fprintf(stderr, "frugal %s: --device opencl:%d: %s\n", cmd, c->device, fr_last_error(ctx));
#else
    fprintf(stderr,
            "frugal %s: --device opencl: this frugal was built without OpenCL (install "
            "ocl-icd-opencl-dev, opencl-headers and libclblast-dev, then rebuild)\n",
            cmd);
#endif
    return 1;
}

/* Close the context's device and free the context. */
static void ctx_done(fr_ctx *ctx) {
#ifdef FR_HAVE_OPENCL
    fr_cl_unuse(ctx);
#endif
    fr_ctx_free(ctx);
}

/* Under mpirun, a rank that dies (kill -9) makes mpirun stop the others
 * with SIGTERM: each says so in one line (write(2): nothing else is safe in
 * a handler) and exits non-zero. */
static char stop_line[160];
static size_t stop_len;

static void on_stop(int sig) {
    if (stop_len && write(STDERR_FILENO, stop_line, stop_len) < 0) stop_len = 0;
    _exit(128 + sig);
}

static void stop_handlers(int rank, int ranks) {
    int n = snprintf(stop_line, sizeof stop_line,
                     "frugal train: rank %d of %d: stopped by a signal: another rank failed or "
                     "the job was stopped (see mpirun's message); the last checkpoint is intact\n",
                     rank, ranks);
    stop_len = n > 0 && (size_t)n < sizeof stop_line ? (size_t)n : 0;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* One process: SIGINT or SIGTERM asks the trainer to save at the next
 * step boundary and stop (cfg.stop); the handler then steps aside, so a
 * second one stops at once. */
static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) { stop_signal = sig; }

static void save_on_signal(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sa.sa_flags = SA_RESETHAND;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

static int cmd_train(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, &commands[0], &c);
    if (r) return r < 0 ? 0 : r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_comm *comm = NULL;
    if (fr_comm_init(ctx, &comm)) {
        fprintf(stderr, "frugal train: %s\n", fr_last_error(ctx));
        return ctx_done(ctx), 1;
    }
    int rank = fr_comm_rank(comm), ranks = fr_comm_size(comm);
    if (ranks > 1) stop_handlers(rank, ranks);
    else {
        save_on_signal();
        c.t.stop = &stop_signal;
    }
    c.t.comm = comm;
    fr_set_threads(ctx, c.threads);
    if (use_device(ctx, &c, "train")) return fr_comm_finalize(comm), ctx_done(ctx), 1;
    if (c.t.step.offload && c.device < 0)
        return fr_comm_finalize(comm), ctx_done(ctx),
               bad("train", "%s", "--offload needs --device opencl[:N]");
    c.t.step.zero = c.zero > 0 ? c.zero : 0;
    if (rank > 0) c.t.json = 0, c.t.progress = -1, c.t.quiet = 2; /* rank 0 speaks for the run */
    ctx->notices = !c.t.json && c.t.progress >= 0;
    char from[128] = "";
    if (c.batch_from[0]) snprintf(from, sizeof from, " (%s)", c.batch_from);
    if (!c.t.json && !c.t.quiet)
        fprintf(stderr, "training %s on %s: %d epochs, batch %d%s, %s lr %g, %d threads%s\n",
                c.t.model, c.t.train_images ? c.t.train_images : c.t.data, c.t.epochs,
                c.t.step.batch, from, fr_optim_name(c.t.step.optim.kind), (double)c.t.step.optim.lr,
                fr_get_threads(ctx), ranks > 1 ? " a rank" : "");
    fr_train_result res;
    fr_status st = fr_train(ctx, &c.t, &res);
    if (st) {
        if (ranks > 1) {
            /* the others may wait in a collective for this rank: end the job */
            fprintf(stderr, "frugal train: rank %d of %d: %s\n", rank, ranks, fr_last_error(ctx));
            fflush(stderr);
            fr_comm_abort(comm, 1);
        }
        fprintf(stderr, "frugal train: %s\n", fr_last_error(ctx));
        fr_comm_finalize(comm);
        ctx_done(ctx);
        return 1;
    }
    if (c.t.json) {
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        char ab[32], lb[32];
        printf("{\"event\": \"summary\", \"epochs\": %d, \"steps\": %lld, \"batch\": %d, "
               "\"test_acc\": %s, "
               "\"test_loss\": %s, \"seconds\": %.3f, \"peak_rss_bytes\": %zu, \"budget\": %zu, "
               "\"predicted_step_reserved\": %zu, \"measured_reserved_peak\": %zu, \"precision\": "
               "\"%s\", "
               "\"loss_scale\": %g, \"skipped_steps\": %llu, \"stopped_by_signal\": %d, \"cpu\": ",
               res.epochs_done, (long long)res.steps_done, res.batch,
               json_acc(res.test_acc, ab, sizeof ab), json_real(res.test_loss, lb, sizeof lb),
               res.seconds, res.peak_rss_kib * 1024, c.t.step.budget, res.predicted_reserved,
               res.measured_reserved_peak, fr_precision_name(c.t.step.precision),
               (double)res.loss_scale, (unsigned long long)res.skipped_steps, res.stopped_by);
        fr_cpu_json(stdout, NULL); /* features, BLAS core, GEMM providers: no probe */
        printf(", \"memory\": ");
        mem_json_inline(ctx);
        if (ranks > 1) {
            printf(", ");
            fr_mem_ranks_summary(ranks, res.rank_peak_min, res.rank_peak_max, stdout, 1);
            printf(", \"buckets\": %d, \"comm_wait_seconds\": %.6f", res.buckets, res.comm_wait_s);
        }
        printf("}\n");
    } else if (!c.t.quiet && !res.stopped_by) {
        if (!res.tokens && isnan(res.test_loss))
            printf("done in %.1f s: train loss %.4f (no test split)\n", res.seconds,
                   res.final_loss);
        else if (res.tokens)
            printf("done in %.1f s, %lld steps: validation loss %.4f nats\n", res.seconds,
                   (long long)res.steps_done, res.test_loss);
        else if (isnan(res.test_acc))
            printf("done in %.1f s: test loss %.6g\n", res.seconds, res.test_loss);
        else printf("done in %.1f s: test accuracy %.2f%%\n", res.seconds, 100 * res.test_acc);
    }
    fflush(stdout);
    fr_comm_finalize(comm);
    ctx_done(ctx);
    return res.stopped_by ? 128 + res.stopped_by : 0;
}

static int cmd_eval(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, &commands[1], &c);
    if (r) return r < 0 ? 0 : r;
    if (!c.weights && hf_dir_has(c.t.model, hf_weight_files)) c.weights = c.t.model;
    if (!c.weights)
        return bad("eval", "%s",
                   "--weights CKPT is required (a Hugging Face --model directory brings its own)");
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads);
    if (use_device(ctx, &c, "eval")) return ctx_done(ctx), 1;
    fr_model *m = load_for("eval", ctx, &c);
    fr_source src = {0};
    fr_eval_sums t = {0};
    double acc = 0, loss = 0;
    fr_status st = m ? fr_model_load_weights(m, c.weights) : FR_ERR_ARG;
    if (!st && c.t.adapter) st = fr_adapter_apply(m, c.t.adapter, c.t.step.seed);
    if (!st && c.t.merge) st = fr_adapter_merge_save(m, c.t.merge);
    if (!st) st = fr_source_open(ctx, &c.t, m, 0, &src);
    src.eval_progress = c.t.progress > 0 && !c.t.json;
    src.head_rows = c.t.step.head_rows;
    /* train's rule: every test sample of an image set, the first 128
     * windows of a token stream, unless --test-limit says (0: all) */
    if (!st)
        st = fr_source_evaluate_sums(&src, m, c.t.step.batch,
                                     fr_eval_limit(&c.t, src.tokens != NULL), &t);
    if (!st) {
        fr_eval_sums_result(m, &t, &acc, &loss);
        fr_mem_stats ms;
        fr_mem_get_stats(ctx, &ms);
        long long n = (long long)t.seen, toks = (long long)(t.seen * t.rows);
        if (c.t.json) {
            char ab[32];
            printf("{\"accuracy\": %s, \"loss\": %.9g, \"samples\": %lld, \"tokens\": %lld, "
                   "\"precision\": \"fp32\", \"gradients_bytes_peak\": %zu, "
                   "\"optimizer_bytes_peak\": %zu, \"memory\": ",
                   json_acc(acc, ab, sizeof ab), loss, n, src.tokens ? toks : 0,
                   ms.allocated_peak[FR_MEM_GRADS], ms.allocated_peak[FR_MEM_OPTIM]);
            mem_json_inline(ctx);
            printf("}\n");
        } else if (src.tokens) {
            const char *unit = fr_tokens_get_kind(src.tokens) == FR_TOKENS_TEXT ? "byte" : "token";
            long long held = (long long)((src.split.n_val - 1) / src.seq);
            printf("validation loss %.4f nats, %.4f bits per %s, token accuracy %.2f%%: %lld "
                   "windows of %d (%lld tokens) scored of the %lld held out%s\n",
                   loss, loss / log(2.0), unit, 100 * acc, n, src.seq, toks, held,
                   n < held ? " (--test-limit 0 scores all)" : "");
            fr_mem_summary(ctx, stdout);
        } else {
            if (isnan(acc)) printf("test loss %.6g (%lld samples)\n", loss, n);
            else printf("test accuracy %.2f%%, loss %.4f (%lld samples)\n", 100 * acc, loss, n);
            fr_mem_summary(ctx, stdout);
        }
    } else if (m) {
        fprintf(stderr, "frugal eval: %s\n", fr_last_error(ctx));
    }
    fr_source_close(&src);
    fr_model_free(m);
    ctx_done(ctx);
    return st ? 1 : 0;
}

static fr_model *load_for(const char *cmd, fr_ctx *ctx, const cli *c) {
    fr_model *m = fr_model_load(ctx, c->t.model);
    if (m && ((c->t.freeze && fr_model_freeze(m, c->t.freeze)) ||
              (c->t.lora && fr_model_lora_spec(m, c->t.lora, c->t.step.seed)) ||
              (c->t.seq && fr_model_set_seq(m, c->t.seq)))) {
        fr_model_free(m);
        m = NULL;
    }
    if (!m) fprintf(stderr, "frugal %s: %s\n", cmd, fr_last_error(ctx));
    return m;
}

static fr_step_opts step_opts(const cli *c, fr_model *m) {
    fr_step_opts so = c->t.step;
    so.training = 1;
    if (c->t.batch_auto && m) {
        if (fr_batch_auto(m, &so, 1 << 16, &so.batch)) so.batch = 0;
        else fprintf(stderr, "--batch auto: %d is the largest batch that fits\n", so.batch);
    }
    return so;
}

/* The datasets `train` would open, counted for the budget as train counts
 * them (open, measured, kept open while planning). If they cannot be
 * opened, Fashion-MNIST's sizes with the model's input are assumed, and
 * said. */
static void plan_data(fr_ctx *ctx, const cli *c, const fr_model *m, fr_budget_data *bd,
                      fr_dataset **train, fr_dataset **test, fr_source *src) {
    if (fr_model_context(m)) { /* a language model: its token stream and split */
        if (!fr_source_open(ctx, &c->t, m, 1, src)) {
            fr_source_budget(src, &c->t, bd);
            return;
        }
        fr_source_close(src);
        *bd = (fr_budget_data){0,
                               100000,
                               10000,
                               c->t.limit_train,
                               fr_eval_limit(&c->t, 1),
                               c->t.queue,
                               c->t.eval_batch,
                               FR_PLAN_ASSUMED_HANDLES,
                               1,
                               fr_model_seq(m),
                               0,
                               0};
        fprintf(stderr,
                "frugal plan: %s\nfrugal plan: counting the data as 100000 training and 10000 "
                "validation windows of %d tokens would take\n",
                fr_last_error(ctx), fr_model_seq(m));
        return;
    }
    fr_mem_stats m0, m1;
    fr_mem_empty_cache(ctx);
    fr_mem_get_stats(ctx, &m0);
    /* training files alone, no --data: no test split (train's rule) */
    int no_test = c->t.train_images && !c->t.test_images && c->t.data_default;
    *train = fr_dataset_open_split(ctx, c->t.data, "train", c->t.train_images, c->t.train_labels);
    *test = *train && !no_test
                ? fr_dataset_open_split(ctx, c->t.data, "t10k", c->t.test_images, c->t.test_labels)
                : NULL;
    fr_mem_empty_cache(ctx);
    fr_mem_get_stats(ctx, &m1);
    *bd = (fr_budget_data){
        0, 0, 0, c->t.limit_train, fr_eval_limit(&c->t, 0), c->t.queue, c->t.eval_batch, 0, 0,
        0, 0, 0};
    if (*train && (*test || no_test)) {
        int ch, h, w;
        fr_dataset_sample_shape(*train, &ch, &h, &w);
        bd->sample = (size_t)ch * h * w;
        bd->n_train = fr_dataset_len(*train);
        bd->n_test = *test ? fr_dataset_len(*test) : 0;
        bd->handles = (m1.reserved - m1.cached) - (m0.reserved - m0.cached);
        return;
    }
    fprintf(stderr,
            "frugal plan: %s\nfrugal plan: counting the data as Fashion-MNIST would take: "
            "60000 training and 10000 test samples of %lld values, %d KiB for the open datasets\n",
            fr_last_error(ctx), (long long)fr_shape_numel(&m->in), FR_PLAN_ASSUMED_HANDLES >> 10);
    fr_dataset_close(*train);
    *train = NULL;
    bd->sample = (size_t)fr_shape_numel(&m->in);
    bd->n_train = 60000;
    bd->n_test = 10000;
    bd->handles = FR_PLAN_ASSUMED_HANDLES;
    bd->assumed = 1;
}

/* fr_step_ranks_table's JSON object for one stage, without its newline. */
static void ranks_json(const fr_step *s, int ranks, int zero) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return;
    fr_step_ranks_table(s, ranks, zero, f, 1);
    fclose(f);
    while (len && buf[len - 1] == '\n') buf[--len] = 0;
    fputs(buf, stdout);
    free(buf);
}

/* The plan's JSON object with the budget's split added as "budget_split"
 * and, for one rank of several, its bytes as "per_rank". */
static void plan_json(const fr_step *s, const fr_budget *b, int ranks, int zero) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f) return;
    fr_step_describe_plan(s, f, 1);
    fclose(f);
    while (len && (buf[len - 1] == '\n' || buf[len - 1] == '}')) {
        int brace = buf[len - 1] == '}';
        buf[--len] = 0;
        if (brace) break;
    }
    fputs(buf, stdout);
    if (b) {
        printf(", \"budget_split\": ");
        fr_budget_describe(b, stdout, 1);
    }
    if (ranks > 1 || zero >= 0) {
        printf(", \"per_rank\": ");
        ranks_json(s, ranks > 1 ? ranks : 1, zero >= 0 ? zero : 0);
    }
    printf("}\n");
    free(buf);
}

static int cmd_plan(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, &commands[3], &c);
    if (r) return r < 0 ? 0 : r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads); /* workspace sizes depend on it */
    if (use_device(ctx, &c, "plan")) return ctx_done(ctx), 1;
    fr_model *m = load_for("plan", ctx, &c);
    fr_dataset *train = NULL, *test = NULL;
    fr_source src = {0};
    fr_step *s = NULL;
    fr_budget bud;
    int ranks = c.ranks > 1 ? c.ranks : 1, zero = c.zero >= 0 ? c.zero : 0;
    if (m && ranks > 1 && c.t.batch_auto) {
        fprintf(stderr, "frugal plan: --batch auto with --ranks %d: give the global --batch\n",
                ranks);
        fr_model_free(m);
        m = NULL;
    } else if (m && c.t.step.budget) { /* the same accounting as `frugal train --budget` */
        fr_budget_data bd;
        plan_data(ctx, &c, m, &bd, &train, &test, &src);
        /* one rank of several: the budget is the rank's, its step the slice's */
        bd.ranks = ranks, bd.zero = zero;
        fr_step_opts so = step_opts(&c, NULL);
        fr_rank_step_opts(&so, ranks);
        s = fr_budget_plan(m, &so, &bd, c.t.batch_auto, &bud);
        if (s && c.t.batch_auto)
            fprintf(stderr, "--batch auto: %d is the largest batch whose whole footprint fits\n",
                    s->o.batch);
    } else if (m) {
        fr_step_opts so = step_opts(&c, NULL);
        fr_rank_step_opts(&so, ranks);
        s = fr_step_prepare(m, &so); /* planned on shapes: nothing of the model allocated */
    }
    if (m && !s) fprintf(stderr, "frugal plan: %s\n", fr_last_error(ctx));
    int per_rank = c.ranks > 1 || c.zero >= 0;
    if (s && c.t.json) {
        plan_json(s, c.t.step.budget ? &bud : NULL, ranks, per_rank ? zero : -1);
    } else if (s) {
        fr_step_describe_plan(s, stdout, 0);
        if (c.t.step.budget) {
            fputc('\n', stdout);
            fr_budget_describe(&bud, stdout, 0);
        }
        if (per_rank) fr_step_ranks_table(s, ranks, zero, stdout, 0);
    }
    int rc = s ? 0 : 1;
    fr_step_free(s);
    fr_dataset_close(train);
    fr_dataset_close(test);
    fr_source_close(&src);
    fr_model_free(m);
    ctx_done(ctx);
    return rc;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmd_profile(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, &commands[4], &c);
    if (r) return r < 0 ? 0 : r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads);
    if (use_device(ctx, &c, "profile")) return ctx_done(ctx), 1;
    fr_model *m = load_for("profile", ctx, &c);
    fr_step *s = NULL;
    float *x = NULL;
    int32_t *y = NULL;
    int rc = 1;
    if (!m) goto out;
    if (c.t.step.budget)
        fr_mem_set_limit(ctx, c.t.step.budget); /* the model is allocated within it too */
    fr_mem_trace(ctx, 1);
    fr_step_opts so = step_opts(&c, m);
    if (!(s = fr_step_compile(m, &so))) {
        fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
        goto out;
    }
    fr_step_describe_plan(s, stderr, 0);
    size_t per = (size_t)fr_shape_numel(&s->g.vals[s->g.input].shape) / (size_t)s->sched.micro;
    size_t rows = (size_t)fr_shape_numel(&s->g.vals[s->g.label].shape) / (size_t)s->sched.micro;
    x = malloc(per * (size_t)so.batch * sizeof *x);
    y = malloc((per > rows ? per : rows) * (size_t)so.batch * sizeof *y);
    if (!x || !y) goto out;
    for (size_t i = 0; i < per * (size_t)so.batch; i++)
        x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f;
    for (size_t i = 0; i < rows * (size_t)so.batch; i++)
        y[i] = (int32_t)(i % (size_t)fr_model_num_classes(m));
    fr_batch b = {.n = so.batch, .x = x, .y = y, .idx = y}; /* token ids: y's are valid ids */
    int steps = c.steps ? c.steps : 3;
    double t0 = 0, t1 = 0; /* the steps after the first (warm-up) */
    for (int i = 0; i < steps; i++) {
        if (i == 1) t0 = now_seconds();
        float loss;
        if (fr_step_run(s, &b, &loss, NULL)) {
            fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
            goto out;
        }
    }
    t1 = now_seconds();
    fr_mem_stats ms; /* the run's, before the reports' buffers */
    fr_mem_get_stats(ctx, &ms);
    fr_mem_set_limit(ctx, 0); /* --budget bounds the run, not the reports written after it */
    const char *trace = c.trace ? c.trace : "memory-trace.json";
    const char *svg = c.svg ? c.svg : "memory.svg";
    if (fr_timeline_chrome(ctx, trace) || fr_timeline_svg(ctx, svg, c.t.model, c.t.step.budget)) {
        fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
        goto out;
    }
    if (c.t.step.budget) fr_mem_set_limit(ctx, c.t.step.budget); /* as it ran */
    fr_op_time ops[FR_OP_COUNT];
    int nops = fr_timeline_op_times(ctx, ops, FR_OP_COUNT);
    if (nops < 0) {
        fprintf(stderr, "frugal profile: %s\n", fr_last_error(ctx));
        goto out;
    }
    double kernel_ms = 0;
    for (int i = 0; i < nops; i++) kernel_ms += ops[i].ms;
    if (c.t.json) { /* the host's memory, and a device's beside it */
        printf("{\"event\": \"summary\", \"steps\": %d, \"ms_per_step\": %.3f, \"ops\": [", steps,
               steps > 1 ? 1e3 * (t1 - t0) / (steps - 1) : 0.0);
        for (int i = 0; i < nops; i++)
            printf("%s{\"op\": \"%s\", \"calls\": %d, \"ms\": %.3f}", i ? ", " : "", ops[i].name,
                   ops[i].calls, ops[i].ms);
        printf("], \"cpu\": ");
        fr_cpu_json(stdout, NULL);
        printf(", \"memory\": ");
        mem_json_inline(ctx);
        printf("}\n");
        rc = 0;
        goto out;
    }
    char g32[96], g16[96], gc[96], gl[96];
    printf("GEMM: f32 %s, bf16 %s; conv %s; linear f32 %s\n", fr_cpu_gemm_f32(g32, sizeof g32),
           fr_cpu_gemm_bf16(g16, sizeof g16), fr_cpu_conv(gc, sizeof gc),
           fr_cpu_linear32(gl, sizeof gl));
    if (nops > 0) { /* where the time goes: each op's kernels, summed over the steps */
        printf("kernel time by op over %d steps (the first included), %.1f ms a step:\n", steps,
               kernel_ms / steps);
        printf("  %-22s %8s %12s %7s\n", "op", "calls", "ms a step", "share");
        for (int i = 0; i < nops; i++)
            printf("  %-22s %8d %12.2f %6.1f%%\n", ops[i].name, ops[i].calls, ops[i].ms / steps,
                   kernel_ms > 0 ? 100.0 * ops[i].ms / kernel_ms : 0.0);
    }
    printf("%d steps: peak allocated %.1f MiB, peak reserved %.1f MiB\nwrote %s (open in Perfetto) "
           "and %s\n",
           steps, ms.allocated_total_peak / 1048576.0, ms.reserved_peak / 1048576.0, trace, svg);
    rc = 0;
out:
    free(x);
    free(y);
    fr_step_free(s);
    fr_model_free(m);
    ctx_done(ctx);
    return rc;
}

/* estimate --ranks N [--zero K] --json: one document whose answer is one
 * rank's bytes at stage K (0 when not given, what `train` runs), every
 * stage's (or K's) under "stages", and the unsharded step's estimate (one
 * process's document) under "unsharded". */
static void estimate_ranks_json(const fr_step *s, const cli *c) {
    int ranks = c->ranks > 1 ? c->ranks : 1, zero = c->zero >= 0 ? c->zero : 0;
    fr_rank_bytes r;
    fr_step_rank_bytes(s, ranks, zero, &r);
    printf("{\"ranks\": %d, \"zero\": %d, \"rank_batch\": %d, \"predicted_peak\": "
           "{\"parameters\": %zu, \"gradients\": %zu, \"optimizer\": %zu, \"buckets\": %zu, "
           "\"rest\": %zu}, \"predicted_peak_total\": %zu, \"stages\": ",
           ranks, zero, s->o.batch, r.params, r.grads, r.optim, r.buckets, r.rest, r.total);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (f) {
        fr_step_ranks_table(s, ranks, c->zero, f, 1);
        fclose(f);
        char *st = buf ? strstr(buf, "\"stages\": ") : NULL;
        if (st) { /* its array, without the enclosing object */
            st += strlen("\"stages\": ");
            char *end = strrchr(st, ']');
            if (end) fwrite(st, 1, (size_t)(end - st + 1), stdout);
        }
        free(buf);
    }
    printf(", \"unsharded\": ");
    buf = NULL, len = 0;
    f = open_memstream(&buf, &len);
    if (f) {
        fr_step_estimate_table(s, f, 1);
        fclose(f);
        while (len && buf[len - 1] == '\n') buf[--len] = 0;
        fputs(buf ? buf : "null", stdout);
        free(buf);
    }
    printf("}\n");
}

static int cmd_estimate(int argc, char **argv) {
    cli c;
    int r = parse(argc, argv, &commands[2], &c);
    if (r) return r < 0 ? 0 : r;
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads); /* workspace sizes depend on it */
    if (use_device(ctx, &c, "estimate")) return ctx_done(ctx), 1;
    fr_model *m = load_for("estimate", ctx, &c);
    fr_step *s = NULL;
    if (m) {
        fr_step_opts so = step_opts(&c, m);
        so.training = !c.eval_only;
        fr_rank_step_opts(&so, c.ranks); /* one rank: its slice, every gradient kept */
        /* planned on shapes: nothing of the model is allocated, so a model
         * far larger than the machine can be estimated */
        if (!so.batch)
            fprintf(stderr, "frugal estimate: not even a batch of 1 fits %zu bytes\n",
                    c.t.step.budget);
        else if (!(s = fr_step_prepare(m, &so)))
            fprintf(stderr, "frugal estimate: %s\n", fr_last_error(ctx));
    }
    if (!s) {
        fr_model_free(m);
        ctx_done(ctx);
        return 1;
    }
    if (!c.t.json) {
        printf("model %s: %zu trainable parameters", c.t.model, fr_model_num_params(m));
        if (fr_model_lora_rank(m)) /* fr_model_num_params counts the frozen base too */
            printf(" (%zu trained: the LoRA adapters, r=%d; the base frozen)",
                   fr_model_num_trained(m), fr_model_lora_rank(m));
        printf("\n");
    }
    if (c.t.json && (c.ranks > 1 || c.zero >= 0)) estimate_ranks_json(s, &c);
    else {
        fr_step_estimate_table(s, stdout, c.t.json);
        if (c.ranks > 1 || c.zero >= 0)
            fr_step_ranks_table(s, c.ranks > 1 ? c.ranks : 1, c.zero, stdout, c.t.json);
    }
    fr_step_free(s);
    fr_model_free(m);
    ctx_done(ctx);
    return 0;
}

/* generate: where each new token goes. A byte-level model (vocabulary 256)
 * prints bytes, a larger one ids separated by spaces. */
typedef struct gen_out {
    int bytes;           /* a byte model without a tokenizer: each id is a byte */
    fr_tok_stream *text; /* a tokenizer's streaming decoder, or NULL */
    long long n;         /* ids printed (prompt and new) */
    long long made;      /* new tokens */
    fr_status st;        /* a decoding failure */
} gen_out;

static void gen_print(gen_out *o, int32_t tok) {
    if (o->text) {
        char *b = NULL;
        size_t len = 0;
        if (!o->st && !(o->st = fr_tok_stream_push(o->text, tok, &b, &len)))
            fwrite(b, 1, len, stdout);
        free(b);
    } else if (o->bytes) {
        putchar(tok);
    } else {
        printf("%s%ld", o->n ? " " : "", (long)tok);
    }
    o->n++;
    fflush(stdout);
}

static void gen_emit(void *user, int32_t tok) {
    gen_out *o = user;
    gen_print(o, tok);
    o->made++;
}

/* "ids:464,3290" -> ids; 0, or 2 after printing why. */
static int parse_ids(const char *s, int32_t *ids, int *n, int cap) {
    *n = 0;
    for (const char *p = s;;) {
        uint64_t v = 0;
        const char *d = p;
        while (*p >= '0' && *p <= '9' && v <= INT32_MAX) v = 10 * v + (uint64_t)(*p++ - '0');
        if (p == d || v > INT32_MAX || (*p && *p != ',') || *n == cap) {
            fprintf(stderr,
                    "frugal generate: --prompt 'ids:%s': expected token ids separated by commas "
                    "(e.g. ids:464,3290), fault at character %d\n",
                    s, (int)(p - s) + 4);
            return 2;
        }
        ids[(*n)++] = (int32_t)v;
        if (!*p++) return 0;
    }
}

/* The tokenizer --tokenizer names, or a Hugging Face --model directory's
 * own (NULL and *fail 0 when there is none; *fail 1 after printing why). */
static fr_tokenizer *tokenizer_for(const char *cmd, fr_ctx *ctx, const cli *c, fr_model *m,
                                   int *fail) {
    *fail = 0;
    const char *path = c->t.tokenizer;
    if (!path) return NULL;
    fr_tokenizer *t = fr_tokenizer_load(ctx, path);
    if (!t) {
        fprintf(stderr, "frugal %s: --tokenizer %s: %s\n", cmd, path, fr_last_error(ctx));
        *fail = 1;
        return NULL;
    }
    if (m && fr_tokenizer_check_vocab(ctx, t, fr_generate_vocab(m))) {
        fprintf(stderr, "frugal %s: --tokenizer: %s\n", cmd, fr_last_error(ctx));
        fr_tokenizer_free(t);
        *fail = 1;
        return NULL;
    }
    return t;
}

static int cmd_generate(int argc, char **argv) {
    const command *cmd = NULL;
    for (size_t i = 0; i < N_COMMANDS; i++)
        if (!strcmp(commands[i].name, "generate")) cmd = &commands[i];
    cli c;
    int r = parse(argc, argv, cmd, &c);
    if (r) return r < 0 ? 0 : r;
    struct stat msb; /* a model directory: its weights (or a message naming what it lacks) */
    const int mdir = stat(c.t.model, &msb) == 0 && S_ISDIR(msb.st_mode);
    const char *weights = c.weights ? c.weights : mdir ? c.t.model : NULL;
    if (!weights)
        return bad("generate", "%s",
                   "--weights CKPT is required (a Hugging Face --model directory brings its own)");
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fprintf(stderr, "frugal: out of memory\n"), 1;
    fr_set_threads(ctx, c.threads);
    if (use_device(ctx, &c, "generate")) return ctx_done(ctx), 1;
    fr_model *m = load_for("generate", ctx, &c);
    int32_t *ids = NULL;
    int n = 0, rc = 1, vocab = m ? fr_generate_vocab(m) : 0, tfail = 0;
    const int is_ids = !strncmp(c.prompt, "ids:", 4);
    fr_status st = m ? FR_OK : FR_ERR_ARG;
    if (m && !fr_model_context(m)) {
        fprintf(stderr, "frugal generate: model %s does not read tokens (input tokens T)\n",
                c.t.model);
        st = FR_ERR_ARG;
    }
    fr_tokenizer *tok = st ? NULL : tokenizer_for("generate", ctx, &c, m, &tfail);
    if (tfail) st = FR_ERR_ARG;
    if (!st && ((st = fr_model_load_weights(m, weights)) ||
                (c.t.adapter && (st = fr_adapter_apply(m, c.t.adapter, c.t.step.seed)))))
        fprintf(stderr, "frugal generate: %s\n", fr_last_error(ctx));
    if (!st && !is_ids && !tok && vocab != 256) {
        fprintf(stderr,
                "frugal generate: the vocabulary is %d, not bytes (256), and there is no "
                "tokenizer: give one (--tokenizer FILE|DIR), or the prompt as ids, e.g. "
                "--prompt ids:464,3290\n",
                vocab);
        st = FR_ERR_ARG;
    }
    const int eos = tok ? fr_tokenizer_eos(tok) : -1;
    if (!st && c.stop_eos == 1 && eos < 0) {
        fprintf(stderr, "frugal generate: --stop-at-eos on: %s has no end-of-sequence token\n",
                tok ? "the tokenizer" : "without a tokenizer there");
        st = FR_ERR_ARG;
    }
    size_t len = strlen(c.prompt);
    if (!st) {
        if (is_ids || !tok) {
            if (!(ids = malloc((len + 1) * sizeof *ids))) {
                fprintf(stderr, "frugal: out of memory\n");
                st = FR_ERR_NOMEM;
            } else if (is_ids) {
                if (parse_ids(c.prompt + 4, ids, &n, (int)len)) rc = 2, st = FR_ERR_ARG;
            } else {
                for (size_t i = 0; i < len; i++) ids[n++] = (unsigned char)c.prompt[i];
            }
        } else {
            size_t nn = 0;
            if ((st = fr_tokenizer_encode(tok, c.prompt, len, fr_tokenizer_adds_bos(tok), &ids,
                                          &nn)))
                fprintf(stderr, "frugal generate: --prompt: %s\n", fr_last_error(ctx));
            else if (nn > (size_t)INT32_MAX / 2) st = FR_ERR_ARG;
            n = (int)nn;
        }
    }
    if (!st) {
        gen_out out = {vocab == 256 && !tok, NULL, 0, 0, FR_OK};
        if (tok && !is_ids) { /* the prompt as given, then the new tokens decoded as they come */
            fwrite(c.prompt, 1, len, stdout);
            if (!(out.text = fr_tok_stream_new(tok))) st = FR_ERR_NOMEM;
            /* the decoder continues from the prompt's tokens (a leading space is kept) */
            for (int i = 0; i < n && !st; i++) {
                char *b = NULL;
                size_t bl = 0;
                st = fr_tok_stream_push(out.text, ids[i], &b, &bl);
                free(b);
            }
        } else if (tok) {
            if (!(out.text = fr_tok_stream_new(tok))) st = FR_ERR_NOMEM;
            for (int i = 0; i < n && !st; i++) gen_print(&out, ids[i]);
        } else {
            for (int i = 0; i < n; i++) gen_print(&out, ids[i]); /* the prompt, then new tokens */
        }
        const int stop = c.stop_eos == 1 || (c.stop_eos == -1 && eos >= 0);
        fr_gen_opts o = {.tokens = c.tokens,
                         .temperature = c.temperature,
                         .top_k = c.top_k,
                         .top_p = c.top_p,
                         .stop = stop,
                         .stop_token = eos,
                         .max_context = c.max_context,
                         .window_slide = c.window_slide,
                         .seed = c.t.step.seed,
                         .emit = gen_emit,
                         .user = &out};
        int cropped = 0;
        const int T = c.max_context > 0 && c.max_context < fr_model_context(m)
                          ? c.max_context
                          : fr_model_context(m);
        if (n > T)
            fprintf(stderr,
                    "frugal generate: the prompt has %d tokens, the context %d: the first %d are "
                    "dropped\n",
                    n, T, n - T);
        double t0 = now_seconds();
        if (!st) st = fr_generate(m, ids, n, &o, &cropped);
        double dt = now_seconds() - t0;
        if (out.text && !st && !out.st) {
            char *b = NULL;
            size_t bl = 0;
            if (!(out.st = fr_tok_stream_flush(out.text, &b, &bl))) fwrite(b, 1, bl, stdout);
            free(b);
        }
        if (!st && out.st) st = out.st;
        fr_tok_stream_free(out.text);
        if (out.bytes || out.text ? out.made > 0 : 1) putchar('\n');
        fflush(stdout);
        if (st) {
            fprintf(stderr, "frugal generate: %s\n", fr_last_error(ctx));
        } else {
            fr_mem_stats ms;
            fr_mem_get_stats(ctx, &ms);
            char a[32], b[32], w[32], t[32];
            fprintf(stderr,
                    "%lld tokens%s in %.2f s: %.1f tokens/s (%d threads; prompt %d tokens); "
                    "memory peak: parameters %s, kv_cache %s (%zu bytes) for %d positions, "
                    "workspace %s, total %s\n",
                    out.made, stop && out.made < c.tokens ? " (stopped at EOS)" : "", dt,
                    dt > 0 ? (double)out.made / dt : 0.0, fr_get_threads(ctx), n,
                    fr_human_bytes(ms.allocated_peak[FR_MEM_PARAMS], a, sizeof a),
                    fr_human_bytes(ms.allocated_peak[FR_MEM_KV_CACHE], b, sizeof b),
                    ms.allocated_peak[FR_MEM_KV_CACHE], T,
                    fr_human_bytes(ms.allocated_peak[FR_MEM_WORKSPACE], w, sizeof w),
                    fr_human_bytes(ms.allocated_total_peak, t, sizeof t));
#ifdef FR_HAVE_OPENCL
            if (c.device >= 0) { /* the caches, the weights' copy and the arena live there */
                fr_mem_stats_of(fr_cl_memory(ctx), &ms);
                fprintf(stderr,
                        "device memory peak: parameters %s, kv_cache %s (%zu bytes), workspace "
                        "%s, total %s\n",
                        fr_human_bytes(ms.allocated_peak[FR_MEM_PARAMS], a, sizeof a),
                        fr_human_bytes(ms.allocated_peak[FR_MEM_KV_CACHE], b, sizeof b),
                        ms.allocated_peak[FR_MEM_KV_CACHE],
                        fr_human_bytes(ms.allocated_peak[FR_MEM_WORKSPACE], w, sizeof w),
                        fr_human_bytes(ms.allocated_total_peak, t, sizeof t));
            }
#endif
            rc = 0;
        }
    }
    free(ids);
    fr_tokenizer_free(tok);
    fr_model_free(m);
    ctx_done(ctx);
    return rc;
}

/* ---- devices ----------------------------------------------------------- */

static const char *usage_devices =
    "usage: frugal devices [--json]\n"
    "\n"
    "First a line for the CPU: its model, the features that choose GEMM kernels, the f32\n"
    "GEMM (OpenBLAS and the kernels it runs) and the bf16 one (oneDNN's), with GFLOP/s\n"
    "measured by a 512^3 GEMM of each (about 0.2 s). Then the OpenCL devices of every\n"
    "platform, in the order --device opencl:N counts them: index, platform, device name,\n"
    "global memory, the largest single buffer, whether it has half precision (cl_khr_fp16)\n"
    "and its compute units.\n"
    "\n"
    "options:\n"
    "  --json    one JSON object {\"cpu\": {...}, \"devices\": [...]} on stdout, sizes in bytes\n"
    "  --help    this text\n"
    "\n"
    "exit status: 0 when at least one OpenCL device is listed; 1 when there is none (the message\n"
    "says what to install: pocl-opencl-icd is a CPU device, or your GPU's OpenCL driver)\n"
    "or this frugal was built without OpenCL; 2 for a usage error. So\n"
    "`frugal devices >/dev/null && ...` asks whether a device is there.\n"
    "\n"
    "testing knob: FRUGAL_CL_GLOBAL_MEM=<bytes> makes `frugal train` take a device's\n"
    "global memory as that much (when less than it has), to exercise the check\n"
    "that refuses a plan larger than the device before anything is allocated.\n";

static int cmd_devices(int argc, char **argv) {
    int json = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            return fputs(usage_devices, stdout), 0;
        if (!strcmp(argv[i], "--json")) json = 1;
        else {
            fprintf(stderr, "frugal devices: unknown option '%s' (options: --json, --help)\n",
                    argv[i]);
            return 2;
        }
    }
    fr_gemm_rates rates;
    fr_gemm_probe(&rates);
    if (json) fputs("{\"cpu\": ", stdout), fr_cpu_json(stdout, &rates), fputs(", ", stdout);
    else fr_cpu_line(stdout, &rates), putchar('\n');
#ifndef FR_HAVE_OPENCL
    if (json) puts("\"devices\": []}");
    fputs("frugal devices: this frugal was built without OpenCL (FR_OPENCL=OFF, or OpenCL or "
          "CLBlast not found when it was built)\n",
          stderr);
    return 1;
#else
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return fputs("frugal devices: out of memory\n", stderr), 1;
    int n = 0, rc = 0;
    if (fr_cl_count(ctx, &n) != FR_OK) {
        if (json) puts("\"devices\": []}");
        fprintf(stderr, "frugal devices: %s\n", fr_last_error(ctx));
        fr_ctx_free(ctx);
        return 1;
    }
    if (json) fputs("\"devices\": [", stdout);
    else if (n > 0)
        printf("%-5s %-28s %-36s %10s %10s %4s %5s\n", "index", "platform", "device", "memory",
               "largest", "fp16", "units");
    for (int i = 0; i < n; i++) {
        fr_cl_info in;
        if (fr_cl_describe(ctx, i, &in) != FR_OK) {
            fprintf(stderr, "frugal devices: device %d: %s\n", i, fr_last_error(ctx));
            rc = 1;
            continue;
        }
        if (json) {
            printf("%s\n  {\"index\": %d, \"platform\": ", i ? "," : "", i);
            fr_json_str(stdout, in.platform);
            fputs(", \"name\": ", stdout);
            fr_json_str(stdout, in.name);
            fputs(", \"version\": ", stdout);
            fr_json_str(stdout, in.version);
            printf(", \"global_mem\": %zu, \"max_alloc\": %zu, \"base_align\": %zu, \"fp16\": %s, "
                   "\"fp64\": %s, \"compute_units\": %d}",
                   in.global_mem, in.max_alloc, in.base_align, in.fp16 ? "true" : "false",
                   in.fp64 ? "true" : "false", in.compute_units);
        } else {
            char g[32], a[32];
            printf("%-5d %-28.28s %-36.36s %10s %10s %4s %5d\n", i, in.platform, in.name,
                   fr_human_bytes(in.global_mem, g, sizeof g),
                   fr_human_bytes(in.max_alloc, a, sizeof a), in.fp16 ? "yes" : "no",
                   in.compute_units);
        }
    }
    if (json) puts(n ? "\n]}" : "]}");
    if (n == 0) {
        fputs("no OpenCL device found; install pocl-opencl-icd (a CPU device) or your GPU's "
              "OpenCL driver\n",
              stderr);
        rc = 1;
    }
    fr_ctx_free(ctx);
    return rc;
#endif
}

int cmd_tokenize(int argc, char **argv); /* cmd_tokenize.c */

/* OpenMP's idle threads spin briefly, then sleep, unless the user chose:
 * on a shared or loaded host, spinning threads take the cores the working
 * ones need; a spin of about 0.1 ms (GOMP_SPINCOUNT, libgomp's) keeps the
 * idle host's speed (bench/out/omp_wait.md). Returns 1 when it set them. */
static int passive_wait(void) {
    if (getenv("OMP_WAIT_POLICY") || getenv("GOMP_SPINCOUNT")) return 0;
    return !setenv("OMP_WAIT_POLICY", "passive", 1) && !setenv("GOMP_SPINCOUNT", "10000", 1);
}

int main(int argc, char **argv) {
    /* libgomp and OpenBLAS read their environment once, when they are
     * loaded: what either needs (the wait policy; the BLAS core when
     * OpenBLAS runs narrower vectors than the CPU has, fr_cpu_fix_env) is set and the
     * program started again, once; if that fails it runs on as it is. */
    int again = passive_wait();
    if (fr_cpu_fix_env()) again = 1;
    if (again) execv("/proc/self/exe", argv);
    const char *warn = fr_cpu_warning(); /* a narrow BLAS core that could not be fixed */
    if (warn && argc >= 2 && strcmp(argv[1], "help") && argv[1][0] != '-')
        fprintf(stderr, "%s\n", warn);
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") ||
        !strcmp(argv[1], "-h")) {
        fputs(usage_main, stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) return puts("frugal " FR_VERSION), 0;
    if (!strcmp(argv[1], "train")) return cmd_train(argc - 1, argv + 1);
    if (!strcmp(argv[1], "eval")) return cmd_eval(argc - 1, argv + 1);
    if (!strcmp(argv[1], "estimate")) return cmd_estimate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "plan")) return cmd_plan(argc - 1, argv + 1);
    if (!strcmp(argv[1], "profile")) return cmd_profile(argc - 1, argv + 1);
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(argv[1], "devices")) return cmd_devices(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tokenize")) return cmd_tokenize(argc - 1, argv + 1);
    fprintf(
        stderr,
        "frugal: unknown command '%s' (commands: train, eval, estimate, plan, profile, generate, "
        "devices, tokenize, help)\n",
        argv[1]);
    return 2;
}
