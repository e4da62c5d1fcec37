/* zero.h — the step's data-parallel parts (zero.c) that the step's run and
 * accounting call: not a public interface (fr_step_distribute, the ZeRO
 * peaks and the checkpoint gathers are in step.h). */
#ifndef FR_ZERO_H
#define FR_ZERO_H

#include "parallel/pshard.h"
#include "train/step.h"

/* ZeRO 3's gathers of this step: the groups each plan position reads. */
fr_status fr_zero_plan_gathers(fr_step *s, const fr_pshard *ps, fr_gathers *out);
/* ZeRO 2 and 3: take the buckets whose first writer is at plan position pos. */
fr_status fr_zero_take_buckets(fr_step *s, int pos);
/* ZeRO >= 1, after backward: the scaler's check, clipping and the step over
 * this rank's shard, combined over the ranks, then the weights gathered. */
fr_status fr_zero_update(fr_step *s, float l);
/* The executor's hooks while a step runs under data parallelism: after a
 * node, the buckets whose last gradient it wrote are sent (on the micro-
 * batch that sends them) and ZeRO 3's weights whose last use it was freed;
 * before a node, ZeRO 2's buckets taken and ZeRO 3's weights gathered and
 * bound (fr_zero_bind_group: a group's weights to their block, or NULL). */
fr_status fr_zero_after_node(void *arg, int pos);
fr_status fr_zero_before_node(void *arg, int pos);
void fr_zero_bind_group(void *arg, int grp, float *block);

#endif
