/* fuzz_hf_config.c — libFuzzer target for the Hugging Face config reader
 * (model/hf.c: config.json -> a Llama, Mistral or GPT-2 model through the
 * builder): any input is accepted or refused, never crashes, and allocates
 * nothing that outlives the call. Sizes are what the builder checks (a
 * model of 2^31 values a tensor is refused before anything is allocated:
 * it allocates no parameter). */
#include "fuzz_common.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_model *m = fr_model_from_hf_text(ctx, "config.json", (const char *)data, size);
    if (m) fr_model_free(m);
    fuzz_end(ctx);
    return 0;
}
