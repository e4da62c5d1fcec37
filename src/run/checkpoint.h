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
 * file: use --init), one with state but without a counter or its position
 * (optimizer.step, runs, epoch, batch: named), a metadata value that is not
 * a well-formed number in its range, and a setting that differs from the
 * checkpoint's (naming the option and both values); then load weights, state and counters. Files
 * written before the settings were stored carry none of their keys and are
 * accepted without that check. */
fr_status fr_ckpt_resume(fr_step *s, const char *path, const char *freeze, fr_ckpt_pos *pos);

/* The model's weights alone, as safetensors written atomically (temporary,
 * fsync, rename) like every save: each parameter and buffer under its
 * state_dict name (a tied one under each of its names, as state_dict lists
 * both), dtype and shape, metadata {"format": "pt"}, no optimizer entry and
 * no counter. Loads with load_state_dict(strict=True) into a PyTorch module
 * of the same names, nanoGPT's GPT on PyTorch >= 2.0 among them (flash
 * attention: no mask buffers). nanogpt_masks = 1 adds, after each block's
 * transformer.h.N.attn.c_attn.weight, the buffer transformer.h.N.attn.bias
 * nanoGPT registers without flash attention (PyTorch < 2.0): f32 of shape
 * (1, 1, T, T), T the model's context, 1 on and below the diagonal, 0
 * above; FR_ERR_ARG when the model has no such block. frugal's own loaders
 * ignore those buffers. On a device the current values are fetched first;
 * a parameter not held whole (ZeRO-3) is refused (FR_ERR_ARG). */
fr_status fr_ckpt_save_weights(fr_model *m, const char *path, int nanogpt_masks);

/* fr_model_load_weights from a file already open or parsed (path names it
 * in messages): the fuzz target's entry point. */
fr_status fr_model_load_weights_file(fr_model *m, const char *path, const fr_st_file *f);

#endif
