/* plan_async.c — plans made on libuv's thread pool for SubmitJob,
 * UpdateSchedule, Plan and a waiting job's start, so that heartbeats,
 * Reports and health checks are answered while a large plan is computed
 * (docs/operations.md, max_plan_ops). Planning is queued per identity and
 * served round-robin: at most max_concurrent_plans run at once, at most
 * max_concurrent_plans_per_identity of one identity's, so one caller's
 * flood of large plans neither holds every planner nor the memory of many
 * plans at once, and another caller's plan is made next. A client that
 * leaves before its plan starts takes it off the queue; one that leaves
 * during it gets nothing, and its op ends quietly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"

static coord_plan_owner *owner_find(coord *co, const char *name, bool make) {
  coord_plan_owner **at = &co->plan_owners;
  for (; *at; at = &(*at)->next)
    if (strcmp((*at)->name, name) == 0)
      return *at;
  if (!make)
    return NULL;
  coord_plan_owner *o = zb_calloc(1, sizeof *o);
  snprintf(o->name, sizeof o->name, "%s", name);
  *at = o;
  return o;
}

/* Takes o off the owners' list; free it when it has nothing queued or running. */
static void owner_unlink(coord *co, coord_plan_owner *o) {
  for (coord_plan_owner **at = &co->plan_owners; *at; at = &(*at)->next)
    if (*at == o) {
      *at = o->next;
      o->next = NULL;
      return;
    }
}

static void owner_forget_if_idle(coord *co, coord_plan_owner *o) {
  if (o->head || o->running)
    return;
  owner_unlink(co, o);
  free(o);
}

static void plan_work(uv_work_t *req);
static void plan_after(uv_work_t *req, int status);

/* Starts queued plans while planners are free: the first owner in list
 * order with a plan queued and room under its own limit goes, then moves
 * to the list's end (round-robin). */
static void plans_dispatch(coord *co) {
  while (!co->stopping && co->plans_running < co->cfg.max_concurrent_plans) {
    coord_plan_owner *o = co->plan_owners;
    while (o && (!o->head || o->running >= co->cfg.max_concurrent_plans_per_identity))
      o = o->next;
    if (!o)
      return;
    coord_plan_op *op = o->head;
    o->head = op->next_queued;
    if (!o->head)
      o->tail = NULL;
    op->queued = false;
    o->running++;
    co->plans_running++;
    owner_unlink(co, o);
    coord_plan_owner **end = &co->plan_owners;
    while (*end)
      end = &(*end)->next;
    *end = o;
    op->req.data = op;
    uv_queue_work(co->loop, &op->req, plan_work, plan_after);
  }
}

/* Takes a queued op off its owner's queue. */
static void plan_unqueue(coord_plan_op *op) {
  coord_plan_owner *o = owner_find(op->co, op->owner, false);
  coord_plan_op **at = o ? &o->head : NULL;
  while (at && *at && *at != op)
    at = &(*at)->next_queued;
  if (!at || !*at)
    return;
  *at = op->next_queued;
  o->tail = NULL;
  for (coord_plan_op *q = o->head; q; q = q->next_queued)
    o->tail = q;
  op->queued = false;
  owner_forget_if_idle(op->co, o);
}

static void plan_left(zb_rpc_call *call, void *arg) {
  (void)call;
  coord_plan_op *op = arg;
  op->call = NULL;
  if (op->queued) { /* not started: it never plans */
    plan_unqueue(op);
    op->cancelled = true;
    op->done(op);
  }
}

/* On a pool thread: touches nothing but the op's spec and plan. */
static void plan_work(uv_work_t *req) {
  coord_plan_op *op = req->data;
  op->err = zb_job_plan(op->spec, op->objective, op->plan, &op->diag);
  if (!op->err && op->then)
    op->then(op);
}

static void plan_after(uv_work_t *req, int status) {
  coord_plan_op *op = req->data;
  coord *co = op->co;
  (void)status; /* dispatched ops are never cancelled (plan_left unqueues them before) */
  coord_plan_owner *o = owner_find(co, op->owner, false);
  if (o) {
    o->running--;
    owner_forget_if_idle(co, o);
  }
  co->plans_running--;
  if (op->call)
    zb_rpc_call_on_close(op->call, NULL, NULL);
  if (op->call && co->stopping) {
    zb_rpc_fail(op->call, GRPC_STATUS_UNAVAILABLE, "the coordinator is shutting down");
    op->call = NULL;
  }
  if (op->call && op->err) {
    zb_rpc_fail(op->call, GRPC_STATUS_INVALID_ARGUMENT, "%sschedule: %s", op->what, op->diag.msg);
    op->call = NULL;
  }
  op->cancelled = co->stopping;
  op->done(op);
  plans_dispatch(co);
}

void coord_plan_off_loop(coord_plan_op *op) {
  coord_plan_owner *o = owner_find(op->co, op->owner, true);
  op->queued = true;
  op->next_queued = NULL;
  if (o->tail)
    o->tail->next_queued = op;
  else
    o->head = op;
  o->tail = op;
  if (op->call)
    zb_rpc_call_on_close(op->call, plan_left, op);
  plans_dispatch(op->co);
}

void coord_plans_drop_queued(coord *co) {
  while (co->plan_owners) {
    coord_plan_owner *o = co->plan_owners;
    while (o->head) {
      coord_plan_op *op = o->head;
      o->head = op->next_queued;
      op->queued = false;
      op->cancelled = true;
      if (op->call)
        zb_rpc_call_on_close(op->call, NULL, NULL);
      op->done(op);
    }
    co->plan_owners = o->next;
    free(o);
  }
}
