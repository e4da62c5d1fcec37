/* scratch.h — the scratch directory and the file-descriptor count of the C
 * tests that write files: tmpdir, made fresh under $TMPDIR (or /tmp) by
 * scratch_make() and emptied and removed by remove_tree(), and open_fds(),
 * to check that no error path leaks a descriptor. One scratch directory per
 * test program. */
#ifndef FR_SCRATCH_H
#define FR_SCRATCH_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[256];

/* Makes tmpdir as "<$TMPDIR or /tmp>/<prefix>-XXXXXX" with mkdtemp: 0, or -1
 * with errno set (nothing printed: the caller reports it). */
static int scratch_make(const char *prefix) {
    const char *t = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/%s-XXXXXX", t && *t ? t : "/tmp", prefix);
    return mkdtemp(tmpdir) ? 0 : -1;
}

/* Removes tmpdir: unlinks each entry (rmdir for an empty subdirectory), then
 * the directory itself. */
static void remove_tree(void) {
    DIR *d = opendir(tmpdir);
    struct dirent *de;
    char p[600];
    while (d && (de = readdir(d))) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", tmpdir, de->d_name);
        if (unlink(p) != 0) rmdir(p);
    }
    if (d) closedir(d);
    rmdir(tmpdir);
}

/* Open file descriptors, to see that no error path leaks one. */
static int open_fds(void) {
    DIR *d = opendir("/proc/self/fd");
    int n = 0;
    while (d && readdir(d)) n++;
    if (d) closedir(d);
    return n;
}

#endif
