/* fuzz_npy.c — libFuzzer target for the .npy checker (fr_npy_check) and the
 * model checks on what parses (fr_npy_check_for: shape, label range, labels
 * vs targets): any input is accepted or refused, never crashes, and
 * allocates nothing that outlives the call. abort() reports a fault. */
#include "fuzz_data.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    return fuzz_data(fr_npy_check, fr_npy_check_for, "fuzz.npy", data, size);
}
