/* test_scaler.c — the loss scaler against sequences derived by hand from
 * GradScaler's rules (the example with growth_interval 3), the
 * default constants, and a scale at 2^127 that must not grow to inf. */
#include <math.h>
#include "check.h"
#include "optim/scaler.h"

int main(void) {
    fr_scaler s = fr_scaler_default();
    CHECK(s.scale == 65536.0f && s.growth_factor == 2.0f && s.backoff_factor == 0.5f &&
              s.growth_interval == 2000,
          "PyTorch's defaults");
    s.growth_interval = 3;
    const int inf[12] = {0, 0, 0, 1, 0, 0, 0, 1, 1, 0, 0, 0};
    const float want_scale[12] = {65536,  65536, 131072, 65536, 65536, 65536,
                                  131072, 65536, 32768,  32768, 32768, 65536};
    const int want_tracker[12] = {1, 2, 0, 0, 1, 2, 0, 0, 0, 1, 2, 0};
    for (int i = 0; i < 12; i++) {
        fr_scaler_update(&s, inf[i]);
        CHECK(s.scale == want_scale[i] && s.growth_tracker == want_tracker[i],
              "step %d: (%g, %d), want (%g, %d)", i + 1, (double)s.scale, s.growth_tracker,
              (double)want_scale[i], want_tracker[i]);
    }
    CHECK(s.skipped == 3, "three skipped steps, counted %llu", (unsigned long long)s.skipped);
    /* 2^127 * 2 overflows float: the scale stays and the tracker resets. */
    fr_scaler big = fr_scaler_default();
    big.growth_interval = 1;
    big.scale = ldexpf(1.0f, 127);
    fr_scaler_update(&big, 0);
    CHECK(big.scale == ldexpf(1.0f, 127) && isfinite(big.scale) && big.growth_tracker == 0,
          "2^127 does not grow to inf: %g", (double)big.scale);
    /* The inverse scale is 1/scale rounded from double: exact for powers of two. */
    CHECK(fr_scaler_inv_scale(&s) == 1.0f / 65536.0f, "inverse scale");
    fr_scaler odd = fr_scaler_default();
    odd.scale = 3.0f;
    CHECK(fr_scaler_inv_scale(&odd) == (float)(1.0 / 3.0), "inverse of 3 from double");
    return check_done();
}
