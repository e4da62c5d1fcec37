/* rules.c — the update rules' table: one row per fr_optim_kind with
 * everything the engine asks of a rule but its arithmetic: its name (for
 * --optimizer and the checkpoint's metadata) and title (for reports),
 * PyTorch's defaults, its state buffers (how many for given options and
 * their state_dict names), whether that state may be compressed, whether
 * the step may be made in LINEAR_BWD's GEMM epilogue, and what it costs on
 * 16-bit weights. A new rule is a kind in frugal.h, a row here and its
 * kernels in each backend (their optim_update: backend/cpu/optim.c,
 * backend/opencl/optim.c); train/ and run/ ask this table (optim.h) and
 * name no rule. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include "backend/state.h"
#include "core/ctx.h"
#include "optim/optim.h"

/* fr_step_opts.optim_state reaches the kernels as an fr_state_kind. */
_Static_assert(FR_OPTIM_STATE_FP32 == (int)FR_STATE_F32 &&
                   FR_OPTIM_STATE_BF16 == (int)FR_STATE_BF16 &&
                   FR_OPTIM_STATE_INT8 == (int)FR_STATE_INT8,
               "fr_optim_state and fr_state_kind number the formats alike");

typedef struct fr_optim_rule {
    const char *name;  /* --optimizer NAME (any letter case) and the checkpoint's "optimizer" */
    const char *title; /* in reports */
    /* torch.optim's defaults (PyTorch 2.x); fields the rule does not use stay 0 */
    double lr, beta1, beta2, eps, weight_decay;
    /* the state buffers it keeps for options o (at most 2), and their names
     * in PyTorch's optimizer.state_dict()["state"][i] */
    int (*states)(const fr_optim_opts *o);
    const char *state_names[2];
    int compressible; /* the state may be stored bf16 or int8 (--optimizer-state) */
    /* for options o, the step needs nothing but the gradient: LINEAR_BWD may
     * make it in its GEMM epilogue (plan/fuse.h); NULL: never */
    int (*in_gemm)(const fr_optim_opts *o);
    int f32_copies; /* on 16-bit weights the kernel works on f32 copies of one tensor */
    int squares;    /* the state holds squared gradients, which pure fp16 underflows */
    int momentum;   /* takes --momentum, --dampening and --nesterov */
    /* Adafactor's defaults: beta2_decay, eps2 (PyTorch's eps[1]) and the
     * update clipping threshold d */
    double beta2_decay, eps2, clip_threshold;
    /* the parts of one parameter's state (names, blocks, offsets, shapes) and
     * the floats it takes in each block; NULL: elementwise (a part of the
     * parameter's shape per block, at offset 0) */
    int (*parts)(const fr_optim_opts *o, const fr_shape *s, fr_state_part *out);
    size_t (*elems)(const fr_optim_opts *o, const fr_shape *s);
    /* the step needs the whole tensor (a factored state): no ZeRO shard, f32
     * weights (a master copy under mixed precision) and f32 state */
    int whole_tensor;
} fr_optim_rule;

static int sgd_states(const fr_optim_opts *o) { return o->momentum != 0.0f ? 1 : 0; }
static int sgd_in_gemm(const fr_optim_opts *o) { return o->momentum == 0.0f; }
static int adam_states(const fr_optim_opts *o) {
    (void)o;
    return 2;
}

/* Adafactor (backend/state.h's fr_factored layout): row_var (..., R, 1) and
 * col_var (..., 1, C) for a matrix, variance for a vector; exp_avg with a
 * first moment. */
static int adafactor_parts(const fr_optim_opts *o, const fr_shape *s, fr_state_part *out) {
    fr_factored f = fr_factored_of(s);
    int n = 0;
    if (f.factored) {
        out[n] = (fr_state_part){"row_var", 0, 0, *s};
        out[n++].shape.d[s->ndim - 1] = 1;
        out[n] = (fr_state_part){"col_var", 0, (size_t)(f.L * f.R), *s};
        out[n++].shape.d[s->ndim - 2] = 1;
    } else {
        out[n++] = (fr_state_part){"variance", 0, 0, *s};
    }
    if (o->beta1 != 0.0) out[n++] = (fr_state_part){"exp_avg", 0, (size_t)f.first_at, *s};
    return n;
}
static size_t adafactor_elems(const fr_optim_opts *o, const fr_shape *s) {
    fr_factored f = fr_factored_of(s);
    return fr_factored_floats(&f, o->beta1 != 0.0);
}
static int one_state(const fr_optim_opts *o) {
    (void)o;
    return 1;
}

