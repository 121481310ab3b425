/* The coordinator's RPCs and job lifecycle (DESIGN §1): jobs go PENDING →
 * RUNNING → SUCCEEDED / FAILED / CANCELLED, every change is an event kept
 * in the store and streamed to watchers; workers attach with a stream that
 * carries their assignments; their per-iteration reports are gathered
 * into one IterationMetrics per iteration. Everything runs on the loop. */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coordinator.h"
#include "grpc/health/v1/health.pb-c.h"
#include "zb_alloc.h"
#include "zb_log.h"
#include "zb_utf8.h"

int64_t coord_now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static coord_job *job_find(coord *co, const char *id) {
  for (coord_job *j = co->jobs; j; j = j->next)
    if (strcmp(j->row.id, id) == 0)
      return j;
  return NULL;
}

static coord_worker *worker_find(coord *co, const char *id) {
  for (coord_worker *w = co->workers; w; w = w->next)
    if (strcmp(w->id, id) == 0)
      return w;
  return NULL;
}

static bool utf8_valid(const char *s) {
  return !s || s[zb_utf8_prefix(s)] == 0;
}

/* Drops what a truncating snprintf left of a multi-byte character. */
static void utf8_trim(char *s) {
  s[zb_utf8_prefix(s)] = 0;
}

static bool job_terminal(const coord_job *j) {
  return j->row.state >= ZB_JOB_SUCCEEDED;
}

/* Whether name is one of a worker's comma-separated capabilities. */
static bool worker_offers(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; *p;) {
    const char *comma = strchr(p, ',');
    size_t len = comma ? (size_t)(comma - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0)
      return true;
    p += len + (comma ? 1 : 0);
  }
  return false;
}

/* An attached worker that offers the job's backend and transport. */
static bool worker_can_run(const coord_worker *w, const zb_job_spec *spec) {
  return w->attach && worker_offers(w->backends, spec->backend) &&
         worker_offers(w->transports, spec->transport);
}

static int workers_idle(coord *co, const zb_job_spec *spec) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += worker_can_run(w, spec) && !w->job;
  return n;
}

static int workers_attached(coord *co) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += w->attach != NULL;
  return n;
}

static int workers_able(coord *co, const zb_job_spec *spec) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += worker_can_run(w, spec);
  return n;
}

/* ---- persistence and events ---- */

static void job_persist(coord *co, coord_job *j) {
  zb_diag d;
  if (zb_store_put_job(co->store, &j->row, &d) != ZB_OK)
    ZB_ERROR("store: %s", d.msg);
}

/* Records an event (state, reason, optional iteration), persists the job
 * and sends the event to every watcher. */
static void job_event(coord *co, coord_job *j, const Zb__V1__IterationMetrics *it) {
  Zb__V1__JobEvent ev = ZB__V1__JOB_EVENT__INIT;
  ev.seq = j->row.next_seq++;
  ev.unix_ms = coord_now_ms();
  ev.state = (Zb__V1__JobState)j->row.state;
  ev.reason = j->row.reason;
  ev.iteration = (Zb__V1__IterationMetrics *)it;
  j->row.updated_ms = ev.unix_ms;
  zb_store_event se = {.seq = ev.seq, .unix_ms = ev.unix_ms, .state = j->row.state};
  snprintf(se.job_id, sizeof se.job_id, "%s", j->row.id);
  snprintf(se.reason, sizeof se.reason, "%s", j->row.reason);
  uint8_t *packed = NULL;
  if (it) {
    se.iteration_len = protobuf_c_message_get_packed_size(&it->base);
    packed = zb_malloc(se.iteration_len);
    protobuf_c_message_pack(&it->base, packed);
    se.iteration = packed;
  }
  zb_diag d;
  if (zb_store_append_event(co->store, &se, &d) != ZB_OK)
    ZB_ERROR("store: %s", d.msg);
  if (it) { /* the job row keeps the last iteration's figures */
    free(j->row.last);
    j->row.last = packed;
    j->row.last_len = se.iteration_len;
    packed = NULL;
  }
  free(packed);
  job_persist(co, j);
  for (coord_watcher *w = j->watchers; w; w = w->next)
    zb_rpc_stream_write(w->call, &ev.base);
  coord_metrics_render(co); /* a scrape right after an event sees it */
}

static void worker_send(coord_worker *w, const Zb__V1__Command *cmd) {
  if (w->attach)
    zb_rpc_stream_write(w->attach, &cmd->base);
}

static void job_release_workers(coord_job *j) {
  if (!j->ranks)
    return;
  for (int r = 0; r < j->spec.ranks; r++) {
    coord_worker *w = j->ranks[r];
    if (!w)
      continue;
    Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
    cmd.kind_case = ZB__V1__COMMAND__KIND_RELEASE_JOB_ID;
    cmd.release_job_id = j->row.id;
    worker_send(w, &cmd);
    w->job = NULL;
    w->rank = -1;
    j->ranks[r] = NULL;
  }
}

static void job_runtime_free(coord_job *j) {
  zb_wire_plan_free(&j->plan);
  zb_wire_plan_free(&j->next_plan);
  for (int k = 0; k < COORD_ITER_SLOTS; k++) {
    free(j->slots[k].have);
    free(j->slots[k].ranks);
    j->slots[k].have = NULL;
    j->slots[k].ranks = NULL;
  }
  free(j->ranks);
  free(j->rank_done);
  j->ranks = NULL;
  j->rank_done = NULL;
}

/* Moves a job to a final state: releases its workers, ends its watchers'
 * streams. */
static void job_finish(coord *co, coord_job *j, int state, const char *reason) {
  if (job_terminal(j))
    return;
  j->row.state = state;
  snprintf(j->row.reason, sizeof j->row.reason, "%s", reason);
  utf8_trim(j->row.reason);
  ZB_INFO("job %s %s: %s", j->row.id, zb_wire_state_name(state), reason);
  job_release_workers(j);
  job_event(co, j, NULL);
  coord_watcher *w = j->watchers;
  j->watchers = NULL;
  while (w) {
    coord_watcher *next = w->next;
    zb_rpc_call_on_close(w->call, NULL, NULL);
    zb_rpc_stream_finish(w->call, GRPC_STATUS_OK, "");
    free(w);
    w = next;
  }
  job_runtime_free(j);
}

/* ---- starting jobs ---- */

/* Rank r's Assignment of plan (version, first iteration); arrays owned by
 * the caller through assignment_clear. */
