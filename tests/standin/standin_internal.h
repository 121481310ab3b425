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

#endif
