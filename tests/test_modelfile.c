/* test_modelfile.c — the model-file parser: every fault of a file gives its
 * file:line:col message and a NULL model with nothing left allocated (also
 * under injected allocation failures); the built-in models parse, have the
 * parameter counts derived by hand below, and equal the files in models/
 * (found through FR_SOURCE_DIR, default "."); --freeze lists, ranges of a
 * repeat's blocks (transformer.h.0-1) among them, against the block each
 * layer's name says it is in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/ctx.h"
#include "model/model.h"
#include "model/modelfile.h"

static size_t allocated(const fr_ctx *ctx) {
    fr_mem_stats st;
    fr_mem_get_stats(ctx, &st);
    return st.allocated_total;
}

/* Parse text as "bad.model": it must fail with want in the message, a NULL
 * model and no bytes left allocated. */
static void expect_error_at(int line, const char *text, size_t len, const char *want) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_parse(ctx, "bad.model", text, len);
    const char *err = fr_last_error(ctx);
    if (m) {
        CHECK_AT(line, m == NULL, "parsed, expected an error with \"%s\"", want);
        fr_model_free(m);
    } else {
        CHECK_AT(line, strstr(err, want) != NULL, "error\n    %s\n  does not contain\n    %s", err,
                 want);
    }
    CHECK(allocated(ctx) == 0, "line %d: %zu bytes left after a failed parse", line,
          allocated(ctx));
    fr_ctx_free(ctx);
}
#define expect_error(text, want) expect_error_at(__LINE__, (text), strlen(text), (want))

/* Parse text as "ok.model": it must give a model with num_params params. */
static void expect_params_at(int line, const char *text, size_t num_params, int classes) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_parse(ctx, "ok.model", text, strlen(text));
    if (!m) {
        CHECK_AT(line, m != NULL, "%s", fr_last_error(ctx));
    } else {
        size_t n = fr_model_num_params(m);
        CHECK(n == num_params, "line %d: %zu params, expected %zu", line, n, num_params);
        CHECK(fr_model_num_classes(m) == classes, "line %d: %d classes, expected %d", line,
              fr_model_num_classes(m), classes);
        fr_model_free(m);
    }
    CHECK(allocated(ctx) == 0, "line %d: %zu bytes left after fr_model_free", line, allocated(ctx));
    fr_ctx_free(ctx);
}
#define expect_params(text, n, classes) expect_params_at(__LINE__, (text), (n), (classes))

/* ---- parameter counts, derived by hand ---------------------------------- */

/* mlp: linear 1000->2000 (weight + bias), linear 2000->10. */
static const size_t MLP_PARAMS = 1000 * 2000 + 2000 + 2000 * 10 + 10; /* 2,022,010 */

/* cnn on 1x28x28 (convs have no bias: the batchnorm after each cancels it):
 *   conv1 1->32 3x3      32*1*3*3   =     288
 *   bn1 (weight, bias)   2*32       =      64   -> pool: 32x14x14
 *   conv2 32->64 3x3     64*32*3*3  =  18,432
 *   bn2                  2*64       =     128   -> pool: 64x7x7 = 3136
 *   fc1 3136->128        3136*128+128 = 401,536
 *   fc2 128->10          128*10+10  =   1,290
 *   total                              421,738 */
static const size_t CNN_PARAMS =
    32 * 1 * 9 + 2 * 32 + 64 * 32 * 9 + 2 * 64 + (64 * 7 * 7) * 128 + 128 + 128 * 10 + 10;

/* resnet on 1x28x28, convs without bias, batchnorm = 2*C params:
 *   stem: conv 1->16 3x3 (144) + bn (32)                                    =     176
 *   BasicBlock(c_in->c, stride 1, identity): conv c_in->c 3x3 + bn + conv c->c 3x3 + bn
 *     layer1.0, layer1.1 (16->16): 2304+32+2304+32 = 4,672 each             =   9,344
 *   layer2.0 (16->32, stride 2): 4608+64+9216+64 + shortcut 1x1 512+64 = 14,528
 *   layer2.1 (32->32): 9216+64+9216+64 = 18,560                   stage 2   =  33,088
 *   layer3.0 (32->64, stride 2): 18432+128+36864+128 + shortcut 2048+128 = 57,728
 *   layer3.1 (64->64): 36864+128+36864+128 = 73,984                stage 3   = 131,712
 *   fc 64->10: 640+10                                                       =     650
 *   total                                                                     174,970 */
