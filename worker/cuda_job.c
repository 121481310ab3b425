/* cuda_job.c — what a cuda or nccl job needs beyond a cpu job (see
 * worker.h; docs/model.md, Backends and Transports): the CUDA device the
 * model runs on, and the nccl transport, whose NCCL id rank 0 makes and the
 * coordinator hands to every rank. With CUDA built in (ZB_WITH_CUDA) this
 * is the real thing; without it both refuse with ZB_ERR_UNSUPPORTED, which
 * the coordinator never provokes, since such a worker offers no cuda.
 *
 * Threads: the job thread. The device and transport it makes are the
 * caller's.
 */
#include <string.h>

#include "worker.h"
#include "zb_log.h"
#include "zb_names.h"

#ifdef ZB_WITH_CUDA
#include "zb_device.h"

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
  zb_err err = a->rank == 0 ? zb_transport_nccl_unique_id(mine, diag) : ZB_OK;
  if (!err)
    err = worker_nccl_exchange(w, a, a->rank == 0 ? mine : NULL, id, NCCL_BOOT_TIMEOUT_S, stop, diag);
  if (err)
    return err;
  zb_nccl_config nc = {.rank = a->rank,
                       .nranks = a->ranks,
                       .compute_stream = dev->ops->stream(dev->self),
                       .stop = stop,
                       .timeout_s = a->transfer_timeout_s};
  memcpy(nc.unique_id, id, sizeof nc.unique_id);
  return zb_transport_nccl_new(&nc, out, diag);
}

#else

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
