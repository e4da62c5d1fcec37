/* device.h — a training step on a device backend (backend/backend.h): the
 * model's parameters, gradients and optimizer state live in the device's
 * memory (fr_param.ddata, dgrad, dstate), uploaded from the host when a step
 * is made and brought back by fr_model_to_host (a checkpoint, the end of a
 * run); a training step's batches are uploaded ahead into two device slots
 * (train/feed.h), others' into the step's input buffers; only the loss,
 * the logits' hits and the scaler's flag come back per step. */
#ifndef FR_DEVICE_H
#define FR_DEVICE_H

#include "train/step.h"

/* Whether the step's context runs on a device. */
int fr_step_on_device(const fr_step *s);
/* Allocate (take) or release the step's GEMM scratch on the device; it is
 * released with the arena (an eval step then takes its place). */
fr_status fr_dev_scratch(fr_step *s, int take);
/* Allocate what the step needs on the device and upload the host's values
 * of tensors the device does not hold yet. */
fr_status fr_dev_materialize(fr_step *s);
/* fr_step_run on the device. */
fr_status fr_dev_run(fr_step *s, const fr_batch *b, float *loss, int *correct);
/* Bind parameters and gradients to the executor's device values. */
void fr_dev_bind(fr_step *s);
/* Upload samples off..off+n of the batch and bind them. */
fr_status fr_dev_batch(fr_step *s, const fr_batch *b, int off, int n);
/* The loss of the last run, and the argmax hits of the rows of its n
 * samples, counted on the device (only the count comes back). */
fr_status fr_dev_loss(fr_step *s, float *loss);
fr_status fr_dev_hits(fr_step *s, int n, int *hits);
/* After backward: the optimizer step on the device, zero_grad. */
fr_status fr_dev_update(fr_step *s, float loss);
/* Bring parameters (and, when allocated, optimizer state) back to the host,
 * and send host values (after a load) to the device. */
fr_status fr_model_to_host(fr_model *m);
fr_status fr_model_to_device(fr_model *m);
/* Release every device tensor of the model. */
void fr_model_release_device(fr_model *m);
void fr_dev_step_free(fr_step *s);
/* What the step reserves in the device's memory (its classes' rounding);
 * SIZE_MAX when its arena exceeds the device's largest buffer. */
size_t fr_dev_step_reserved(const fr_step *s);

#endif
