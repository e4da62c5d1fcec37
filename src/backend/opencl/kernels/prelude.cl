/* prelude.cl — what the runtime puts before every program of this folder
 * (runtime.c, fr_cl_kernel; not a program of its own): the 16-bit
 * conversions of src/core/half.c in integer arithmetic, so every kernel that
 * reads or writes f16 or bf16 rounds as the CPU does, bit for bit (nearest
 * even, NaN payloads kept and quieted, subnormals exact), without needing
 * cl_khr_fp16; and the CPU's e^x (fr_exp_poly), for the activations that
 * must give the CPU's bits (GELU's tanh form, SwiGLU). */

/* no contraction into fma, as on the CPU (every program says so too, after this text) */
#pragma OPENCL FP_CONTRACT OFF

static ushort f32_to_f16(float f) {
    uint x = as_uint(f);
    ushort sign = (ushort)((x >> 16) & 0x8000u);
    uint ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) { /* inf, or NaN: quiet, top of the payload kept */
        if (ax == 0x7f800000u) return sign | 0x7c00u;
        return sign | 0x7e00u | (ushort)((ax >> 13) & 0x3ffu);
    }
    if (ax >= 0x477ff000u) return sign | 0x7c00u; /* rounds to 2^16 or more: infinity */
    if (ax < 0x38800000u) {                       /* an f16 subnormal or zero */
        if (ax <= 0x33000000u) return sign;
        uint e = ax >> 23;
        uint mant = (ax & 0x7fffffu) | 0x800000u;
        uint shift = 126u - e;
        uint q = mant >> shift;
        uint rem = mant & ((1u << shift) - 1u);
        uint halfway = 1u << (shift - 1u);
        if (rem > halfway || (rem == halfway && (q & 1u))) q++;
        return sign | (ushort)q;
    }
    uint h = (ax - 0x38000000u) >> 13;
    uint rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return sign | (ushort)h;
}

static float f16_to_f32(ushort hv) {
    uint h = hv;
    uint sign = (h & 0x8000u) << 16;
    uint e = (h >> 10) & 0x1fu;
    uint m = h & 0x3ffu;
    uint x;
    if (e == 0x1fu) {
        x = sign | 0x7f800000u | (m ? 0x400000u | (m << 13) : 0u);
    } else if (e == 0) {
        if (m == 0) {
            x = sign;
        } else { /* m 2^-24: shift the leading bit onto bit 10 */
            uint sh = (uint)clz(m) - 21u;
            m <<= sh;
            x = sign | ((113u - sh) << 23) | ((m & 0x3ffu) << 13);
        }
    } else {
        x = sign | ((e + 112u) << 23) | (m << 13);
    }
    return as_float(x);
}

static ushort f32_to_bf16(float f) {
    uint x = as_uint(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (ushort)((x >> 16) | 0x0040u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return (ushort)(x >> 16);
}

static float bf16_to_f32(ushort h) {
    uint x = (uint)h << 16;
    if ((x & 0x7fffffffu) > 0x7f800000u) x |= 0x400000u;
    return as_float(x);
}

/* e^x as the CPU's fr_exp_poly (src/backend/cpu/exp_poly.h), operation for
 * operation: the same bits. */
static float exp_poly(float x) {
    float c = x >= -87.3f ? x : -87.3f;
    c = c <= 88.0f ? c : 88.0f;
    const float n = (c * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
    const float g = (c - n * 0.693359375f) + n * 2.12194440e-4f;
    const float p = ((((((1.9875691500e-4f * g + 1.3981999507e-3f) * g + 8.3334519073e-3f) * g +
                        4.1665795894e-2f) *
                           g +
                       1.6666665459e-1f) *
                          g +
                      5.0000001201e-1f) *
                     (g * g)) +
                    g + 1.0f;
    const float b = as_float(((int)n + 127) * (1 << 23));
    return x < -87.3f ? 0.0f : x > 88.0f ? INFINITY : x == x ? p * b : x;
}
