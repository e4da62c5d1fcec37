/* tokens.h — token data for language models: one long 1-D stream of token
 * ids, read lazily with pread, split into a training part and a validation
 * part at its end, and cut into batches of next-token windows.
 *
 * Sources (fr_tokens_open; the kind of each file by extension, then content):
 *   text     any other file: byte-level, token = byte value (vocabulary 256)
 *   shards   llm.c `.bin`: 256 little-endian int32 header words ([0] magic
 *            20240520, [1] version 1, [2] token count n), then n uint16
 *            tokens; the file is exactly 1024 + 2n bytes
 *   npy      `.npy`: a 1-D C-order little-endian array of u1, u2, i4 or i8
 * A path is a file, a directory (walked recursively, entries in byte order
 * of their names, each directory where its name sorts; skipped: names
 * starting with '.', `*.dat` (fortune's index files) and anything that is
 * not a regular file or a directory, symlinks included: `*.u8` in Debian's
 * fortunes are symlinks to the text beside them), or, when no such path
 * exists and it holds one of `*?[`, a glob(3) pattern whose sorted matches
 * are each a file or a directory. The files are concatenated in that order;
 * all must be of one kind. Memory: the open files (at most
 * FR_TOKENS_MAX_FILES descriptors) and a small index of them, whatever the
 * data size.
 *
 * Split (fr_tokens_split): the last n_val = floor(len * val_fraction) tokens
 * (the product in double precision, as Python's math.floor(len * f)) are
 * validation, the first n_train = len - n_val training. A part in use
 * must hold at least T + 1 tokens (one window and its last target).
 *
 * Batches (fr_token_loader): a part [begin, end) of len tokens holds
 * W = (len - 1) / T non-overlapping windows; window k starts at
 * s = begin + k*T, and gives x = tokens[s, s+T), y = tokens[s+1, s+T+1).
 * An epoch has W / B batches of B windows (drop_last). With shuffle, epoch e
 * takes the windows in the order of loader.c's permutation: the identity,
 * then r = fr_rng_make(seed, 1000 + e) and
 *     for i = W-1 down to 1: j = fr_rng_below(&r, i + 1); swap(perm[i], perm[j])
 * (bench/token_order.py computes the same order in Python); batch b holds
 * windows perm[b*B .. b*B + B). Without shuffle (validation) the windows come
 * in order. */
#ifndef FR_TOKENS_H
#define FR_TOKENS_H

#include <stddef.h>
#include "core/ctx.h"
#include "data/prefetch.h"

#define FR_SHARD_MAGIC 20240520
#define FR_SHARD_VERSION 1
#define FR_SHARD_HEADER_BYTES 1024
#define FR_TOKENS_MAX_FILES 1024

typedef struct fr_tokens fr_tokens;

typedef enum fr_tokens_kind { FR_TOKENS_TEXT, FR_TOKENS_SHARDS, FR_TOKENS_NPY } fr_tokens_kind;

/* A file, a directory or a glob pattern (see above). Every file's header is
 * checked here (shards: magic, version, count against the file size; npy:
 * dtype, dimensions, size), and the stream must hold at least one token.
 * NULL with a message naming the file and the fault. */
fr_tokens *fr_tokens_open(fr_ctx *ctx, const char *path);
void fr_tokens_close(fr_tokens *t);

int64_t fr_tokens_len(const fr_tokens *t);
fr_tokens_kind fr_tokens_get_kind(const fr_tokens *t);
int fr_tokens_files(const fr_tokens *t);
/* 256 for text; for shards and npy the largest id + 1 once fr_tokens_check
 * has read every token, 0 before. */
int fr_tokens_vocab_hint(const fr_tokens *t);

/* Reads every token once (in chunks): each id must lie in [0, vocab); the
 * first that does not is reported with its file, its index in that file
 * and its position in the stream. Then the stream must hold at least T + 1
 * tokens. FR_ERR_FORMAT (an id) or FR_ERR_SHAPE (too short). */
fr_status fr_tokens_check(fr_ctx *ctx, fr_tokens *t, int vocab, int T);

/* Tokens [start, start + n) of the stream into out, across file
 * boundaries. Allocates nothing and touches no context (safe on a loader's
 * thread; several threads may read one fr_tokens at once): a fault goes to
 * err. An id that does not fit int32 (negative, or past INT32_MAX in an i8
 * .npy) is FR_ERR_FORMAT, naming the file and the index. */
