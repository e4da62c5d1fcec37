/* comm.c — the run's processes over MPI (see comm.h). Every MPI call of
 * frugal is here; without FR_HAVE_MPI only the one-process answers remain.
 * Failures of a collective are FR_ERR_IO: what fails is another process or
 * the link to it, as a file's read fails. */
#include <stdlib.h>
#include <string.h>
#include "parallel/comm.h"
#include "parallel/shard.h"
#ifdef FR_HAVE_MPI
#include <mpi.h>
#endif

struct fr_comm {
    int rank, size;
#ifdef FR_HAVE_MPI
    MPI_Comm comm; /* a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN */
    MPI_Request *req;
    int n_req;
    int *counts; /* n_req * 2 * size: per slot, the pieces' counts and offsets */
    int *tmp;    /* 2 * size: the same for a blocking call */
    fr_ctx *ctx; /* whose allocator holds req */
#endif
};

static long env_long(const char *name) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : -1;
}

int fr_comm_launched(void) {
    return env_long("OMPI_COMM_WORLD_SIZE") >= 1 || env_long("PMIX_RANK") >= 0 ||
           env_long("PMI_RANK") >= 0;
}

int fr_comm_rank(const fr_comm *c) { return c ? c->rank : 0; }
int fr_comm_size(const fr_comm *c) { return c ? c->size : 1; }

#ifdef FR_HAVE_MPI
/* The message of an MPI error code as fr_fail text. */
static fr_status mpi_fail(fr_ctx *ctx, const fr_comm *c, int rc, const char *call,
                          const char *what) {
    char text[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, text, &len);
    return fr_fail(ctx, FR_ERR_IO,
                   "rank %d of %d: %s of %s failed: %s (another rank may have died or been "
                   "stopped)",
                   c->rank, c->size, call, what, text);
}

fr_status fr_comm_init(fr_ctx *ctx, fr_comm **out) {
    *out = NULL;
    if (!fr_comm_launched()) return FR_OK;
    int inited = 0, provided = 0, rc;
    MPI_Initialized(&inited);
    /* only the main thread calls MPI (OpenMP and loader threads never do) */
    if (!inited &&
        (rc = MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided)) != MPI_SUCCESS)
        return fr_fail(ctx, FR_ERR_IO, "MPI_Init_thread failed (code %d): is this mpirun's?", rc);
    fr_comm *c = fr_calloc(ctx, sizeof *c, FR_MEM_OTHER);
    if (!c) return FR_ERR_NOMEM;
    c->ctx = ctx;
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    if ((rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->comm)) != MPI_SUCCESS) {
        fr_free(ctx, c);
        return fr_fail(ctx, FR_ERR_IO, "MPI_Comm_dup of MPI_COMM_WORLD failed (code %d)", rc);
    }
    MPI_Comm_set_errhandler(c->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(c->comm, &c->rank);
    MPI_Comm_size(c->comm, &c->size);
    *out = c;
    return FR_OK;
}

void fr_comm_finalize(fr_comm *c) {
    if (!c) return;
    fr_free(c->ctx, c->req);
    fr_free(c->ctx, c->counts);
    fr_free(c->ctx, c->tmp);
    MPI_Comm_free(&c->comm);
    fr_free(c->ctx, c);
    int fin = 0;
    MPI_Finalized(&fin);
    if (!fin) MPI_Finalize();
}

void fr_comm_abort(fr_comm *c, int code) {
    if (c && c->size > 1) MPI_Abort(c->comm, code);
}

