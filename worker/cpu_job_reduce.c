/* cpu_job_reduce.c — a cpu job's gradient reduction across data-parallel
 * replicas (cpu_job.h; docs/model.md, Data parallelism). */
#include <stdint.h>
#include <stdlib.h>

#include "cpu_job.h"
#include "zb_alloc.h"

/* The hosted index of global stage `stage`, or -1. */
static int reduce_index(const cpu_job *cj, int stage) {
  for (int i = 0; i < cj->n_stages; i++)
    if (cj->stages[i] == stage)
      return i;
  return -1;
}

/* Reduces hosted stage i's gradients over its stage group, then scales
 * them by 1/d: each replica's are the mean over its m microbatches
 * (loss_scale 1/m), so the result is the mean over the global batch.
 * Without ZeRO-1 (or for a tied head's holder) an all-reduce, seq
 * 2 * iteration; with it a reduce-scatter that leaves this replica's
 * shard (cpu_job_zero.c), the only part scaled and stepped. A cuda job's
 * is only started here: cpu_job_reduce_device_finish scales it. */
static zb_err reduce_one(cpu_job *cj, zb_transport *tr, int i, int iteration, zb_diag *diag) {
  if (cj->device) { /* a cuda job: its stage group's NCCL all-reduce, started */
    zb_err derr = cpu_job_reduce_device_start(cj, i, diag);
    cj->reduced[i] = !derr;
    return derr;
  }
  int *ranks = zb_malloc(sizeof(int) * (size_t)cj->data_parallel);
  /* the seq from the iteration: every member agrees without keeping a
   * count, and a message of another iteration fails the tag check */
  int32_t seq = cj->zero ? cpu_job_zero_seq(iteration, CPU_JOB_ZERO_SEQ_REDUCE)
                         : (int32_t)(((int64_t)iteration * 2) % INT32_MAX);
  zb_ring ring = cpu_job_ring(cj, tr, cj->stages[i], seq, ranks);
  size_t n = zb_model_n_params(zb_backend_cpu_stage(cj->be, i, NULL));
  bool full = cpu_job_zero_full(cj, i);
  zb_err err = full ? zb_ring_all_reduce(&ring, cj->grads[i], n, diag)
                    : zb_ring_reduce_scatter(&ring, cj->grads[i], n, diag);
  free(ranks);
  if (err)
    return err;
  float scale = 1.0f / (float)cj->data_parallel;
  float *g = full ? cj->grads[i] : cj->gview[i];
  size_t len = full ? n : cj->shard_len[i];
  for (size_t k = 0; k < len; k++)
    g[k] *= scale;
  cj->reduced[i] = true;
  return ZB_OK;
}

/* The ring needs a transport; a cuda job's reduction its stage group
 * (cpu_job_reduce_device checks). */
static zb_err reduce_check(const cpu_job *cj, zb_transport *tr, zb_diag *diag) {
  if (cj->device)
    return ZB_OK;
  if (!tr)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "gradient reduction: no transport");
  return ZB_OK;
}

zb_err cpu_job_reduce_stage(void *ud, int stage, int iteration, zb_diag *diag) {
  cpu_job *cj = ud;
  if (cj->data_parallel <= 1)
    return ZB_OK;
  zb_err err = reduce_check(cj, cj->tr, diag);
  if (err)
    return err;
  int i = reduce_index(cj, stage);
  if (i < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_SCHEDULE, "REDUCE_GRAD of stage %d: rank %d does not host it",
                       stage, cj->rank);
  if (cj->reduced[i])
    return zb_diag_set(diag, ZB_ERR_INVALID_SCHEDULE,
                       "REDUCE_GRAD of stage %d: its gradients were reduced already this iteration", stage);
  return reduce_one(cj, cj->tr, i, iteration, diag);
}

zb_err cpu_job_reduce_wait(void *ud, int iteration, zb_diag *diag) {
  cpu_job *cj = ud;
  (void)iteration; /* the ring's reductions are done when the hook returns */
  if (cj->data_parallel <= 1 || !cj->device)
    return ZB_OK;
  return cpu_job_reduce_device_finish(cj, diag);
}

zb_err cpu_job_reduce_rest(cpu_job *cj, zb_transport *tr, int iteration, zb_diag *diag) {
  if (cj->data_parallel <= 1)
    return ZB_OK;
  zb_err err = reduce_check(cj, tr, diag);
  for (int i = 0; !err && i < cj->n_stages; i++)
    if (!cj->reduced[i])
      err = reduce_one(cj, tr, i, iteration, diag);
  if (!err) /* the step reads them: every started reduction done */
    err = cpu_job_reduce_wait(cj, iteration, diag);
  for (int i = 0; i < cj->n_stages; i++)
    cj->reduced[i] = cj->unscaled[i] = false;
  return err;
}
