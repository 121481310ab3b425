/* job_rpc.c — the users' job RPCs: SubmitJob (with resume), GetJob,
 * ListJobs, CancelJob and GetIteration. Admission is admission.c's;
 * starting a job is dispatch.c's; WatchJob is watch.c's. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"
#include "zb_names.h"

/* ---- handlers: users ---- */

/* The spec of job id for a resumed job (SubmitJobRequest.resume_from_job_id),
 * unpacked (the caller frees it), or NULL after failing call: the job must
 * have ended without finishing and have checkpoints. The coordinator
 * cannot see the files (they are on the workers' file system): which
 * iteration every rank holds is settled by the new job's ranks. */
static Zb__V1__JobSpec *resume_spec(coord *co, zb_rpc_call *call, const zb_identity *who, const char *id) {
  coord_job *old = job_find(co, id);
  if (!old) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "resume_from_job_id: no job %.64s", id);
    return NULL;
  }
  if (!authz_job(co, call, who, old))
    return NULL;
  if (old->row.state == ZB_JOB_PENDING || old->row.state == ZB_JOB_RUNNING ||
      old->row.state == ZB_JOB_SUCCEEDED) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "resume_from_job_id: job %s %s", id,
                old->row.state == ZB_JOB_SUCCEEDED ? "has finished: nothing to resume"
                                                   : "has not ended (cancel it first)");
    return NULL;
  }
  if (!zb_job_spec_trains_model(&old->spec) || old->spec.model.checkpoint_every <= 0) {
    zb_rpc_fail(
        call, GRPC_STATUS_FAILED_PRECONDITION,
        "resume_from_job_id: job %s has no checkpoints (a cpu or cuda job with model.checkpoint_every "
        "> 0)",
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

/* Enough attached workers with a GPU for a cuda job; fails call naming the
 * shortage and the GPU workers there are, when not. */
static bool admit_gpu_workers(coord *co, zb_rpc_call *call, const zb_job_spec *spec) {
  char ids[160];
  int n = workers_with_gpu(co, spec, ids, sizeof ids);
  if (zb_job_spec_world(spec) <= n)
    return true;
  zb_rpc_fail(
      call, GRPC_STATUS_FAILED_PRECONDITION,
      "spec.backend: backend cuda needs %d workers with a GPU and transport '%s'; %d of the %d attached "
      "workers %s%s%s%s (zbctl workers shows each worker's GPU; a worker without one logs why)",
      zb_job_spec_world(spec), spec->transport, n, workers_attached(co), n == 1 ? "has one" : "have one",
      n ? " (" : "", ids, n ? ")" : "");
  return false;
}

/* The model's fixed state against the memory the workers advertised: a
 * job refused when fewer workers that offer it than it has ranks have room
 * (RESOURCE_EXHAUSTED). Too few workers at all is admit_workers' to say. */
static bool admit_memory(coord *co, zb_rpc_call *call, const zb_job_spec *spec) {
  if (!zb_job_spec_trains_model(spec))
    return true;
  double need = zb_job_spec_rank_state_bytes(spec), gib = 1024.0 * 1024.0 * 1024.0;
  int offer, fit;
  long long most;
  workers_memory_fit(co, spec, need, &offer, &fit, &most);
  int world = zb_job_spec_world(spec);
  if (offer < world || fit >= world)
    return true;
  zb_rpc_fail(
      call, GRPC_STATUS_RESOURCE_EXHAUSTED,
      "spec.model: its parameters, gradients and AdamW moments alone need at least %.3g GiB on each of "
      "its %d ranks (%.4g M parameters, 16 bytes each), but %d of the %d workers able to run it have "
      "that much %s memory (the most: %.3g GiB); use more ranks or a smaller model",
      need / gib, world, need * spec->ranks / 16 / 1e6, fit, offer, job_needs_gpu(spec) ? "GPU" : "host",
      (double)most / gib);
  return false;
}

/* Enough attached workers able to run spec; fails call when not. */
static bool admit_workers(coord *co, zb_rpc_call *call, const zb_job_spec *spec) {
  int world = zb_job_spec_world(spec);
  /* replicas of a model job average their gradients on the workers
   * (docs/model.md, Data parallelism): over the tcp ring for a cpu job,
   * over each stage group's NCCL communicator for a cuda job, which
   * therefore needs transport nccl */
  bool cuda = zb_job_spec_trains_model(spec) && strcmp(spec->backend, "cpu") != 0;
  if (spec->data_parallel > 1 && cuda && strcmp(spec->transport, "nccl") != 0) {
    zb_rpc_fail(call, GRPC_STATUS_UNIMPLEMENTED,
                "spec.data_parallel: data_parallel > 1 with backend '%s' reduces gradients with NCCL "
                "collectives and needs transport nccl (transport '%s' is not built for it)",
                spec->backend, spec->transport);
    return false;
  }
  if (spec->zero && cuda) {
    zb_rpc_fail(call, GRPC_STATUS_UNIMPLEMENTED,
                "spec.zero: ZeRO-1 on cuda not built yet; use zero: 0 with backend '%s'", spec->backend);
    return false;
  }
  /* ZeRO-1 shards a cpu job's optimizer state (docs/model.md, Data
   * parallelism: ZeRO-1); a cuda job's is not built */
  if (spec->zero && strcmp(spec->backend, "cpu") != 0) {
    zb_rpc_fail(
        call, GRPC_STATUS_UNIMPLEMENTED,
        "spec.zero: ZeRO-1 optimizer sharding with backend '%s' is not built yet; backend cpu shards, "
        "or use zero: 0 (every replica keeps its whole optimizer state)",
        spec->backend);
    return false;
  }
  if (!admit_memory(co, call, spec))
    return false;
  if (spec->wait_for_workers_s > 0)
    return true; /* too few now: it waits PENDING for them (coord_start_pending) */
  if (job_needs_gpu(spec))
    return admit_gpu_workers(co, call, spec);
  int attached = workers_attached(co);
  if (world > attached) {
    char shape[48] = ""; /* one replica: just its ranks */
    if (spec->data_parallel > 1)
      snprintf(shape, sizeof shape, " (%d replicas of %d)", spec->data_parallel, spec->ranks);
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "spec.ranks: the job needs %d ranks%s but %d workers are attached", world, shape, attached);
    return false;
  }
  int able = workers_able(co, spec);
  if (world > able) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "spec.backend: the job needs %d ranks with backend '%s' and transport '%s' but %d of the %d "
                "attached workers offer them",
                world, spec->backend, spec->transport, able, attached);
    return false;
  }
  return true;
}

