/* fuzz_weights.c — libFuzzer target for loading weights by name into a GPT
 * (fr_model_load_weights_file): nanoGPT's names with a tied lm_head.weight,
 * or Hugging Face GPT-2's (no "transformer." prefix, Conv1D weights [in,
 * out] transposed on load, attention buffers ignored). Any input loads or is
 * refused (FR_ERR_FORMAT, a message naming the file), never crashes, leaves
 * the weights as they were when refused as malformed, and leaks nothing. The seeds in
 * corpus/weights are this model's init in both layouts and a tie that
 * differs (written by fuzz/corpus/make_weights_corpus.py). */
#include <string.h>
#include "fuzz_common.h"
#include "model/model.h"
#include "model/modelfile.h"
#include "run/checkpoint.h"

static const char model_text[] = "input tokens 4\n"
                                 "embedding 8 8 name=transformer.wte\n"
                                 "pos_embedding 4 name=transformer.wpe\n"
                                 "repeat 1 name=transformer.h\n"
                                 "  residual\n"
                                 "    layernorm 8 name=ln_1\n"
                                 "    linear 24 name=attn.c_attn\n"
                                 "    attention heads=2\n"
                                 "    linear 8 name=attn.c_proj\n"
                                 "  end\n"
                                 "  residual\n"
                                 "    layernorm 8 name=ln_2\n"
                                 "    linear 32 name=mlp.c_fc\n"
                                 "    gelu approximate=tanh\n"
                                 "    linear 8 name=mlp.c_proj\n"
                                 "  end\n"
                                 "end\n"
                                 "layernorm 8 name=transformer.ln_f\n"
                                 "linear 8 bias=false tie=transformer.wte name=lm_head\n"
                                 "loss cross_entropy\n";

static size_t param_bytes(const fr_param *p) {
    return (size_t)fr_shape_numel(&p->shape) * fr_dtype_size(p->dtype);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_model *m = fr_model_parse(ctx, "fuzz.model", model_text, sizeof model_text - 1);
    if (!m) abort(); /* the model text is ours: it must parse */
    fr_st_file f;
    fr_status parsed = fr_st_parse(ctx, "fuzz.safetensors", data, size, &f), st = parsed;
    fuzz_expect_status(st);
    if (parsed == FR_OK && fr_model_init(m, 1) == FR_OK) {
        size_t total = 0;
        for (size_t i = 0; i < m->n_params; i++) total += param_bytes(&m->params[i]);
        uint8_t *before = malloc(total ? total : 1), *at = before;
        if (!before) abort();
        for (size_t i = 0; i < m->n_params; i++) {
            memcpy(at, m->params[i].data, param_bytes(&m->params[i]));
            at += param_bytes(&m->params[i]);
        }
        st = fr_model_load_weights_file(m, "fuzz.safetensors", &f);
        fuzz_expect_status(st);
        if (st != FR_OK && !strstr(fr_last_error(ctx), "fuzz.safetensors")) abort();
        at = before;
        for (size_t i = 0; st == FR_ERR_FORMAT && i < m->n_params; i++) {
            if (memcmp(at, m->params[i].data, param_bytes(&m->params[i])) != 0) abort();
            at += param_bytes(&m->params[i]);
        }
        free(before);
    }
    if (parsed == FR_OK) fr_st_close(ctx, &f);
    fr_model_free(m);
    fuzz_end(ctx);
    return 0;
}
