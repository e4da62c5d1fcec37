/* runtime.cl — the runtime's own small kernels: fill a span with a value and
 * y = a*x + y, used by its test and by anyone who needs them. Tensors are
 * (buffer, element offset) pairs, as every kernel here takes them. */

/* x[x_off + i] = value, i in [0, n) */
__kernel void fill_f32(__global float *x, ulong x_off, ulong n, float value) {
    size_t i = get_global_id(0);
    if (i < n) x[x_off + i] = value;
}

/* No contraction to fma: a host's float a*x+y gives the same bits. */
#pragma OPENCL FP_CONTRACT OFF

/* y[y_off + i] = a * x[x_off + i] + y[y_off + i], i in [0, n) */
__kernel void axpy_f32(ulong n, float a, __global const float *x, ulong x_off, __global float *y,
                       ulong y_off) {
    size_t i = get_global_id(0);
    if (i < n) y[y_off + i] = a * x[x_off + i] + y[y_off + i];
}
