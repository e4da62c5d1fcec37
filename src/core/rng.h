/* rng.h — counter-based random numbers: the value at (seed, stream, index)
 * does not depend on the order or the thread that asks, so dropout masks and
 * shuffles are the same bit for bit for a given seed at any thread count. */
#ifndef FR_RNG_H
#define FR_RNG_H

#include <stdint.h>

/* A 64-bit hash of (seed, stream, index) (splitmix64 finaliser chain). */
uint64_t fr_rng_u64(uint64_t seed, uint64_t stream, uint64_t index);
/* Uniform in [0, 1) with 24 random bits. */
float fr_rng_uniform(uint64_t seed, uint64_t stream, uint64_t index);

/* A sequential generator for initialisation and shuffling. */
typedef struct fr_rng {
    uint64_t seed, stream, i;
} fr_rng;

static inline fr_rng fr_rng_make(uint64_t seed, uint64_t stream) {
    fr_rng r = {seed, stream, 0};
    return r;
}
uint64_t fr_rng_next(fr_rng *r);
float fr_rng_next_uniform(fr_rng *r); /* [0, 1) */
/* Uniform integer in [0, n) without modulo bias. */
uint64_t fr_rng_below(fr_rng *r, uint64_t n);

#endif
