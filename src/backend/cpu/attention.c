/* attention.c — causal multi-head self-attention, forward and backward, as
 * FlashAttention-2 computes it (the design of PyTorch's CPU flash kernel,
 * aten/src/ATen/native/cpu/FlashAttentionKernel.cpp): scores a tile of
 * queries x a tile of keys at a time by OpenBLAS GEMMs, an online softmax in
 * the forward, the tiles recomputed from lse in the backward. It owns the
 * math and the tiling, and the op table's ATTENTION / ATTENTION_BWD kernels
 * on a GPT's fused qkv: no allocation (the workspace is planned). Also
 * generation's two ops (attention.h): ATTENTION_KV, a chunk of positions
 * over the KV caches, and LAST_ROW, the row the layers after the last
 * attention compute.
 *
 * For one (batch, head), with Q, K, V, O (T, HS) and s = 1/sqrt(HS):
 *   S = s Q K^T, masked to S[t,u] = -inf for u > t
 *   P = softmax_rows(S),  O = P V,  lse[t] = log sum_u exp(S[t,u])
 * and, from dO:
 *   dV = P^T dO;  dP = dO V^T;  D[t] = sum_u P[t,u] dP[t,u] = dO[t,:] . O[t,:]
 *   dS = P o (dP - D);  dQ = s dS K;  dK = s dS^T Q
 * P is never stored whole: the backward recomputes each tile as
 * P = exp(S - lse). */
#include "backend/cpu/attention.h"
#include <cblas.h>
#include <stdint.h>
#include <math.h>
#include <omp.h>
#include <string.h>
#include "backend/cpu/attn_tiles16.h"
#include "backend/cpu/exp_poly.h"
#include "core/half.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/reduce.h"
#include "frugal.h"
#include "backend/kcheck.h"

static int imin(int a, int b) { return a < b ? a : b; }

fr_attn_layout fr_attn_packed_gqa(int B, int NH, int NKV, int T, int HS) {
    const size_t t = (size_t)HS, h = (size_t)T * t, b = (size_t)NH * h;
    return (fr_attn_layout){B, NH, T, HS, b, h, t, b, h, t, NKV, (size_t)NKV * h, h};
}

fr_attn_layout fr_attn_packed(int B, int NH, int T, int HS) {
    return fr_attn_packed_gqa(B, NH, NH, T, HS);
}

fr_attn_layout fr_attn_fused_gqa(int B, int NH, int NKV, int T, int HS) {
    const size_t C = (size_t)NH * HS, W = (size_t)(NH + 2 * NKV) * HS;
    return (fr_attn_layout){B,
                            NH,
                            T,
                            HS,
                            (size_t)T * W,
                            (size_t)HS,
                            W,
                            (size_t)T * C,
                            (size_t)HS,
                            C,
                            NKV,
                            (size_t)T * W,
                            (size_t)HS};
}

fr_attn_layout fr_attn_fused(int B, int NH, int T, int HS) {
    return fr_attn_fused_gqa(B, NH, NH, T, HS);
}

/* Query heads a kv head serves (1: multi-head); 0 when NKV does not divide NH. */
static int group(const fr_attn_layout *L) {
    return L->NKV > 0 && L->NH % L->NKV == 0 ? L->NH / L->NKV : 0;
}

/* 16 words (64 bytes) rounded up */
static size_t up16(size_t words) { return (words + 15) / 16 * 16; }

/* The bf16 tile path's buffers (attn_tiles16.h), after a slot's two score
 * tiles and its m and l: out's f32 rows (BQ x HS); the pair packs of a key
 * tile's k and v for the products with their transposes (kt, vt), of k (or
 * v) for dS k (or P v) (kv), of q and dout for dS^T q and P^T dout (qp,
 * dop); dout (BQ x HS, and the zero pad row of an odd BQ), P and dS (BQ x
 * BK, the pad row and column zero) rounded to bf16 rows. The packs of a key
 * tile (kt, vt, kv) are kept for nkc key tiles, tile j in place j % nkc,
 * and those of a query tile (qp, dop, do16) for the last one: each with a
 * tag of what it holds (t16_tag), so that a call packs each tile once where
 * its loops come back to it (every query tile of a head reads the same key
 * tiles). t16_layout clears the tags, at the start of each call. */
typedef struct t16_bufs {
    float *o;
    uint32_t *kt, *vt, *kv, *qp, *dop;
    uint16_t *do16, *p16, *ds16;
    size_t ldt, ldh, ldp;      /* words a row of kt/vt, of kv/qp/dop; elements a row of p16/ds16 */
    size_t kt_words, kv_words; /* a key tile's pack in kt and vt, in kv */
    uint32_t *tags;            /* kt, vt, kv: nkc each; then qp, dop, do16 */
    int nkc;
} t16_bufs;

/* Key tiles whose packs a thread keeps: a head of up to 16 x 64 keys whole */
#define T16_KCACHE 16

/* Floats of the bf16 tile buffers for T keys; fills *b from base, with no
 * pack held (a call's tiles are other values than the last call's), when b
 * is given. */
static size_t t16_layout(float *base, int T, int BQ, int BK, int HS, t16_bufs *b) {
    const size_t ldt = fr_t16_ld(BK), ldh = fr_t16_ld(HS), ldp = (size_t)(BK + 1) / 2 * 2;
    const size_t hp = (size_t)(HS + 1) / 2, qp = (size_t)(BQ + 1) / 2, kp = (size_t)(BK + 1) / 2;
    const int nk = (T + BK - 1) / BK, nkc = imin(nk > 0 ? nk : 1, T16_KCACHE);
    const size_t ktw = up16(hp * ldt), kvw = up16(kp * ldh);
    const size_t sz[10] = {up16((size_t)BQ * (size_t)HS),
                           ktw * (size_t)nkc,
                           ktw * (size_t)nkc,
                           kvw * (size_t)nkc,
                           up16(qp * ldh),
                           up16(qp * ldh),
                           up16(2 * qp * hp),
                           up16(qp * ldp),
                           up16(qp * ldp),
                           up16(3 * (size_t)nkc + 3)};
    size_t off[10], n = 0;
    for (int i = 0; i < 10; i++) off[i] = n, n += sz[i];
    if (b) {
        b->o = base;
        b->kt = (uint32_t *)(base + off[1]), b->vt = (uint32_t *)(base + off[2]);
        b->kv = (uint32_t *)(base + off[3]), b->qp = (uint32_t *)(base + off[4]);
        b->dop = (uint32_t *)(base + off[5]);
        b->do16 = (uint16_t *)(base + off[6]), b->p16 = (uint16_t *)(base + off[7]);
        b->ds16 = (uint16_t *)(base + off[8]);
        b->tags = (uint32_t *)(base + off[9]);
        b->ldt = ldt, b->ldh = ldh, b->ldp = ldp;
        b->kt_words = ktw, b->kv_words = kvw, b->nkc = nkc;
        memset(b->tags, 0, (3 * (size_t)nkc + 3) * sizeof *b->tags);
    }
    return n;
}

