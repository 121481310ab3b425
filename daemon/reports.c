/* reports.c — gathering the workers' Reports: heartbeats, a rank's
 * failure (held briefly in case a lost worker is the better reason), and
 * per-iteration metrics, joined into one IterationMetrics event once all
 * ranks of an iteration are in. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"
#include "zb_timeline_pb.h"

/* Rank r's timeline decoded on the coordinator's clock into ranks[r]
 * (false, and n 0, without one or when it does not decode). */
static bool timeline_of(const Zb__V1__RankIteration *ri, zb_tl_rank *out) {
  zb_tl_op *ops = NULL;
  bool ok =
      ri->timeline && zb_timeline_decode(ri->timeline, ri->start_monotonic_seconds + ri->clock_offset_seconds,
                                         &ops, &out->n, NULL) == ZB_OK;
  out->ops = ops;
  if (!ok)
    out->n = 0;
  return ok;
}

/* A sampled iteration whose every rank of replica 0 sent a timeline: the
 * timelines on the coordinator's clock (each rank's start plus its
 * worker's offset), replica 0's summarised with the simulator's
 * definitions into it and the ranks' span_* figures (the other replicas
 * run the same lists; their timelines count towards T_reduce). A timeline
 * of replica 0 that does not decode leaves it unaligned. */
static void iteration_align(coord_job *j, coord_iter_slot *slot, Zb__V1__IterationMetrics *it,
                            int32_t **stragglers) {
  int p = j->spec.ranks, world = zb_job_spec_world(&j->spec);
  const zb_planner_result *pl =
      j->switch_at >= 0 && slot->iteration >= j->switch_at ? &j->next_plan : &j->plan;
  zb_tl_rank *ranks = zb_calloc((size_t)world, sizeof *ranks);
  bool ok = true;
  for (int r = 0; r < p && ok; r++)
    ok = timeline_of(&slot->ranks[r], &ranks[r]);
  for (int r = p; r < world && ok; r++)
    timeline_of(&slot->ranks[r], &ranks[r]);
  zb_tl_summary s = {0};
  if (ok && zb_timeline_summarize(ranks, p, &s, NULL) == ZB_OK && s.span > 0) {
    it->aligned = true;
    it->span_seconds = s.span;
    it->bubble_ratio = s.bubble_ratio;
    it->bubble_ratio_paper = s.bubble_ratio_paper;
    for (int r = 0; r < p; r++) {
      slot->ranks[r].span_compute_seconds = s.compute[r];
      slot->ranks[r].span_comm_seconds = s.comm[r];
      slot->ranks[r].span_idle_seconds = s.idle[r];
    }
    job_learn(j, pl, ranks, world, &s, slot->ranks, it, stragglers);
  }
  zb_tl_summary_free(&s);
  for (int r = 0; r < world; r++)
    free((void *)ranks[r].ops);
  free(ranks);
}

