/* safetensors.h — read and write the safetensors format
 * (8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
 *  "__metadata__": {"key": "value"}}, then the data). A reader validates
 * everything before trusting it: header length within the file, JSON well
 * formed, known dtypes, offsets inside the data and matching shape x dtype,
 * no overlaps, no gaps. fr_st_read reads the header only, checks every
 * offset against the file's size, and reads a tensor's bytes when the caller
 * asks for them (fr_st_load): a file much larger than what is used costs
 * only its header. Writes are atomic: temporary file, fsync, rename; a write
 * first removes temporaries of its own path left by dead processes. */
#ifndef FR_SAFETENSORS_H
#define FR_SAFETENSORS_H

#include "core/ctx.h"
#include "core/tensor.h"

#define FR_ST_NAME_MAX 160
#define FR_ST_META_MAX 32

typedef struct fr_st_entry {
    char name[FR_ST_NAME_MAX];
    fr_dtype dtype;
    fr_shape shape;   /* ndim 0 is a scalar (one element) */
    const void *data; /* write: source bytes; fr_st_parse: points into the buffer;
                         fr_st_read: NULL (fr_st_load copies the bytes out) */
    size_t nbytes;
    uint64_t offset; /* read: begin of the bytes within the data section */
    int part;        /* a sharded set (fr_st_open): the file of parts[] holding it */
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
    void *blob;       /* freed by fr_st_close (a caller of fr_st_parse may hand its buffer over) */
    char *path;       /* fr_st_read: the file's path (for messages); NULL otherwise */
    int fd;           /* fr_st_read: the open file (valid while path is set) */
    uint64_t data_at; /* fr_st_read: file position of the data section */
    /* fr_st_open of a sharded set: the shards, each open (fr_st_read), and
     * entries[] all of theirs, each naming its part */
    struct fr_st_file *parts;
    int n_parts;
} fr_st_file;

fr_status fr_st_write(fr_ctx *ctx, const char *path, const fr_st_entry *e, int n,
                      const fr_st_meta *meta, int n_meta);
/* Parse from memory (the fuzz target's entry point); buf is kept, not copied. */
fr_status fr_st_parse(fr_ctx *ctx, const char *path_for_messages, const void *buf, size_t len,
                      fr_st_file *out);
/* Open path (a regular file: FIFOs and directories are refused without
 * blocking), read and check the header against the file's size; the header
 * and the entry table are allocated in category cat. No tensor data is read. */
fr_status fr_st_read(fr_ctx *ctx, const char *path, fr_st_file *out, fr_mem_cat cat);
/* Copy entry e's nbytes into dst: from the buffer (fr_st_parse) or with
 * pread from the file (fr_st_read); a short read is an error naming the
 * tensor and the position. */
fr_status fr_st_load(fr_ctx *ctx, const fr_st_file *f, const fr_st_entry *e, void *dst);
const fr_st_entry *fr_st_find(const fr_st_file *f, const char *name);

/* Weights as Hugging Face stores them (shards.c): path a safetensors file
 * (fr_st_read), an index ("model.safetensors.index.json": {"weight_map":
 * {tensor: shard file}}, the shards beside it), or a directory holding
 * model.safetensors or model.safetensors.index.json. A sharded set opens
 * every shard and checks the index against them: a shard that is missing,
 * a tensor the index names that its shard lacks, a tensor a shard holds
 * that the index does not name (or names in another shard), or a tensor in
 * two shards is refused, naming the files. *resolved (when not NULL) gets
 * the file that was opened (the index for a set); the caller frees it with
 * fr_free. */
fr_status fr_st_open(fr_ctx *ctx, const char *path, fr_st_file *out, fr_mem_cat cat,
                     char **resolved);
const char *fr_st_meta_get(const fr_st_file *f, const char *key);
void fr_st_close(fr_ctx *ctx, fr_st_file *f);

/* Whether fr_st_write(path) can succeed as far as can be told before any
 * work: path is not a directory (nor another non-regular file), its
 * directory exists, is a directory and is writable. */
fr_status fr_st_check_writable(fr_ctx *ctx, const char *path);

/* Write `bytes` to path atomically (temporary in the same directory, fsync,
 * rename, fsync of the directory). Used by every writer of files. */
fr_status fr_write_atomic(fr_ctx *ctx, const char *path, const void *bytes, size_t len);

#endif
