/* test_loader.c — the loader over a synthetic IDX set whose pixels encode
 * each sample's index: every sample exactly once per epoch, the order a
 * function of (seed, epoch) only and the same with or without prefetch,
 * Fisher-Yates as loader.h documents it, drop_last, resume with skip, limit,
 * restarting and freeing with the prefetch thread running, a read error in
 * the thread reported on the caller's side, the DATA memory bound, float
 * regression targets in b.target, every allocation failing in turn, and the
 * data-parallel slices of a batch (rank r of N: [r*n/N, (r+1)*n/N)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "check.h"
#include "core/rng.h"
#include "data/loader.h"
#include "scratch.h"

/* 10000 images of 8x8; pixel 0 and 1 hold the index's low and high byte,
 * pixel 2 its low byte again (a check), the rest 7; label = index % 10. */
enum { NS = 10000, SH = 8, SW = 8, SD = SH * SW };

static char img_path[512], lab_path[512];

static void be32(unsigned char *b, uint32_t v) {
    b[0] = (unsigned char)(v >> 24), b[1] = (unsigned char)(v >> 16),
    b[2] = (unsigned char)(v >> 8), b[3] = (unsigned char)v;
}

static int make_files(void) {
    size_t ni = 16 + (size_t)NS * SD;
    unsigned char *img = calloc(ni, 1), lab[8 + NS];
    if (!img) return -1;
    be32(img, 0x803), be32(img + 4, NS), be32(img + 8, SH), be32(img + 12, SW);
    be32(lab, 0x801), be32(lab + 4, NS);
    for (int i = 0; i < NS; i++) {
        unsigned char *p = img + 16 + (size_t)i * SD;
        memset(p, 7, SD);
        p[0] = (unsigned char)(i & 0xFF), p[1] = (unsigned char)(i >> 8), p[2] = p[0];
        lab[8 + i] = (unsigned char)(i % 10);
    }
    snprintf(img_path, sizeof img_path, "%s/img.idx", tmpdir);
    snprintf(lab_path, sizeof lab_path, "%s/lab.idx", tmpdir);
    FILE *f = fopen(img_path, "wb"), *g = fopen(lab_path, "wb");
    int ok = f && g && fwrite(img, 1, ni, f) == ni && fwrite(lab, 1, sizeof lab, g) == sizeof lab;
    if (f) fclose(f);
    if (g) fclose(g);
    free(img);
    return ok ? 0 : -1;
}

/* The sample index a row of x encodes, or -1 if the row is not intact. */
static int64_t decode(const float *x, int32_t y) {
    long lo = lrintf(x[0] * 255.0f), hi = lrintf(x[1] * 255.0f), chk = lrintf(x[2] * 255.0f);
    int64_t i = lo + 256 * hi;
    if (chk != lo || fabsf(x[SD - 1] - 7 / 255.0f) > 1e-7f || i >= NS || y != i % 10) return -1;
    return i;
}

/* Runs one epoch and records the order of samples; returns batches seen. */
static int64_t run_epoch(fr_ctx *ctx, fr_loader *l, int epoch, int64_t skip, int64_t *order,
                         int64_t *count, int *sizes) {
    *count = 0;
    if (fr_loader_start(l, epoch, skip)) return -1;
    int64_t nb = 0, targets = 0;
    for (;;) {
        fr_batch b;
        int done;
        if (fr_loader_next(l, &b, &done)) {
            fprintf(stderr, "next: %s\n", fr_last_error(ctx));
            return -1;
        }
        if (done) break;
        if (sizes) sizes[nb] = b.n;
        for (int k = 0; k < b.n; k++) order[(*count)++] = decode(b.x + (size_t)k * SD, b.y[k]);
        targets += b.target != NULL;
        nb++;
    }
    CHECK(targets == 0, "%lld batches have targets", (long long)targets);
    return nb;
}

static fr_loader_opts opts(int batch, int shuffle, int drop_last, uint64_t seed, int queue,
                           int64_t limit) {
    fr_loader_opts o = {batch, shuffle, drop_last, seed, queue, limit, 0, 0};
    return o;
}