/* Which buffer a tag names: a key tile's kt, vt, kv; a query tile's qp, dop, do16 */
enum { T16_KT, T16_VT, T16_KV, T16_QP, T16_DOP, T16_DO16 };

/* Whether buffer `which` must be packed for `want` (nonzero: what the
 * caller names the tile by): for a key tile j (T16_KT .. T16_KV) its place
 * j % nkc, for a query tile the one place; *at is set to the place's
 * words. The tag then says `want`. */
static int t16_tag(t16_bufs *b, int which, int j, uint32_t want, uint32_t **at) {
    uint32_t *tag;
    if (which <= T16_KV) {
        const int slot = j % b->nkc;
        uint32_t *base = which == T16_KT ? b->kt : which == T16_VT ? b->vt : b->kv;
        *at = base + (size_t)slot * (which == T16_KV ? b->kv_words : b->kt_words);
        tag = b->tags + (size_t)which * b->nkc + slot;
    } else {
        *at = which == T16_QP ? b->qp : which == T16_DOP ? b->dop : (uint32_t *)b->do16;
        tag = b->tags + 3 * (size_t)b->nkc + (which - T16_QP);
    }
    if (want && *tag == want) return 0;
    *tag = want;
    return 1;
}

/* The tag of key tile j of kv head kvh (of nk tiles a head) or of query
 * tile i of head bh (nq a head): 1 + its index, 0 (pack always) where the
 * indices would not fit the tags' 32 bits */
static uint32_t t16_name(size_t head, int j, int per_head, long long heads) {
    if ((unsigned long long)heads * (unsigned long long)per_head >= 0xffffffffull) return 0;
    return (uint32_t)(head * (size_t)per_head + (size_t)j + 1);
}

/* A thread's slot: two score tiles (BQ x BK) and two values per query row;
 * with 16-bit operands (half) also the widened tiles of q (BQ x HS), k and v
 * (BK x HS each) and the f32 accumulator of out's rows (BQ x HS), or, where
 * the CPU has the bf16 tile products, their buffers if larger (either path
 * fits). */
static size_t slot_floats(int T, int HS, int half) {
    size_t bq = (size_t)imin(T, FR_ATTN_BQ), bk = (size_t)imin(T, FR_ATTN_BK);
    size_t hs = (size_t)(HS > 0 ? HS : 0), extra = half ? (2 * bq + 2 * bk) * hs : 0;
    if (half && HS > 0 && fr_t16_cpu()) {
        size_t t = t16_layout(NULL, T, (int)bq, (int)bk, HS, NULL);
        if (t > extra) extra = t;
    }
    return 2 * bq * bk + 2 * bq + extra;
}

size_t fr_attention_ws_floats(int T, int HS, int threads) {
    return fr_attention_ws_floats_io(T, HS, threads, 0);
}

size_t fr_attention_ws_floats_io(int T, int HS, int threads, int half) {
    if (T < 1) T = 1;
    return slot_floats(T, HS, half) * (size_t)(threads > 0 ? threads : 1);
}

/* A backward thread's f32 sums of 16-bit gradients: the rows of one query
 * head's dq and its kv head's dk and dv (T x HS each), rounded into the
 * outputs when complete. */
static size_t acc_floats(int T, int HS) { return 3 * up16((size_t)T * (size_t)(HS > 0 ? HS : 0)); }

static size_t bwd_slot_floats(int T, int HS, int half, int grad16) {
    return slot_floats(T, HS, half) + (grad16 ? acc_floats(T, HS) : 0);
}

size_t fr_attention_bwd_ws_floats(int T, int HS, int threads, int half, int grad16) {
    if (T < 1) T = 1;
    return bwd_slot_floats(T, HS, half, grad16) * (size_t)(threads > 0 ? threads : 1);
}

/* The thread's widened tiles (a slot's tail, when half). */
typedef struct attn_bufs {
    float *q, *k, *v, *o;
} attn_bufs;

static attn_bufs slot_bufs(float *slot, int BQ, int BK, int HS) {
    attn_bufs b;
    b.q = slot + 2 * (size_t)BQ * BK + 2 * (size_t)BQ;
    b.k = b.q + (size_t)BQ * HS;
    b.v = b.k + (size_t)BK * HS;
    b.o = b.v + (size_t)BK * HS;
    return b;
}

/* n rows of HS values of a q-like tensor p (dtype dt, row stride ld
 * elements) from element off, as f32: p's own rows (*ldf = ld) when f32,
 * else widened exactly into buf (*ldf = HS). */
static const float *rows_f32(const void *p, fr_dtype dt, size_t off, size_t ld, int n, int HS,
                             float *buf, size_t *ldf) {
    if (dt == FR_F32) {
        *ldf = ld;
        return (const float *)p + off;
    }
    for (int r = 0; r < n; r++)
        fr_half_to_f32_n_seq((const uint16_t *)p + off + (size_t)r * ld, buf + (size_t)r * HS,
                             (size_t)HS, dt == FR_F16);
    *ldf = (size_t)HS;
    return buf;
}

/* Threads the kernel uses: as many as ws has slots, at most the maximum and
 * the number of tasks; 0 when ws holds no slot.
 * one_thread_gemms: OpenBLAS's bits depend on how many threads split a GEMM,
 * so every tile GEMM runs on one thread. In a team of several OpenBLAS sees
 * omp_in_parallel() and stays on one; a team of one (one task, or ws with one
 * slot) is not an active region, so each thread also sets its own
 * nthreads-var to 1 (an ICV of the region's implicit task: the caller's
 * setting is untouched), which OpenBLAS's OpenMP build reads. */
static int team(size_t slot, size_t ws_floats, long long tasks) {
    long long slots = (long long)(ws_floats / slot), nt = omp_get_max_threads();
    if (slots < nt) nt = slots;
    if (tasks < nt) nt = tasks;
    return (int)nt;
}

/* The scores of one tile: S (rq, rk; row stride ldS) = s Qi Kj^T, with Qi the
 * tile's rq query rows and Kj its rk key rows (HS each, row strides lq, lk). */
static void scores(float *S, int ldS, const float *Qi, size_t lq, const float *Kj, size_t lk,
                   int rq, int rk, int HS, float s) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rq, rk, HS, s, Qi, (int)lq, Kj, (int)lk,
                0.0f, S, ldS);
}

/* Keys of a tile starting at k0 (rk of them) that query row q may attend:
 * columns 0 .. n-1, n = clamp(q - k0 + 1, 0, rk). */
static int visible(int q, int k0, int rk) {
    int n = q - k0 + 1;
    return n < 0 ? 0 : n > rk ? rk : n;
}

