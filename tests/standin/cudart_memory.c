/* cudart_memory.c — the CPU stand-in of the CUDA runtime's memory calls
 * (test-only; docs/model.md, The CPU stand-in): cudaMalloc/cudaFree,
 * pinned host memory, copies and memsets, with every pointer checked;
 * cudaMemGetInfo from the device bytes it tracks (and ZB_STANDIN_OTHER_BYTES).
 *
 * Device memory is host memory the stand-in tracks: a sorted table of live
 * allocations (device, and pinned host from cudaMallocHost), so any
 * pointer is classified as device, pinned, freed device or plain host.
 * cudaMalloc fills new memory with 0xff bytes (NaN as floats): a program
 * that reads memory it never wrote sees garbage, as on a GPU. cudaFree
 * waits for the device (as CUDA's does), poisons the memory the same way
 * and keeps it in a quarantine (the newest QUARANTINE_MAX frees, up to
 * QUARANTINE_BYTES), so a later use names the freed allocation instead of
 * landing in a new one. cudaFreeAsync frees in stream order: the pointer
 * stops being live at once (a later launch naming it is refused), and the
 * bytes are poisoned and quarantined when the stream reaches the free.
 * Device memory is mapped twice (map_device): the
 * pointer cudaMalloc returns has no access, so a host read of it faults as
 * on a GPU, and the stand-in works through its read-write view
 * (standin_view). Copies and memsets run on their stream; cudaMemcpy
 * and cudaMemset go to the legacy default stream, cudaMemcpy then waits.
 *
 * Errors: a bad pointer, wrong cudaMemcpyKind, use after free or range
 * past an allocation is cudaErrorInvalidValue with a message naming it
 * (standin_last_error, and stderr). Threads: g_mem guards the tables.
 */
#define _GNU_SOURCE /* memfd_create */
#include <cuda_runtime.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "standin_internal.h"

#define DEVICE_BYTES ((size_t)16 << 30)
/* ZB_STANDIN_OTHER_BYTES (environment): device bytes other processes hold,
 * so cudaMemGetInfo reports less free than the total and cudaMalloc runs
 * out sooner (a shared GPU; the worker's admission, tests/service). */
static size_t other_bytes(void) {
  const char *s = getenv("ZB_STANDIN_OTHER_BYTES");
  unsigned long long v = s ? strtoull(s, NULL, 10) : 0;
  return v < DEVICE_BYTES ? (size_t)v : DEVICE_BYTES;
}
#define QUARANTINE_MAX 1024
#define QUARANTINE_BYTES ((size_t)256 << 20)

typedef enum mem_kind { MEM_HOST, MEM_DEVICE, MEM_PINNED, MEM_FREED } mem_kind;

typedef struct alloc {
  char *base;
  size_t size;
  mem_kind kind;
  char *view;    /* device: the stand-in's read-write mapping of base's pages; else base */
  size_t mapped; /* device: bytes of each mapping (whole pages) */
} alloc;

static pthread_mutex_t g_mem = PTHREAD_MUTEX_INITIALIZER;
static alloc *g_live; /* sorted by base */
static size_t g_nlive, g_caplive, g_device_bytes;
static alloc g_freed[QUARANTINE_MAX]; /* ring, oldest at g_freed_head */
static size_t g_freed_head, g_nfreed, g_freed_bytes;
#define PENDING_MAX 4096
static alloc *g_pending[PENDING_MAX]; /* cudaFreeAsync'd, their stream not there yet; unordered */
static size_t g_npending;

/* Under g_mem: index of the live allocation holding p, or -1. */
static long find_live(const char *p) {
  size_t lo = 0, hi = g_nlive;
  while (lo < hi) { /* first base > p */
    size_t mid = (lo + hi) / 2;
    if (g_live[mid].base <= p)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == 0)
    return -1;
  const alloc *a = &g_live[lo - 1];
  return p < a->base + a->size ? (long)(lo - 1) : -1;
}

