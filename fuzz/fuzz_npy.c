/* fuzz_npy.c — libFuzzer target for the .npy checker (fr_npy_check): any
 * input is accepted or refused with FR_ERR_FORMAT, never crashes, and
 * allocates nothing that outlives the call. abort() reports a fault. */
#include "data/dataset.h"
#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_check_buffer(fr_npy_check, "fuzz.npy", data, size);
}