/* Room in the queue for one more job of owner's: fewer than the
 * configured max_pending_per_identity of its jobs wait PENDING or are
 * being planned (one caller cannot fill the coordinator with waiting jobs
 * and their plans, nor the planners with a burst of submits). Checked
 * before planning and again when the plan is in; fails call
 * (RESOURCE_EXHAUSTED) when not. */
static bool admit_queue(coord *co, zb_rpc_call *call, const char *owner) {
  long long waiting = 0;
  for (const coord_job *j = co->jobs; j; j = j->next)
    waiting += j->row.state == ZB_JOB_PENDING && strcmp(j->spec.owner, owner) == 0;
  for (const coord_job *j = co->planning; j; j = j->next_planning) /* submits still being planned */
    waiting += strcmp(j->spec.owner, owner) == 0;
  if (jc_room_in_queue(waiting, co->cfg.max_pending_per_identity))
    return true;
  zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "%s has %lld jobs waiting, the most one identity may (max_pending_per_identity in the "
              "coordinator's config): cancel one or wait for one to start",
              owner[0] ? owner : "this caller", waiting);
  return false;
}

/* A torch job's run is no other waiting, running or planned job's: its
 * agents would be placed in whichever starts first, and a second job's
 * ranks would never find theirs. torch_run is a name, not a secret
 * (docs/operations.md, Security); this only catches a mistake. Checked
 * before planning and again when the plan is in; fails call
 * (ALREADY_EXISTS) when taken. */
