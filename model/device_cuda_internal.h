/* device_cuda_internal.h — what the CUDA device's files share
 * (device_cuda.c: streams, copies, events, gemm, kernels, creation;
 * device_cuda_alloc.c: the caching allocator): the device's state and its
 * error helpers. Not a public header. */
#ifndef ZB_DEVICE_CUDA_INTERNAL_H
#define ZB_DEVICE_CUDA_INTERNAL_H

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdbool.h>

#include "zb_device.h"

#define N_CLASSES 224 /* class 0: up to 512 bytes; 4 per power of two up to 2^63 */
#define MAX_BYTES ((size_t)1 << 62)

typedef struct live_block {
  void *p; /* NULL: empty slot */
  size_t asked, size;
} live_block;

typedef struct free_list {
  void **p;
  int n, cap;
} free_list;

typedef struct cuda_dev {
  int ordinal;
  cudaStream_t stream;
  cublasHandle_t blas;
  zb_precision precision;
  zb_err err; /* poisoned when not ZB_OK */
  char err_msg[256];
  zb_device_info info;
  bool exact;       /* no caching: every block its own cudaMalloc, every free a cudaFree (the stand-in) */
  live_block *live; /* open addressing, linear probing; cap a power of two */
  size_t live_cap, live_n;
  free_list free[N_CLASSES];
  zb_device_mem mem;
  int64_t host_syncs; /* dev_sync calls */
} cuda_dev;

/* The device's first error, kept: every later call returns it (the
 * device is poisoned); returns it, with its message in diag. */
zb_err cuda_fail(cuda_dev *d, zb_diag *diag, zb_err err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* ZB_OK, or a failure naming call and the runtime's message. */
zb_err cuda_ok(cuda_dev *d, zb_diag *diag, cudaError_t e, const char *call);
/* Every call starts here: the first error again, or the device made
 * current on this thread (device_cuda.c says why the last error is
 * cleared). */
zb_err cuda_enter(cuda_dev *d, zb_diag *diag);
/* ZB_ERR_INVALID_ARG naming op and what is wrong; does not poison. */
zb_err cuda_bad_arg(zb_diag *diag, const char *op, const char *what);

/* The allocator (device_cuda_alloc.c): zb_device_ops' alloc, free, mem
 * and reset_peak, and the release of every block at destruction. */
zb_err cuda_alloc(void *self, size_t bytes, void **out, zb_diag *diag);
void cuda_free(void *self, void *p);
void cuda_mem(void *self, zb_device_mem *out);
void cuda_reset_peak(void *self);
void cuda_alloc_destroy(cuda_dev *d);
/* The cuBLAS workspace's block: held (and held_peak) count it, current
 * does not (no caller asked for it); it stays until cuda_alloc_destroy,
 * after the handle that uses it is gone. */
zb_err cuda_workspace_alloc(cuda_dev *d, size_t bytes, void **out, zb_diag *diag);

#endif
