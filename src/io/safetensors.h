/* safetensors.h — read and write the safetensors format
 * (8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value"}}, then the data). A reader validates
 * everything before trusting it: header length within the file, JSON well
 * formed, known dtypes, offsets inside the data and matching shape x dtype,
 * no overlaps, no gaps. Writes are atomic: temporary file, fsync, rename. */
#ifndef FR_SAFETENSORS_H
#define FR_SAFETENSORS_H

#include "core/ctx.h"
#include "core/tensor.h"

#define FR_ST_NAME_MAX 160
#define FR_ST_META_MAX 32

typedef struct fr_st_entry {
    char name[FR_ST_NAME_MAX];
    fr_dtype dtype;
    fr_shape shape; /* ndim 0 is a scalar (one element) */
    const void *data; /* write: source bytes; read: points into the file's data */
    size_t nbytes;
} fr_st_entry;

typedef struct fr_st_meta {
    char key[64];
    char value[256];
} fr_st_meta;

typedef struct fr_st_file {
    fr_st_entry *entries;
    int n;
    fr_st_meta meta[FR_ST_META_MAX];
    int n_meta;
    void *blob; /* whole file contents (category passed to fr_st_read) */
} fr_st_file;

fr_status fr_st_write(fr_ctx *ctx, const char *path, const fr_st_entry *e, int n,
                      const fr_st_meta *meta, int n_meta);
/* Parse from memory (the fuzz target's entry point); buf is kept, not copied. */
fr_status fr_st_parse(fr_ctx *ctx, const char *path_for_messages, const void *buf, size_t len,
                      fr_st_file *out);
fr_status fr_st_read(fr_ctx *ctx, const char *path, fr_st_file *out, fr_mem_cat cat);
const fr_st_entry *fr_st_find(const fr_st_file *f, const char *name);
const char *fr_st_meta_get(const fr_st_file *f, const char *key);
void fr_st_close(fr_ctx *ctx, fr_st_file *f);

/* Write `bytes` to path atomically (temporary in the same directory, fsync,
 * rename, fsync of the directory). Used by every writer of files. */
fr_status fr_write_atomic(fr_ctx *ctx, const char *path, const void *bytes, size_t len);

#endif
