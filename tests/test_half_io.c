/* test_half_io.c — which inputs and outputs a backend's kernels take in 16
 * bits where that is a limit of the kernel (fr_backend.half_io), and that the
 * op table asks the context's backend for them (ops.c's half_in/half_out).
 * The CPU's answers against its limits worked out here by hand:
 *  - max pooling and BatchNorm backward widen one (H,W) plane of x on the
 *    thread's stack: H W <= 16384 (64 KiB of floats), so 128x128 is taken
 *    and 128x129 = 16512 is not; an (N,C) x is one value a plane;
 *  - max pooling rounds one output plane there: OH OW <= 4096 (64x64 yes,
 *    64x65 = 4160 no);
 *  - a convolution reads its image in 16 bits on the shifted-GEMM path
 *    only: stride 1, 2 pad = kernel - 1, kernel > 1, at least 8 channels.
 * The OpenCL backend, where built, gives the same answers (bit-identical
 * plans on both), but for the 16-bit copy of a sum (a CAST there: the same
 * bits); a backend without the member gets f32 everywhere. */
#include <string.h>
#include "backend/backend.h"
#include "check.h"
#include "core/ctx.h"
#ifdef FR_HAVE_OPENCL
#include "backend/opencl/backend.h"
#endif

/* A graph of one node: inputs are values 0 .. nin-1, out[0] value nin. */
typedef struct one {
    fr_value v[FR_MAX_IN + 1];
    fr_node n;
    fr_graph g;
} one;

static void one_make(one *o, fr_op op, const fr_shape *in, int nin, fr_shape out, int k, int s,
                     int p) {
    memset(o, 0, sizeof *o);
    for (int i = 0; i < nin; i++) o->v[i].shape = in[i], o->n.in[i] = i;
    o->v[nin].shape = out;
    o->n.op = op;
    o->n.n_in = nin;
    o->n.n_out = 1;
    o->n.out[0] = nin;
    o->n.fwd = -1;
    o->n.attr.kernel = k, o->n.attr.stride = s, o->n.attr.pad = p;
    o->g.vals = o->v;
    o->g.n_vals = (size_t)nin + 1;
    o->g.nodes = &o->n;
    o->g.n_nodes = 1;
}

/* The op table's answer for j (an input; -1: out[0]). */
static int table(const one *o, int j) {
    const fr_op_info *info = fr_op_get(o->n.op);
    if (j < 0) return info->half_out && info->half_out(&o->g, &o->n);
    return info->half_in && info->half_in(&o->g, &o->n, j);
}

/* CPU's member, the op table with no context and with a CPU context, and
 * OpenCL's member, each against the hand answer want[j + 1], j = -1 .. nin-1. */
static void expect(int line, fr_ctx *ctx, one *o, const int *want, const char *what) {
    for (int j = -1; j < o->n.n_in; j++) {
        int w = want[j + 1];
        int got = fr_cpu_backend.half_io(&o->g, &o->n, j);
        CHECK_AT(line, got == w, "%s, j = %d: cpu says %d, want %d", what, j, got, w);
        o->g.ctx = NULL;
        got = table(o, j);
        CHECK_AT(line, got == w, "%s, j = %d: op table (no context) says %d, want %d", what, j, got,
                 w);
        o->g.ctx = ctx;
        got = table(o, j);
        CHECK_AT(line, got == w, "%s, j = %d: op table (cpu context) says %d, want %d", what, j,
                 got, w);
        o->g.ctx = NULL;
#ifdef FR_HAVE_OPENCL
        got = fr_cl_backend.half_io(&o->g, &o->n, j);
        CHECK_AT(line, got == w, "%s, j = %d: opencl says %d, want %d", what, j, got, w);
#endif
    }
}

#define S4(a, b, c, d) fr_shape4(a, b, c, d)

