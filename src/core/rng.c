/* rng.c — counter-based hashing (splitmix64) for reproducible randomness. */
#include "core/rng.h"

uint64_t fr_rng_u64(uint64_t seed, uint64_t stream, uint64_t index) {
    return fr_rng_mix(fr_rng_base(seed, stream) ^ index);
}

float fr_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index) {
    return fr_rng_uniform_at(fr_rng_base(seed, stream), index);
}

uint64_t fr_rng_next(fr_rng *r) { return fr_rng_u64(r->seed, r->stream, r->i++); }

float fr_rng_next_uniform(fr_rng *r) {
    return (float)(fr_rng_next(r) >> 40) * (1.0f / 16777216.0f);
}

uint64_t fr_rng_below(fr_rng *r, uint64_t n) {
    if (n <= 1) return 0;
    uint64_t lim = UINT64_MAX - UINT64_MAX % n; /* reject the biased tail */
    uint64_t x;
    do x = fr_rng_next(r);
    while (x >= lim);
    return x % n;
}
