#ifndef FLUXBUS_CLIBUV_SHIM_H
#define FLUXBUS_CLIBUV_SHIM_H
#include <uv.h>
#endif
