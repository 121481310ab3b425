/* nccl_id.c — an nccl job's bootstrap ids through the coordinator
 * (docs/wire.md, NCCL id exchange): global rank 0 makes the job's id (the
 * nccl transport calls ncclGetUniqueId) and reports it; the coordinator
 * sends it to every rank as Command.nccl_id, which the main thread keeps
 * in `worker` for the job thread. With data_parallel > 1 each stage
 * group's member 0 (replica 0) does the same for its group's id, which
 * the coordinator sends to the group's members only (stage_group set).
 *
 * Threads: worker_take_nccl_id runs on the main thread (the Attach
 * stream), the exchanges on the job thread; they meet under w->mu and
 * w->cv (the job thread is the one waiter on cv). An id is kept per job
 * id, so one for an earlier job is never taken for the next.
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
  if (ours && pb->stage_group) {
    snprintf(w->group_job, sizeof w->group_job, "%s", job);
    w->group_rank = pb->pipeline_rank;
    memcpy(w->group_id, pb->unique_id.data, ZB_NCCL_ID_BYTES);
  } else if (ours) {
    snprintf(w->nccl_job, sizeof w->nccl_job, "%s", job);
    memcpy(w->nccl_id, pb->unique_id.data, ZB_NCCL_ID_BYTES);
  }
  if (ours)
    pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
  const char *what = pb->stage_group ? "stage group's NCCL id" : "NCCL id";
  if (ours)
    ZB_DEBUG("job %s: %s received", job, what);
  else
    ZB_DEBUG("%s of job %s, which this worker does not run: ignored", what, job);
}

/* The maker's Report of its id: job, global rank, plan version and the
 * id (ReportRequest.nccl_unique_id, or nccl_group_unique_id for a stage
 * group's), no metrics. */
static zb_err report_id(worker *w, const zb_assignment *a, const uint8_t *mine, bool group, zb_diag *diag) {
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = w->id;
  req.job_id = (char *)a->job_id;
  req.rank = zb_assignment_global(a);
  req.plan_version = a->plan_version;
  ProtobufCBinaryData *field = group ? &req.nccl_group_unique_id : &req.nccl_unique_id;
  field->data = (uint8_t *)mine;
  field->len = ZB_NCCL_ID_BYTES;
  const char *what = group ? "its stage group's NCCL id" : "the NCCL id";
  char why[300] = "";
  report_result r = worker_report(w, &req, why, sizeof why);
  if (r == REPORT_FAILED)
    return zb_diag_set(diag, ZB_ERR_IO, "job %s: reporting %s to the coordinator failed: %s", a->job_id, what,
                       why);
  if (r == REPORT_STOP)
    return zb_diag_set(diag, ZB_ERR_IO, "job %s: the coordinator ended the job before %s went out", a->job_id,
                       what);
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

/* Whether the id the exchange waits for is in (under w->mu). */
static bool id_here(const worker *w, const zb_assignment *a, bool group) {
  if (group)
    return strcmp(w->group_job, a->job_id) == 0 && w->group_rank == a->rank;
  return strcmp(w->nccl_job, a->job_id) == 0;
}

/* Reports mine (the maker) and waits for the coordinator's Command with
 * the id, bounded by timeout_s, *stop and the worker's shutdown. */
static zb_err exchange(worker *w, const zb_assignment *a, const uint8_t *mine, bool group,
                       uint8_t out[ZB_NCCL_ID_BYTES], double timeout_s, atomic_bool *stop, zb_diag *diag) {
  if (!(timeout_s > 0))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "job %s: NCCL id timeout must be > 0 s, got %g", a->job_id,
                       timeout_s);
  zb_err err = mine ? report_id(w, a, mine, group, diag) : ZB_OK;
  if (err)
    return err;
  double deadline = zb_clock_s() + timeout_s;
  bool got = false, stopped = false;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    got = id_here(w, a, group);
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
    memcpy(out, group ? w->group_id : w->nccl_id, ZB_NCCL_ID_BYTES);
  pthread_mutex_unlock(&w->mu);
  if (got)
    return ZB_OK;
  const char *what = group ? "stage group NCCL id" : "NCCL id";
  if (stopped)
    return zb_diag_set(diag, ZB_ERR_IO, "job %s rank %d: stopped while waiting for the %s", a->job_id,
                       zb_assignment_global(a), what);
  return zb_diag_set(diag, ZB_ERR_IO,
                     "job %s rank %d: no %s from the coordinator within %g s (%s makes it and reports it "
                     "first: see its log)",
                     a->job_id, zb_assignment_global(a), what, timeout_s,
                     group ? "replica 0's rank" : "rank 0");
}

zb_err worker_nccl_exchange(worker *w, const zb_assignment *a, const uint8_t *mine,
                            uint8_t out[ZB_NCCL_ID_BYTES], double timeout_s, atomic_bool *stop,
                            zb_diag *diag) {
  bool maker = zb_assignment_global(a) == 0;
  if (maker != (mine != NULL))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "job %s rank %d: %s", a->job_id, zb_assignment_global(a),
                       maker ? "rank 0 must make the NCCL id" : "only rank 0 makes the NCCL id");
  return exchange(w, a, mine, false, out, timeout_s, stop, diag);
}

zb_err worker_nccl_group_exchange(worker *w, const zb_assignment *a, const uint8_t *mine,
                                  uint8_t out[ZB_NCCL_ID_BYTES], double timeout_s, atomic_bool *stop,
                                  zb_diag *diag) {
  bool maker = a->replica == 0;
  if (maker != (mine != NULL))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "job %s rank %d: %s", a->job_id, zb_assignment_global(a),
                       maker ? "replica 0 must make its stage group's NCCL id"
                             : "only replica 0 makes a stage group's NCCL id");
  return exchange(w, a, mine, true, out, timeout_s, stop, diag);
}
