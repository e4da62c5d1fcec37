/* modelfile.c — the model-file parser: line-oriented text (one statement a
 * line, `#` comments, key=value options; grammar in models/README.md) turned
 * into calls of the public builder API (fr_model_new, fr_model_conv2d, ...,
 * fr_model_residual_*), so it depends on no model internals: shapes are the
 * builder's to check, and its messages come back prefixed with file:line.
 * Every fault of the text itself is reported as file:line:col with a hint.
 * It also holds the built-in models ("mlp", "cnn", "resnet", "gpt-tiny",
 * "gpt2"), whose text is
 * byte for byte the files in models/ (tests/test_modelfile.c checks). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include "core/ctx.h"
#include "io/file.h"
#include "model/model.h"
#include "model/modelfile.h"

#define MF_MAX_LINE 1024       /* bytes in one line, comment included */
#define MF_MAX_TEXT (1u << 20) /* bytes in one model file */
#define MF_MAX_INT (1 << 24)   /* the largest number any argument takes */
#define MF_MAX_NAME 100        /* the builder's limit on a layer name */
#define MF_MAX_DEPTH 16    /* open residual blocks the parser tracks (the builder allows fewer) */
#define MF_QUOTE_MAX 40    /* longest token quoted whole in a message */
#define MF_MAX_REPEAT 4096 /* iterations of one repeat */
#define MF_MAX_EXPANDED (1 << 20) /* lines read, repeats expanded */

/* ---- statements: one table row each ------------------------------------ */

typedef enum mf_key {
    K_KERNEL = 0,
    K_STRIDE,
    K_PADDING,
    K_BIAS,
    K_NAME,
    K_CHECKPOINT,
    K_STD,
    K_TIE,
    K_APPROXIMATE,
    K_HEADS,
    K_CAUSAL,
    K_COUNT
} mf_key;
#define KB(k) (1u << (k))
static const char *const mf_key_names[K_COUNT] = {"kernel",      "stride",     "padding", "bias",
                                                  "name",        "checkpoint", "std",     "tie",
                                                  "approximate", "heads",      "causal"};

typedef enum mf_kind {
    S_INPUT = 0,
    S_LAYER,
    S_RESIDUAL,
    S_SHORTCUT,
    S_END,
    S_LOSS,
    S_REPEAT,
    S_DEFAULT
} mf_kind;
/* What the positional arguments are. */
typedef enum mf_pos { P_NONE = 0, P_INT, P_PROB, P_LOSS } mf_pos;

/* One parsed statement's arguments. */
typedef struct mf_args {
    int n;                /* positional arguments given */
    int v[3];             /* P_INT values */
    float p;              /* P_PROB */
    fr_loss loss;         /* P_LOSS */
    int key[K_COUNT];     /* integer and true/false values */
    int key_col[K_COUNT]; /* column of each key given, 0 when absent */
    float std;            /* K_STD */
    char name[MF_MAX_NAME + 1];
    char tie[MF_MAX_NAME + 1];
} mf_args;

static int has(const mf_args *a, mf_key k) { return a->key_col[k] != 0; }
static int key_or(const mf_args *a, mf_key k, int dflt) { return has(a, k) ? a->key[k] : dflt; }

static fr_status b_linear(fr_model *m, const mf_args *a) {
    return fr_model_linear(m, a->v[0], key_or(a, K_BIAS, 1));
}
/* A graph-level call on the value made last; its message is on the context. */
static fr_status made(fr_val v) { return v == FR_NO_VAL ? FR_ERR_SHAPE : FR_OK; }
static fr_status b_embedding(fr_model *m, const mf_args *a) {
    return made(fr_embedding(m, fr_model_last_value(m), a->v[0], a->v[1]));
}
static fr_status b_pos_embedding(fr_model *m, const mf_args *a) {
    return made(fr_pos_embedding(m, fr_model_last_value(m), a->v[0]));
}
static fr_status b_attention(fr_model *m, const mf_args *a) {
    return made(fr_attention(m, fr_model_last_value(m), a->key[K_HEADS]));
}
static fr_status b_layernorm(fr_model *m, const mf_args *a) {
    if (a->n == 0) return fr_model_layernorm(m);
    return made(fr_layernorm(m, fr_model_last_value(m), a->v[0]));
}
static fr_status b_gelu(fr_model *m, const mf_args *a) {
    return made(fr_gelu(m, fr_model_last_value(m), key_or(a, K_APPROXIMATE, 0)));
}
static fr_status b_conv2d(fr_model *m, const mf_args *a) {
    return fr_model_conv2d(m, a->v[0], a->key[K_KERNEL], key_or(a, K_STRIDE, 1),
                           key_or(a, K_PADDING, 0), key_or(a, K_BIAS, 1));
}
static fr_status b_maxpool2d(fr_model *m, const mf_args *a) {
    return fr_model_maxpool2d(m, a->v[0], key_or(a, K_STRIDE, a->v[0]));
}
static fr_status b_avgpool2d(fr_model *m, const mf_args *a) {
    return fr_model_avgpool2d(m, a->v[0], key_or(a, K_STRIDE, a->v[0]));
}
/* The layers and block markers that take no arguments. */
#define MF_NOARG(fn, call)                               \
    static fr_status fn(fr_model *m, const mf_args *a) { \
        (void)a;                                         \
        return call(m);                                  \
    }
MF_NOARG(b_global_avgpool, fr_model_global_avgpool)
MF_NOARG(b_batchnorm, fr_model_batchnorm)
MF_NOARG(b_relu, fr_model_relu)
MF_NOARG(b_sigmoid, fr_model_sigmoid)
MF_NOARG(b_tanh, fr_model_tanh)
MF_NOARG(b_flatten, fr_model_flatten)
MF_NOARG(b_residual, fr_model_residual_begin)
MF_NOARG(b_shortcut, fr_model_residual_shortcut)
MF_NOARG(b_end, fr_model_residual_end)
static fr_status b_dropout(fr_model *m, const mf_args *a) { return fr_model_dropout(m, a->p); }

typedef struct mf_stmt {
    const char *word;
    mf_kind kind;
    mf_pos pos;
    int pos_min, pos_max;
    const char *pos_name[3]; /* for messages, as in the usage line */
    unsigned keys;           /* keys it takes */
    unsigned required;       /* keys it needs */
    fr_status (*build)(fr_model *m, const mf_args *a);
    const char *usage;
} mf_stmt;

