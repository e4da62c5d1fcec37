/* hf.c — a model from a Hugging Face config.json: LlamaForCausalLM (and
 * MistralForCausalLM, the same network) and GPT2LMHeadModel, built with the
 * graph-level builder under Hugging Face's state_dict names, so the hub's
 * model.safetensors loads strictly into it (fr_model_load_weights).
 *
 * A Llama decoder layer, as modeling_llama.py's LlamaDecoderLayer:
 *   h = x + o_proj(attention(rope(q_proj(n), k_proj(n), v_proj(n)))),  n = input_layernorm(x)
 *   y = h + down_proj(silu(gate_proj(m)) * up_proj(m)),               m = post_attention_layernorm(h)
 * each layer one checkpointing unit; then model.norm and lm_head (tied to
 * model.embed_tokens when tie_word_embeddings). Weights are initialised as
 * _init_weights does: N(0, initializer_range) for linear and embedding
 * weights, biases 0, norms 1. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/file.h"
#include "io/json.h"
#include "model/model.h"

#define HF_CONFIG_MAX (1u << 20)
#define HF_MAX_DIM (1 << 20)
#define HF_MAX_LAYERS 512        /* Llama 3.1 405B has 126 */
#define HF_MAX_CONTEXT (1 << 24) /* positions: max_position_embeddings and rope_scaling's */

typedef struct hf_cfg {
    fr_ctx *ctx;
    const char *path;
    const fr_json *root;
    fr_status st;
} hf_cfg;

/* Member `key` as an integer in [lo, hi]; def when absent or null (def < 0: required). */
static int cfg_int(hf_cfg *c, const char *key, long long def, long long lo, long long hi) {
    if (c->st) return 0;
    const fr_json *v = fr_json_get(c->root, key);
    if (!v || v->kind == FR_JSON_NULL) {
        if (def >= 0) return (int)def;
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT, "%s: \"%s\" is missing", c->path, key);
        return 0;
    }
    if (v->kind != FR_JSON_NUMBER || v->number != floor(v->number) || v->number < (double)lo ||
        v->number > (double)hi) {
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT,
                        "%s: byte %zu: \"%s\" must be an integer in [%lld, %lld]", c->path, v->pos,
                        key, lo, hi);
        return 0;
    }
    return (int)v->number;
}

static double cfg_num(hf_cfg *c, const fr_json *obj, const char *key, double def) {
    if (c->st) return 0;
    const fr_json *v = fr_json_get(obj, key);
    if (!v || v->kind == FR_JSON_NULL) return def;
    if (v->kind != FR_JSON_NUMBER || !(v->number > 0.0) || !isfinite(v->number)) {
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT, "%s: byte %zu: \"%s\" must be a positive number",
                        c->path, v->pos, key);
        return 0;
    }
    return v->number;
}

static int cfg_bool(hf_cfg *c, const char *key, int def) {
    if (c->st) return 0;
    const fr_json *v = fr_json_get(c->root, key);
    if (!v || v->kind == FR_JSON_NULL) return def;
    if (v->kind != FR_JSON_BOOL) {
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT, "%s: byte %zu: \"%s\" must be true or false",
                        c->path, v->pos, key);
        return 0;
    }
    return v->boolean;
}

static const char *cfg_str(hf_cfg *c, const char *key, const char *def) {
    if (c->st) return def;
    const fr_json *v = fr_json_get(c->root, key);
    if (!v || v->kind == FR_JSON_NULL) return def;
    if (v->kind != FR_JSON_STRING) {
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT, "%s: byte %zu: \"%s\" must be a string", c->path,
                        v->pos, key);
        return def;
    }
    return v->str;
}

/* "<prefix>.<layer>.<what>" in b (FR_ST_NAME_MAX bytes) */
static const char *lname(char *b, const char *prefix, int layer, const char *what) {
    snprintf(b, FR_ST_NAME_MAX, "%s.%d.%s", prefix, layer, what);
    return b;
}

