/* dispatch.c — handing plans to workers: starting a pending job on idle
 * workers (placed by placement.c), sending each rank its Assignment
 * (zb_assignment.h), releasing them, and schedule updates of a running
 * job (a new plan from an iteration no rank has started). */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_arch.h"
#include "zb_clock.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"
#include "zb_names.h"

void worker_send(coord_worker *w, const Zb__V1__Command *cmd) {
  if (w && w->attach)
    zb_rpc_stream_write(w->attach, &cmd->base);
}

void job_release_workers(coord_job *j) {
  if (!j->ranks)
    return;
  for (int r = 0; r < zb_job_spec_world(&j->spec); r++) {
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

/* A model whose head is tied to its embedding over several stages: the
 * ranks of the end stages sum the weight's gradients (docs/model.md, Tied
 * head). */
static bool job_tied_ends(const coord_job *j, const zb_planner_result *plan) {
  zb_arch arch;
  return zb_model_spec_has_arch(&j->spec.model) && plan->p * plan->v > 1 &&
         zb_model_spec_arch(&j->spec.model, &arch, NULL) == ZB_OK && arch.tied;
}

zb_assignment_src job_assignment_src(coord_job *j, const zb_planner_result *plan, int version, int first) {
  zb_assignment_src src = {.job_id = j->row.id,
                           .spec = &j->spec,
                           .plan = plan,
                           .plan_version = version,
                           .first_iteration = first,
                           .data_secret = j->data_secret};
  /* a model job's update that moves stages: weights may go to any rank */
  src.all_peers = plan != &j->plan && zb_job_spec_trains_model(&j->spec) &&
                  (plan->v != j->plan.v || plan->placement != j->plan.placement);
  src.tied_ends = job_tied_ends(j, plan);
  if (j->ranks) {
    int world = zb_job_spec_world(&j->spec);
    const char **addrs = zb_calloc((size_t)world, sizeof(char *));
    for (int g = 0; g < world; g++)
      addrs[g] = j->ranks[g] ? j->ranks[g]->data_address : NULL;
    src.addresses = addrs;
  }
  return src;
}

static void job_send_plan(coord_job *j, const zb_planner_result *plan, int version, int first) {
  zb_assignment_src src = job_assignment_src(j, plan, version, first);
  /* every replica runs the plan: an update goes to all of them */
  for (int g = 0; g < zb_job_spec_world(&j->spec); g++) {
    Zb__V1__Assignment a;
    zb_assignment_encode(&src, g, &a);
    Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
    cmd.kind_case = ZB__V1__COMMAND__KIND_ASSIGN;
    cmd.assign = &a;
    worker_send(j->ranks[g], &cmd);
    zb_assignment_encode_clear(&a);
  }
  free((void *)src.addresses);
}

void job_send_nccl_id(coord_job *j) {
  Zb__V1__NcclId id = ZB__V1__NCCL_ID__INIT;
  id.job_id = j->row.id;
  id.unique_id.data = j->nccl_id;
  id.unique_id.len = sizeof j->nccl_id;
  Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
  cmd.kind_case = ZB__V1__COMMAND__KIND_NCCL_ID;
  cmd.nccl_id = &id;
  for (int r = 0; j->ranks && r < zb_job_spec_world(&j->spec); r++)
    worker_send(j->ranks[r], &cmd);
}

void job_send_group_id(coord_job *j, int r) {
  Zb__V1__NcclId id = ZB__V1__NCCL_ID__INIT;
  id.job_id = j->row.id;
  id.unique_id.data = j->group_ids[r];
  id.unique_id.len = ZB_NCCL_ID_BYTES;
  id.stage_group = true;
  id.pipeline_rank = r;
  Zb__V1__Command cmd = ZB__V1__COMMAND__INIT;
  cmd.kind_case = ZB__V1__COMMAND__KIND_NCCL_ID;
  cmd.nccl_id = &id;
  /* the group of pipeline rank r: global ranks k x p + r (zb_jobspec_dp.h) */
  for (int k = 0; j->ranks && k < j->spec.data_parallel; k++)
    worker_send(j->ranks[k * j->spec.ranks + r], &cmd);
}

/* Admission held the plan against the workers attached then; one that
 * attached since with a smaller receive limit may be among the ranks. */
static bool job_fits_workers(coord *co, coord_job *j) {
  const coord_worker *by = NULL;
  long long limit = coord_assignment_limit(co, j->ranks, zb_job_spec_world(&j->spec), &by);
  zb_assignment_src src = job_assignment_src(j, &j->plan, 1, 0);
  zb_assignment_sizes sz;
  zb_assignment_measure(&src, &sz);
  free((void *)src.addresses);
  if ((long long)sz.largest <= limit)
    return true;
  char reason[256];
  snprintf(reason, sizeof reason,
           "the assignment of rank %d is %zu bytes, over the %lld-byte receive limit of worker %s",
           sz.largest_rank, sz.largest, limit, by ? by->id : "(the coordinator's max_message_bytes)");
  job_finish(co, j, ZB_JOB_FAILED, reason);
  return false;
}

/* The run-time state of a job about to run: nobody reported yet. */
void job_runtime_init(coord_job *j) {
  int p = zb_job_spec_world(&j->spec);
  j->rank_done = zb_calloc((size_t)p, sizeof(bool));
  j->next_iteration = -1;
  j->done_ranks = 0;
  j->max_reported = -1;
  j->plan_version = 1;
  j->switch_at = -1;
  for (int k = 0; k < COORD_ITER_SLOTS; k++) {
    j->slots[k].iteration = -1;
    j->slots[k].have = zb_calloc((size_t)p, sizeof(bool));
    j->slots[k].ranks = zb_calloc((size_t)p, sizeof(Zb__V1__RankIteration));
  }
}

void job_record_owners(coord_job *j) {
  int p = zb_job_spec_world(&j->spec);
  free(j->row.rank_owners);
  j->row.rank_owners = zb_calloc((size_t)p, sizeof *j->row.rank_owners);
  j->row.n_rank_owners = p;
  for (int r = 0; r < p; r++)
    snprintf(j->row.rank_owners[r], sizeof j->row.rank_owners[r], "%s", j->ranks[r]->owner);
}

static void job_start(coord *co, coord_job *j) {
  int p = zb_job_spec_world(&j->spec);
  job_take_workers(co, j);
  if (!job_fits_workers(co, j))
    return;
  job_record_owners(j);
  job_runtime_init(j);
  j->row.state = ZB_JOB_RUNNING;
  snprintf(j->row.reason, sizeof j->row.reason, "ranks assigned: %d workers", p);
  snprintf(j->row.schedule, sizeof j->row.schedule, "%s", zb_family_name(j->plan.family));
  ZB_INFO("job %s RUNNING: %s on %d ranks (%d replicas), %d microbatches, %d iterations", j->row.id,
          j->row.schedule, p, j->spec.data_parallel, j->spec.microbatches, j->spec.iterations);
  job_event(co, j, NULL, NULL);
  job_send_plan(j, &j->plan, 1, 0);
}

/* A pending job past its wait_for_workers_s with fewer able workers
 * attached than ranks fails, saying so. */
static void job_timed_out(coord *co, coord_job *j, int able) {
  const zb_job_spec *s = &j->spec;
  char reason[sizeof j->row.reason];
  snprintf(
      reason, sizeof reason,
      "no %d workers able to run it (backend %s, transport %s) within wait_for_workers_s %d: %d attached",
      zb_job_spec_world(s), s->backend, s->transport, s->wait_for_workers_s, able);
  job_finish(co, j, ZB_JOB_FAILED, reason);
}

/* A pending job with fewer able workers attached than ranks: its reason
 * says how many it has (an event when that changes). */
static void job_waits_for_workers(coord *co, coord_job *j, int able) {
  const zb_job_spec *s = &j->spec;
  char reason[sizeof j->row.reason];
  snprintf(reason, sizeof reason,
           "waiting for %d workers able to run it (backend %s, transport %s), %d attached",
           zb_job_spec_world(s), s->backend, s->transport, able);
  if (strcmp(reason, j->row.reason) != 0) {
    snprintf(j->row.reason, sizeof j->row.reason, "%s", reason);
    job_event(co, j, NULL, NULL);
  }
}

/* A waiting job's plan being made again to start it (plan_async.c). */
typedef struct start_op {
  coord_plan_op base;
  coord_job *j;
} start_op;

/* Back on the loop: the job starts if it still waits and its workers are
 * still idle (coord_start_pending), fails naming why it cannot be planned,
 * or, cancelled meanwhile, drops the plan. */
static void start_planned(coord_plan_op *base) {
  start_op *op = (start_op *)base;
  coord *co = base->co;
  coord_job *j = op->j;
  bool cancelled = base->cancelled;
  zb_err err = base->err;
  char why[200];
  snprintf(why, sizeof why, "%.180s", base->diag.msg);
  free(op);
  j->start_planning = false;
  if (cancelled || co->stopping || j->row.state != ZB_JOB_PENDING) {
    zb_planner_result_free(&j->plan);
    return;
  }
  if (err) {
    char reason[256];
    snprintf(reason, sizeof reason, "cannot be planned at its start: %s", why);
    zb_planner_result_free(&j->plan);
    job_finish(co, j, ZB_JOB_FAILED, reason);
  } else {
    coord_metrics_observe_plan(co, j->plan.generate_seconds);
  }
  coord_start_pending(co);
}

/* Makes j's plan again, off the loop, to start it (the plan it was
 * admitted with was dropped while it waited). */
static void job_plan_for_start(coord *co, coord_job *j) {
  start_op *op = zb_calloc(1, sizeof *op);
  op->j = j;
  op->base = (coord_plan_op){.co = co,
                             .spec = &j->spec,
                             .objective = ZB_OBJ_MAKESPAN,
                             .plan = &j->plan,
                             .what = "spec.",
                             .done = start_planned};
  snprintf(op->base.owner, sizeof op->base.owner, "%s", j->spec.owner);
  j->start_planning = true;
  ZB_INFO("job %s: workers are there; making its plan again to start it", j->row.id);
  coord_plan_off_loop(&op->base);
}

/* The jobs that go on waiting hold no plan; the memory goes back to the
 * system (a plan made on a pool thread sits in that thread's arena, which
 * free alone keeps). */
static void pending_drop_plans(coord *co) {
  bool dropped = false;
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state == ZB_JOB_PENDING && !j->start_planning && j->plan.p) {
      zb_planner_result_free(&j->plan);
      dropped = true;
    }
  if (dropped)
    malloc_trim(0);
}

/* Starts pending jobs, oldest first, while enough workers are idle. One
 * that lacks attached workers waits for them, up to its
 * wait_for_workers_s, and holds nothing: no job's end could start it, so
 * later jobs that fit start beside it (backfill). The first that has the
 * workers but not idle ones holds the rest (no overtaking): it starts as
 * soon as jobs end, so a large job is not starved by smaller ones once
 * its workers are there. So does one whose plan is being made to start
 * it. */
static void start_in_order(coord *co) {
  int64_t now = zb_clock_unix_ms();
  for (coord_job *j = co->jobs; j; j = j->next) {
    if (j->row.state != ZB_JOB_PENDING)
      continue;
    int idle = workers_idle(co, &j->spec);
    /* able is read only when too few are idle: no second walk of the
     * workers for a job that starts */
    int world = zb_job_spec_world(&j->spec);
    jc_waiting w = {.ranks = world,
                    .able = idle >= world ? idle : workers_able(co, &j->spec),
                    .idle = idle,
                    .has_plan = j->plan.p > 0,
                    .planning = j->start_planning,
                    .created_ms = j->row.created_ms,
                    .wait_for_workers_s = j->spec.wait_for_workers_s};
    switch (jc_queue_step(&w, now)) {
    case JC_START: job_start(co, j); break;
    case JC_PLAN: job_plan_for_start(co, j); return;
    case JC_HOLD: return;
    case JC_WAIT_WORKERS: job_waits_for_workers(co, j, w.able); break;
    case JC_TIMED_OUT: job_timed_out(co, j, w.able); break;
    }
  }
}

void coord_start_pending(coord *co) {
  start_in_order(co);
  pending_drop_plans(co);
}

/* Whether j can take an update now; fails call when not. */
static bool update_allowed(zb_rpc_call *call, const coord_job *j, const Zb__V1__UpdateScheduleRequest *req) {
  if (j->row.state != ZB_JOB_RUNNING) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "job_id: job %s is %s, not RUNNING", j->row.id,
                zb_job_state_name(j->row.state));
    return false;
  }
  if (j->recovered) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "job_id: job %s was taken back after a coordinator restart: its ranks' data-plane secret is "
                "not stored, so its schedule stays",
                j->row.id);
    return false;
  }
  if (j->updating) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "job_id: job %s has an update being planned",
                j->row.id);
    return false;
  }
  if (j->switch_at >= 0) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "job_id: job %s already has an update waiting for iteration %d", j->row.id, j->switch_at);
    return false;
  }
  if (!req->schedule || !req->schedule[0]) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "schedule: required");
    return false;
  }
  return true;
}