static int64_t order_a[NS], order_b[NS];
static int sizes[NS];

static void test_epochs(fr_ctx *ctx, fr_dataset *ds) {
    int queues[3] = {0, 1, 4};
    for (int qi = 0; qi < 3; qi++) {
        fr_loader_opts o = opts(64, 1, 0, 42, queues[qi], 0);
        fr_loader *l = fr_loader_new(ctx, ds, &o);
        CHECK(l != NULL, "%s", fr_last_error(ctx));
        if (!l) return;
        CHECK(fr_loader_num_batches(l) == 157, "ceil(10000 / 64) = 157, got %lld",
              (long long)fr_loader_num_batches(l));
        for (int epoch = 0; epoch < 2; epoch++) {
            int64_t n;
            int64_t nb = run_epoch(ctx, l, epoch, 0, order_a, &n, sizes);
            CHECK(nb == 157 && n == NS, "queue %d epoch %d: %lld batches, %lld samples", queues[qi],
                  epoch, (long long)nb, (long long)n);
            CHECK(sizes[0] == 64 && sizes[155] == 64 && sizes[156] == 10000 - 156 * 64,
                  "last batch holds %d", sizes[156]);
            static unsigned char seen[NS];
            memset(seen, 0, sizeof seen);
            int dup = 0, broken = 0;
            for (int64_t k = 0; k < n; k++) {
                if (order_a[k] < 0) broken++;
                else if (seen[order_a[k]]++) dup++;
            }
            CHECK(dup == 0 && broken == 0, "queue %d epoch %d: %d repeats, %d broken rows",
                  queues[qi], epoch, dup, broken);
        }
        fr_loader_free(l);
    }
}

/* The order for (seed, epoch) as loader.h documents it, computed here. */
static void reference_order(uint64_t seed, int epoch, int64_t n, int64_t *perm) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    fr_rng r = fr_rng_make(seed, 1000 + (uint64_t)epoch);
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)fr_rng_below(&r, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
}

static void test_order(fr_ctx *ctx, fr_dataset *ds) {
    fr_loader_opts o0 = opts(100, 1, 0, 7, 0, 0), o3 = opts(100, 1, 0, 7, 3, 0),
                   o9 = opts(100, 1, 0, 8, 3, 0);
    fr_loader *a = fr_loader_new(ctx, ds, &o0), *b = fr_loader_new(ctx, ds, &o3),
              *c = fr_loader_new(ctx, ds, &o9);
    CHECK(a && b && c, "%s", fr_last_error(ctx));
    if (!a || !b || !c) return;
    static int64_t ref[NS];
    int64_t n;
    run_epoch(ctx, a, 2, 0, order_a, &n, NULL);
    reference_order(7, 2, NS, ref);
    CHECK(!memcmp(order_a, ref, sizeof ref), "epoch 2 is not Fisher-Yates on fr_rng_make(7, 1002)");
    run_epoch(ctx, b, 2, 0, order_b, &n, NULL);
    CHECK(!memcmp(order_a, order_b, sizeof ref), "prefetch changes the order");
    run_epoch(ctx, b, 3, 0, order_b, &n, NULL);
    CHECK(memcmp(order_a, order_b, sizeof ref) != 0, "epochs 2 and 3 have the same order");
    run_epoch(ctx, c, 2, 0, order_b, &n, NULL);
    CHECK(memcmp(order_a, order_b, sizeof ref) != 0, "seeds 7 and 8 give the same order");
    run_epoch(ctx, a, 2, 0, order_b, &n, NULL); /* the same loader again */
    CHECK(!memcmp(order_a, order_b, sizeof ref), "epoch 2 differs on its second run");

    /* Resume: epoch 2 from batch 37 is the tail of the full epoch. */
    int64_t nb = run_epoch(ctx, b, 2, 37, order_b, &n, NULL);
    CHECK(nb == 100 - 37 && n == NS - 3700 &&
              !memcmp(order_b, order_a + 3700, (size_t)n * sizeof *order_b),
          "resume at batch 37: %lld batches", (long long)nb);
    nb = run_epoch(ctx, b, 2, 100, order_b, &n, NULL);
    CHECK(nb == 0 && n == 0, "skip of a whole epoch yields nothing");
    CHECK(fr_loader_start(b, 2, 101) == FR_ERR_ARG, "skip past the epoch accepted");
    fr_batch bt;
    int done;
    CHECK(fr_loader_next(b, &bt, &done) == FR_ERR_ARG, "next after a refused start");
    CHECK(fr_loader_start(b, -1, 0) == FR_ERR_ARG, "negative epoch accepted");

    /* No shuffle: the identity. */
    fr_loader_opts on = opts(33, 0, 0, 7, 2, 0);
    fr_loader *d = fr_loader_new(ctx, ds, &on);
    run_epoch(ctx, d, 5, 0, order_b, &n, NULL);
    int ok = n == NS;
    for (int64_t k = 0; k < n; k++) ok &= order_b[k] == k;
    CHECK(ok, "shuffle 0 is not the identity");
    fr_loader_free(d);
    fr_loader_free(a);
    fr_loader_free(b);
    fr_loader_free(c);
}

