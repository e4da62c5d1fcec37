/* test_optim_rules.c — the update rules' table (src/optim/rules.c) against
 * facts written down by hand from PyTorch's documentation and source:
 *   - torch.optim.SGD keeps state["momentum_buffer"] only when momentum != 0;
 *     Adam and AdamW keep state["exp_avg"] and state["exp_avg_sq"] (their
 *     "step" is the checkpoint's optimizer.step; "max_exp_avg_sq" is
 *     amsgrad's, which frugal does not offer);
 *   - which rules' state is compressed (bitsandbytes' 8-bit optimizers
 *     quantize Adam's moments; frugal keeps SGD's momentum f32), which step
 *     needs nothing but the gradient (SGD without momentum:
 *     p -= lr * (g + wd * p)), which state holds squared gradients (Adam's
 *     exp_avg_sq), which takes SGD's momentum options;
 *   - every kind named, the names parsed back, listed in kind order; a kind
 *     outside the table answered without a fault.
 *   - the state's parts (names, blocks, offsets, shapes) as optimizer.state_dict()
 *     holds them, torch.optim.Adafactor's factored row_var / col_var included,
 *     and the options a whole-tensor rule refuses.
 * Prints "N passed, M failed"; exits non-zero on any failure. */
#include <string.h>
#include "check.h"
#include "optim/optim.h"

typedef struct expect {
    fr_optim_kind kind;
    const char *name, *title;
    int states_plain, states_momentum; /* momentum 0, momentum 0.9 (SGD only) */
    const char *state_names[2];
    int compresses, in_gemm_plain, f32_copies, squares, takes_momentum;
} expect;

static const expect rows[] = {
    {FR_OPTIM_SGD, "sgd", "SGD", 0, 1, {"momentum_buffer", NULL}, 0, 1, 1, 0, 1},
    {FR_OPTIM_ADAM, "adam", "Adam", 2, 2, {"exp_avg", "exp_avg_sq"}, 1, 0, 0, 1, 0},
    {FR_OPTIM_ADAMW, "adamw", "AdamW", 2, 2, {"exp_avg", "exp_avg_sq"}, 1, 0, 0, 1, 0},
    {FR_OPTIM_ADAFACTOR, "adafactor", "Adafactor", 1, 1, {"row_var", "col_var"}, 0, 0, 0, 1, 0},
};
#define N_ROWS (int)(sizeof rows / sizeof rows[0])

static void test_rows(void) {
    CHECK(N_ROWS == FR_OPTIM_KINDS, "%d rules written here, %d kinds", N_ROWS, FR_OPTIM_KINDS);
    for (int i = 0; i < N_ROWS; i++) {
        const expect *e = &rows[i];
        fr_optim_opts o = fr_optim_defaults(e->kind);
        CHECK(!strcmp(fr_optim_name(e->kind), e->name), "kind %d: name '%s', want '%s'", i,
              fr_optim_name(e->kind), e->name);
        CHECK(!strcmp(fr_optim_title(e->kind), e->title), "%s: title '%s', want '%s'", e->name,
              fr_optim_title(e->kind), e->title);
        CHECK(fr_optim_states(&o) == e->states_plain, "%s: %d states, want %d", e->name,
              fr_optim_states(&o), e->states_plain);
        CHECK(fr_optim_in_gemm(&o) == e->in_gemm_plain, "%s: in the GEMM epilogue %d, want %d",
              e->name, fr_optim_in_gemm(&o), e->in_gemm_plain);
        CHECK(fr_optim_compresses(&o) == e->compresses &&
                  fr_optim_f32_copies(&o) == e->f32_copies && fr_optim_squares(&o) == e->squares &&
                  fr_optim_takes_momentum(e->kind) == e->takes_momentum,
              "%s: compresses %d, f32 copies %d, squares %d, momentum options %d", e->name,
              fr_optim_compresses(&o), fr_optim_f32_copies(&o), fr_optim_squares(&o),
              fr_optim_takes_momentum(e->kind));
        if (e->takes_momentum) o.momentum = 0.9;
        int ns = fr_optim_states(&o);
        CHECK(ns == e->states_momentum, "%s with momentum: %d states, want %d", e->name, ns,
              e->states_momentum);
        CHECK(!fr_optim_in_gemm(&o) || !e->takes_momentum,
              "%s with momentum: a step that needs its buffer is not made in the GEMM", e->name);
        fr_state_part part[FR_STATE_PARTS_MAX];
        fr_shape w = fr_shape2(64, 100);
        int np = fr_optim_state_parts(&o, &w, part);
        CHECK(np == (ns && e->state_names[1] ? 2 : ns), "%s: %d parts of a matrix", e->name, np);
        for (int k = 0; k < np && k < 2; k++)
            CHECK(!strcmp(part[k].name, e->state_names[k]),
                  "%s: state %d is '%s', want PyTorch's '%s'", e->name, k, part[k].name,
                  e->state_names[k]);
        fr_optim_kind back = (fr_optim_kind)-1;
        CHECK(fr_optim_parse(NULL, e->name, &back) == FR_OK && back == e->kind,
              "%s: parsed back as %d", e->name, (int)back);
    }
}

