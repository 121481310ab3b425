/* transport_nccl_post.c — the nccl transport's groups posted without a
 * host wait (zb_transport.h, device-ordered transports; docs/schedules.md,
 * Execution model): mark records a compute-stream point after a send's
 * producer, group_post enqueues a group after a mark and records its end
 * in a ring of `window` events, order_device makes the compute stream wait
 * on one, room counts free ring slots, drain waits for every posted group.
 * A group with host buffers runs as a blocking one (its received bytes are
 * copied out after a host wait). */
#include <cuda_runtime.h>

#include "transport_nccl_internal.h"

/* Waits on the host for posted group k (and so every earlier one). */
static zb_err nccl_wait_ticket(nccl_transport *t, int64_t k, zb_diag *diag) {
  if (k < t->complete)
    return ZB_OK;
  zb_err err = zbn_enter(t, diag);
  int slot = (int)(k % t->window);
  if (!err)
    err = zbn_wait_group(t, t->ring[slot], t->ring_what[slot], diag);
  if (!err)
    t->complete = k + 1;
  return err;
}

static bool nccl_has_host(const nccl_transport *t) {
  for (int i = 0; i < t->n_ops; i++)
    if (t->ops[i].host)
      return true;
  return false;
}

zb_err zbn_mark(void *self, int64_t *mark, zb_diag *diag) {
  nccl_transport *t = self;
  if (t->failed)
    return zbn_failed_before(t, diag);
  zb_err err = zbn_enter(t, diag);
  if (err)
    return err;
  cudaError_t ce = cudaEventRecord(t->marks[t->n_marks % NCCL_MARKS], t->compute);
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: marking the compute stream: %s", t->rank,
                    cudaGetErrorString(ce));
  *mark = t->n_marks++;
  return ZB_OK;
}

zb_err zbn_group_post(void *self, int64_t after, int64_t *ticket, zb_diag *diag) {
  nccl_transport *t = self;
  if (t->failed)
    return zbn_failed_before(t, diag);
  if (after >= t->n_marks)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "group_post after mark %lld, which was never made",
                    (long long)after);
  if (t->depth != 1)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "group_post needs one open group (%d open)", t->depth);
  t->depth = 0;
  int64_t k = t->posted;
  if (t->n_ops == 0 || nccl_has_host(t)) { /* host bytes are copied out after a host wait */
    zb_err err = zbn_run(t, diag);
    if (!err) {
      *ticket = t->posted++;
      t->complete = t->posted;
    }
    return err;
  }
  zb_err err = k - t->window >= 0 ? nccl_wait_ticket(t, k - t->window, diag) : ZB_OK; /* the window */
  int slot = (int)(k % t->window);
  if (!err)
    err = zbn_enter(t, diag);
  if (!err) {
    zbn_describe(t, t->ring_what[slot], sizeof t->ring_what[slot]);
    /* a mark's slot recorded again since is a later point of the same
     * stream: waiting on it is later than needed, never too early */
    err = zbn_launch(t, after >= 0 ? t->marks[after % NCCL_MARKS] : NULL, t->ring[slot], false, diag);
  }
  if (err)
    return err;
  zbn_account(t);
  *ticket = t->posted++;
  return ZB_OK;
}

zb_err zbn_order_device(void *self, int64_t k, zb_diag *diag) {
  nccl_transport *t = self;
  if (t->failed)
    return zbn_failed_before(t, diag);
  if (k < 0 || k >= t->posted)
    return zbn_fail(t, ZB_ERR_INVALID_ARG, diag, "order_device: group %lld was never posted (%lld so far)",
                    (long long)k, (long long)t->posted);
  if (k < t->complete)
    return ZB_OK; /* the host saw it complete: nothing to wait for */
  zb_err err = zbn_enter(t, diag);
  if (err)
    return err;
  cudaError_t ce = cudaStreamWaitEvent(t->compute, t->ring[k % t->window], 0);
  if (ce != cudaSuccess)
    return zbn_fail(t, ZB_ERR_IO, diag, "nccl: rank %d: ordering the compute stream after group %s: %s",
                    t->rank, t->ring_what[k % t->window], cudaGetErrorString(ce));
  return ZB_OK;
}

int zbn_room(void *self) {
  nccl_transport *t = self;
  if (t->failed)
    return 0;
  while (t->complete < t->posted) { /* completions come in posting order */
    cudaError_t q = cudaEventQuery(t->ring[t->complete % t->window]);
    if (q == cudaErrorNotReady && cudaPeekAtLastError() == cudaErrorNotReady)
      (void)cudaGetLastError(); /* as in zbn_wait_group */
    if (q != cudaSuccess)
      break; /* not done yet, or failed: a wait will say which */
    t->complete++;
  }
  return t->window - (int)(t->posted - t->complete);
}

zb_err zbn_drain(void *self, zb_diag *diag) {
  nccl_transport *t = self;
  if (t->failed)
    return zbn_failed_before(t, diag);
  return t->posted > t->complete ? nccl_wait_ticket(t, t->posted - 1, diag) : ZB_OK;
}
