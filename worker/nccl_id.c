/* nccl_id.c — an nccl job's bootstrap id through the coordinator
 * (docs/wire.md, NCCL id exchange): rank 0 makes the id (the nccl
 * transport calls ncclGetUniqueId) and reports it; the coordinator sends
 * it to every rank as Command.nccl_id, which the main thread keeps in
 * `worker` for the job thread.
 *
 * Threads: worker_take_nccl_id runs on the main thread (the Attach
 * stream), worker_nccl_exchange on the job thread; they meet under w->mu
 * and w->cv (the job thread is the one waiter on cv). The id is kept per
 * job id, so one for an earlier job is never taken for the next.
 * Errors: zb_err with a zb_diag message naming the job and the step.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "worker.h"
#include "zb_clock.h"
#include "zb_log.h"

void worker_take_nccl_id(worker *w, const Zb__V1__NcclId *pb) {
  const char *job = pb->job_id ? pb->job_id : "";
  if (pb->unique_id.len != ZB_NCCL_ID_BYTES || !job[0] || strlen(job) >= sizeof w->nccl_job) {
    ZB_WARN("nccl id of job '%.64s': %zu bytes, not %d; ignored", job, pb->unique_id.len, ZB_NCCL_ID_BYTES);
    return;
  }
  pthread_mutex_lock(&w->mu);
  bool ours = strcmp(w->running_job, job) == 0 || (w->next_job && strcmp(w->next_job->job_id, job) == 0);
  if (ours) {
    snprintf(w->nccl_job, sizeof w->nccl_job, "%s", job);
    memcpy(w->nccl_id, pb->unique_id.data, ZB_NCCL_ID_BYTES);
    pthread_cond_signal(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
  if (ours)
    ZB_DEBUG("job %s: NCCL id received", job);
  else
    ZB_DEBUG("nccl id of job %s, which this worker does not run: ignored", job);
}

/* Rank 0's Report of its id: job, rank, plan version and the id, no
 * metrics (ReportRequest.nccl_unique_id). */
static zb_err report_id(worker *w, const zb_assignment *a, const uint8_t *mine, zb_diag *diag) {
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = w->id;
  req.job_id = (char *)a->job_id;
  req.rank = a->rank;
  req.plan_version = a->plan_version;
  req.nccl_unique_id.data = (uint8_t *)mine;
  req.nccl_unique_id.len = ZB_NCCL_ID_BYTES;
  char why[300] = "";
  report_result r = worker_report(w, &req, why, sizeof why);
  if (r == REPORT_FAILED)
    return zb_diag_set(diag, ZB_ERR_IO, "job %s: reporting the NCCL id to the coordinator failed: %s",
                       a->job_id, why);
  if (r == REPORT_STOP)
    return zb_diag_set(diag, ZB_ERR_IO, "job %s: the coordinator ended the job before the NCCL id went out",
                       a->job_id);
  return ZB_OK;
}

/* now + ms on CLOCK_REALTIME, which w->cv waits on (its default clock). */
static struct timespec realtime_in(int ms) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  ts.tv_nsec += (long)ms * 1000000L;
  ts.tv_sec += ts.tv_nsec / 1000000000L;
  ts.tv_nsec %= 1000000000L;
  return ts;
}

zb_err worker_nccl_exchange(worker *w, const zb_assignment *a, const uint8_t *mine,
                            uint8_t out[ZB_NCCL_ID_BYTES], double timeout_s, atomic_bool *stop,
                            zb_diag *diag) {
  if ((a->rank == 0) != (mine != NULL))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "job %s rank %d: %s", a->job_id, a->rank,
                       a->rank == 0 ? "rank 0 must make the NCCL id" : "only rank 0 makes the NCCL id");
  if (!(timeout_s > 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "job %s: NCCL id timeout must be > 0 s, got %g", a->job_id,
                       timeout_s);
  zb_err err = mine ? report_id(w, a, mine, diag) : ZB_OK;
  if (err)
    return err;
  double deadline = zb_clock_s() + timeout_s;
  bool got = false, stopped = false;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    got = strcmp(w->nccl_job, a->job_id) == 0;
    stopped = (stop && atomic_load(stop)) || atomic_load(&w->shutdown);
    if (got || stopped || zb_clock_s() >= deadline)
      break;
    /* slices: the stop flag is set without a signal on cv */
    struct timespec ts = realtime_in(100);
    int rc = pthread_cond_timedwait(&w->cv, &w->mu, &ts);
    if (rc != 0 && rc != ETIMEDOUT)
      break;
  }
  if (got)
    memcpy(out, w->nccl_id, ZB_NCCL_ID_BYTES);
  pthread_mutex_unlock(&w->mu);
  if (got)
    return ZB_OK;
  if (stopped)
    return zb_diag_set(diag, ZB_ERR_IO, "job %s rank %d: stopped while waiting for the NCCL id", a->job_id,
                       a->rank);
  return zb_diag_set(diag, ZB_ERR_IO,
                     "job %s rank %d: no NCCL id from the coordinator within %g s (rank 0 makes it and "
                     "reports it first: see rank 0's log)",
                     a->job_id, a->rank, timeout_s);
}