/* All p ranks reported iteration slot->iteration: one event. */
static void job_iteration_complete(coord *co, coord_job *j, coord_iter_slot *slot) {
  int p = zb_job_spec_world(&j->spec);
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
  /* global: every replica ran its own m microbatches */
  it.samples_per_second = wall > 0 ? (double)j->spec.data_parallel * j->spec.microbatches / wall : 0;
  it.bubble_ratio = wall > 0 ? 1 - busy / (p * wall) : 0;
  it.predicted_bubble_ratio = slot->predicted;
  it.predicted_bubble_ratio_paper = slot->predicted_paper;
  int32_t *stragglers = NULL;
  iteration_align(j, slot, &it, &stragglers);
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
    zb_planner_result_free(&j->plan);
    j->plan = j->next_plan;
    memset(&j->next_plan, 0, sizeof j->next_plan);
    j->switch_at = -1;
    snprintf(j->row.schedule, sizeof j->row.schedule, "%s", zb_family_name(j->plan.family));
  }
  snprintf(j->row.reason, sizeof j->row.reason, "iteration %d done", slot->iteration);
  job_event(co, j, &it, NULL);
  free(ptrs);
  free(stragglers);
  if (it.aligned)
    job_adapt(co, j);
  for (int r = 0; r < p; r++) {
    zb_timeline_pb_free(slot->ranks[r].timeline);
    slot->ranks[r].timeline = NULL;
  }
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
  memset(slot->have, 0, sizeof(bool) * (size_t)zb_job_spec_world(&j->spec));
  const zb_planner_result *pl = j->switch_at >= 0 && iteration >= j->switch_at ? &j->next_plan : &j->plan;
  snprintf(slot->schedule, sizeof slot->schedule, "%s", zb_family_name(pl->family));
  slot->predicted = pl->sim ? pl->sim->bubble_ratio : 0;
  slot->predicted_paper = pl->sim ? pl->sim->bubble_ratio_paper : 0;
  slot->loss_rank = -1;
  /* a job that trains (a cpu or cuda model, or a torch job's script)
   * reports its loss from the rank holding the plan's last stage: only
   * that stage computes the loss, so the other ranks have none to give */
  if (zb_job_spec_trains_model(&j->spec) || !strcmp(j->spec.backend, ZB_BACKEND_TORCH))
    slot->loss_rank = zb_placement_rank(pl->placement, pl->p, pl->v, pl->p * pl->v - 1);
  return slot;
}

/* The slot that completes next, or NULL while it is not full: iteration
 * next_iteration once known, else the lowest slot in use (a job's first
 * iteration; a resumed job's is not 0). */
static coord_iter_slot *job_next_full(coord_job *j) {
  coord_iter_slot *next = NULL;
  for (int k = 0; k < COORD_ITER_SLOTS; k++) {
    coord_iter_slot *s = &j->slots[k];
    if (s->iteration < 0)
      continue;
    if (j->next_iteration >= 0 ? s->iteration == j->next_iteration : !next || s->iteration < next->iteration)
      next = s;
  }
  return next && next->n == zb_job_spec_world(&j->spec) ? next : NULL;
}

/* Completes every full slot in iteration order. A rank reports in order,
 * but after a coordinator restart its worker sends its last reports again
 * while its job thread may retry a later one, which can arrive first
 * (docs/wire.md, Reports): a later full slot waits for the earlier ones. */
static void job_complete_ready(coord *co, coord_job *j) {
  coord_iter_slot *s;
  while ((s = job_next_full(j))) {
    j->next_iteration = s->iteration + 1;
    job_iteration_complete(co, j, s);
  }
}

/* Copies a rank's reported figures into its slot (field by field: the
 * request's message is freed after the handler). */
static void report_copy(Zb__V1__RankIteration *ri, int rank, const Zb__V1__RankIteration *m) {
  zb__v1__rank_iteration__init(ri);
  ri->rank = rank;
  ri->wall_seconds = m->wall_seconds;
  ri->busy_f_seconds = m->busy_f_seconds;
  ri->busy_b_seconds = m->busy_b_seconds;
  ri->busy_w_seconds = m->busy_w_seconds;
  ri->idle_seconds = m->idle_seconds;
  ri->bytes_sent = m->bytes_sent;
  ri->peak_memory = m->peak_memory;
  ri->peak_memory_bytes = m->peak_memory_bytes;
  ri->bubble_ratio = m->bubble_ratio;
  ri->start_monotonic_seconds = m->start_monotonic_seconds;
  ri->loss = m->loss;
  ri->has_loss = m->has_loss;
  ri->grad_norm = m->grad_norm;
  ri->clipped = m->clipped;
  ri->skipped = m->skipped;
  ri->has_grad_norm = m->has_grad_norm;
  ri->comm_groups = m->comm_groups;
  ri->comm_actions = m->comm_actions;
  ri->device_peak_bytes = m->device_peak_bytes;
  ri->device_used_bytes = m->device_used_bytes;
  ri->cpu_wait_seconds = m->cpu_wait_seconds;
  ri->comm_wait_seconds = m->comm_wait_seconds;
  ri->clock_offset_seconds = m->clock_offset_seconds;
  ri->clock_rtt_seconds = m->clock_rtt_seconds;
  ri->timeline = zb_timeline_pb_copy(m->timeline);
}