fr_status fr_comm_sum_f64(fr_ctx *ctx, const fr_comm *c, double *buf, int n, const char *what) {
    if (!c || c->size == 1) return FR_OK;
    int rc = MPI_Allreduce(MPI_IN_PLACE, buf, n, MPI_DOUBLE, MPI_SUM, c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Allreduce (sum)", what);
}

fr_status fr_comm_minmax_u64(fr_ctx *ctx, const fr_comm *c, const uint64_t *buf, uint64_t *lo,
                             uint64_t *hi, int n, const char *what) {
    if (!c || c->size == 1) {
        memcpy(lo, buf, (size_t)n * sizeof *buf);
        memcpy(hi, buf, (size_t)n * sizeof *buf);
        return FR_OK;
    }
    int rc = MPI_Allreduce(buf, lo, n, MPI_UINT64_T, MPI_MIN, c->comm);
    if (rc == MPI_SUCCESS) rc = MPI_Allreduce(buf, hi, n, MPI_UINT64_T, MPI_MAX, c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Allreduce (min/max)", what);
}

fr_status fr_comm_allgather(fr_ctx *ctx, const fr_comm *c, const void *mine, void *all,
                            size_t bytes, const char *what) {
    if (!c || c->size == 1) {
        memcpy(all, mine, bytes);
        return FR_OK;
    }
    int rc = MPI_Allgather(mine, (int)bytes, MPI_BYTE, all, (int)bytes, MPI_BYTE, c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Allgather", what);
}

fr_status fr_comm_barrier(fr_ctx *ctx, const fr_comm *c, const char *what) {
    if (!c || c->size == 1) return FR_OK;
    int rc = MPI_Barrier(c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Barrier", what);
}

fr_status fr_comm_bcast(fr_ctx *ctx, const fr_comm *c, void *buf, size_t bytes, const char *what) {
    if (!c || c->size == 1) return FR_OK;
    if (bytes > (size_t)INT32_MAX)
        return fr_fail(ctx, FR_ERR_ARG, "%s: %zu bytes too many for one MPI_Bcast", what, bytes);
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, 0, c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Bcast", what);
}

fr_status fr_comm_reserve(fr_ctx *ctx, fr_comm *c, int n) {
    if (!c || n <= c->n_req) return FR_OK;
    MPI_Request *r = fr_alloc(ctx, (size_t)n * sizeof *r, FR_MEM_OTHER);
    int *counts = fr_calloc(ctx, (size_t)n * 2 * (size_t)c->size * sizeof *counts, FR_MEM_OTHER);
    int *tmp = c->tmp ? c->tmp : fr_calloc(ctx, 2 * (size_t)c->size * sizeof *tmp, FR_MEM_OTHER);
    if (!r || !counts || !tmp) {
        fr_free(ctx, r);
        fr_free(ctx, counts);
        if (tmp != c->tmp) fr_free(ctx, tmp);
        return FR_ERR_NOMEM;
    }
    fr_free(c->ctx, c->counts);
    c->counts = counts;
    c->tmp = tmp;
    for (int k = 0; k < n; k++) r[k] = k < c->n_req ? c->req[k] : MPI_REQUEST_NULL;
    fr_free(c->ctx, c->req);
    c->req = r;
    c->n_req = n;
    c->ctx = ctx;
    return FR_OK;
}

fr_status fr_comm_isum_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t n,
                           const char *what) {
    if (!c || c->size == 1) return FR_OK;
    if (slot < 0 || slot >= c->n_req || c->req[slot] != MPI_REQUEST_NULL || n > (size_t)INT32_MAX)
        return fr_fail(ctx, FR_ERR_ARG, "%s: request slot %d of %d busy or %zu floats too many",
                       what, slot, c->n_req, n);
    int rc = MPI_Iallreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, c->comm, &c->req[slot]);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Iallreduce (sum)", what);
}

fr_status fr_comm_test_all(fr_ctx *ctx, fr_comm *c) {
    if (!c || c->size == 1 || !c->n_req) return FR_OK;
    int flag = 0;
    int rc = MPI_Testall(c->n_req, c->req, &flag, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Testall", "gradient buckets");
}

fr_status fr_comm_wait_all(fr_ctx *ctx, fr_comm *c, const char *what) {
    if (!c || c->size == 1 || !c->n_req) return FR_OK;
    int rc = MPI_Waitall(c->n_req, c->req, MPI_STATUSES_IGNORE);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Waitall", what);
}

/* Each rank's piece of [at, at+n): counts cnt[r] and offsets dsp[r] from at. */
static int pieces(const fr_comm *c, size_t at, size_t n, size_t total, int *cnt, int *dsp) {
    if (n > (size_t)INT32_MAX) return -1;
    for (int r = 0; r < c->size; r++) {
        size_t lo, hi;
        fr_shard_range(total, c->size, r, &lo, &hi);
        size_t a = lo > at ? lo : at, b = hi < at + n ? hi : at + n;
        cnt[r] = b > a ? (int)(b - a) : 0;
        dsp[r] = b > a ? (int)(a - at) : 0;
    }
    return 0;
}

/* A free request slot k and its pieces of [at, at+n) in the slot's counts. */
static fr_status slot_pieces(fr_ctx *ctx, fr_comm *c, int slot, size_t at, size_t n, size_t total,
                             const char *what, int **cnt, int **dsp) {
    if (slot < 0 || slot >= c->n_req || c->req[slot] != MPI_REQUEST_NULL)
        return fr_fail(ctx, FR_ERR_ARG, "%s: request slot %d of %d busy", what, slot, c->n_req);
    *cnt = c->counts + (size_t)slot * 2 * (size_t)c->size, *dsp = *cnt + c->size;
    if (pieces(c, at, n, total, *cnt, *dsp))
        return fr_fail(ctx, FR_ERR_ARG, "%s: %zu floats too many", what, n);
    return FR_OK;
}

fr_status fr_comm_isum_scatter_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t at,
                                   size_t n, size_t total, const char *what) {
    if (!c || c->size == 1) return FR_OK;
    int *cnt, *dsp;
    fr_status st = slot_pieces(ctx, c, slot, at, n, total, what, &cnt, &dsp);
    if (st) return st;
    int rc =
        MPI_Ireduce_scatter(MPI_IN_PLACE, buf, cnt, MPI_FLOAT, MPI_SUM, c->comm, &c->req[slot]);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Ireduce_scatter (sum)", what);
}

fr_status fr_comm_allgather_shards_f32(fr_ctx *ctx, fr_comm *c, float *buf, size_t at, size_t n,
                                       size_t total, const char *what) {
    if (!c || c->size == 1) return FR_OK;
    int *cnt = c->tmp, *dsp = c->tmp + c->size;
    if (!cnt || pieces(c, at, n, total, cnt, dsp))
        return fr_fail(ctx, FR_ERR_ARG, "%s: no counts reserved or %zu floats too many", what, n);
    int rc = MPI_Allgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, cnt, dsp, MPI_FLOAT, c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Allgatherv", what);
}

fr_status fr_comm_iallgather_shards_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t at,
                                        size_t n, size_t total, const char *what) {
    if (!c || c->size == 1) return FR_OK;
    int *cnt, *dsp;
    fr_status st = slot_pieces(ctx, c, slot, at, n, total, what, &cnt, &dsp);
    if (st) return st;
    int rc = MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_FLOAT, buf, cnt, dsp, MPI_FLOAT, c->comm,
                             &c->req[slot]);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Iallgatherv", what);
}

