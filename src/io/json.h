/* json.h — a strict reader of JSON text (RFC 8259) into a tree: objects,
 * arrays, strings (escapes and \u surrogate pairs decoded to UTF-8),
 * numbers, true, false, null. Refusals name the file and the byte
 * position. For configuration files (PEFT's adapter_config.json) and
 * tokenizer files (a GPT-2-sized tokenizer.json of 1.5 MB: 50k tokens and
 * 50k merges, read and tabled in about 0.2 s); the safetensors header keeps
 * its own lexer (safetensors.c). */
#ifndef FR_JSON_H
#define FR_JSON_H

#include <stddef.h>
#include "core/ctx.h"

typedef enum fr_json_kind {
    FR_JSON_NULL = 0,
    FR_JSON_BOOL,
    FR_JSON_NUMBER,
    FR_JSON_STRING,
    FR_JSON_ARRAY,
    FR_JSON_OBJECT
} fr_json_kind;

typedef struct fr_json {
    fr_json_kind kind;
    int boolean;
    double number;
    char *str;             /* a string's bytes, NUL-terminated (an embedded NUL is refused) */
    size_t n;              /* array items or object members */
    struct fr_json *items; /* [n] */
    char **keys;           /* an object's member names [n] */
    size_t pos;            /* byte offset of the value in the text */
} fr_json;

#define FR_JSON_MAX_DEPTH 64

/* Parse text[0..len) (one value, whitespace around it); *out freed by
 * fr_json_free. FR_ERR_FORMAT with "<name>: byte N: <fault>". */
fr_status fr_json_parse(fr_ctx *ctx, const char *name, const char *text, size_t len, fr_json *out);
void fr_json_free(fr_ctx *ctx, fr_json *v);
/* An object's member `key` (the last if repeated), or NULL. */
const fr_json *fr_json_get(const fr_json *obj, const char *key);

#endif
