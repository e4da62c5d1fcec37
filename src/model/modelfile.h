/* modelfile.h — the model-file format (models/README.md): text in, a model
 * built through the public builder calls out. fr_model_load (frugal.h) reads
 * a file or picks a built-in; fr_model_parse works on text already in memory
 * (tests, the fuzzer). Neither knows model internals. */
#ifndef FR_MODELFILE_H
#define FR_MODELFILE_H

#include <stddef.h>
#include "frugal.h"

/* Parse len bytes of model-file text (no NUL needed). name_for_messages
 * starts every error message ("name:line:col: fault"). Returns NULL with the
 * message in fr_last_error(ctx) and nothing left allocated on failure. */
fr_model *fr_model_parse(fr_ctx *ctx, const char *name_for_messages, const char *text, size_t len);

/* The text of a built-in model ("mlp", "cnn", "resnet"), identical to
 * models/<name>.model; NULL for any other name. */
const char *fr_modelfile_builtin(const char *name);

#endif