static void test_drop_last_limit(fr_ctx *ctx, fr_dataset *ds) {
    fr_loader_opts o = opts(64, 1, 1, 3, 2, 0);
    fr_loader *l = fr_loader_new(ctx, ds, &o);
    int64_t n;
    int64_t nb = run_epoch(ctx, l, 0, 0, order_a, &n, sizes);
    CHECK(fr_loader_num_batches(l) == 156 && nb == 156 && n == 156 * 64,
          "drop_last: %lld batches, %lld samples", (long long)nb, (long long)n);
    int full = 1;
    for (int k = 0; k < nb; k++) full &= sizes[k] == 64;
    CHECK(full, "a short batch with drop_last");
    static unsigned char seen[NS];
    memset(seen, 0, sizeof seen);
    int dup = 0;
    for (int64_t k = 0; k < n; k++) dup += order_a[k] < 0 || seen[order_a[k]]++;
    CHECK(dup == 0, "drop_last repeats %d samples", dup);
    fr_loader_free(l);

    /* limit: only the first 100 samples, shuffled among themselves. */
    o = opts(32, 1, 0, 3, 1, 100);
    l = fr_loader_new(ctx, ds, &o);
    nb = run_epoch(ctx, l, 0, 0, order_a, &n, sizes);
    memset(seen, 0, sizeof seen);
    dup = 0;
    for (int64_t k = 0; k < n; k++)
        dup += order_a[k] < 0 || order_a[k] >= 100 || seen[order_a[k]]++;
    CHECK(nb == 4 && n == 100 && sizes[3] == 4 && dup == 0,
          "limit 100: %lld batches, %lld samples, %d bad", (long long)nb, (long long)n, dup);
    fr_loader_free(l);

    /* A batch larger than the data: one short batch, or none with drop_last. */
    o = opts(20000, 1, 0, 3, 1, 0);
    l = fr_loader_new(ctx, ds, &o);
    nb = run_epoch(ctx, l, 0, 0, order_a, &n, sizes);
    CHECK(nb == 1 && sizes[0] == NS, "one batch of everything");
    fr_loader_free(l);
    o.drop_last = 1;
    l = fr_loader_new(ctx, ds, &o);
    nb = run_epoch(ctx, l, 0, 0, order_a, &n, sizes);
    CHECK(nb == 0 && fr_loader_num_batches(l) == 0, "drop_last of a batch larger than the data");
    fr_loader_free(l);
    fr_loader_opts bad = opts(0, 1, 0, 3, 1, 0);
    CHECK(fr_loader_new(ctx, ds, &bad) == NULL && strstr(fr_last_error(ctx), "bad options"),
          "batch 0 accepted");
    bad = opts(8, 1, 0, 3, -1, 0);
    CHECK(fr_loader_new(ctx, ds, &bad) == NULL, "queue -1 accepted");
}

