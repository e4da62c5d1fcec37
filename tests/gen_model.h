/* gen_model.h — the GPT that the generation tests run (test_generate.c on
 * the CPU, test_generate_device.c on a device against the CPU): context T,
 * vocabulary V, width C, NLAYER blocks of 4 heads, the head tied to the
 * token embedding, in the model-file language (model/modelfile.h). */
#ifndef FR_TEST_GEN_MODEL_H
#define FR_TEST_GEN_MODEL_H

#define T 16 /* context */
#define V 37 /* vocabulary */
#define C 24 /* d_model */
#define NLAYER 2

static const char *gpt_text = "input tokens 16\n"
                              "embedding 37 24 std=0.5 name=wte\n"
                              "pos_embedding 16 std=0.5 name=wpe\n"
                              "repeat 2 name=h\n"
                              "  residual\n"
                              "    layernorm 24 name=ln_1\n"
                              "    linear 72 std=0.4 name=attn.c_attn\n"
                              "    attention heads=4\n"
                              "    linear 24 std=0.3 name=attn.c_proj\n"
                              "  end\n"
                              "  residual\n"
                              "    layernorm 24 name=ln_2\n"
                              "    linear 96 std=0.3 name=mlp.c_fc\n"
                              "    gelu approximate=tanh\n"
                              "    linear 24 std=0.3 name=mlp.c_proj\n"
                              "  end\n"
                              "end\n"
                              "layernorm 24 name=ln_f\n"
                              "linear 37 bias=false tie=wte name=lm_head\n"
                              "loss cross_entropy\n";

#endif