/* Under g_mem: what p points into; *a receives the allocation. */
static mem_kind classify(const void *vp, alloc *a) {
  const char *p = vp;
  long i = find_live(p);
  if (i >= 0) {
    *a = g_live[i];
    return a->kind;
  }
  for (size_t k = g_nfreed; k-- > 0;) {
    const alloc *f = &g_freed[(g_freed_head + k) % QUARANTINE_MAX];
    if (p >= f->base && p < f->base + f->size) {
      *a = *f;
      return MEM_FREED;
    }
  }
  for (size_t k = 0; k < g_npending; k++)
    if (p >= g_pending[k]->base && p < g_pending[k]->base + g_pending[k]->size) {
      *a = *g_pending[k];
      return MEM_FREED;
    }
  return MEM_HOST;
}

/* Checks [p, p+bytes) against the allocation a it lies in. */
static cudaError_t check_bounds(const char *p, size_t bytes, const alloc *a, const char *what) {
  size_t room = (size_t)(a->base + a->size - p);
  if (bytes <= room)
    return cudaSuccess;
  standin_error("%s: [%p, +%zu bytes) runs %zu bytes past the end of the %s allocation [%p, +%zu) "
                "(out of bounds)",
                what, (const void *)p, bytes, bytes - room, a->kind == MEM_DEVICE ? "device" : "pinned host",
                (void *)a->base, a->size);
  return cudaErrorInvalidValue;
}

static cudaError_t freed_error(const void *p, const alloc *a, const char *what) {
  standin_error("%s: %p is in device memory [%p, +%zu) already freed (use after free)", what, p,
                (void *)a->base, a->size);
  return cudaErrorInvalidValue;
}

cudaError_t standin_check_device(const void *p, size_t bytes, const char *what) {
  if (!p) {
    standin_error("%s: NULL where device memory belongs", what);
    return cudaErrorInvalidValue;
  }
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = classify(p, &a);
  pthread_mutex_unlock(&g_mem);
  switch (k) {
  case MEM_DEVICE: return check_bounds(p, bytes, &a, what);
  case MEM_FREED: return freed_error(p, &a, what);
  case MEM_PINNED:
    standin_error("%s: %p is pinned host memory (cudaMallocHost), not device memory", what, p);
    return cudaErrorInvalidValue;
  case MEM_HOST: break;
  }
  standin_error(
      "%s: %p is host memory, not a device allocation (host pointer where a device pointer belongs)", what,
      p);
  return cudaErrorInvalidValue;
}

cudaError_t standin_check_host(const void *p, size_t bytes, const char *what) {
  if (!p) {
    standin_error("%s: NULL where host memory belongs", what);
    return cudaErrorInvalidValue;
  }
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = classify(p, &a);
  pthread_mutex_unlock(&g_mem);
  switch (k) {
  case MEM_DEVICE:
    standin_error("%s: %p is device memory where host memory belongs (device pointer where a host pointer "
                  "belongs)",
                  what, p);
    return cudaErrorInvalidValue;
  case MEM_FREED: return freed_error(p, &a, what);
  case MEM_PINNED: return check_bounds(p, bytes, &a, what);
  case MEM_HOST: break;
  }
  return cudaSuccess;
}

bool standin_is_device(const void *p) {
  alloc a;
  pthread_mutex_lock(&g_mem);
  bool dev = p && classify(p, &a) == MEM_DEVICE;
  pthread_mutex_unlock(&g_mem);
  return dev;
}

void *standin_view(const void *p, size_t bytes, const char *what) {
  if (standin_check_device(p, bytes, what) != cudaSuccess)
    return NULL;
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = classify(p, &a);
  pthread_mutex_unlock(&g_mem);
  /* freed between the check and here: a race in the caller, named as such */
  return k == MEM_DEVICE ? a.view + ((const char *)p - a.base) : standin_view(p, bytes, what);
}

size_t standin_room(const void *vp) {
  const char *p = vp;
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = p ? classify(p, &a) : MEM_HOST;
  pthread_mutex_unlock(&g_mem);
  return k == MEM_DEVICE ? (size_t)(a.base + a.size - p) : 0;
}