/* SGD has no default lr in PyTorch (it is required); 0.01 is ours. */
static const fr_optim_rule rules[] = {
    [FR_OPTIM_SGD] = {.name = "sgd",
                      .title = "SGD",
                      .lr = 0.01,
                      .states = sgd_states,
                      .state_names = {"momentum_buffer"},
                      .in_gemm = sgd_in_gemm,
                      .f32_copies = 1,
                      .momentum = 1},
    [FR_OPTIM_ADAM] = {.name = "adam",
                       .title = "Adam",
                       .lr = 1e-3,
                       .beta1 = 0.9,
                       .beta2 = 0.999,
                       .eps = 1e-8,
                       .states = adam_states,
                       .state_names = {"exp_avg", "exp_avg_sq"},
                       .compressible = 1,
                       .squares = 1},
    [FR_OPTIM_ADAMW] = {.name = "adamw",
                        .title = "AdamW",
                        .lr = 1e-3,
                        .beta1 = 0.9,
                        .beta2 = 0.999,
                        .eps = 1e-8,
                        .weight_decay = 1e-2,
                        .states = adam_states,
                        .state_names = {"exp_avg", "exp_avg_sq"},
                        .compressible = 1,
                        .squares = 1},
    /* torch.optim.Adafactor (2.5): lr is the relative step's cap; eps 0
     * stands for eps1 = None, float32's machine epsilon */
    [FR_OPTIM_ADAFACTOR] = {.name = "adafactor",
                            .title = "Adafactor",
                            .lr = 1e-2,
                            .beta2_decay = -0.8,
                            .eps2 = 1e-3,
                            .clip_threshold = 1.0,
                            .states = one_state,
                            .parts = adafactor_parts,
                            .elems = adafactor_elems,
                            .squares = 1,
                            .whole_tensor = 1},
};
_Static_assert(sizeof rules / sizeof rules[0] == FR_OPTIM_KINDS,
               "one row per fr_optim_kind (FR_OPTIM_KINDS in optim.h)");

/* A kind outside the table (a caller's bad value) reads as a rule of no
 * name, no state and no capability. */
static const fr_optim_rule *rule_of(fr_optim_kind kind) {
    static const fr_optim_rule unknown = {.name = "?", .title = "?"};
    return (unsigned)kind < FR_OPTIM_KINDS && rules[kind].name ? &rules[kind] : &unknown;
}

fr_optim_opts fr_optim_defaults(fr_optim_kind kind) {
    const fr_optim_rule *r = rule_of(kind);
    fr_optim_opts o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.zero_grad_to_none = 1; /* zero_grad(set_to_none=True), the 2.x default */
    o.lr = r->lr, o.beta1 = r->beta1, o.beta2 = r->beta2, o.eps = r->eps;
    o.weight_decay = r->weight_decay;
    o.beta2_decay = r->beta2_decay, o.eps2 = r->eps2, o.clip_threshold = r->clip_threshold;
    return o;
}

const char *fr_optim_name(fr_optim_kind kind) { return rule_of(kind)->name; }
const char *fr_optim_title(fr_optim_kind kind) { return rule_of(kind)->title; }

int fr_optim_states(const fr_optim_opts *o) {
    const fr_optim_rule *r = rule_of(o->kind);
    return r->states ? r->states(o) : 0;
}

int fr_optim_compresses(const fr_optim_opts *o) { return rule_of(o->kind)->compressible; }

int fr_optim_in_gemm(const fr_optim_opts *o) {
    const fr_optim_rule *r = rule_of(o->kind);
    return r->in_gemm && r->in_gemm(o);
}

int fr_optim_f32_copies(const fr_optim_opts *o) { return rule_of(o->kind)->f32_copies; }
int fr_optim_squares(const fr_optim_opts *o) { return rule_of(o->kind)->squares; }
int fr_optim_takes_momentum(fr_optim_kind kind) { return rule_of(kind)->momentum; }

int fr_optim_whole_tensor(const fr_optim_opts *o) { return rule_of(o->kind)->whole_tensor; }

size_t fr_optim_state_elems(const fr_optim_opts *o, const fr_shape *s) {
    const fr_optim_rule *r = rule_of(o->kind);
    return r->elems ? r->elems(o, s) : (size_t)fr_shape_numel(s);
}

