/* bench_util.h — what the bench programs share: a wall clock in ms, a qsort
 * comparator for doubles, and integer option parsing with a clear error.
 * Define BENCH_NAME (the program's name, for messages) before including. */
#ifndef FR_BENCH_UTIL_H
#define FR_BENCH_UTIL_H

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* --opt's value s as an integer in [lo, hi] into *out; -1 with a message. */
static int parse_int(const char *opt, const char *s, int lo, int hi, int *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, BENCH_NAME ": --%s '%s': expected an integer in [%d, %d]\n", opt, s, lo,
                hi);
        return -1;
    }
    *out = (int)v;
    return 0;
}

#endif
