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

#endif