/* An update of a cpu or cuda job that places stages elsewhere (another
 * chunk count or placement) moves their weights and optimizer moments
 * between ranks at the switch (docs/model.md, Schedule updates move
 * stages); its assignments carry every rank's data address for that. */
void job_switch_plan(coord_job *j, zb_planner_result *plan, int at) {
  j->next_plan = *plan;
  memset(plan, 0, sizeof *plan);
  j->switch_at = at;
  j->plan_version++;
  job_send_plan(j, &j->next_plan, j->plan_version, at);
}

/* An update being planned off the loop (plan_async.c). The job cannot be
 * pruned meanwhile (j->updating), and a second update waits for it. */
typedef struct update_op {
  coord_plan_op base;
  coord_job *j;
  zb_job_spec spec; /* the job's, with the new schedule (stage_costs shared) */
  zb_planner_result plan;
} update_op;

/* Back on the loop: the job may have ended meanwhile; the plan's size is
 * checked, then it is switched in three iterations past the latest report
 * (ranks run at most about one iteration apart, so no rank has started
 * that one yet). */
static void update_planned(coord_plan_op *base) {
  update_op *op = (update_op *)base;
  coord_job *j = op->j;
  zb_rpc_call *call = base->call;
  j->updating = false;
  int at = j->max_reported + 3;
  if (!call || !coord_admit_planned(base->co, call, j, &op->spec, "", &op->plan))
    goto done;
  if (j->row.state != ZB_JOB_RUNNING || at >= j->spec.iterations) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION, "job_id: job %s %s", j->row.id,
                j->row.state != ZB_JOB_RUNNING ? "ended while its update was planned"
                                               : "ends before an update could apply");
    goto done;
  }
  bool moves = op->plan.v != j->plan.v || op->plan.placement != j->plan.placement;
  if (moves && !strcmp(j->spec.backend, ZB_BACKEND_TORCH)) {
    /* the script built each process's stage modules at start and zb does
     * not move them: every agent would fail at the switch */
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "schedule: job %s is a torch job, whose stages cannot move between its torchrun processes; "
                "%s places its stages otherwise than %s (choose a schedule with the same chunks and "
                "placement)",
                j->row.id, op->spec.schedule, j->spec.schedule);
    goto done;
  }
  if (moves && (job_tied_ends(j, &j->plan) || job_tied_ends(j, &op->plan))) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "schedule: job %s's model ties its head to its embedding over several stages, whose two "
                "holders cannot move at an update yet; %s places its stages otherwise than %s (choose a "
                "schedule with the same chunks and placement)",
                j->row.id, op->spec.schedule, j->spec.schedule);
    goto done;
  }
  job_switch_plan(j, &op->plan, at);
  snprintf(j->spec.schedule, sizeof j->spec.schedule, "%s", op->spec.schedule);
  j->spec.chunks = op->spec.chunks;
  j->spec.mem_limit = op->spec.mem_limit;
  ZB_INFO("job %s: schedule update to %s from iteration %d (plan version %d)", j->row.id, op->spec.schedule,
          at, j->plan_version);
  Zb__V1__UpdateScheduleResponse resp = ZB__V1__UPDATE_SCHEDULE_RESPONSE__INIT;
  Zb__V1__Job pb;
  job_pb(j, &pb);
  resp.job = &pb;
  resp.from_iteration = at;
  zb_rpc_reply(call, &resp.base);
  job_pb_clear(&pb);