/* Name the layer made last; st set on failure. */
static fr_val named(fr_model *m, fr_val v, fr_status *st, const char *name) {
    if (*st) return FR_NO_VAL;
    if (v == FR_NO_VAL) {
        *st = m->status ? m->status : FR_ERR_ARG;
        return v;
    }
    if ((*st = fr_model_name_last(m, name))) return FR_NO_VAL;
    return v;
}

static fr_val linear_std(fr_model *m, fr_val x, int out, int bias, float std, fr_status *st,
                         const char *name) {
    if (*st) return FR_NO_VAL;
    fr_val y = named(m, fr_linear(m, x, out, bias), st, name);
    if (!*st) *st = fr_model_init_std_last(m, std);
    return *st ? FR_NO_VAL : y;
}

/* rope_scaling: null, or {"rope_type" (or "type"): "default" | "linear" | "llama3", ...} */
static void rope_of(hf_cfg *c, fr_rope *r) {
    memset(r, 0, sizeof *r);
    r->theta = (float)cfg_num(c, c->root, "rope_theta", 10000.0);
    const fr_json *s = fr_json_get(c->root, "rope_scaling");
    if (c->st || !s || s->kind == FR_JSON_NULL) return;
    const fr_json *t = fr_json_get(s, "rope_type");
    if (!t) t = fr_json_get(s, "type");
    if (s->kind != FR_JSON_OBJECT || !t || t->kind != FR_JSON_STRING) {
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT,
                        "%s: byte %zu: \"rope_scaling\" must be null or an object with a "
                        "\"rope_type\"",
                        c->path, s->pos);
        return;
    }
    if (!strcmp(t->str, "default")) return;
    if (!strcmp(t->str, "linear")) {
        r->type = FR_ROPE_LINEAR;
        r->factor = (float)cfg_num(c, s, "factor", 0);
    } else if (!strcmp(t->str, "llama3")) {
        r->type = FR_ROPE_LLAMA3;
        r->factor = (float)cfg_num(c, s, "factor", 0);
        r->low_freq_factor = (float)cfg_num(c, s, "low_freq_factor", 1.0);
        r->high_freq_factor = (float)cfg_num(c, s, "high_freq_factor", 4.0);
        const double oc = cfg_num(c, s, "original_max_position_embeddings", 8192);
        if (!c->st && !(oc >= 1 && oc <= HF_MAX_CONTEXT && oc == floor(oc))) {
            c->st = fr_fail(c->ctx, FR_ERR_FORMAT,
                            "%s: rope_scaling's \"original_max_position_embeddings\" must be an "
                            "integer in [1, %d]",
                            c->path, HF_MAX_CONTEXT);
            return;
        }
        r->orig_context = (int)oc;
    } else {
        c->st = fr_fail(c->ctx, FR_ERR_FORMAT,
                        "%s: byte %zu: rope_scaling type \"%.40s\" is not supported (supported: "
                        "default, linear, llama3)",
                        c->path, t->pos, t->str);
        return;
    }
    if (!c->st && !(r->factor > 0.0f))
        c->st =
            fr_fail(c->ctx, FR_ERR_FORMAT, "%s: rope_scaling needs a positive \"factor\"", c->path);
}