/* Restart and free with the prefetch thread running (possibly blocked on a
 * full queue); the batches stay right. */
static void test_restart(fr_ctx *ctx, fr_dataset *ds) {
    fr_loader_opts o = opts(16, 1, 0, 11, 3, 0);
    fr_loader *l = fr_loader_new(ctx, ds, &o);
    static int64_t ref[NS];
    int bad = 0;
    for (int round = 0; round < 60; round++) {
        int epoch = round % 4;
        reference_order(11, epoch, NS, ref);
        int64_t skip = round % 7;
        if (fr_loader_start(l, epoch, skip)) {
            bad++;
            continue;
        }
        if (round % 5 == 0) usleep(2000); /* let the producer fill the queue and block */
        for (int k = 0; k < round % 6; k++) {
            fr_batch b;
            int done;
            if (fr_loader_next(l, &b, &done) || done || b.n != 16) {
                bad++;
                break;
            }
            for (int s = 0; s < b.n; s++)
                if (decode(b.x + (size_t)s * SD, b.y[s]) != ref[(skip + k) * 16 + s]) bad++;
        }
    }
    CHECK(bad == 0, "%d wrong batches across restarts", bad);
    fr_loader_free(l); /* mid-epoch, thread running */
    l = fr_loader_new(ctx, ds, &o);
    fr_loader_start(l, 0, 0);
    usleep(2000);
    fr_loader_free(l); /* started, nothing taken */
    l = fr_loader_new(ctx, ds, &o);
    fr_loader_free(l); /* never started */
    CHECK(1, "free in every state");
}

/* DATA bytes while iterating stay at exactly (queue + 1) batch slots:
 * (queue + 1) * batch * (c*h*w * 4 + 4). */
static void test_memory_bound(fr_ctx *ctx, fr_dataset *ds) {
    const int queue = 3, batch = 64;
    const size_t bound = (size_t)(queue + 1) * batch * (SD * sizeof(float) + sizeof(int32_t));
    CHECK(bound == 66560, "bound %zu", bound);
    fr_mem_reset_peak(ctx);
    fr_mem_stats s0;
    fr_mem_get_stats(ctx, &s0);
    CHECK(s0.allocated[FR_MEM_DATA] == 0, "dataset holds %zu data bytes",
          s0.allocated[FR_MEM_DATA]);
    fr_loader_opts o = opts(batch, 1, 0, 5, queue, 0);
    fr_loader *l = fr_loader_new(ctx, ds, &o);
    int over = 0;
    for (int epoch = 0; epoch < 2; epoch++) {
        fr_loader_start(l, epoch, 0);
        for (;;) {
            fr_batch b;
            int done;
            if (fr_loader_next(l, &b, &done) || done) break;
            fr_mem_stats s;
            fr_mem_get_stats(ctx, &s);
            if (s.allocated[FR_MEM_DATA] != bound) over++;
        }
    }
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK(over == 0, "%d batches saw DATA bytes other than %zu", over, bound);
    CHECK(s.allocated_peak[FR_MEM_DATA] == bound,
          "peak DATA %zu, bound %zu (the whole set is %d bytes)", s.allocated_peak[FR_MEM_DATA],
          bound, NS * (SD * 4 + 4));
    CHECK(s.allocated[FR_MEM_OTHER] - s0.allocated[FR_MEM_OTHER] <= NS * sizeof(int64_t) + 4096,
          "loader metadata %zu bytes", s.allocated[FR_MEM_OTHER] - s0.allocated[FR_MEM_OTHER]);
    fr_loader_free(l);
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated[FR_MEM_DATA] == 0, "DATA left after free");
}

/* The image file shrinks under an open dataset: the prefetch thread's
 * pread comes up short; next() reports it on this thread, after the
 * batches read before the damage. */
