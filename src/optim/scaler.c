/* scaler.c — dynamic loss scaling (see scaler.h). */
#include <math.h>
#include "optim/scaler.h"

fr_scaler fr_scaler_default(void) {
    fr_scaler s = {1, 65536.0f, 2.0f, 0.5f, 2000, 0, 0};
    return s;
}

/* torch._amp_update_scale_: on inf, scale *= backoff and the tracker resets;
 * otherwise the tracker counts up, and on reaching growth_interval the scale
 * grows if the result is finite, and the tracker resets either way. */
void fr_scaler_update(fr_scaler *s, int found_inf) {
    if (found_inf) {
        s->scale = s->scale * s->backoff_factor;
        s->growth_tracker = 0;
        s->skipped++;
        return;
    }
    int successful = s->growth_tracker + 1;
    if (successful == s->growth_interval) {
        float grown = s->scale * s->growth_factor;
        if (isfinite(grown)) s->scale = grown;
        s->growth_tracker = 0;
    } else {
        s->growth_tracker = successful;
    }
}

float fr_scaler_inv_scale(const fr_scaler *s) { return (float)(1.0 / (double)s->scale); }
