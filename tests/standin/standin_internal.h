/* standin_internal.h — what the parts of the CUDA-runtime and cuBLAS
 * stand-in share beyond standin.h (test-only; docs/model.md, The CPU
 * stand-in). Not for callers of the stand-in: they use standin.h.
 * Thread-safe unless a line says otherwise.
 */
#ifndef ZB_STANDIN_INTERNAL_H
#define ZB_STANDIN_INTERNAL_H

#include <stdint.h>

#include "standin.h"

/* Sets the calling thread's last error (cudaGetLastError) to e when e is
 * an error, and returns e. */
cudaError_t standin_set_last(cudaError_t e);

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t standin_now_ns(void);

/* cudaSuccess when [p, p + bytes) is host memory: not device memory, live or
 * freed, and inside its allocation when p is pinned (cudaMallocHost);
 * otherwise cudaErrorInvalidValue with a message naming `what`. */
cudaError_t standin_check_host(const void *p, size_t bytes, const char *what);

/* True when this call of api, from the return address site, is to fail
 * (standin_fail.c); the caller then fails the way the library would. */
bool standin_inject(const char *api, const void *site);

/* The caller's return address, for standin_inject. */
#define STANDIN_SITE __builtin_return_address(0)

#endif
