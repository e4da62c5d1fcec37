/* names.c — the words frugal prints for sizes and precisions: bytes in
 * human units, the precision names and their parser, shared by the floors
 * that print them (parallel/, run/, report/, the CLI). */
#include <stdio.h>
#include <string.h>
#include "core/ctx.h"
#include "core/names.h"

const char *fr_human_bytes(size_t b, char *buf, int len) {
    static const char *units[] = {"KiB", "MiB", "GiB"};
    if (!buf || len <= 0) return buf;
    if (b < 1024) {
        snprintf(buf, (size_t)len, "%zu B", b);
        return buf;
    }
    double v = (double)b / 1024.0;
    int u = 0;
    while (v >= 1023.95 && u < 2) { /* would print as 1024.0: use the next unit */
        v /= 1024.0;
        u++;
    }
    snprintf(buf, (size_t)len, "%.1f %s", v, units[u]);
    return buf;
}

static const char *precision_names[] = {"fp32", "bf16", "fp16", "bf16-mixed", "fp16-mixed", "auto"};

const char *fr_precision_name(fr_precision p) {
    return (unsigned)p <= FR_PREC_AUTO ? precision_names[p] : "?";
}

fr_status fr_precision_parse(fr_ctx *ctx, const char *name, fr_precision *out) {
    for (int i = 0; name && i <= FR_PREC_AUTO; i++)
        if (!strcmp(name, precision_names[i])) {
            *out = (fr_precision)i;
            return FR_OK;
        }
    return fr_fail(
        ctx, FR_ERR_ARG,
        "unknown precision '%s' (choose fp32, bf16, fp16, bf16-mixed, fp16-mixed or auto)",
        name ? name : "");
}

static const char *base_names[] = {"fp32", "bf16", "int8", "nf4", "auto"};

const char *fr_base_precision_name(fr_base_precision b) {
    return (unsigned)b <= FR_BASE_AUTO ? base_names[b] : "?";
}

fr_status fr_base_precision_parse(fr_ctx *ctx, const char *name, fr_base_precision *out) {
    for (int i = 0; name && i <= FR_BASE_AUTO; i++)
        if (!strcmp(name, base_names[i])) {
            *out = (fr_base_precision)i;
            return FR_OK;
        }
    return fr_fail(ctx, FR_ERR_ARG,
                   "--base-precision: unknown format '%s' (choose fp32, bf16, int8, nf4 or auto)",
                   name ? name : "");
}

void fr_json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}