static void job_assignment(coord_job *j, const zb_wire_plan *plan, int r, int version, int first,
                           Zb__V1__Assignment *a, Zb__V1__RankActions *ra) {
  zb__v1__assignment__init(a);
  a->job_id = j->row.id;
  a->rank = r;
  a->ranks = plan->p;
  a->n_peer_addresses = (size_t)plan->p;
  a->peer_addresses = zb_malloc(sizeof(char *) * (size_t)plan->p);
  for (int k = 0; k < plan->p; k++)
    a->peer_addresses[k] = j->ranks && j->ranks[k] ? j->ranks[k]->data_address : "";
  zb_wire_rank_actions(plan->lowered, r, ra);
  a->actions = ra;
  int S = plan->p * plan->v;
  a->n_stage_seconds = (size_t)S;
  a->stage_seconds = zb_malloc(sizeof *a->stage_seconds * (size_t)S);
  Zb__V1__StageCosts *sc = zb_malloc(sizeof *sc * (size_t)S);
  a->n_stage_m_f = a->n_stage_m_b = a->n_stage_m_w = (size_t)S;
  a->stage_m_f = zb_malloc(sizeof(double) * (size_t)S * 3);
  a->stage_m_b = a->stage_m_f + S;
  a->stage_m_w = a->stage_m_b + S;
  for (int s = 0; s < S; s++) {
    zb__v1__stage_costs__init(&sc[s]);
    sc[s].t_f = plan->costs->t_f[s];
    sc[s].t_b = plan->costs->t_b[s];
    sc[s].t_w = plan->costs->t_w[s];
    a->stage_seconds[s] = &sc[s];
    a->stage_m_f[s] = plan->costs->m_f[s];
    a->stage_m_b[s] = plan->costs->m_b[s];
    a->stage_m_w[s] = plan->costs->m_w[s];
  }
  a->first_iteration = first;
  a->iterations = j->spec.iterations;
  a->bytes_per_activation = j->spec.bytes_per_activation;
  a->backend = j->spec.backend;
  a->transport = j->spec.transport;
  a->plan_version = version;
  a->schedule = (char *)zb_family_name(plan->family);
  a->microbatches = plan->m;
  if (strcmp(j->spec.backend, "cpu") == 0) { /* the spec's model, resolved when it was submitted */
    /* m first: assignment_clear frees the block by a->model */
    zb_wire_model_pb *block = zb_malloc(sizeof *block);
    zb_wire_model_to_pb(&j->spec.model, block);
    a->model = &block->m;
  }
}

static void assignment_clear(Zb__V1__Assignment *a, Zb__V1__RankActions *ra) {
  free(a->peer_addresses);
  if (a->n_stage_seconds)
    free(a->stage_seconds[0]);
  free(a->stage_seconds);
  free(a->stage_m_f);
  free(a->model);
  zb_wire_rank_actions_clear(ra);
}

/* The largest per-rank Assignment of plan, packed. */
static size_t plan_max_assignment_bytes(coord_job *j, const zb_wire_plan *plan, int *worst_rank) {
  size_t worst = 0;
  for (int r = 0; r < plan->p; r++) {
    Zb__V1__Assignment a;
    Zb__V1__RankActions ra;
    job_assignment(j, plan, r, 1, 0, &a, &ra);
    Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
    cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
    cmd.assign = &a;
    size_t n = protobuf_c_message_get_packed_size(&cmd.base);
    assignment_clear(&a, &ra);
    if (n > worst) {
      worst = n;
      *worst_rank = r;
    }
  }
  return worst;
}

/* Sum of the decimal lengths of 0..n-1. */
static double digits_total(double n) {
  double t = 0;
  for (double lo = 0, hi = 10, len = 1; lo < n; lo = hi, hi *= 10, len++)
    t += ((n < hi ? n : hi) - lo) * len;
  return t;
}

/* A lower bound on the packed size of the action lists of a shape: every
 * (stage, microbatch) has at least an F and a B ("<stage>F<mb>", framed by
 * a tag and a length byte). whole: all ranks (a PlanResponse); else the
 * busiest rank's v stages (an Assignment). */
static double plan_min_bytes(const zb_job_spec *spec, bool whole) {
  zb_family f;
  if (zb_family_parse(spec->schedule, &f, NULL) != ZB_OK)
    return 0;
  double v = spec->chunks > 0 ? spec->chunks : zb_family_default_chunks(f);
  double m = spec->microbatches, stages = whole ? spec->ranks * v : v;
  double stage_digits = whole ? digits_total(stages) : stages;
  return 2 * (3 * stages * m + stage_digits * m + stages * digits_total(m));
}

/* Refuses a shape whose plan cannot fit the message limit before planning
 * it: generating a plan of millions of actions holds the loop (and so every
 * heartbeat and report) for seconds, only to refuse it afterwards. */
static bool plan_fits(coord *co, zb_rpc_call *call, const zb_job_spec *spec, bool whole) {
  double need = plan_min_bytes(spec, whole);
  if (need <= (double)co->cfg.max_message_bytes)
    return true;
  zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "spec: %s of p=%d m=%d needs at least %.0f bytes, over the %lld-byte message limit "
              "(max_message_bytes); use fewer microbatches or ranks",
              whole ? "the plan" : "one rank's plan", spec->ranks, spec->microbatches, need,
              co->cfg.max_message_bytes);
  return false;
}

static void job_send_plan(coord_job *j, const zb_wire_plan *plan, int version, int first) {
  for (int r = 0; r < plan->p; r++) {
    Zb__V1__Assignment a;
    Zb__V1__RankActions ra;
    job_assignment(j, plan, r, version, first, &a, &ra);
    Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
    cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
    cmd.assign = &a;
    worker_send(j->ranks[r], &cmd);
    assignment_clear(&a, &ra);
  }
}

