/* cuda_job.c — what a cuda or nccl job needs beyond a cpu job (see
 * worker.h; docs/model.md, Backends and Transports): the CUDA device the
 * model runs on, the nccl transport, whose NCCL id global rank 0 makes and
 * the coordinator hands to every rank, and with data_parallel > 1 the
 * rank's stage group communicator (docs/model.md, Data parallelism), whose
 * id the group's replica 0 makes. With CUDA built in (ZB_WITH_CUDA) this
 * is the real thing; without it all refuse with ZB_ERR_UNSUPPORTED, which
 * the coordinator never provokes, since such a worker offers no cuda.
 *
 * The p2p communicator spans the whole job (data_parallel x p ranks, rank
 * = the global rank), not one per replica: the executor already names
 * peers by global rank (peer_base), so one id and one communicator serve
 * every replica, and NCCL's p2p calls involve only their two ends.
 *
 * Threads: the job thread. The device and transport it makes are the
 * caller's.
 */
#include <stdlib.h>
#include <string.h>

#include "worker.h"
#include "zb_log.h"
#include "zb_names.h"

#ifdef ZB_WITH_CUDA
#include "zb_alloc.h"
#include "zb_device.h"
#include "zb_group_comm.h"

/* How long every rank waits for the id and the communicator: long enough
 * for the slowest rank to receive its assignment and start. */
#define NCCL_BOOT_TIMEOUT_S 30.0

static zb_precision precision_of(const char *name) {
  if (strcmp(name, "tf32") == 0)
    return ZB_PRECISION_TF32;
  if (strcmp(name, "bf16") == 0)
    return ZB_PRECISION_BF16;
  return ZB_PRECISION_FP32;
}

zb_err worker_cuda_device(worker *w, const zb_assignment *a, struct zb_device **out, zb_diag *diag) {
  *out = NULL;
  if (!zb_backend_needs_gpu(a->backend))
    return ZB_OK;
  zb_cuda_device_config dc = {.ordinal = w->gpu_ordinal, .precision = precision_of(a->precision)};
  zb_err err = zb_device_cuda_new(&dc, out, diag);
  if (!err)
    ZB_INFO("job %s rank %d: cuda device %d, precision %s", a->job_id, a->rank, w->gpu_ordinal, a->precision);
  return err;
}

zb_err worker_nccl_transport(worker *w, const zb_assignment *a, struct zb_device *dev, atomic_bool *stop,
                             zb_transport **out, zb_diag *diag) {
  if (!dev)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "transport nccl needs backend cuda (job %s has %s)",
                       a->job_id, a->backend);
  uint8_t mine[ZB_NCCL_ID_BYTES], id[ZB_NCCL_ID_BYTES];
  bool maker = zb_assignment_global(a) == 0;
  zb_err err = maker ? zb_transport_nccl_unique_id(mine, diag) : ZB_OK;
  if (!err)
    err = worker_nccl_exchange(w, a, maker ? mine : NULL, id, NCCL_BOOT_TIMEOUT_S, stop, diag);
  if (err)
    return err;
  zb_nccl_config nc = {.rank = zb_assignment_global(a), /* one communicator over every replica */
                       .nranks = zb_assignment_world(a),
                       .compute_stream = dev->ops->stream(dev->self),
                       .stop = stop,
                       .timeout_s = a->transfer_timeout_s};
  memcpy(nc.unique_id, id, sizeof nc.unique_id);
  return zb_transport_nccl_new(&nc, out, diag);
}

zb_err worker_group_comm(worker *w, const zb_assignment *a, struct zb_device *dev, atomic_bool *stop,
                         struct zb_group_comm **out, zb_diag *diag) {
  *out = NULL;
  uint8_t mine[ZB_NCCL_ID_BYTES];
  zb_group_comm_config gc = {.stage = a->rank,
                             .size = a->data_parallel,
                             .index = a->replica,
                             .compute_stream = dev->ops->stream(dev->self),
                             .stop = stop,
                             .timeout_s = a->transfer_timeout_s};
  bool maker = a->replica == 0;
  zb_err err = maker ? zb_group_comm_unique_id(mine, diag) : ZB_OK;
  if (!err)
    err =
        worker_nccl_group_exchange(w, a, maker ? mine : NULL, gc.unique_id, NCCL_BOOT_TIMEOUT_S, stop, diag);
  if (err)
    return err;
  int *ranks = zb_malloc(sizeof(int) * (size_t)a->data_parallel);
  for (int k = 0; k < a->data_parallel; k++)
    ranks[k] = k * a->ranks + a->rank; /* the group of pipeline rank r */
  gc.ranks = ranks;
  err = zb_group_comm_new(&gc, out, diag);
  free(ranks);
  if (!err && (err = zb_group_comm_connect(*out, diag))) {
    zb_group_comm_free(*out);
    *out = NULL;
  }
  if (!err)
    ZB_INFO("job %s rank %d: %s connected", a->job_id, zb_assignment_global(a), zb_group_comm_name(*out));
  return err;
}

void worker_group_comm_end(zb_group_comm *g, const char *why) {
  if (g && why) {
    ZB_INFO("%s aborted: %s", zb_group_comm_name(g), why);
    zb_group_comm_abort(g, why);
  }
  zb_group_comm_free(g);
}

#else

void worker_group_comm_end(struct zb_group_comm *g, const char *why) {
  (void)g; /* never made without CUDA */
  (void)why;
}

zb_err worker_group_comm(worker *w, const zb_assignment *a, struct zb_device *dev, atomic_bool *stop,
                         struct zb_group_comm **out, zb_diag *diag) {
  (void)w;
  (void)dev;
  (void)stop;
  *out = NULL;
  return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                     "data_parallel %d (job %s): stage group collectives need CUDA; this zb-worker was built "
                     "without it",
                     a->data_parallel, a->job_id);
}

zb_err worker_cuda_device(worker *w, const zb_assignment *a, struct zb_device **out, zb_diag *diag) {
  (void)w;
  *out = NULL;
  if (!zb_backend_needs_gpu(a->backend))
    return ZB_OK;
  return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "backend cuda: this zb-worker was built without CUDA");
}

zb_err worker_nccl_transport(worker *w, const zb_assignment *a, struct zb_device *dev, atomic_bool *stop,
                             zb_transport **out, zb_diag *diag) {
  (void)w;
  (void)dev;
  (void)stop;
  (void)out;
  return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                     "transport nccl (job %s): this zb-worker was built without CUDA", a->job_id);
}

#endif