/* Every layer and residual block takes name= and checkpoint=true (recompute
 * its activations in backward instead of keeping them: PyTorch's
 * checkpoint(self.layer1, x)). */
#define NAMED (KB(K_NAME) | KB(K_CHECKPOINT))
#define CONV_KEYS (KB(K_KERNEL) | KB(K_STRIDE) | KB(K_PADDING) | KB(K_BIAS) | NAMED)
/* clang-format off */
static const mf_stmt mf_stmts[] = {
    /* word, kind, positionals (what, min, max, names), keys taken, keys needed, builder, usage */
    {"input", S_INPUT, P_INT, 1, 3, {"C", "H", "W"}, 0, 0, NULL,
     "input C H W  (an image)  or  input FEATURES  (a vector)  or  input tokens CONTEXT"},
    {"conv2d", S_LAYER, P_INT, 1, 1, {"OUT_CHANNELS"}, CONV_KEYS, KB(K_KERNEL), b_conv2d,
     "conv2d OUT_CHANNELS kernel=K [stride=1] [padding=0] [bias=true] [name=NAME]"},
    {"linear", S_LAYER, P_INT, 1, 1, {"OUT_FEATURES"}, KB(K_BIAS) | KB(K_STD) | KB(K_TIE) | NAMED,
     0, b_linear, "linear OUT_FEATURES [bias=true] [std=S] [tie=LAYER] [name=NAME]"},
    {"maxpool2d", S_LAYER, P_INT, 1, 1, {"K"}, KB(K_STRIDE) | NAMED, 0, b_maxpool2d,
     "maxpool2d K [stride=K] [name=NAME]"},
    {"avgpool2d", S_LAYER, P_INT, 1, 1, {"K"}, KB(K_STRIDE) | NAMED, 0, b_avgpool2d,
     "avgpool2d K [stride=K] [name=NAME]"},
    {"global_avgpool", S_LAYER, P_NONE, 0, 0, {0}, NAMED, 0, b_global_avgpool,
     "global_avgpool [name=NAME]"},
    {"batchnorm", S_LAYER, P_NONE, 0, 0, {0}, NAMED, 0, b_batchnorm, "batchnorm [name=NAME]"},
    {"layernorm", S_LAYER, P_INT, 0, 1, {"DIM"}, NAMED, 0, b_layernorm,
     "layernorm [DIM] [name=NAME]  (DIM: over the last dimension, nn.LayerNorm(DIM))"},
    {"relu", S_LAYER, P_NONE, 0, 0, {0}, NAMED, 0, b_relu, "relu [name=NAME]"},
    {"gelu", S_LAYER, P_NONE, 0, 0, {0}, KB(K_APPROXIMATE) | NAMED, 0, b_gelu,
     "gelu [approximate=none|tanh] [name=NAME]"},
    {"sigmoid", S_LAYER, P_NONE, 0, 0, {0}, NAMED, 0, b_sigmoid, "sigmoid [name=NAME]"},
    {"tanh", S_LAYER, P_NONE, 0, 0, {0}, NAMED, 0, b_tanh, "tanh [name=NAME]"},
    {"dropout", S_LAYER, P_PROB, 1, 1, {"P"}, NAMED, 0, b_dropout, "dropout P [name=NAME]"},
    {"flatten", S_LAYER, P_NONE, 0, 0, {0}, NAMED, 0, b_flatten, "flatten [name=NAME]"},
    {"embedding", S_LAYER, P_INT, 2, 2, {"VOCAB", "DIM"}, KB(K_STD) | NAMED, 0, b_embedding,
     "embedding VOCAB DIM [std=S] [name=NAME]"},
    {"pos_embedding", S_LAYER, P_INT, 1, 1, {"POSITIONS"}, KB(K_STD) | NAMED, 0, b_pos_embedding,
     "pos_embedding POSITIONS [std=S] [name=NAME]"},
    {"attention", S_LAYER, P_NONE, 0, 0, {0}, KB(K_HEADS) | KB(K_CAUSAL) | NAMED, KB(K_HEADS),
     b_attention, "attention heads=H [causal=true] [name=NAME]"},
    {"residual", S_RESIDUAL, P_NONE, 0, 0, {0}, NAMED, 0, b_residual, "residual [name=NAME]"},
    {"shortcut", S_SHORTCUT, P_NONE, 0, 0, {0}, 0, 0, b_shortcut, "shortcut"},
    {"end", S_END, P_NONE, 0, 0, {0}, 0, 0, b_end, "end"},
    {"repeat", S_REPEAT, P_INT, 1, 1, {"N"}, KB(K_NAME), 0, NULL,
     "repeat N [name=PREFIX]  ... end  (layer names inside: PREFIX.i.NAME)"},
    {"loss", S_LOSS, P_LOSS, 1, 1, {"LOSS"}, 0, 0, NULL, "loss cross_entropy|mse"},
    {"default", S_DEFAULT, P_NONE, 0, 0, {0}, 0, 0, NULL, "default batch N"},
};
/* clang-format on */
#define MF_N_STMTS (sizeof mf_stmts / sizeof mf_stmts[0])

static const char *const mf_loss_names[] = {
    [FR_LOSS_CROSS_ENTROPY] = "cross_entropy", [FR_LOSS_MSE] = "mse"};
#define MF_N_LOSSES (sizeof mf_loss_names / sizeof mf_loss_names[0])

/* ---- the parser -------------------------------------------------------- */

typedef struct mf_tok {
    const char *s;
    int len, col; /* col: 1-based */
} mf_tok;

typedef struct mf_open {
    int line, col;     /* where the `residual` (or `repeat`) is */
    int shortcut_line; /* 0: no `shortcut` yet */
    int checkpoint;    /* checkpoint=true on the `residual` line: mark the block at `end` */
    /* a `repeat N`: its body is read N times, from the line after it */
    int repeat, count, iter, block;
    const char *body;
    char prefix[MF_MAX_NAME + 1];
} mf_open;

typedef struct mf_parser {
    fr_ctx *ctx;
    const char *file;
    int line;
    fr_model *m;
    int input_line, loss_line, n_layers;
    fr_loss loss;
    int depth;
    mf_open open[MF_MAX_DEPTH];
    const char *next; /* where the line after the current one starts */
    const char *jump; /* set by a repeat's `end`: read on from there, at jump_line + 1 */
    int jump_line;
} mf_parser;

/* A token quoted for a message, cut to MF_QUOTE_MAX bytes: use as
 * "'%.*s%s'" with MF_Q(t). Tokens hold printable ASCII only. */