static bool admit_torch_run(coord *co, zb_rpc_call *call, const zb_job_spec *spec) {
  if (strcmp(spec->backend, ZB_BACKEND_TORCH) != 0)
    return true;
  const coord_job *other = NULL;
  for (const coord_job *j = co->jobs; j && !other; j = j->next)
    if ((j->row.state == ZB_JOB_PENDING || j->row.state == ZB_JOB_RUNNING) &&
        !strcmp(j->spec.torch_run, spec->torch_run))
      other = j;
  for (const coord_job *j = co->planning; j && !other; j = j->next_planning)
    if (!strcmp(j->spec.torch_run, spec->torch_run))
      other = j;
  if (!other)
    return true;
  if (!other->row.id[0]) /* still being planned: no id yet */
    zb_rpc_fail(call, GRPC_STATUS_ALREADY_EXISTS,
                "spec.torch_run: torch run %s is another job's, being submitted now: one job per run",
                spec->torch_run);
  else
    zb_rpc_fail(call, GRPC_STATUS_ALREADY_EXISTS,
                "spec.torch_run: torch run %s is job %s's (%s): one job per run; cancel it or use another "
                "run id",
                spec->torch_run, other->row.id, zb_job_state_name(other->row.state));
  return false;
}

/* Gives an admitted job its id and row and queues it last. */
static void job_enqueue(coord *co, coord_job *j) {
  jc_row_new(&j->spec, &co->next_job_number, zb_clock_unix_ms(), &j->row);
  coord_job **tail = &co->jobs;
  while (*tail)
    tail = &(*tail)->next;
  *tail = j;
  zb_strmap_put(&co->job_index, j->row.id, j);
  ZB_INFO("job %s submitted: %s, %s, p=%d m=%d", j->row.id, j->spec.name, j->spec.schedule, j->spec.ranks,
          j->spec.microbatches);
}

/* Takes the last-queued job j off the queue again (its row could not be
 * stored): its id is not used. */
static void job_unqueue(coord *co, coord_job *j) {
  coord_job **pp = &co->jobs;
  while (*pp && *pp != j)
    pp = &(*pp)->next;
  if (*pp)
    *pp = j->next;
  zb_strmap_remove(&co->job_index, j->row.id);
  co->next_job_number--;
  jc_row_clear(&j->row);
}

/* A submission being planned off the loop (plan_async.c): the job, not
 * queued yet, carries the spec and receives the plan. */
typedef struct submit_op {
  coord_plan_op base;
  coord_job *j;
} submit_op;

static void job_discard(coord_job *j) {
  zb_planner_result_free(&j->plan);
  zb_job_spec_free(&j->spec);
  free(j);
}

/* Back on the loop: the checks of the plan made, then the job is queued
 * (or dropped, when nobody waits for the answer any more). */
static void submit_planned(coord_plan_op *base) {
  submit_op *op = (submit_op *)base;
  coord *co = base->co;
  zb_rpc_call *call = base->call;
  coord_job *j = op->j;
  free(op);
  for (coord_job **at = &co->planning; *at; at = &(*at)->next_planning)
    if (*at == j) {
      *at = j->next_planning;
      break;
    }
  if (!call || !admit_queue(co, call, j->spec.owner) || !admit_torch_run(co, call, &j->spec) ||
      !admit_workers(co, call, &j->spec) || !coord_admit_planned(co, call, j, &j->spec, "spec.", &j->plan) ||
      !coord_admit_activations(co, call, &j->spec, &j->plan)) {
    job_discard(j);
    return;
  }
  job_enqueue(co, j);
  zb_diag d;
  if (!job_event(co, j, NULL, &d)) { /* acknowledged only once its row is in the store */
    job_unqueue(co, j);
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "store: %s (the job was not accepted; try again later)",
                d.msg);
    job_discard(j);
    return;
  }
  Zb__V1__SubmitJobResponse resp = ZB__V1__SUBMIT_JOB_RESPONSE__INIT;
  resp.job_id = j->row.id;
  zb_rpc_reply(call, &resp.base);
  coord_start_pending(co);
}

