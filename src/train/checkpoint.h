/* checkpoint.h — what the trainer saves beside the weights and optimizer
 * state (fr_step_save_meta, checkpoint.c) so that a resume is the run it
 * continues, bit for bit: where training stands (epochs done, batches done
 * inside the next epoch) and every setting the numbers depend on; and the
 * strict reading of it back. Does not own the training loop (trainer.c). */
#ifndef FR_CHECKPOINT_H
#define FR_CHECKPOINT_H

#include "train/step.h"

/* Where a checkpoint stands and what it was trained with. */
typedef struct fr_ckpt_pos {
    int epoch;            /* epochs done */
    int64_t batches_done; /* batches done inside epoch `epoch` (0: at its start) */
    int lr_differs;       /* the resume runs with another lr (allowed: see checkpoint.c) */
    double saved_lr;
} fr_ckpt_pos;

/* Save s (weights, optimizer state, the step's counters) with the position
 * and the run's settings; freeze is the --freeze text (NULL: none), kept
 * for messages. */
fr_status fr_ckpt_save(fr_step *s, const char *path, const char *freeze, int epoch,
                       int64_t batches_done);

/* Resume s from path: refuse a file without optimizer state (a weights-only
 * file: use --init), a metadata value that is not a well-formed number in
 * its range, and a setting that differs from the checkpoint's (naming the
 * option and both values); then load weights, state and counters. Files
 * written before the settings were stored carry none of their keys and are
 * accepted without that check. */
fr_status fr_ckpt_resume(fr_step *s, const char *path, const char *freeze, fr_ckpt_pos *pos);

/* fr_model_load_weights from a file already open or parsed (path names it
 * in messages): the fuzz target's entry point. */
fr_status fr_model_load_weights_file(fr_model *m, const char *path, const fr_st_file *f);

#endif