#define CONV(ci, co, k) ((size_t)(ci) * (co) * (k) * (k))
#define BN(c) ((size_t)2 * (c))
static const size_t RESNET_PARAMS =
    CONV(1, 16, 3) + BN(16) +                                   /* stem */
    2 * (CONV(16, 16, 3) + BN(16) + CONV(16, 16, 3) + BN(16)) + /* stage 1 */
    CONV(16, 32, 3) + BN(32) + CONV(32, 32, 3) + BN(32) + CONV(16, 32, 1) + BN(32) +
    CONV(32, 32, 3) + BN(32) + CONV(32, 32, 3) + BN(32) + /* stage 2 */
    CONV(32, 64, 3) + BN(64) + CONV(64, 64, 3) + BN(64) + CONV(32, 64, 1) + BN(64) +
    CONV(64, 64, 3) + BN(64) + CONV(64, 64, 3) + BN(64) + /* stage 3 */
    64 * 10 + 10;                                         /* fc */

/* ---- helpers -------------------------------------------------------------- */

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap + 1);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            char *nb = realloc(buf, 2 * cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    fclose(f);
    if (buf) buf[n] = '\0';
    *len = n;
    return buf;
}

static int write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t n = strlen(text);
    int ok = fwrite(text, 1, n, f) == n;
    return (fclose(f) == 0 && ok) ? 0 : -1;
}

static const fr_param *find_param(const fr_model *m, const char *name) {
    for (size_t i = 0; i < m->n_params; i++)
        if (strcmp(m->params[i].name, name) == 0) return &m->params[i];
    return NULL;
}

/* ---- tests ---------------------------------------------------------------- */

static void test_builtins(void) {
    /* A GPT of L layers, width C, context T, vocabulary V with a tied head:
     * wte V*C + wpe T*C + per block (ln_1, ln_2: 4C; c_attn 3C*C + 3C;
     * attn.c_proj C*C + C; mlp.c_fc 4C*C + 4C; mlp.c_proj 4C*C + C) =
     * 12C^2 + 13C, + ln_f 2C. GPT-2 124M: 124,439,808 (the figure nanoGPT
     * prints for GPT-2 with the position embeddings counted). */
#define GPT_PARAMS(L, C, T, V) \
    ((size_t)(V) * (C) + (size_t)(T) * (C) + (size_t)(L) * (12 * (C) * (C) + 13 * (C)) + 2 * (C))
    static const struct {
        const char *name;
        size_t params;
        int classes;
    } want[] = {{"mlp", MLP_PARAMS, 10},
                {"cnn", CNN_PARAMS, 10},
                {"resnet", RESNET_PARAMS, 10},
                {"gpt-tiny", GPT_PARAMS(6, 384, 256, 256), 256},
                {"gpt2", GPT_PARAMS(12, 768, 1024, 50257), 50257}};
    CHECK(GPT_PARAMS(12, 768, 1024, 50257) == 124439808, "GPT-2's count is 124,439,808");
    CHECK(MLP_PARAMS == 2022010, "the mlp's hand count is 2,022,010");
    CHECK(CNN_PARAMS == 421738, "the cnn's hand count is 421,738");
    CHECK(RESNET_PARAMS == 174970, "the resnet's hand count is 174,970");
    const char *dir = getenv("FR_SOURCE_DIR");
    if (!dir || !dir[0]) dir = ".";
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        fr_ctx *ctx = fr_ctx_new();
        fr_model *m = fr_model_load(ctx, want[i].name);
        CHECK(m != NULL, "built-in %s: %s", want[i].name, fr_last_error(ctx));
        if (m) {
            CHECK(fr_model_num_params(m) == want[i].params, "%s: %zu params, expected %zu",
                  want[i].name, fr_model_num_params(m), want[i].params);
            CHECK(fr_model_num_classes(m) == want[i].classes, "%s: %d classes", want[i].name,
                  fr_model_num_classes(m));
            fr_model_free(m);
        }
        /* The built-in text is the file in models/, byte for byte. */
        char path[4096];
        snprintf(path, sizeof path, "%s/models/%s.model", dir, want[i].name);
        size_t len = 0;
        char *text = read_file(path, &len);
        const char *builtin = fr_modelfile_builtin(want[i].name);
        CHECK(text != NULL, "cannot read %s (set FR_SOURCE_DIR to the source tree)", path);
        CHECK(builtin != NULL, "no built-in text for %s", want[i].name);
        if (text && builtin)
            CHECK(len == strlen(builtin) && memcmp(text, builtin, len) == 0,
                  "%s differs from the built-in '%s' in src/model/modelfile.c", path, want[i].name);
        /* Loading the file by path gives the same model. */
        if (text) {
            m = fr_model_load(ctx, path);
            CHECK(m != NULL, "%s: %s", path, fr_last_error(ctx));
            if (m) {
                CHECK(fr_model_num_params(m) == want[i].params, "%s: %zu params", path,
                      fr_model_num_params(m));
                fr_model_free(m);
            }
        }
        free(text);
        CHECK(allocated(ctx) == 0, "%s: %zu bytes left", want[i].name, allocated(ctx));
        fr_ctx_free(ctx);
    }
    CHECK(fr_modelfile_builtin("vgg") == NULL, "no built-in vgg");
}

