/* file.c — opening outside files safely (see file.h). */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "io/file.h"

static const char *kind_of(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    return "not a regular file";
}

int fr_open_regular(fr_ctx *ctx, const char *path, const char *what, uint64_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        fr_fail(ctx, FR_ERR_IO, "%s: cannot open the %s: %s", path, what, strerror(e));
        return -1;
    }
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        int e = errno;
        close(fd);
        fr_fail(ctx, FR_ERR_IO, "%s: cannot stat the %s: %s", path, what, strerror(e));
        return -1;
    }
    if (!S_ISREG(sb.st_mode)) {
        close(fd);
        fr_fail(ctx, FR_ERR_IO, "%s: the %s is %s, not a regular file", path, what,
                kind_of(sb.st_mode));
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(fd);
        fr_fail(ctx, FR_ERR_IO, "%s: cannot set up the %s: %s", path, what, strerror(e));
        return -1;
    }
    if (size) *size = (uint64_t)sb.st_size;
    return fd;
}

int fr_pread_full(int fd, void *buf, size_t n, uint64_t off) {
    char *p = buf;
    while (n) {
        ssize_t r = pread(fd, p, n, (off_t)off);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = 0; /* end of file */
            return -1;
        }
        p += r;
        n -= (size_t)r;
        off += (uint64_t)r;
    }
    return 0;
}

fr_status fr_read_small(fr_ctx *ctx, const char *path, const char *what, uint64_t max, char **out,
                        size_t *len) {
    uint64_t size = 0;
    *out = NULL;
    *len = 0;
    int fd = fr_open_regular(ctx, path, what, &size);
    if (fd < 0) return FR_ERR_IO;
    if (size > max) {
        close(fd);
        return fr_fail(ctx, FR_ERR_FORMAT, "%s: %llu bytes: more than a %s may have (%llu)", path,
                       (unsigned long long)size, what, (unsigned long long)max);
    }
    char *buf = fr_alloc(ctx, (size_t)size + 1, FR_MEM_OTHER);
    if (!buf) {
        close(fd);
        return FR_ERR_NOMEM;
    }
    if (size && fr_pread_full(fd, buf, (size_t)size, 0)) {
        const int e = errno;
        close(fd);
        fr_free(ctx, buf);
        return fr_fail(ctx, FR_ERR_IO, "%s: cannot read the %s: %s", path, what,
                       e ? strerror(e) : "it shrank while read");
    }
    close(fd);
    buf[size] = 0;
    *out = buf;
    *len = (size_t)size;
    return FR_OK;
}