/* The times a rank reported, checked before they are kept: its clock
 * offset and start finite and sane, and its timeline (if any) one the
 * iteration's plan could have produced on that rank: at most one row per
 * action of its list, each a stage it hosts and a microbatch of the plan.
 * False with diag naming the field. */
static bool report_times_ok(const coord_job *j, int rank, int iteration, const Zb__V1__RankIteration *m,
                            zb_diag *d) {
  const zb_planner_result *pl = j->switch_at >= 0 && iteration >= j->switch_at ? &j->next_plan : &j->plan;
  if (!isfinite(m->clock_offset_seconds) || fabs(m->clock_offset_seconds) > 1e6 ||
      !isfinite(m->clock_rtt_seconds) || m->clock_rtt_seconds < 0) {
    zb_diag_set(d, ZB_ERR_INVALID_ARG, "clock_offset_seconds: %g (round trip %g s) is not a clock offset",
                m->clock_offset_seconds, m->clock_rtt_seconds);
    return false;
  }
  if (!isfinite(m->start_monotonic_seconds) || m->start_monotonic_seconds < 0 ||
      m->start_monotonic_seconds > 1e12) {
    zb_diag_set(d, ZB_ERR_INVALID_ARG, "start_monotonic_seconds: %g is not a monotonic time",
                m->start_monotonic_seconds);
    return false;
  }
  if (!m->timeline)
    return true;
  zb_tl_op *ops = NULL;
  int n = 0;
  if (zb_timeline_decode(m->timeline, 0, &ops, &n, d) != ZB_OK)
    return false;
  const zb_rank_list *l = pl->lowered && rank < pl->lowered->p ? &pl->lowered->ranks[rank] : NULL;
  bool ok = l && n <= l->n;
  if (!ok)
    zb_diag_set(d, ZB_ERR_INVALID_ARG, "timeline: %d rows, more than rank %d's %d actions", n, rank,
                l ? l->n : 0);
  for (int i = 0; ok && i < n; i++) {
    /* a reduction has no microbatch (docs/schedules.md, Gradient reduction) */
    bool reduce = ops[i].op == ZB_OP_REDUCE_GRAD || ops[i].op == ZB_OP_WAIT_REDUCE_GRAD;
    ok = ops[i].stage >= 0 && ops[i].stage < pl->p * pl->v && (reduce ? ops[i].mb == -1 : ops[i].mb >= 0) &&
         ops[i].mb < pl->m && zb_stage_rank(pl->lowered, ops[i].stage) == rank;
    if (!ok)
      zb_diag_set(d, ZB_ERR_INVALID_ARG,
                  "timeline row %d: stage %d microbatch %d is not rank %d's (%d stages, %d "
                  "microbatches)",
                  i, ops[i].stage, ops[i].mb, rank, pl->p * pl->v, pl->m);
  }
  free(ops);
  return ok;
}

/* The measured figures a rank reported, checked before they are kept (a
 * NaN or a negative time would be averaged and exported as it is): every
 * time finite and not negative, the bubble ratio a ratio, peaks and
 * counts not negative. The loss and the gradient norm are the model's and
 * may be non-finite (a diverged run, a skipped step). False with diag
 * naming the field. */
