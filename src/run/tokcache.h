/* tokcache.h — text data tokenized once for a model with a tokenizer
 * (tokcache.c says where the cache lives and what it holds). */
#ifndef FR_TOKCACHE_H
#define FR_TOKCACHE_H

#include "data/tokens.h"
#include "tok/tokenizer.h"

/* Tokenize the text data at `data` (a file, directory or glob, as
 * fr_tokens_open reads it) with tok into a cache .npy, or find the cache a
 * run before made; *out gets its path (free()). Says on stderr what it did
 * unless quiet. FR_ERR_ARG when data is not text (already token ids). */
fr_status fr_tokenize_cached(fr_ctx *ctx, fr_tokenizer *tok, const char *data, char **out,
                             int quiet);

#endif
