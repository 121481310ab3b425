/* admission.c — the one admission check of a plan (a submission, a
 * schedule update, a Plan call): a shape whose plan cannot fit the message
 * limits is refused before it is planned; the plan is made once, with
 * libzb's pipeline (zb_job_plan), and its largest Assignment is held
 * against the smallest receive limit of the workers that could run it
 * (docs/wire.md, Assignment). Also the Plan RPC. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"

/* Sum of the decimal lengths of 0..n-1. */
static double digits_total(double n) {
  double t = 0;
  for (double lo = 0, hi = 10, len = 1; lo < n; lo = hi, hi *= 10, len++)
    t += ((n < hi ? n : hi) - lo) * len;
  return t;
}

/* Sum of the varint lengths of the zigzag-coded microbatches 0..m-1 (the
 * ActionList's sint32 column). */
static double zigzag_bytes_total(double m) {
  double t = 0;
  for (double lo = 0, hi = 64, len = 1; lo < m; lo = hi, hi *= 128, len++)
    t += ((m < hi ? m : hi) - lo) * len;
  return t;
}

/* A lower bound on the packed size of a shape's action lists. whole: all
 * ranks' lists as PyTorch strings (a PlanResponse): every (stage,
 * microbatch) has at least an F and a B, "<stage>F<mb>" framed by a tag
 * and a length byte. Else the busiest rank's v stages as ActionList
 * columns (an Assignment): with more than one rank every (stage,
 * microbatch) also has a send or receive for F and for B, and each action
 * takes at least a byte per column and its microbatch's varint. */
static double plan_min_bytes(const zb_job_spec *spec, bool whole) {
  zb_family f;
  if (zb_family_parse(spec->schedule, &f, NULL) != ZB_OK)
    return 0;
  double v = spec->chunks > 0 ? spec->chunks : zb_family_default_chunks(f);
  double m = spec->microbatches;
  if (!whole)
    return (spec->ranks > 1 ? 4 : 2) * v * (4 * m + zigzag_bytes_total(m));
  double stages = spec->ranks * v;
  return 2 * (3 * stages * m + digits_total(stages) * m + stages * digits_total(m));
}

long long coord_assignment_limit(coord *co, coord_worker *const *ws, int n, const coord_worker **by) {
  long long limit = co->cfg.max_message_bytes;
  *by = NULL;
  for (int k = 0; k < n; k++) {
    if (!ws[k])
      continue;
    long long lim = ws[k]->max_receive_bytes > 0 ? ws[k]->max_receive_bytes : COORD_OLD_WORKER_RECEIVE_BYTES;
    if (lim < limit) {
      limit = lim;
      *by = ws[k];
    }
  }
  return limit;
}

/* The limit for a job of spec: the smallest of the attached workers able
 * to run it (any of them may get a rank). */
static long long spec_limit(coord *co, const zb_job_spec *spec, const coord_worker **by) {
  int n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    n += worker_can_run(w, spec);
  coord_worker **ws = zb_calloc((size_t)(n ? n : 1), sizeof *ws);
  n = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    if (worker_can_run(w, spec))
      ws[n++] = w;
  long long limit = coord_assignment_limit(co, ws, n, by);
  free(ws);
  return limit;
}

/* Fails call with RESOURCE_EXHAUSTED: what, over which limit (the
 * coordinator's setting or a worker's), and what to do. */
static void fail_over_limit(zb_rpc_call *call, const char *what, long long limit, const coord_worker *by) {
  char name[160];
  if (by)
    snprintf(name, sizeof name, "receive limit of worker %s (its --max-message-bytes)", by->id);
  else
    snprintf(name, sizeof name, "message limit (max_message_bytes)");
  zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "%s, over the %lld-byte %s; use fewer microbatches or ranks", what, limit, name);
}

/* Refuses a shape whose plan cannot fit before planning it: generating a
 * plan of millions of actions holds the loop (and so every heartbeat and
 * report) for seconds, only to refuse it afterwards. */
static bool plan_fits(zb_rpc_call *call, const zb_job_spec *spec, bool whole, long long limit,
                      const coord_worker *by) {
  double need = plan_min_bytes(spec, whole);
  if (need <= (double)limit)
    return true;
  char what[200];
  snprintf(what, sizeof what, "spec: %s of p=%d m=%d needs at least %.0f bytes",
           whole ? "the plan" : "one rank's plan", spec->ranks, spec->microbatches, need);
  fail_over_limit(call, what, limit, by);
  return false;
}

