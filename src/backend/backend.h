/* backend.h — the seam between the engine and the memory and processors a
 * step runs on. A backend is a kernel table indexed by op (one kernel per op
 * of ops.h, checked when the table compiles), the workspace each op's kernel
 * needs (asked by the shape rules at plan time, so plan/ knows sizes only),
 * the memory tensors live in with its copies and synchronisation, the step's
 * whole-tensor passes (optimizer, gradient scaling, accuracy) and the
 * batches' uploads. The CPU backend (backend/cpu) fills every member but the
 * optional wait_copy; the OpenCL backend (backend/opencl) every one. What a
 * kernel gets is the same on every backend: one fr_kernel_call whose tensors
 * point into the backend's memory (fr_tensor.data on the host; .buf and .off
 * on a device). */
#ifndef FR_BACKEND_H
#define FR_BACKEND_H

#include "graph/graph.h"

/* One node's kernel call. The node says what the kernel computes: its op,
 * its attributes, and which outputs it updates in place (fr_node.update:
 * LINEAR_BWD's plain SGD step, with attr.lr and attr.wd). The optimizer's
 * own steps (OPTIM_STEP) are no kernel's: the executor hands them to the
 * step (exec.h, param_step). */
typedef struct fr_kernel_call {
    fr_ctx *ctx;
    const fr_node *node; /* attributes: node->attr */
    fr_tensor in[FR_MAX_IN];
    fr_tensor out[FR_MAX_OUT];
    uint32_t accumulate;
    float *grad_ws;     /* scratch for a weight's gradient formed a tile at a time (LINEAR_BWD
                           with update bit 1); on a device the step's one scratch buffer (a
                           cl_mem: CLBlast's temporaries, then that gradient, opencl/gemm.c) */
    size_t grad_ws_len; /* its length in floats (fr_k_linear_upd_ws) */
    void *gemm_ws;      /* on the CPU, the step's 16-bit GEMM scratch (gemm16.h) */
    size_t gemm_ws_len; /* its length in bytes (the most any node's GEMM needs) */
    uint64_t seed;      /* run seed (dropout) */
    uint64_t step;      /* step counter (dropout stream) */
    /* OFFLOAD and FETCH on a backend with wait_copy: where the kernel puts the
     * event its enqueued copy completes (the executor waits on it where the
     * plan says, fr_offload_waits); NULL: the copy is done on return. */
    void **copy_event;
} fr_kernel_call;

