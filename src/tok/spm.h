/* spm.h — the C face of spm.cc, a shim over libsentencepiece's
 * SentencePieceProcessor (the real library, Debian's libsentencepiece).
 * Each call catches what C++ throws; a fault is a message in err. */
#ifndef FR_TOK_SPM_H
#define FR_TOK_SPM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct fr_spm fr_spm;

/* A serialized ModelProto (tokenizer.model's bytes); NULL with err set. */
fr_spm *fr_spm_load(const void *bytes, size_t len, char *err, size_t errlen);
void fr_spm_free(fr_spm *s);
int fr_spm_vocab(const fr_spm *s);
int fr_spm_bos(const fr_spm *s); /* -1: none */
int fr_spm_eos(const fr_spm *s);
/* Append to *ids (malloc'd, capacity *cap). 0, or -1 with err set. */
int fr_spm_encode(fr_spm *s, const char *text, size_t len, int32_t **ids, size_t *n, size_t *cap,
                  char *err, size_t errlen);
/* *text malloc'd, NUL-terminated; ids must lie in [0, vocab). */
int fr_spm_decode(fr_spm *s, const int32_t *ids, size_t n, char **text, size_t *len, char *err,
                  size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