#define MF_Q(t) \
    ((t).len > MF_QUOTE_MAX ? MF_QUOTE_MAX : (t).len), (t).s, ((t).len > MF_QUOTE_MAX ? "..." : "")

__attribute__((format(printf, 4, 5))) static fr_status mf_fail_at(mf_parser *p, int line, int col,
                                                                  const char *fmt, ...) {
    char msg[FR_ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return fr_fail(p->ctx, FR_ERR_FORMAT, "%s:%d:%d: %s", p->file, line, col, msg);
}
#define mf_fail(p, col, ...) mf_fail_at((p), (p)->line, (col), __VA_ARGS__)

/* A builder call failed: keep its message and status, prefixed with file:line. */
static fr_status mf_builder_failed(mf_parser *p, fr_status st) {
    char msg[FR_ERR_LEN];
    snprintf(msg, sizeof msg, "%s", fr_last_error(p->ctx));
    fr_fail(p->ctx, st, "%s:%d: %s", p->file, p->line, msg);
    return st != FR_OK ? st : FR_ERR_ARG;
}

/* Levenshtein distance, case-insensitive, for "did you mean"; words of up
 * to 31 bytes (longer ones are never close to a keyword). */
static int mf_distance(const char *a, int la, const char *b) {
    int lb = (int)strlen(b), row[32];
    if (la > 31 || lb > 31) return 99;
    for (int j = 0; j <= lb; j++) row[j] = j;
    for (int i = 1; i <= la; i++) {
        int diag = row[0];
        row[0] = i;
        for (int j = 1; j <= lb; j++) {
            char ca = a[i - 1], cb = b[j - 1];
            if (ca >= 'A' && ca <= 'Z') ca = (char)(ca - 'A' + 'a');
            int best = diag + (ca != cb);
            if (row[j] + 1 < best) best = row[j] + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            diag = row[j];
            row[j] = best;
        }
    }
    return row[lb];
}

/* "; did you mean 'x'?" for the closest of words[] within distance 2, or "". */
static void mf_suggest(const mf_tok *t, const char *const *words, size_t n, char *out, size_t cap) {
    int best = 3;
    const char *pick = NULL;
    for (size_t i = 0; i < n; i++) {
        if (!words[i]) continue;
        int d = mf_distance(t->s, t->len, words[i]);
        if (d < best) best = d, pick = words[i];
    }
    if (pick) snprintf(out, cap, "; did you mean '%s'?", pick);
    else if (cap) out[0] = '\0';
}

static int mf_eq(const mf_tok *t, const char *word) {
    return (size_t)t->len == strlen(word) && memcmp(t->s, word, (size_t)t->len) == 0;
}

/* A decimal integer of digits only: 0 ok, -1 not one, -2 above MF_MAX_INT. */
static int mf_int(const char *s, int len, int *out) {
    if (len <= 0) return -1;
    long v = 0;
    int big = 0;
    for (int i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return -1;
        if (!big) v = v * 10 + (s[i] - '0');
        if (v > MF_MAX_INT) big = 1;
    }
    if (big) return -2;
    *out = (int)v;
    return 0;
}

/* A probability written DIGITS[.DIGITS] or .DIGITS in [0, 1): 0 ok, -1 not. */
static int mf_prob(const char *s, int len, float *out) {
    double mant = 0, scale = 1;
    int digits = 0, dot = 0;
    for (int i = 0; i < len; i++) {
        if (s[i] == '.' && !dot) {
            dot = 1;
        } else if (s[i] >= '0' && s[i] <= '9') {
            if (++digits > 15) return -1; /* beyond what a double holds exactly */
            mant = mant * 10 + (s[i] - '0');
            if (dot) scale *= 10;
        } else {
            return -1;
        }
    }
    if (digits == 0) return -1;
    double v = mant / scale; /* both exact, so v is correctly rounded */
    if (!(v < 1.0)) return -1;
    *out = (float)v;
    return *out < 1.0f ? 0 : -1; /* 0.999999999 is 1 as a float */
}

/* A number written DIGITS[.DIGITS][e[-]DIGITS] (like 0.02 or 2e-2): 0 ok, -1 not. */
static int mf_number(const char *s, int len, float *out) {
    char buf[32];
    if (len <= 0 || len >= (int)sizeof buf) return -1;
    for (int i = 0; i < len; i++)
        if (!((s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == 'e' || s[i] == 'E' ||
              (s[i] == '-' && i > 0 && (s[i - 1] == 'e' || s[i - 1] == 'E'))))
            return -1;
    memcpy(buf, s, (size_t)len);
    buf[len] = '\0';
    char *end = NULL;
    double v = strtod(buf, &end);
    if (end != buf + len || !(v == v) || v > 1e30) return -1;
    *out = (float)v;
    return 0;
}

/* The comma-separated names of the keys in mask, into out. */
static void mf_key_list(unsigned mask, char *out, size_t cap) {
    size_t at = 0;
    out[0] = '\0';
    for (int k = 0; k < K_COUNT; k++) {
        if (!(mask & KB(k))) continue;
        int w = snprintf(out + at, cap - at, "%s%s", at ? ", " : "", mf_key_names[k]);
        if (w < 0 || (size_t)w >= cap - at) return;
        at += (size_t)w;
    }
}

static fr_status mf_key_value(mf_parser *p, const mf_stmt *st, const mf_tok *t, mf_args *a) {
    const char *eq = memchr(t->s, '=', (size_t)t->len);
    mf_tok key = {t->s, (int)(eq - t->s), t->col};
    mf_tok val = {eq + 1, t->len - key.len - 1, t->col + key.len + 1};
    int k = 0;
    while (k < K_COUNT && !mf_eq(&key, mf_key_names[k])) k++;
    if (k == K_COUNT || !(st->keys & KB(k))) {
        if (!st->keys)
            return mf_fail(p, t->col,
                           "unknown key '%.*s%s': %s takes no key=value options (usage: %s)",
                           MF_Q(key), st->word, st->usage);
        char known[128], hint[64];
        const char *names[K_COUNT] = {0};
        for (int i = 0; i < K_COUNT; i++)
            if (st->keys & KB(i)) names[i] = mf_key_names[i];
        mf_suggest(&key, names, K_COUNT, hint, sizeof hint);
        mf_key_list(st->keys, known, sizeof known);
        return mf_fail(p, t->col, "unknown key '%.*s%s' for %s (known: %s)%s", MF_Q(key), st->word,
                       known, hint);
    }
    if (a->key_col[k])
        return mf_fail(p, t->col, "duplicate key '%s' (first given at column %d)", mf_key_names[k],
                       a->key_col[k]);
    if (val.len == 0)
        return mf_fail(p, t->col, "%s=: missing value (write %s=VALUE, no spaces around '=')",
                       mf_key_names[k], mf_key_names[k]);
    switch ((mf_key)k) {
    case K_KERNEL:
    case K_STRIDE:
    case K_PADDING: {
        int v = 0, r = mf_int(val.s, val.len, &v);
        int positive = k != K_PADDING;
        if (r == -2) return mf_fail(p, t->col, "%.*s%s: must be at most %d", MF_Q(*t), MF_MAX_INT);
        if (r != 0 || (positive && v == 0))
            return mf_fail(p, t->col, "%.*s%s: must be a %s integer", MF_Q(*t),
                           positive ? "positive" : "non-negative");
        a->key[k] = v;
        break;
    }
    case K_HEADS: {
        int v = 0, r = mf_int(val.s, val.len, &v);
        if (r != 0 || v == 0)
            return mf_fail(p, t->col, "%.*s%s: must be a positive integer", MF_Q(*t));
        a->key[k] = v;
        break;
    }
    case K_STD: {
        float v = 0.0f;
        if (mf_number(val.s, val.len, &v) != 0 || !(v > 0.0f))
            return mf_fail(p, t->col, "%.*s%s: must be a positive number, like 0.02", MF_Q(*t));
        a->std = v;
        break;
    }
    case K_APPROXIMATE:
        if (mf_eq(&val, "tanh")) a->key[k] = 1;
        else if (mf_eq(&val, "none")) a->key[k] = 0;
        else return mf_fail(p, t->col, "%.*s%s: must be none or tanh", MF_Q(*t));
        break;
    case K_CAUSAL:
        if (!mf_eq(&val, "true"))
            return mf_fail(p, t->col,
                           "%.*s%s: only causal attention is supported (causal=true, the default)",
                           MF_Q(*t));
        a->key[k] = 1;
        break;
    case K_BIAS:
    case K_CHECKPOINT:
        if (mf_eq(&val, "true")) a->key[k] = 1;
        else if (mf_eq(&val, "false")) a->key[k] = 0;
        else return mf_fail(p, t->col, "%.*s%s: must be true or false", MF_Q(*t));
        break;
    case K_NAME:
    case K_TIE:
        if (val.len > MF_MAX_NAME)
            return mf_fail(p, t->col, "name=%.*s...: a name is at most %d characters", 20, val.s,
                           MF_MAX_NAME);
        for (int i = 0; i < val.len; i++) {
            char c = val.s[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '.' || c == '-'))
                return mf_fail(p, val.col + i,
                               "%.*s%s: a name is letters, digits, '_', '-' and '.' "
                               "(like layer1.0.conv1); '%c' is not allowed",
                               MF_Q(*t), c);
        }
        memcpy(k == K_NAME ? a->name : a->tie, val.s, (size_t)val.len);
        (k == K_NAME ? a->name : a->tie)[val.len] = '\0';
        break;
    case K_COUNT: break;
    }
    a->key_col[k] = t->col;
    return FR_OK;
}

static fr_status mf_positional(mf_parser *p, const mf_stmt *st, const mf_tok *t, mf_args *a) {
    if (a->n >= st->pos_max)
        return mf_fail(p, t->col, "unexpected '%.*s%s' (usage: %s)", MF_Q(*t), st->usage);
    const char *what = st->pos_name[a->n];
    switch (st->pos) {
    case P_INT: {
        int v = 0, r = mf_int(t->s, t->len, &v);
        if (r == -2)
            return mf_fail(p, t->col, "%s %s '%.*s%s': must be at most %d", st->word, what,
                           MF_Q(*t), MF_MAX_INT);
        if (r != 0 || v == 0)
            return mf_fail(p, t->col, "%s %s '%.*s%s': must be a positive integer", st->word, what,
                           MF_Q(*t));
        a->v[a->n] = v;
        break;
    }
    case P_PROB:
        if (mf_prob(t->s, t->len, &a->p) != 0)
            return mf_fail(p, t->col, "%s %s '%.*s%s': must be a number in [0, 1), like 0.25",
                           st->word, what, MF_Q(*t));
        break;
    case P_LOSS: {
        size_t i = 0;
        while (i < MF_N_LOSSES && !mf_eq(t, mf_loss_names[i])) i++;
        if (i == MF_N_LOSSES) {
            char hint[64];
            mf_suggest(t, mf_loss_names, MF_N_LOSSES, hint, sizeof hint);
            return mf_fail(p, t->col, "unknown loss '%.*s%s' (known: cross_entropy, mse)%s",
                           MF_Q(*t), hint);
        }
        a->loss = (fr_loss)i;
        break;
    }
    case P_NONE: break;
    }
    a->n++;
    return FR_OK;
}

/* name inside the open repeats: PREFIX.i.name for each, outermost first. */
static void mf_prefixed(const mf_parser *p, const char *name, char *out, size_t cap) {
    size_t at = 0;
    out[0] = '\0';
    for (int d = 0; d < p->depth; d++) {
        const mf_open *o = &p->open[d];
        if (!o->repeat) continue;
        int n =
            snprintf(out + at, cap - at, "%s%s%d.", o->prefix, o->prefix[0] ? "." : "", o->iter);
        if (n < 0 || (size_t)n >= cap - at) return;
        at += (size_t)n;
    }
    snprintf(out + at, cap - at, "%s", name);
}

/* `repeat N [name=PREFIX]` opens a body read N times; its `end` reads it
 * again from the line after the `repeat` until the N-th time. A repeat
 * outside any block is a checkpointing unit per iteration (a transformer
 * block). */
static fr_status mf_repeat(mf_parser *p, const mf_stmt *st, const mf_args *a, int col) {
    fr_status s;
    if (st->kind == S_REPEAT) {
        if (p->depth == MF_MAX_DEPTH)
            return mf_fail(p, col, "blocks nest at most %d deep", MF_MAX_DEPTH);
        if (a->v[0] > MF_MAX_REPEAT)
            return mf_fail(p, col, "repeat %d: at most %d", a->v[0], MF_MAX_REPEAT);
        mf_open o = {.line = p->line,
                     .col = col,
                     .repeat = 1,
                     .count = a->v[0],
                     .block = p->depth == 0,
                     .body = p->next};
        snprintf(o.prefix, sizeof o.prefix, "%s", a->name);
        if (o.block && (s = fr_model_block_begin(p->m)) != FR_OK) return mf_builder_failed(p, s);
        p->open[p->depth++] = o;
        return FR_OK;
    }
    mf_open *o = &p->open[p->depth - 1];
    if (o->block && (s = fr_model_block_end(p->m)) != FR_OK) return mf_builder_failed(p, s);
    if (++o->iter < o->count) {
        if (o->block && (s = fr_model_block_begin(p->m)) != FR_OK) return mf_builder_failed(p, s);
        p->jump = o->body;
        p->jump_line = o->line;
        return FR_OK;
    }
    p->depth--;
    return FR_OK;
}

/* The statement at the current line, already split into tokens. */
static fr_status mf_statement(mf_parser *p, const mf_tok *tok, int n_tok) {
    const mf_tok *w = &tok[0];
    const mf_stmt *st = NULL;
    for (size_t i = 0; i < MF_N_STMTS && !st; i++)
        if (mf_eq(w, mf_stmts[i].word)) st = &mf_stmts[i];
    if (!st) {
        const char *words[MF_N_STMTS];
        char known[512], hint[64];
        size_t at = 0;
        for (size_t i = 0; i < MF_N_STMTS; i++) {
            words[i] = mf_stmts[i].word;
            int n = snprintf(known + at, sizeof known - at, "%s%s", i ? ", " : "", words[i]);
            if (n > 0 && (size_t)n < sizeof known - at) at += (size_t)n;
        }
        mf_suggest(w, words, MF_N_STMTS, hint, sizeof hint);
        return mf_fail(p, w->col, "unknown layer '%.*s%s' (known: %s)%s", MF_Q(*w), known, hint);
    }

    /* "kernel = 3" would read as three words: say what is wrong first. */
    for (int i = 1; i < n_tok; i++)
        if (tok[i].s[0] == '=')
            return mf_fail(p, tok[i].col,
                           "'%.*s%s': a key is missing before '=' (write key=value, no spaces "
                           "around '=')",
                           MF_Q(tok[i]));
    if (st->kind == S_INPUT && n_tok >= 2 && mf_eq(&tok[1], "tokens")) {
        int ctx_len = 0;
        if (p->input_line)
            return mf_fail(p, w->col, "second 'input' line (the first is line %d)", p->input_line);
        if (n_tok != 3 || mf_int(tok[2].s, tok[2].len, &ctx_len) != 0 || ctx_len == 0)
            return mf_fail(p, n_tok > 2 ? tok[2].col : w->col,
                           "input tokens CONTEXT: CONTEXT must be one positive integer (the "
                           "positions a sample has, e.g. input tokens 256)");
        p->m = fr_model_new_tokens(p->ctx, ctx_len);
        if (!p->m) return mf_builder_failed(p, FR_ERR_ARG);
        p->input_line = p->line;
        return FR_OK;
    }
    /* "default batch N": the batch the command line uses when it gives
     * none (a language model's windows are costlier than images). */
    if (st->kind == S_DEFAULT) {
        int v = 0;
        if (!p->m)
            return mf_fail(p, w->col, "'default' before 'input': a model file starts with 'input'");
        if (n_tok != 3 || !mf_eq(&tok[1], "batch"))
            return mf_fail(p, n_tok > 1 ? tok[1].col : w->col,
                           "default takes one setting: default batch N (the samples a step "
                           "takes when the command line gives no --batch)");
        if (mf_int(tok[2].s, tok[2].len, &v) != 0 || v < 1 || v > (1 << 20))
            return mf_fail(p, tok[2].col,
                           "default batch '%.*s%s': expected a whole number from 1 "
                           "to %d",
                           MF_Q(tok[2]), 1 << 20);
        if (p->m->default_batch) return mf_fail(p, w->col, "second 'default batch' line");
        p->m->default_batch = v;
        return FR_OK;
    }
    mf_args a;
    memset(&a, 0, sizeof a);
    for (int i = 1; i < n_tok; i++) {
        fr_status s = memchr(tok[i].s, '=', (size_t)tok[i].len) ? mf_key_value(p, st, &tok[i], &a)
                                                                : mf_positional(p, st, &tok[i], &a);
        if (s) return s;
    }
    if (a.n < st->pos_min)
        return mf_fail(p, w->col, "%s: missing argument %s (usage: %s)", st->word,
                       st->pos_name[a.n], st->usage);
    for (int k = 0; k < K_COUNT; k++)
        if ((st->required & KB(k)) && !a.key_col[k])
            return mf_fail(p, w->col, "%s: missing argument %s=%s (usage: %s)", st->word,
                           mf_key_names[k], k == K_KERNEL ? "K" : "VALUE", st->usage);

    if (st->kind == S_LOSS) {
        if (p->loss_line)
            return mf_fail(p, w->col, "second 'loss' line (the first is line %d)", p->loss_line);
        if (p->depth)
            return mf_fail(p, w->col,
                           "'loss' inside the residual block opened on line %d: put it after 'end'",
                           p->open[p->depth - 1].line);
        p->loss_line = p->line;
        p->loss = a.loss;
        return FR_OK;
    }
    if (st->kind == S_INPUT) {
        if (p->input_line)
            return mf_fail(p, w->col, "second 'input' line (the first is line %d)", p->input_line);
        if (a.n == 2)
            return mf_fail(p, tok[2].col,
                           "input takes 1 number (FEATURES) or 3 (C H W), not 2: for an image "
                           "with one channel write 'input 1 %d %d'",
                           a.v[0], a.v[1]);
        int c = a.v[0], h = a.n == 3 ? a.v[1] : 1, ww = a.n == 3 ? a.v[2] : 1;
        if ((long long)c * h * ww > (long long)MF_MAX_INT * 16)
            return mf_fail(p, w->col, "input of %lld values per sample is too large (at most %lld)",
                           (long long)c * h * ww, (long long)MF_MAX_INT * 16);
        p->m = fr_model_new(p->ctx, c, h, ww);
        if (!p->m) return mf_builder_failed(p, FR_ERR_ARG);
        p->input_line = p->line;
        return FR_OK;
    }
    if (!p->m)
        return mf_fail(p, w->col,
                       "'%s' before 'input': a model file starts with 'input C H W' (an image) or "
                       "'input FEATURES' (a vector)",
                       st->word);

    /* Block structure is checked here, before the builder, to point at columns. */
    if (st->kind == S_RESIDUAL && p->depth == MF_MAX_DEPTH)
        return mf_fail(p, w->col, "residual blocks nest at most %d deep", MF_MAX_DEPTH);
    if (st->kind == S_SHORTCUT) {
        if (!p->depth || p->open[p->depth - 1].repeat)
            return mf_fail(p, w->col,
                           "'shortcut' without 'residual': it starts the second branch "
                           "of a residual block");
        mf_open *o = &p->open[p->depth - 1];
        if (o->shortcut_line)
            return mf_fail(p, w->col,
                           "second 'shortcut' in the residual block opened on line %d (the first "
                           "is line %d)",
                           o->line, o->shortcut_line);
    }
    if (st->kind == S_END && !p->depth)
        return mf_fail(p, w->col, "'end' without 'residual' or 'repeat': nothing to close");
    if (st->kind == S_REPEAT || (st->kind == S_END && p->open[p->depth - 1].repeat))
        return mf_repeat(p, st, &a, w->col);

    fr_status s = st->build(p->m, &a);
    if (s) return mf_builder_failed(p, s);
    if (has(&a, K_NAME)) {
        char full[2 * MF_MAX_NAME + 64];
        mf_prefixed(p, a.name, full, sizeof full);
        if ((s = fr_model_name_last(p->m, full)) != FR_OK) return mf_builder_failed(p, s);
    }
    if (has(&a, K_STD) && (s = fr_model_init_std_last(p->m, a.std)) != FR_OK)
        return mf_builder_failed(p, s);
    if (has(&a, K_TIE) && (s = fr_model_tie_last(p->m, a.tie)) != FR_OK)
        return mf_builder_failed(p, s);
    int ckpt = has(&a, K_CHECKPOINT) && a.key[K_CHECKPOINT];
    if (ckpt && st->kind == S_LAYER && (s = fr_model_checkpoint_last(p->m)) != FR_OK)
        return mf_builder_failed(p, s);
    if (st->kind == S_END && p->open[p->depth - 1].checkpoint &&
        (s = fr_model_checkpoint_last(p->m)) != FR_OK)
        return mf_builder_failed(p, s);

    p->n_layers++;
    switch (st->kind) {
    case S_RESIDUAL:
        p->open[p->depth++] = (mf_open){.line = p->line, .col = w->col, .checkpoint = ckpt};
        break;
    case S_SHORTCUT: p->open[p->depth - 1].shortcut_line = p->line; break;
    case S_END: p->depth--; break;
    case S_LAYER:
    case S_INPUT:
    case S_LOSS:
    case S_DEFAULT:
    case S_REPEAT: break;
    }
    return FR_OK;
}

/* One line (without its '\n'): check bytes, drop the comment, split, run. */
static fr_status mf_line(mf_parser *p, const char *s, size_t len) {
    if (len > MF_MAX_LINE)
        return mf_fail(p, MF_MAX_LINE + 1, "line is longer than %d characters", MF_MAX_LINE);
    mf_tok tok[MF_MAX_LINE / 2 + 1];
    int n_tok = 0;
    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        if (c == '#') break;
        if (c == ' ' || c == '\t' || c == '\r') {
            i++;
            continue;
        }
        if (c < 0x21 || c > 0x7e)
            return mf_fail(p, (int)i + 1,
                           "unexpected byte 0x%02x: outside comments a model file is plain ASCII",
                           c);
        size_t j = i;
        while (j < len && (unsigned char)s[j] > 0x20 && (unsigned char)s[j] < 0x7f && s[j] != '#')
            j++;
        tok[n_tok++] = (mf_tok){s + i, (int)(j - i), (int)i + 1};
        i = j;
    }
    return n_tok ? mf_statement(p, tok, n_tok) : FR_OK;
}