static void job_start(coord *co, coord_job *j) {
  zb_diag d;
  if (zb_wire_plan_make(&j->spec, ZB_OBJ_MAKESPAN, &j->plan, &d) != ZB_OK) {
    job_finish(co, j, ZB_JOB_FAILED, d.msg);
    return;
  }
  coord_metrics_observe_plan(co, j->plan.generation_seconds);
  int p = j->spec.ranks;
  j->ranks = zb_calloc((size_t)p, sizeof *j->ranks);
  j->rank_done = zb_calloc((size_t)p, sizeof(bool));
  j->done_ranks = 0;
  j->max_reported = -1;
  j->plan_version = 1;
  j->switch_at = -1;
  for (int k = 0; k < COORD_ITER_SLOTS; k++) {
    j->slots[k].iteration = -1;
    j->slots[k].have = zb_calloc((size_t)p, sizeof(bool));
    j->slots[k].ranks = zb_calloc((size_t)p, sizeof(Zb__V1__RankIteration));
  }
  /* ranks go to idle workers in attach order */
  int r = 0;
  for (coord_worker *w = co->workers; w && r < p; w = w->next)
    if (worker_can_run(w, &j->spec) && !w->job) {
      w->job = j;
      w->rank = r;
      j->ranks[r++] = w;
    }
  j->row.state = ZB_JOB_RUNNING;
  snprintf(j->row.reason, sizeof j->row.reason, "ranks assigned: %d workers", p);
  snprintf(j->row.schedule, sizeof j->row.schedule, "%s", zb_family_name(j->plan.family));
  ZB_INFO("job %s RUNNING: %s on %d ranks, %d microbatches, %d iterations", j->row.id, j->row.schedule, p,
          j->spec.microbatches, j->spec.iterations);
  job_event(co, j, NULL);
  job_send_plan(j, &j->plan, 1, 0);
}

/* Starts pending jobs, oldest first, while enough workers are idle. */
static void coord_start_pending(coord *co) {
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state == ZB_JOB_PENDING) {
      if (workers_idle(co, &j->spec) < j->spec.ranks)
        return; /* keep the order: no overtaking */
      job_start(co, j);
    }
}

/* ---- Job messages ---- */

/* Fills out from j; release with job_pb_clear. */
static void job_pb(const coord_job *j, Zb__V1__Job *out) {
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
}

static void job_pb_clear(Zb__V1__Job *pb) {
  if (pb->spec)
    protobuf_c_message_free_unpacked(&pb->spec->base, NULL);
  if (pb->last)
    protobuf_c_message_free_unpacked(&pb->last->base, NULL);
}

static coord_job *job_lookup(coord *co, zb_rpc_call *call, const char *id) {
  if (!id || !id[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "job_id: required");
    return NULL;
  }
  coord_job *j = job_find(co, id);
  if (!j)
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "job_id: no job '%s'", id);
  return j;
}

/* ---- handlers: users ---- */

/* The spec of job id for a resumed job (SubmitJobRequest.resume_from_job_id),
 * unpacked (the caller frees it), or NULL after failing call: the job must
 * have ended without finishing and have checkpoints. The coordinator
 * cannot see the files (they are on the workers' file system): which
 * iteration every rank holds is settled by the new job's ranks. */
static Zb__V1__JobSpec *resume_spec(coord *co, zb_rpc_call *call, const char *id) {
  coord_job *old = job_find(co, id);
  if (!old) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "resume_from_job_id: no job %.64s", id);
    return NULL;
  }
  if (old->row.state == ZB_JOB_PENDING || old->row.state == ZB_JOB_RUNNING ||
      old->row.state == ZB_JOB_SUCCEEDED) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "resume_from_job_id: job %s %s", id,
                old->row.state == ZB_JOB_SUCCEEDED ? "has finished: nothing to resume"
                                                   : "has not ended (cancel it first)");
    return NULL;
  }
  if (strcmp(old->spec.backend, "cpu") != 0 || old->spec.model.checkpoint_every <= 0) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "resume_from_job_id: job %s has no checkpoints (a cpu job with model.checkpoint_every > 0)",
                id);
    return NULL;
  }
  Zb__V1__JobSpec *pb = (Zb__V1__JobSpec *)protobuf_c_message_unpack(&zb__v1__job_spec__descriptor, NULL,
                                                                     old->row.spec_len, old->row.spec);
  if (!pb) {
    zb_rpc_fail(call, GRPC_STATUS_INTERNAL, "resume_from_job_id: job %s: its stored spec does not unpack",
                id);
    return NULL;
  }
  return pb;
}

static void on_submit(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__SubmitJobRequest *req = (const void *)m;
  const char *resume = req->resume_from_job_id && req->resume_from_job_id[0] ? req->resume_from_job_id : NULL;
  if (!req->spec && !resume) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: required");
    return;
  }
  if (req->spec && resume) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "spec: must be absent with resume_from_job_id (the job takes job %.64s's spec)", resume);
    return;
  }
  if (co->stopping) {
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "the coordinator is shutting down");
    return;
  }
  Zb__V1__JobSpec *resume_pb = NULL;
  if (resume && !(resume_pb = resume_spec(co, call, resume)))
    return;
  coord_job *j = zb_calloc(1, sizeof *j);
  zb_diag d;
  zb_err werr = zb_wire_spec_from_pb(resume ? resume_pb : req->spec, &j->spec, &d);
  if (resume_pb)
    protobuf_c_message_free_unpacked(&resume_pb->base, NULL);
  if (werr != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: %s", d.msg);
    free(j);
    return;
  }
  if (!resume && j->spec.model.resume_from[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "spec.model.resume_from_job_id: set by the coordinator only; use "
                "SubmitJobRequest.resume_from_job_id (zbctl resume)");
    goto fail;
  }
  if (resume) /* replaces the job the old one was resumed from, if it was */
    snprintf(j->spec.model.resume_from, sizeof j->spec.model.resume_from, "%s", resume);
  if (!plan_fits(co, call, &j->spec, false))
    goto fail;
  /* plan now, so a bad or oversized plan is refused before it is queued */
  zb_wire_plan plan;
  if (zb_wire_plan_make(&j->spec, ZB_OBJ_MAKESPAN, &plan, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec.schedule: %s", d.msg);
    goto fail;
  }
  int worst_rank = 0;
  size_t worst = plan_max_assignment_bytes(j, &plan, &worst_rank);
  zb_wire_plan_free(&plan);
  if ((long long)worst > co->cfg.max_message_bytes) {
    zb_rpc_fail(
        call, GRPC_STATUS_RESOURCE_EXHAUSTED,
        "spec: the plan for rank %d is %zu bytes, over the %lld-byte message limit (max_message_bytes); "
        "use fewer microbatches or ranks",
        worst_rank, worst, co->cfg.max_message_bytes);
    goto fail;
  }
  int attached = workers_attached(co);
  if (j->spec.ranks > attached) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "spec.ranks: the job needs %d ranks but %d workers are attached", j->spec.ranks, attached);
    goto fail;
  }
  int able = workers_able(co, &j->spec);
  if (j->spec.ranks > able) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "spec.backend: the job needs %d ranks with backend '%s' and transport '%s' but %d of the %d "
                "attached workers offer them",
                j->spec.ranks, j->spec.backend, j->spec.transport, able, attached);
    goto fail;
  }
  snprintf(j->row.id, sizeof j->row.id, "j-%d", co->next_job_number++);
  snprintf(j->row.name, sizeof j->row.name, "%s", j->spec.name);
  snprintf(j->row.schedule, sizeof j->row.schedule, "%s", j->spec.schedule);
  j->row.state = ZB_JOB_PENDING;
  snprintf(j->row.reason, sizeof j->row.reason, "submitted");
  j->row.created_ms = coord_now_ms();
  j->row.next_seq = 1;
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&j->spec, &pb);
  j->row.spec_len = protobuf_c_message_get_packed_size(&pb.base);
  j->row.spec = zb_malloc(j->row.spec_len);
  protobuf_c_message_pack(&pb.base, j->row.spec);
  zb_wire_spec_pb_clear(&pb);
  coord_job **tail = &co->jobs;
  while (*tail)
    tail = &(*tail)->next;
  *tail = j;
  ZB_INFO("job %s submitted: %s, %s, p=%d m=%d", j->row.id, j->spec.name, j->spec.schedule, j->spec.ranks,
          j->spec.microbatches);
  job_event(co, j, NULL);
  Zb__V1__SubmitJobResponse resp = ZB__V1__SUBMIT_JOB_RESPONSE__INIT;
  resp.job_id = j->row.id;
  zb_rpc_reply(call, &resp.base);
  coord_start_pending(co);
  return;