/* The view of p when p is live device memory; p itself otherwise (host
 * memory, or a pointer the caller has checked already). */
static void *view_or_self(const void *p) {
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = p ? classify(p, &a) : MEM_HOST;
  pthread_mutex_unlock(&g_mem);
  return k == MEM_DEVICE ? a.view + ((const char *)p - a.base) : (void *)(uintptr_t)p;
}

/* What CUDA says of a pointer: device (a live allocation), host (pinned
 * by cudaMallocHost) or unregistered (plain host memory, CUDA 11 and
 * later); a freed device pointer is an error, as in CUDA. */
cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes *attributes, const void *ptr) {
  if (!attributes)
    return cudaErrorInvalidValue;
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = ptr ? classify(ptr, &a) : MEM_HOST;
  pthread_mutex_unlock(&g_mem);
  memset(attributes, 0, sizeof *attributes);
  switch (k) {
  case MEM_DEVICE:
    attributes->type = cudaMemoryTypeDevice;
    attributes->devicePointer = (void *)(uintptr_t)ptr;
    return cudaSuccess;
  case MEM_PINNED:
    attributes->type = cudaMemoryTypeHost;
    attributes->hostPointer = attributes->devicePointer = (void *)(uintptr_t)ptr;
    return cudaSuccess;
  case MEM_FREED:
    standin_error("cudaPointerGetAttributes: %p was freed (use after free)", ptr);
    return cudaErrorInvalidValue;
  case MEM_HOST: break;
  }
  attributes->type = cudaMemoryTypeUnregistered;
  attributes->device = -2;
  return cudaSuccess;
}

/* ---- allocation ---- */

/* Under g_mem. */
static bool insert_live(alloc a) {
  if (g_nlive == g_caplive) {
    size_t cap = g_caplive ? 2 * g_caplive : 256;
    alloc *n = realloc(g_live, cap * sizeof *n);
    if (!n)
      return false;
    g_live = n;
    g_caplive = cap;
  }
  size_t i = 0;
  while (i < g_nlive && g_live[i].base < a.base)
    i++;
  memmove(g_live + i + 1, g_live + i, (g_nlive - i) * sizeof *g_live);
  g_live[i] = a;
  g_nlive++;
  return true;
}

/* Device memory: one memfd mapped twice, PROT_NONE (the device address)
 * and read-write (the view). The fd is closed at once; the mappings keep
 * the pages. Outside malloc, so ASan and LeakSanitizer leave it alone. */
static bool map_device(size_t size, alloc *a) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE), len = (size + page - 1) / page * page;
  int fd = memfd_create("zb-standin-device", MFD_CLOEXEC);
  if (fd < 0)
    return false;
  void *rw = MAP_FAILED, *none = MAP_FAILED;
  if (ftruncate(fd, (off_t)len) == 0) {
    rw = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    none = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
  }
  close(fd);
  if (rw == MAP_FAILED || none == MAP_FAILED) {
    if (rw != MAP_FAILED)
      munmap(rw, len);
    if (none != MAP_FAILED)
      munmap(none, len);
    return false;
  }
  *a = (alloc){none, size, MEM_DEVICE, rw, len};
  return true;
}

static void unmap_device(const alloc *a) {
  munmap(a->base, a->mapped);
  munmap(a->view, a->mapped);
}