done:
  zb_planner_result_free(&op->plan);
  free(op);
}

void on_update_schedule(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__UpdateScheduleRequest *req = (const void *)m;
  coord_job *j = job_lookup(co, call, req->job_id);
  if (!j || !update_allowed(call, j, req))
    return;
  update_op *op = zb_calloc(1, sizeof *op);
  op->j = j;
  op->spec = j->spec;
  snprintf(op->spec.schedule, sizeof op->spec.schedule, "%s", req->schedule);
  op->spec.chunks = req->chunks;
  op->spec.mem_limit = req->mem_limit;
  zb_diag d;
  if (zb_job_spec_check(&op->spec, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "%s", d.msg);
    free(op);
    return;
  }
  if (j->max_reported + 3 >= j->spec.iterations) {
    zb_rpc_fail(call, GRPC_STATUS_FAILED_PRECONDITION,
                "job_id: job %s ends at iteration %d, before an update could apply (iteration %d)", j->row.id,
                j->spec.iterations, j->max_reported + 3);
    free(op);
    return;
  }
  if (!coord_admit_before_plan(co, call, &op->spec, "")) {
    free(op);
    return;
  }
  j->updating = true;
  op->base = (coord_plan_op){.co = co,
                             .call = call,
                             .spec = &op->spec,
                             .objective = ZB_OBJ_MAKESPAN,
                             .plan = &op->plan,
                             .what = "",
                             .done = update_planned};
  snprintf(op->base.owner, sizeof op->base.owner, "%s", j->spec.owner);
  coord_plan_off_loop(&op->base);
}