fail:
  zb_job_spec_free(&j->spec);
  free(j);
}

static void on_get_job(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  const Zb__V1__GetJobRequest *req = (const void *)m;
  coord_job *j = job_lookup(user, call, req->job_id);
  if (!j)
    return;
  Zb__V1__Job pb;
  job_pb(j, &pb);
  zb_rpc_reply(call, &pb.base);
  job_pb_clear(&pb);
}

static void on_list_jobs(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  (void)m;
  coord *co = user;
  int n = 0;
  for (coord_job *j = co->jobs; j; j = j->next)
    n++;
  Zb__V1__Job *jobs = zb_calloc((size_t)(n ? n : 1), sizeof *jobs);
  Zb__V1__Job **ptrs = zb_calloc((size_t)(n ? n : 1), sizeof *ptrs);
  int k = 0;
  for (coord_job *j = co->jobs; j; j = j->next, k++) {
    job_pb(j, &jobs[k]);
    ptrs[k] = &jobs[k];
  }
  Zb__V1__ListJobsResponse resp = ZB__V1__LIST_JOBS_RESPONSE__INIT;
  resp.n_jobs = (size_t)n;
  resp.jobs = ptrs;
  zb_rpc_reply(call, &resp.base);
  for (k = 0; k < n; k++)
    job_pb_clear(&jobs[k]);
  free(jobs);
  free(ptrs);
}

static void on_cancel(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__CancelJobRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j)
    return;
  if (job_terminal(j)) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "job_id: job %s has already ended (%s)", j->row.id,
                zb_wire_state_name(j->row.state));
    return;
  }
  if (!utf8_valid(req->reason)) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "reason: not valid UTF-8");
    return;
  }
  char reason[256];
  snprintf(reason, sizeof reason, "cancelled: %s",
           req->reason && req->reason[0] ? req->reason : "by request");
  job_finish(co, j, ZB_JOB_CANCELLED, reason);
  Zb__V1__Job pb;
  job_pb(j, &pb);
  zb_rpc_reply(call, &pb.base);
  job_pb_clear(&pb);
  coord_start_pending(co);
}

static void watcher_closed(zb_rpc_call *call, void *arg) {
  coord_watcher *w = arg;
  coord_watcher **pp = &w->job->watchers;
  while (*pp && *pp != w)
    pp = &(*pp)->next;
  if (*pp)
    *pp = w->next;
  (void)call;
  free(w);
}

static void on_watch(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__WatchJobRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j)
    return;
  zb_store_event *evs = NULL;
  int n = 0;
  zb_diag d;
  if (zb_store_list_events(co->store, j->row.id, 0, &evs, &n, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INTERNAL, "store: %s", d.msg);
    return;
  }
  for (int k = 0; k < n; k++) {
    Zb__V1__JobEvent ev = ZB__V1__JOB_EVENT__INIT;
    ev.seq = evs[k].seq;
    ev.unix_ms = evs[k].unix_ms;
    ev.state = (Zb__V1__JobState)evs[k].state;
    ev.reason = evs[k].reason;
    if (evs[k].iteration)
      ev.iteration = (Zb__V1__IterationMetrics *)protobuf_c_message_unpack(
          &zb__v1__iteration_metrics__descriptor, NULL, evs[k].iteration_len, evs[k].iteration);
    zb_rpc_stream_write(call, &ev.base);
    if (ev.iteration)
      protobuf_c_message_free_unpacked(&ev.iteration->base, NULL);
  }
  zb_store_events_free(evs, n);
  if (job_terminal(j)) {
    zb_rpc_stream_finish(call, GRPC_STATUS_OK, "");
    return;
  }
  coord_watcher *w = zb_calloc(1, sizeof *w);
  w->call = call;
  w->job = j;
  w->next = j->watchers;
  j->watchers = w;
  zb_rpc_call_on_close(call, watcher_closed, w);
}