size_t fr_optim_scratch_bytes(const fr_optim_opts *o, const fr_shape *s) {
    if (!fr_optim_whole_tensor(o)) return 0;
    fr_factored f = fr_factored_of(s);
    return fr_factored_scratch(&f, NULL);
}

int fr_optim_state_parts(const fr_optim_opts *o, const fr_shape *s,
                         fr_state_part out[FR_STATE_PARTS_MAX]) {
    const fr_optim_rule *r = rule_of(o->kind);
    if (r->parts) return r->parts(o, s, out);
    int n = fr_optim_states(o);
    for (int k = 0; k < n; k++) out[k] = (fr_state_part){r->state_names[k], k, 0, *s};
    return n;
}

size_t fr_optim_state_bytes(const fr_optim_opts *o, fr_optim_state fmt, const fr_param *p,
                            int *kind) {
    size_t n = fr_optim_state_elems(o, &p->shape);
    *kind = FR_STATE_F32;
    if (fr_optim_whole_tensor(o)) return n * sizeof(float); /* f32 whatever p's dtype */
    if (p->dtype != FR_F32) return n * fr_dtype_size(p->dtype);
    if (!fr_optim_compresses(o)) return n * sizeof(float);
    *kind = fr_state_kind_for((fr_state_kind)fmt, n);
    return fr_state_bytes((fr_state_kind)*kind, n);
}

const char *fr_optim_names(char *out, size_t cap, const char *sep, const char *last) {
    size_t len = 0;
    if (cap) out[0] = '\0';
    for (int k = 0; k < FR_OPTIM_KINDS; k++) {
        const char *between = k == 0 ? "" : k == FR_OPTIM_KINDS - 1 ? last : sep;
        int w = len < cap ? snprintf(out + len, cap - len, "%s%s", between, rules[k].name)
                          : snprintf(NULL, 0, "%s%s", between, rules[k].name);
        if (w > 0) len += (size_t)w;
    }
    return out;
}

fr_status fr_optim_check(fr_ctx *ctx, const fr_optim_opts *o, fr_optim_state fmt, fr_precision prec,
                         int zero) {
    if (!fr_optim_whole_tensor(o)) return FR_OK;
    const char *name = fr_optim_name(o->kind);
    if (fmt != FR_OPTIM_STATE_FP32)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--optimizer-state %s: %s's factored state is already small and stays "
                       "fp32; use --optimizer-state fp32",
                       fmt == FR_OPTIM_STATE_BF16 ? "bf16" : "int8", name);
    if (prec == FR_PREC_FP16 || prec == FR_PREC_BF16)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--precision %s stores the weights in 16 bits, and %s steps f32 weights: "
                       "use --precision %s-mixed (f32 master weights)",
                       prec == FR_PREC_FP16 ? "fp16" : "bf16", name,
                       prec == FR_PREC_FP16 ? "fp16" : "bf16");
    if (zero >= 1)
        return fr_fail(ctx, FR_ERR_ARG,
                       "--zero %d: %s's factored state belongs to whole matrices, which ZeRO "
                       "shards at any element; use --zero 0",
                       zero, name);
    if (o->clip_threshold <= 0 || !(o->eps2 >= 0) || !(o->eps >= 0) || !(o->beta2_decay <= 0) ||
        !(o->beta1 >= 0 && o->beta1 < 1))
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: --clip-threshold %g must be > 0, --eps %g and --eps2 %g >= 0, "
                       "--beta2-decay %g <= 0 and --beta1 %g in [0, 1)",
                       name, o->clip_threshold, o->eps, o->eps2, o->beta2_decay, o->beta1);
    return FR_OK;
}

fr_status fr_optim_parse(fr_ctx *ctx, const char *name, fr_optim_kind *out) {
    for (int k = 0; name && k < FR_OPTIM_KINDS; k++) {
        const char *a = name, *b = rules[k].name;
        while (*a && *b && tolower((unsigned char)*a) == *b) a++, b++;
        if (!*a && !*b) {
            if (out) *out = (fr_optim_kind)k;
            return FR_OK;
        }
    }
    char names[128];
    return fr_fail(ctx, FR_ERR_ARG, "unknown optimizer '%s' (choose %s)", name ? name : "",
                   fr_optim_names(names, sizeof names, ", ", " or "));
}
