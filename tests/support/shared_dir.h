/* Where the shared models and data live (../shared beside the checkout). */
#ifndef OSCAR_TEST_SHARED_DIR_H
#define OSCAR_TEST_SHARED_DIR_H
#include <stddef.h>
/* Writes the folder into buf: $OSCAR_SHARED_DIR (ctest sets it), else
 * ../shared next to the source tree. Returns 1 if it is a folder, 0 if absent
 * (tests that need it then skip). */
int rc_shared_dir(char *buf, size_t len);
#endif