/* The forward's online softmax over one tile of scores S (rq x rk, row
 * stride ldS; query rows q0.., keys k0..): per row, with m and l its running
 * max and sum, m' = max(m, max_u S), S becomes P = e^(S - m') (0 where
 * masked), l' = l e^(m - m') + sum_u P, and the row of O (HS wide, row
 * stride ot) is multiplied by e^(m - m'). */
FR_V3_CLONES static void online_softmax(float *S, int ldS, int rq, int rk, int q0, int k0, float *m,
                                        float *l, float *O, size_t ot, int HS) {
    for (int r = 0; r < rq; r++) {
        float *Sr = S + (size_t)r * ldS;
        const int n = visible(q0 + r, k0, rk);
        const float mx = max_f32(Sr, n, m[r]);
#pragma omp simd
        for (int c = 0; c < n; c++) Sr[c] = fr_exp_poly(Sr[c] - mx);
        for (int c = n; c < rk; c++) Sr[c] = 0.0f;
        const float sum = sum_f32(Sr, n);
        if (mx != m[r]) { /* m was -inf before the first tile: alpha 0 */
            const float alpha = fr_exp_poly(m[r] - mx);
            float *Or = O + (size_t)r * ot;
#pragma omp simd
            for (int d = 0; d < HS; d++) Or[d] *= alpha;
            l[r] *= alpha;
        }
        l[r] += sum;
        m[r] = mx;
    }
}

/* The backward's tile: P (scores s Q K^T on entry) becomes e^(P - lse), and
 * dS (dO V^T on entry) becomes P o (dS - D); both 0 where masked. */
FR_V3_CLONES static void probs_and_dscores(float *P, float *dS, int ld, int rq, int rk, int q0,
                                           int k0, const float *lse, const float *D) {
    for (int r = 0; r < rq; r++) {
        float *Pr = P + (size_t)r * ld, *dSr = dS + (size_t)r * ld;
        const int n = visible(q0 + r, k0, rk);
        const float lr = lse[r], Dr = D[r];
#pragma omp simd
        for (int c = 0; c < n; c++) {
            Pr[c] = fr_exp_poly(Pr[c] - lr);
            dSr[c] = Pr[c] * (dSr[c] - Dr);
        }
        for (int c = n; c < rk; c++) Pr[c] = 0.0f, dSr[c] = 0.0f;
    }
}

/* Offsets of (batch, head) bh's first row in q-like and out-like tensors. */
static size_t qbase(const fr_attn_layout *L, size_t bh) {
    return bh / (size_t)L->NH * L->qb + bh % (size_t)L->NH * L->qh;
}
static size_t obase(const fr_attn_layout *L, size_t bh) {
    return bh / (size_t)L->NH * L->ob + bh % (size_t)L->NH * L->oh;
}
/* Offset of the first row of the kv head that (batch, query head) bh reads. */
static size_t kbase(const fr_attn_layout *L, size_t bh) {
    return bh / (size_t)L->NH * L->kb + bh % (size_t)L->NH / (size_t)group(L) * L->kh;
}
/* The (batch, kv head) index that (batch, query head) bh reads. */
static size_t kv_head(const fr_attn_layout *L, size_t bh) {
    return bh / (size_t)L->NH * (size_t)L->NKV + bh % (size_t)L->NH / (size_t)group(L);
}

/* The bf16 tile products (attn_tiles16.h) run for a bf16 qkv of even head
 * size (a pair never crosses into the next head) where the CPU has them;
 * otherwise 16-bit operands are widened to f32 for OpenBLAS. */
static int tiles16(const fr_attn_io *io, int HS) {
    return io->qkv == FR_BF16 && HS % 2 == 0 && fr_t16_on();
}

// q, k, v are (B,NH,T,HS) seen through L's strides, out likewise, lse is (B,NH,T)
// out[t] = sum_{u<=t} exp(S[t,u] - lse[t]) v[u],  lse[t] = log sum_{u<=t} exp(S[t,u])
// One task per (b, head, query tile); out's rows are the accumulator. Per key
// tile j (left to right, those with a key at or left of the tile's last
// query): S = s Qi Kj^T; per row the running max m and sum l become
// m' = max(m, max_u S), l' = l e^(m - m') + sum_u e^(S - m'), the row of out
// is multiplied by e^(m - m') and gets P Vj added with P = e^(S - m').
// Key tiles wholly right of the diagonal are skipped, the diagonal ones
// masked. At the end out /= l and lse = m + log l.
int fr_attention_fwd(const fr_attn_layout *L, const float *q, const float *k, const float *v,
                     float *out, float *lse, float *ws, size_t ws_floats) {
    const fr_attn_io io = {FR_F32, FR_F32, FR_F32};
    return fr_attention_fwd_io(L, &io, q, k, v, out, lse, ws, ws_floats);
}

