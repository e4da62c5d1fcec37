/* train_mlp.c — the seed MLP, Linear(1000,2000)-ReLU-Linear(2000,10), trained
 * with the C API on a synthetic task (labels from a fixed linear "teacher"),
 * then the memory it took. Built by cmake as build/train_mlp; `train_mlp N`
 * takes N steps instead of 300. */
#include <stdio.h>
#include <stdlib.h>
#include <frugal.h>

int main(int argc, char **argv) {
    fr_cpu_setup(argv); /* first: OpenBLAS on the kernels this CPU calls for (a restart, once) */
    enum { N = 32, D = 1000 };
    const int steps = argc > 1 && atoi(argv[1]) > 0 ? atoi(argv[1]) : 300;
    fr_ctx *ctx = fr_ctx_new();
    fr_set_threads(ctx, 2);
    fr_model *m = fr_model_new(ctx, D, 1, 1); /* a flat input of 1000 features */
    if (fr_model_linear(m, 2000, 1) || fr_model_relu(m) || fr_model_linear(m, 10, 1)) {
        fprintf(stderr, "%s\n", fr_last_error(ctx));
        return 1;
    }
    fr_model_init(m, 42); /* PyTorch's default initialisation, seeded */
    fr_step_opts opts = {
        .batch = N, .training = 1, .optim = fr_optim_defaults(FR_OPTIM_SGD), .seed = 42};
    opts.optim.lr = 0.01f;
    opts.optim.momentum = 0.9f;
    fr_step *step = fr_step_compile(m, &opts); /* graph -> autodiff -> plan -> arena */
    if (!step) {
        fprintf(stderr, "%s\n", fr_last_error(ctx));
        return 1;
    }
    float *x = malloc(sizeof(float) * N * D);
    int32_t *y = malloc(sizeof(int32_t) * N);
    srand(1);
    for (int it = 0; it < steps; it++) {
        for (int i = 0; i < N; i++) { /* label = argmax_k sum_j x_j t_kj, t_kj in -3..3 */
            float best = -1e30f;
            for (int j = 0; j < D; j++)
                x[i * D + j] = 2.0f * (float)rand() / (float)RAND_MAX - 1.0f;
            for (int k = 0; k < 10; k++) {
                float z = 0;
                for (int j = 0; j < D; j++) z += x[i * D + j] * (float)((j * 31 + k * 17) % 7 - 3);
                if (z > best) best = z, y[i] = k;
            }
        }
        fr_batch b = {.n = N, .x = x, .y = y};
        float loss;
        int correct;
        if (fr_step_run(step, &b, &loss, &correct)) {
            fprintf(stderr, "%s\n", fr_last_error(ctx));
            return 1;
        }
        if (it % 50 == 0 || it == steps - 1)
            printf("step %3d  loss %.4f  batch accuracy %d/%d\n", it, loss, correct, N);
    }
    size_t predicted[FR_MEM_CAT_COUNT], peak;
    fr_step_predicted(step, predicted, &peak);
    printf("predicted peak of a step: %.1f MiB\n", peak / 1048576.0);
    fr_mem_summary(ctx, stdout);
    free(x);
    free(y);
    fr_step_free(step);
    fr_model_free(m);
    fr_ctx_free(ctx);
    return 0;
}