static void maxpool(fr_ctx *ctx) {
    one o;
    fr_shape x = S4(2, 3, 128, 128);
    one_make(&o, FR_OP_MAXPOOL2D, &x, 1, S4(2, 3, 64, 64), 2, 2, 0);
    expect(__LINE__, ctx, &o, (int[]){1, 1}, "maxpool2d 128x128 -> 64x64");
    x = S4(1, 1, 128, 129);
    one_make(&o, FR_OP_MAXPOOL2D, &x, 1, S4(1, 1, 64, 64), 2, 2, 0);
    expect(__LINE__, ctx, &o, (int[]){1, 0}, "maxpool2d 128x129 (x plane 16512)");
    x = S4(1, 1, 64, 65);
    one_make(&o, FR_OP_MAXPOOL2D, &x, 1, S4(1, 1, 64, 65), 1, 1, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 1}, "maxpool2d 64x65 -> 64x65 (y plane 4160)");
    x = S4(4, 2, 1, 4096);
    one_make(&o, FR_OP_MAXPOOL2D, &x, 1, S4(4, 2, 1, 4096), 1, 1, 0);
    expect(__LINE__, ctx, &o, (int[]){1, 1}, "maxpool2d 1x4096 -> 1x4096");
    one_make(&o, FR_OP_MAXPOOL2D, &x, 1, fr_shape3(4, 2, 4096), 1, 1, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 1}, "maxpool2d with a 3-d y");

    /* dy, x, y: only x, and no 16-bit dx */
    fr_shape in[3] = {S4(2, 3, 64, 64), S4(2, 3, 128, 128), S4(2, 3, 64, 64)};
    one_make(&o, FR_OP_MAXPOOL2D_BWD, in, 3, in[1], 2, 2, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 0, 1, 0}, "maxpool2d_bwd 128x128");
    in[0] = in[2] = S4(2, 3, 2, 1638), in[1] = S4(2, 3, 5, 3277);
    one_make(&o, FR_OP_MAXPOOL2D_BWD, in, 3, in[1], 2, 2, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 0, 0, 0}, "maxpool2d_bwd 5x3277 (plane 16385)");
}

static void batchnorm(fr_ctx *ctx) {
    one o;
    /* dy, x, gamma, mean, invstd -> dx: only x */
    fr_shape c = fr_shape1(4);
    fr_shape in[5] = {S4(2, 4, 128, 128), S4(2, 4, 128, 128), c, c, c};
    one_make(&o, FR_OP_BATCHNORM_BWD, in, 5, in[0], 0, 0, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 0, 1, 0, 0, 0}, "batchnorm_bwd 128x128");
    in[0] = in[1] = S4(2, 4, 1, 16385);
    one_make(&o, FR_OP_BATCHNORM_BWD, in, 5, in[0], 0, 0, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 0, 0, 0, 0, 0}, "batchnorm_bwd 1x16385");
    in[0] = in[1] = fr_shape2(100000, 4);
    one_make(&o, FR_OP_BATCHNORM_BWD, in, 5, in[0], 0, 0, 0);
    expect(__LINE__, ctx, &o, (int[]){0, 0, 1, 0, 0, 0}, "batchnorm_bwd (N,C)");
}

/* x (N,C,5,5), W (4,C,k,k), bias (4); forward and backward */
static void conv_case(int line, fr_ctx *ctx, int C, int k, int s, int p, int want) {
    one o;
    char what[96];
    int oh = (5 + 2 * p - k) / s + 1;
    fr_shape x = S4(2, C, 5, 5), w = S4(4, C, k, k), y = S4(2, 4, oh, oh);
    fr_shape fin[3] = {x, w, fr_shape1(4)}, bin[3] = {y, x, w};
    snprintf(what, sizeof what, "conv2d C=%d k=%d s=%d p=%d", C, k, s, p);
    one_make(&o, FR_OP_CONV2D, fin, 3, y, k, s, p);
    expect(line, ctx, &o, (int[]){0, want, 0, 0}, what);
    snprintf(what, sizeof what, "conv2d_bwd C=%d k=%d s=%d p=%d", C, k, s, p);
    one_make(&o, FR_OP_CONV2D_BWD, bin, 3, x, k, s, p);
    expect(line, ctx, &o, (int[]){0, 0, want, 0}, what);
}

static void conv(fr_ctx *ctx) {
    conv_case(__LINE__, ctx, 8, 3, 1, 1, 1);  /* the shifted path */
    conv_case(__LINE__, ctx, 16, 5, 1, 2, 1); /* so is a 5x5 "same" */
    conv_case(__LINE__, ctx, 7, 3, 1, 1, 0);  /* too few channels */
    conv_case(__LINE__, ctx, 8, 1, 1, 0, 0);  /* 1x1 */
    conv_case(__LINE__, ctx, 8, 3, 2, 1, 0);  /* stride 2 */
    conv_case(__LINE__, ctx, 8, 3, 1, 0, 0);  /* not "same" */
}

