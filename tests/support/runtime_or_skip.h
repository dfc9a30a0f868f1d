/* The runtime a test runs on: the CPU always, a plugin where it runs here, and a backend that
 * cannot run fails the test where $OSCAR_REQUIRE_BACKENDS names it (CI: opencl). */
#ifndef OSCAR_TEST_RUNTIME_OR_SKIP_H
#define OSCAR_TEST_RUNTIME_OR_SKIP_H
#include "oscar/oscar.h"
/* 1 if $OSCAR_REQUIRE_BACKENDS names backend (a substring of it: "opencl,cuda"). */
int rc_backend_required(const char *backend);
/* The runtime of ro, or NULL where it cannot be created and ro->backend is not required; a required
 * one fails the test ("BACKEND is required but: oscar_last_error()"). */
oscar_runtime *rc_runtime_or_null(const oscar_runtime_options *ro);
/* The runtime of backend with the default options, or the test skipped ("BACKEND not available:
 * why") where it cannot be created and is not required (failed where it is, as above). */
oscar_runtime *rc_runtime_or_skip(const char *backend);
#endif