void on_submit(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__SubmitJobRequest *req = (const void *)m;
  const char *resume = req->resume_from_job_id && req->resume_from_job_id[0] ? req->resume_from_job_id : NULL;
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_USER | AUTHZ_ADMIN, "submit jobs", &who))
    return;
  if (!req->spec && !resume) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: required");
    return;
  }
  if (req->spec && resume) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "spec: must be absent with resume_from_job_id (the job takes job %.64s's spec)", resume);
    return;
  }
  if (co->stopping || co->store_failing) {
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "%s",
                co->stopping ? "the coordinator is shutting down"
                             : "the job store takes no writes (a full disk?): no job can be accepted now");
    return;
  }
  Zb__V1__JobSpec *resume_pb = NULL;
  if (resume && !(resume_pb = resume_spec(co, call, &who, resume)))
    return;
  coord_job *j = zb_calloc(1, sizeof *j);
  job_new_data_secret(j);
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
  snprintf(j->spec.owner, sizeof j->spec.owner, "%s", who.name); /* never the client's say */
  if (resume) /* replaces the job the old one was resumed from, if it was */
    snprintf(j->spec.model.resume_from, sizeof j->spec.model.resume_from, "%s", resume);
  /* every cheap check first (workers, the planning budget); then plan off
   * the loop and keep the plan, so a bad or oversized plan is refused
   * before it is queued and the job starts with the plan it was admitted
   * with */
  if (!admit_queue(co, call, j->spec.owner) || !admit_torch_run(co, call, &j->spec) ||
      !admit_workers(co, call, &j->spec) || !coord_admit_before_plan(co, call, &j->spec, "spec."))
    goto fail;
  submit_op *op = zb_calloc(1, sizeof *op);
  op->j = j;
  op->base = (coord_plan_op){.co = co,
                             .call = call,
                             .spec = &j->spec,
                             .objective = ZB_OBJ_MAKESPAN,
                             .plan = &j->plan,
                             .what = "spec.",
                             .done = submit_planned};
  snprintf(op->base.owner, sizeof op->base.owner, "%s", j->spec.owner);
  j->next_planning = co->planning; /* counted by admit_queue until planned */
  co->planning = j;
  coord_plan_off_loop(&op->base);
  return;
fail:
  job_discard(j);
}

void on_get_job(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  const Zb__V1__GetJobRequest *req = (const void *)m;
  coord_job *j = job_lookup(user, call, req->job_id);
  if (!j)
    return;
  Zb__V1__Job pb;
  job_pb(j, &pb);
  zb_rpc_reply(call, &pb.base);
  job_pb_clear(&pb);
}

enum { LIST_PAGE_DEFAULT = 500, LIST_PAGE_MAX = 1000 };

/* A page token is the number N of the last job id "j-N" a page held; the
 * next page starts past it, so pruned or new jobs never shift a page. */
static bool page_after(const char *token, int64_t *after) {
  *after = 0;
  if (!token || !*token)
    return true;
  char *end = NULL;
  errno = 0;
  long long n = strncmp(token, "j-", 2) == 0 ? strtoll(token + 2, &end, 10) : -1;
  if (!end || *end || errno || n < 0)
    return false;
  *after = n;
  return true;
}

static int64_t job_number(const coord_job *j) {
  return strtoll(j->row.id + 2, NULL, 10);
}

void on_list_jobs(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  const Zb__V1__ListJobsRequest *req = (const void *)m;
  coord *co = user;
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_USER | AUTHZ_ADMIN, "list jobs", &who))
    return;
  int64_t after;
  if (req->page_size < 0 || !page_after(req->page_token, &after)) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s",
                req->page_size < 0 ? "page_size: must not be negative"
                                   : "page_token: not a token ListJobs returned");
    return;
  }
  int limit = req->page_size == 0              ? LIST_PAGE_DEFAULT
              : req->page_size > LIST_PAGE_MAX ? LIST_PAGE_MAX
                                               : req->page_size;
  Zb__V1__Job *jobs = zb_calloc((size_t)limit, sizeof *jobs);
  Zb__V1__Job **ptrs = zb_calloc((size_t)limit, sizeof *ptrs);
  int n = 0;
  const coord_job *j = co->jobs;
  for (; j && n < limit; j = j->next) {
    if (job_number(j) <= after || !authz_owns(co, &who, j))
      continue;
    job_pb(j, &jobs[n]);
    ptrs[n] = &jobs[n];
    n++;
  }
  while (j && !authz_owns(co, &who, j)) /* a full page with nothing after it is the last */
    j = j->next;
  Zb__V1__ListJobsResponse resp = ZB__V1__LIST_JOBS_RESPONSE__INIT;
  resp.n_jobs = (size_t)n;
  resp.jobs = ptrs;
  resp.next_page_token = j && n ? jobs[n - 1].id : (char *)"";
  zb_rpc_reply(call, &resp.base);
  for (int k = 0; k < n; k++)
    job_pb_clear(&jobs[k]);
  free(jobs);
  free(ptrs);
}