/* name= reaches the state_dict names (read through the model's internals). */
static void test_names(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_load(ctx, "mlp");
    if (m) {
        CHECK(find_param(m, "fc1.weight") && find_param(m, "fc1.bias") &&
                  find_param(m, "fc2.weight") && find_param(m, "fc2.bias"),
              "mlp names are the seed's fc1/fc2");
        fr_model_free(m);
    }
    m = fr_model_load(ctx, "resnet");
    if (m) {
        const fr_param *p = find_param(m, "layer2.0.downsample.0.weight");
        CHECK(p && p->shape.ndim == 4 && p->shape.d[0] == 32 && p->shape.d[1] == 16 &&
                  p->shape.d[2] == 1,
              "resnet has layer2.0.downsample.0.weight of (32, 16, 1, 1)");
        CHECK(find_param(m, "layer3.1.bn2.running_var") && find_param(m, "fc.bias") &&
                  find_param(m, "conv1.weight") && !find_param(m, "conv1.bias"),
              "resnet names follow torchvision");
        fr_model_free(m);
    }
    /* Unnamed layers keep the builder's index names; a named residual block
     * names what it holds. */
    const char *text = "input 4\nlinear 4\nresidual name=blk\n linear 4\nend\nlinear 2 name=head\n";
    m = fr_model_parse(ctx, "t.model", text, strlen(text));
    CHECK(m != NULL, "named residual: %s", fr_last_error(ctx));
    if (m) {
        CHECK(find_param(m, "0.weight") && find_param(m, "blk.body.0.weight") &&
                  find_param(m, "head.weight"),
              "names 0, blk.body.0, head");
        fr_model_free(m);
    }
    CHECK(allocated(ctx) == 0, "%zu bytes left", allocated(ctx));
    fr_ctx_free(ctx);
}

/* The frozen layers with parameters of a 3-block GPT after freeze(list),
 * as a bit mask over blocks (bit b: block b's layers all frozen, none of
 * them unfrozen) plus bit 3 for transformer.ln_f and bit 4 for the
 * embeddings; -1 when freeze refused the list, -2 for a mixed block. */
static int frozen_mask(const char *list) {
    static const char text[] = "input tokens 8\n"
                               "embedding 32 16 name=transformer.wte\n"
                               "pos_embedding 8 name=transformer.wpe\n"
                               "repeat 3 name=transformer.h\n"
                               "  residual\n"
                               "    layernorm 16 name=ln_1\n"
                               "    linear 48 name=attn.c_attn\n"
                               "    attention heads=2\n"
                               "    linear 16 name=attn.c_proj\n"
                               "  end\n"
                               "end\n"
                               "layernorm 16 name=transformer.ln_f\n"
                               "linear 32 bias=false tie=transformer.wte name=lm_head\n";
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_parse(ctx, "g.model", text, sizeof text - 1);
    CHECK(m != NULL, "%s", fr_last_error(ctx));
    int mask = -1;
    if (m && fr_model_freeze(m, list) == FR_OK) {
        int on[5] = {0}, off[5] = {0};
        for (size_t i = 0; i < m->n_layers; i++) {
            const fr_layer *l = &m->layers[i];
            int b = -1;
            if (l->n_params == 0) continue;
            if (sscanf(l->name, "transformer.h.%d.", &b) != 1)
                b = strstr(l->name, "ln_f") ? 3 : strstr(l->name, "transformer.w") ? 4 : -1;
            CHECK(b >= 0 && b < 5, "layer %s", l->name);
            if (b < 0 || b >= 5) continue;
            on[b] += l->frozen != 0;
            off[b] += l->frozen == 0;
        }
        mask = 0;
        for (int b = 0; b < 5; b++) {
            if (on[b] && off[b]) mask = -2;
            if (mask >= 0 && on[b]) mask |= 1 << b;
        }
    }
    fr_model_free(m);
    fr_ctx_free(ctx);
    return mask;
}

