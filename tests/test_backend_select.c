/* Backend selection: asking for one backend opens only that plugin
 * (issue 15: OSCAR_BACKEND=cpu used to probe every plugin, and PoCL left
 * threads behind). The fake plugins record every dlopen in
 * $OSCAR_FAKE_LOADED from a constructor; the real OpenCL plugin and its ICD
 * loader are checked with RTLD_NOLOAD. */
#define _GNU_SOURCE 1
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "oscar/oscar.h"

static oscar_runtime *make(const char *backend, const char *dir, oscar_status expect) {
    oscar_runtime_options o;
    oscar_runtime_options_default(&o);
    o.backend = backend;
    o.plugin_dir = dir;
    oscar_runtime *rt = NULL;
    cr_assert_eq(oscar_runtime_create(&o, &rt), expect, "%s", oscar_last_error());
    return rt;
}

static int loaded(const char *name) {
    const char *l = getenv("OSCAR_FAKE_LOADED");
    return l && strstr(l, name) != NULL;
}

Test(select, cpu_opens_no_plugin) {
    unsetenv("OSCAR_FAKE_LOADED");
    oscar_runtime *rt = make("cpu", OSCAR_FAKE_PLUGIN_DIR, OSCAR_OK);
    cr_assert(!loaded("cuda") && !loaded("opencl"), "opened: %s", getenv("OSCAR_FAKE_LOADED"));
    const char *rep = oscar_runtime_report(rt);
    cr_assert(strstr(rep, "opencl  skipped: not opened, backend 'cpu' requested (options)"), "%s", rep);
    cr_assert(strstr(rep, "cuda    skipped: not opened"), "%s", rep);
    oscar_runtime_destroy(rt);
    /* The control: without a request both fakes are opened and probed, so
     * the marker does see a dlopen. */
    rt = make(NULL, OSCAR_FAKE_PLUGIN_DIR, OSCAR_OK);
    cr_assert(loaded("cuda") && loaded("opencl"), "opened: %s", getenv("OSCAR_FAKE_LOADED"));
    oscar_runtime_destroy(rt);
}

Test(select, env_cpu_opens_no_plugin) {
    unsetenv("OSCAR_FAKE_LOADED");
    setenv("OSCAR_BACKEND", "cpu", 1);
    oscar_runtime *rt = make(NULL, OSCAR_FAKE_PLUGIN_DIR, OSCAR_OK);
    unsetenv("OSCAR_BACKEND");
    cr_assert(!loaded("cuda") && !loaded("opencl"), "opened: %s", getenv("OSCAR_FAKE_LOADED"));
    cr_assert(strstr(oscar_runtime_report(rt), "requested (OSCAR_BACKEND)"), "%s", oscar_runtime_report(rt));
    oscar_runtime_destroy(rt);
}

Test(select, one_gpu_backend_opens_only_that_one) {
    unsetenv("OSCAR_FAKE_LOADED");
    /* The fake cuda plugin has a foreign ABI: the request fails, naming it,
     * and the fake opencl plugin is never opened. */
    oscar_runtime *rt = make("cuda", OSCAR_FAKE_PLUGIN_DIR, OSCAR_ERR_NO_BACKEND);
    cr_assert_null(rt);
    cr_assert(loaded("cuda") && !loaded("opencl"), "opened: %s", getenv("OSCAR_FAKE_LOADED"));
    cr_assert(strstr(oscar_last_error(), "plugin ABI 999"), "%s", oscar_last_error());
    unsetenv("OSCAR_FAKE_LOADED");
    rt = make("hip", OSCAR_FAKE_PLUGIN_DIR, OSCAR_ERR_NO_BACKEND);
    cr_assert(!loaded("cuda") && !loaded("opencl"), "opened: %s", getenv("OSCAR_FAKE_LOADED"));
}

/* The real OpenCL plugin (built in CI): with cpu requested neither it nor
 * the OpenCL ICD loader is mapped into the process. */
Test(select, cpu_leaves_real_opencl_unloaded) {
    char path[4096];
    snprintf(path, sizeof path, "%s/liboscar_backend_opencl.so", OSCAR_BUILD_LIB_DIR);
    FILE *f = fopen(path, "rb");
    if (!f) cr_skip_test("OpenCL plugin not built (%s)", path);
    fclose(f);
    cr_assert_null(dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD), "ICD loader mapped before the test");
    oscar_runtime *rt = make("cpu", OSCAR_BUILD_LIB_DIR, OSCAR_OK);
    cr_assert_null(dlopen(path, RTLD_NOW | RTLD_NOLOAD), "plugin was opened:\n%s", oscar_runtime_report(rt));
    cr_assert_null(dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_NOLOAD), "ICD loader was opened");
    oscar_runtime_destroy(rt);
}