/* Refuses a plan over the coordinator's planning budget (max_plan_ops)
 * before making it: planning holds memory in proportion to its ops (a
 * 96-million-op plan took a coordinator past 3 GB). */
static bool plan_within_budget(coord *co, zb_rpc_call *call, const zb_job_spec *spec, const char *what) {
  zb_family f = ZB_FAMILY_1F1B;
  bool known = zb_family_parse(spec->schedule, &f, NULL) == ZB_OK;
  int v = spec->chunks > 0 ? spec->chunks : known ? zb_family_default_chunks(f) : 1;
  if (known && f == ZB_FAMILY_ZB_AUTO && spec->chunks <= 0) /* its search plans up to 4 chunks */
    v = 4;
  double ops = 3.0 * spec->ranks * v * spec->microbatches;
  if (ops <= (double)co->cfg.max_plan_ops)
    return true;
  size_t n = strlen(what);
  zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "%s%s: p=%d x %d chunks x m=%d x 3 = %.0f compute ops to plan, over the coordinator's "
              "max_plan_ops %lld; use fewer microbatches or ranks",
              what, n && what[n - 1] == '.' ? "microbatches" : "", spec->ranks, v, spec->microbatches, ops,
              co->cfg.max_plan_ops);
  return false;
}

bool coord_admit_before_plan(coord *co, zb_rpc_call *call, const zb_job_spec *spec, const char *what) {
  const coord_worker *by = NULL;
  long long limit = spec_limit(co, spec, &by);
  return plan_within_budget(co, call, spec, what) && plan_fits(call, spec, false, limit, by);
}

bool coord_admit_planned(coord *co, zb_rpc_call *call, coord_job *j, const zb_job_spec *spec,
                         const char *what, zb_planner_result *plan) {
  const coord_worker *by = NULL;
  long long limit = spec_limit(co, spec, &by);
  coord_metrics_observe_plan(co, plan->generate_seconds);
  /* the data addresses are not known before the job starts (job_start
   * checks again with them) */
  zb_assignment_src src = {.job_id = j->row.id[0] ? j->row.id : "j-0000000",
                           .spec = spec,
                           .plan = plan,
                           .data_secret = j->data_secret};
  zb_assignment_sizes sz;
  zb_assignment_measure(&src, &sz);
  if ((long long)sz.largest <= limit)
    return true;
  char why[200];
  snprintf(why, sizeof why, "%sschedule: the %s assignment of rank %d is %zu bytes", what,
           zb_family_name(plan->family), sz.largest_rank, sz.largest);
  fail_over_limit(call, why, limit, by);
  zb_planner_result_free(plan);
  return false;
}

/* The most bytes a rank of plan needs: the model's fixed state on a rank
 * and the activations the plan keeps live at the rank's peak (the sim's
 * peak in units of the rank's M_F, one forward's activation) times
 * bytes_per_activation; *worst the rank. */
static double plan_rank_bytes(const zb_job_spec *spec, const zb_planner_result *plan, int *worst) {
  double state = zb_job_spec_rank_state_bytes(spec), most = 0;
  *worst = 0;
  for (int r = 0; plan->sim && r < plan->sim->p; r++) {
    double need = state + plan->sim->peak_memory_units[r] * (double)spec->bytes_per_activation;
    if (need > most) {
      most = need;
      *worst = r;
    }
  }
  return most;
}

bool coord_admit_activations(coord *co, zb_rpc_call *call, const zb_job_spec *spec,
                             const zb_planner_result *plan) {
  if (!zb_job_spec_trains_model(spec))
    return true;
  int worst;
  double need = plan_rank_bytes(spec, plan, &worst), gib = 1024.0 * 1024.0 * 1024.0;
  int offer, fit;
  long long most;
  workers_memory_fit(co, spec, need, &offer, &fit, &most);
  if (offer < zb_job_spec_world(spec) || fit >= zb_job_spec_world(spec))
    return true; /* too few workers at all: the job waits for them, or was refused for that */
  zb_rpc_fail(call, GRPC_STATUS_RESOURCE_EXHAUSTED,
              "spec: rank %d of its %s plan needs %.3g GiB (the model's state on a rank and the activations "
              "live at its peak, %lld bytes each), but %d of the %d workers able to run it have that much %s "
              "memory (the most: %.3g GiB); use more ranks, fewer microbatches in flight or a smaller model",
              worst, zb_family_name(plan->family), need / gib, spec->bytes_per_activation, fit, offer,
              job_needs_gpu(spec) ? "GPU" : "host", (double)most / gib);
  return false;
}