int fr_attention_fwd_io(const fr_attn_layout *L, const fr_attn_io *io, const void *q, const void *k,
                        const void *v, void *out, float *lse, float *ws, size_t ws_floats) {
    const int B = L->B, NH = L->NH, T = L->T, HS = L->HS;
    if (B <= 0 || NH <= 0 || T <= 0 || HS <= 0) return FR_OK;
    if (!group(L)) return FR_ERR_ARG;
    const int BQ = imin(T, FR_ATTN_BQ), BK = imin(T, FR_ATTN_BK);
    const int nq = (T + BQ - 1) / BQ, nk = (T + BK - 1) / BK;
    const long long tasks = (long long)B * NH * nq, kvheads = (long long)B * L->NKV;
    const fr_dtype qdt = io->qkv, odt = io->out;
    const int half = qdt != FR_F32 || odt != FR_F32;
    const size_t per = slot_floats(T, HS, half), qt = L->qt, ot = L->ot;
    const int nt = team(per, ws_floats, tasks);
    if (nt < 1) return FR_ERR_ARG;
    const float s = 1.0f / sqrtf((float)HS);
    const int t16 = tiles16(io, HS);
#pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1); /* one-thread GEMMs (see one_thread_gemms) */
        float *S = ws + (size_t)omp_get_thread_num() * per;
        float *m = S + 2 * (size_t)BQ * BK, *l = m + BQ;
        const attn_bufs b = slot_bufs(S, BQ, BK, HS);
        t16_bufs tb;
        if (t16) t16_layout(m + 2 * (size_t)BQ, T, BQ, BK, HS, &tb);
#pragma omp for schedule(static)
        for (long long task = 0; task < tasks; task++) {
            const size_t bh = (size_t)(task / nq);
            const int q0 = (int)(task % nq) * BQ, rq = imin(BQ, T - q0);
            const size_t base = qbase(L, bh), kvb = kbase(L, bh);
            const size_t oof = obase(L, bh) + (size_t)q0 * ot;
            size_t lo = odt == FR_F32 ? ot : (size_t)HS;
            /* out's rows are the accumulator: out itself when f32, else b.o */
            float *Oi = odt == FR_F32 ? (float *)out + oof : t16 ? tb.o : b.o;
            for (int r = 0; r < rq; r++) {
                memset(Oi + (size_t)r * lo, 0, (size_t)HS * sizeof(float));
                m[r] = -INFINITY, l[r] = 0.0f;
            }
            if (t16) { /* bf16 tile products: no widening */
                const uint16_t *Q16 = (const uint16_t *)q + base + (size_t)q0 * qt;
                const size_t kvh = kv_head(L, bh);
                for (int k0 = 0; k0 <= q0 + rq - 1; k0 += BK) {
                    const int rk = imin(BK, T - k0), j = k0 / BK;
                    const size_t kof = kvb + (size_t)k0 * qt;
                    const uint32_t name = t16_name(kvh, j, nk, kvheads);
                    uint32_t *kt, *vr;
                    if (t16_tag(&tb, T16_KT, j, name, &kt))
                        fr_t16_pack_pairs((const uint16_t *)k + kof, qt, rk, HS / 2, kt, tb.ldt);
                    fr_t16_gemm(rq, rk, HS / 2, Q16, qt, FR_T16_ROWS, kt, tb.ldt, s, 0, S, BK);
                    online_softmax(S, BK, rq, rk, q0, k0, m, l, Oi, lo, HS);
                    fr_t16_round_rows(S, BK, rq, rk, tb.p16, tb.ldp);
                    if (t16_tag(&tb, T16_KV, j, name, &vr))
                        fr_t16_pack_rows((const uint16_t *)v + kof, 0, qt, rk, HS, vr, tb.ldh);
                    fr_t16_gemm(rq, HS, (rk + 1) / 2, tb.p16, tb.ldp, FR_T16_ROWS, vr, tb.ldh, 1.0f,
                                1, Oi, lo);
                }
            } else { /* 16-bit operands widened a tile at a time, OpenBLAS */
                size_t lq, lk, lv;
                const float *Qi = rows_f32(q, qdt, base + (size_t)q0 * qt, qt, rq, HS, b.q, &lq);
                for (int k0 = 0; k0 <= q0 + rq - 1; k0 += BK) {
                    const int rk = imin(BK, T - k0);
                    const size_t kof = kvb + (size_t)k0 * qt;
                    const float *Kj = rows_f32(k, qdt, kof, qt, rk, HS, b.k, &lk);
                    const float *Vj = rows_f32(v, qdt, kof, qt, rk, HS, b.v, &lv);
                    scores(S, BK, Qi, lq, Kj, lk, rq, rk, HS, s);
                    online_softmax(S, BK, rq, rk, q0, k0, m, l, Oi, lo, HS);
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rq, HS, rk, 1.0f, S, BK,
                                Vj, (int)lv, 1.0f, Oi, (int)lo);
                }
            }
            for (int r = 0; r < rq; r++) {
                float *Or = Oi + (size_t)r * lo;
                const float inv = 1.0f / l[r];
                for (int d = 0; d < HS; d++) Or[d] *= inv;
                if (odt != FR_F32) /* rounded to nearest even, as a CAST would */
                    fr_f32_to_half_n_seq(Or, (uint16_t *)out + oof + (size_t)r * ot, (size_t)HS,
                                         odt == FR_F16);
                if (lse) lse[bh * (size_t)T + (size_t)q0 + r] = m[r] + logf(l[r]);
            }
        }
    }
    return FR_OK;
}

/* One tile of the backward's recomputation: S = s Qi Kj^T becomes
 * P = exp(S - lse) (0 where masked) in place, dP = dOi Vj^T becomes
 * dS = P o (dP - D) in place. Qi, Kj, Vj have row stride ldq, dOi ldo. */
static void tile_grads(float *P, float *dS, int ld, const float *Qi, size_t lq, const float *Kj,
                       size_t lk, const float *Vj, size_t lv, const float *dOi, int ldo,
                       const float *lse_i, const float *D, int q0, int k0, int rq, int rk, int HS,
                       float s) {
    scores(P, ld, Qi, lq, Kj, lk, rq, rk, HS, s);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rq, rk, HS, 1.0f, dOi, ldo, Vj, (int)lv,
                0.0f, dS, ld);
    probs_and_dscores(P, dS, ld, rq, rk, q0, k0, lse_i, D);
}

// q, k, v, dq, dk, dv are (B,NH,T,HS) and out, dout too, seen through L's strides;
// lse and D are (B,NH,T)
// dv = P^T dout;  dk = s dS^T q;  dq = s dS k;  dS = P o (dout v^T - D),
// D[t] = dout[t,:] . out[t,:], P = exp(s q k^T - lse) masked.
// Each row of an output is written by one task, in an order that does not
// depend on the thread count, so neither do the bits:
//  0. one task per (b, head, query tile): D of its rows, summed in double;
//  then, when there are at least as many (b, kv head) pairs as threads, one
//  task per (b, kv head) walks its group's query heads in increasing order,
//  in each its query tiles i in increasing order and, in each, its key tiles
//  j in increasing order, recomputing P and dS of tile (i, j) once and
//  adding to dq_i, dk_j and dv_j (dk, dv shared by the group's heads);
//  otherwise (few heads, many threads) two passes split the work finer and
//  recompute each tile twice:
//  1. one task per (b, kv head, key tile j): dk_j, dv_j summed over the
//     group's heads in increasing order and, in each, over the query tiles i
//     that see a key of j, in increasing i;
//  2. one task per (b, head, query tile i): dq_i summed over key tiles j in
//     increasing j.
// Both ways add the same tile products into each row in the same order, so
// they give the same bits. A 16-bit dq, dk, dv: the task adds its rows into
// f32 sums in its thread's slot instead (the same adds in the same order)
// and rounds them into the output once they are complete, so no f32 dqkv
// exists and no CAST pass follows.
static void zero_rows(float *x, size_t ld, int rows, int HS) {
    for (int r = 0; r < rows; r++) memset(x + (size_t)r * ld, 0, (size_t)HS * sizeof(float));
}

/* The contributions of tile (q0, k0) of head bh: P and dS recomputed into
 * the thread's slot, then dv_j += P^T dO_i, dk_j += s dS^T Q_i and, when dq
 * is given, dq_i += s dS K_j. */
typedef struct attn_bwd_args {
    const fr_attn_layout *L;
    const void *q, *k, *v;
    fr_dtype qdt;
    const float *dout, *lse, *D;
    float s;
    int BQ, BK;
    int nq, nk;               /* query and key tiles a head */
    long long heads, kvheads; /* (batch, head) and (batch, kv head) pairs */
} attn_bwd_args;

/* Where a task's tiles add their gradients: the f32 rows of the query
 * head's dq and of its kv head's dk and dv, from row 0 of each, ld floats
 * a row; the outputs themselves (f32) or the thread's sums (16-bit). */
