/* Deliberately broken plugins for the registry tests: one with a foreign ABI
 * version (FAKE_ABI), one that cannot run here (probe 0 with a reason). */
#include "oscar_backend.h"

static int probe_never(int device_index, oscar_errbuf *why) {
    (void)device_index;
    oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND, "fake device is unplugged");
    return 0;
}

static const oscar_backend_api fake_api = {
    .abi_version = FAKE_ABI ? FAKE_ABI : OSCAR_BACKEND_ABI_VERSION,
    .name = FAKE_NAME,
    .probe = probe_never,
};

__attribute__((visibility("default"))) const oscar_backend_api *oscar_backend_entry_v1(void) { return &fake_api; }
