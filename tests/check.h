/* check.h — the smallest test harness: CHECK counts and reports, and
 * check_done() prints the closing "N passed, M failed" line CTest logs show. */
#ifndef FR_CHECK_H
#define FR_CHECK_H

#include <stdio.h>

static int check_pass, check_fail;

#define CHECK(cond, ...)                                               \
    do {                                                               \
        if (cond) {                                                    \
            check_pass++;                                              \
        } else {                                                       \
            check_fail++;                                              \
            fprintf(stderr, "FAIL %s:%d: ", __FILE__, __LINE__);       \
            fprintf(stderr, __VA_ARGS__);                              \
            fprintf(stderr, "\n");                                     \
        }                                                              \
    } while (0)

static inline int check_done(void) {
    printf("%d passed, %d failed\n", check_pass, check_fail);
    return check_fail ? 1 : 0;
}

#endif
