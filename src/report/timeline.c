/* timeline.c — the memory timeline writers (see timeline.h): the
 * allocator's event trace as Chrome Trace Event JSON and as a stacked-area
 * SVG. It owns the snapshot of the trace (copied under the allocator's lock
 * with tracing paused, and the bytes held when the trace started), a small
 * text builder, and the drawing. It does not record events (mem.c does) and
 * keeps no state between calls. */
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include "core/ctx.h"
#include "io/safetensors.h"
#include "report/report.h"
#include "report/timeline.h"

#define NCAT FR_MEM_CAT_COUNT

/* ---- the trace, copied ---------------------------------------------------- */

typedef struct tl_trace {
    fr_mem_event *ev; /* copy of the events, fr_alloc'd (category other) */
    size_t n;
    int64_t base[NCAT]; /* allocated bytes per category when the trace started */
    int was_tracing;
    int truncated; /* the allocator stopped the trace itself (out of memory) */
} tl_trace;

static void trace_resume(fr_ctx *ctx, tl_trace *tr) {
    fr_free(ctx, tr->ev); /* first: its free must not be traced */
    tr->ev = NULL;
    fr_mem *m = &ctx->mem;
    pthread_mutex_lock(&m->lock);
    if (tr->was_tracing) m->tracing = 1;
    pthread_mutex_unlock(&m->lock);
}

/* Pause tracing (without clearing it, as fr_mem_trace(ctx, 0) would) so the
 * writer's own allocations stay out of the trace, and copy the events. Every
 * allocation and free while tracing was on left an event, so the bytes held
 * at the start are today's counts less the sum of all deltas; this holds as
 * long as no other thread allocates while a writer runs. */
static fr_status trace_take(fr_ctx *ctx, tl_trace *tr, const char *path) {
    fr_mem *m = &ctx->mem;
    memset(tr, 0, sizeof *tr);
    pthread_mutex_lock(&m->lock);
    size_t n = m->n_events;
    tr->was_tracing = m->tracing;
    m->tracing = 0;
    pthread_mutex_unlock(&m->lock);
    if (n == 0) {
        trace_resume(ctx, tr);
        return fr_fail(ctx, FR_ERR_ARG,
                       "%s: the memory trace is empty (call fr_mem_trace(ctx, 1) before the "
                       "work to trace)",
                       path);
    }
    tr->ev = fr_alloc(ctx, n * sizeof *tr->ev, FR_MEM_OTHER);
    if (!tr->ev) {
        trace_resume(ctx, tr);
        return fr_fail(ctx, FR_ERR_NOMEM, "%s: out of memory copying %zu trace events", path, n);
    }
    int64_t sum[NCAT] = {0};
    sum[FR_MEM_OTHER] = (int64_t)(n * sizeof *tr->ev); /* the copy itself, not traced */
    pthread_mutex_lock(&m->lock);
    if (m->n_events < n) n = m->n_events; /* restarted meanwhile by another thread */
    memcpy(tr->ev, m->events, n * sizeof *tr->ev);
    for (size_t i = 0; i < m->n_events; i++) sum[m->events[i].cat % NCAT] += m->events[i].delta;
    for (int c = 0; c < NCAT; c++) tr->base[c] = (int64_t)m->st.allocated[c] - sum[c];
    pthread_mutex_unlock(&m->lock);
    tr->n = n;
    tr->truncated = !tr->was_tracing; /* fr_mem_trace(ctx, 0) clears, so events left with
                                         tracing off mean the trace stopped on its own */
    if (tr->truncated) {
        /* Later events are missing, so today's counts say nothing of the
         * start: take the least start that keeps every category >= 0. */
        int64_t run[NCAT] = {0};
        for (int c = 0; c < NCAT; c++) tr->base[c] = 0;
        for (size_t i = 0; i < n; i++) {
            int c = tr->ev[i].cat % NCAT;
            run[c] += tr->ev[i].delta;
            if (-run[c] > tr->base[c]) tr->base[c] = -run[c];
        }
    }
    for (int c = 0; c < NCAT; c++)
        if (tr->base[c] < 0) tr->base[c] = 0;
    return FR_OK;
}

