/* jobs.c — the coordinator's jobs and their lifecycle (docs/architecture.md,
 * A job's life): jobs go PENDING -> RUNNING -> SUCCEEDED / FAILED /
 * CANCELLED; every change is an event kept in the store and streamed to
 * watchers. Also loading jobs at start-up and freeing them at exit.
 * Everything runs on the loop thread. */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sys/random.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"
#include "zb_timeline_pb.h"

void job_new_data_secret(coord_job *j) {
  size_t got = 0;
  while (got < sizeof j->data_secret) {
    ssize_t n = getrandom(j->data_secret + got, sizeof j->data_secret - got, 0);
    if (n > 0)
      got += (size_t)n;
  }
}

void job_rank_who(const coord_job *j, const coord_worker *w, char *out, size_t cap) {
  int p = j->spec.ranks;
  if (j->spec.data_parallel > 1)
    snprintf(out, cap, "rank %d (replica %d, stage %d, worker %s)", w->rank, zb_dp_replica(w->rank, p),
             zb_dp_pipeline_rank(w->rank, p), w->id);
  else
    snprintf(out, cap, "rank %d (worker %s)", w->rank, w->id);
}

coord_job *job_find(coord *co, const char *id) {
  return zb_strmap_get(&co->job_index, id);
}

bool utf8_valid(const char *s) {
  return !s || s[zb_utf8_prefix(s)] == 0;
}

/* Drops what a truncating snprintf left of a multi-byte character. */
void utf8_trim(char *s) {
  s[zb_utf8_prefix(s)] = 0;
}

bool job_terminal(const coord_job *j) {
  return j->row.state >= ZB_JOB_SUCCEEDED;
}

/* ---- persistence and events ---- */

/* Writes j's row; on failure marks it dirty and the store failing. */
static bool job_persist(coord *co, coord_job *j, zb_diag *d) {
  if (zb_store_put_job(co->store, &j->row, d) == ZB_OK) {
    j->dirty = false;
    return true;
  }
  if (!co->store_failing)
    ZB_ERROR("store: %s; NOT_SERVING until it takes writes again", d->msg);
  j->dirty = co->store_failing = true;
  return false;
}

void coord_store_retry(coord *co) {
  if (!co->store_failing)
    return;
  zb_diag d;
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->dirty && !job_persist(co, j, &d))
      return;
  co->store_failing = false;
  ZB_INFO("store: writes succeed again; serving");
}

bool job_event(coord *co, coord_job *j, const Zb__V1__IterationMetrics *it, zb_diag *diag) {
  size_t packed_len = it ? protobuf_c_message_get_packed_size(&it->base) : 0;
  uint8_t *packed = it ? zb_malloc(packed_len ? packed_len : 1) : NULL;
  if (it) { /* the job row keeps the last iteration's figures */
    protobuf_c_message_pack(&it->base, packed);
    free(j->row.last);
    j->row.last = packed;
    j->row.last_len = packed_len;
  }
  zb_store_event se;
  zb_diag d;
  jc_iteration jit = {
      .packed = packed, .len = packed_len, .number = it ? it->iteration : 0, .traced = it && it->aligned};
  bool stored = jc_record(co->store, &j->row, it ? &jit : NULL, zb_clock_unix_ms(), &se, &d) == ZB_OK;
  if (stored) {
    j->dirty = false;
  } else {
    if (!co->store_failing)
      ZB_ERROR("store: %s; NOT_SERVING until it takes writes again", d.msg);
    j->dirty = co->store_failing = true;
    if (diag)
      *diag = d;
  }
  Zb__V1__JobEvent ev = ZB__V1__JOB_EVENT__INIT;
  ev.seq = se.seq;
  ev.unix_ms = se.unix_ms;
  ev.state = (Zb__V1__JobState)j->row.state;
  ev.reason = j->row.reason;
  ev.iteration = (Zb__V1__IterationMetrics *)it;
  watch_send_live(j, &ev);
  return stored;
}