fr_status fr_comm_wait(fr_ctx *ctx, fr_comm *c, int slot, const char *what) {
    if (!c || c->size == 1 || slot < 0 || slot >= c->n_req) return FR_OK;
    int rc = MPI_Wait(&c->req[slot], MPI_STATUS_IGNORE);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Wait", what);
}

fr_status fr_comm_gather_shards_f32(fr_ctx *ctx, fr_comm *c, const float *mine, float *full,
                                    size_t at, size_t n, size_t total, const char *what) {
    if (!c || c->size == 1) {
        memcpy(full, mine, n * sizeof *full);
        return FR_OK;
    }
    int *cnt = c->tmp, *dsp = c->tmp + c->size;
    if (!cnt || pieces(c, at, n, total, cnt, dsp))
        return fr_fail(ctx, FR_ERR_ARG, "%s: no counts reserved or %zu floats too many", what, n);
    int rc = MPI_Gatherv(mine, cnt[c->rank], MPI_FLOAT, full, cnt, dsp, MPI_FLOAT, 0, c->comm);
    return rc == MPI_SUCCESS ? FR_OK : mpi_fail(ctx, c, rc, "MPI_Gatherv", what);
}

#else /* built without MPI: one process */

fr_status fr_comm_init(fr_ctx *ctx, fr_comm **out) {
    *out = NULL;
    long n = env_long("OMPI_COMM_WORLD_SIZE");
    if (n > 1)
        return fr_fail(ctx, FR_ERR_ARG,
                       "started by mpirun with %ld processes, but this frugal was built without "
                       "MPI: install libopenmpi-dev and rebuild (CMake finds it), or run one "
                       "process",
                       n);
    return FR_OK;
}