/* The objective a PlanRequest names; fails call for an unknown one. */
static bool plan_objective(zb_rpc_call *call, const char *name, zb_objective *out) {
  *out = ZB_OBJ_MAKESPAN;
  if (!name || !name[0] || strcmp(name, "makespan") == 0)
    return true;
  if (strcmp(name, "span") == 0) {
    *out = ZB_OBJ_SPAN;
    return true;
  }
  zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "objective: '%s' is not makespan or span", name);
  return false;
}

/* A Plan call being planned off the loop (plan_async.c). */
typedef struct plan_rpc_op {
  coord_plan_op base;
  zb_job_spec spec;
  zb_planner_result plan;
  bool with_action_lists;
  /* the answer, built and packed on the pool thread too: a large one
   * takes a second */
  grpc_byte_buffer *packed;
  size_t packed_bytes;
} plan_rpc_op;

static void plan_rpc_answer(coord_plan_op *base) {
  plan_rpc_op *op = (plan_rpc_op *)base;
  Zb__V1__PlanResponse resp;
  zb_wire_plan_response(&op->plan, op->with_action_lists, &resp);
  op->packed_bytes = protobuf_c_message_get_packed_size(&resp.base);
  if ((long long)op->packed_bytes <= base->co->cfg.max_message_bytes)
    op->packed = zb_rpc_pack(&resp.base);
  zb_wire_plan_response_clear(&resp);
}

static void plan_rpc_planned(coord_plan_op *base) {
  plan_rpc_op *op = (plan_rpc_op *)base;
  coord *co = base->co;
  if (base->call) {
    coord_metrics_observe_plan(co, op->plan.generate_seconds);
    if (!op->packed)
      zb_rpc_fail(base->call, GRPC_STATUS_RESOURCE_EXHAUSTED,
                  "spec: the plan is %zu bytes, over the %lld-byte message limit (max_message_bytes)",
                  op->packed_bytes, co->cfg.max_message_bytes);
    else
      zb_rpc_reply_packed(base->call, op->packed);
    op->packed = NULL;
  }
  if (op->packed)
    grpc_byte_buffer_destroy(op->packed);
  zb_planner_result_free(&op->plan);
  zb_job_spec_free(&op->spec);
  free(op);
}

void on_plan(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Zb__V1__PlanRequest *req = (const void *)m;
  zb_objective obj;
  zb_identity who;
  if (!authz_caller(co, call, AUTHZ_USER | AUTHZ_ADMIN, "plan", &who))
    return;
  if (!req->spec) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: required");
    return;
  }
  if (!plan_objective(call, req->objective, &obj))
    return;
  /* Plan takes a shape without a job's name */
  Zb__V1__JobSpec spec_pb = *req->spec;
  if (!spec_pb.name || !spec_pb.name[0])
    spec_pb.name = "plan";
  plan_rpc_op *op = zb_calloc(1, sizeof *op);
  zb_diag d;
  if (zb_wire_spec_from_pb(&spec_pb, &op->spec, &d) != ZB_OK) {
    zb_rpc_fail(call, GRPC_STATUS_INVALID_ARGUMENT, "spec: %s", d.msg);
    free(op);
    return;
  }
  /* without its action lists the answer is a few figures */
  if (!plan_within_budget(co, call, &op->spec, "spec.") ||
      (req->with_action_lists && !plan_fits(call, &op->spec, true, co->cfg.max_message_bytes, NULL))) {
    zb_job_spec_free(&op->spec);
    free(op);
    return;
  }
  op->with_action_lists = req->with_action_lists;
  op->base = (coord_plan_op){.co = co,
                             .call = call,
                             .spec = &op->spec,
                             .objective = obj,
                             .plan = &op->plan,
                             .what = "spec.",
                             .then = plan_rpc_answer,
                             .done = plan_rpc_planned};
  snprintf(op->base.owner, sizeof op->base.owner, "%s", who.name);
  coord_plan_off_loop(&op->base);
}
