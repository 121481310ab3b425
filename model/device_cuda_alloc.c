/* device_cuda_alloc.c — the CUDA device's caching allocator
 * (device_cuda.c has the contract: size classes, free lists, exact
 * current and peak bytes, and why reusing a block at once is safe).
 *
 * Exact mode (d->exact, on when the device is the CPU stand-in): every
 * block is its own cudaMalloc of exactly the bytes asked for and every free
 * is a cudaFreeAsync on the device's stream: stream-ordered, as the cache's
 * reuse is, without a wait for the device (a cudaFree would serialise the
 * host with the device at every free and hide any overlap).
 * A freed block is then freed to the stand-in too, and its range checks
 * name a use after free or a read one element past a block, which a cached,
 * rounded-up block would hide (docs/model.md, The CPU stand-in). */
#include <cuda_runtime.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "device_cuda_internal.h"

/* Rounds bytes up to its class's size; *cls gets the class. */
static size_t size_class(size_t bytes, int *cls) {
  if (bytes <= 512) {
    *cls = 0;
    return 512;
  }
  int k = 63 - __builtin_clzll((unsigned long long)(bytes - 1)); /* 2^k < bytes <= 2^(k+1) */
  size_t step = (size_t)1 << (k - 2);
  size_t r = (bytes + step - 1) / step * step; /* 5..8 steps */
  *cls = 1 + (k - 9) * 4 + (int)(r / step - 5);
  return r;
}

static size_t live_slot(const cuda_dev *d, const void *p) {
  uintptr_t h = (uintptr_t)p;
  h ^= h >> 17;
  h *= 0x9e3779b97f4a7c15ull;
  return (size_t)(h >> 20) & (d->live_cap - 1);
}

static bool live_put(cuda_dev *d, void *p, size_t asked, size_t size) {
  if ((d->live_n + 1) * 2 > d->live_cap) {
    size_t old_cap = d->live_cap, cap = old_cap ? old_cap * 2 : 64;
    live_block *old = d->live, *tab = calloc(cap, sizeof *tab);
    if (!tab)
      return false;
    d->live = tab;
    d->live_cap = cap;
    d->live_n = 0;
    for (size_t i = 0; i < old_cap; i++)
      if (old[i].p)
        live_put(d, old[i].p, old[i].asked, old[i].size);
    free(old);
  }
  size_t i = live_slot(d, p);
  while (d->live[i].p)
    i = (i + 1) & (d->live_cap - 1);
  d->live[i] = (live_block){p, asked, size};
  d->live_n++;
  return true;
}

/* Removes p's entry (backward-shift deletion keeps probe chains whole). */
static bool live_take(cuda_dev *d, void *p, live_block *out) {
  if (!d->live_cap)
    return false;
  size_t mask = d->live_cap - 1, i = live_slot(d, p);
  while (d->live[i].p != p) {
    if (!d->live[i].p)
      return false;
    i = (i + 1) & mask;
  }
  *out = d->live[i];
  for (size_t j = (i + 1) & mask; d->live[j].p; j = (j + 1) & mask) {
    size_t home = live_slot(d, d->live[j].p);
    /* entry j may move to the hole at i unless its home lies in (i, j] */
    if (((j - home) & mask) >= ((j - i) & mask)) {
      d->live[i] = d->live[j];
      i = j;
    }
  }
  d->live[i].p = NULL;
  d->live_n--;
  return true;
}

/* A block of `size` bytes came from cudaMalloc: held grows; at a new high
 * the device's own used figure is sampled beside it (cudaMemGetInfo), so
 * the two are reported from the same moment (docs/model.md, Memory
 * accounting). Only here: a cache hit holds nothing new. */
