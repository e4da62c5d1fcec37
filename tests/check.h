/* check.h — the one test harness of the C tests: CHECK counts and reports, and
 * check_done() prints the closing "N passed, M failed" line CTest logs show.
 * A failure prints "FAIL file:line: condition: message" to stderr.
 *
 * CHECK(cond, fmt, ...)          counts cond; on failure prints fmt, ... (only
 *                                then are the arguments evaluated).
 * CHECK_AT(line, cond, fmt, ...) the same, reporting the given line of this
 *                                file: for a helper that checks on behalf of
 *                                its caller (pass it __LINE__).
 * CHECK_MAX_REPORTS              define before including to print only the
 *                                first that many failures (all are counted):
 *                                for a test of millions of cases. */
#ifndef FR_CHECK_H
#define FR_CHECK_H

#include <limits.h>
#include <stdio.h>

#ifndef CHECK_MAX_REPORTS
#define CHECK_MAX_REPORTS LLONG_MAX
#endif

static long long check_pass, check_fail;

#define CHECK(cond, ...) CHECK_REPORT_(__LINE__, (cond), #cond, __VA_ARGS__)
#define CHECK_AT(line, cond, ...) CHECK_REPORT_((line), (cond), #cond, __VA_ARGS__)

#define CHECK_REPORT_(line, ok, text, ...)                                     \
    do {                                                                       \
        if (ok) {                                                              \
            check_pass++;                                                      \
        } else {                                                               \
            if (check_fail < CHECK_MAX_REPORTS) {                              \
                fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, (line), (text)); \
                fprintf(stderr, __VA_ARGS__);                                  \
                fprintf(stderr, "\n");                                         \
            }                                                                  \
            check_fail++;                                                      \
        }                                                                      \
    } while (0)

static inline int check_done(void) {
    printf("%lld passed, %lld failed\n", check_pass, check_fail);
    return check_fail ? 1 : 0;
}

#endif
