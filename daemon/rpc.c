/* rpc.c — the coordinator's RPC table: every method it serves and its
 * handler (in jobs, admission, dispatch, workers and reports), and the
 * gRPC health check. */
#include <string.h>

#include "coordinator.h"
#include "grpc/health/v1/health.pb-c.h"
#include "zb_methods.h"

static void on_health(zb_rpc_call *call, const ProtobufCMessage *m, void *user) {
  coord *co = user;
  const Grpc__Health__V1__HealthCheckRequest *req = (const void *)m;
  /* "zb.v1.Zb.tls" is SERVING only with mutual TLS on: monitoring can
   * tell an insecure coordinator (docs/operations.md, Security) */
  bool tls_probe = req->service && !strcmp(req->service, "zb.v1.Zb.tls");
  if (req->service && req->service[0] && strcmp(req->service, "zb.v1.Zb") != 0 && !tls_probe) {
    zb_rpc_fail(call, GRPC_STATUS_NOT_FOUND, "service: unknown service '%s'", req->service);
    return;
  }
  Grpc__Health__V1__HealthCheckResponse resp = GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__INIT;
  bool up = !co->stopping && !co->store_failing && (!tls_probe || co->tls);
  resp.status = up ? GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__SERVING
                   : GRPC__HEALTH__V1__HEALTH_CHECK_RESPONSE__SERVING_STATUS__NOT_SERVING;
  zb_rpc_reply(call, &resp.base);
}

const zb_rpc_method coord_methods[] = {
    {ZB_METHOD_SUBMIT_JOB, &zb__v1__submit_job_request__descriptor, on_submit, false, true},
    {ZB_METHOD_GET_JOB, &zb__v1__get_job_request__descriptor, on_get_job, false, false},
    {ZB_METHOD_LIST_JOBS, &zb__v1__list_jobs_request__descriptor, on_list_jobs, false, false},
    {ZB_METHOD_CANCEL_JOB, &zb__v1__cancel_job_request__descriptor, on_cancel, false, false},
    {ZB_METHOD_WATCH_JOB, &zb__v1__watch_job_request__descriptor, on_watch, true, false},
    {ZB_METHOD_UPDATE_SCHEDULE, &zb__v1__update_schedule_request__descriptor, on_update_schedule, false,
     true},
    {ZB_METHOD_LIST_WORKERS, &zb__v1__list_workers_request__descriptor, on_list_workers, false, false},
    {ZB_METHOD_PLAN, &zb__v1__plan_request__descriptor, on_plan, false, true},
    {ZB_METHOD_GET_ITERATION, &zb__v1__get_iteration_request__descriptor, on_get_iteration, false, false},
    {ZB_METHOD_ATTACH, &zb__v1__attach_request__descriptor, on_attach, true, false},
    {ZB_METHOD_REPORT, &zb__v1__report_request__descriptor, on_report, false, false},
    {ZB_METHOD_HEALTH_CHECK, &grpc__health__v1__health_check_request__descriptor, on_health, false, false},
};

const int coord_n_methods = sizeof coord_methods / sizeof coord_methods[0];
