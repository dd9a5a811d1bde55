#ifndef FLUXBUS_CJEMALLOC_SHIM_H
#define FLUXBUS_CJEMALLOC_SHIM_H
#include <stddef.h>
/* fluxd links jemalloc (Debian's libjemalloc-dev), which then provides malloc and free for the whole process.
 * Only its control entry point is declared here (jemalloc/jemalloc.h redeclares malloc & co., which clashes with
 * Glibc's module): fluxd reads the version through it, which also keeps the library linked. */
int mallctl(const char *name, void *oldp, size_t *oldlenp, void *newp, size_t newlen);
#endif
