/* scaler.h — the dynamic loss scaler, with PyTorch's GradScaler semantics:
 * the loss is multiplied by `scale` before backward; a step whose gradients
 * hold an inf or NaN is skipped and the scale backs off; after
 * growth_interval clean steps in a row the scale grows, but only if the
 * grown scale is finite (float32 arithmetic, like torch._amp_update_scale_).
 * Gradients are unscaled before clipping and the optimizer. */
#ifndef FR_SCALER_H
#define FR_SCALER_H

#include <stdint.h>

typedef struct fr_scaler {
    int enabled;
    float scale;          /* init_scale 65536 */
    float growth_factor;  /* 2.0 */
    float backoff_factor; /* 0.5 */
    int growth_interval;  /* 2000 */
    int growth_tracker;   /* clean steps since the last growth or backoff */
    uint64_t skipped;     /* steps skipped for inf/NaN gradients */
} fr_scaler;

fr_scaler fr_scaler_default(void);
/* After a step: found_inf says whether any gradient was inf or NaN. */
void fr_scaler_update(fr_scaler *s, int found_inf);
/* PyTorch's inverse scale: computed in double, then rounded to float. */
float fr_scaler_inv_scale(const fr_scaler *s);

#endif