static cudaError_t alloc_kind(void **out, size_t size, mem_kind kind, const char *what) {
  if (!out) {
    standin_error("%s: NULL result pointer", what);
    return standin_set_last(cudaErrorInvalidValue);
  }
  *out = NULL;
  if (size == 0)
    return cudaSuccess;
  pthread_mutex_lock(&g_mem);
  size_t used = g_device_bytes + other_bytes();
  pthread_mutex_unlock(&g_mem);
  bool room = kind != MEM_DEVICE || size <= DEVICE_BYTES - used;
  alloc a = {NULL, size, kind, NULL, 0};
  if (room && kind == MEM_DEVICE && !map_device(size, &a))
    a.base = NULL;
  else if (room && kind != MEM_DEVICE && size <= SIZE_MAX - 255) /* 256-byte aligned, as CUDA's */
    a.base = a.view = aligned_alloc(256, (size + 255) & ~(size_t)255);
  if (!a.base) {
    standin_error("%s(%zu bytes): out of memory (%zu of %zu device bytes in use)", what, size, used,
                  DEVICE_BYTES);
    return standin_set_last(cudaErrorMemoryAllocation);
  }
  if (kind == MEM_DEVICE)
    memset(a.view, 0xff, size);
  pthread_mutex_lock(&g_mem);
  bool ok = insert_live(a);
  if (ok && kind == MEM_DEVICE)
    g_device_bytes += size;
  pthread_mutex_unlock(&g_mem);
  if (!ok) {
    if (kind == MEM_DEVICE)
      unmap_device(&a);
    else
      free(a.base);
    return standin_set_last(cudaErrorMemoryAllocation);
  }
  *out = a.base;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **devPtr, size_t size) {
  if (standin_inject("cudaMalloc", STANDIN_SITE))
    return standin_set_last(cudaErrorMemoryAllocation);
  return alloc_kind(devPtr, size, MEM_DEVICE, "cudaMalloc");
}

cudaError_t cudaMallocHost(void **ptr, size_t size) {
  if (standin_inject("cudaMallocHost", STANDIN_SITE))
    return standin_set_last(cudaErrorMemoryAllocation);
  return alloc_kind(ptr, size, MEM_PINNED, "cudaMallocHost");
}

/* Under g_mem: the live allocation based exactly at p, removed from the table. */
static cudaError_t take_live(void *p, mem_kind kind, const char *what, alloc *out) {
  alloc a;
  mem_kind k = classify(p, &a);
  if (k == MEM_FREED)
    return freed_error(p, &a, what);
  if (k != kind || a.base != (char *)p) {
    standin_error("%s: %p is not the start of a live %s allocation (%s)", what, p,
                  kind == MEM_DEVICE ? "device (cudaMalloc)" : "pinned host (cudaMallocHost)",
                  k == MEM_HOST     ? "host memory"
                  : k == MEM_DEVICE ? "device memory"
                  : k == MEM_PINNED ? "pinned host memory"
                                    : "inside an allocation");
    return cudaErrorInvalidValue;
  }
  long i = find_live(p);
  memmove(g_live + i, g_live + i + 1, (g_nlive - (size_t)i - 1) * sizeof *g_live);
  g_nlive--;
  if (g_nlive == 0) {
    free(g_live);
    g_live = NULL;
    g_caplive = 0;
  }
  *out = a;
  return cudaSuccess;
}

/* Under g_mem: keeps a freed device allocation, poisoned, so a later use is named. */
static void quarantine(alloc a) {
  memset(a.view, 0xff, a.size);
  while (g_nfreed > 0 && (g_nfreed == QUARANTINE_MAX || g_freed_bytes + a.size > QUARANTINE_BYTES)) {
    alloc *old = &g_freed[g_freed_head];
    unmap_device(old);
    g_freed_bytes -= old->size;
    g_freed_head = (g_freed_head + 1) % QUARANTINE_MAX;
    g_nfreed--;
  }
  g_freed[(g_freed_head + g_nfreed) % QUARANTINE_MAX] = a;
  g_nfreed++;
  g_freed_bytes += a.size;
}

cudaError_t cudaFree(void *devPtr) {
  if (!devPtr)
    return cudaSuccess;
  cudaError_t e = cudaDeviceSynchronize(); /* cudaFree waits for the device */
  alloc a;
  pthread_mutex_lock(&g_mem);
  cudaError_t fe = take_live(devPtr, MEM_DEVICE, "cudaFree", &a);
  if (fe == cudaSuccess) {
    g_device_bytes -= a.size;
    quarantine(a);
  }
  pthread_mutex_unlock(&g_mem);
  return standin_set_last(fe != cudaSuccess ? fe : e);
}

