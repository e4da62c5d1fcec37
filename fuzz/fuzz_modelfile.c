/* fuzz_modelfile.c — libFuzzer target for the model-file parser: any bytes
 * must give a model or a message, never a crash, and leave nothing allocated
 * once the model is freed. Seeds: fuzz/corpus/modelfile/ (the built-ins). */
#include "fuzz_common.h"
#include "model/modelfile.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fr_ctx *ctx = fr_ctx_new();
    if (!ctx) return 0;
    fr_model *m = fr_model_parse(ctx, "fuzz.model", (const char *)data, size);
    if (m) {
        (void)fr_model_num_params(m);
        (void)fr_model_num_classes(m);
        fr_model_free(m);
    } else if (!fr_last_error(ctx)[0]) {
        abort(); /* a failure must say why */
    }
    fuzz_end(ctx); /* aborts on a leak */
    return 0;
}
