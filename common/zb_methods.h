/* zb_methods.h — the gRPC method paths of zb.v1.Zb (proto/zb/v1/zb.proto)
 * and the health service, written once. The coordinator's RPC table
 * (daemon/rpc.c), zbctl, zb-worker and the benchmarks name methods by
 * these, so a renamed method is one edit and a typo a compile error. */
#ifndef ZB_METHODS_H
#define ZB_METHODS_H

#define ZB_METHOD_PREFIX "/zb.v1.Zb/"
#define ZB_METHOD_SUBMIT_JOB ZB_METHOD_PREFIX "SubmitJob"
#define ZB_METHOD_GET_JOB ZB_METHOD_PREFIX "GetJob"
#define ZB_METHOD_LIST_JOBS ZB_METHOD_PREFIX "ListJobs"
#define ZB_METHOD_CANCEL_JOB ZB_METHOD_PREFIX "CancelJob"
#define ZB_METHOD_WATCH_JOB ZB_METHOD_PREFIX "WatchJob"
#define ZB_METHOD_UPDATE_SCHEDULE ZB_METHOD_PREFIX "UpdateSchedule"
#define ZB_METHOD_LIST_WORKERS ZB_METHOD_PREFIX "ListWorkers"
#define ZB_METHOD_PLAN ZB_METHOD_PREFIX "Plan"
#define ZB_METHOD_GET_ITERATION ZB_METHOD_PREFIX "GetIteration"
#define ZB_METHOD_ATTACH ZB_METHOD_PREFIX "Attach"
#define ZB_METHOD_REPORT ZB_METHOD_PREFIX "Report"
#define ZB_METHOD_HEALTH_CHECK "/grpc.health.v1.Health/Check"

#endif
