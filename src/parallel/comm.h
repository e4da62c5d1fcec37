/* comm.h — the processes of one data-parallel run and the collectives the
 * trainer needs, over MPI. It owns MPI's start and end and its requests; it
 * knows nothing of models or gradients (buckets.h lays those out).
 *
 * A process that mpirun did not start (no OMPI_COMM_WORLD_SIZE, PMIX_RANK
 * or PMI_RANK in its environment) never calls MPI_Init: fr_comm_init gives
 * NULL and every call below treats NULL as one process of rank 0, so a
 * single run is exactly today's. Every collective returns fr_status: the
 * communicator reports errors (MPI_ERRORS_RETURN) and a failed call becomes
 * an fr_fail message naming the collective, what it carried and MPI's text. */
#ifndef FR_COMM_H
#define FR_COMM_H

#include <stddef.h>
#include <stdint.h>
#include "core/ctx.h"

typedef struct fr_comm fr_comm;

/* 1 when this process was started by mpirun (or another PMI launcher). */
int fr_comm_launched(void);
/* Join the run: *out is NULL outside mpirun, else this rank's handle (one
 * MPI_Init per process; a build without MPI refuses a launch of more than
 * one process). */
fr_status fr_comm_init(fr_ctx *ctx, fr_comm **out);
/* Leave it: MPI_Finalize (NULL: nothing). */
void fr_comm_finalize(fr_comm *c);
/* End every rank of the job (MPI_Abort) after this one failed where the
 * others may be waiting for it in a collective (NULL: returns). */
void fr_comm_abort(fr_comm *c, int code);
int fr_comm_rank(const fr_comm *c);
int fr_comm_size(const fr_comm *c);

/* buf[0..n) summed over the ranks, in place, on every rank. */
fr_status fr_comm_sum_f64(fr_ctx *ctx, const fr_comm *c, double *buf, int n, const char *what);
/* min and max of buf[0..n) over the ranks, into lo and hi (on every rank). */
fr_status fr_comm_minmax_u64(fr_ctx *ctx, const fr_comm *c, const uint64_t *buf, uint64_t *lo,
                             uint64_t *hi, int n, const char *what);
/* every rank's `bytes` bytes of mine, rank after rank, into all (size * bytes). */
fr_status fr_comm_allgather(fr_ctx *ctx, const fr_comm *c, const void *mine, void *all,
                            size_t bytes, const char *what);
fr_status fr_comm_barrier(fr_ctx *ctx, const fr_comm *c, const char *what);
/* rank 0's `bytes` bytes of buf into every other rank's buf (MPI_Bcast). */
fr_status fr_comm_bcast(fr_ctx *ctx, const fr_comm *c, void *buf, size_t bytes, const char *what);

/* Non-blocking sums in place (MPI_Iallreduce), in numbered slots: reserve
 * n slots once (category other), start slot k on n floats, then wait for
 * all started ones. test_all lets MPI progress the started ones between
 * kernels (OpenMPI moves data only inside its calls). */
fr_status fr_comm_reserve(fr_ctx *ctx, fr_comm *c, int n);
fr_status fr_comm_isum_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t n,
                           const char *what);
fr_status fr_comm_test_all(fr_ctx *ctx, fr_comm *c);
fr_status fr_comm_wait_all(fr_ctx *ctx, fr_comm *c, const char *what);

/* ZeRO (the shard rule of parallel/shard.h): buf holds the elements [at, at+n)
 * of a flat vector of `total` f32 sharded over the ranks.
 * isum_scatter: slot k's non-blocking sum of buf over the ranks, scattered
 * (MPI_Ireduce_scatter, in place): once waited for, this rank's share of
 * the sum sits at buf[0 .. its count), by MPI's in-place rule (the caller
 * moves it to its place). allgather_shards: every rank's share of buf sent
 * to all (MPI_Allgatherv, in place). gather_shards: every rank's share
 * (`mine`, its count of elements) into full[0..n) on rank 0 (MPI_Gatherv;
 * full is only written on rank 0). */
fr_status fr_comm_isum_scatter_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t at,
                                   size_t n, size_t total, const char *what);
fr_status fr_comm_allgather_shards_f32(fr_ctx *ctx, fr_comm *c, float *buf, size_t at, size_t n,
                                       size_t total, const char *what);
/* iallgather_shards: allgather_shards started in slot k (MPI_Iallgatherv,
 * in place: this rank's share must already sit at its place in buf);
 * wait: wait for slot k alone (MPI_Wait). */
fr_status fr_comm_iallgather_shards_f32(fr_ctx *ctx, fr_comm *c, int slot, float *buf, size_t at,
                                        size_t n, size_t total, const char *what);
fr_status fr_comm_wait(fr_ctx *ctx, fr_comm *c, int slot, const char *what);
fr_status fr_comm_gather_shards_f32(fr_ctx *ctx, fr_comm *c, const float *mine, float *full,
                                    size_t at, size_t n, size_t total, const char *what);

#endif
