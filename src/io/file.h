/* file.h — opening files that come from outside (model files, datasets,
 * weights, checkpoints) so that nothing hangs and every refusal names the
 * path and the fault. It owns no format: the parsers read what it opens. */
#ifndef FR_FILE_H
#define FR_FILE_H

#include "core/ctx.h"

/* Open path read-only without blocking (a FIFO or a device never stalls
 * open()), refuse anything but a regular file ("is a directory", "is a FIFO",
 * ...), then clear O_NONBLOCK. Returns the descriptor and its size in *size,
 * or -1 with a message "<path>: <fault>" on ctx naming `what` ("model file",
 * "weights", ...). errno is read where the call failed, never later. */
int fr_open_regular(fr_ctx *ctx, const char *path, const char *what, uint64_t *size);

/* Read exactly n bytes at off (pread, again after EINTR and short reads).
 * 0, or -1 with errno set (0 at the end of the file). Touches no context:
 * loaders' threads use it. */
int fr_pread_full(int fd, void *buf, size_t n, uint64_t off);

/* The whole of a small regular file (opened as fr_open_regular does), in an
 * fr_alloc'd buffer (FR_MEM_OTHER) of *len bytes plus a NUL: a file of more
 * than max bytes is refused before anything is allocated ("<path>: N bytes:
 * more than a <what> may have (max)"), a short read is an I/O error naming
 * the path. FR_OK, or the status with the message on ctx. */
fr_status fr_read_small(fr_ctx *ctx, const char *path, const char *what, uint64_t max, char **out,
                        size_t *len);

#endif
