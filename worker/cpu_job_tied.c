/* cpu_job_tied.c — a tied head over several stages (docs/model.md, Tied
 * head): the first stage's token embedding and the last stage's head are
 * one logical weight with two holders. After an iteration's W ops each
 * holder's gradient becomes the sum of both, so the two take the same
 * AdamW step and stay bit-identical, as Megatron-LM does for its
 * embedding group; the step's check counts the weight once, on the first
 * stage (zb_stepper_count_prefix). See cpu_job.h. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_job.h"
#include "zb_alloc.h"

/* The hosted stage index of global stage s, or -1. */
static int hosted_index(const cpu_job *cj, int s) {
  for (int i = 0; i < cj->n_stages; i++)
    if (cj->stages[i] == s)
      return i;
  return -1;
}

/* The tied weight's tensor on hosted stage i: the embedding on the first
 * stage, the head (the stage's last tensor, a copy) on the last. */
static const zb_model_tensor *tied_tensor(const cpu_job *cj, int i) {
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  if (cj->stages[i] == 0)
    return zb_model_tensor_at(st, 0);
  return zb_model_tensor_at(st, zb_model_n_tensors(st) - 1);
}

bool cpu_job_tied(const cpu_job *cj) {
  return cj->has_arch && cj->arch.tied && cj->total_stages > 1;
}

zb_err cpu_job_tied_count_once(cpu_job *cj, zb_diag *diag) {
  int i = hosted_index(cj, cj->total_stages - 1);
  if (!cpu_job_tied(cj) || i < 0)
    return ZB_OK;
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  size_t n = (size_t)(tied_tensor(cj, i)->grad - zb_model_grads(st));
  /* with ZeRO-1 the stepper sees stage i's shard: the part of the prefix in it */
  size_t off = cj->shard_off[i], len = cj->shard_len[i];
  n = n <= off ? 0 : (n - off < len ? n - off : len);
  if (cj->dstep)
    return zb_step_device_count_prefix(cj->dstep, i, n, diag);
  return zb_stepper_count_prefix(cj->stepper, i, n, diag);
}

/* Hosted stage i's tied gradient <-> host buffer (a cuda job's lives on
 * its device; a cpu job's is the host view itself). */
static zb_err tied_io(cpu_job *cj, int i, float *host, bool to_host, zb_diag *diag) {
  const zb_model_tensor *t = tied_tensor(cj, i);
  size_t bytes = t->numel * sizeof(float);
  if (!cj->device) {
    if (to_host)
      memcpy(host, t->grad, bytes);
    else
      memcpy(t->grad, host, bytes);
    return ZB_OK;
  }
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  float *dev = zb_model_device_grads(st) + (t->grad - zb_model_grads(st));
  zb_device *d = cj->device;
  zb_err err = to_host ? d->ops->copy(d->self, host, dev, bytes, ZB_COPY_D2H, diag)
                       : d->ops->copy(d->self, dev, host, bytes, ZB_COPY_H2D, diag);
  return err ? err : d->ops->sync(d->self, diag);
}

/* sum[k] = first[k] + last[k]: the same expression on both holders, so
 * both get the same bits. */
static void add_into(float *sum, const float *first, const float *last, size_t n) {
  for (size_t k = 0; k < n; k++)
    sum[k] = first[k] + last[k];
}

/* Both holders on this rank (a V placement puts stage 0 and the last
 * stage on rank 0). */
static zb_err tie_local(cpu_job *cj, int i0, int il, float *a, float *b, size_t n, zb_diag *diag) {
  zb_err err = tied_io(cj, i0, a, true, diag);
  if (!err)
    err = tied_io(cj, il, b, true, diag);
  if (err)
    return err;
  add_into(a, a, b, n);
  err = tied_io(cj, i0, a, false, diag);
  return err ? err : tied_io(cj, il, a, false, diag);
}

/* One holder here, the other on rank peer: the first stage's holder
 * sends then receives, the last's receives then sends, so blocking
 * transports cannot deadlock. Tags use stage INT32_MIN, which no
 * activation, gradient, step check, resume or restage message carries
 * (they use stages >= -1, -2 and <= -3 - stage): (F, INT32_MIN, it) from
 * the first stage's rank, (B, INT32_MIN, it) from the last's. */
static zb_err tie_remote(cpu_job *cj, zb_transport *tr, int iteration, int i, bool first, int peer,
                         float *mine, float *theirs, size_t n, zb_diag *diag) {
  zb_tag from_first = {.kind = ZB_OP_F, .stage = INT32_MIN, .mb = iteration};
  zb_tag from_last = {.kind = ZB_OP_B, .stage = INT32_MIN, .mb = iteration};
  size_t bytes = n * sizeof(float);
  zb_err err = tied_io(cj, i, mine, true, diag);
  if (!err && first) {
    if (!(err = zb_transport_send(tr, peer, from_first, mine, bytes, diag)))
      err = zb_transport_recv(tr, peer, from_last, theirs, bytes, diag);
  } else if (!err) {
    if (!(err = zb_transport_recv(tr, peer, from_first, theirs, bytes, diag)))
      err = zb_transport_send(tr, peer, from_last, mine, bytes, diag);
  }
  if (err)
    return err;
  if (first)
    add_into(mine, mine, theirs, n);
  else
    add_into(mine, theirs, mine, n);
  return tied_io(cj, i, mine, false, diag);
}

zb_err cpu_job_tie_grads(cpu_job *cj, zb_transport *tr, int iteration, zb_diag *diag) {
  if (!cpu_job_tied(cj))
    return ZB_OK;
  int last = cj->total_stages - 1;
  int i0 = hosted_index(cj, 0), il = hosted_index(cj, last);
  if (i0 < 0 && il < 0)
    return ZB_OK;
  size_t n = tied_tensor(cj, i0 >= 0 ? i0 : il)->numel;
  float *a = zb_malloc(n * sizeof(float)), *b = zb_malloc(n * sizeof(float));
  zb_err err;
  if (i0 >= 0 && il >= 0) {
    err = tie_local(cj, i0, il, a, b, n, diag);
  } else {
    bool first = i0 >= 0;
    /* the other holder in this replica (transport ranks: peer_base + q) */
    int peer = cj->peer_base + zb_placement_rank(cj->placement, cj->p, cj->v, first ? last : 0);
    err = tie_remote(cj, tr, iteration, first ? i0 : il, first, peer, a, b, n, diag);
  }
  free(a);
  free(b);
  return err;
}