static bool report_figures_ok(const Zb__V1__RankIteration *m, zb_diag *d) {
  const struct {
    const char *name;
    double v;
  } secs[] = {{"wall_seconds", m->wall_seconds},           {"busy_f_seconds", m->busy_f_seconds},
              {"busy_b_seconds", m->busy_b_seconds},       {"busy_w_seconds", m->busy_w_seconds},
              {"idle_seconds", m->idle_seconds},           {"cpu_wait_seconds", m->cpu_wait_seconds},
              {"comm_wait_seconds", m->comm_wait_seconds}, {"peak_memory", m->peak_memory}};
  for (size_t k = 0; k < sizeof secs / sizeof secs[0]; k++)
    if (!isfinite(secs[k].v) || secs[k].v < 0 || secs[k].v > 1e9) {
      zb_diag_set(d, ZB_ERR_INVALID_ARG, "%s: %g is not a measured figure (finite, 0 to 1e9)", secs[k].name,
                  secs[k].v);
      return false;
    }
  if (!isfinite(m->bubble_ratio) || m->bubble_ratio < 0 || m->bubble_ratio > 1) {
    zb_diag_set(d, ZB_ERR_INVALID_ARG, "bubble_ratio: %g is not a ratio (0 to 1)", m->bubble_ratio);
    return false;
  }
  if (m->bytes_sent < 0 || m->peak_memory_bytes < 0 || m->comm_groups < 0 || m->comm_actions < 0) {
    zb_diag_set(d, ZB_ERR_INVALID_ARG, "bytes_sent, peak_memory_bytes, comm_groups, comm_actions: negative");
    return false;
  }
  if (m->device_peak_bytes < 0 || m->device_used_bytes < 0) { /* the GPU's figures, exported as gauges */
    zb_diag_set(d, ZB_ERR_INVALID_ARG, "%s: %lld is negative (bytes; 0 when the rank has no GPU)",
                m->device_peak_bytes < 0 ? "device_peak_bytes" : "device_used_bytes",
                (long long)(m->device_peak_bytes < 0 ? m->device_peak_bytes : m->device_used_bytes));
    return false;
  }
  return true;
}

/* A rank's iteration figures into their slot; false after failing call. */
static bool report_iteration(coord *co, zb_rpc_call *call, coord_job *j, coord_worker *w,
                             const Zb__V1__ReportRequest *req) {
  if (req->iteration < 0 || req->iteration >= j->spec.iterations) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "iteration: %d is not an iteration of job %s (0..%d)",
                req->iteration, j->row.id, j->spec.iterations - 1);
    return false;
  }
  if (req->iteration < j->row.iterations_done)
    return true; /* completed: a retry whose answer was lost, or a report sent again after a restart */
  coord_iter_slot *slot = job_slot(j, req->iteration);
  if (!slot) {
    zb_rpc_fail(
        call, GRPC_STATUS_INVALID_ARGUMENT,
        "iteration: rank %d ran too far ahead: iteration %d, %d or more past the oldest incomplete one",
        w->rank, req->iteration, COORD_ITER_SLOTS);
    return false;
  }
  if (slot->have[w->rank])
    return true; /* a retry of a report whose answer was lost: counted once already */
  int r = zb_dp_pipeline_rank(w->rank, j->spec.ranks); /* the plan's rank */
  if (req->metrics->has_loss && r != slot->loss_rank) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "metrics.has_loss: rank %d does not compute the loss of iteration %d (%s)", w->rank,
                req->iteration,
                slot->loss_rank < 0 ? "the job trains no model" : "the last stage is on another rank");
    return false;
  }
  zb_diag d = {{0}};
  if (!report_figures_ok(req->metrics, &d) || !report_times_ok(j, r, req->iteration, req->metrics, &d)) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "metrics.%s", d.msg);
    return false;
  }
  Zb__V1__RankIteration *ri = &slot->ranks[w->rank];
  report_copy(ri, w->rank, req->metrics);
  slot->have[w->rank] = true;
  slot->n++;
  if (req->iteration > j->max_reported)
    j->max_reported = req->iteration;
  coord_metrics_observe_ops(co, j, ri);
  if (slot->n == zb_job_spec_world(&j->spec))
    job_complete_ready(co, j);
  return true;
}

/* A rank's failure: the first one is kept, and the job fails with it after
 * COORD_FAIL_GRACE_MS unless a worker of the job is lost first: "peer rank
 * 2 closed the connection" from rank 1 is a symptom of rank 2. For the
 * same reason a kept failure that only echoes a peer's (from_peer) gives
 * way to a rank's own that arrives within the grace, which it does not
 * extend: rank 1's "frame 0 from rank 0 failed its MAC" over rank 0's
 * "peer rank 1 closed the connection", whichever came first. */
