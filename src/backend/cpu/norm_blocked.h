/* norm_blocked.h — BatchNorm's kernels on nChw16c tensors (norm_blocked.c);
 * fr_k_batchnorm and fr_k_batchnorm_bwd call them when attr.blocked says
 * so, with the dims they checked. */
#ifndef FR_CPU_NORM_BLOCKED_H
#define FR_CPU_NORM_BLOCKED_H

#include <stdint.h>
#include "backend/backend.h"

int fr_k_batchnorm_blocked(fr_kernel_call *c, int64_t N, int64_t C, int64_t HW);
int fr_k_batchnorm_bwd_blocked(fr_kernel_call *c, int64_t N, int64_t C, int64_t HW);

#endif