fr_model *fr_model_parse(fr_ctx *ctx, const char *name, const char *text, size_t len) {
    if (!ctx) return NULL;
    if (!name) name = "<model>";
    if (!text && len) {
        fr_fail(ctx, FR_ERR_ARG, "%s: no text given", name);
        return NULL;
    }
    if (!text) text = ""; /* NULL + 0 is undefined */
    if (len > MF_MAX_TEXT) {
        fr_fail(ctx, FR_ERR_FORMAT, "%s: %zu bytes is too large for a model file (at most %u)",
                name, len, MF_MAX_TEXT);
        return NULL;
    }
    mf_parser p;
    memset(&p, 0, sizeof p);
    p.ctx = ctx;
    p.file = name;
    const char *s = text, *end = text + len;
    fr_status st = FR_OK;
    long expanded = 0;
    while (st == FR_OK && s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        p.line++;
        p.next = nl ? nl + 1 : end;
        if (++expanded > MF_MAX_EXPANDED) {
            st = mf_fail(&p, 1, "the repeats expand to more than %d lines", MF_MAX_EXPANDED);
            break;
        }
        st = mf_line(&p, s, (size_t)(le - s));
        s = p.next;
        if (p.jump) {
            s = p.jump;
            p.line = p.jump_line;
            p.jump = NULL;
        }
    }
    if (st == FR_OK && p.depth) {
        const mf_open *o = &p.open[p.depth - 1];
        st = mf_fail_at(&p, o->line, o->col, "'%s' is never closed: the file ends before its 'end'",
                        o->repeat ? "repeat" : "residual");
    }
    if (st == FR_OK && !p.m)
        st = mf_fail_at(&p, 1, 1,
                        "no 'input' line: a model file starts with 'input C H W' (an image) or "
                        "'input FEATURES' (a vector)");
    if (st == FR_OK && p.n_layers == 0)
        st = mf_fail_at(&p, p.input_line, 1, "no layers after 'input'");
    if (st == FR_OK && p.loss_line) {
        p.line = p.loss_line;
        st = fr_model_set_loss(p.m, p.loss);
        if (st) mf_builder_failed(&p, st);
    }
    if (st != FR_OK) {
        fr_model_free(p.m);
        return NULL;
    }
    return p.m;
}