static int64_t total_of(const int64_t *s) {
    int64_t t = 0;
    for (int c = 0; c < NCAT; c++) t += s[c];
    return t;
}

typedef struct tl_peak {
    int64_t bytes;
    int64_t at[NCAT]; /* per category at the peak */
    double t_us;
    const char *tag;
    size_t event; /* index of the event that reached it; n: the start */
} tl_peak;

/* The highest total, first reached (the start counts as a state). */
static tl_peak find_peak(const tl_trace *tr) {
    tl_peak p;
    int64_t s[NCAT];
    memcpy(s, tr->base, sizeof s);
    memcpy(p.at, s, sizeof s);
    p.bytes = total_of(s);
    p.t_us = 0;
    p.tag = NULL;
    p.event = tr->n;
    for (size_t i = 0; i < tr->n; i++) {
        s[tr->ev[i].cat % NCAT] += tr->ev[i].delta;
        int64_t t = total_of(s);
        if (t > p.bytes) {
            p.bytes = t;
            memcpy(p.at, s, sizeof s);
            p.t_us = tr->ev[i].t_us;
            p.tag = tr->ev[i].tag;
            p.event = i;
        }
    }
    return p;
}

/* ---- text built in memory ------------------------------------------------- */

typedef struct tl_text {
    fr_ctx *ctx;
    char *p;
    size_t len, cap;
    int nomem;
} tl_text;

static void put(tl_text *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(tl_text *b, const char *fmt, ...) {
    if (b->nomem) return;
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        size_t room = b->cap - b->len;
        int k = vsnprintf(b->p ? b->p + b->len : NULL, room, fmt, ap);
        va_end(ap);
        if (k < 0) {
            b->nomem = 1;
            return;
        }
        if ((size_t)k < room) {
            b->len += (size_t)k;
            return;
        }
        size_t want = b->len + (size_t)k + 1;
        if (want < 4096) want = 4096;
        void *arr = b->p;
        if (fr_grow(b->ctx, &arr, &b->cap, want, 1, FR_MEM_OTHER)) {
            b->nomem = 1;
            return;
        }
        b->p = arr;
    }
}

/* s as the inside of a JSON string (or of XML text when xml is set). */
static void put_escaped(tl_text *b, const char *s, int xml) {
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (xml && ch == '<') put(b, "&lt;");
        else if (xml && ch == '>') put(b, "&gt;");
        else if (xml && ch == '&') put(b, "&amp;");
        else if (xml && ch == '"') put(b, "&quot;");
        else if (!xml && (ch == '"' || ch == '\\')) put(b, "\\%c", ch);
        else if (ch < 0x20 && xml) put(b, " ");
        else if (ch < 0x20) put(b, "\\u%04x", ch);
        else put(b, "%c", ch);
    }
}

static fr_status text_write(tl_text *b, const char *path, const char *what) {
    fr_status st = FR_OK;
    if (b->nomem)
        st = fr_fail(b->ctx, FR_ERR_NOMEM, "%s: out of memory building the %s", path, what);
    else st = fr_write_atomic(b->ctx, path, b->p, b->len);
    fr_free(b->ctx, b->p);
    b->p = NULL;
    return st;
}

/* ---- Chrome Trace Event JSON ---------------------------------------------- */

static void put_counter(tl_text *b, double ts, const int64_t *s) {
    put(b, ",\n{\"name\": \"memory\", \"ph\": \"C\", \"ts\": %.3f, \"pid\": 1, \"args\": {", ts);
    for (int c = 0; c < NCAT; c++)
        put(b, "%s\"%s\": %" PRId64, c ? ", " : "", fr_mem_cat_name((fr_mem_cat)c), s[c]);
    put(b, "}}");
}