static fr_model *build_llama(hf_cfg *c, int mistral) {
    fr_ctx *ctx = c->ctx;
    const int V = cfg_int(c, "vocab_size", -1, 1, 1 << 24);
    const int C = cfg_int(c, "hidden_size", -1, 1, HF_MAX_DIM);
    const int I = cfg_int(c, "intermediate_size", -1, 1, HF_MAX_DIM);
    const int L = cfg_int(c, "num_hidden_layers", -1, 1, HF_MAX_LAYERS);
    const int NH = cfg_int(c, "num_attention_heads", -1, 1, 4096);
    const int NKV = cfg_int(c, "num_key_value_heads", NH, 1, 4096);
    const int HD = cfg_int(c, "head_dim", NH ? C / NH : 1, 1, HF_MAX_DIM);
    int T = cfg_int(c, "max_position_embeddings", 2048, 1, HF_MAX_CONTEXT);
    const float eps = (float)cfg_num(c, c->root, "rms_norm_eps", 1e-6);
    const float std = (float)cfg_num(c, c->root, "initializer_range", 0.02);
    const int tied = cfg_bool(c, "tie_word_embeddings", 0);
    const int abias = cfg_bool(c, "attention_bias", 0), mbias = cfg_bool(c, "mlp_bias", 0);
    const char *act = cfg_str(c, "hidden_act", "silu");
    fr_rope rope;
    rope_of(c, &rope);
    if (c->st) return NULL;
    if (strcmp(act, "silu")) {
        fr_fail(ctx, FR_ERR_FORMAT, "%s: hidden_act \"%.40s\" is not supported (Llama's is silu)",
                c->path, act);
        return NULL;
    }
    if (NH % NKV || HD % 2 || (!fr_json_get(c->root, "head_dim") && C % NH)) {
        fr_fail(ctx, FR_ERR_FORMAT,
                "%s: num_attention_heads %d, num_key_value_heads %d, head_dim %d: the kv heads "
                "must divide the heads, the head dim be even (and divide hidden_size %d)",
                c->path, NH, NKV, HD, C);
        return NULL;
    }
    if (mistral) { /* within its window, sliding-window attention is causal attention */
        const int w = cfg_int(c, "sliding_window", 0, 0, 1 << 24);
        if (c->st) return NULL;
        if (w > 0 && w < T) T = w;
    }
    if (rope.type == FR_ROPE_LLAMA3 && rope.orig_context <= 0) rope.orig_context = 8192;
    fr_model *m = fr_model_new_tokens(ctx, T);
    if (!m) return NULL;
    fr_status st = FR_OK;
    fr_val x = named(m, fr_embedding(m, FR_MODEL_INPUT, V, C), &st, "model.embed_tokens");
    if (!st) st = fr_model_init_std_last(m, std);
    const char *lf = "model.layers";
    char nb[FR_ST_NAME_MAX];
    for (int l = 0; l < L && !st; l++) {
        if ((st = fr_model_block_begin(m))) break;
        fr_val n = named(m, st ? FR_NO_VAL : fr_rmsnorm(m, x, C, eps), &st,
                         lname(nb, lf, l, "input_layernorm"));
        fr_val q = linear_std(m, n, NH * HD, abias, std, &st, lname(nb, lf, l, "self_attn.q_proj"));
        fr_val k =
            linear_std(m, n, NKV * HD, abias, std, &st, lname(nb, lf, l, "self_attn.k_proj"));
        fr_val v =
            linear_std(m, n, NKV * HD, abias, std, &st, lname(nb, lf, l, "self_attn.v_proj"));
        fr_val qkv = st ? FR_NO_VAL : fr_rope_qkv(m, q, k, v, NH, NKV, &rope);
        qkv = named(m, qkv, &st, lname(nb, lf, l, "self_attn.rotary_emb"));
        fr_val a = named(m, st ? FR_NO_VAL : fr_attention_gqa(m, qkv, NH, NKV), &st,
                         lname(nb, lf, l, "self_attn.attn"));
        fr_val o = linear_std(m, a, C, abias, std, &st, lname(nb, lf, l, "self_attn.o_proj"));
        fr_val h =
            named(m, st ? FR_NO_VAL : fr_add(m, x, o), &st, lname(nb, lf, l, "residual_attn"));
        fr_val n2 = named(m, st ? FR_NO_VAL : fr_rmsnorm(m, h, C, eps), &st,
                          lname(nb, lf, l, "post_attention_layernorm"));
        fr_val g = linear_std(m, n2, I, mbias, std, &st, lname(nb, lf, l, "mlp.gate_proj"));
        fr_val u = linear_std(m, n2, I, mbias, std, &st, lname(nb, lf, l, "mlp.up_proj"));
        fr_val s =
            named(m, st ? FR_NO_VAL : fr_swiglu(m, g, u), &st, lname(nb, lf, l, "mlp.act_fn"));
        fr_val d = linear_std(m, s, C, mbias, std, &st, lname(nb, lf, l, "mlp.down_proj"));
        x = named(m, st ? FR_NO_VAL : fr_add(m, h, d), &st, lname(nb, lf, l, "residual_mlp"));
        if (!st) st = fr_model_block_end(m);
    }
    x = named(m, st ? FR_NO_VAL : fr_rmsnorm(m, x, C, eps), &st, "model.norm");
    if (!st) {
        fr_val z = named(m, st ? FR_NO_VAL : fr_linear(m, x, V, 0), &st, "lm_head");
        (void)z;
        if (!st)
            st = tied ? fr_model_tie_last(m, "model.embed_tokens") : fr_model_init_std_last(m, std);
    }
    if (st) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

/* GPT2LMHeadModel: nanoGPT's names (transformer.h.N...), so GPT-2's hub
 * files load as they do into the built-in gpt2 (Conv1D weights transposed,
 * the prefix-less names of GPT2Model's file accepted). */
static fr_model *build_gpt2(hf_cfg *c) {
    fr_ctx *ctx = c->ctx;
    const int V = cfg_int(c, "vocab_size", -1, 1, 1 << 24);
    const int C = cfg_int(c, "n_embd", -1, 1, HF_MAX_DIM);
    const int L = cfg_int(c, "n_layer", -1, 1, HF_MAX_LAYERS);
    const int NH = cfg_int(c, "n_head", -1, 1, 4096);
    const int T = cfg_int(c, "n_positions", 1024, 1, 1 << 24);
    const int I = cfg_int(c, "n_inner", 4LL * (C > 0 ? C : 1), 1, HF_MAX_DIM);
    const float eps = (float)cfg_num(c, c->root, "layer_norm_epsilon", 1e-5);
    const float std = (float)cfg_num(c, c->root, "initializer_range", 0.02);
    const int tied = cfg_bool(c, "tie_word_embeddings", 1);
    const char *act = cfg_str(c, "activation_function", "gelu_new");
    if (c->st) return NULL;
    if (strcmp(act, "gelu_new") && strcmp(act, "gelu_pytorch_tanh")) {
        fr_fail(ctx, FR_ERR_FORMAT,
                "%s: activation_function \"%.40s\" is not supported (GPT-2's is gelu_new, the "
                "tanh approximation)",
                c->path, act);
        return NULL;
    }
    if (C % NH) {
        fr_fail(ctx, FR_ERR_FORMAT, "%s: n_head %d does not divide n_embd %d", c->path, NH, C);
        return NULL;
    }
    if (!tied) {
        fr_fail(ctx, FR_ERR_FORMAT,
                "%s: GPT2LMHeadModel with tie_word_embeddings false is not supported (GPT-2 ties "
                "lm_head to wte)",
                c->path);
        return NULL;
    }
    fr_model *m = fr_model_new_tokens(ctx, T);
    if (!m) return NULL;
    fr_status st = FR_OK;
    const float pstd = std / sqrtf(2.0f * (float)L); /* GPT-2's residual projections */
    fr_val x = named(m, fr_embedding(m, FR_MODEL_INPUT, V, C), &st, "transformer.wte");
    if (!st) st = fr_model_init_std_last(m, std);
    x = named(m, st ? FR_NO_VAL : fr_pos_embedding(m, x, T), &st, "transformer.wpe");
    if (!st) st = fr_model_init_std_last(m, std);
    const char *lf = "transformer.h";
    char nb[FR_ST_NAME_MAX];
    for (int l = 0; l < L && !st; l++) {
        if ((st = fr_model_block_begin(m))) break;
        fr_val n = named(m, st ? FR_NO_VAL : fr_layernorm(m, x, C), &st, lname(nb, lf, l, "ln_1"));
        if (!st) m->layers[m->n_layers - 1].eps = eps;
        fr_val qkv = linear_std(m, n, 3 * C, 1, std, &st, lname(nb, lf, l, "attn.c_attn"));
        fr_val a =
            named(m, st ? FR_NO_VAL : fr_attention(m, qkv, NH), &st, lname(nb, lf, l, "attn.attn"));
        fr_val o = linear_std(m, a, C, 1, pstd, &st, lname(nb, lf, l, "attn.c_proj"));
        fr_val h =
            named(m, st ? FR_NO_VAL : fr_add(m, x, o), &st, lname(nb, lf, l, "residual_attn"));
        fr_val n2 = named(m, st ? FR_NO_VAL : fr_layernorm(m, h, C), &st, lname(nb, lf, l, "ln_2"));
        if (!st) m->layers[m->n_layers - 1].eps = eps;
        fr_val f = linear_std(m, n2, I, 1, std, &st, lname(nb, lf, l, "mlp.c_fc"));
        fr_val g = named(m, st ? FR_NO_VAL : fr_gelu(m, f, 1), &st, lname(nb, lf, l, "mlp.act"));
        fr_val p = linear_std(m, g, C, 1, pstd, &st, lname(nb, lf, l, "mlp.c_proj"));
        x = named(m, st ? FR_NO_VAL : fr_add(m, h, p), &st, lname(nb, lf, l, "residual_mlp"));
        if (!st) st = fr_model_block_end(m);
    }
    x = named(m, st ? FR_NO_VAL : fr_layernorm(m, x, C), &st, "transformer.ln_f");
    if (!st) m->layers[m->n_layers - 1].eps = eps;
    if (!st) {
        named(m, st ? FR_NO_VAL : fr_linear(m, x, V, 0), &st, "lm_head");
        if (!st) st = fr_model_tie_last(m, "transformer.wte");
    }
    if (st) {
        fr_model_free(m);
        return NULL;
    }
    return m;
}

static int is_dir(const char *p) {
    struct stat s;
    return stat(p, &s) == 0 && S_ISDIR(s.st_mode);
}

fr_model *fr_model_from_hf(fr_ctx *ctx, const char *path) {
    char file[4096];
    if (is_dir(path)) {
        size_t n = strlen(path);
        snprintf(file, sizeof file, "%s%sconfig.json", path, n && path[n - 1] == '/' ? "" : "/");
    } else {
        snprintf(file, sizeof file, "%s", path);
    }
    char *text = NULL;
    size_t size = 0;
    if (fr_read_small(ctx, file, "model config", HF_CONFIG_MAX, &text, &size)) return NULL;
    fr_model *m = fr_model_from_hf_text(ctx, file, text, size);
    fr_free(ctx, text);
    return m;
}

fr_model *fr_model_from_hf_text(fr_ctx *ctx, const char *file, const char *text, size_t size) {
    fr_json root;
    fr_status st = fr_json_parse(ctx, file, text, size, &root);
    if (st) return NULL;
    hf_cfg c = {ctx, file, &root, FR_OK};
    fr_model *m = NULL;
    const fr_json *arch = root.kind == FR_JSON_OBJECT ? fr_json_get(&root, "architectures") : NULL;
    const char *name =
        arch && arch->kind == FR_JSON_ARRAY && arch->n == 1 && arch->items[0].kind == FR_JSON_STRING
            ? arch->items[0].str
            : NULL;
    if (root.kind != FR_JSON_OBJECT)
        fr_fail(ctx, FR_ERR_FORMAT, "%s: a config.json is a JSON object", file);
    else if (!name)
        fr_fail(ctx, FR_ERR_FORMAT,
                "%s: \"architectures\" must be a list of one name (supported: LlamaForCausalLM, "
                "MistralForCausalLM, GPT2LMHeadModel)",
                file);
    else if (!strcmp(name, "LlamaForCausalLM")) m = build_llama(&c, 0);
    else if (!strcmp(name, "MistralForCausalLM")) m = build_llama(&c, 1);
    else if (!strcmp(name, "GPT2LMHeadModel")) m = build_gpt2(&c);
    else
        fr_fail(ctx, FR_ERR_FORMAT,
                "%s: architecture \"%.60s\" is not supported (supported: LlamaForCausalLM, "
                "MistralForCausalLM, GPT2LMHeadModel)",
                file, name);
    fr_json_free(ctx, &root);
    return m;
}