typedef struct attn_sums {
    float *dq, *dk, *dv;
    size_t ld;
} attn_sums;

static void bwd_tile(const attn_bwd_args *a, float *P, float *dS, const attn_bufs *b, size_t bh,
                     int q0, int k0, int with_dq, const attn_sums *o) {
    const fr_attn_layout *L = a->L;
    const size_t qt = L->qt, ot = L->ot;
    const int T = L->T, HS = L->HS, BK = a->BK;
    const int rq = imin(a->BQ, T - q0), rk = imin(BK, T - k0);
    const size_t qof = qbase(L, bh) + (size_t)q0 * qt, kof = kbase(L, bh) + (size_t)k0 * qt;
    const size_t oof = obase(L, bh) + (size_t)q0 * ot, lof = bh * (size_t)T + (size_t)q0;
    size_t lq, lk, lv;
    const float *Qi = rows_f32(a->q, a->qdt, qof, qt, rq, HS, b->q, &lq);
    const float *Kj = rows_f32(a->k, a->qdt, kof, qt, rk, HS, b->k, &lk);
    const float *Vj = rows_f32(a->v, a->qdt, kof, qt, rk, HS, b->v, &lv);
    tile_grads(P, dS, BK, Qi, lq, Kj, lk, Vj, lv, a->dout + oof, (int)ot, a->lse + lof, a->D + lof,
               q0, k0, rq, rk, HS, a->s);
    const int ld = (int)o->ld;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rk, HS, rq, 1.0f, P, BK, a->dout + oof,
                (int)ot, 1.0f, o->dv + (size_t)k0 * o->ld, ld);
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rk, HS, rq, a->s, dS, BK, Qi, (int)lq,
                1.0f, o->dk + (size_t)k0 * o->ld, ld);
    if (with_dq)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rq, HS, rk, a->s, dS, BK, Kj,
                    (int)lk, 1.0f, o->dq + (size_t)q0 * o->ld, ld);
}

/* bwd_tile on the bf16 tile products (a bf16 qkv, attn_tiles16.h): S = s Q
 * K^T and dP = dO V^T with dO rounded to bf16, then with P and dS rounded
 * to bf16: dv_j += P^T dO_i and dk_j += s dS^T Q_i (what & 1), dq_i += s
 * dS K_j (what & 2). */
static void bwd_tile16(const attn_bwd_args *a, float *P, float *dS, t16_bufs *tb, size_t bh, int q0,
                       int k0, int what, const attn_sums *o) {
    const fr_attn_layout *L = a->L;
    const size_t qt = L->qt, ot = L->ot;
    const int T = L->T, HS = L->HS, BK = a->BK, hp = HS / 2;
    const int rq = imin(a->BQ, T - q0), rk = imin(BK, T - k0), j = k0 / BK;
    const size_t qof = qbase(L, bh) + (size_t)q0 * qt, kof = kbase(L, bh) + (size_t)k0 * qt;
    const size_t oof = obase(L, bh) + (size_t)q0 * ot, lof = bh * (size_t)T + (size_t)q0;
    const uint16_t *Q16 = (const uint16_t *)a->q + qof, *K16 = (const uint16_t *)a->k + kof,
                   *V16 = (const uint16_t *)a->v + kof;
    const float *dO = a->dout + oof;
    /* the packs, each made once for what it holds (t16_tag) */
    const uint32_t kn = t16_name(kv_head(L, bh), j, a->nk, a->kvheads),
                   qn = t16_name(bh, q0 / a->BQ, a->nq, a->heads);
    uint32_t *kt, *vt, *kv, *qp, *dop, *do16w;
    if (t16_tag(tb, T16_KT, j, kn, &kt)) fr_t16_pack_pairs(K16, qt, rk, hp, kt, tb->ldt);
    fr_t16_gemm(rq, rk, hp, Q16, qt, FR_T16_ROWS, kt, tb->ldt, a->s, 0, P, BK);
    if (t16_tag(tb, T16_DO16, 0, qn, &do16w))
        fr_t16_round_rows(dO, ot, rq, HS, (uint16_t *)do16w, (size_t)HS);
    if (t16_tag(tb, T16_VT, j, kn, &vt)) fr_t16_pack_pairs(V16, qt, rk, hp, vt, tb->ldt);
    fr_t16_gemm(rq, rk, hp, do16w, (size_t)HS, FR_T16_ROWS, vt, tb->ldt, 1.0f, 0, dS, BK);
    probs_and_dscores(P, dS, BK, rq, rk, q0, k0, a->lse + lof, a->D + lof);
    fr_t16_round_rows(dS, BK, rq, rk, tb->ds16, tb->ldp);
    if (what & 1) {
        const int rqp = (rq + 1) / 2;
        fr_t16_round_rows(P, BK, rq, rk, tb->p16, tb->ldp);
        if (t16_tag(tb, T16_DOP, 0, qn, &dop)) fr_t16_pack_rows(dO, 1, ot, rq, HS, dop, tb->ldh);
        fr_t16_gemm(rk, HS, rqp, tb->p16, tb->ldp, FR_T16_COLS, dop, tb->ldh, 1.0f, 1,
                    o->dv + (size_t)k0 * o->ld, o->ld);
        if (t16_tag(tb, T16_QP, 0, qn, &qp)) fr_t16_pack_rows(Q16, 0, qt, rq, HS, qp, tb->ldh);
        fr_t16_gemm(rk, HS, rqp, tb->ds16, tb->ldp, FR_T16_COLS, qp, tb->ldh, a->s, 1,
                    o->dk + (size_t)k0 * o->ld, o->ld);
    }
    if (what & 2) {
        if (t16_tag(tb, T16_KV, j, kn, &kv)) fr_t16_pack_rows(K16, 0, qt, rk, HS, kv, tb->ldh);
        fr_t16_gemm(rq, HS, (rk + 1) / 2, tb->ds16, tb->ldp, FR_T16_ROWS, kv, tb->ldh, a->s, 1,
                    o->dq + (size_t)q0 * o->ld, o->ld);
    }
}

/* D[r] = x[r,:] . y[r,:] for rows r < n, each summed in double over d in
 * order: one dependent chain of adds a row, so four rows run side by side
 * (named locals, kept in registers), each with the bits of its row alone. */
