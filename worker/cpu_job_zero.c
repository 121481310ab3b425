/* cpu_job_zero.c — ZeRO-1 optimizer sharding of a cpu job (docs/model.md,
 * Data parallelism: ZeRO-1): each replica steps its shard of every hosted
 * stage, its global check spans every replica's shard, and the updated
 * shards are all-gathered so every replica holds the whole parameters.
 * See cpu_job.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"
#include "zb_collective.h"

/* The check's partials travel as floats (the ring moves bits, never adds
 * them in an all-gather): a double sumsq and a double finite flag. */
#define CHECK_FLOATS 4

int32_t cpu_job_zero_seq(int iteration, int which) {
  return (int32_t)(((int64_t)iteration * CPU_JOB_ZERO_SEQS + which) % INT32_MAX);
}

zb_ring cpu_job_ring(const cpu_job *cj, zb_transport *tr, int32_t stage, int32_t seq, int *ranks) {
  for (int k = 0; k < cj->data_parallel; k++)
    ranks[k] = k * cj->nranks + cj->rank;
  return (zb_ring){
      .tr = tr, .size = cj->data_parallel, .index = cj->replica, .ranks = ranks, .stage = stage, .seq = seq};
}

bool cpu_job_zero_full(const cpu_job *cj, int i) {
  /* a tied head's holders sum whole tensors after the reduction
   * (cpu_job_tied.c), so their stages are all-reduced in full */
  return !cj->zero || (cpu_job_tied(cj) && (cj->stages[i] == 0 || cj->stages[i] == cj->total_stages - 1));
}

void cpu_job_zero_layout(cpu_job *cj) {
  size_t k = (size_t)(cj->n_stages ? cj->n_stages : 1);
  cj->shard_off = zb_calloc(k, sizeof *cj->shard_off);
  cj->shard_len = zb_calloc(k, sizeof *cj->shard_len);
  cj->pview = zb_calloc(k, sizeof *cj->pview);
  cj->gview = zb_calloc(k, sizeof *cj->gview);
  for (int i = 0; i < cj->n_stages; i++) {
    size_t n = zb_model_n_params(zb_backend_cpu_stage(cj->be, i, NULL));
    if (cj->zero)
      zb_ring_shard(n, cj->data_parallel, cj->replica, &cj->shard_off[i], &cj->shard_len[i]);
    else
      cj->shard_len[i] = n;
    cj->pview[i] = cj->params[i] + cj->shard_off[i];
    cj->gview[i] = cj->grads[i] + cj->shard_off[i];
  }
}

void cpu_job_zero_free(cpu_job *cj) {
  free(cj->shard_off);
  free(cj->shard_len);
  free(cj->pview);
  free(cj->gview);
}

size_t cpu_job_optimizer_bytes(const cpu_job *cj) {
  size_t n = 0;
  for (int i = 0; i < cj->n_stages; i++)
    n += zb_adamw_size(cj->opt[i]);
  return n * 2 * sizeof(float); /* m and v */
}

/* This rank's partial becomes its stage group's: every member's partial
 * (its shards of the same stages) all-gathered, then summed in member
 * order, so every replica holds the same bits. */
static zb_err zero_gather_check(const cpu_job *cj, zb_transport *tr, int iteration, zb_step_partial *p,
                                zb_diag *diag) {
  int d = cj->data_parallel;
  float *buf = zb_calloc((size_t)d * CHECK_FLOATS, sizeof(float));
  int *ranks = zb_malloc(sizeof(int) * (size_t)d);
  double mine[2] = {p->sumsq, p->finite ? 1 : 0};
  memcpy(buf + (size_t)cj->replica * CHECK_FLOATS, mine, sizeof mine);
  /* stage -1 with kind REDUCE_GRAD: no stage's reduction uses it */
  zb_ring ring = cpu_job_ring(cj, tr, -1, (int32_t)(iteration % INT32_MAX), ranks);
  zb_err err = zb_ring_all_gather(&ring, buf, (size_t)d * CHECK_FLOATS, diag);
  if (!err) {
    p->sumsq = 0;
    p->finite = true;
    for (int k = 0; k < d; k++) {
      double got[2];
      memcpy(got, buf + (size_t)k * CHECK_FLOATS, sizeof got);
      p->sumsq += got[0];
      p->finite = p->finite && got[1] != 0;
    }
  }
  free(ranks);
  free(buf);
  return err;
}

zb_err cpu_job_zero_check(void *arg, zb_step_partial *p, zb_diag *diag) {
  cpu_job_check *c = arg;
  if (c->cj->zero) {
    zb_err err = zero_gather_check(c->cj, c->chain->tr, c->chain->iteration, p, diag);
    if (err)
      return err;
  }
  return zb_step_reduce_chain(c->chain, p, diag);
}

/* All-gathers hosted stage i's buffer (its params or grads) from the
 * replicas' shards. */
static zb_err zero_gather(cpu_job *cj, zb_transport *tr, int i, float *buf, int32_t seq, zb_diag *diag) {
  int *ranks = zb_malloc(sizeof(int) * (size_t)cj->data_parallel);
  zb_ring ring = cpu_job_ring(cj, tr, cj->stages[i], seq, ranks);
  size_t n = zb_model_n_params(zb_backend_cpu_stage(cj->be, i, NULL));
  zb_err err = zb_ring_all_gather(&ring, buf, n, diag);
  free(ranks);
  return err;
}

zb_err cpu_job_zero_gather(cpu_job *cj, zb_transport *tr, int iteration, bool grads, zb_diag *diag) {
  zb_err err = ZB_OK;
  for (int i = 0; cj->zero && !err && i < cj->n_stages; i++) {
    err = zero_gather(cj, tr, i, cj->params[i], cpu_job_zero_seq(iteration, CPU_JOB_ZERO_SEQ_PARAMS), diag);
    /* a dump records the whole reduced gradient, as without ZeRO-1 */
    if (!err && grads && !cpu_job_zero_full(cj, i))
      err = zero_gather(cj, tr, i, cj->grads[i], cpu_job_zero_seq(iteration, CPU_JOB_ZERO_SEQ_GRADS), diag);
  }
  return err;
}