static void job_runtime_free(coord_job *j) {
  zb_planner_result_free(&j->plan);
  zb_planner_result_free(&j->next_plan);
  for (int k = 0; k < COORD_ITER_SLOTS; k++) {
    for (int r = 0; j->slots[k].ranks && r < zb_job_spec_world(&j->spec); r++)
      zb_timeline_pb_free(j->slots[k].ranks[r].timeline);
    free(j->slots[k].have);
    free(j->slots[k].ranks);
    j->slots[k].have = NULL;
    j->slots[k].ranks = NULL;
  }
  free(j->ranks);
  free(j->rank_done);
  free(j->group_ids);
  free(j->has_group_id);
  j->ranks = NULL;
  j->rank_done = NULL;
  j->group_ids = NULL;
  j->has_group_id = NULL;
}

/* Moves a job to a final state: releases its workers, ends its watchers'
 * streams. */
void job_finish(coord *co, coord_job *j, int state, const char *reason) {
  if (!jc_may_move(j->row.state, state))
    return;
  j->row.state = state;
  snprintf(j->row.reason, sizeof j->row.reason, "%s", reason);
  utf8_trim(j->row.reason);
  ZB_INFO("job %s %s: %s", j->row.id, zb_job_state_name(state), reason);
  coord_metrics_job_finished(co, state);
  job_release_workers(j);
  job_event(co, j, NULL, NULL);
  watch_end_live(j);
  job_runtime_free(j);
}

/* ---- Job messages ---- */

/* Job.rank_workers and rank_states, by global rank (the strings are j's
 * or constants). */
static void job_pb_grid(const coord_job *j, Zb__V1__Job *out) {
  size_t n = (size_t)zb_job_spec_world(&j->spec);
  out->n_rank_workers = out->n_rank_states = n;
  out->rank_workers = zb_malloc(sizeof *out->rank_workers * n);
  out->rank_states = zb_malloc(sizeof *out->rank_states * n);
  for (size_t g = 0; g < n; g++) {
    out->rank_workers[g] = (char *)j->rank_workers[g];
    bool running = j->row.state == ZB_JOB_RUNNING;
    out->rank_states[g] = (char *)(j->rank_done && j->rank_done[g] ? "done"
                                   : running                       ? "running"
                                                                   : zb_job_state_name(j->row.state));
  }
}

/* Fills out from j; release with job_pb_clear. */
void job_pb(const coord_job *j, Zb__V1__Job *out) {
  zb__v1__job__init(out);
  out->id = (char *)j->row.id;
  out->spec = (Zb__V1__JobSpec *)protobuf_c_message_unpack(&zb__v1__job_spec__descriptor, NULL,
                                                           j->row.spec_len, j->row.spec);
  out->state = (Zb__V1__JobState)j->row.state;
  out->reason = (char *)j->row.reason;
  out->created_unix_ms = j->row.created_ms;
  out->updated_unix_ms = j->row.updated_ms;
  out->iterations_done = j->row.iterations_done;
  out->schedule = (char *)j->row.schedule;
  if (j->row.last)
    out->last = (Zb__V1__IterationMetrics *)protobuf_c_message_unpack(&zb__v1__iteration_metrics__descriptor,
                                                                      NULL, j->row.last_len, j->row.last);
  out->learned = job_learned_pb(j);
  if (j->rank_hosts) {
    out->n_rank_hosts = (size_t)zb_job_spec_world(&j->spec);
    out->rank_hosts = zb_malloc(sizeof *out->rank_hosts * out->n_rank_hosts);
    for (size_t r = 0; r < out->n_rank_hosts; r++)
      out->rank_hosts[r] = j->rank_hosts[r];
  }
  if (j->rank_workers)
    job_pb_grid(j, out);
}

void job_pb_clear(Zb__V1__Job *pb) {
  if (pb->spec)
    protobuf_c_message_free_unpacked(&pb->spec->base, NULL);
  if (pb->last)
    protobuf_c_message_free_unpacked(&pb->last->base, NULL);
  if (pb->learned)
    protobuf_c_message_free_unpacked(&pb->learned->base, NULL);
  free(pb->rank_hosts);
  free(pb->rank_workers);
  free(pb->rank_states);
  pb->rank_workers = pb->rank_states = NULL;
  pb->n_rank_workers = pb->n_rank_states = 0;
}

coord_job *job_lookup(coord *co, zb_rpc_call *call, const char *id) {
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_USER | AUTHZ_ADMIN, "act on jobs", &who))
    return NULL;
  if (!id || !id[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "job_id: required");
    return NULL;
  }
  coord_job *j = job_find(co, id);
  if (!j)
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "job_id: no job '%s'", id);
  return j && authz_job(co, call, &who, j) ? j : NULL;
}

