/* kernels_standin_step.c — the optimizer step's fused launchers of
 * model/zb_cuda_kernels.h (zbk_adamw_multi, zbk_sumsq_multi) as host loops
 * on the CPU stand-in's streams (test-only; docs/model.md, The CPU
 * stand-in, and Optimizer and step). Each element is zbm_adamw_at and each
 * block of the norm zbm_norm_block (model/zb_kernel_math.h), the functions
 * and summation order kernels_cuda_step.cu's threads follow, so the
 * stand-in's norm is the GPU's bit for bit; the chunks' partials go through
 * the caller's scratch slots as on the GPU.
 *
 * Like kernels_standin.c's launchers: every device range is checked and
 * translated to the stand-in's view (standin.h) at the launch, the loop is
 * enqueued on stream s, the status is what cudaGetLastError says after
 * the launch; injectable like every launcher.
 */
#include <stdlib.h>
#include <string.h>

#include "standin_internal.h"
#include "zb_cuda_kernels.h"

typedef struct adamw_job {
  int count, mode;
  zbm_adamw_tensor t[]; /* pointers already the stand-in's views */
} adamw_job;

static cudaError_t adamw_run(void *arg) {
  const adamw_job *j = arg;
  for (int k = 0; k < j->count; k++)
    for (size_t i = 0; i < j->t[k].n; i++)
      zbm_adamw_at(&j->t[k], i, j->mode);
  return cudaSuccess;
}

/* Swaps *p (n elements of size bytes) for its view; false after a failed check. */
static bool view_of(void *pp, size_t bytes, const char *api) {
  void **p = pp;
  *p = standin_view(*p, bytes, api);
  return *p != NULL;
}

static cudaError_t enqueue(cudaStream_t s, standin_fn fn, void *job) {
  cudaError_t e = standin_enqueue(s, fn, job, free);
  if (e != cudaSuccess) {
    free(job);
    return standin_set_last(e);
  }
  return cudaGetLastError();
}

cudaError_t zbk_adamw_multi(cudaStream_t s, const zbm_adamw_tensor *t, int count, int mode) {
  const char *api = "zbk_adamw_multi";
  if (count < 0 || mode < ZBM_ADAMW_FULL || mode > ZBM_ADAMW_COMMIT || (count && !t))
    return standin_set_last(cudaErrorInvalidValue);
  if (standin_inject(api, NULL)) /* as a launch that cannot run (standin_fail.c) */
    return standin_set_last(cudaErrorLaunchOutOfResources);
  adamw_job *j = malloc(sizeof *j + (size_t)count * sizeof *t);
  if (!j)
    return standin_set_last(cudaErrorMemoryAllocation);
  j->count = count;
  j->mode = mode;
  for (int k = 0; k < count; k++) {
    zbm_adamw_tensor *v = &j->t[k];
    *v = t[k];
    size_t fb = v->n * sizeof(float);
    if (v->n && !(view_of(&v->p, fb, api) && view_of(&v->m, fb, api) && view_of(&v->v, fb, api) &&
                  view_of(&v->g, fb, api) && view_of(&v->decay, v->n, api) &&
                  (mode != ZBM_ADAMW_TRY || view_of(&v->keep, fb, api)))) {
      free(j);
      return standin_set_last(cudaErrorInvalidValue);
    }
  }
  return enqueue(s, adamw_run, j);
}

typedef struct norm_job {
  int count;
  double *part, *sums; /* views */
  int *part_bad, *bad;
  struct {
    const float *x;
    size_t n;
  } a[];
} norm_job;

static cudaError_t norm_run(void *arg) {
  const norm_job *j = arg;
  size_t base = 0;
  for (int k = 0; k < j->count; k++) { /* pass 1, chunk by chunk, into the slots */
    for (size_t c = 0; c < zbm_norm_chunks(j->a[k].n); c++) {
      size_t at = c * ZBM_NORM_CHUNK, len = j->a[k].n - at;
      j->part_bad[base + c] = 0;
      j->part[base + c] = zbm_norm_block(j->a[k].x + at, NULL, len < ZBM_NORM_CHUNK ? len : ZBM_NORM_CHUNK,
                                         &j->part_bad[base + c]);
    }
    base += zbm_norm_chunks(j->a[k].n);
  }
  base = 0;
  for (int k = 0; k < j->count; k++) { /* pass 2, array by array, from the slots */
    size_t chunks = zbm_norm_chunks(j->a[k].n);
    j->bad[k] = 0;
    for (size_t c = 0; c < chunks; c++)
      j->bad[k] |= j->part_bad[base + c];
    j->sums[k] = zbm_norm_block(NULL, j->part + base, chunks, NULL);
    base += chunks;
  }
  return cudaSuccess;
}

cudaError_t zbk_sumsq_multi(cudaStream_t s, const float *const *x, const size_t *n, int count, double *part,
                            int *part_bad, double *sums, int *bad) {
  const char *api = "zbk_sumsq_multi";
  if (count < 0 || (count && (!x || !n)))
    return standin_set_last(cudaErrorInvalidValue);
  if (count == 0)
    return cudaSuccess;
  if (standin_inject(api, NULL))
    return standin_set_last(cudaErrorLaunchOutOfResources);
  norm_job *j = malloc(sizeof *j + (size_t)count * sizeof j->a[0]);
  if (!j)
    return standin_set_last(cudaErrorMemoryAllocation);
  size_t chunks = 0;
  bool ok = true;
  j->count = count;
  for (int k = 0; k < count && ok; k++) {
    j->a[k].x = x[k];
    j->a[k].n = n[k];
    chunks += zbm_norm_chunks(n[k]);
    ok = !n[k] || view_of(&j->a[k].x, n[k] * sizeof(float), api);
  }
  j->part = part;
  j->part_bad = part_bad;
  j->sums = sums;
  j->bad = bad;
  size_t slots = chunks ? chunks : 1;
  if (!ok || !view_of(&j->part, slots * sizeof(double), api) ||
      !view_of(&j->part_bad, slots * sizeof(int), api) ||
      !view_of(&j->sums, (size_t)count * sizeof(double), api) ||
      !view_of(&j->bad, (size_t)count * sizeof(int), api)) {
    free(j);
    return standin_set_last(cudaErrorInvalidValue);
  }
  return enqueue(s, norm_run, j);
}
