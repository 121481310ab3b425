/* recovery.c — jobs outlive a coordinator restart (docs/operations.md,
 * Coordinator restarts). Workers keep running their job while the
 * coordinator is away, their reports waiting for the next one. At start
 * the coordinator takes back every job its store has RUNNING: its plan
 * made again from its spec (plans are deterministic), its progress from
 * the store. Each rank's worker, attaching again, names the job and rank
 * it runs and gets it back, then sends again the reports the old
 * coordinator took for iterations it had not completed; each is counted
 * once. A rank goes back only to the identity the store says ran it (the
 * row's rank_owners, written when the job started): any other worker
 * naming it is refused, and the rank waits on for its own. A torch job's
 * rank, whose identity a run's agents share, goes back only to the agent
 * bound to its run and rank, and an agent takes back no other job's. A
 * rank not back within the recovery window fails the job; a worker naming
 * a job this coordinator will not run is released from it. */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"

/* How long a taken-back job waits for its ranks' workers: they attach
 * again within seconds (backoff at most 2 s), and their reports wait up to
 * WORKER_REPORT_RIDE_OUT_S (60 s) for a coordinator. */
enum { COORD_RECOVER_MS = 30000 };

void job_recover(coord *co, coord_job *j) {
  zb_diag d;
  if (zb_job_plan(&j->spec, ZB_OBJ_MAKESPAN, &j->plan, &d) != ZB_OK) {
    char reason[256];
    snprintf(reason, sizeof reason, "the coordinator restarted and cannot plan the job again: %.180s", d.msg);
    job_finish(co, j, ZB_JOB_FAILED, reason);
    return;
  }
  if (strcmp(zb_family_name(j->plan.family), j->row.schedule) != 0) {
    /* its schedule was updated: the new one's chunks and limit are not stored */
    char reason[256];
    snprintf(reason, sizeof reason,
             "the coordinator restarted and cannot rebuild the plan of a job whose schedule was updated (%s)",
             j->row.schedule);
    zb_planner_result_free(&j->plan);
    job_finish(co, j, ZB_JOB_FAILED, reason);
    return;
  }
  int p = zb_job_spec_world(&j->spec);
  if (j->row.n_rank_owners != p && j->row.n_rank_owners != 0) {
    char reason[256];
    snprintf(reason, sizeof reason,
             "the coordinator restarted and cannot take the job back: its store names the workers of %d "
             "ranks, not %d",
             j->row.n_rank_owners, p);
    zb_planner_result_free(&j->plan);
    job_finish(co, j, ZB_JOB_FAILED, reason);
    return;
  }
  if (!j->row.n_rank_owners) /* started under store schema 1, which did not keep them */
    ZB_WARN(
        "job %s: the store does not say which workers ran its ranks (it started before schema version 2): "
        "the first worker naming a rank takes it back, whoever it is",
        j->row.id);
  job_runtime_init(j);
  /* what the store has is counted (a repeat is a retry); the rest completes
   * in order from there, however the ranks' re-sent reports interleave */
  j->next_iteration = j->row.iterations_done > 0 ? j->row.iterations_done : -1;
  j->max_reported = j->row.iterations_done - 1;
  j->ranks = zb_calloc((size_t)p, sizeof *j->ranks);
  j->rank_hosts = zb_calloc((size_t)p, sizeof *j->rank_hosts);
  j->rank_workers = zb_calloc((size_t)p, sizeof *j->rank_workers);
  j->recovered = true;
  int64_t window = 3LL * co->cfg.heartbeat_timeout_ms;
  j->recover_until_ms = zb_clock_unix_ms() + (window > COORD_RECOVER_MS ? window : COORD_RECOVER_MS);
  snprintf(j->row.reason, sizeof j->row.reason,
           "taken back after a coordinator restart at iteration %d: waiting for its %d ranks' workers",
           j->row.iterations_done, p);
  ZB_INFO("job %s: %s", j->row.id, j->row.reason);
  job_event(co, j, NULL, NULL);
}

void job_readmit(coord *co, coord_job *j) {
  (void)co; /* its plan is made when its workers are there (dispatch.c) */
  ZB_INFO("job %s: waiting again after a coordinator restart (%s; planned anew at its start)", j->row.id,
          j->row.schedule);
}