void on_cancel(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__CancelJobRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j)
    return;
  if (job_terminal(j)) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "job_id: job %s has already ended (%s)", j->row.id,
                zb_job_state_name(j->row.state));
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

/* j's stored events into *evs (zb_store_events_free), or false after
 * failing call with the store's error. */
static bool job_stored_events(coord *co, zb_rpc_call *call, const coord_job *j, zb_store_event **evs,
                              int *n) {
  zb_diag d;
  if (zb_store_list_events(co->store, j->row.id, 0, evs, n, &d) == ZB_OK)
    return true;
  zb_rpc_fail(call, GRPC_STATUS_INTERNAL, "store: %s", d.msg);
  return false;
}

/* Whether stored event ev is the iteration req asks for (-1: one with
 * aligned timelines); its metrics unpacked into *out when it is. */
static bool event_is_iteration(const zb_store_event *ev, int want, Zb__V1__IterationMetrics **out) {
  if (!ev->iteration)
    return false;
  Zb__V1__IterationMetrics *it = (Zb__V1__IterationMetrics *)protobuf_c_message_unpack(
      &zb__v1__iteration_metrics__descriptor, NULL, ev->iteration_len, ev->iteration);
  if (it && (want < 0 ? it->aligned : it->iteration == want)) {
    *out = it;
    return true;
  }
  if (it)
    protobuf_c_message_free_unpacked(&it->base, NULL);
  return false;
}

/* Iteration `want` of j (-1: the last traced) into *out (NULL: none),
 * through the store's index; a job whose events predate it (schema
 * version 3) is read whole. False after failing call. */
static bool find_iteration(coord *co, zb_rpc_call *call, coord_job *j, int want,
                           Zb__V1__IterationMetrics **out) {
  zb_store_event *ev = NULL;
  bool unindexed = false;
  zb_diag d;
  if (zb_store_find_iteration(co->store, j->row.id, want, &ev, &unindexed, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INTERNAL, "%s", d.msg);
    return false;
  }
  if (ev) {
    event_is_iteration(ev, want, out);
    zb_store_events_free(ev, 1);
    return true;
  }
  if (!unindexed)
    return true;
  zb_store_event *evs = NULL;
  int n = 0;
  if (!job_stored_events(co, call, j, &evs, &n))
    return false;
  for (int k = n - 1; k >= 0 && !event_is_iteration(&evs[k], want, out); k--)
    ;
  zb_store_events_free(evs, n);
  return true;
}

void on_get_iteration(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__GetIterationRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j)
    return;
  if (req->iteration < -1) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "iteration: %d is not an iteration (>= 0, or -1: the last traced)", req->iteration);
    return;
  }
  Zb__V1__IterationMetrics *it = NULL;
  if (!find_iteration(co, call, j, req->iteration, &it))
    return;
  if (!it) {
    if (req->iteration < 0 && j->spec.trace_every <= 0)
      zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND,
                  "iteration: job %s has no traced iteration: its spec turns tracing off (trace_every 0 in "
                  "YAML, -1 on the wire)",
                  j->row.id);
    else if (req->iteration < 0)
      zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND,
                  "iteration: job %s has no traced iteration yet (trace_every %d)", j->row.id,
                  j->spec.trace_every);
    else
      zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "iteration: job %s has not completed iteration %d (%d done)",
                  j->row.id, req->iteration, j->row.iterations_done);
    return;
  }
  zb_rpc_reply(call, &it->base);
  protobuf_c_message_free_unpacked(&it->base, NULL);
}