static void on_update_schedule(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__UpdateScheduleRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j)
    return;
  if (j->row.state != ZB_JOB_RUNNING) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "job_id: job %s is %s, not RUNNING", j->row.id,
                zb_wire_state_name(j->row.state));
    return;
  }
  if (j->switch_at >= 0) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "job_id: job %s already has an update waiting for iteration %d", j->row.id, j->switch_at);
    return;
  }
  if (!req->schedule || !req->schedule[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "schedule: required");
    return;
  }
  zb_job_spec spec = j->spec;
  snprintf(spec.schedule, sizeof spec.schedule, "%s", req->schedule);
  spec.chunks = req->chunks;
  spec.mem_limit = req->mem_limit;
  zb_diag d;
  if (zb_job_spec_check(&spec, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", d.msg);
    return;
  }
  if (!plan_fits(co, call, &spec, false))
    return;
  zb_wire_plan plan;
  if (zb_wire_plan_make(&spec, ZB_OBJ_MAKESPAN, &plan, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "schedule: %s", d.msg);
    return;
  }
  coord_metrics_observe_plan(co, plan.generation_seconds);
  /* A cpu job's ranks keep their stages' weights and optimizer moments
   * across the switch; a plan that places stages elsewhere (another chunk
   * count or placement) would have to move them between ranks, and the
   * layers between stages. Refused rather than carried over: the simpler
   * of the two, and nothing is lost by picking a schedule of the same
   * shape (1f1b, zb-h1, zb-h2, zb-auto; or zb-v, v-half, v-min). */
  zb_placement was = zb_family_placement(j->plan.family), now = zb_family_placement(plan.family);
  if (strcmp(j->spec.backend, "cpu") == 0 && (plan.v != j->plan.v || now != was)) {
    zb_rpc_fail(
        call, GRPC_STATUS_FAILED_PRECONDITION,
        "schedule: job %s is a cpu job whose ranks hold their stages' weights and optimizer state; %s "
        "places %d stage(s) per rank with %s placement where %s places %d with %s placement, so they "
        "would have to move between ranks: choose a schedule with the same chunks and placement",
        j->row.id, spec.schedule, plan.v, now == ZB_PLACE_V ? "V" : "loop", zb_family_name(j->plan.family),
        j->plan.v, was == ZB_PLACE_V ? "V" : "loop");
    zb_wire_plan_free(&plan);
    return;
  }
  /* the same limit as at submission: more chunks make longer action lists */
  int worst_rank = 0;
  size_t worst = plan_max_assignment_bytes(j, &plan, &worst_rank);
  if ((long long)worst > co->cfg.max_message_bytes) {
    zb_wire_plan_free(&plan);
    zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "schedule: the %s plan for rank %d is %zu bytes, over the %lld-byte message limit "
                "(max_message_bytes)",
                spec.schedule, worst_rank, worst, co->cfg.max_message_bytes);
    return;
  }
  /* Ranks run at most about one iteration apart (each needs its
   * neighbours' tensors), so three past the latest report is an iteration
   * no rank has started yet. */
  int at = j->max_reported + 3;
  if (at >= j->spec.iterations) {
    zb_wire_plan_free(&plan);
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "job_id: job %s ends at iteration %d, before an update could apply (iteration %d)", j->row.id,
                j->spec.iterations, at);
    return;
  }
  j->next_plan = plan;
  j->switch_at = at;
  j->plan_version++;
  snprintf(j->spec.schedule, sizeof j->spec.schedule, "%s", spec.schedule);
  j->spec.chunks = spec.chunks;
  j->spec.mem_limit = spec.mem_limit;
  job_send_plan(j, &j->next_plan, j->plan_version, at);
  ZB_INFO("job %s: schedule update to %s from iteration %d (plan version %d)", j->row.id, spec.schedule, at,
          j->plan_version);
  Zb__V1__UpdateScheduleResponse resp = ZB__V1__UPDATE_SCHEDULE_RESPONSE__INIT;
  Zb__V1__Job pb;
  job_pb(j, &pb);
  resp.job = &pb;
  resp.from_iteration = at;
  zb_rpc_reply(call, &resp.base);
  job_pb_clear(&pb);
}

/* A worker's comma-separated capabilities as a repeated field's entries:
 * *items point into *copy; the caller frees both. */
static size_t split_list(const char *list, char **copy, char ***items) {
  size_t n = list[0] ? 1 : 0;
  for (const char *p = list; *p; p++)
    n += *p == ',';
  *copy = zb_malloc(strlen(list) + 1);
  memcpy(*copy, list, strlen(list) + 1);
  *items = zb_calloc(n ? n : 1, sizeof(char *));
  size_t k = 0;
  for (char *p = *copy; n && p; k++) {
    (*items)[k] = p;
    p = strchr(p, ',');
    if (p)
      *p++ = 0;
  }
  return n;
}

static void on_list_workers(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  (void)m;
  coord *co = user;
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n++;
  Zb__V1__Worker *ws = zb_calloc((size_t)(n ? n : 1), sizeof *ws);
  Zb__V1__Worker **ptrs = zb_calloc((size_t)(n ? n : 1), sizeof *ptrs);
  char **copies = zb_calloc((size_t)(n ? n : 1) * 2, sizeof(char *));
  int k = 0;
  for (coord_worker *w = co->workers; w; w = w->next, k++) {
    zb__v1__worker__init(&ws[k]);
    ws[k].id = w->id;
    ws[k].data_address = w->data_address;
    ws[k].n_backends = split_list(w->backends, &copies[2 * k], &ws[k].backends);
    ws[k].n_transports = split_list(w->transports, &copies[2 * k + 1], &ws[k].transports);
    ws[k].gpu = w->gpu;
    ws[k].hostname = w->hostname;
    ws[k].state = w->job ? "busy" : "idle";
    ws[k].job_id = w->job ? w->job->row.id : "";
    ws[k].rank = w->job ? w->rank : -1;
    ws[k].last_seen_unix_ms = w->last_seen_ms;
    ptrs[k] = &ws[k];
  }
  Zb__V1__ListWorkersResponse resp = ZB__V1__LIST_WORKERS_RESPONSE__INIT;
  resp.n_workers = (size_t)n;
  resp.workers = ptrs;
  zb_rpc_reply(call, &resp.base);
  for (k = 0; k < n; k++) {
    free(ws[k].backends);
    free(ws[k].transports);
    free(copies[2 * k]);
    free(copies[2 * k + 1]);
  }
  free(ws);
  free(ptrs);
  free(copies);
}

static void on_plan(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__PlanRequest *req = (const void *)m;
  if (!req->spec) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: required");
    return;
  }
  zb_objective obj = ZB_OBJ_MAKESPAN;
  if (req->objective && req->objective[0]) {
    if (strcmp(req->objective, "span") == 0)
      obj = ZB_OBJ_SPAN;
    else if (strcmp(req->objective, "makespan") != 0) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "objective: '%s' is not makespan or span",
                  req->objective);
      return;
    }
  }
  /* Plan takes a shape without a job's name */
  Zb__V1__JobSpec spec_pb = *req->spec;
  if (!spec_pb.name || !spec_pb.name[0])
    spec_pb.name = "plan";
  zb_job_spec spec;
  zb_diag d;
  if (zb_wire_spec_from_pb(&spec_pb, &spec, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: %s", d.msg);
    return;
  }
  if (!plan_fits(co, call, &spec, true)) {
    zb_job_spec_free(&spec);
    return;
  }
  zb_wire_plan plan;
  zb_err err = zb_wire_plan_make(&spec, obj, &plan, &d);
  zb_job_spec_free(&spec);
  if (err) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec.schedule: %s", d.msg);
    return;
  }
  coord_metrics_observe_plan(co, plan.generation_seconds);
  Zb__V1__PlanResponse resp;
  zb_wire_plan_response(&plan, &resp);
  size_t n = protobuf_c_message_get_packed_size(&resp.base);
  if ((long long)n > co->cfg.max_message_bytes)
    zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                "spec: the plan is %zu bytes, over the %lld-byte message limit (max_message_bytes)", n,
                co->cfg.max_message_bytes);
  else
    zb_rpc_reply(call, &resp.base);
  zb_wire_plan_response_clear(&resp);
  zb_wire_plan_free(&plan);
}