/* cudaFreeAsync's item: nothing to run; its release, which runs on the
 * stream's thread once every earlier item of the stream has (also on a
 * poisoned stream), poisons the memory and quarantines it. */
static cudaError_t free_async_run(void *arg) {
  (void)arg;
  return cudaSuccess;
}

static void free_async_release(void *arg) {
  pthread_mutex_lock(&g_mem);
  for (size_t k = 0; k < g_npending; k++)
    if (g_pending[k] == arg) {
      g_pending[k] = g_pending[--g_npending];
      break;
    }
  quarantine(*(alloc *)arg);
  pthread_mutex_unlock(&g_mem);
  free(arg);
}

/* Stream-ordered free (CUDA 11.2+): p stops being live at once, so a later
 * launch naming it is refused, while work already queued on s still reads
 * it; the bytes are poisoned and quarantined when s reaches the free. */
cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s) {
  if (!devPtr)
    return cudaSuccess;
  if (standin_inject("cudaFreeAsync", STANDIN_SITE))
    return standin_set_last(cudaErrorInvalidValue);
  alloc *a = malloc(sizeof *a);
  if (!a)
    return standin_set_last(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&g_mem);
  bool room = g_npending < PENDING_MAX;
  pthread_mutex_unlock(&g_mem);
  if (!room) /* the pending table is full: let the stream catch up first */
    cudaStreamSynchronize(s);
  pthread_mutex_lock(&g_mem);
  cudaError_t fe = take_live(devPtr, MEM_DEVICE, "cudaFreeAsync", a);
  if (fe == cudaSuccess) {
    g_device_bytes -= a->size;
    if (g_npending < PENDING_MAX) /* else named as host memory until its stream gets there */
      g_pending[g_npending++] = a;
  }
  pthread_mutex_unlock(&g_mem);
  if (fe != cudaSuccess) {
    free(a);
    return standin_set_last(fe);
  }
  cudaError_t e = standin_enqueue(s, free_async_run, a, free_async_release);
  if (e != cudaSuccess) /* no such stream: free it now, as a synchronous free would */
    free_async_release(a);
  return standin_set_last(e);
}

/* What the device has free: its 16 GiB less the live device allocations
 * (a cudaFreeAsync'd block is free at once, as CUDA's pool reports it)
 * and what other processes hold (other_bytes). */
cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total) {
  if (standin_inject("cudaMemGetInfo", STANDIN_SITE))
    return standin_set_last(cudaErrorInvalidValue);
  if (!free_bytes || !total) {
    standin_error("cudaMemGetInfo: NULL result pointer");
    return standin_set_last(cudaErrorInvalidValue);
  }
  pthread_mutex_lock(&g_mem);
  *free_bytes = DEVICE_BYTES - other_bytes() - g_device_bytes;
  pthread_mutex_unlock(&g_mem);
  *total = DEVICE_BYTES;
  return cudaSuccess;
}

cudaError_t cudaFreeHost(void *ptr) {
  if (!ptr)
    return cudaSuccess;
  cudaError_t e = cudaDeviceSynchronize();
  alloc a;
  pthread_mutex_lock(&g_mem);
  cudaError_t fe = take_live(ptr, MEM_PINNED, "cudaFreeHost", &a);
  pthread_mutex_unlock(&g_mem);
  if (fe == cudaSuccess)
    free(a.base);
  return standin_set_last(fe != cudaSuccess ? fe : e);
}

/* ---- copies ---- */

typedef struct copy_job {
  char *dst;
  const char *src;
  size_t dpitch, spitch, width, rows;
  int value; /* memset: the byte; -1 for a copy */
} copy_job;

static cudaError_t copy_run(void *arg) {
  const copy_job *j = arg;
  for (size_t r = 0; r < j->rows; r++) {
    if (j->value >= 0)
      memset(j->dst + r * j->dpitch, j->value, j->width);
    else
      memcpy(j->dst + r * j->dpitch, j->src + r * j->spitch, j->width);
  }
  return cudaSuccess;
}

