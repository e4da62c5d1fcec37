/* bpe.h — byte-level BPE inside the tokenizer (tokenizer.c's dispatch reads
 * the files; bpe.c owns the tables, the pre-tokenizer and the merges). */
#ifndef FR_TOK_BPE_H
#define FR_TOK_BPE_H

#include <stddef.h>
#include <stdint.h>
#include "core/ctx.h"

typedef struct fr_bpe fr_bpe;

/* vocab.json's and merges.txt's texts (named in messages). */
fr_status fr_bpe_from_vocab_merges(fr_ctx *ctx, const char *vname, const char *vtext, size_t vlen,
                                   const char *mname, const char *mtext, size_t mlen, fr_bpe **out);
/* A tokenizer.json's text. */
fr_status fr_bpe_from_tokenizer_json(fr_ctx *ctx, const char *name, const char *text, size_t len,
                                     fr_bpe **out);
void fr_bpe_free(fr_bpe *b);

/* A special token matched before pre-tokenization; its id must be a vocab
 * id or past the vocabulary (then the vocabulary grows to hold it). */
fr_status fr_bpe_add_special(fr_bpe *b, const char *content, int id);
/* The id of an added token's content, else of a vocabulary string; -1. */
int fr_bpe_lookup(const fr_bpe *b, const char *s);
int fr_bpe_vocab(const fr_bpe *b);
/* 1 when the pre-tokenizer is GPT-2's regex (after Digits, if any) with
 * no prefix space: a text cut after a newline that an ASCII non-space
 * printable byte follows encodes as the whole text. */
int fr_bpe_cuttable(const fr_bpe *b);
/* BOS as tokenizer.json's TemplateProcessing puts it first; -1: none. */
int fr_bpe_template_bos(const fr_bpe *b);

/* Append the ids of text to *ids (malloc'd, *cap its capacity). */
fr_status fr_bpe_encode(fr_bpe *b, const char *text, size_t len, int32_t **ids, size_t *n,
                        size_t *cap);
/* Append the bytes of ids to *out (malloc'd). */
fr_status fr_bpe_decode(fr_bpe *b, const int32_t *ids, size_t n, char **out, size_t *len,
                        size_t *cap);

#endif