static void on_health(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
  if (req->service && req->service[0] && strcmp(req->service, "zb.v1.Zb") != 0) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "service: unknown service '%s'", req->service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  resp.status = co->stopping ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING
                             : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING;
  zb_rpc_reply(call, &resp.base);
}

/* ---- handlers: workers ---- */

static void worker_remove(coord *co, coord_worker *w) {
  coord_worker **pp = &co->workers;
  while (*pp && *pp != w)
    pp = &(*pp)->next;
  if (*pp)
    *pp = w->next;
  free(w);
}

/* A worker is gone (stream closed, heartbeats missed): its job fails. */
static void worker_lost(coord *co, coord_worker *w, const char *why) {
  if (co->stopping) {
    /* Draining cancels every Attach stream: the job is interrupted, not
     * failed by this rank. It stays RUNNING in the store, and the next
     * coordinator marks it as stopped with the coordinator. */
    ZB_INFO("worker %s detached: the coordinator is stopping", w->id);
    if (w->job)
      w->job->ranks[w->rank] = NULL;
    worker_remove(co, w);
    return;
  }
  ZB_WARN("worker %s lost: %s", w->id, why);
  if (w->job) {
    char reason[256];
    snprintf(reason, sizeof reason, "rank %d (worker %s) lost: %s", w->rank, w->id, why);
    coord_job *j = w->job;
    job_finish(co, j, ZB_JOB_FAILED, reason);
  }
  worker_remove(co, w);
  coord_start_pending(co);
}

static void attach_closed(zb_rpc_call *call, void *arg) {
  (void)call;
  coord_worker *w = arg;
  w->attach = NULL;
  worker_lost(w->co, w, "its Attach stream closed");
}

static void join_list(char *out, size_t cap, char **items, size_t n) {
  out[0] = 0;
  for (size_t k = 0; k < n; k++) {
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s", k ? "," : "", items[k]);
  }
}

static void on_attach(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__AttachRequest *req = (const void *)m;
  if (!req->worker_id || !req->worker_id[0] || strlen(req->worker_id) >= 64) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "worker_id: required, 1..63 characters");
    return;
  }
  if (!req->data_address || !req->data_address[0] || strlen(req->data_address) >= 128 ||
      !strrchr(req->data_address, ':')) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "data_address: required, host:port");
    return;
  }
  const char *texts[] = {req->worker_id, req->data_address, req->hostname, req->gpu};
  const char *names[] = {"worker_id", "data_address", "hostname", "gpu"};
  for (int k = 0; k < 4; k++)
    if (!utf8_valid(texts[k])) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: not valid UTF-8", names[k]);
      return;
    }
  for (size_t k = 0; k < req->n_backends + req->n_transports; k++)
    if (!utf8_valid(k < req->n_backends ? req->backends[k] : req->transports[k - req->n_backends])) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s: not valid UTF-8",
                  k < req->n_backends ? "backends" : "transports");
      return;
    }
  if (co->stopping) {
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "the coordinator is shutting down");
    return;
  }
  coord_worker *w = worker_find(co, req->worker_id);
  if (w) { /* the same worker again (it restarted, or its stream broke) */
    if (w->attach) {
      zb_rpc_call *old = w->attach;
      zb_rpc_call_on_close(old, NULL, NULL);
      w->attach = NULL;
      zb_rpc_stream_finish(old, GRPC_STATUS_ABORTED, "replaced by a new Attach from the same worker");
    }
    if (w->job) {
      char reason[256];
      snprintf(reason, sizeof reason, "rank %d (worker %s) attached again: it restarted", w->rank, w->id);
      job_finish(co, w->job, ZB_JOB_FAILED, reason);
    }
  } else {
    w = zb_calloc(1, sizeof *w);
    w->co = co;
    snprintf(w->id, sizeof w->id, "%s", req->worker_id);
    w->rank = -1;
    coord_worker **tail = &co->workers;
    while (*tail)
      tail = &(*tail)->next;
    *tail = w;
  }
  snprintf(w->data_address, sizeof w->data_address, "%s", req->data_address);
  snprintf(w->hostname, sizeof w->hostname, "%s", req->hostname ? req->hostname : "");
  snprintf(w->gpu, sizeof w->gpu, "%s", req->gpu ? req->gpu : "");
  join_list(w->backends, sizeof w->backends, req->backends, req->n_backends);
  join_list(w->transports, sizeof w->transports, req->transports, req->n_transports);
  utf8_trim(w->hostname);
  utf8_trim(w->gpu);
  utf8_trim(w->backends);
  utf8_trim(w->transports);
  w->attach = call;
  w->last_seen_ms = coord_now_ms();
  zb_rpc_call_on_close(call, attach_closed, w);
  ZB_INFO("worker %s attached from %s (data %s)", w->id, zb_rpc_call_peer(call), w->data_address);
  Zb__V1__Command ping = ZB__V1__COMMAND__INIT;
  ping.kind_case = ZB__V1__COMMAND__KIND_PING_UNIX_MS;
  ping.ping_unix_ms = w->last_seen_ms;
  zb_rpc_stream_write(call, &ping.base);
  coord_start_pending(co);
}