void fr_comm_finalize(fr_comm *c) { (void)c; }

void fr_comm_abort(fr_comm *c, int code) { (void)c, (void)code; }

fr_status fr_comm_sum_f64(fr_ctx *ctx, const fr_comm *c, double *buf, int n, const char *what) {
    (void)ctx, (void)c, (void)buf, (void)n, (void)what;
    return FR_OK;
}

fr_status fr_comm_minmax_u64(fr_ctx *ctx, const fr_comm *c, const uint64_t *buf, uint64_t *lo,
                             uint64_t *hi, int n, const char *what) {
    (void)ctx, (void)c, (void)what;
    memcpy(lo, buf, (size_t)n * sizeof *buf);
    memcpy(hi, buf, (size_t)n * sizeof *buf);
    return FR_OK;
}

fr_status fr_comm_allgather(fr_ctx *ctx, const fr_comm *c, const void *mine, void *all,
                            size_t bytes, const char *what) {
    (void)ctx, (void)c, (void)what;
    memcpy(all, mine, bytes);
    return FR_OK;
}

fr_status fr_comm_barrier(fr_ctx *ctx, const fr_comm *c, const char *what) {
    (void)ctx, (void)c, (void)what;
    return FR_OK;
}

fr_status fr_comm_bcast(fr_ctx *ctx, const fr_comm *c, void *buf, size_t bytes, const char *what) {
    (void)ctx, (void)c, (void)buf, (void)bytes, (void)what;
    return FR_OK;
}

fr_status fr_comm_reserve(fr_ctx *ctx, fr_comm *c, int n) {
    (void)ctx, (void)c, (void)n;
    return FR_OK;
}

fr_status fr_comm_isum_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t n,
                           const char *what) {
    (void)ctx, (void)c, (void)slot, (void)buf, (void)n, (void)what;
    return FR_OK;
}

fr_status fr_comm_test_all(fr_ctx *ctx, fr_comm *c) {
    (void)ctx, (void)c;
    return FR_OK;
}

fr_status fr_comm_wait_all(fr_ctx *ctx, fr_comm *c, const char *what) {
    (void)ctx, (void)c, (void)what;
    return FR_OK;
}
fr_status fr_comm_isum_scatter_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t at,
                                   size_t n, size_t total, const char *what) {
    (void)ctx, (void)c, (void)slot, (void)buf, (void)at, (void)n, (void)total, (void)what;
    return FR_OK;
}

fr_status fr_comm_allgather_shards_f32(fr_ctx *ctx, fr_comm *c, float *buf, size_t at, size_t n,
                                       size_t total, const char *what) {
    (void)ctx, (void)c, (void)buf, (void)at, (void)n, (void)total, (void)what;
    return FR_OK;
}

fr_status fr_comm_iallgather_shards_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t at,
                                        size_t n, size_t total, const char *what) {
    (void)ctx, (void)c, (void)slot, (void)buf, (void)at, (void)n, (void)total, (void)what;
    return FR_OK;
}

fr_status fr_comm_wait(fr_ctx *ctx, fr_comm *c, int slot, const char *what) {
    (void)ctx, (void)c, (void)slot, (void)what;
    return FR_OK;
}

fr_status fr_comm_gather_shards_f32(fr_ctx *ctx, fr_comm *c, const float *mine, float *full,
                                    size_t at, size_t n, size_t total, const char *what) {
    (void)ctx, (void)c, (void)at, (void)total, (void)what;
    memcpy(full, mine, n * sizeof *full);
    return FR_OK;
}
#endif
