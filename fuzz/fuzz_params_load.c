/* libFuzzer harness for the parameter file loader (docs/FORMAT.md §6).
 * Any input must be refused with a status or accepted; never a crash, a
 * leak, undefined behaviour or an allocation the input's size cannot back. */
#include <stddef.h>
#include <stdint.h>

#include "oscar_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    oscar_params *p = NULL;
    oscar_status s = oscar_params_load_memory(data, size, &p);
    if (s == OSCAR_OK) {
        /* An accepted file must be usable: touch every accessor. */
        oscar_params_info info;
        if (oscar_params_get_info(p, &info) != OSCAR_OK) __builtin_trap();
        for (int l = 0; l < info.num_layers; l++)
            for (int kv = 0; kv < 2; kv++) {
                const float *R;
                float c;
                if (oscar_params_rotation(p, l, 0, (oscar_kv)kv, &R) != OSCAR_OK) __builtin_trap();
                if (oscar_params_clip(p, l, (oscar_kv)kv, &c) != OSCAR_OK || !(c > 0.0f && c <= 1.0f)) __builtin_trap();
                volatile float sink = R[(size_t)info.head_dim * (size_t)info.head_dim - 1];
                (void)sink;
                for (int h = 0; h < info.num_kv_heads; h++) {
                    int bits = 0;
                    if (oscar_params_code_bits(p, l, h, (oscar_kv)kv, &bits) != OSCAR_OK || (bits != 2 && bits != 3))
                        __builtin_trap();
                }
            }
        oscar_params_destroy(p);
    } else if (p != NULL) {
        __builtin_trap(); /* a refused file must leave *out NULL */
    }
    return 0;
}