fr_status fr_timeline_chrome(fr_ctx *ctx, const char *path) {
    if (!ctx || !path) return fr_fail(ctx, FR_ERR_ARG, "fr_timeline_chrome: no path");
    tl_trace tr;
    fr_status st = trace_take(ctx, &tr, path);
    if (st) return st;
    tl_peak pk = find_peak(&tr);
    tl_text b = {.ctx = ctx};

    put(&b, "{\"traceEvents\": [\n");
    put(&b, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": 1, \"args\": {\"name\": "
            "\"frugal\"}},\n");
    put(&b, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": 1, \"args\": "
            "{\"name\": \"ops\"}}");

    /* the counter track: the start, then the state after each event */
    int64_t s[NCAT];
    memcpy(s, tr.base, sizeof s);
    put_counter(&b, 0.0, s);
    for (size_t i = 0; i < tr.n; i++) {
        if (!tr.ev[i].delta) continue; /* a time mark (fr_mem_mark) */
        s[tr.ev[i].cat % NCAT] += tr.ev[i].delta;
        put_counter(&b, tr.ev[i].t_us, s);
    }

    /* one slice per run of events under the same op tag */
    for (size_t i = 0; i < tr.n;) {
        size_t j = i;
        int64_t plus = 0, minus = 0;
        while (j < tr.n && tr.ev[j].tag == tr.ev[i].tag) {
            if (tr.ev[j].delta > 0) plus += tr.ev[j].delta;
            else minus -= tr.ev[j].delta;
            j++;
        }
        if (tr.ev[i].tag) {
            double t0 = tr.ev[i].t_us, t1 = j < tr.n ? tr.ev[j].t_us : tr.ev[j - 1].t_us;
            put(&b, ",\n{\"name\": \"");
            put_escaped(&b, tr.ev[i].tag, 0);
            put(&b,
                "\", \"cat\": \"op\", \"ph\": \"X\", \"ts\": %.3f, \"dur\": %.3f, \"pid\": 1, "
                "\"tid\": 1, \"args\": {\"allocated\": %" PRId64 ", \"freed\": %" PRId64
                ", \"events\": %zu}}",
                t0, t1 > t0 ? t1 - t0 : 0.0, plus, minus, j - i);
        }
        i = j;
    }

    char hb[32];
    put(&b, ",\n{\"name\": \"peak %s", fr_human_bytes((size_t)pk.bytes, hb, sizeof hb));
    if (pk.tag) {
        put(&b, " during ");
        put_escaped(&b, pk.tag, 0);
    }
    put(&b,
        "\", \"ph\": \"i\", \"s\": \"g\", \"ts\": %.3f, \"pid\": 1, \"tid\": 1, \"args\": "
        "{\"bytes\": %" PRId64 "}}",
        pk.t_us, pk.bytes);
    put(&b,
        "\n],\n\"displayTimeUnit\": \"ms\",\n\"otherData\": {\"generator\": \"frugal " FR_VERSION
        "\", \"memory_events\": %zu, \"peak_bytes\": %" PRId64 ", \"truncated\": %s}}\n",
        tr.n, pk.bytes, tr.truncated ? "true" : "false");

    st = text_write(&b, path, "Chrome trace");
    trace_resume(ctx, &tr);
    return st;
}

/* ---- SVG -------------------------------------------------------------------- */

#define SVG_W 1000
#define SVG_H 500
#define PX0 84 /* plot area, in SVG units (pixels at 100%) */
#define PX1 800
#define PY0 64
#define PY1 440
#define NCOL (PX1 - PX0) /* one column per pixel */

/* Colours from Tableau 10, red kept for the budget. */
static const char *const cat_colour[] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1",
                                         "#76b7b2", "#edc948", "#bab0ac", "#9c755f"};