/* ---- files ------------------------------------------------------------- */

/* Read a whole file into an fr_alloc'd buffer of *len bytes. fr_open_regular
 * refuses what is not a regular file (a FIFO would block open() and read()
 * forever), the size is checked before anything is allocated, and one byte
 * more than that size is asked for, so a file that grows meanwhile is seen. */
static char *mf_read(fr_ctx *ctx, const char *path, size_t *len) {
    uint64_t size = 0;
    int fd = fr_open_regular(ctx, path, "model file", &size);
    if (fd < 0) return NULL;
    if (size > MF_MAX_TEXT) {
        close(fd);
        fr_fail(ctx, FR_ERR_FORMAT, "%s: %llu bytes is too large for a model file (at most %u)",
                path, (unsigned long long)size, MF_MAX_TEXT);
        return NULL;
    }
    size_t cap = (size_t)size + 1, n = 0;
    char *buf = fr_alloc(ctx, cap, FR_MEM_OTHER);
    if (!buf) {
        char msg[FR_ERR_LEN];
        snprintf(msg, sizeof msg, "%s", fr_last_error(ctx));
        close(fd);
        fr_fail(ctx, FR_ERR_NOMEM, "%s: cannot read the model file: %s", path, msg);
        return NULL;
    }
    while (n < cap) {
        ssize_t got = read(fd, buf + n, cap - n);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            int e = errno;
            fr_fail(ctx, FR_ERR_IO, "%s: cannot read the model file: %s", path, strerror(e));
            break;
        }
        if (got == 0) {
            close(fd);
            *len = n;
            return buf;
        }
        n += (size_t)got;
    }
    if (n == cap) fr_fail(ctx, FR_ERR_IO, "%s: the model file grew while it was read", path);
    close(fd);
    fr_free(ctx, buf);
    return NULL;
}

