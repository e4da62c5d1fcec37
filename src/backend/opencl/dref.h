/* dref.h (opencl) — a tensor as a kernel takes it, for the host files that
 * set kernel arguments one by one (reduce.c, rmsnorm_swiglu.c): its buffer
 * (NULL when absent) and its offset in elements of its dtype; TA and VA
 * spell a tensor's and a value's clSetKernelArg size and pointer pairs. */
#ifndef FR_CL_DREF_H
#define FR_CL_DREF_H

#include "backend/opencl/backend.h"

typedef struct dref {
    cl_mem m;
    cl_ulong off;
} dref;

static inline dref dref_of(const fr_tensor *t) {
    return t->buf ? (dref){fr_cl_mem(t), (cl_ulong)fr_cl_off(t)} : (dref){NULL, 0};
}
#define TA(t) sizeof(cl_mem), &(t).m, sizeof(cl_ulong), &(t).off
#define VA(v) sizeof(v), &(v)

#endif
