/* plan_async.c — plans made on libuv's thread pool for SubmitJob,
 * UpdateSchedule and Plan, so that heartbeats, Reports and health checks
 * are answered while a large plan is computed (docs/operations.md,
 * max_plan_ops). A client that leaves before its plan starts cancels it;
 * one that leaves during it gets nothing, and its op ends quietly. */
#include "coordinator.h"

static void plan_left(zb_rpc_call *call, void *arg) {
  (void)call;
  coord_plan_op *op = arg;
  op->call = NULL;
  uv_cancel((uv_req_t *)&op->req); /* not started yet: it never plans */
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
  if (op->call)
    zb_rpc_call_on_close(op->call, NULL, NULL);
  if (status != 0)
    op->call = NULL; /* cancelled: the client had left */
  if (op->call && op->co->stopping) {
    zb_rpc_fail(op->call, GRPC_STATUS_UNAVAILABLE, "the coordinator is shutting down");
    op->call = NULL;
  }
  if (op->call && op->err) {
    zb_rpc_fail(op->call, GRPC_STATUS_INVALID_ARGUMENT, "%sschedule: %s", op->what, op->diag.msg);
    op->call = NULL;
  }
  op->done(op);
}

void coord_plan_off_loop(coord_plan_op *op) {
  op->req.data = op;
  zb_rpc_call_on_close(op->call, plan_left, op);
  uv_queue_work(op->co->loop, &op->req, plan_work, plan_after);
}
