/* tokenizer.h — text to token ids and back, from the files models ship with.
 *
 * Kinds (fr_tokenizer_kind):
 *   "sentencepiece"  tokenizer.model (Llama, TinyLlama, Mistral) through
 *                    libsentencepiece's SentencePieceProcessor (spm.cc).
 *   "bpe"            byte-level BPE as OpenAI's GPT-2 encoder.py defines it
 *                    (bpe.c): vocab.json + merges.txt, or a tokenizer.json of
 *                    model type BPE with a ByteLevel pre-tokenizer (alone or
 *                    after Split / Digits in a Sequence, as SmolLM ships).
 *
 * Invalid UTF-8: byte-level BPE takes any bytes (a run of bytes that is not
 * UTF-8 is a piece of its own, BPE'd like any other: decode(encode(x)) == x
 * for every x). SentencePiece replaces each byte of an invalid sequence by
 * U+FFFD before it encodes (its normalizer does; the piece is unknown unless
 * the model has byte fallback), so such text does not come back.
 *
 * An encoder keeps a cache and scratch buffers: one thread at a time. */
#ifndef FR_TOKENIZER_H
#define FR_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>
#include "core/ctx.h"

typedef struct fr_tokenizer fr_tokenizer;
/* FILE: tokenizer.model (SentencePiece), tokenizer.json (BPE, ByteLevel), vocab.json (with
 * merges.txt beside it); DIR: the first of those it holds. NULL with fr_last_error(ctx) set. */
fr_tokenizer *fr_tokenizer_load(fr_ctx *ctx, const char *file_or_dir);
void fr_tokenizer_free(fr_tokenizer *t);
const char *fr_tokenizer_kind(const fr_tokenizer *t); /* "sentencepiece" | "bpe" */
int fr_tokenizer_vocab(const fr_tokenizer *t);        /* ids are 0 .. vocab-1 */
int fr_tokenizer_bos(const fr_tokenizer *t);          /* -1: none */
int fr_tokenizer_eos(const fr_tokenizer *t);          /* -1: none */
int fr_tokenizer_adds_bos(const fr_tokenizer *t);     /* HF's add_bos_token (Llama: 1) */
/* ids: a growable array the caller frees with free(); add_bos: prepend BOS when it has one */
fr_status fr_tokenizer_encode(fr_tokenizer *t, const char *text, size_t len, int add_bos,
                              int32_t **ids, size_t *n);
fr_status fr_tokenizer_decode(fr_tokenizer *t, const int32_t *ids, size_t n, char **text,
                              size_t *len);
/* Streaming decode for generate: push one id, get the bytes that are final so far.
 * *bytes is malloc'd (free()), NUL-terminated, possibly empty; the pushes'
 * bytes and the flush's are decode(all ids). A trailing incomplete UTF-8
 * character or U+FFFD (byte fallback in progress) waits for the next id. */
typedef struct fr_tok_stream fr_tok_stream;
fr_tok_stream *fr_tok_stream_new(fr_tokenizer *t);
fr_status fr_tok_stream_push(fr_tok_stream *s, int32_t id, char **bytes, size_t *len);
fr_status fr_tok_stream_flush(fr_tok_stream *s, char **bytes, size_t *len);
void fr_tok_stream_free(fr_tok_stream *s);

/* ---- additions to the plan's API ------------------------------------------ */

/* The file it was read from (a directory resolved to its file). */
const char *fr_tokenizer_path(const fr_tokenizer *t);
/* A model of model_vocab embedding rows can take every id of t: t's vocab
 * must not exceed it (a smaller one is a padded embedding, as llm.c's
 * 50304 rows for GPT-2's 50257 ids). FR_ERR_ARG naming the file and both
 * sizes otherwise. */
fr_status fr_tokenizer_check_vocab(fr_ctx *ctx, const fr_tokenizer *t, int model_vocab);

/* 1 when a text may be encoded in parts cut after a newline that an ASCII
 * non-space printable byte follows, with the ids of the whole text (GPT-2's
 * pre-tokenizer never joins two pieces across such a cut); 0 for
 * SentencePiece (a part's dummy-prefix space), a BPE that adds a prefix
 * space, or one with its own Split pattern. */
int fr_tokenizer_cuttable(const fr_tokenizer *t);
/* The first place at or after `from` in t[0..n) where such a cut may be
 * made (just after a newline that an ASCII non-space printable byte
 * follows), or n when there is none. */
size_t fr_tokenizer_next_cut(const char *t, size_t n, size_t from);

#endif