/* The storage of one state buffer: SGD's momentum stays f32 whatever the
 * format asked; Adam's moments take it (a tensor under one 2048-value int8
 * block keeps f32); a 16-bit weight's state takes the weight's format. */
static void test_state_bytes(void) {
    fr_param p;
    memset(&p, 0, sizeof p);
    p.shape = fr_shape2(64, 100), p.dtype = FR_F32; /* 6400 values */
    int kind = -1;
    fr_optim_opts sgd = fr_optim_defaults(FR_OPTIM_SGD), adam = fr_optim_defaults(FR_OPTIM_ADAM);
    sgd.momentum = 0.9;
    size_t b = fr_optim_state_bytes(&sgd, FR_OPTIM_STATE_BF16, &p, &kind);
    CHECK(b == 6400 * 4 && kind == FR_OPTIM_STATE_FP32, "sgd, bf16 asked: %zu bytes, kind %d", b,
          kind);
    b = fr_optim_state_bytes(&adam, FR_OPTIM_STATE_BF16, &p, &kind);
    CHECK(b == 6400 * 2 && kind == FR_OPTIM_STATE_BF16, "adam bf16: %zu bytes, kind %d", b, kind);
    b = fr_optim_state_bytes(&adam, FR_OPTIM_STATE_INT8, &p, &kind);
    CHECK(b > 6400 && b < 6400 * 2 && kind == FR_OPTIM_STATE_INT8, "adam int8: %zu bytes, kind %d",
          b, kind);
    p.shape = fr_shape1(100);
    b = fr_optim_state_bytes(&adam, FR_OPTIM_STATE_INT8, &p, &kind);
    CHECK(b == 400 && kind == FR_OPTIM_STATE_FP32, "adam int8, 100 values: %zu bytes, kind %d", b,
          kind);
    p.dtype = FR_BF16;
    b = fr_optim_state_bytes(&adam, FR_OPTIM_STATE_INT8, &p, &kind);
    CHECK(b == 200 && kind == FR_OPTIM_STATE_FP32, "adam on bf16 weights: %zu bytes, kind %d", b,
          kind);
}

