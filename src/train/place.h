/* place.h — where a step's tensors live (place.c): the model's parameters
 * in the backend's memory, they and a device's optimizer state brought to
 * the host and sent back, a micro-batch's inputs and labels, the GEMM
 * scratch, the gradients and weights crossing when the optimizer is
 * offloaded, the accuracy count. The gradients' and the state's buffers
 * themselves are the step's to make (step.c), in the optimizer's records
 * (optim/optim.h). */
#ifndef FR_PLACE_H
#define FR_PLACE_H

#include "train/step.h"

/* Whether the backend's memory is a second one beside the host's (a
 * device's), the one question the engine asks of where tensors live
 * outside backend/: what a step holds there is reserved and checked in
 * that memory, and the optimizer and the saved activations may be
 * offloaded from it to the host; on the CPU both are the host's. */
int fr_place_second_memory(const fr_ctx *ctx);
/* What the step needs in the backend's memory beyond the optimizer's: the
 * parameters' copies (fr_backend.mirror of the host's values) and the
 * batch's buffers (the feed's two slots, or a micro-batch's); nothing on
 * the CPU. */
fr_status fr_place_materialize(fr_step *s);
/* The GEMM scratch taken (take 1) or given back with the arena: floats of
 * it (a device's holds the fused SGD step's weight gradient too), and its
 * binding into the executor. */
size_t fr_place_scratch_floats(const fr_step *s);
fr_status fr_place_scratch_take(fr_step *s, int take);
void fr_place_scratch(fr_step *s);
/* Samples off..off+n of b bound as the graph's input and label: the host's
 * batch in place, or written into the step's device buffers, or the feed's
 * slot (uploaded ahead). */
fr_status fr_place_batch(fr_step *s, const fr_batch *b, int slot, int off, int n);
void fr_place_free(fr_step *s);
/* The argmax hits of the n samples just run, counted by the backend where
 * the logits are (only the count comes back from a device). */
fr_status fr_step_hits_of(fr_step *s, int n, int *hits);
/* --offload optimizer: the valid gradients read into their host copies
 * (made by the step);
 * the updated weights written back to the device. */
fr_status fr_place_grads_down(fr_step *s);
fr_status fr_place_params_up(fr_step *s);
/* Bring parameters (and a device's optimizer state) to the host, and send
 * host values (after a load) back; nothing on the CPU. */
fr_status fr_model_to_host(fr_model *m);
fr_status fr_model_to_device(fr_model *m);

#endif
