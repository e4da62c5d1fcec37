/* blocked_io.h — which operands the CPU kernels take in nChw16c
 * (fr_backend.blocked_io of the CPU backend; blocked_io.c). */
#ifndef FR_CPU_BLOCKED_IO_H
#define FR_CPU_BLOCKED_IO_H

#include "graph/graph.h"

int fr_cpu_blocked_io(const fr_graph *g, const fr_node *n, int j);

#endif
