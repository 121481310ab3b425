/* gpu.c — the GPU a zb-worker offers (docs/operations.md, GPU workers):
 * with CUDA built in (ZB_WITH_CUDA, which links model/device_cuda.c) it
 * probes the device --gpu names once at start; on success the worker
 * offers backend cuda and transport nccl and reports the device to the
 * coordinator (AttachRequest.gpu, shown by `zbctl workers`), which gives
 * cuda jobs only to workers that reported one. It advertises the GPU's
 * free memory at start (cudaMemGetInfo) and keeps the cuBLAS workspace's
 * size for admission (admit.c). The one place the worker's
 * control code depends on ZB_WITH_CUDA.
 *
 * Threads: main thread, before the job thread starts; writes w->has_cuda
 * and w->gpu, read-only afterwards. Errors: none returned; a device that
 * is not there is logged once and the worker offers what it has.
 */
#include <stdio.h>
#include <string.h>

#include "worker.h"
#include "zb_log.h"

#ifdef ZB_WITH_CUDA
#include "zb_device.h"

void worker_gpu_probe(worker *w, int ordinal) {
  zb_device_info info;
  zb_diag d = {{0}};
  memset(&info, 0, sizeof info);
  if (zb_device_cuda_probe(ordinal, &info, &d) != ZB_OK) {
    ZB_INFO("no CUDA device: %s (--gpu %d); offering no cuda backend", d.msg, ordinal);
    return;
  }
  info.name[sizeof info.name - 1] = 0;
  int major = info.driver_version / 1000, minor = info.driver_version % 1000 / 10;
  /* the stand-in's name says so already; the mark must reach zbctl workers
   * whatever the name (docs/operations.md, GPU workers) */
  const char *mark = info.standin && !strstr(info.name, "stand-in") ? " [stand-in]" : "";
  snprintf(w->gpu, sizeof w->gpu, "%s%s (%.1f GiB, %.1f free, cc %d.%d, CUDA driver %d.%d)", info.name, mark,
           (double)info.total_bytes / (1024.0 * 1024.0 * 1024.0),
           (double)info.free_bytes / (1024.0 * 1024.0 * 1024.0), info.cc_major, info.cc_minor, major, minor);
  w->has_cuda = true;
  /* free, not total: what a job can still take (docs/operations.md, Admission) */
  w->gpu_memory_bytes = info.free_bytes;
  w->gpu_workspace_bytes = zb_cublas_workspace_bytes(info.cc_major);
  if (info.standin)
    ZB_WARN("using the CPU stand-in of CUDA (tests only): %s", w->gpu);
  else
    ZB_INFO("GPU %d: %s", ordinal, w->gpu);
}

#else

void worker_gpu_probe(worker *w, int ordinal) {
  (void)ordinal;
  w->has_cuda = false;
  w->gpu[0] = 0;
  ZB_DEBUG("built without CUDA: offering no cuda backend");
}

#endif
