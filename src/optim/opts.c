/* opts.c — the optimizer options: PyTorch's defaults for each kind and
 * the parser of an optimizer's name. The update arithmetic lives in each
 * backend's kernels (backend/cpu/optim.c, backend/opencl/optim.c) and the
 * rules over a model's parameters in optim/optim.c. */
#include <ctype.h>
#include <string.h>
#include "backend/state.h"
#include "core/ctx.h"

/* fr_step_opts.optim_state reaches the kernels as an fr_state_kind. */
_Static_assert(FR_OPTIM_STATE_FP32 == (int)FR_STATE_F32 &&
                   FR_OPTIM_STATE_BF16 == (int)FR_STATE_BF16 &&
                   FR_OPTIM_STATE_INT8 == (int)FR_STATE_INT8,
               "fr_optim_state and fr_state_kind number the formats alike");

/* torch.optim defaults (PyTorch 2.x). SGD has no default lr in PyTorch (it is
 * required); 0.01 is ours. Fields a kind does not use stay 0. */
fr_optim_opts fr_optim_defaults(fr_optim_kind kind) {
    fr_optim_opts o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    o.zero_grad_to_none = 1; /* zero_grad(set_to_none=True), the 2.x default */
    switch (kind) {
    case FR_OPTIM_SGD: o.lr = 0.01; break;
    case FR_OPTIM_ADAM:
    case FR_OPTIM_ADAMW:
        o.lr = 1e-3;
        o.beta1 = 0.9;
        o.beta2 = 0.999;
        o.eps = 1e-8;
        o.weight_decay = kind == FR_OPTIM_ADAMW ? 1e-2 : 0.0;
        break;
    }
    return o;
}

/* "sgd", "adam" or "adamw", in any letter case. */
fr_status fr_optim_parse(fr_ctx *ctx, const char *name, fr_optim_kind *out) {
    static const struct {
        const char *name;
        fr_optim_kind kind;
    } known[] = {{"sgd", FR_OPTIM_SGD}, {"adam", FR_OPTIM_ADAM}, {"adamw", FR_OPTIM_ADAMW}};
    if (name) {
        for (size_t k = 0; k < sizeof known / sizeof known[0]; k++) {
            const char *a = name, *b = known[k].name;
            while (*a && *b && tolower((unsigned char)*a) == *b) a++, b++;
            if (!*a && !*b) {
                if (out) *out = known[k].kind;
                return FR_OK;
            }
        }
    }
    return fr_fail(ctx, FR_ERR_ARG, "unknown optimizer '%s' (choose sgd, adam or adamw)",
                   name ? name : "");
}