/* ---- start-up, ticks, teardown ---- */

/* Loads the jobs; those RUNNING when the coordinator stopped are taken
 * back (recovery.c), those PENDING planned anew to wait as before; either
 * with a stored spec that no longer reads fails. */
zb_err coord_load(coord *co, zb_diag *diag) {
  zb_err err;
  zb_store_job *rows = NULL;
  int n = 0;
  if ((err = zb_store_list_jobs(co->store, &rows, &n, diag)))
    return err;
  coord_job **tail = &co->jobs;
  co->next_job_number = 1;
  for (int k = 0; k < n; k++) {
    coord_job *j = zb_calloc(1, sizeof *j);
    job_new_data_secret(j);
    j->row = rows[k];
    rows[k].spec = rows[k].last = NULL; /* moved */
    rows[k].rank_owners = NULL;
    Zb__V1__JobSpec *pb = (Zb__V1__JobSpec *)protobuf_c_message_unpack(&zb__v1__job_spec__descriptor, NULL,
                                                                       j->row.spec_len, j->row.spec);
    zb_diag d;
    if (!pb || zb_wire_spec_from_pb(pb, &j->spec, &d) != ZB_OK) {
      zb_job_spec_default(&j->spec); /* kept for its history; never runs again */
      j->spec_unreadable = true;
    }
    if (pb)
      protobuf_c_message_free_unpacked(&pb->base, NULL);
    /* ids are j-<number>: the next one follows the largest stored (read
     * as 64-bit and range-checked, so j-2147483647 is followed by
     * j-2147483648, not an overflow) */
    char *end = NULL;
    errno = 0;
    long long number = strncmp(j->row.id, "j-", 2) == 0 ? strtoll(j->row.id + 2, &end, 10) : -1;
    if (end && *end == 0 && errno == 0 && number >= co->next_job_number && number < INT64_MAX)
      co->next_job_number = number + 1;
    *tail = j;
    tail = &j->next;
    zb_strmap_put(&co->job_index, j->row.id, j);
  }
  zb_store_jobs_free(rows, n);
  int64_t last = 0; /* past every id ever stored, pruned ones included */
  if ((err = zb_store_last_job_number(co->store, &last, diag)))
    return err;
  if (last >= co->next_job_number && last < INT64_MAX)
    co->next_job_number = last + 1;
  ZB_INFO("loaded %d job(s) from the store; next id j-%" PRId64, n, co->next_job_number);
  for (coord_job *j = co->jobs; j; j = j->next) {
    jc_restart what = jc_at_restart(j->row.state, !j->spec_unreadable);
    if (what == JC_FAIL_UNREADABLE)
      job_finish(co, j, ZB_JOB_FAILED, "the coordinator restarted and cannot read the job's stored spec");
    else if (what == JC_READMIT)
      job_readmit(co, j);
  }
  /* the running ones last: each starts the window its ranks have to come
   * back in (their plans are made here, on the loop) */
  for (coord_job *j = co->jobs; j; j = j->next)
    if (jc_at_restart(j->row.state, !j->spec_unreadable) == JC_RECOVER)
      job_recover(co, j);
  return ZB_OK;
}

void job_free(coord_job *j) {
  watch_free_all(j);
  job_runtime_free(j);
  zb_costs_free(j->learned); /* kept past the run: zbctl get shows it */
  coord_metrics_forget_job(j);
  free(j->rank_hosts);
  free(j->rank_workers);
  free(j->slowdown);
  zb_job_spec_free(&j->spec);
  free(j->row.spec);
  free(j->row.last);
  free(j->row.rank_owners);
  free(j);
}

void coord_free_state(coord *co) {
  coord_plans_drop_queued(co); /* a queued start plan points at its job */
  coord_job *j = co->jobs;
  while (j) {
    coord_job *next = j->next;
    job_free(j);
    j = next;
  }
  co->jobs = NULL;
  zb_strmap_free(&co->job_index);
  coord_worker *w = co->workers;
  while (w) {
    coord_worker *next = w->next;
    free(w);
    w = next;
  }
  co->workers = NULL;
  watch_free_owners(co);
  zb_strmap_free(&co->worker_index);
}