static void release(coord_worker *w, const char *job_id, const char *why) {
  ZB_INFO("worker %s runs job %s, which %s: releasing it", w->id, job_id, why);
  Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
  cmd.kind_case = ZB__V1__COMMAND__KIND_RELEASE_JOB_ID;
  cmd.release_job_id = (char *)job_id;
  worker_send(w, &cmd);
}

bool coord_attach_allowed(coord *co, zb_rpc_call *call, const char *owner, const char *job_id, int rank) {
  coord_job *j = job_id && job_id[0] ? job_find(co, job_id) : NULL;
  /* only a rank waiting for its worker is guarded here; any other naming is
   * released by coord_attach_running, which gives nothing */
  if (!j || j->row.state != ZB_JOB_RUNNING || !j->recover_until_ms || rank < 0 ||
      rank >= zb_job_spec_world(&j->spec) || j->ranks[rank] ||
      j->row.n_rank_owners != zb_job_spec_world(&j->spec))
    return true;
  const char *ran = j->row.rank_owners[rank];
  if (strcmp(ran, owner) == 0)
    return true;
  ZB_WARN("job %s: %s named rank %d, which %s ran: refused; the rank waits for its own worker", j->row.id,
          owner, rank, ran);
  zb_rpc_fail(call, GRPC_STATUS_PERMISSION_DENIED,
              "running_rank: rank %d of job %s ran on %s, and %s may not take it back", rank, j->row.id, ran,
              owner);
  return false;
}

void coord_attach_running(coord *co, coord_worker *w, const char *job_id, int rank) {
  if (!job_id || !job_id[0])
    return;
  coord_job *j = job_find(co, job_id);
  if (!j || j->row.state != ZB_JOB_RUNNING) {
    release(w, job_id, j ? "is not running" : "this coordinator does not know");
    return;
  }
  if (!j->recover_until_ms || rank < 0 || rank >= zb_job_spec_world(&j->spec) || j->ranks[rank]) {
    release(w, job_id, "runs without it");
    return;
  }
  /* the store's rank owner is the certificate, which a run's agents share
   * (and, without TLS, a worker id anything may take): the binding is what
   * ties a rank to its process, as at placement */
  if (!worker_bound_for_rank(w, &j->spec, rank)) {
    ZB_WARN("job %s: worker %s (torch run %s, rank %d) named rank %d, which it is not bound to run",
            j->row.id, w->id, w->torch_run[0] ? w->torch_run : "(none)", w->torch_rank, rank);
    release(w, job_id, "binds its ranks otherwise (torch run and rank)");
    return;
  }
  w->job = j;
  w->rank = rank;
  j->ranks[rank] = w;
  snprintf(j->rank_hosts[rank], sizeof j->rank_hosts[rank], "%s", w->hostname);
  snprintf(j->rank_workers[rank], sizeof j->rank_workers[rank], "%s", w->id);
  int back = 0;
  for (int r = 0; r < zb_job_spec_world(&j->spec); r++)
    back += j->ranks[r] != NULL;
  ZB_INFO("job %s: rank %d back on worker %s, %s (%d of %d)", j->row.id, rank, w->id, w->owner, back,
          zb_job_spec_world(&j->spec));
  if (back < zb_job_spec_world(&j->spec))
    return;
  j->recover_until_ms = 0;
  if (!j->row.n_rank_owners) /* a job from store schema 1: kept from now on */
    job_record_owners(j);
  snprintf(j->row.reason, sizeof j->row.reason, "running again after a coordinator restart: every rank back");
  job_event(co, j, NULL, NULL);
}

void coord_recovery_tick(coord *co, int64_t now_ms) {
  for (coord_job *j = co->jobs; j; j = j->next) {
    if (j->row.state != ZB_JOB_RUNNING || !j->recover_until_ms || now_ms < j->recover_until_ms)
      continue;
    int missing = -1, n = 0;
    for (int r = 0; r < zb_job_spec_world(&j->spec); r++)
      if (!j->ranks[r]) {
        missing = missing < 0 ? r : missing;
        n++;
      }
    char reason[256];
    snprintf(reason, sizeof reason,
             "rank %d%s did not come back within %" PRId64
             " s of the coordinator's restart (its worker did not "
             "attach again)",
             missing, n > 1 ? " and others" : "", (now_ms - j->row.updated_ms) / 1000);
    j->recover_until_ms = 0;
    job_finish(co, j, ZB_JOB_FAILED, reason);
  }
}
