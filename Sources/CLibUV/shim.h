#ifndef FLUXBUS_CLIBUV_SHIM_H
#define FLUXBUS_CLIBUV_SHIM_H
#include <uv.h>
#include <stdint.h>

/// A cheap, monotonic tick counter for measuring how long a callback held the loop: the CPU's time-stamp counter
/// on x86-64 (one instruction; constant-rate on every CPU fluxd targets), nanoseconds from uv_hrtime elsewhere.
/// EventLoop converts ticks to nanoseconds by comparing both clocks over its lifetime.
static inline uint64_t fluxbus_ticks(void) {
#if defined(__x86_64__)
    uint32_t lo, hi;
    __asm__ __volatile__("rdtsc" : "=a"(lo), "=d"(hi));
    return ((uint64_t)hi << 32) | lo;
#else
    return uv_hrtime();
#endif
}
#endif
