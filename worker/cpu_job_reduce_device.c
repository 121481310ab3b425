/* cpu_job_reduce_device.c — a cuda job's gradient reduction across
 * data-parallel replicas (cpu_job.h; docs/model.md, Data parallelism):
 * the device counterpart of cpu_job_reduce.c's ring. A hosted stage's
 * device gradient buffer is all-reduced over the rank's stage group
 * communicator (zb_group_comm.h: NCCL's sum, every member the same bits),
 * the host waits for it, bounded by the job's transfer_timeout_s, and the
 * device scales it by 1/d: the same float multiply the cpu job does on
 * the host, so both paths compute the same mean of the same sum.
 *
 * Why the host waits: the executor's reduce hook is host-blocking
 * (zb_executor.h), and a wait is where the group's watchdog bounds a
 * collective; left unwaited, a lost member would stall the compute stream
 * until the step's sync, which nothing bounds.
 */
#include "cpu_job.h"

#ifdef ZB_WITH_CUDA
#include "zb_device.h"
#include "zb_group_comm.h"

zb_err cpu_job_reduce_device(cpu_job *cj, int i, zb_diag *diag) {
  if (!cj->group_comm || !cj->device)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "data_parallel %d: stage %d's gradient reduction needs the cuda job's stage group "
                       "communicator, which is not connected",
                       cj->data_parallel, cj->stages[i]);
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  float *g = zb_model_device_grads(st);
  size_t n = zb_model_n_params(st);
  zb_err err = zb_group_comm_all_reduce(cj->group_comm, g, n, diag);
  if (!err)
    err = zb_group_comm_wait(cj->group_comm, diag);
  if (!err)
    err = cj->device->ops->scale(cj->device->self, g, 1.0f / (float)cj->data_parallel, n, diag);
  return err;
}

void cpu_job_reduce_abort(void *ud, const char *why) {
  cpu_job *cj = ud;
  if (cj->group_comm)
    zb_group_comm_abort(cj->group_comm, why);
}

#else

zb_err cpu_job_reduce_device(cpu_job *cj, int i, zb_diag *diag) {
  return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                     "data_parallel %d: stage %d's gradient reduction on the device needs CUDA; this "
                     "zb-worker was built without it",
                     cj->data_parallel, cj->stages[i]);
}

void cpu_job_reduce_abort(void *ud, const char *why) {
  (void)ud; /* no stage group without CUDA */
  (void)why;
}

#endif