static void report_failure(coord_job *j, const coord_worker *w, const char *error, bool from_peer) {
  if (j->fail_at_ms && (from_peer || !j->fail_from_peer))
    return;
  char who[128];
  job_rank_who(j, w, who, sizeof who);
  snprintf(j->fail_reason, sizeof j->fail_reason, "%s failed: %s", who, error);
  j->fail_from_peer = from_peer;
  if (!j->fail_at_ms)
    j->fail_at_ms = zb_clock_unix_ms() + COORD_FAIL_GRACE_MS;
}

/* Answers a report; when it carried the worker's send time, with the
 * coordinator's receive time t2 and now (docs/wire.md, Timelines). */
static void report_reply(zb_rpc_call *call, Zb__V1__ReportResponse *resp, const Zb__V1__ReportRequest *req,
                         double t2) {
  if (req->sent_seconds > 0) {
    resp->received_seconds = t2;
    resp->replied_seconds = zb_clock_s();
  }
  zb_rpc_reply(call, &resp->base);
}

/* The job of a report from w, or NULL after answering call: a heartbeat,
 * a late report of a job that ended, or one that is not w's. */
static coord_job *report_job(coord *co, zb_rpc_call *call, coord_worker *w, const Zb__V1__ReportRequest *req,
                             double t2) {
  Zb__V1__ReportResponse resp = ZB__V1__REPORT_RESPONSE__INIT;
  if (!req->job_id || !req->job_id[0]) { /* heartbeat */
    report_reply(call, &resp, req, t2);
    return NULL;
  }
  coord_job *j = job_find(co, req->job_id);
  if (!j) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "job_id: no job '%s'", req->job_id);
    return NULL;
  }
  if (j->row.state == ZB_JOB_RUNNING && j->recover_until_ms && w->job != j) {
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "job_id: job %s waits for its ranks to attach again",
                j->row.id);
    return NULL;
  }
  if (j->row.state != ZB_JOB_RUNNING || w->job != j) {
    resp.stop = true;
    report_reply(call, &resp, req, t2);
    return NULL;
  }
  if (req->rank != w->rank) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "rank: worker %s runs rank %d of job %s, not %d", w->id,
                w->rank, j->row.id, req->rank);
    return NULL;
  }
  if (!utf8_valid(req->error)) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "error: not valid UTF-8");
    return NULL;
  }
  return j;
}

/* Rank 0's NCCL bootstrap id (docs/wire.md, NCCL id exchange): checked,
 * kept on the job and sent to every rank; false after failing call. The
 * same id again (a retried Report) is answered without a second fan-out. */
static bool report_nccl_id(coord_job *j, zb_rpc_call *call, const coord_worker *w,
                           const Zb__V1__ReportRequest *req) {
  const ProtobufCBinaryData *id = &req->nccl_unique_id;
  const char *why = NULL;
  if (strcmp(j->spec.transport, "nccl") != 0)
    why = "the job's transport is not nccl";
  else if (w->rank != 0)
    why = "only rank 0 makes the job's id";
  else if (id->len != ZB_NCCL_ID_BYTES)
    why = "not NCCL_UNIQUE_ID_BYTES (128) bytes";
  else if (j->has_nccl_id && memcmp(j->nccl_id, id->data, ZB_NCCL_ID_BYTES) != 0)
    why = "the job already has another id (one per job)";
  if (why) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "nccl_unique_id: %zu bytes from rank %d of job %s (transport %s): %s", id->len, w->rank,
                j->row.id, j->spec.transport, why);
    return false;
  }
  if (j->has_nccl_id)
    return true;
  memcpy(j->nccl_id, id->data, ZB_NCCL_ID_BYTES);
  j->has_nccl_id = true;
  ZB_INFO("job %s: rank 0's NCCL id in; sent to its %d ranks", j->row.id, zb_job_spec_world(&j->spec));
  job_send_nccl_id(j);
  return true;
}