static void test_names(void) {
    char out[64];
    CHECK(!strcmp(fr_optim_names(out, sizeof out, ", ", " or "), "sgd, adam, adamw or adafactor"),
          "'%s'", out);
    CHECK(!strcmp(fr_optim_names(out, sizeof out, " | ", " | "), "sgd | adam | adamw | adafactor"),
          "'%s'", out);
    char small[8]; /* a canary past the cap: bytes 6 and 7 must stay as they are */
    memset(small, 'x', sizeof small);
    fr_optim_names(small, 6, ", ", " or "); /* cut to fit, ended */
    CHECK(!strcmp(small, "sgd, ") && small[6] == 'x' && small[7] == 'x', "cut: '%s'", small);
    fr_optim_names(small, 0, ", ", " or "); /* nothing written */
    CHECK(small[0] == 's', "cap 0 wrote");
    for (int i = 0; i < FR_OPTIM_KINDS; i++)
        for (int j = 0; j < i; j++)
            CHECK(strcmp(fr_optim_name((fr_optim_kind)i), fr_optim_name((fr_optim_kind)j)),
                  "kinds %d and %d share the name '%s'", i, j, fr_optim_name((fr_optim_kind)i));
    fr_optim_kind bad = (fr_optim_kind)FR_OPTIM_KINDS;
    fr_optim_opts o = fr_optim_defaults(bad);
    fr_state_part part[FR_STATE_PARTS_MAX];
    fr_shape w = fr_shape2(2, 3);
    CHECK(!strcmp(fr_optim_name(bad), "?") && fr_optim_states(&o) == 0 && !fr_optim_in_gemm(&o) &&
              fr_optim_state_parts(&o, &w, part) == 0 && o.lr == 0,
          "a kind outside the table");
}

/* One part as the checkpoint names it: name, block, offset in floats, shape. */
static void check_part(const char *what, const fr_state_part *p, const char *name, int block,
                       size_t off, fr_shape shape) {
    char a[64], b[64];
    CHECK(!strcmp(p->name, name) && p->block == block && p->off == off &&
              fr_shape_eq(&p->shape, &shape),
          "%s: part %s block %d at %zu %s, want %s block %d at %zu %s", what, p->name, p->block,
          p->off, fr_shape_str(&p->shape, a, sizeof a), name, block, off,
          fr_shape_str(&shape, b, sizeof b));
}

/* The parts of each rule's state, written from PyTorch's optimizer.state_dict():
 * SGD's momentum_buffer and Adam's exp_avg / exp_avg_sq have the parameter's
 * shape, one a block, at the parameter's offset (today's layout, unchanged);
 * torch.optim.Adafactor keeps row_var with the last dim 1 and col_var with
 * the second-to-last 1 for a tensor of 2 or more dims, variance for a
 * vector; frugal's optional first moment exp_avg comes after them. */
static void test_parts(void) {
    fr_state_part part[FR_STATE_PARTS_MAX];
    fr_shape s3 = fr_shape3(3, 4, 5), v = fr_shape1(11), m = fr_shape2(7, 13);
    fr_optim_opts sgd = fr_optim_defaults(FR_OPTIM_SGD), adam = fr_optim_defaults(FR_OPTIM_ADAMW);
    sgd.momentum = 0.9;
    CHECK(fr_optim_state_parts(&sgd, &s3, part) == 1, "sgd: one part");
    check_part("sgd", &part[0], "momentum_buffer", 0, 0, s3);
    CHECK(fr_optim_state_elems(&sgd, &s3) == 60, "sgd: 60 elements");
    CHECK(fr_optim_state_parts(&adam, &m, part) == 2, "adamw: two parts");
    check_part("adamw", &part[0], "exp_avg", 0, 0, m);
    check_part("adamw", &part[1], "exp_avg_sq", 1, 0, m);
    CHECK(fr_optim_state_elems(&adam, &m) == 91, "adamw: 91 elements a block");
    fr_optim_opts af = fr_optim_defaults(FR_OPTIM_ADAFACTOR);
    CHECK(af.lr == 1e-2 && af.beta2_decay == -0.8 && af.eps == 0 && af.eps2 == 1e-3 &&
              af.clip_threshold == 1.0 && af.weight_decay == 0 && af.beta1 == 0,
          "adafactor: torch.optim.Adafactor's defaults");
    CHECK(fr_optim_state_parts(&af, &s3, part) == 2, "adafactor (3,4,5): two parts");
    check_part("adafactor (3,4,5)", &part[0], "row_var", 0, 0, fr_shape3(3, 4, 1));
    check_part("adafactor (3,4,5)", &part[1], "col_var", 0, 12, fr_shape3(3, 1, 5));
    CHECK(fr_optim_state_elems(&af, &s3) == 3 * 4 + 3 * 5, "adafactor (3,4,5): %zu elements",
          fr_optim_state_elems(&af, &s3));
    CHECK(fr_optim_state_parts(&af, &m, part) == 2, "adafactor (7,13): two parts");
    check_part("adafactor (7,13)", &part[0], "row_var", 0, 0, fr_shape2(7, 1));
    check_part("adafactor (7,13)", &part[1], "col_var", 0, 7, fr_shape2(1, 13));
    CHECK(fr_optim_state_parts(&af, &v, part) == 1, "adafactor (11): one part");
    check_part("adafactor (11)", &part[0], "variance", 0, 0, v);
    CHECK(fr_optim_state_elems(&af, &v) == 11, "adafactor (11): 11 elements");
    af.beta1 = 0.9;
    CHECK(fr_optim_state_parts(&af, &s3, part) == 3, "adafactor with beta1: three parts");
    check_part("adafactor beta1", &part[2], "exp_avg", 0, 27, s3);
    CHECK(fr_optim_state_elems(&af, &s3) == 27 + 60, "adafactor beta1: 87 elements");
    CHECK(fr_optim_state_parts(&af, &v, part) == 2, "adafactor (11) beta1: two parts");
    check_part("adafactor (11) beta1", &part[1], "exp_avg", 0, 11, v);
    /* the state's bytes: f32 whatever format is asked (it is refused first) */
    fr_param p;
    memset(&p, 0, sizeof p);
    p.shape = fr_shape2(64, 100), p.dtype = FR_F32;
    int kind = -1;
    af.beta1 = 0;
    size_t b = fr_optim_state_bytes(&af, FR_OPTIM_STATE_FP32, &p, &kind);
    CHECK(b == (64 + 100) * 4 && kind == FR_OPTIM_STATE_FP32, "adafactor (64,100): %zu bytes", b);
}