/* Ops the backend is not asked about answer 0 from its member; the op
 * table still answers for them itself (the activation backwards). */
static void others(fr_ctx *ctx) {
    one o;
    fr_shape in[2] = {fr_shape2(4, 8), fr_shape2(4, 8)};
    one_make(&o, FR_OP_RELU_BWD, in, 2, in[0], 0, 0, 0);
    for (int j = -1; j < 2; j++)
        CHECK(!fr_cpu_backend.half_io(&o.g, &o.n, j), "relu_bwd j = %d: cpu member says 1", j);
    o.g.ctx = ctx;
    CHECK(table(&o, 1) && !table(&o, 0), "relu_bwd: the op table takes the saved y only");
}

/* The 16-bit copy of out[0] (j = -2, fr_op_info.half_copy): the CPU's
 * residual-stream sums and ReLU on an f32 x make it (any size: a chunk or a
 * row at a time), no other op does, and OpenCL's never (a CAST after) */
static void copies(fr_ctx *ctx) {
    one o;
    fr_shape in[2] = {fr_shape3(2, 300, 5000), fr_shape3(2, 300, 5000)};
    const fr_op ops[5] = {FR_OP_ADD, FR_OP_POS_EMBEDDING, FR_OP_LAYERNORM, FR_OP_RELU, FR_OP_RELU};
    for (int k = 0; k < 5; k++) {
        if (ops[k] == FR_OP_POS_EMBEDDING) in[1] = fr_shape2(300, 5000);
        one_make(&o, ops[k], in, ops[k] == FR_OP_RELU ? 1 : 2, in[0], 0, 0, 0);
        if (k == 4) o.v[0].dtype = FR_BF16; /* ReLU reading its x rounded: no copy */
        const int want = ops[k] != FR_OP_LAYERNORM && k != 4;
        const char *nm = fr_op_get(ops[k])->name;
        CHECK(fr_cpu_backend.half_io(&o.g, &o.n, -2) == want, "%s: cpu's copy answer is not %d", nm,
              want);
        o.g.ctx = ctx;
        const fr_op_info *info = fr_op_get(ops[k]);
        CHECK((info->half_copy && info->half_copy(&o.g, &o.n)) == want,
              "%s: the op table's copy answer (cpu context) is not %d", nm, want);
        o.g.ctx = NULL;
#ifdef FR_HAVE_OPENCL
        CHECK(!fr_cl_backend.half_io(&o.g, &o.n, -2), "%s: opencl says it writes a copy", nm);
#endif
    }
}

/* A backend that answers otherwise is the one asked; one without the
 * member gets f32. */
static int asked_j = -9;
static int say_yes(const fr_graph *g, const fr_node *n, int j) {
    (void)g, (void)n;
    asked_j = j;
    return 1;
}

static void seam(fr_ctx *ctx) {
    one o;
    fr_shape x = S4(1, 1, 128, 129); /* the CPU says no to both */
    one_make(&o, FR_OP_MAXPOOL2D, &x, 1, S4(1, 1, 64, 65), 2, 2, 0);
    fr_backend yes = fr_cpu_backend, none = fr_cpu_backend;
    yes.half_io = say_yes;
    none.half_io = NULL;
    o.g.ctx = ctx;
    ctx->be = &yes;
    CHECK(table(&o, 0) && asked_j == 0, "maxpool2d x: the context's backend was not asked");
    CHECK(table(&o, -1) && asked_j == -1, "maxpool2d y: the context's backend was not asked");
    ctx->be = &none;
    fr_shape ok = S4(1, 1, 4, 4);
    one_make(&o, FR_OP_MAXPOOL2D, &ok, 1, S4(1, 1, 2, 2), 2, 2, 0);
    o.g.ctx = ctx;
    CHECK(!table(&o, 0) && !table(&o, -1), "a backend without half_io: maxpool2d takes 16 bits");
    ctx->be = NULL;
}

int main(void) {
    fr_ctx *ctx = fr_ctx_new();
    CHECK(ctx != NULL, "fr_ctx_new");
    if (!ctx) return check_done();
    maxpool(ctx);
    batchnorm(ctx);
    conv(ctx);
    others(ctx);
    copies(ctx);
    seam(ctx);
    fr_ctx_free(ctx);
    return check_done();
}
