#include "runtime_or_skip.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

int rc_backend_required(const char *backend) {
    const char *r = getenv("OSCAR_REQUIRE_BACKENDS");
    return r && backend && strstr(r, backend) != NULL;
}

oscar_runtime *rc_runtime_or_null(const oscar_runtime_options *ro) {
    oscar_runtime *rt = NULL;
    if (oscar_runtime_create(ro, &rt) == OSCAR_OK) return rt;
    cr_assert(!rc_backend_required(ro->backend), "%s is required but: %s", ro->backend, oscar_last_error());
    return NULL;
}

oscar_runtime *rc_runtime_or_skip(const char *backend) {
    oscar_runtime_options ro;
    oscar_runtime_options_default(&ro);
    ro.backend = backend;
    oscar_runtime *rt = rc_runtime_or_null(&ro);
    if (!rt) cr_skip_test("%s not available: %s", backend ? backend : "the default backend", oscar_last_error());
    return rt;
}