typedef struct fr_backend {
    const char *name;            /* "cpu", "opencl" */
    const fr_kernel_fn *kernels; /* [FR_OP_COUNT]; NULL only for a view op (fr_op_info.view)
                                    and OPTIM_STEP (the optimizer's, exec.h) */
    /* Elements (f32) of workspace output j of node n, whose inputs' values
     * are in g (a backward node's forward is g->nodes[n->fwd]); j = -1: of
     * the step's GEMM scratch (the step plans the largest over its nodes):
     * on a device what the kernel takes from grad_ws, on the CPU gemm_ws. */
    int64_t (*ws_elems)(const fr_graph *g, const fr_node *n, int j);
    /* Whether LINEAR and LINEAR_BWD take their GEMM operands in 16-bit
     * format dt natively (f32 accumulation); NULL or 0: they take f32, and
     * mixed precision hands them f32 copies rounded through 16 bits. */
    int (*gemm16)(fr_dtype dt);
    /* Where tensors live: 1 on the CPU, whose tensors address host memory
     * through fr_tensor.data and whose buffer handles (alloc's) are host
     * pointers; 0 on a device, whose tensors are .buf (an opaque handle)
     * and .off (fr_backend_is_device). */
    int host_memory;
    /* The backend's memory. Buffers are handles accounted in the backend's
     * fr_mem (the CPU's: ctx->mem, through fr_alloc and fr_free, so a
     * handle is the host pointer; a device's: its own, ctx->dmem); a
     * refusal is NULL with the error set, as on the host. */
    void *(*alloc)(fr_ctx *ctx, size_t bytes, fr_mem_cat cat);
    void (*release)(fr_ctx *ctx, void *buf);
    /* The step's planned arena: reserved, its live values tracked by plan
     * events through track (the CPU: fr_arena_alloc and fr_mem_track). */
    void *(*arena_alloc)(fr_ctx *ctx, size_t bytes);
    void (*arena_free)(fr_ctx *ctx, void *buf);
    void (*track)(fr_ctx *ctx, fr_mem_cat cat, int64_t delta);
    /* n bytes at buf+off from host src, into host dst, set to zero (the
     * CPU: memcpy and memset, done on return; a device: blocking copies,
     * the zero enqueued). */
    int (*write)(fr_ctx *ctx, void *buf, size_t off, const void *src, size_t n);
    int (*read)(fr_ctx *ctx, void *buf, size_t off, void *dst, size_t n);
    int (*zero)(fr_ctx *ctx, void *buf, size_t off, size_t n);
    int (*finish)(fr_ctx *ctx);        /* wait for everything enqueued (the CPU: 0 at once) */
    size_t (*max_buffer)(fr_ctx *ctx); /* the largest buffer allowed (the CPU: PTRDIFF_MAX) */
    size_t (*global_mem)(fr_ctx *ctx); /* the memory's size, bytes (the CPU: physical memory) */
    /* Rates the planner costs offload with, measured once per device: bytes
     * a second between host and device (a copy down and back), and FLOPs a
     * second of a GEMM; 0 when they could not be measured. The CPU returns
     * 0 for both: an offloaded value there stays in the same memory, and
     * the planner leaves --offload uncosted (INFINITY) as it always has. */
    double (*copy_rate)(fr_ctx *ctx);
    double (*flop_rate)(fr_ctx *ctx);
    /* The share of the step's compute time that copies beside the kernels
     * may run under (fr_backend.wait_copy): 1 where a copy engine moves
     * bytes while the processors compute, 0 where both share the same cores
     * (a CPU device, and the CPU), so every copied byte costs its time. */
    double (*copy_overlap)(fr_ctx *ctx);
    /* Optional. A device whose OFFLOAD and FETCH copies run beside its
     * kernels: what is enqueued after this waits for the copy's event, which
     * is released. NULL on the CPU, whose copies are done when the kernel
     * returns (the executor plans no waits where it is NULL). */
    int (*wait_copy)(fr_ctx *ctx, void *event);
    /* The step's whole-tensor passes (the CPU: fr_k_sgd / fr_k_adam* and
     * fr_k_grad_* over .data, as the host step calls them): one optimizer
     * step of p from its gradient g, t 1-based, with state[0..1] in format
     * state_kind (a 16-bit p: g f32 or in p's format, the state in p's; on
     * a device each moment from byte 0 of its buffer, .off 0);
     * the loss scaler's unscale (g *= inv, *found_inf set on any inf or
     * NaN); clipping's sum of squares (double) and scaling. */
    int (*optim_update)(fr_ctx *ctx, const fr_optim_opts *o, int64_t t, fr_tensor *p,
                        const fr_tensor *g, fr_tensor *state, int state_kind);
    int (*grad_unscale)(fr_ctx *ctx, fr_tensor *g, float inv, int *found_inf);
    int (*grad_sumsq)(fr_ctx *ctx, const fr_tensor *g, double *out);
    int (*grad_scale)(fr_ctx *ctx, fr_tensor *g, float f);
    /* Accuracy: *out = the rows i of logits (N,K) f32 whose first maximum
     * (strict >, as fr_step_hits) is at labels[i] (i32, N); on a device
     * counted there, FR_HITS_SCRATCH bytes of category other taken from the
     * device's memory while it runs. */
    int (*hits)(fr_ctx *ctx, const fr_tensor *logits, const fr_tensor *labels, int64_t *out);
    /* Uploads beside the step (train/feed.c): host bytes copied into
     * buffers on an upload queue of their own while the step's queue
     * computes, the two ordered by events. An event is an opaque handle (a
     * cl_event); NULL is one that has completed. The CPU copies at once
     * (memcpy) and hands out NULL events, on which every wait returns. */
    int (*upload_open)(fr_ctx *ctx, void **queue);
    void (*upload_close)(fr_ctx *ctx, void *queue); /* finishes what is in flight; NULL: none */
    /* n bytes of host src into buf+off on queue, once event `after` has
     * completed (NULL: at once), started and not waited for: *done
     * completes when the bytes are there, and src must stay until then.
     * No context (the loader's thread calls it): a fault returns
     * FR_ERR_NOMEM or FR_ERR_IO with its message in err. */
    int (*upload)(void *queue, void *buf, size_t off, const void *src, size_t n, void *after,
                  void **done, char *err, size_t errlen);
    int (*upload_finish)(fr_ctx *ctx, void *queue); /* wait for every upload on queue */
    /* On the step's queue: *out, an event that completes when everything
     * enqueued before it has (a mark); what is enqueued after this waits for
     * event, which stays the caller's (an order). Neither waits on the host. */
    int (*event_mark)(fr_ctx *ctx, void **out);
    int (*event_order)(fr_ctx *ctx, void *event);
    int (*event_wait)(fr_ctx *ctx, void *event); /* the host waits for it */
    void (*event_release)(void *event);          /* NULL: nothing */
    /* When the command of a completed event started and ended, in
     * microseconds of the device's clock (its queue profiled); 0 for what
     * the backend cannot tell (the CPU: both). */
    void (*event_times)(void *event, double *start_us, double *end_us);
    /* Whether node n's kernel reads input j (j >= 0), or writes out[0]
     * (j = -1), in f16/bf16 itself, for the ops whose answer is a limit of
     * the backend's kernels: max pooling and its backward, BatchNorm's
     * backward, convolution and its backward (the op table's half_in and
     * half_out ask here; ops.c); or (j = -2) writes, besides its f32
     * out[0], a 16-bit copy of it as one more output (half_copy: add,
     * pos_embedding, ReLU). NULL: never. */
    int (*half_io)(const fr_graph *g, const fr_node *n, int j);
    /* Whether bf16-mixed runs node n's products natively in bf16 here, for
     * the ops whose answer depends on the backend beyond its bf16 GEMM
     * (gemm16): convolutions and attention. Asked of a graph in either
     * precision (the answer is the bf16-mixed one): --precision auto counts
     * these FLOPs in the share that gains (planner.c). NULL: never. */
    int (*native16)(const fr_graph *g, const fr_node *n);
    /* Whether node n's kernel takes its 4-d operand in[j] (j >= 0) or
     * out[-1-j] (j < 0) in nChw16c (fr_value.blocked): FR_BLK_NO, or
     * FR_BLK_TIED (in the layout of the node's other TIED operands: an
     * element-wise op, BatchNorm) or FR_BLK_FREE (either layout, whatever
     * the others have: a convolution). plan/layout.c asks. NULL: never. */
    int (*blocked_io)(const fr_graph *g, const fr_node *n, int j);
    /* Floats of scratch LINEAR_BWD takes to update an out x in weight inside
     * backward (fr_node.update) over `rows` rows: the CPU's kernel
     * tiles the weight's gradient, a device computes it whole. */
    size_t (*upd_tile)(fr_ctx *ctx, int64_t out, int64_t in, int64_t rows);
    /* A copy in the backend's memory of n host bytes its kernels read (a
     * parameter, a batch, generation's ids): *buf made in category cat
     * when NULL, then written from src (NULL: made only); a refusal is
     * FR_ERR_NOMEM with the error set. The CPU's kernels read the host's
     * bytes themselves: it makes and writes nothing, *buf stays as it was
     * (NULL: the caller binds the host's bytes). mirror_bytes: what the
     * copy of n bytes takes in the backend's memory (the CPU: 0). */
    int (*mirror)(fr_ctx *ctx, void **buf, const void *src, size_t n, fr_mem_cat cat);
    size_t (*mirror_bytes)(fr_ctx *ctx, size_t n);
} fr_backend;

enum { FR_BLK_NO, FR_BLK_TIED, FR_BLK_FREE };

#define FR_HITS_SCRATCH 8 /* the count, as fr_backend.hits keeps it on the device */

/* Whether be's tensors live outside host memory (.buf and .off). */
static inline int fr_backend_is_device(const fr_backend *be) { return !be->host_memory; }

extern const fr_backend fr_cpu_backend;

/* The backend of g's context (the CPU's unless one was chosen). */
const fr_backend *fr_backend_of(const fr_ctx *ctx);
/* (fr_backend_ws and fr_backend_half_io, which the op table's shape rules
 * ask, are declared in ops/ops.h and defined in cpu/table.c.) */

#endif