static void test_thread_error(fr_ctx *ctx) {
    char p[512], pl[512];
    snprintf(p, sizeof p, "%s/shrink.idx", tmpdir);
    snprintf(pl, sizeof pl, "%s/lab.idx", tmpdir);
    FILE *in = fopen(img_path, "rb"), *out = fopen(p, "wb");
    char buf[65536];
    size_t k;
    while (in && out && (k = fread(buf, 1, sizeof buf, in)) > 0) fwrite(buf, 1, k, out);
    if (in) fclose(in);
    if (out) fclose(out);
    fr_dataset *ds = fr_dataset_open(ctx, p, pl);
    CHECK(ds != NULL, "%s", fr_last_error(ctx));
    if (!ds) return;
    fr_loader_opts o = opts(100, 0, 0, 1, 2, 0);
    fr_loader *l = fr_loader_new(ctx, ds, &o);
    fr_loader_start(l, 0, 0);
    fr_batch b;
    int done;
    CHECK(fr_loader_next(l, &b, &done) == FR_OK && b.n == 100, "first batch");
    if (truncate(p, 16 + 5000 * SD) != 0) perror("truncate");
    int64_t got = 1;
    fr_status st = FR_OK;
    while (!(st = fr_loader_next(l, &b, &done)) && !done) got++;
    CHECK(st == FR_ERR_IO, "status %d after %lld batches", st, (long long)got);
    CHECK(strstr(fr_last_error(ctx), "shrink.idx: cannot read sample") != NULL, "message: %s",
          fr_last_error(ctx));
    CHECK(got >= 1 && got <= 50, "%lld batches before the error", (long long)got);
    CHECK(fr_loader_next(l, &b, &done) == FR_ERR_IO, "error not sticky");
    /* A new epoch after the error starts cleanly, and fails the same way. */
    CHECK(fr_loader_start(l, 1, 0) == FR_OK, "restart after an error");
    fr_loader_free(l);
    o.queue = 0;
    l = fr_loader_new(ctx, ds, &o);
    fr_loader_start(l, 0, 60);
    st = fr_loader_next(l, &b, &done);
    CHECK(st == FR_ERR_IO && strstr(fr_last_error(ctx), "shrink.idx"), "queue 0: %s",
          fr_last_error(ctx));
    fr_loader_free(l);
    fr_dataset_close(ds);
}

/* Every allocation of open + new + start + two batches fails in turn. */
static void test_alloc_failures(fr_ctx *ctx) {
    int fails = 0;
    for (int queue = 0; queue <= 2; queue += 2) {
        for (int n = 1; n < 200; n++) {
            fr_mem_stats before, after;
            fr_mem_get_stats(ctx, &before);
            fr_mem_fail_at(ctx, (uint64_t)n);
            fr_dataset *ds = fr_dataset_open(ctx, img_path, lab_path);
            fr_loader *l = NULL;
            fr_status st = FR_OK;
            int got = 0;
            if (ds) {
                fr_loader_opts o = opts(50, 1, 0, 9, queue, 0);
                l = fr_loader_new(ctx, ds, &o);
            }
            if (l && !(st = fr_loader_start(l, 0, 0))) {
                for (int k = 0; k < 2 && !st; k++) {
                    fr_batch b;
                    int done;
                    st = fr_loader_next(l, &b, &done);
                    got += !st && !done && b.n == 50;
                }
            }
            fr_loader_free(l);
            fr_dataset_close(ds);
            fr_mem_fail_at(ctx, 0);
            fr_mem_get_stats(ctx, &after);
            int injected = after.num_ooms > before.num_ooms;
            if (!ds || !l) {
                fails++;
                CHECK(injected && strstr(fr_last_error(ctx), "out of memory"), "fail at %d: %s", n,
                      fr_last_error(ctx));
            } else {
                CHECK(st == FR_OK && got == 2, "fail at %d: batches failed: %s", n,
                      fr_last_error(ctx));
            }
            CHECK(after.allocated_total == 0, "fail at %d: %zu bytes leaked", n,
                  after.allocated_total);
            if (!injected) break;
        }
    }
    CHECK(fails >= 6, "only %d allocations failed", fails);
}

