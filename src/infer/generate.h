/* generate.h — text from a token model (`input tokens T`), one position at a
 * time, with a cache of every attention layer's keys and values: the prompt
 * in one pass (prefill), then each new token as one position whose attention
 * reads the cached keys (O(T) per layer, not O(T^2)). It runs on the
 * context's backend (the CPU, or an OpenCL device after fr_cl_use) through
 * the graph, plan and executor a training step runs through: a chunk of
 * positions is the model's forward graph with ATTENTION_KV for attention,
 * its step values planned in one arena (FR_MEM_WORKSPACE). The cache is its
 * own memory category, FR_MEM_KV_CACHE, in the backend's memory: 2 x (NH,
 * context, HS) f32 per attention layer, 2 * layers * context * C * 4 bytes
 * for a GPT, held only while fr_generate runs; on a device the weights are
 * copied there too (FR_MEM_PARAMS) with the chunk's ids (FR_MEM_DATA).
 *
 * The context is the model's (its pos_embedding's table, `input tokens T`).
 * Past it, two rules (window_slide):
 *   0, the default: when the sequence would pass T, the oldest half is
 *      dropped: the last T/2 tokens are prefilled again at positions 0..
 *      and the cache goes on from there. One prefill per T/2 new tokens, so
 *      a token still costs O(T) on average; but the positions restart, so
 *      the tokens from the first wrap on are not nanoGPT's.
 *   1, slide: nanoGPT's rule (idx[:, -block_size:] at every step). Until
 *      the sequence passes T the cache runs as above; from then on each new
 *      token drops the oldest and the whole window of the last T tokens is
 *      run again at positions 0..T-1 (the cache cannot be kept: every
 *      token's position moves down by one), O(T^2) attention and T rows of
 *      every layer per token. Each token is then chosen from nanoGPT's
 *      logits: greedy decoding equals nanoGPT's.
 * A prompt longer than T keeps its last T tokens under both rules.
 *
 * Sampling, in Hugging Face's order of warpers: logits / temperature, the
 * top_k largest kept (0: all; ties at the k-th value are kept too, as
 * nanoGPT's `logits < v[-1]` mask), softmax in double, then top_p (nucleus:
 * the most probable tokens, in order, while the mass before each is below
 * top_p, as TopPLogitsWarper; 0 or 1: all), one draw from fr_rng(seed) per
 * token: the same seed gives the same tokens. temperature 0 is greedy: the
 * argmax, the lowest id on a tie. With stop set, the run ends after it makes
 * stop_token (the tokenizer's EOS), which is emitted.
 *
 * max_context (0: the model's) caps the positions the caches hold: a model
 * whose config allows 131072 positions generates in the memory of fewer. 
 *
 * Layers run in eval mode: dropout passes its input on. The kinds walked are
 * embedding, pos_embedding, layernorm, linear, gelu, relu, add, residual
 * blocks and attention; any other is refused. Weights must be f32 (a model
 * turned to 16 bits is refused) and loaded or initialised. */
#ifndef FR_GENERATE_H
#define FR_GENERATE_H

#include <stdint.h>
#include "frugal.h"

typedef struct fr_gen_opts {
    int tokens;         /* new tokens to make (>= 0) */
    double temperature; /* 0: greedy; else > 0 */
    int top_k;          /* 0: the whole vocabulary */
    double top_p;       /* nucleus sampling: 0 or 1 keeps all; else in (0, 1) */
    int stop;           /* 1: stop after making stop_token */
    int32_t stop_token;
    int max_context; /* positions the caches hold: 0 the model's context, else at most it */
    uint64_t seed;
    /* past the context: 0 keeps the last T/2 tokens and restarts positions (a
     * prefill per T/2 tokens); 1 slides the window a token a step as nanoGPT
     * does (a prefill of T positions per token) */
    int window_slide;
    /* called with each new token as it is chosen (may be NULL) */
    void (*emit)(void *user, int32_t token);
    /* called with the logits (vocab f32) each new token is chosen from, before
     * temperature and top-k (may be NULL; the array is valid during the call) */
    void (*logits)(void *user, const float *logits, int vocab);
    void *user;
} fr_gen_opts;

/* Continues prompt[0..n_prompt) (n_prompt >= 1, ids below the vocabulary)
 * by o->tokens new tokens, handed to o->emit one by one. A prompt longer
 * than the context keeps its last context tokens; *cropped (may be NULL)
 * receives how many were dropped. Errors: FR_ERR_ARG / FR_ERR_SHAPE with a
 * message (a model that does not read tokens or has no weights, a kind of
 * layer it cannot run, 16-bit weights, a bad id or option), FR_ERR_NOMEM. */
fr_status fr_generate(fr_model *m, const int32_t *prompt, int n_prompt, const fr_gen_opts *o,
                      int *cropped);

/* What fr_generate(m, a prompt of n_prompt tokens, o) will hold in the
 * backend's memory, by category, predicted from its plans before anything
 * runs: peak[FR_MEM_KV_CACHE] the caches, peak[FR_MEM_WORKSPACE] the largest
 * peak of a chunk's step values, and on a device peak[FR_MEM_PARAMS] the
 * weights' copy and peak[FR_MEM_DATA] the ids (the CPU reads the model's
 * weights and the prompt in place: 0). fr_mem_stats' allocated_peak of the
 * same categories, taken from zero, measures the same bytes. */
fr_status fr_generate_predict(fr_model *m, int n_prompt, const fr_gen_opts *o,
                              size_t peak[FR_MEM_CAT_COUNT]);

/* The vocabulary of a token model (rows of its first embedding), 0 if it has
 * none. */
int fr_generate_vocab(const fr_model *m);

#endif
