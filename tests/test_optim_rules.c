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
        for (int k = 0; k < ns; k++)
            CHECK(!strcmp(fr_optim_state_name(&o, k), e->state_names[k]),
                  "%s: state %d is '%s', want PyTorch's '%s'", e->name, k,
                  fr_optim_state_name(&o, k), e->state_names[k]);
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
    CHECK(!strcmp(fr_optim_names(out, sizeof out, ", ", " or "), "sgd, adam or adamw"), "'%s'",
          out);
    CHECK(!strcmp(fr_optim_names(out, sizeof out, " | ", " | "), "sgd | adam | adamw"), "'%s'",
          out);
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
    CHECK(!strcmp(fr_optim_name(bad), "?") && fr_optim_states(&o) == 0 && !fr_optim_in_gemm(&o) &&
              !strcmp(fr_optim_state_name(&o, 0), "?") && o.lr == 0,
          "a kind outside the table");
}

int main(void) {
    test_rows();
    test_state_bytes();
    test_names();
    return check_done();
}