/* ---- the built-in models (identical to the files in models/) ---------- */

static const char mf_mlp_text[] =
    "# mlp.model: the seed MLP, nn.Linear(1000, 2000) -> ReLU -> nn.Linear(2000, 10).\n"
    "# The names give the seed's state_dict: fc1.weight, fc1.bias, fc2.weight, fc2.bias.\n"
    "input 1000\n"
    "linear 2000 name=fc1\n"
    "relu\n"
    "linear 10 name=fc2\n";

static const char mf_cnn_text[] =
    "# cnn.model: the default Fashion-MNIST CNN (why this one: models/README.md).\n"
    "# Two conv-batchnorm-relu-maxpool stages, then a 128-unit hidden layer.\n"
    "# The convs have no bias: the batchnorm after each cancels it.\n"
    "input 1 28 28\n"
    "\n"
    "conv2d 32 kernel=3 padding=1 bias=false name=conv1      # 32x28x28\n"
    "batchnorm name=bn1\n"
    "relu\n"
    "maxpool2d 2                                             # 32x14x14\n"
    "\n"
    "conv2d 64 kernel=3 padding=1 bias=false name=conv2      # 64x14x14\n"
    "batchnorm name=bn2\n"
    "relu\n"
    "maxpool2d 2                                             # 64x7x7\n"
    "\n"
    "flatten                                                 # 3136\n"
    "linear 128 name=fc1\n"
    "relu\n"
    "linear 10 name=fc2\n"
    "loss cross_entropy\n";

