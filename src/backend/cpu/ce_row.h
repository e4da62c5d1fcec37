/* ce_row.h — the arithmetic of one row of softmax cross-entropy, shared by
 * the loss over stored logits (loss.c) and the head fused with its loss
 * (linear_ce.c), so that both make the same bits from the same logits: the
 * row's logsumexp, its gradient and its first argmax (ce_row.c, each cloned
 * for x86-64-v3 and a baseline with the same IEEE operations: the same bits). */
#ifndef FR_CE_ROW_H
#define FR_CE_ROW_H

#include <stdint.h>
#include "backend/cpu/kernels.h"

/* Row statistics of logits z (C of them): *zmax = max_j z[j] and the
 * returned log sum_j e^(z[j] - zmax) (max-shifted, so logits of 1000 do not
 * overflow), the logsumexp being their sum. Each e^ is fr_exp_poly's (one
 * float ulp), summed in double over eight chains in a fixed order. */
double fr_ce_row_lse(const float *z, int64_t C, float *zmax);

/* dz[j] = k (softmax(z)_j - [j == y]) for one row (or added into dz), the
 * softmax as e^((z[j] - zmax) - shift) with shift = log sum e^(z - zmax). */
void fr_ce_row_dlogits(const float *z, float *dz, int64_t C, float zmax, float shift, float k,
                       int64_t y, int acc);

/* The first index of the row's maximum, as a left-to-right strict > scan
 * finds it: the max first (NaNs never win a >), then its first position; 0
 * for a row starting with NaN (nothing is > it) and when none equals the max. */
int64_t fr_ce_row_argmax(const float *z, int64_t C);

#endif