static const char *kind_name(enum cudaMemcpyKind k) {
  switch (k) {
  case cudaMemcpyHostToHost: return "HostToHost";
  case cudaMemcpyHostToDevice: return "HostToDevice";
  case cudaMemcpyDeviceToHost: return "DeviceToHost";
  case cudaMemcpyDeviceToDevice: return "DeviceToDevice";
  default: return "Default";
  }
}

/* Checks one side of a copy: `dev` says which memory the kind promises. */
static cudaError_t check_side(const void *p, size_t bytes, bool dev, const char *api,
                              enum cudaMemcpyKind kind, const char *side) {
  char what[96];
  snprintf(what, sizeof what, "%s(%s) %s", api, kind_name(kind), side);
  return dev ? standin_check_device(p, bytes, what) : standin_check_host(p, bytes, what);
}

/* Validates a (2D) copy; the extents are the bytes each side spans. */
static cudaError_t check_copy(void *dst, size_t dst_extent, const void *src, size_t src_extent,
                              enum cudaMemcpyKind kind, const char *api) {
  bool ddev, sdev;
  switch (kind) {
  case cudaMemcpyHostToHost: ddev = sdev = false; break;
  case cudaMemcpyHostToDevice: ddev = true, sdev = false; break;
  case cudaMemcpyDeviceToHost: ddev = false, sdev = true; break;
  case cudaMemcpyDeviceToDevice: ddev = sdev = true; break;
  case cudaMemcpyDefault: {
    alloc a;
    pthread_mutex_lock(&g_mem);
    mem_kind dk = dst ? classify(dst, &a) : MEM_HOST, sk = src ? classify(src, &a) : MEM_HOST;
    pthread_mutex_unlock(&g_mem);
    /* a freed pointer is checked as device memory, so it is named */
    ddev = dk == MEM_DEVICE || dk == MEM_FREED;
    sdev = sk == MEM_DEVICE || sk == MEM_FREED;
    break;
  }
  default:
    standin_error("%s: %d is not a cudaMemcpyKind", api, (int)kind);
    return cudaErrorInvalidMemcpyDirection;
  }
  cudaError_t e = check_side(dst, dst_extent, ddev, api, kind, "destination");
  if (e == cudaSuccess)
    e = check_side(src, src_extent, sdev, api, kind, "source");
  return e;
}

/* j's pointers are checked already; the job gets their views. */
static cudaError_t enqueue_copy(const copy_job *j, cudaStream_t s) {
  copy_job *c = malloc(sizeof *c);
  if (!c)
    return cudaErrorMemoryAllocation;
  *c = *j;
  c->dst = view_or_self(j->dst);
  c->src = j->src ? view_or_self(j->src) : NULL;
  cudaError_t e = standin_enqueue(s, copy_run, c, free);
  if (e != cudaSuccess)
    free(c);
  return e;
}

/* A copy whose source bytes were taken when it was issued (owns them). */
static void snapshot_free(void *arg) {
  copy_job *c = arg;
  free((void *)(uintptr_t)c->src);
  free(c);
}

/* True when p is pageable host memory: neither device memory nor pinned. */
static bool pageable(const void *p) {
  alloc a;
  pthread_mutex_lock(&g_mem);
  mem_kind k = p ? classify(p, &a) : MEM_HOST;
  pthread_mutex_unlock(&g_mem);
  return k == MEM_HOST;
}

/* cudaMemcpyAsync with CUDA's documented behaviour for pageable host
 * memory: from it to the device, the source is consumed before the call
 * returns (here: copied aside, then written in stream order); from the
 * device to it, the call returns once the copy has completed. Pinned memory
 * (cudaMallocHost) is fully asynchronous, so a missing synchronisation
 * reads stale data there, which the delay knob makes certain. */