static const char mf_resnet_text[] =
    "# resnet.model: a small ResNet for 1x28x28 images (Fashion-MNIST), after\n"
    "# He et al.'s CIFAR ResNets: a 3x3 stem, three stages of two BasicBlocks with\n"
    "# 16, 32 and 64 channels, global average pooling and a linear classifier.\n"
    "# A BasicBlock is conv-bn-relu-conv-bn plus a shortcut, then relu after the\n"
    "# add. The first block of stages 2 and 3 halves H and W (stride 2) and its\n"
    "# shortcut is a 1x1 conv with stride 2 and a batchnorm. Names follow\n"
    "# torchvision's ResNet (conv1, layer2.0.downsample.0, fc, ...).\n"
    "input 1 28 28\n"
    "\n"
    "conv2d 16 kernel=3 padding=1 bias=false name=conv1          # 16x28x28\n"
    "batchnorm name=bn1\n"
    "relu\n"
    "\n"
    "# stage 1: 16 channels, 28x28\n"
    "residual name=layer1.0\n"
    "  conv2d 16 kernel=3 padding=1 bias=false name=layer1.0.conv1\n"
    "  batchnorm name=layer1.0.bn1\n"
    "  relu\n"
    "  conv2d 16 kernel=3 padding=1 bias=false name=layer1.0.conv2\n"
    "  batchnorm name=layer1.0.bn2\n"
    "end\n"
    "relu\n"
    "residual name=layer1.1\n"
    "  conv2d 16 kernel=3 padding=1 bias=false name=layer1.1.conv1\n"
    "  batchnorm name=layer1.1.bn1\n"
    "  relu\n"
    "  conv2d 16 kernel=3 padding=1 bias=false name=layer1.1.conv2\n"
    "  batchnorm name=layer1.1.bn2\n"
    "end\n"
    "relu\n"
    "\n"
    "# stage 2: 32 channels, 14x14\n"
    "residual name=layer2.0\n"
    "  conv2d 32 kernel=3 stride=2 padding=1 bias=false name=layer2.0.conv1\n"
    "  batchnorm name=layer2.0.bn1\n"
    "  relu\n"
    "  conv2d 32 kernel=3 padding=1 bias=false name=layer2.0.conv2\n"
    "  batchnorm name=layer2.0.bn2\n"
    "shortcut\n"
    "  conv2d 32 kernel=1 stride=2 bias=false name=layer2.0.downsample.0\n"
    "  batchnorm name=layer2.0.downsample.1\n"
    "end\n"
    "relu\n"
    "residual name=layer2.1\n"
    "  conv2d 32 kernel=3 padding=1 bias=false name=layer2.1.conv1\n"
    "  batchnorm name=layer2.1.bn1\n"
    "  relu\n"
    "  conv2d 32 kernel=3 padding=1 bias=false name=layer2.1.conv2\n"
    "  batchnorm name=layer2.1.bn2\n"
    "end\n"
    "relu\n"
    "\n"
    "# stage 3: 64 channels, 7x7\n"
    "residual name=layer3.0\n"
    "  conv2d 64 kernel=3 stride=2 padding=1 bias=false name=layer3.0.conv1\n"
    "  batchnorm name=layer3.0.bn1\n"
    "  relu\n"
    "  conv2d 64 kernel=3 padding=1 bias=false name=layer3.0.conv2\n"
    "  batchnorm name=layer3.0.bn2\n"
    "shortcut\n"
    "  conv2d 64 kernel=1 stride=2 bias=false name=layer3.0.downsample.0\n"
    "  batchnorm name=layer3.0.downsample.1\n"
    "end\n"
    "relu\n"
    "residual name=layer3.1\n"
    "  conv2d 64 kernel=3 padding=1 bias=false name=layer3.1.conv1\n"
    "  batchnorm name=layer3.1.bn1\n"
    "  relu\n"
    "  conv2d 64 kernel=3 padding=1 bias=false name=layer3.1.conv2\n"
    "  batchnorm name=layer3.1.bn2\n"
    "end\n"
    "relu\n"
    "\n"
    "global_avgpool                                               # 64\n"
    "linear 10 name=fc\n"
    "loss cross_entropy\n";