/* --freeze: ranges of a named repeat's blocks ("transformer.h.0-1"), and
 * every older form (a prefix, a top-level index or range) as before. */
static void test_freeze(void) {
    static const struct {
        const char *list;
        int mask;
    } cases[] = {
        {"transformer.h.0-1", 0x3},
        {"transformer.h.1-2", 0x6},
        {"transformer.h.2-2", 0x4},
        {"transformer.h.0-7", 0x7}, /* past the last block: the blocks there are */
        {"transformer.h.1", 0x2},
        {"transformer.h", 0x7},
        {"transformer.h.0-1,transformer.ln_f", 0xB},
        {"transformer.h.0.attn.c_attn,transformer.h.0.ln_1,transformer.h.0.attn.c_proj", 0x1},
        {"transformer.wte,transformer.wpe", 0x10},
        {"transformer.h.1-0", -1}, /* an empty range */
        {"transformer.h.3-5", -1}, /* no such block */
        {"transformer.h.0-", -1},
        {"transformer.h.-1", -1},
        {"transformer.h.01-2", 0x6}, /* as the top-level "01-2" reads */
        {"transformer.h.0-1x", -1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        int got = frozen_mask(cases[k].list);
        CHECK(got == cases[k].mask, "--freeze %s: mask %d, expected %d", cases[k].list, got,
              cases[k].mask);
    }
    /* Top-level indices and ranges still name nn.Sequential positions. */
    fr_ctx *ctx = fr_ctx_new();
    const char *text = "input 4\nlinear 4\nrelu\nlinear 4\nlinear 2 name=head\n";
    fr_model *m = fr_model_parse(ctx, "t.model", text, strlen(text));
    CHECK(m && fr_model_freeze(m, "0-2") == FR_OK, "%s", fr_last_error(ctx));
    for (size_t i = 0; m && i < m->n_layers; i++)
        CHECK(m->layers[i].frozen == (m->layers[i].index <= 2), "layer %zu (%s)", i,
              m->layers[i].name);
    CHECK(m && fr_model_freeze(m, "head") == FR_OK && m->layers[m->n_layers - 1].frozen, "head");
    CHECK(m && fr_model_freeze(m, "head.0-1") == FR_ERR_ARG &&
              strstr(fr_last_error(ctx), "transformer.h.0-3"),
          "a range under an unrepeated name: %s", fr_last_error(ctx));
    fr_model_free(m);
    CHECK(allocated(ctx) == 0, "%zu bytes left", allocated(ctx));
    fr_ctx_free(ctx);
}

static void test_syntax_ok(void) {
    /* Every statement and option once. Hand count:
     *   c1 conv 3->4 3x3 no bias 108; bn 8; residual body conv 4->4 3x3 + bias 148,
     *   shortcut conv 4->4 1x1 + bias 20; layernorm over 4x2x2: 16 + 16;
     *   linear 16->6 no bias 96; linear 6->3 18 + 3. */
    expect_params("# every statement\n"
                  "input 3 8 8\n"
                  "conv2d 4 kernel=3 stride=1 padding=1 bias=false name=c1   # 4x8x8\n"
                  "batchnorm name=bn\n"
                  "gelu\n"
                  "residual name=blk\n"
                  "    conv2d 4 kernel=3 padding=1\n"
                  "    sigmoid\n"
                  "shortcut\n"
                  "    conv2d 4 kernel=1 bias=true\n"
                  "end\n"
                  "maxpool2d 2                # 4x4x4\n"
                  "avgpool2d 2 stride=2       # 4x2x2\n"
                  "tanh\n"
                  "layernorm\n"
                  "flatten\n"
                  "dropout 0.5\n"
                  "linear 6 bias=false\n"
                  "relu\n"
                  "linear 3\n"
                  "loss mse\n",
                  108 + 8 + 148 + 20 + 32 + 96 + 21, 3);
    /* A flat input needs no flatten; global_avgpool gives C; key order is free. */
    expect_params("input 784\nlinear 10 name=fc bias=true\n", 7850, 10);
    expect_params("input 2 6 6\nconv2d 5 padding=0 kernel=3 stride=2\nglobal_avgpool\n", 95, 5);
    /* CRLF lines, tabs, no final newline, comments everywhere, blank lines. */
    expect_params("\r\n# c\r\n\tinput 8 # x\r\n\r\n\tlinear 4\t# y\r\n   relu", 36, 4);
    /* Loss may come first; dropout numbers. */
    expect_params("loss cross_entropy\ninput 8\ndropout 0\ndropout .5\ndropout 0.999\nlinear 2\n",
                  18, 2);
    /* Non-ASCII bytes are fine inside comments. */
    expect_params("input 8 # Größe\nlinear 2 # \xff\x01\n", 18, 2);
    /* A line of exactly 1024 bytes is allowed. */
    char line[2048];
    int n = snprintf(line, sizeof line, "input 8\nlinear 2 #");
    memset(line + n, 'x', 1024 - (sizeof "linear 2 #" - 1));
    line[n + 1024 - (sizeof "linear 2 #" - 1)] = '\0';
    expect_params(line, 18, 2);
}

static void test_errors(void) {
    /* unknown layers, with the known list and the nearest word */
    expect_error("input 1 28 28\nconv3d 8 kernel=3\n",
                 "bad.model:2:1: unknown layer 'conv3d' (known: input, conv2d, linear, maxpool2d");
    expect_error("input 1 28 28\nconv3d 8 kernel=3\n", "did you mean 'conv2d'?");
    expect_error("input 8\n  Linear 4\n", "bad.model:2:3: unknown layer 'Linear'");
    expect_error("input 8\n  Linear 4\n", "did you mean 'linear'?");
    expect_error("input 8\nfoo\n", "bad.model:2:1: unknown layer 'foo' (known: ");
    /* bad numbers */
    expect_error("input 1 28 28\nconv2d 8 kernel=0\n",
                 "bad.model:2:10: kernel=0: must be a positive integer");
    expect_error("input 1 28 28\nconv2d 8 kernel=3 stride=-1\n",
                 "bad.model:2:19: stride=-1: must be a positive integer");
    expect_error("input 1 28 28\nconv2d 8 kernel=3 padding=x\n",
                 "bad.model:2:19: padding=x: must be a non-negative integer");
    expect_error("input 8\nlinear 10x\n",
                 "bad.model:2:8: linear OUT_FEATURES '10x': must be a positive integer");
    expect_error("input 8\nlinear 0\n",
                 "bad.model:2:8: linear OUT_FEATURES '0': must be a positive integer");
    expect_error("input 8\nlinear 2.5\n",
                 "bad.model:2:8: linear OUT_FEATURES '2.5': must be a positive integer");
    expect_error("input 99999999999999999999999\n",
                 "bad.model:1:7: input C '99999999999999999999999': must be at most 16777216");
    expect_error("input 1 28 28\nconv2d 8 kernel=16777217\n",
                 "bad.model:2:10: kernel=16777217: must be at most 16777216");
    expect_error("input 4096 4096 4096\n",
                 "bad.model:1:1: input of 68719476736 values per sample is too large");
    expect_error("input 8\ndropout 1.5\n",
                 "bad.model:2:9: dropout P '1.5': must be a number in [0, 1)");
    expect_error("input 8\ndropout 1\n",
                 "bad.model:2:9: dropout P '1': must be a number in [0, 1)");
    expect_error("input 8\ndropout -0.1\n", "bad.model:2:9: dropout P '-0.1'");
    expect_error("input 8\ndropout 0.5.5\n", "bad.model:2:9: dropout P '0.5.5'");
    expect_error("input 8\ndropout .\n", "bad.model:2:9: dropout P '.'");
    expect_error("input 8\ndropout 1e-1\n", "bad.model:2:9: dropout P '1e-1'");
    expect_error("input 8\ndropout 0.9999999999\n", "bad.model:2:9: dropout P '0.9999999999'");
    expect_error("input 8\nlinear 10 bias=yes\n",
                 "bad.model:2:11: bias=yes: must be true or false");
    /* keys */
    expect_error("input 1 28 28\nconv2d 8 kernal=3\n",
                 "bad.model:2:10: unknown key 'kernal' for conv2d (known: kernel, stride, padding, "
                 "bias, name, checkpoint); did you mean 'kernel'?");
    expect_error("input 8\nlinear 8 kernel=3\n", "bad.model:2:10: unknown key 'kernel' for linear "
                                                 "(known: bias, name, checkpoint, std, tie)");
    /* checkpoint marks: on a layer or a whole block, not inside a block */
    expect_error("input 1 8 8\nresidual\n  conv2d 1 kernel=3 padding=1 checkpoint=true\nend\n",
                 "bad.model:3: checkpoint inside a residual block");
    expect_error("input 8\nlinear 8 checkpoint=maybe\n",
                 "bad.model:2:10: checkpoint=maybe: must be true or false");
    expect_error("input 8 name=x\n",
                 "bad.model:1:9: unknown key 'name': input takes no key=value options");
    expect_error("input 8\nresidual\nlinear 8\nend name=x\n",
                 "bad.model:4:5: unknown key 'name': end takes no");
    expect_error("input 1 8 8\nconv2d 8 kernel=3 kernel=3\n",
                 "bad.model:2:19: duplicate key 'kernel' (first given at column 10)");
    expect_error("input 1 8 8\nconv2d 8 kernel=\n", "bad.model:2:10: kernel=: missing value");
    expect_error("input 1 8 8\nconv2d 8 kernel = 3\n",
                 "bad.model:2:17: '=': a key is missing before '=' (write key=value, no spaces");
    expect_error("input 1 8 8\nconv2d 8 =3\n", "bad.model:2:10: '=3': a key is missing before '='");
    expect_error("input 8\nlinear 10 name=a/b\n", "bad.model:2:17: name=a/b: a name is letters");
    expect_error("input 8\nlinear 2 name=größe\n", "bad.model:2:17: unexpected byte 0xc3");
    /* missing arguments */
    expect_error("input 1 28 28\nconv2d kernel=3\n",
                 "bad.model:2:1: conv2d: missing argument OUT_CHANNELS (usage: conv2d OUT_CHANNELS "
                 "kernel=K");
    expect_error("input 1 28 28\nconv2d 8 padding=1\n",
                 "bad.model:2:1: conv2d: missing argument kernel=K");
    expect_error("input 8\ndropout\n", "bad.model:2:1: dropout: missing argument P");
    expect_error("input 8\nlinear\n", "bad.model:2:1: linear: missing argument OUT_FEATURES");
    expect_error("input 1 8 8\nmaxpool2d stride=2\n",
                 "bad.model:2:1: maxpool2d: missing argument K");
    expect_error("input\n", "bad.model:1:1: input: missing argument C");
    expect_error("input 8\nlinear 2\nloss\n", "bad.model:3:1: loss: missing argument LOSS");
    /* trailing garbage */
    expect_error("input 8\nlinear 10 20\n",
                 "bad.model:2:11: unexpected '20' (usage: linear OUT_FEATURES");
    expect_error("input 8\nrelu now\n",
                 "bad.model:2:6: unexpected 'now' (usage: relu [name=NAME])");
    expect_error("input 1 28 28 28\n", "bad.model:1:15: unexpected '28'");
    expect_error("input 8\nlinear 2\nloss mse mse\n", "bad.model:3:10: unexpected 'mse'");
    expect_error("input 8\nresidual\nlinear 8\nend now\n",
                 "bad.model:4:5: unexpected 'now' (usage: end)");
    expect_error("input 28 28\n",
                 "bad.model:1:10: input takes 1 number (FEATURES) or 3 (C H W), not 2");
    /* structure */
    expect_error("input 784\nlinear 10\ninput 784\n",
                 "bad.model:3:1: second 'input' line (the first is line 1)");
    expect_error("# comment\n\nlinear 10\ninput 784\n", "bad.model:3:1: 'linear' before 'input'");
    expect_error("residual\n", "bad.model:1:1: 'residual' before 'input'");
    expect_error("input 8\nlinear 8\n  end\n", "bad.model:3:3: 'end' without 'residual'");
    expect_error("input 8\nlinear 8\n  residual\n    linear 8\n",
                 "bad.model:3:3: 'residual' is never closed: the file ends before its 'end'");
    expect_error("input 8\nresidual\nresidual\nlinear 8\nend\n",
                 "bad.model:2:1: 'residual' is never closed");
    expect_error("input 8\nshortcut\n", "bad.model:2:1: 'shortcut' without 'residual'");
    expect_error("input 8\nresidual\nlinear 8\nshortcut\nshortcut\nend\n",
                 "bad.model:5:1: second 'shortcut' in the residual block opened on line 2 (the "
                 "first is line 4)");
    expect_error("", "bad.model:1:1: no 'input' line");
    expect_error("# only a comment\n\n", "bad.model:1:1: no 'input' line");
    expect_error("loss mse\n", "bad.model:1:1: no 'input' line");
    expect_error("\ninput 8\n# nothing else\n", "bad.model:2:1: no layers after 'input'");
    expect_error("input 8\nlinear 2\nloss l1\n",
                 "bad.model:3:6: unknown loss 'l1' (known: cross_entropy, mse)");
    expect_error("input 8\nlinear 2\nloss MSE\n", "did you mean 'mse'?");
    expect_error("input 8\nloss mse\nlinear 2\nloss mse\n",
                 "bad.model:4:1: second 'loss' line (the first is line 2)");
    expect_error(
        "input 8\nresidual\nloss mse\nend\n",
        "bad.model:3:1: 'loss' inside the residual block opened on line 2: put it after 'end'");
    /* bytes and lines */
    expect_error("input 8\x01\n", "bad.model:1:8: unexpected byte 0x01");
    expect_error_at(__LINE__, "input 8\nline\0ar 2\n", 18, "bad.model:2:5: unexpected byte 0x00");
    {
        char text[2200];
        int n = snprintf(text, sizeof text, "input 8\nlinear 2 # ");
        memset(text + n, 'x', 1100);
        text[n + 1100] = '\0';
        expect_error(text, "bad.model:2:1025: line is longer than 1024 characters");
    }
    /* The builder's own checks come back with file:line. */
    expect_error("input 1 28 28\nlinear 10\n", "bad.model:2: linear needs a flat input");
    expect_error("input 1 4 4\nconv2d 8 kernel=7\n", "bad.model:2: conv2d: kernel 7 is larger");
    expect_error("input 4 8 8\nresidual\n  conv2d 8 kernel=1\nend\n",
                 "bad.model:4: residual block: the body gives");
    expect_error("input 8\nlinear 8 name=a\nlinear 8 name=a\n",
                 "bad.model:3: layer name 'a' is already used");
    expect_error("input 8\nshortcut name=x\n",
                 "bad.model:2:10: unknown key 'name': shortcut takes no");
    expect_error("input 8\nresidual\nresidual\nresidual\nresidual\nresidual\n",
                 "bad.model:6: residual blocks nest at most");
}

/* Limits: names of 100 characters, texts and files of 1 MiB. */
static void test_limits(void) {
    char text[512], name[128];
    memset(name, 'n', 100);
    name[100] = '\0';
    snprintf(text, sizeof text, "input 8\nlinear 2 name=%s\n", name);
    expect_params(text, 18, 2);
    snprintf(text, sizeof text, "input 8\nlinear 2 name=%sn\n", name);
    expect_error(text,
                 "bad.model:2:10: name=nnnnnnnnnnnnnnnnnnnn...: a name is at most 100 characters");

    size_t big = (1u << 20) + 1;
    char *blank = malloc(big);
    fr_ctx *ctx = fr_ctx_new();
    if (blank) {
        memset(blank, '\n', big);
        memcpy(blank, "input 8\nlinear 2\n", 17);
        CHECK(!fr_model_parse(ctx, "big.model", blank, big) &&
                  strstr(fr_last_error(ctx),
                         "big.model: 1048577 bytes is too large for a model file"),
              "a text over 1 MiB: %s", fr_last_error(ctx));
        fr_model *m = fr_model_parse(ctx, "big.model", blank, big - 1);
        CHECK(m != NULL, "a text of 1 MiB: %s", fr_last_error(ctx));
        fr_model_free(m);
        char path[] = "/tmp/test_modelfile_big_XXXXXX";
        int fd = mkstemp(path);
        if (fd >= 0) {
            int ok = write(fd, blank, big) == (ssize_t)big;
            close(fd);
            CHECK(ok, "write %s", path);
            char want[128];
            snprintf(want, sizeof want, "%s: 1048577 bytes is too large for a model file", path);
            CHECK(!fr_model_load(ctx, path) && strstr(fr_last_error(ctx), want),
                  "a file over 1 MiB: %s", fr_last_error(ctx));
            remove(path);
        }
        free(blank);
    }
    CHECK(!fr_model_parse(ctx, "null.model", NULL, 5) &&
              strstr(fr_last_error(ctx), "null.model: no text"),
          "NULL text: %s", fr_last_error(ctx));
    CHECK(!fr_model_parse(ctx, "null.model", NULL, 0) &&
              strstr(fr_last_error(ctx), "null.model:1:1: no 'input' line"),
          "NULL empty text: %s", fr_last_error(ctx));
    CHECK(allocated(ctx) == 0, "%zu bytes left", allocated(ctx));
    fr_ctx_free(ctx);
}

static void test_nested_residual(void) {
    /* Nested blocks: y = x + (x + (linear(x))) ... the builder allows them. */
    expect_params("input 4\n"
                  "residual\n"
                  "  residual\n"
                  "    linear 4\n"
                  "  end\n"
                  "  linear 4\n"
                  "shortcut\n"
                  "  linear 4 bias=false\n"
                  "end\n"
                  "linear 2\n",
                  20 + 20 + 16 + 10, 2);
}

static void test_files(void) {
    fr_ctx *ctx = fr_ctx_new();
    fr_model *m = fr_model_load(ctx, "/nonexistent/x.model");
    CHECK(!m &&
              strstr(fr_last_error(ctx),
                     "/nonexistent/x.model: cannot open the model file: No such file or directory"),
          "missing file: %s", fr_last_error(ctx));
    m = fr_model_load(ctx, "/");
    CHECK(!m && strstr(fr_last_error(ctx), "/: the model file is a directory"), "directory: %s",
          fr_last_error(ctx));
    m = fr_model_load(ctx, NULL);
    CHECK(!m && strstr(fr_last_error(ctx), "no file or built-in name"), "NULL: %s",
          fr_last_error(ctx));
    m = fr_model_load(ctx, "");
    CHECK(!m, "empty name");
    CHECK(allocated(ctx) == 0, "%zu bytes left", allocated(ctx));

    /* An error in a file names the file as given. */
    char path[] = "/tmp/test_modelfile_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0, "mkstemp");
    if (fd >= 0) {
        close(fd);
        char want[256];
        CHECK(write_file(path, "input 1 28 28\n\nconv3d 8\n") == 0, "write %s", path);
        m = fr_model_load(ctx, path);
        snprintf(want, sizeof want, "%s:3:1: unknown layer 'conv3d'", path);
        CHECK(!m && strstr(fr_last_error(ctx), want), "file error: %s", fr_last_error(ctx));
        CHECK(allocated(ctx) == 0, "%zu bytes left", allocated(ctx));

        /* Allocation failures while reading and building: each is reported and
         * leaks nothing; the load succeeds once no allocation fails. */
        CHECK(write_file(path, "input 1 8 8\nconv2d 4 kernel=3\nflatten\nlinear 2 name=x\n") == 0,
              "write");
        int ok = 0;
        for (uint64_t n = 1; n < 100 && !ok; n++) {
            fr_ctx *c2 = fr_ctx_new();
            fr_mem_fail_at(c2, n);
            m = fr_model_load(c2, path);
            if (m) {
                ok = 1;
                fr_model_free(m);
            } else {
                CHECK(strstr(fr_last_error(c2), "out of memory") != NULL, "fail_at %d: %s", (int)n,
                      fr_last_error(c2));
            }
            CHECK(allocated(c2) == 0, "fail_at %d: %zu bytes left", (int)n, allocated(c2));
            fr_ctx_free(c2);
        }
        CHECK(ok, "the file loads once no allocation fails");
        remove(path);
    }
    fr_ctx_free(ctx);

    /* The same for every built-in. */
    static const char *const names[] = {"mlp", "cnn", "resnet"};
    for (size_t i = 0; i < 3; i++) {
        int ok = 0, failures = 0, leaks = 0, silent = 0;
        for (uint64_t n = 1; n < 100000 && !ok; n++) {
            fr_ctx *c2 = fr_ctx_new();
            fr_mem_fail_at(c2, n);
            m = fr_model_load(c2, names[i]);
            if (m) {
                ok = 1;
                fr_model_free(m);
            } else {
                failures++;
                char want[64];
                snprintf(want, sizeof want, "%s.model:", names[i]);
                if (!strstr(fr_last_error(c2), want) || !strstr(fr_last_error(c2), "out of memory"))
                    silent++;
            }
            if (allocated(c2) != 0) leaks++;
            fr_ctx_free(c2);
        }
        CHECK(ok && failures > 0, "%s loads after %d injected failures", names[i], failures);
        CHECK(leaks == 0, "%s: %d injected failures leaked", names[i], leaks);
        CHECK(silent == 0, "%s: %d injected failures without a located 'out of memory'", names[i],
              silent);
    }
}

int main(void) {
    test_builtins();
    test_names();
    test_freeze();
    test_syntax_ok();
    test_errors();
    test_nested_residual();
    test_limits();
    test_files();
    return check_done();
}