FR_V3_CLONES static void row_dots(const float *x, size_t ldx, const float *y, size_t ldy, int n,
                                  int HS, float *D) {
    int r = 0;
    for (; r + 4 <= n; r += 4) {
        const float *x0 = x + (size_t)r * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;
        const float *y0 = y + (size_t)r * ldy, *y1 = y0 + ldy, *y2 = y1 + ldy, *y3 = y2 + ldy;
        double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        for (int d = 0; d < HS; d++) {
            a0 += (double)x0[d] * y0[d];
            a1 += (double)x1[d] * y1[d];
            a2 += (double)x2[d] * y2[d];
            a3 += (double)x3[d] * y3[d];
        }
        D[r] = (float)a0, D[r + 1] = (float)a1, D[r + 2] = (float)a2, D[r + 3] = (float)a3;
    }
    for (; r < n; r++) {
        const float *xr = x + (size_t)r * ldx, *yr = y + (size_t)r * ldy;
        double acc = 0.0;
        for (int d = 0; d < HS; d++) acc += (double)xr[d] * yr[d];
        D[r] = (float)acc;
    }
}

int fr_attention_bwd(const fr_attn_layout *L, const float *q, const float *k, const float *v,
                     const float *out, const float *dout, const float *lse, float *D, float *dq,
                     float *dk, float *dv, float *ws, size_t ws_floats) {
    const fr_attn_io io = {FR_F32, FR_F32, FR_F32};
    return fr_attention_bwd_io(L, &io, q, k, v, out, dout, lse, D, dq, dk, dv, ws, ws_floats);
}

/* Where rows of a gradient are summed: the thread's sums from float `at`
 * (acc given: a 16-bit gradient), else the f32 gradient g from element off */
static float *sums_at(float *acc, size_t at, void *g, size_t off) {
    return acc ? acc + at : (float *)g + off;
}

/* A 16-bit gradient's rows r0 .. r0+n-1 (from element off, row stride ld)
 * rounded to nearest even from the thread's f32 sums, as a CAST would */
static void round_rows(const float *sum, size_t lds, void *g, fr_dtype dt, size_t off, size_t ld,
                       int r0, int n, int HS) {
    for (int r = r0; r < r0 + n; r++)
        fr_f32_to_half_n_seq(sum + (size_t)r * lds, (uint16_t *)g + off + (size_t)r * ld,
                             (size_t)HS, dt == FR_F16);
}

int fr_attention_bwd_io(const fr_attn_layout *L, const fr_attn_io *io, const void *q, const void *k,
                        const void *v, const void *out, const float *dout, const float *lse,
                        float *D, void *dq, void *dk, void *dv, float *ws, size_t ws_floats) {
    const int B = L->B, NH = L->NH, T = L->T, HS = L->HS, G = group(L);
    if (B <= 0 || NH <= 0 || T <= 0 || HS <= 0) return FR_OK;
    if (!G) return FR_ERR_ARG;
    const int BQ = imin(T, FR_ATTN_BQ), BK = imin(T, FR_ATTN_BK);
    const int nq = (T + BQ - 1) / BQ, nk = (T + BK - 1) / BK;
    const long long heads = (long long)B * NH, kvheads = (long long)B * L->NKV;
    const long long tasks_k = kvheads * nk, tasks_q = heads * nq;
    const int half = io->qkv != FR_F32 || io->out != FR_F32;
    const fr_dtype gdt = io->dqkv;
    const int g16 = gdt != FR_F32;
    const size_t slot = slot_floats(T, HS, half), per = bwd_slot_floats(T, HS, half, g16);
    const size_t qt = L->qt, ot = L->ot, th = up16((size_t)T * HS);
    const int nt = team(per, ws_floats, tasks_k > tasks_q ? tasks_k : tasks_q);
    if (nt < 1) return FR_ERR_ARG;
    const int per_head = kvheads >= nt, t16 = tiles16(io, HS);
    const attn_bwd_args a = {L,  q,  k,  v,  io->qkv, dout,   lse, D, 1.0f / sqrtf((float)HS),
                             BQ, BK, nq, nk, heads,   kvheads};
#pragma omp parallel num_threads(nt)
    {
        omp_set_num_threads(1); /* one-thread GEMMs (see one_thread_gemms) */
        float *P = ws + (size_t)omp_get_thread_num() * per;
        float *dS = P + (size_t)BQ * BK;
        const attn_bufs b = slot_bufs(P, BQ, BK, HS);
        t16_bufs tb;
        if (t16) t16_layout(P + 2 * (size_t)BQ * BK + 2 * (size_t)BQ, T, BQ, BK, HS, &tb);
        /* a 16-bit gradient's sums: the slot's tail; an f32 one's: itself */
        float *acc = g16 ? P + slot : NULL;
        attn_sums o = {NULL, NULL, NULL, g16 ? (size_t)HS : qt};
#pragma omp for schedule(static)
        for (long long task = 0; task < tasks_q; task++) {
            const size_t bh = (size_t)(task / nq);
            const int q0 = (int)(task % nq) * BQ, rq = imin(BQ, T - q0);
            const size_t off = obase(L, bh) + (size_t)q0 * ot;
            size_t lo;
            const float *Oi = rows_f32(out, io->out, off, ot, rq, HS, b.o, &lo);
            row_dots(dout + off, ot, Oi, lo, rq, HS, D + bh * (size_t)T + (size_t)q0);
        }
        if (per_head) {
#pragma omp for schedule(static)
            for (long long bkv = 0; bkv < kvheads; bkv++) {
                /* the group's query heads, in increasing order */
                const size_t bh0 = (size_t)(bkv / L->NKV * NH + bkv % L->NKV * G);
                o.dk = sums_at(acc, th, dk, kbase(L, bh0));
                o.dv = sums_at(acc, 2 * th, dv, kbase(L, bh0));
                zero_rows(o.dk, o.ld, T, HS);
                zero_rows(o.dv, o.ld, T, HS);
                for (size_t bh = bh0; bh < bh0 + (size_t)G; bh++) {
                    o.dq = sums_at(acc, 0, dq, qbase(L, bh));
                    zero_rows(o.dq, o.ld, T, HS);
                    for (int q0 = 0; q0 < T; q0 += BQ)
                        for (int k0 = 0; k0 <= imin(T, q0 + BQ) - 1; k0 += BK)
                            if (t16) bwd_tile16(&a, P, dS, &tb, bh, q0, k0, 3, &o);
                            else bwd_tile(&a, P, dS, &b, bh, q0, k0, 1, &o);
                    if (g16) round_rows(o.dq, o.ld, dq, gdt, qbase(L, bh), qt, 0, T, HS);
                }
                if (g16) {
                    round_rows(o.dk, o.ld, dk, gdt, kbase(L, bh0), qt, 0, T, HS);
                    round_rows(o.dv, o.ld, dv, gdt, kbase(L, bh0), qt, 0, T, HS);
                }
            }
        } else {
#pragma omp for schedule(static)
            for (long long task = 0; task < tasks_k; task++) {
                const long long bkv = task / nk;
                const size_t bh0 = (size_t)(bkv / L->NKV * NH + bkv % L->NKV * G);
                const int k0 = (int)(task % nk) * BK, rk = imin(BK, T - k0);
                o.dk = sums_at(acc, th, dk, kbase(L, bh0));
                o.dv = sums_at(acc, 2 * th, dv, kbase(L, bh0));
                zero_rows(o.dk + (size_t)k0 * o.ld, o.ld, rk, HS);
                zero_rows(o.dv + (size_t)k0 * o.ld, o.ld, rk, HS);
                /* the group's heads in increasing order, each from the first
                 * query tile with a query >= k0 */
                for (size_t bh = bh0; bh < bh0 + (size_t)G; bh++)
                    for (int q0 = k0 / BQ * BQ; q0 < T; q0 += BQ)
                        if (t16) bwd_tile16(&a, P, dS, &tb, bh, q0, k0, 1, &o);
                        else bwd_tile(&a, P, dS, &b, bh, q0, k0, 0, &o);
                if (g16) {
                    round_rows(o.dk, o.ld, dk, gdt, kbase(L, bh0), qt, k0, rk, HS);
                    round_rows(o.dv, o.ld, dv, gdt, kbase(L, bh0), qt, k0, rk, HS);
                }
            }
#pragma omp for schedule(static)
            for (long long task = 0; task < tasks_q; task++) {
                const size_t bh = (size_t)(task / nq);
                const int q0 = (int)(task % nq) * BQ, rq = imin(BQ, T - q0);
                const size_t qof = qbase(L, bh) + (size_t)q0 * qt;
                const size_t oof = obase(L, bh) + (size_t)q0 * ot,
                             lof = bh * (size_t)T + (size_t)q0;
                size_t lq, lk, lv;
                o.dq = sums_at(acc, 0, dq, qbase(L, bh));
                float *dqi = o.dq + (size_t)q0 * o.ld;
                zero_rows(dqi, o.ld, rq, HS);
                if (t16) {
                    for (int k0 = 0; k0 <= q0 + rq - 1; k0 += BK)
                        bwd_tile16(&a, P, dS, &tb, bh, q0, k0, 2, &o);
                } else {
                    const float *Qi = rows_f32(q, io->qkv, qof, qt, rq, HS, b.q, &lq);
                    for (int k0 = 0; k0 <= q0 + rq - 1; k0 += BK) {
                        const int rk = imin(BK, T - k0);
                        const size_t kof = kbase(L, bh) + (size_t)k0 * qt;
                        const float *Kj = rows_f32(k, io->qkv, kof, qt, rk, HS, b.k, &lk);
                        const float *Vj = rows_f32(v, io->qkv, kof, qt, rk, HS, b.v, &lv);
                        tile_grads(P, dS, BK, Qi, lq, Kj, lk, Vj, lv, dout + oof, (int)ot,
                                   lse + lof, D + lof, q0, k0, rq, rk, HS, a.s);
                        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rq, HS, rk, a.s, dS,
                                    BK, Kj, (int)lk, 1.0f, dqi, (int)o.ld);
                    }
                }
                if (g16) round_rows(o.dq, o.ld, dq, gdt, qbase(L, bh), qt, q0, rq, HS);
            }
        }
    }
    return FR_OK;
}

