/* cpu_job_reduce_device.c — a cuda job's gradient reduction across
 * data-parallel replicas (cpu_job.h; docs/model.md, Data parallelism):
 * the device counterpart of cpu_job_reduce.c's ring. A hosted stage's
 * device gradient buffer is all-reduced over the rank's stage group
 * communicator (zb_group_comm.h: NCCL's sum, every member the same bits),
 * and the device scales it by 1/d: the same float multiply the cpu job
 * does on the host, so both paths compute the same mean of the same sum.
 *
 * Two halves, so the all-reduce overlaps the compute after it (issue 31;
 * docs/schedules.md, Gradient reduction): _start enqueues it on the
 * group's stream after the stage's last W and returns; _finish (at
 * WAIT_REDUCE_GRAD, or before the step) orders the compute stream after
 * it, scales, and waits on the host once. That host wait stays: it is
 * where the group's watchdog bounds a collective; left unwaited, a lost
 * member would stall the compute stream until the step's sync, which
 * nothing bounds.
 */
#include "cpu_job.h"

#ifdef ZB_WITH_CUDA
#include "zb_device.h"
#include "zb_group_comm.h"

static zb_err reduce_no_group(const cpu_job *cj, int i, zb_diag *diag) {
  return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                     "data_parallel %d: stage %d's gradient reduction needs the cuda job's stage group "
                     "communicator, which is not connected",
                     cj->data_parallel, cj->stages[i]);
}

zb_err cpu_job_reduce_device_start(cpu_job *cj, int i, zb_diag *diag) {
  if (!cj->group_comm || !cj->device)
    return reduce_no_group(cj, i, diag);
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  zb_err err =
      zb_group_comm_all_reduce_start(cj->group_comm, zb_model_device_grads(st), zb_model_n_params(st), diag);
  cj->unscaled[i] = !err;
  return err;
}

zb_err cpu_job_reduce_device_finish(cpu_job *cj, zb_diag *diag) {
  int first = -1;
  for (int i = 0; i < cj->n_stages && first < 0; i++)
    first = cj->unscaled[i] ? i : -1;
  if (first < 0)
    return ZB_OK;
  if (!cj->group_comm || !cj->device)
    return reduce_no_group(cj, first, diag);
  zb_err err = zb_group_comm_join(cj->group_comm, diag); /* the scale reads the sums */
  for (int i = first; !err && i < cj->n_stages; i++) {
    if (!cj->unscaled[i])
      continue;
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    err = cj->device->ops->scale(cj->device->self, zb_model_device_grads(st), 1.0f / (float)cj->data_parallel,
                                 zb_model_n_params(st), diag);
    cj->unscaled[i] = false;
  }
  if (!err)
    err = zb_group_comm_wait(cj->group_comm, diag);
  return err;
}

void cpu_job_reduce_abort(void *ud, const char *why) {
  cpu_job *cj = ud;
  if (cj->group_comm)
    zb_group_comm_abort(cj->group_comm, why);
}

#else

zb_err cpu_job_reduce_device_start(cpu_job *cj, int i, zb_diag *diag) {
  return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                     "data_parallel %d: stage %d's gradient reduction on the device needs CUDA; this "
                     "zb-worker was built without it",
                     cj->data_parallel, cj->stages[i]);
}

zb_err cpu_job_reduce_device_finish(cpu_job *cj, zb_diag *diag) {
  (void)cj; /* nothing starts without CUDA */
  (void)diag;
  return ZB_OK;
}

void cpu_job_reduce_abort(void *ud, const char *why) {
  (void)ud; /* no stage group without CUDA */
  (void)why;
}

#endif
