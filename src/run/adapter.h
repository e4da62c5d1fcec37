/* adapter.h — LoRA adapters as PEFT keeps them on disk: a directory with
 * adapter_config.json (LoraConfig's fields) and adapter_model.safetensors
 * (base_model.model.<layer>.lora_A.weight (r, in), ...lora_B.weight
 * (out, r), f32), read back into a model (--adapter), written after
 * training (--save-adapter), and merged into the base as one ordinary
 * state_dict (--merge). The adapters themselves are model/lora.c's. */
#ifndef FR_ADAPTER_H
#define FR_ADAPTER_H

#include "model/model.h"

/* path: a directory holding the pair, or the .safetensors file with
 * adapter_config.json beside it. Read the config and add its adapters to m
 * (fr_model_lora; A drawn from seed's streams until fr_adapter_load). */
fr_status fr_adapter_lora(fr_model *m, const char *path, uint64_t seed);
/* The adapter tensors into m's adapters, strictly: every adapter present,
 * nothing else, each of its layer's shape (names, ranks and dimensions
 * named when they differ); the model unchanged on refusal. */
fr_status fr_adapter_load(fr_model *m, const char *path);
/* Both, for a model that holds its base's values (eval, generate). */
fr_status fr_adapter_apply(fr_model *m, const char *path, uint64_t seed);
/* Write the pair into directory dir (made if missing), each file
 * atomically; if the second fails, the first written by this call is
 * removed. */
fr_status fr_adapter_save(fr_model *m, const char *dir);
/* The merged model W + (alpha / r) B A for every adapted layer, written as
 * a weights-only state_dict without adapters (fr_ckpt_save_weights's
 * names); m is unchanged. Refused without adapters, for a tied or 16-bit
 * adapted weight. */
fr_status fr_adapter_merge_save(fr_model *m, const char *path);
/* The merged weight of adapted layer li into w (O x K floats). */
void fr_adapter_merged(const fr_model *m, int li, float *w);

#endif