/* ---- the op table's kernels: qkv (B,T,3C) in the fused layout ---- */

static int attn_dims(fr_kernel_call *c, const char *op, const fr_tensor *qkv, fr_attn_layout *L) {
    fr_attn_dims d;
    int st = fr_kcheck_attention(c, op, qkv, &d);
    if (!st) *L = fr_attn_fused_gqa(d.B, d.NH, d.NKV, d.T, d.HS);
    return st;
}

/* q, k, v's element offsets in a fused qkv of dtype dt */
static const void *col(const fr_tensor *t, size_t off) {
    return t->dtype == FR_F32 ? (const void *)((const float *)t->data + off)
                              : (const void *)((const uint16_t *)t->data + off);
}

static int io_ok(fr_kernel_call *c, const char *op, fr_dtype a, fr_dtype b) {
    if ((a == FR_F32 || a == FR_BF16 || a == FR_F16) &&
        (b == FR_F32 || b == FR_BF16 || b == FR_F16))
        return FR_OK;
    return fr_fail(c->ctx, FR_ERR_ARG, "%s: qkv and y must be f32, f16 or bf16", op);
}

// qkv is (B,T,(NH+2NKV)HS) (3C when NKV = NH), y is (B,T,C), C = NH HS, lse is
// (B,NH,T), ws a tile per thread; qkv and y f32 or 16 bits (y rounded from the f32 result)
int fr_k_attention(fr_kernel_call *c) {
    fr_attn_layout L;
    int st = attn_dims(c, "attention", &c->in[0], &L);
    if (st || (st = io_ok(c, "attention", c->in[0].dtype, c->out[0].dtype))) return st;
    const size_t C = (size_t)L.NH * L.HS, CK = (size_t)L.NKV * L.HS;
    const fr_tensor *qkv = &c->in[0];
    const fr_attn_io io = {qkv->dtype, c->out[0].dtype, FR_F32};
    float *ws = fr_f32(&c->out[2]);
    const size_t wsn = (size_t)fr_shape_numel(&c->out[2].shape);
    if (fr_attention_fwd_io(&L, &io, col(qkv, 0), col(qkv, C), col(qkv, C + CK), c->out[0].data,
                            fr_f32(&c->out[1]), ws, ws ? wsn : 0))
        return fr_fail(c->ctx, FR_ERR_ARG, "attention: a workspace of %zu floats holds no tile",
                       ws ? wsn : 0);
    return FR_OK;
}

// dy, y are (B,T,C), qkv and dqkv (B,T,(NH+2NKV)HS), lse and D (B,NH,T), ws
// (fr_attention_bwd_ws_floats); qkv, y and dqkv f32 or 16 bits
int fr_k_attention_bwd(fr_kernel_call *c) {
    fr_attn_layout L;
    int st = attn_dims(c, "attention_bwd", &c->in[1], &L);
    if (st || (st = io_ok(c, "attention_bwd", c->in[1].dtype, c->in[2].dtype))) return st;
    fr_tensor *dqkv = &c->out[0];
    if (dqkv->dtype != FR_F32 && dqkv->dtype != FR_BF16 && dqkv->dtype != FR_F16)
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_bwd: dqkv must be f32, f16 or bf16");
    if (!dqkv->data) return FR_OK;
    if (acc_bit(c, 0))
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "attention_bwd: dqkv is written whole, it cannot be added into");
    if (c->in[0].dtype != FR_F32)
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_bwd: dy must be f32");
    const size_t C = (size_t)L.NH * L.HS, CK = (size_t)L.NKV * L.HS;
    const fr_tensor *qkv = &c->in[1];
    const fr_attn_io io = {qkv->dtype, c->in[2].dtype, dqkv->dtype};
    float *ws = fr_f32(&c->out[2]), *D = fr_f32(&c->out[1]);
    const size_t wsn = ws ? (size_t)fr_shape_numel(&c->out[2].shape) : 0;
    if (!D || !fr_f32(&c->in[3]))
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_bwd: the saved lse or D's buffer is missing");
    if (fr_attention_bwd_io(&L, &io, col(qkv, 0), col(qkv, C), col(qkv, C + CK), c->in[2].data,
                            fr_f32(&c->in[0]), fr_f32(&c->in[3]), D, (void *)col(dqkv, 0),
                            (void *)col(dqkv, C), (void *)col(dqkv, C + CK), ws, wsn))
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_bwd: a workspace of %zu floats holds no tile",
                       wsn);
    return FR_OK;
}