static const char mf_gpt_tiny_text[] =
    "# gpt-tiny.model: a byte-level GPT: 6 layers, 6 heads, d_model 384, context 256,\n"
    "# vocabulary 256 (bytes), MLP 4x, lm_head tied to wte, no dropout.\n"
    "# nanoGPT's GPT (same state_dict names, so its checkpoints load into nanoGPT's\n"
    "# GPT unchanged), with GPT-2's initialisation: N(0, 0.02), the residual\n"
    "# projections N(0, 0.02/sqrt(2*layers)), biases 0.\n"
    "input tokens 256\n"
    "default batch 8                                 # 8 windows of 256 bytes a step\n"
    "embedding 256 384 std=0.02 name=transformer.wte\n"
    "pos_embedding 256 std=0.02 name=transformer.wpe\n"
    "repeat 6 name=transformer.h                    # one checkpointing unit a block\n"
    "  residual                                      # x + attn(ln_1(x))\n"
    "    layernorm 384 name=ln_1\n"
    "    linear 1152 std=0.02 name=attn.c_attn          # q, k, v\n"
    "    attention heads=6                           # causal, in tiles: no TxT matrix\n"
    "    linear 384 std=0.00577 name=attn.c_proj\n"
    "  end\n"
    "  residual                                      # x + mlp(ln_2(x))\n"
    "    layernorm 384 name=ln_2\n"
    "    linear 1536 std=0.02 name=mlp.c_fc\n"
    "    gelu approximate=tanh\n"
    "    linear 384 std=0.00577 name=mlp.c_proj\n"
    "  end\n"
    "end\n"
    "layernorm 384 name=transformer.ln_f\n"
    "linear 256 bias=false tie=transformer.wte name=lm_head\n"
    "loss cross_entropy\n";

static const char mf_gpt2_text[] =
    "# gpt2.model: GPT-2 124M: 12 layers, 12 heads, d_model 768, context 1024,\n"
    "# vocabulary 50257, MLP 4x, lm_head tied to wte (124,439,808 parameters).\n"
    "# nanoGPT's GPT (same state_dict names, so its checkpoints load into nanoGPT's\n"
    "# GPT unchanged), with GPT-2's initialisation: N(0, 0.02), the residual\n"
    "# projections N(0, 0.02/sqrt(2*layers)), biases 0.\n"
    "input tokens 1024\n"
    "default batch 4                                 # 4 windows of 1024 tokens a step\n"
    "embedding 50257 768 std=0.02 name=transformer.wte\n"
    "pos_embedding 1024 std=0.02 name=transformer.wpe\n"
    "repeat 12 name=transformer.h                    # one checkpointing unit a block\n"
    "  residual                                      # x + attn(ln_1(x))\n"
    "    layernorm 768 name=ln_1\n"
    "    linear 2304 std=0.02 name=attn.c_attn          # q, k, v\n"
    "    attention heads=12                           # causal, in tiles: no TxT matrix\n"
    "    linear 768 std=0.00408 name=attn.c_proj\n"
    "  end\n"
    "  residual                                      # x + mlp(ln_2(x))\n"
    "    layernorm 768 name=ln_2\n"
    "    linear 3072 std=0.02 name=mlp.c_fc\n"
    "    gelu approximate=tanh\n"
    "    linear 768 std=0.00408 name=mlp.c_proj\n"
    "  end\n"
    "end\n"
    "layernorm 768 name=transformer.ln_f\n"
    "linear 50257 bias=false tie=transformer.wte name=lm_head\n"
    "loss cross_entropy\n";

typedef struct mf_builtin {
    const char *name, *file, *text;
} mf_builtin;

static const mf_builtin mf_builtins[] = {
    {"mlp", "mlp.model", mf_mlp_text},          {"cnn", "cnn.model", mf_cnn_text},
    {"resnet", "resnet.model", mf_resnet_text}, {"gpt-tiny", "gpt-tiny.model", mf_gpt_tiny_text},
    {"gpt2", "gpt2.model", mf_gpt2_text},
};
#define MF_N_BUILTINS (sizeof mf_builtins / sizeof mf_builtins[0])

const char *fr_modelfile_builtin(const char *name) {
    for (size_t i = 0; name && i < MF_N_BUILTINS; i++)
        if (strcmp(name, mf_builtins[i].name) == 0) return mf_builtins[i].text;
    return NULL;
}

fr_model *fr_model_load(fr_ctx *ctx, const char *file_or_name) {
    if (!ctx) return NULL;
    if (!file_or_name || !file_or_name[0]) {
        fr_fail(ctx, FR_ERR_ARG,
                "fr_model_load: no file or built-in name given (built-ins: mlp, cnn, resnet)");
        return NULL;
    }
    for (size_t i = 0; i < MF_N_BUILTINS; i++)
        if (strcmp(file_or_name, mf_builtins[i].name) == 0)
            return fr_model_parse(ctx, mf_builtins[i].file, mf_builtins[i].text,
                                  strlen(mf_builtins[i].text));
    /* a Hugging Face config.json, or a model directory holding one */
    struct stat sb;
    size_t len = strlen(file_or_name);
    if (len >= 5 && !strcmp(file_or_name + len - 5, ".json"))
        return fr_model_from_hf(ctx, file_or_name);
    if (stat(file_or_name, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        char cfg[4096];
        snprintf(cfg, sizeof cfg, "%s/config.json", file_or_name);
        if (access(cfg, F_OK) == 0) return fr_model_from_hf(ctx, file_or_name);
        fr_fail(ctx, FR_ERR_ARG,
                "%s: the model file is a directory without config.json (a Hugging Face model "
                "directory holds one; a model file is a regular file)",
                file_or_name);
        return NULL;
    }
    char *text = mf_read(ctx, file_or_name, &len);
    if (!text) return NULL;
    fr_model *m = fr_model_parse(ctx, file_or_name, text, len);
    fr_free(ctx, text);
    return m;
}
