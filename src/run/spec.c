/* spec.c — the user's words for sizes and checkpoint modes: "48MiB",
 * "every:4", and the batch-size finder that computes (not crashes its way
 * to) the largest batch that fits a budget. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include "run/trainer.h"

/* The largest size a budget can name: 2^50 bytes (1 PiB), far above any
 * machine, and small enough that size_t and the planner's sums never wrap. */
#define FR_BYTES_MAX 1125899906842624.0

/* A size is a decimal number (digits, an optional fraction and exponent:
 * "1.5", "2e3") and an optional unit, binary (K, KiB, M, MiB, G, GiB) or
 * decimal (KB, MB, GB), case-insensitive; a plain number is bytes and a
 * fraction of a byte is dropped. Signs, hex, "nan", "inf" and spaces are not
 * sizes. */
fr_status fr_parse_bytes(const char *s, size_t *out, char *err, size_t errlen) {
    const char *p = s;
    size_t digits = 0;
    for (; *p >= '0' && *p <= '9'; p++) digits++;
    if (*p == '.')
        for (p++; *p >= '0' && *p <= '9'; p++) digits++;
    if (digits && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (*q == '+' || *q == '-') q++;
        if (*q >= '0' && *q <= '9') {
            while (*q >= '0' && *q <= '9') q++;
            p = q;
        }
    }
    if (*s == '-') {
        snprintf(err, errlen, "'%s': a size cannot be negative", s);
        return FR_ERR_ARG;
    }
    char *end;
    errno = 0;
    double v = digits ? strtod(s, &end) : 0;
    if (!digits || end != p) {
        snprintf(err, errlen,
                 "'%s' is not a size (a decimal number and a unit: 48MiB, 1.5GiB, 500MB)", s);
        return FR_ERR_ARG;
    }
    static const struct {
        const char *unit;
        double mult;
    } units[] = {{"", 1},
                 {"B", 1},
                 {"K", 1024.0},
                 {"KiB", 1024.0},
                 {"KB", 1e3},
                 {"M", 1048576.0},
                 {"MiB", 1048576.0},
                 {"MB", 1e6},
                 {"G", 1073741824.0},
                 {"GiB", 1073741824.0},
                 {"GB", 1e9},
                 {"T", 1099511627776.0},
                 {"TiB", 1099511627776.0},
                 {"TB", 1e12}};
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++)
        if (!strcasecmp(p, units[i].unit)) {
            double b = v * units[i].mult; /* strtod's overflow is inf, which fails below */
            if (!(b <= FR_BYTES_MAX)) {
                snprintf(err, errlen, "'%s' is too large: a size is at most 1024 TiB (2^50 bytes)",
                         s);
                return FR_ERR_ARG;
            }
            *out = (size_t)b;
            return FR_OK;
        }
    snprintf(err, errlen, "'%s': unknown unit '%s' (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB)", s, p);
    return FR_ERR_ARG;
}

fr_status fr_parse_checkpoint(const char *s, fr_ckpt_mode *mode, int *arg, char *err,
                              size_t errlen) {
    static const struct {
        const char *name;
        fr_ckpt_mode mode;
    } plain[] = {{"none", FR_CKPT_NONE},
                 {"marks", FR_CKPT_MARKS},
                 {"all", FR_CKPT_ALL},
                 {"sqrt", FR_CKPT_SQRT},
                 {"auto", FR_CKPT_AUTO}};
    *arg = 0;
    for (size_t i = 0; i < sizeof plain / sizeof plain[0]; i++)
        if (!strcmp(s, plain[i].name)) {
            *mode = plain[i].mode;
            return FR_OK;
        }
    const char *colon = strchr(s, ':');
    if (colon) {
        /* decimal digits only: no sign, spaces or hex */
        const char *d = colon + 1;
        long n = 0;
        size_t nd = 0;
        for (; d[nd] >= '0' && d[nd] <= '9'; nd++) n = n > 100000 ? n : 10 * n + (d[nd] - '0');
        if (!nd || d[nd] || n < 1 || n > 100000) {
            snprintf(err, errlen,
                     "'%s': the number after ':' must be a positive integer up to 100000", s);
            return FR_ERR_ARG;
        }
        size_t k = (size_t)(colon - s);
        if (k == 5 && !strncmp(s, "every", 5)) *mode = FR_CKPT_EVERY;
        else if (k == 7 && !strncmp(s, "revolve", 7)) *mode = FR_CKPT_REVOLVE;
        else goto unknown;
        *arg = (int)n;
        return FR_OK;
    }
unknown:
    snprintf(err, errlen, "'%s': choose none, marks, all, sqrt, every:N, revolve:SLOTS or auto", s);
    return FR_ERR_ARG;
}

/* Whether a batch's plan fits; a plan that cannot be built does not. */
static int fits(fr_model *m, const fr_step_opts *opts, int batch) {
    fr_step_opts o = *opts;
    o.batch = batch;
    if (o.micro_batch > batch || (o.micro_batch && batch % o.micro_batch)) return 0;
    fr_ctx *ctx = m->ctx;
    char saved[FR_ERR_LEN];
    memcpy(saved, ctx->err, sizeof saved);
    int ok = 0;
    if (o.checkpoint == FR_CKPT_AUTO || o.precision == FR_PREC_AUTO) {
        ok = fr_plan_fits(m, &o); /* any whole-batch plan (no single one is always smallest) */
        memcpy(ctx->err, saved, sizeof saved);
        return ok;
    }
    fr_step *s = fr_step_build(m, &o);
    if (s) {
        fr_plan_info info;
        fr_step_plan_info(s, &info);
        ok = info.reserved <= opts->budget;
        fr_step_free(s);
    }
    memcpy(ctx->err, saved, sizeof saved);
    return ok;
}

fr_status fr_batch_auto(fr_model *m, const fr_step_opts *opts, int max_batch, int *batch) {
    if (max_batch < 1)
        return fr_fail(m->ctx, FR_ERR_ARG, "fr_batch_auto: max_batch %d is not positive",
                       max_batch);
    if (!fits(m, opts, 1))
        return fr_fail(m->ctx, FR_ERR_BUDGET, "not even a batch of 1 fits the budget of %zu bytes",
                       opts->budget);
    int lo = 1, hi = 2;
    while (hi <= max_batch && fits(m, opts, hi)) lo = hi, hi *= 2;
    if (hi > max_batch) hi = max_batch + 1;
    while (hi - lo > 1) { /* lo fits, hi does not */
        int mid = lo + (hi - lo) / 2;
        if (fits(m, opts, mid)) lo = mid;
        else hi = mid;
    }
    *batch = lo;
    return FR_OK;
}