static zb_err note_held(cuda_dev *d, size_t size, zb_diag *diag) {
  d->mem.held += (int64_t)size;
  if (d->mem.held <= d->mem.held_peak)
    return ZB_OK;
  d->mem.held_peak = d->mem.held;
  size_t free_b = 0, total_b = 0;
  zb_err err = cuda_ok(d, diag, cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  if (!err)
    d->mem.device_used = (int64_t)(total_b - free_b);
  return err;
}

/* Gives every cached block back to CUDA. */
static void release_cache(cuda_dev *d) {
  for (int c = 0; c < N_CLASSES; c++) {
    for (int i = 0; i < d->free[c].n; i++)
      cudaFree(d->free[c].p[i]);
    d->free[c].n = 0;
  }
  d->mem.held -= d->mem.cached; /* cached counts the rounded sizes */
  d->mem.cached = 0;
}

/* A block of at least `bytes` for a caller (cuda_alloc) or for the
 * device itself (the workspace): from the cache or cudaMalloc, entered in
 * the live table; held is counted here, current by the caller. */
static zb_err alloc_block(cuda_dev *d, size_t bytes, void **out, zb_diag *diag) {
  int cls = 0;
  size_t size = d->exact ? (bytes ? bytes : 1) : size_class(bytes, &cls);
  void *p = NULL;
  free_list *fl = d->exact ? NULL : &d->free[cls];
  if (fl && fl->n > 0) {
    p = fl->p[--fl->n];
    d->mem.cached -= (int64_t)size;
  } else {
    cudaError_t e = cudaMalloc(&p, size);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError(); /* not sticky: clear it, free the cache, try again */
      release_cache(d);
      e = cudaMalloc(&p, size);
    }
    if (e != cudaSuccess)
      return cuda_fail(d, diag, ZB_ERR_IO,
                       "cuda device %d: cudaMalloc of %zu bytes (%lld in use, %lld cached): %s", d->ordinal,
                       size, (long long)d->mem.current, (long long)d->mem.cached, cudaGetErrorString(e));
    zb_err err = note_held(d, size, diag);
    if (err) {
      cudaFree(p);
      d->mem.held -= (int64_t)size;
      return err;
    }
  }
  if (!live_put(d, p, bytes, size)) {
    cudaFree(p);
    d->mem.held -= (int64_t)size;
    return cuda_fail(d, diag, ZB_ERR_IO, "cuda device %d: out of host memory for the allocator's table",
                     d->ordinal);
  }
  *out = p;
  return ZB_OK;
}

zb_err cuda_alloc(void *self, size_t bytes, void **out, zb_diag *diag) {
  cuda_dev *d = self;
  if (!out || bytes > MAX_BYTES)
    return cuda_bad_arg(diag, "alloc", !out ? "no output pointer" : "more than 2^62 bytes asked for");
  *out = NULL;
  zb_err err = cuda_enter(d, diag);
  if (err || (err = alloc_block(d, bytes, out, diag)))
    return err;
  d->mem.current += (int64_t)bytes;
  if (d->mem.current > d->mem.peak)
    d->mem.peak = d->mem.current;
  return ZB_OK;
}

zb_err cuda_workspace_alloc(cuda_dev *d, size_t bytes, void **out, zb_diag *diag) {
  zb_err err = alloc_block(d, bytes, out, diag);
  if (!err)
    d->mem.workspace = (int64_t)bytes;
  return err;
}

void cuda_free(void *self, void *p) {
  cuda_dev *d = self;
  live_block b;
  if (!p)
    return;
  if (!live_take(d, p, &b)) {
    /* a caller's bug; poisoning makes the next call report it */
    cuda_fail(d, NULL, ZB_ERR_INVALID_ARG, "cuda device %d: free of %p, which this device did not hand out",
              d->ordinal, p);
    return;
  }
  if (d->exact) { /* stream-ordered: work queued before still reads p */
    d->mem.current -= (int64_t)b.asked;
    d->mem.held -= (int64_t)b.size;
    cuda_ok(d, NULL, cudaFreeAsync(p, d->stream), "cudaFreeAsync"); /* an error poisons: the next call says */
    return;
  }
  int cls;
  size_class(b.size, &cls);
  free_list *fl = &d->free[cls];
  if (fl->n == fl->cap) {
    int cap = fl->cap ? fl->cap * 2 : 8;
    void **np = realloc(fl->p, (size_t)cap * sizeof *np);
    if (!np) { /* cannot cache it: give it back to CUDA (cudaFree waits for the device) */
      cudaFree(p);
      d->mem.current -= (int64_t)b.asked;
      d->mem.held -= (int64_t)b.size;
      return;
    }
    fl->p = np;
    fl->cap = cap;
  }
  fl->p[fl->n++] = p;
  d->mem.current -= (int64_t)b.asked;
  d->mem.cached += (int64_t)b.size;
}

void cuda_mem(void *self, zb_device_mem *out) {
  *out = ((cuda_dev *)self)->mem;
}

void cuda_reset_peak(void *self) {
  cuda_dev *d = self;
  d->mem.peak = d->mem.current;
}

void cuda_alloc_destroy(cuda_dev *d) {
  release_cache(d);
  for (size_t i = 0; i < d->live_cap; i++) /* blocks the caller never gave back */
    if (d->live[i].p)
      cudaFree(d->live[i].p);
  for (int c = 0; c < N_CLASSES; c++)
    free(d->free[c].p);
  free(d->live);
}