_Static_assert(sizeof cat_colour / sizeof *cat_colour == NCAT, "a colour per category");

typedef struct tl_col {
    int used;           /* an event falls in this column */
    int64_t top[NCAT];  /* the state with the highest total in the column */
    int64_t last[NCAT]; /* the state at its end */
} tl_col;

/* A tick step of 1, 2 or 5 times a power of ten giving about `want` ticks. */
static double nice_step(double span, int want) {
    double raw = span / want, mag = pow(10.0, floor(log10(raw))), f = raw / mag;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * mag;
}

/* The step of 1, 2, 2.5 or 5 times a power of ten that gives 4 to 8 ticks
 * up to the lowest top at or above `top`. */
static double byte_step(double top) {
    static const double mant[] = {1, 2, 2.5, 5};
    double best = nice_step(top, 5), best_top = ceil(top / best) * best;
    for (double mag = pow(10.0, floor(log10(top)) - 2); mag <= top; mag *= 10)
        for (int k = 0; k < 4; k++) {
            double step = mant[k] * mag, ticks = ceil(top / step);
            if (ticks >= 4 && ticks <= 8 && ticks * step < best_top - step * 1e-9) {
                best = step;
                best_top = ticks * step;
            }
        }
    return best;
}

/* The byte axis: a unit (B, KiB, MiB, GiB) in which the axis top reads
 * between 1 and 1024, and a step of 1, 2 or 5 times a power of ten of it. */
