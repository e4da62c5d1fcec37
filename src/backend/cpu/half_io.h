/* half_io.h — which inputs and outputs the CPU kernels take in f16/bf16
 * themselves (fr_backend.half_io of the CPU backend; half_io.c). */
#ifndef FR_CPU_HALF_IO_H
#define FR_CPU_HALF_IO_H

#include "backend/backend.h"

int fr_cpu_half_io(const fr_graph *g, const fr_node *n, int j);

#endif