static cudaError_t copy_async(void *dst, const void *src, size_t count, cudaStream_t s) {
  bool from_pageable = pageable(src) && !pageable(dst), to_pageable = pageable(dst) && !pageable(src);
  if (from_pageable) {
    copy_job *c = malloc(sizeof *c);
    void *snap = malloc(count);
    if (!c || !snap) {
      free(c);
      free(snap);
      return cudaErrorMemoryAllocation;
    }
    memcpy(snap, src, count);
    *c = (copy_job){view_or_self(dst), snap, count, count, count, 1, -1};
    cudaError_t e = standin_enqueue(s, copy_run, c, snapshot_free);
    if (e != cudaSuccess)
      snapshot_free(c);
    return e;
  }
  cudaError_t e = enqueue_copy(&(copy_job){dst, src, count, count, count, 1, -1}, s);
  return e == cudaSuccess && to_pageable ? cudaStreamSynchronize(s) : e;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t s) {
  if (standin_inject("cudaMemcpyAsync", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  if (count == 0)
    return cudaSuccess;
  cudaError_t e = check_copy(dst, count, src, count, kind, "cudaMemcpyAsync");
  if (e == cudaSuccess)
    e = copy_async(dst, src, count, s);
  return standin_set_last(e);
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t count, enum cudaMemcpyKind kind) {
  if (standin_inject("cudaMemcpy", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  if (count == 0)
    return cudaSuccess;
  cudaError_t e = check_copy(dst, count, src, count, kind, "cudaMemcpy");
  if (e == cudaSuccess)
    e = enqueue_copy(&(copy_job){dst, src, count, count, count, 1, -1}, 0);
  if (e == cudaSuccess)
    e = cudaStreamSynchronize(0);
  return standin_set_last(e);
}

cudaError_t cudaMemcpy2DAsync(void *dst, size_t dpitch, const void *src, size_t spitch, size_t width,
                              size_t height, enum cudaMemcpyKind kind, cudaStream_t s) {
  if (standin_inject("cudaMemcpy2DAsync", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  if (width > dpitch || width > spitch) {
    standin_error("cudaMemcpy2DAsync: width %zu exceeds a pitch (dpitch %zu, spitch %zu)", width, dpitch,
                  spitch);
    return standin_set_last(cudaErrorInvalidPitchValue);
  }
  if (width == 0 || height == 0)
    return cudaSuccess;
  if (height - 1 > (SIZE_MAX - width) / dpitch || height - 1 > (SIZE_MAX - width) / spitch) {
    standin_error("cudaMemcpy2DAsync: %zu rows overflow the address space", height);
    return standin_set_last(cudaErrorInvalidValue);
  }
  size_t dext = (height - 1) * dpitch + width, sext = (height - 1) * spitch + width;
  cudaError_t e = check_copy(dst, dext, src, sext, kind, "cudaMemcpy2DAsync");
  if (e == cudaSuccess)
    e = enqueue_copy(&(copy_job){dst, src, dpitch, spitch, width, height, -1}, s);
  return standin_set_last(e);
}

cudaError_t cudaMemsetAsync(void *p, int value, size_t count, cudaStream_t s) {
  if (standin_inject("cudaMemsetAsync", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  if (count == 0)
    return cudaSuccess;
  cudaError_t e = standin_check_device(p, count, "cudaMemsetAsync");
  if (e == cudaSuccess)
    e = enqueue_copy(&(copy_job){p, NULL, count, count, count, 1, value & 0xff}, s);
  return standin_set_last(e);
}

/* Asynchronous with respect to the host for device memory, as in CUDA. */
cudaError_t cudaMemset(void *p, int value, size_t count) {
  if (standin_inject("cudaMemset", STANDIN_SITE))
    return standin_set_last(cudaErrorLaunchFailure);
  if (count == 0)
    return cudaSuccess;
  cudaError_t e = standin_check_device(p, count, "cudaMemset");
  if (e == cudaSuccess)
    e = enqueue_copy(&(copy_job){p, NULL, count, count, count, 1, value & 0xff}, 0);
  return standin_set_last(e);
}