static double axis_unit(double top, const char **name) {
    static const char *names[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double unit = 1;
    int u = 0;
    while (top >= 1024 * unit && u < 4) unit *= 1024, u++;
    *name = names[u];
    return unit;
}

/* A tick value in the axis unit, without trailing zeros: "1.5 MiB", "2 MiB". */
static void fmt_tick(double v, double unit, const char *uname, char *buf, size_t len) {
    if (v == 0) {
        snprintf(buf, len, "0");
        return;
    }
    snprintf(buf, len, "%.3f", v / unit);
    char *e = buf + strlen(buf) - 1;
    while (*e == '0') *e-- = 0;
    if (*e == '.') *e = 0;
    size_t n = strlen(buf);
    snprintf(buf + n, len - n, " %s", uname);
}

static void fmt_ms(double us, char *buf, size_t len) {
    double ms = us / 1000.0;
    snprintf(buf, len, ms < 1 ? "%.3f ms" : ms < 10 ? "%.2f ms" : "%.1f ms", ms);
}

static double ymap(double bytes, double ymax) { return PY1 - bytes / ymax * (PY1 - PY0); }

/* The area under the sum of categories 0..c, step-shaped, closed on the axis. */
static void put_area(tl_text *b, const tl_col *col, const int64_t *base, int c, double ymax) {
    int64_t s0 = 0;
    for (int k = 0; k <= c; k++) s0 += base[k];
    put(b, "<path fill=\"%s\" d=\"M%d %d V%.1f", cat_colour[c], PX0, PY1, ymap((double)s0, ymax));
    for (int x = 0; x < NCOL; x++) {
        if (!col[x].used) continue;
        int64_t top = 0, last = 0;
        for (int k = 0; k <= c; k++) top += col[x].top[k], last += col[x].last[k];
        put(b, "H%dV%.1fH%dV%.1f", PX0 + x, ymap((double)top, ymax), PX0 + x + 1,
            ymap((double)last, ymax));
    }
    put(b, "H%dV%dZ\"/>\n", PX1, PY1);
}

fr_status fr_timeline_svg(fr_ctx *ctx, const char *path, const char *title, size_t budget) {
    if (!ctx || !path) return fr_fail(ctx, FR_ERR_ARG, "fr_timeline_svg: no path");
    tl_trace tr;
    fr_status st = trace_take(ctx, &tr, path);
    if (st) return st;
    tl_peak pk = find_peak(&tr);
    tl_text b = {.ctx = ctx};
    tl_col *col = fr_calloc(ctx, NCOL * sizeof *col, FR_MEM_OTHER);
    if (!col) {
        trace_resume(ctx, &tr);
        return fr_fail(ctx, FR_ERR_NOMEM, "%s: out of memory drawing the timeline", path);
    }

    /* x: time since the trace started, a little past the last event so the
     * state it leaves shows; y: bytes, headroom above the peak and budget */
    double t_end = tr.ev[tr.n - 1].t_us * 1.03;
    if (t_end <= 0) t_end = 1;
    double top = (double)(pk.bytes > (int64_t)budget ? (size_t)pk.bytes : budget);
    if (top <= 0) top = 1024;
    const char *uname;
    double unit = axis_unit(top * 1.1, &uname);
    double ystep = byte_step(top * 1.1 / unit) * unit;
    double ymax = ceil(top * 1.1 / ystep) * ystep;

    /* thin to one column per pixel, each at its highest total */
    int64_t s[NCAT];
    memcpy(s, tr.base, sizeof s);
    for (size_t i = 0; i < tr.n; i++) {
        s[tr.ev[i].cat % NCAT] += tr.ev[i].delta;
        int x = (int)(tr.ev[i].t_us / t_end * NCOL);
        if (x < 0) x = 0;
        if (x >= NCOL) x = NCOL - 1;
        tl_col *c = &col[x];
        if (!c->used) { /* the column starts with what was held before this event */
            c->used = 1;
            memcpy(c->top, s, sizeof s);
            c->top[tr.ev[i].cat % NCAT] -= tr.ev[i].delta;
        }
        if (total_of(s) > total_of(c->top)) memcpy(c->top, s, sizeof s);
        memcpy(c->last, s, sizeof s);
    }

    char h1[32], h2[32], tb[32];
    put(&b,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d "
        "%d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\" font-size=\"12\">\n",
        SVG_W, SVG_H, SVG_W, SVG_H);
    put(&b, "<rect width=\"%d\" height=\"%d\" fill=\"#ffffff\"/>\n", SVG_W, SVG_H);
    put(&b, "<text x=\"%d\" y=\"24\" font-size=\"16\" font-weight=\"bold\" fill=\"#222\">", PX0);
    put_escaped(&b, title && *title ? title : "memory timeline", 1);
    put(&b, "</text>\n");
    fmt_ms(tr.ev[tr.n - 1].t_us, tb, sizeof tb);
    put(&b,
        "<text x=\"%d\" y=\"44\" fill=\"#666\">allocated bytes by category over %s, %zu "
        "allocator events%s</text>\n",
        PX0, tb, tr.n, tr.truncated ? " (trace cut short: the allocator ran out of room)" : "");

    /* grid and y axis */
    put(&b, "<g stroke=\"#e4e4e4\" stroke-width=\"1\">\n");
    for (double v = ystep; v <= ymax + ystep / 2; v += ystep)
        put(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\"/>\n", PX0, PX1, ymap(v, ymax),
            ymap(v, ymax));
    put(&b, "</g>\n<g fill=\"#444\" text-anchor=\"end\">\n");
    for (double v = 0; v <= ymax + ystep / 2; v += ystep) {
        fmt_tick(v, unit, uname, h1, sizeof h1);
        put(&b, "<text x=\"%d\" y=\"%.1f\">%s</text>\n", PX0 - 6, ymap(v, ymax) + 4, h1);
    }
    put(&b, "</g>\n");
    put(&b,
        "<text transform=\"translate(16 %d) rotate(-90)\" text-anchor=\"middle\" "
        "fill=\"#444\">allocated</text>\n",
        (PY0 + PY1) / 2);

    /* the stack, drawn from the sum of all categories down to parameters */
    put(&b, "<g id=\"areas\">\n");
    for (int c = NCAT - 1; c >= 0; c--) put_area(&b, col, tr.base, c, ymax);
    put(&b, "</g>\n");

    /* x axis */
    double tstep = nice_step(t_end / 1000.0, 8);
    put(&b, "<g stroke=\"#444\" stroke-width=\"1\">\n");
    put(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"/>\n", PX0, PX1, PY1, PY1);
    put(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\"/>\n", PX0, PX0, PY0, PY1);
    for (double v = 0; v <= t_end / 1000.0 + tstep * 1e-6; v += tstep) {
        double x = PX0 + v * 1000.0 / t_end * NCOL;
        put(&b, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%d\" y2=\"%d\"/>\n", x, x, PY1, PY1 + 5);
    }
    put(&b, "</g>\n<g fill=\"#444\" text-anchor=\"middle\">\n");
    int prec = tstep >= 1 ? 0 : tstep >= 0.1 ? 1 : tstep >= 0.01 ? 2 : 3;
    for (double v = 0; v <= t_end / 1000.0 + tstep * 1e-6; v += tstep)
        put(&b, "<text x=\"%.1f\" y=\"%d\">%.*f</text>\n", PX0 + v * 1000.0 / t_end * NCOL,
            PY1 + 18, prec, v);
    put(&b,
        "</g>\n<text x=\"%d\" y=\"%d\" text-anchor=\"middle\" fill=\"#444\">time since the "
        "trace started (ms)</text>\n",
        (PX0 + PX1) / 2, PY1 + 40);

    /* the peak: a dashed line across, a dot where it happens, a label beside it */
    double py = ymap((double)pk.bytes, ymax);
    double px = PX0 + pk.t_us / t_end * NCOL;
    int left_half = px < (PX0 + PX1) / 2.0;
    /* each label sits above its line unless the other line is just above it */
    double by = budget > 0 ? ymap((double)budget, ymax) : -100;
    double peak_ty = py - by > 0 && py - by < 18 ? py + 16 : py - 7;
    double budget_ty = by - py > 0 && by - py < 18 ? by + 15 : by - 6;
    put(&b,
        "<line id=\"peak\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#222\" "
        "stroke-width=\"1.2\" stroke-dasharray=\"6 4\"/>\n",
        PX0, PX1, py, py);
    put(&b, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3.5\" fill=\"#222\"/>\n", px, py);
    fmt_ms(pk.t_us, tb, sizeof tb);
    put(&b,
        "<text id=\"peak-label\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\" fill=\"#222\" "
        "font-weight=\"bold\" stroke=\"#fff\" stroke-width=\"3\" paint-order=\"stroke\">peak %s "
        "at %s",
        left_half ? fmax(px, PX0 + 4.0) : fmin(px, PX1 - 4.0), peak_ty, left_half ? "start" : "end",
        fr_human_bytes((size_t)pk.bytes, h1, sizeof h1), tb);
    if (pk.tag) {
        put(&b, ", during ");
        put_escaped(&b, pk.tag, 1);
    }
    put(&b, "</text>\n");

    /* the budget, labelled on the side away from the peak's label */
    if (budget > 0) {
        put(&b,
            "<line id=\"budget\" x1=\"%d\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#d62728\" "
            "stroke-width=\"2\"/>\n",
            PX0, PX1, by, by);
        put(&b,
            "<text x=\"%d\" y=\"%.1f\" text-anchor=\"%s\" fill=\"#d62728\" stroke=\"#fff\" "
            "stroke-width=\"3\" paint-order=\"stroke\">budget %s</text>\n",
            left_half ? PX1 - 4 : PX0 + 4, budget_ty, left_half ? "end" : "start",
            fr_human_bytes(budget, h1, sizeof h1));
    }

    /* legend: top of the stack first, with each category's bytes at the peak */
    int lx = PX1 + 22, ly = PY0 + 4;
    put(&b,
        "<g id=\"legend\">\n<text x=\"%d\" y=\"%d\" fill=\"#444\" "
        "font-weight=\"bold\">at the peak</text>\n",
        lx, ly);
    for (int c = NCAT - 1; c >= 0; c--) {
        ly += 22;
        int empty = pk.at[c] == 0;
        put(&b, "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/>\n", lx, ly - 10,
            cat_colour[c]);
        put(&b, "<text x=\"%d\" y=\"%d\" fill=\"%s\">%s</text>\n", lx + 18, ly,
            empty ? "#999" : "#222", fr_mem_cat_name((fr_mem_cat)c));
        put(&b, "<text x=\"%d\" y=\"%d\" text-anchor=\"end\" fill=\"%s\">%s</text>\n", SVG_W - 12,
            ly, empty ? "#999" : "#222", fr_human_bytes((size_t)pk.at[c], h2, sizeof h2));
    }
    ly += 10;
    put(&b, "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#bbb\"/>\n", lx, SVG_W - 12, ly,
        ly);
    ly += 18;
    put(&b,
        "<text x=\"%d\" y=\"%d\" fill=\"#222\" font-weight=\"bold\">total</text>\n<text x=\"%d\" "
        "y=\"%d\" text-anchor=\"end\" fill=\"#222\" font-weight=\"bold\">%s</text>\n",
        lx + 18, ly, SVG_W - 12, ly, fr_human_bytes((size_t)pk.bytes, h1, sizeof h1));
    ly += 30;
    put(&b,
        "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#222\" stroke-width=\"1.2\" "
        "stroke-dasharray=\"6 4\"/>\n<text x=\"%d\" y=\"%d\" fill=\"#444\">peak</text>\n",
        lx, lx + 12, ly - 4, ly - 4, lx + 18, ly);
    if (budget > 0) {
        ly += 22;
        put(&b,
            "<line x1=\"%d\" x2=\"%d\" y1=\"%d\" y2=\"%d\" stroke=\"#d62728\" "
            "stroke-width=\"2\"/>\n<text x=\"%d\" y=\"%d\" fill=\"#444\">budget</text>\n",
            lx, lx + 12, ly - 4, ly - 4, lx + 18, ly);
    }
    put(&b, "</g>\n</svg>\n");

    fr_free(ctx, col);
    st = text_write(&b, path, "SVG");
    trace_resume(ctx, &tr);
    return st;
}

/* ---- kernel time by op ----------------------------------------------------- */

int fr_timeline_op_times(fr_ctx *ctx, fr_op_time *out, int max) {
    if (!ctx || !out || max < 1) return 0;
    tl_trace tr;
    if (trace_take(ctx, &tr, "op times")) return -1;
    int n = 0;
    for (size_t i = 0; i < tr.n;) {
        size_t j = i;
        while (j < tr.n && tr.ev[j].tag == tr.ev[i].tag) j++;
        /* a kernel's span: a run under its op's name that the executor's
         * NULL mark ends (fr_mem_mark), not the tags of setup or copies */
        if (tr.ev[i].tag && j < tr.n && !tr.ev[j].tag && !tr.ev[j].delta) {
            double ms = (tr.ev[j].t_us - tr.ev[i].t_us) / 1e3;
            int k = 0;
            while (k < n && strcmp(out[k].name, tr.ev[i].tag)) k++;
            if (k == n && n < max) out[n++] = (fr_op_time){tr.ev[i].tag, 0, 0.0};
            if (k < n) out[k].calls++, out[k].ms += ms > 0 ? ms : 0.0;
        }
        i = j;
    }
    trace_resume(ctx, &tr);
    for (int a = 1; a < n; a++) /* the largest first (insertion sort: a few dozen ops) */
        for (int b = a; b > 0 && out[b].ms > out[b - 1].ms; b--) {
            fr_op_time t = out[b];
            out[b] = out[b - 1];
            out[b - 1] = t;
        }
    return n;
}