/* What a whole-tensor rule refuses, each naming the option. */
static void test_refusals(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_optim_opts af = fr_optim_defaults(FR_OPTIM_ADAFACTOR),
                  adam = fr_optim_defaults(FR_OPTIM_ADAM);
    CHECK(fr_optim_check(ctx, &af, FR_OPTIM_STATE_FP32, FR_PREC_BF16_MIXED, 0) == FR_OK,
          "adafactor, fp32 state, bf16-mixed: %s", fr_last_error(ctx));
    CHECK(fr_optim_check(ctx, &adam, FR_OPTIM_STATE_INT8, FR_PREC_FP16, 2) == FR_OK,
          "adam is not checked here");
    static const struct {
        fr_optim_state fmt;
        fr_precision prec;
        int zero;
        const char *says;
    } bad[] = {{FR_OPTIM_STATE_BF16, FR_PREC_FP32, 0, "--optimizer-state bf16"},
               {FR_OPTIM_STATE_INT8, FR_PREC_FP32, 0, "--optimizer-state int8"},
               {FR_OPTIM_STATE_FP32, FR_PREC_BF16, 0, "--precision bf16"},
               {FR_OPTIM_STATE_FP32, FR_PREC_FP16, 0, "--precision fp16"},
               {FR_OPTIM_STATE_FP32, FR_PREC_FP32, 1, "--zero 1"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fr_status st = fr_optim_check(ctx, &af, bad[i].fmt, bad[i].prec, bad[i].zero);
        CHECK(st == FR_ERR_ARG && strstr(fr_last_error(ctx), bad[i].says) &&
                  strstr(fr_last_error(ctx), "adafactor"),
              "refusal %zu: %d '%s'", i, (int)st, fr_last_error(ctx));
    }
    af.clip_threshold = 0;
    CHECK(fr_optim_check(ctx, &af, FR_OPTIM_STATE_FP32, FR_PREC_FP32, 0) == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "--clip-threshold"),
          "d = 0: '%s'", fr_last_error(ctx));
    fr_ctx_free(ctx);
}

int main(void) {
    test_rows();
    test_parts();
    test_refusals();
    test_state_bytes();
    test_names();
    return check_done();
}