fr_status fr_tokens_read(fr_tokens *t, int64_t start, int n, int32_t *out, char *err,
                         size_t errlen);

/* The split of a stream of len tokens (val_fraction in [0, 1)):
 * n_val = floor(len * val_fraction), n_train = len - n_val; each part must
 * hold T + 1 tokens (n_val may be 0 when val_fraction is 0: no validation).
 * FR_ERR_ARG naming the part, the tokens it holds and what it needs. */
typedef struct fr_token_split {
    int64_t n_train, n_val;
} fr_token_split;
fr_status fr_tokens_split(fr_ctx *ctx, const fr_tokens *t, double val_fraction, int T,
                          fr_token_split *out);

/* ---- batches ------------------------------------------------------------ */

typedef struct fr_token_loader fr_token_loader;

typedef struct fr_token_loader_opts {
    int batch;          /* B windows a batch */
    int T;              /* tokens a window */
    int shuffle;        /* 0: windows in order (validation) */
    uint64_t seed;      /* the shuffle's */
    int queue;          /* batches prefetched ahead (>= 1); 0: no thread, read in next() */
    int vocab;          /* > 0: an id >= vocab read from disk is an error (the file changed
                           since fr_tokens_check); 0: no check */
    int64_t begin, end; /* the part: tokens [begin, end) of the stream */
    /* Data parallel: this process is rank `rank` of `ranks` (0: one) and
     * reads only windows [rank*B/ranks, (rank+1)*B/ranks) of each batch of B
     * in the loader's order (fr_loader_slice, the image loader's rule);
     * every batch is whole (drop_last), so a rank's slice is the same size
     * in every batch, and a slot holds ceil(B/ranks) windows. */
    int rank, ranks;
    /* 1: the windows past the last whole batch make one more, smaller batch
     * (drop_last=False: evaluation scores every window); 0: they are dropped */
    int keep_last;
} fr_token_loader_opts;

/* B windows of T tokens: x[b*T + t] is the input at position t of row b,
 * y[b*T + t] its next-token target (with ranks: B is this rank's slice).
 * Valid until the next call to next/start/free. */
typedef struct fr_token_batch {
    int B, T;
    const int32_t *x, *y;
} fr_token_batch;

/* The part must hold at least B windows (one batch) and lie inside the
 * stream; FR_ERR_ARG naming the part's windows and the batch otherwise. */
fr_token_loader *fr_token_loader_new(fr_ctx *ctx, fr_tokens *t, const fr_token_loader_opts *o);
/* What fr_token_loader_new reserves, as the allocator rounds it: the loader,
 * the permutation (8 bytes a window, only with shuffle) and (queue + 1) batch
 * slots of (2*S*T + 1) int32 (category DATA), S = B, or ceil(B/ranks) with
 * ranks. For budgets, before any loader
 * exists; 0 for options that are bad whatever the stream (B, T, queue,
 * vocab, begin >= end). */
size_t fr_token_loader_reserved(const fr_token_loader_opts *o);
void fr_token_loader_free(fr_token_loader *l);
int64_t fr_token_loader_num_windows(const fr_token_loader *l);
int64_t fr_token_loader_num_batches(const fr_token_loader *l);
/* Start epoch `epoch` (0-based), skipping its first `skip` batches (resume). */
fr_status fr_token_loader_start(fr_token_loader *l, int epoch, int64_t skip);
/* Next batch of the epoch (this rank's slice of it); *done = 1 and no batch
 * at its end, and at once for a rank whose slice is empty (B < ranks). */
fr_status fr_token_loader_next(fr_token_loader *l, fr_token_batch *out, int *done);
/* fr_loader_set_hand's twin (batches as fr_batch: n = B, idx, y). */
void fr_token_loader_set_hand(fr_token_loader *l, fr_hand_fn hand, void *user, int lag);

/* ---- parsers on memory (the fuzzer, the corruption tests) --------------- */

/* A whole llm.c shard image of len bytes: header words, then the exact size
 * for its count; the first fault, named with `name` and the byte. */
fr_status fr_shard_check(fr_ctx *ctx, const char *name, const void *buf, size_t len);
/* A whole token .npy image: a 1-D u1/u2/i4/i8 array of exactly len bytes,
 * every id in [0, INT32_MAX]. */
fr_status fr_token_npy_check(fr_ctx *ctx, const char *name, const void *buf, size_t len);

#endif