/* A regression set: 100 f32 samples of 4 values (value 0 is the index i),
 * targets (i, 2i, -i) as a (100, 3) .npy. Shuffled batches with prefetch
 * carry b.target rows that match their samples, no b.y, and DATA is
 * exactly (q + 1) * batch * (4 + 3) floats. */
static void test_targets(fr_ctx *ctx) {
    enum { TN = 100, TD = 4, TK = 3 };
    static const char
        *hx = "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (100, 4), }",
        *ht = "\x93NUMPY\x01\x00v\x00{'descr': '<f4', 'fortran_order': False, 'shape': (100, 3), }";
    char px[512], pt[512];
    snprintf(px, sizeof px, "%s/tx.npy", tmpdir);
    snprintf(pt, sizeof pt, "%s/tt.npy", tmpdir);
    const char *hdrs[2] = {hx, ht}, *paths[2] = {px, pt};
    for (int f = 0; f < 2; f++) {
        char hdr[128];
        memset(hdr, ' ', sizeof hdr);
        memcpy(hdr, hdrs[f], 10); /* preamble (with NULs), then the dict */
        memcpy(hdr + 10, hdrs[f] + 10, strlen(hdrs[f] + 10));
        hdr[127] = '\n';
        float v[TN * TD];
        int d = f ? TK : TD;
        for (int i = 0; i < TN; i++)
            for (int j = 0; j < d; j++)
                v[i * d + j] = f ? (float)(j == 0   ? i
                                           : j == 1 ? 2 * i
                                                    : -i)
                                 : (float)(i + 1000 * j);
        FILE *o = fopen(paths[f], "wb");
        if (!o) return;
        fwrite(hdr, 1, sizeof hdr, o);
        fwrite(v, sizeof(float), (size_t)TN * d, o);
        fclose(o);
    }
    fr_dataset *ds = fr_dataset_open(ctx, px, pt);
    CHECK(ds && fr_dataset_outputs(ds) == TK, "targets set: %s", fr_last_error(ctx));
    if (!ds) return;
    const int batch = 7, queue = 2;
    fr_loader_opts o = opts(batch, 1, 0, 3, queue, 0);
    fr_loader *l = fr_loader_new(ctx, ds, &o);
    CHECK(l != NULL, "%s", fr_last_error(ctx));
    int seen[TN] = {0}, bad = 0;
    fr_mem_stats s;
    if (l && !fr_loader_start(l, 0, 0)) {
        for (;;) {
            fr_batch b;
            int done;
            if (fr_loader_next(l, &b, &done) || done) break;
            if (b.y || !b.target) bad++;
            for (int k = 0; k < b.n && b.target; k++) {
                int i = (int)b.x[k * TD];
                const float *t = b.target + k * TK;
                if (i < 0 || i >= TN || b.x[k * TD + 3] != i + 3000 || t[0] != i || t[1] != 2 * i ||
                    t[2] != -i)
                    bad++;
                else seen[i]++;
            }
        }
        fr_mem_get_stats(ctx, &s);
        CHECK(s.allocated[FR_MEM_DATA] == (size_t)(queue + 1) * batch * (TD + TK) * sizeof(float),
              "DATA %zu", s.allocated[FR_MEM_DATA]);
    }
    for (int i = 0; i < TN; i++)
        if (seen[i] != 1) bad++;
    CHECK(bad == 0, "%d wrong target rows or samples", bad);
    fr_loader_free(l);
    fr_dataset_close(ds);
}

/* Data parallel slices: for 3 ranks, batch 64 over the first 1000 samples
 * (15 batches of 64 and one of 40), rank r's batch k holds samples
 * [r*n/3, (r+1)*n/3) of the one loader's batch k (n its size), worked out
 * here from the one loader's order; the slices differ by at most one, every
 * sample once; fr_loader_global_n says n; a slot holds ceil(64/3) = 22 samples
 * (DATA: 22 * (queue + 1) rows). */