/* All p ranks reported iteration slot->iteration: one event. */
static void job_iteration_complete(coord *co, coord_job *j, coord_iter_slot *slot) {
  int p = j->spec.ranks;
  double wall = 0, busy = 0;
  Zb__V1__RankIteration **ptrs = zb_malloc(sizeof *ptrs * (size_t)p);
  for (int r = 0; r < p; r++) {
    Zb__V1__RankIteration *ri = &slot->ranks[r];
    ptrs[r] = ri;
    if (ri->wall_seconds > wall)
      wall = ri->wall_seconds;
    busy += ri->busy_f_seconds + ri->busy_b_seconds + ri->busy_w_seconds;
  }
  Zb__V1__IterationMetrics it = ZB__V1__ITERATION_METRICS__INIT;
  it.iteration = slot->iteration;
  it.schedule = slot->schedule;
  it.wall_seconds = wall;
  it.samples_per_second = wall > 0 ? j->spec.microbatches / wall : 0;
  it.bubble_ratio = wall > 0 ? 1 - busy / (p * wall) : 0;
  it.predicted_bubble_ratio = slot->predicted;
  it.n_ranks = (size_t)p;
  it.ranks = ptrs;
  for (int r = 0; r < p && !it.has_loss; r++) /* on_report let only the last stage's rank set one */
    if (slot->ranks[r].has_loss) {
      it.loss = slot->ranks[r].loss;
      it.has_loss = true;
    }
  /* every rank reduced the same values and took the same decision: rank 0's
   * report stands for all */
  if (p > 0 && slot->ranks[0].has_grad_norm) {
    it.grad_norm = slot->ranks[0].grad_norm;
    it.clipped = slot->ranks[0].clipped;
    it.skipped = slot->ranks[0].skipped;
    it.has_grad_norm = true;
  }
  j->samples_per_second = it.samples_per_second;
  /* iterations complete in order; a resumed job's first one is not 0 */
  j->row.iterations_done = slot->iteration + 1;
  if (j->switch_at >= 0 && slot->iteration >= j->switch_at) { /* the update took over */
    zb_wire_plan_free(&j->plan);
    j->plan = j->next_plan;
    memset(&j->next_plan, 0, sizeof j->next_plan);
    j->switch_at = -1;
    snprintf(j->row.schedule, sizeof j->row.schedule, "%s", zb_family_name(j->plan.family));
  }
  snprintf(j->row.reason, sizeof j->row.reason, "iteration %d done", slot->iteration);
  job_event(co, j, &it);
  free(ptrs);
  slot->iteration = -1;
}

static coord_iter_slot *job_slot(coord_job *j, int iteration) {
  coord_iter_slot *slot = &j->slots[iteration % COORD_ITER_SLOTS];
  if (slot->iteration == iteration)
    return slot;
  if (slot->iteration >= 0)
    return NULL; /* a rank ran COORD_ITER_SLOTS iterations ahead: cannot be */
  slot->iteration = iteration;
  slot->n = 0;
  memset(slot->have, 0, sizeof(bool) * (size_t)j->spec.ranks);
  const zb_wire_plan *pl = j->switch_at >= 0 && iteration >= j->switch_at ? &j->next_plan : &j->plan;
  snprintf(slot->schedule, sizeof slot->schedule, "%s", zb_family_name(pl->family));
  slot->predicted = pl->sim ? pl->sim->bubble_ratio : 0;
  slot->loss_rank = -1;
  if (strcmp(j->spec.backend, "cpu") == 0)
    slot->loss_rank = zb_placement_rank(zb_family_placement(pl->family), pl->p, pl->v, pl->p * pl->v - 1);
  return slot;
}

static void on_report(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__ReportRequest *req = (const void *)m;
  coord_metrics_count_report(co);
  Zb__V1__ReportResponse resp = ZB__V1__REPORT_RESPONSE__INIT;
  if (!req->worker_id || !req->worker_id[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "worker_id: required");
    return;
  }
  coord_worker *w = worker_find(co, req->worker_id);
  if (!w) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "worker_id: no worker '%s' is attached", req->worker_id);
    return;
  }
  w->last_seen_ms = coord_now_ms();
  if (!req->job_id || !req->job_id[0]) { /* heartbeat */
    zb_rpc_reply(call, &resp.base);
    return;
  }
  coord_job *j = job_find(co, req->job_id);
  if (!j) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "job_id: no job '%s'", req->job_id);
    return;
  }
  if (j->row.state != ZB_JOB_RUNNING || w->job != j) {
    resp.stop = true; /* a late report of a job that ended, or not this worker's */
    zb_rpc_reply(call, &resp.base);
    return;
  }
  if (req->rank != w->rank) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "rank: worker %s runs rank %d of job %s, not %d", w->id,
                w->rank, j->row.id, req->rank);
    return;
  }
  if (!utf8_valid(req->error)) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "error: not valid UTF-8");
    return;
  }
  if (req->error && req->error[0]) {
    /* The first failure is kept, and the job fails with it after
     * COORD_FAIL_GRACE_MS unless a worker of the job is lost first: "peer
     * rank 2 closed the connection" from rank 1 is a symptom of rank 2. */
    if (!j->fail_at_ms) {
      snprintf(j->fail_reason, sizeof j->fail_reason, "rank %d (worker %s) failed: %s", w->rank, w->id,
               req->error);
      j->fail_at_ms = coord_now_ms() + COORD_FAIL_GRACE_MS;
    }
    resp.stop = true;
    zb_rpc_reply(call, &resp.base);
    return;
  }
  if (req->metrics) {
    if (req->iteration < 0 || req->iteration >= j->spec.iterations) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "iteration: %d is not an iteration of job %s (0..%d)",
                  req->iteration, j->row.id, j->spec.iterations - 1);
      return;
    }
    coord_iter_slot *slot = job_slot(j, req->iteration);
    if (!slot || slot->have[w->rank]) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                  "iteration: rank %d already reported iteration %d or ran "
                  "too far ahead",
                  w->rank, req->iteration);
      return;
    }
    if (req->metrics->has_loss && w->rank != slot->loss_rank) {
      zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                  "metrics.has_loss: rank %d does not compute the loss of iteration %d (%s)", w->rank,
                  req->iteration,
                  slot->loss_rank < 0 ? "the job trains no model" : "the last stage is on another rank");
      return;
    }
    Zb__V1__RankIteration *ri = &slot->ranks[w->rank];
    zb__v1__rank_iteration__init(ri); /* the scalars are copied one by one below */
    ri->rank = w->rank;
    ri->wall_seconds = req->metrics->wall_seconds;
    ri->busy_f_seconds = req->metrics->busy_f_seconds;
    ri->busy_b_seconds = req->metrics->busy_b_seconds;
    ri->busy_w_seconds = req->metrics->busy_w_seconds;
    ri->idle_seconds = req->metrics->idle_seconds;
    ri->bytes_sent = req->metrics->bytes_sent;
    ri->peak_memory = req->metrics->peak_memory;
    ri->peak_memory_bytes = req->metrics->peak_memory_bytes;
    ri->bubble_ratio = req->metrics->bubble_ratio;
    ri->start_monotonic_seconds = req->metrics->start_monotonic_seconds;
    ri->loss = req->metrics->loss;
    ri->has_loss = req->metrics->has_loss;
    ri->grad_norm = req->metrics->grad_norm;
    ri->clipped = req->metrics->clipped;
    ri->skipped = req->metrics->skipped;
    ri->has_grad_norm = req->metrics->has_grad_norm;
    slot->have[w->rank] = true;
    slot->n++;
    if (req->iteration > j->max_reported)
      j->max_reported = req->iteration;
    coord_metrics_observe_ops(co, j, ri);
    if (slot->n == j->spec.ranks)
      job_iteration_complete(co, j, slot);
  }
  if (req->done && !j->rank_done[w->rank]) {
    j->rank_done[w->rank] = true;
    j->done_ranks++;
  }
  if (j->done_ranks == j->spec.ranks && j->row.iterations_done >= j->spec.iterations) {
    char reason[128];
    snprintf(reason, sizeof reason, "%d iterations done", j->row.iterations_done);
    job_finish(co, j, ZB_JOB_SUCCEEDED, reason);
    resp.stop = true;
    coord_start_pending(co);
  }
  zb_rpc_reply(call, &resp.base);
}

