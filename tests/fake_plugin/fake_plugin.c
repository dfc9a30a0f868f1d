/* Deliberately broken plugins for the registry tests: one with a foreign ABI
 * version (FAKE_ABI), one that cannot run here (probe 0 with a reason), and one
 * that runs without kernels or capabilities (FAKE_RUNS). */
#include <stdlib.h>
#include <string.h>

#include "oscar_backend.h"

#ifndef FAKE_RUNS
#define FAKE_RUNS 0
#endif

/* Marks that this plugin was dlopen'ed at all (tests/test_backend_select.c):
 * appends FAKE_NAME to $OSCAR_FAKE_LOADED. */
__attribute__((constructor)) static void mark_loaded(void) {
    const char *old = getenv("OSCAR_FAKE_LOADED");
    char buf[256];
    size_t n = old ? strlen(old) : 0;
    if (n + sizeof FAKE_NAME + 1 > sizeof buf) return;
    if (old) memcpy(buf, old, n);
    buf[n] = ' ';
    memcpy(buf + n + 1, FAKE_NAME, sizeof FAKE_NAME);
    setenv("OSCAR_FAKE_LOADED", buf, 1);
}

static int probe_never(int device_index, oscar_errbuf *why) {
    (void)device_index;
    oscar_errbuf_set(why, OSCAR_ERR_NO_BACKEND, "fake device is unplugged");
    return 0;
}

static int probe_always(int device_index, oscar_errbuf *why) {
    (void)device_index;
    (void)why;
    return 100;
}
#if FAKE_RUNS
/* FAKE_RUNS: a plugin that runs (probe and init succeed) but claims no capability beyond the 2-bit
 * format (caps 0) and has no kernels: the runtime's refusals that come before any backend call
 * (3-bit head-tensors on a backend without OSCAR_BACKEND_CAP_WIDE_CODES) are tested on it. */
static int fake_ctx;
static oscar_status init_fake(int device_index, void **ctx, oscar_errbuf *err) {
    (void)device_index;
    (void)err;
    *ctx = &fake_ctx;
    return OSCAR_OK;
}
static void shutdown_fake(void *ctx) { (void)ctx; }
#endif

static const oscar_backend_api fake_api = {
    .abi_version = FAKE_ABI ? FAKE_ABI : OSCAR_BACKEND_ABI_VERSION,
    .name = FAKE_NAME,
    .probe = FAKE_RUNS ? probe_always : probe_never,
#if FAKE_RUNS
    .init = init_fake,
    .shutdown = shutdown_fake,
#endif
};

__attribute__((visibility("default"))) const oscar_backend_api *oscar_backend_entry_v1(void) { return &fake_api; }