static void test_rank_slices(fr_ctx *ctx, fr_dataset *ds) {
    enum { R = 3, B = 64, LIM = 1000 };
    static int64_t whole[LIM], part[LIM];
    static int wsizes[LIM / B + 1];
    fr_loader_opts o = opts(B, 1, 0, 9, 2, LIM);
    fr_loader *l = fr_loader_new(ctx, ds, &o);
    CHECK(l != NULL, "%s", fr_last_error(ctx));
    if (!l) return;
    int64_t n1;
    int64_t nb = run_epoch(ctx, l, 1, 0, whole, &n1, wsizes);
    fr_loader_free(l);
    CHECK(nb == 16 && n1 == LIM && wsizes[15] == 40, "one loader: %lld batches", (long long)nb);
    static unsigned char seen[LIM];
    memset(seen, 0, sizeof seen);
    for (int r = 0; r < R; r++) {
        fr_loader_opts ro = o;
        ro.rank = r, ro.ranks = R;
        fr_mem_stats before, after;
        fr_mem_get_stats(ctx, &before);
        fr_loader *rl = fr_loader_new(ctx, ds, &ro);
        CHECK(rl != NULL, "%s", fr_last_error(ctx));
        if (!rl) return;
        fr_mem_get_stats(ctx, &after);
        size_t data = after.allocated[FR_MEM_DATA] - before.allocated[FR_MEM_DATA];
        CHECK(data == 3 * 22 * (SD * sizeof(float) + sizeof(int32_t)),
              "rank %d: DATA %zu bytes, 3 slots of 22 samples expected", r, data);
        int64_t np = 0;
        CHECK(fr_loader_start(rl, 1, 0) == FR_OK, "%s", fr_last_error(ctx));
        for (int k = 0;; k++) {
            fr_batch b;
            int done = 0;
            if (fr_loader_next(rl, &b, &done) || done) break;
            int n = wsizes[k], lo = r * n / R, hi = (r + 1) * n / R;
            CHECK(b.n == hi - lo && fr_loader_global_n(rl) == n,
                  "rank %d batch %d: %d samples of %d, expected %d of %d", r, k, b.n,
                  fr_loader_global_n(rl), hi - lo, n);
            for (int j = 0; j < b.n && j < hi - lo; j++) {
                int64_t want = whole[(int64_t)k * B + lo + j];
                part[np] = decode(b.x + (size_t)j * SD, b.y[j]);
                CHECK(part[np] == want, "rank %d batch %d row %d: sample %lld, expected %lld", r, k,
                      j, (long long)part[np], (long long)want);
                if (part[np] >= 0 && part[np] < LIM) seen[part[np]]++;
                np++;
            }
        }
        CHECK(fr_loader_rank_samples(LIM, B, r, R) == np, "rank %d: %lld samples, counted %lld", r,
              (long long)np, (long long)fr_loader_rank_samples(LIM, B, r, R));
        fr_loader_free(rl);
    }
    int once = 1;
    for (int i = 0; i < LIM; i++) once &= seen[i] <= 1;
    CHECK(once, "a sample in two ranks' slices");
}

int main(void) {
    if (scratch_make("frugal-ld") || make_files()) {
        perror("setup");
        return 1;
    }
    int fds = open_fds();
    fr_ctx *ctx = fr_ctx_new();
    fr_dataset *ds = fr_dataset_open(ctx, img_path, lab_path);
    CHECK(ds != NULL, "%s", fr_last_error(ctx));
    if (ds) {
        test_epochs(ctx, ds);
        test_order(ctx, ds);
        test_drop_last_limit(ctx, ds);
        test_restart(ctx, ds);
        test_memory_bound(ctx, ds);
        test_rank_slices(ctx, ds);
        fr_dataset_close(ds);
    }
    test_thread_error(ctx);
    test_targets(ctx);
    test_alloc_failures(ctx);
    fr_mem_stats s;
    fr_mem_get_stats(ctx, &s);
    CHECK(s.allocated_total == 0, "leak: %zu bytes", s.allocated_total);
    fr_ctx_free(ctx);
    CHECK(open_fds() == fds, "%d file descriptors leaked", open_fds() - fds);
    remove_tree();
    return check_done();
}