/* A stage group's NCCL id from its member 0 (replica 0's rank r; docs/
 * wire.md, NCCL id exchange): checked like the job's, kept by pipeline
 * rank and sent to the group's members; false after failing call. */
static bool report_group_id(coord_job *j, zb_rpc_call *call, const coord_worker *w,
                            const Zb__V1__ReportRequest *req) {
  const ProtobufCBinaryData *id = &req->nccl_group_unique_id;
  int p = j->spec.ranks, r = zb_dp_pipeline_rank(w->rank, p);
  const char *why = NULL;
  if (strcmp(j->spec.transport, "nccl") != 0)
    why = "the job's transport is not nccl";
  else if (j->spec.data_parallel <= 1)
    why = "the job has one replica (no stage groups)";
  else if (zb_dp_replica(w->rank, p) != 0)
    why = "only replica 0's rank makes its stage group's id";
  else if (id->len != ZB_NCCL_ID_BYTES)
    why = "not NCCL_UNIQUE_ID_BYTES (128) bytes";
  else if (j->has_group_id && j->has_group_id[r] && memcmp(j->group_ids[r], id->data, ZB_NCCL_ID_BYTES) != 0)
    why = "the stage group already has another id (one per group)";
  if (why) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT,
                "nccl_group_unique_id: %zu bytes from rank %d of job %s (transport %s, data_parallel %d): %s",
                id->len, w->rank, j->row.id, j->spec.transport, j->spec.data_parallel, why);
    return false;
  }
  if (!j->has_group_id) {
    j->group_ids = zb_calloc((size_t)p, sizeof *j->group_ids);
    j->has_group_id = zb_calloc((size_t)p, sizeof *j->has_group_id);
  }
  if (j->has_group_id[r])
    return true;
  memcpy(j->group_ids[r], id->data, ZB_NCCL_ID_BYTES);
  j->has_group_id[r] = true;
  ZB_INFO("job %s: stage group %d's NCCL id in; sent to its %d members", j->row.id, r, j->spec.data_parallel);
  job_send_group_id(j, r);
  return true;
}

void on_report(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  double t2 = zb_clock_s();
  const Zb__V1__ReportRequest *req = (const void *)m;
  coord_metrics_count_report(co);
  Zb__V1__ReportResponse resp = ZB__V1__REPORT_RESPONSE__INIT;
  if (!authz_worker(co, call, req->worker_id, "report"))
    return;
  if (!req->worker_id || !req->worker_id[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "worker_id: required");
    return;
  }
  coord_worker *w = worker_find(co, req->worker_id);
  if (!w) { /* not attached (yet): after a coordinator restart it attaches, then this goes through */
    zb_rpc_fail(call, GRPC_STATUS_UNAVAILABLE, "worker_id: no worker '%s' is attached (yet)", req->worker_id);
    return;
  }
  w->last_seen_ms = zb_clock_unix_ms();
  coord_job *j = report_job(co, call, w, req, t2);
  if (!j)
    return;
  if (req->error && req->error[0]) {
    report_failure(j, w, req->error, req->error_from_peer);
    resp.stop = true;
    report_reply(call, &resp, req, t2);
    return;
  }
  if (req->nccl_unique_id.len && !report_nccl_id(j, call, w, req))
    return;
  if (req->nccl_group_unique_id.len && !report_group_id(j, call, w, req))
    return;
  if (req->metrics && !report_iteration(co, call, j, w, req))
    return;
  if (req->done && !j->rank_done[w->rank]) {
    j->rank_done[w->rank] = true;
    j->done_ranks++;
  }
  if (j->done_ranks == zb_job_spec_world(&j->spec) && j->row.iterations_done >= j->spec.iterations) {
    char reason[128];
    snprintf(reason, sizeof reason, "%d iterations done", j->row.iterations_done);
    job_finish(co, j, ZB_JOB_SUCCEEDED, reason);
    resp.stop = true;
    coord_start_pending(co);
  }
  report_reply(call, &resp, req, t2);
}
