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

/* The same values a stream at a time, for loops over many indices: the
 * chain's first two rounds depend on (seed, stream) alone, so a kernel
 * takes them once (fr_rng_base) and the last round per index, inlined:
 * fr_rng_uniform_at(fr_rng_base(s, t), i) == fr_rng_uniform(s, t, i). */
static inline uint64_t fr_rng_mix(uint64_t z) {
    z += 0x9e3779b97f4a7c15ULL;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
static inline uint64_t fr_rng_base(uint64_t seed, uint64_t stream) {
    return fr_rng_mix(fr_rng_mix(seed) ^ stream);
}
static inline float fr_rng_uniform_at(uint64_t base, uint64_t index) {
    return (float)(fr_rng_mix(base ^ index) >> 40) * (1.0f / 16777216.0f);
}

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