const zb_rpc_method coord_methods[] = {
    {"/zb.v1.Zb/SubmitJob", &zb__v1__submit_job_request__descriptor, on_submit, false},
    {"/zb.v1.Zb/GetJob", &zb__v1__get_job_request__descriptor, on_get_job, false},
    {"/zb.v1.Zb/ListJobs", &zb__v1__list_jobs_request__descriptor, on_list_jobs, false},
    {"/zb.v1.Zb/CancelJob", &zb__v1__cancel_job_request__descriptor, on_cancel, false},
    {"/zb.v1.Zb/WatchJob", &zb__v1__watch_job_request__descriptor, on_watch, true},
    {"/zb.v1.Zb/UpdateSchedule", &zb__v1__update_schedule_request__descriptor, on_update_schedule, false},
    {"/zb.v1.Zb/ListWorkers", &zb__v1__list_workers_request__descriptor, on_list_workers, false},
    {"/zb.v1.Zb/Plan", &zb__v1__plan_request__descriptor, on_plan, false},
    {"/zb.v1.Zb/Attach", &zb__v1__attach_request__descriptor, on_attach, true},
    {"/zb.v1.Zb/Report", &zb__v1__report_request__descriptor, on_report, false},
    {"/grpc.health.v1.Health/Check", &grpc__health__v1__health_check_request__descriptor, on_health, false},
};
const int coord_n_methods = sizeof coord_methods / sizeof coord_methods[0];

/* ---- start-up, ticks, teardown ---- */

zb_err coord_load(coord *co, zb_diag *diag) {
  int marked = 0;
  zb_err err = zb_store_mark_interrupted(co->store, "the coordinator stopped while the job was active",
                                         coord_now_ms(), &marked, diag);
  if (err)
    return err;
  if (marked)
    ZB_WARN("%d job(s) were active when the coordinator stopped; marked FAILED", marked);
  zb_store_job *rows = NULL;
  int n = 0;
  if ((err = zb_store_list_jobs(co->store, &rows, &n, diag)))
    return err;
  coord_job **tail = &co->jobs;
  co->next_job_number = 1;
  for (int k = 0; k < n; k++) {
    coord_job *j = zb_calloc(1, sizeof *j);
    j->row = rows[k];
    rows[k].spec = rows[k].last = NULL; /* moved */
    Zb__V1__JobSpec *pb = (Zb__V1__JobSpec *)protobuf_c_message_unpack(&zb__v1__job_spec__descriptor, NULL,
                                                                       j->row.spec_len, j->row.spec);
    zb_diag d;
    if (!pb || zb_wire_spec_from_pb(pb, &j->spec, &d) != ZB_OK)
      zb_job_spec_default(&j->spec); /* kept for its history; never runs again */
    if (pb)
      protobuf_c_message_free_unpacked(&pb->base, NULL);
    int number = 0;
    if (sscanf(j->row.id, "j-%d", &number) == 1 && number >= co->next_job_number)
      co->next_job_number = number + 1;
    *tail = j;
    tail = &j->next;
  }
  zb_store_jobs_free(rows, n);
  ZB_INFO("loaded %d job(s) from the store", n);
  return ZB_OK;
}

void coord_tick(coord *co) {
  int64_t now = coord_now_ms();
  /* A tick far behind its period means the loop itself was held (a long
   * plan, a slow disk, a stopped process): the reports that came meanwhile
   * are not read yet, so the stall is not the workers' silence. */
  int64_t stall = co->last_tick_ms ? now - co->last_tick_ms - COORD_TICK_MS : 0;
  co->last_tick_ms = now;
  if (stall > COORD_TICK_MS)
    for (coord_worker *x = co->workers; x; x = x->next)
      x->last_seen_ms = x->last_seen_ms + stall < now ? x->last_seen_ms + stall : now;
  coord_worker *w = co->workers;
  while (w) {
    coord_worker *next = w->next;
    if (now - w->last_seen_ms > co->cfg.heartbeat_timeout_ms) {
      char why[128];
      snprintf(why, sizeof why, "no heartbeat for %" PRId64 " ms (timeout %d ms)", now - w->last_seen_ms,
               co->cfg.heartbeat_timeout_ms);
      if (w->attach) {
        zb_rpc_call *call = w->attach;
        zb_rpc_call_on_close(call, NULL, NULL);
        w->attach = NULL;
        zb_rpc_stream_finish(call, GRPC_STATUS_UNAVAILABLE, why);
      }
      worker_lost(co, w, why);
    } else if (w->attach && zb_rpc_call_queued(w->attach) == 0) {
      Zb__V1__Command ping = ZB__V1__COMMAND__INIT;
      ping.kind_case = ZB__V1__COMMAND__KIND_PING_UNIX_MS;
      ping.ping_unix_ms = now;
      zb_rpc_stream_write(w->attach, &ping.base);
    }
    w = next;
  }
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state == ZB_JOB_RUNNING && j->fail_at_ms && now >= j->fail_at_ms)
      job_finish(co, j, ZB_JOB_FAILED, j->fail_reason);
  coord_start_pending(co);
  coord_metrics_render(co);
}

void coord_free_state(coord *co) {
  coord_job *j = co->jobs;
  while (j) {
    coord_job *next = j->next;
    coord_watcher *w = j->watchers;
    while (w) {
      coord_watcher *wn = w->next;
      free(w);
      w = wn;
    }
    job_runtime_free(j);
    zb_job_spec_free(&j->spec);
    free(j->row.spec);
    free(j->row.last);
    free(j);
    j = next;
  }
  co->jobs = NULL;
  coord_worker *w = co->workers;
  while (w) {
    coord_worker *next = w->next;
    free(w);
    w = next;
  }
  co->workers = NULL;
}