/* ---- generation: a chunk of positions over the caches (attention.h) ---- */

int64_t fr_attention_kv_ws(int P, int NH, int Tc, int HS, int threads) {
    const int64_t tiles = (int64_t)fr_attention_ws_floats(P, HS, threads);
    const int64_t scores = (int64_t)NH * Tc;
    return tiles > scores ? tiles : scores;
}

/* One query q (HS) of one head over positions 0 .. n-1 of its cache Kh, Vh
 * (rows of HS): s[u] = scale q.Kh[u], y = sum_u softmax(s)[u] Vh[u], the
 * softmax's sum in double; s holds n floats. O(n HS). */
static void attend_cached(const float *q, const float *Kh, const float *Vh, int n, int HS,
                          float scale, float *s, float *y) {
    float mx = -INFINITY;
    for (int u = 0; u < n; u++) {
        const float *k = Kh + (size_t)u * HS;
        float d = 0.0f;
        for (int j = 0; j < HS; j++) d += q[j] * k[j];
        s[u] = d * scale;
        if (s[u] > mx) mx = s[u];
    }
    double sum = 0.0;
    for (int u = 0; u < n; u++) {
        s[u] = expf(s[u] - mx);
        sum += s[u];
    }
    const float inv = (float)(1.0 / sum);
    for (int j = 0; j < HS; j++) y[j] = 0.0f;
    for (int u = 0; u < n; u++) {
        const float p = s[u] * inv, *v = Vh + (size_t)u * HS;
        for (int j = 0; j < HS; j++) y[j] += p * v[j];
    }
}

// qkv is (B,P,(NH+2NKV)HS), K and V are (B,NKV,Tc,HS), y is (B,P,C), C = NH HS, ws
// fr_attention_kv_ws floats; pos = c->step, CK = NKV HS.
// K[b,g,pos+t] = qkv[b,t,C + g HS ..], V[b,g,pos+t] = qkv[b,t,C + CK + g HS ..];
// y[b,t,h HS ..] attends positions 0 .. pos+t of K[b,g], V[b,g], g = h / (NH / NKV).
int fr_k_attention_kv(fr_kernel_call *c) {
    fr_attn_dims d;
    int st = fr_kcheck_attention(c, "attention_kv", &c->in[0], &d);
    if (st) return st;
    const int B = d.B, P = d.T, NH = d.NH, NKV = d.NKV, HS = d.HS, G = NH / NKV;
    const fr_shape *ks = &c->in[1].shape;
    if (ks->ndim != 4 || ks->d[0] != B || ks->d[1] != NKV || ks->d[3] != HS ||
        !fr_shape_eq(ks, &c->in[2].shape) || ks->d[2] < P || c->step > (uint64_t)(ks->d[2] - P))
        return fr_fail(c->ctx, FR_ERR_SHAPE,
                       "attention_kv: positions %llu .. %llu do not fit caches of (%d, %d, %lld, "
                       "%d) (batch, heads, positions, head size)",
                       (unsigned long long)c->step, (unsigned long long)c->step + P - 1, B, NKV,
                       ks->ndim == 4 ? (long long)ks->d[2] : 0LL, HS);
    float *K = fr_f32(&c->in[1]), *Vc = fr_f32(&c->in[2]), *y = fr_f32(&c->out[0]);
    float *ws = fr_f32(&c->out[1]);
    const float *qkv = fr_f32(&c->in[0]);
    if (!K || !Vc || !qkv || !y)
        return fr_fail(c->ctx, FR_ERR_ARG, "attention_kv: a cache, qkv or y is not bound");
    const size_t C = (size_t)NH * HS, CK = (size_t)NKV * HS, W = C + 2 * CK;
    const size_t Tc = (size_t)ks->d[2], pos = (size_t)c->step;
    const size_t wsn = ws ? (size_t)fr_shape_numel(&c->out[1].shape) : 0;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < P; t++)
            for (int g = 0; g < NKV; g++) {
                const float *src = qkv + ((size_t)b * P + t) * W + (size_t)g * HS;
                const size_t row = (((size_t)b * NKV + g) * Tc + pos + t) * HS;
                memcpy(K + row, src + C, (size_t)HS * sizeof(float));
                memcpy(Vc + row, src + C + CK, (size_t)HS * sizeof(float));
            }
    if (pos == 0) { /* nothing cached before the chunk: its own q, k, v */
        fr_attn_layout L = fr_attn_fused_gqa(B, NH, NKV, P, HS);
        if (fr_attention_fwd(&L, qkv, qkv + C, qkv + C + CK, y, NULL, ws, wsn))
            return fr_fail(c->ctx, FR_ERR_ARG,
                           "attention_kv: a workspace of %zu floats holds no tile", wsn);
        return FR_OK;
    }
    if (wsn < (size_t)NH * Tc)
        return fr_fail(c->ctx, FR_ERR_ARG,
                       "attention_kv: a workspace of %zu floats, %zu needed for the scores", wsn,
                       (size_t)NH * Tc);
    const float scale = 1.0f / sqrtf((float)HS);
    for (int b = 0; b < B; b++)
        for (int t = 0; t < P; t++) {
            const int n = (int)pos + t + 1;
            const float *q = qkv + ((size_t)b * P + t) * W;
            float *yt = y + ((size_t)b * P + t) * C;
#pragma omp parallel for schedule(static) if ((size_t)NH * n * HS >= 65536)
            for (int h = 0; h < NH; h++) {
                const size_t kh = ((size_t)b * NKV + h / G) * Tc * HS;
                attend_cached(q + (size_t)h * HS, K + kh, Vc + kh, n, HS, scale, ws + h * Tc,
                              yt + (size_t)h * HS);
            }
        }
    return FR_OK;
}

// x is (B,T,...) of any dtype, y is (B,1,...): y[b] = x[b, T-1]
int fr_k_last_row(fr_kernel_call *c) {
    int64_t B, T;
    size_t row;
    const int st = fr_kcheck_last_row(c, &B, &T, &row);
    if (st || row == 0) return st;
    const char *xp = c->in[0].data;
    char *yp = c->out[0].data;
    for (int64_t b = 0; b < B; b++) memcpy(yp + b * row, xp + (size_t)(b * T + T - 1) * row, row);
    return FR_OK;
}
