/* fuzz_proto_messages.h — the messages fuzz_proto unpacks, in the order
 * that names them: an input's first byte (modulo the count) picks one, so
 * the seed maker (fuzz_proto_seeds.c) and the harness must agree on it.
 * Every message a process of ours unpacks is here: what the coordinator
 * receives (the requests, and JobSpec, IterationMetrics and LearnedCosts
 * back from its store), what zb-worker receives (Command, ReportResponse)
 * and what zbctl receives (the responses); the column messages and the
 * Assignment also on their own. Submessages come with their parents.
 * Append only: a reordering renames the seeds.
 */
#ifndef ZB_FUZZ_PROTO_MESSAGES_H
#define ZB_FUZZ_PROTO_MESSAGES_H

#include "grpc/health/v1/health.pb-c.h"
#include "zb/v1/zb.pb-c.h"

#define FUZZ_PROTO_MESSAGES(X)                                                                               \
  X(zb__v1__job_spec__descriptor)                                                                            \
  X(zb__v1__submit_job_request__descriptor)                                                                  \
  X(zb__v1__plan_request__descriptor)                                                                        \
  X(zb__v1__assignment__descriptor)                                                                          \
  X(zb__v1__command__descriptor)                                                                             \
  X(zb__v1__report_request__descriptor)                                                                      \
  X(zb__v1__iteration_metrics__descriptor)                                                                   \
  X(zb__v1__job__descriptor)                                                                                 \
  X(zb__v1__job_event__descriptor)                                                                           \
  X(zb__v1__attach_request__descriptor)                                                                      \
  X(zb__v1__update_schedule_request__descriptor)                                                             \
  X(zb__v1__get_job_request__descriptor)                                                                     \
  X(zb__v1__list_jobs_request__descriptor)                                                                   \
  X(zb__v1__cancel_job_request__descriptor)                                                                  \
  X(zb__v1__watch_job_request__descriptor)                                                                   \
  X(zb__v1__list_workers_request__descriptor)                                                                \
  X(zb__v1__get_iteration_request__descriptor)                                                               \
  X(grpc__health__v1__health_check_request__descriptor)                                                      \
  X(zb__v1__report_response__descriptor)                                                                     \
  X(zb__v1__nccl_id__descriptor)                                                                             \
  X(zb__v1__learned_costs__descriptor)                                                                       \
  X(zb__v1__submit_job_response__descriptor)                                                                 \
  X(zb__v1__list_jobs_response__descriptor)                                                                  \
  X(zb__v1__update_schedule_response__descriptor)                                                            \
  X(zb__v1__plan_response__descriptor)                                                                       \
  X(zb__v1__list_workers_response__descriptor)                                                               \
  X(grpc__health__v1__health_check_response__descriptor)                                                     \
  X(zb__v1__op_timeline__descriptor)                                                                         \
  X(zb__v1__action_list__descriptor)                                                                         \
  X(zb__v1__rank_actions__descriptor)

#define FUZZ_PROTO_ADDRESS(d) &d,
static const ProtobufCMessageDescriptor *const fuzz_proto_messages[] = {
    FUZZ_PROTO_MESSAGES(FUZZ_PROTO_ADDRESS)};
#undef FUZZ_PROTO_ADDRESS
#define FUZZ_PROTO_COUNT ((int)(sizeof fuzz_proto_messages / sizeof fuzz_proto_messages[0]))

/* The selector byte of d's seeds; -1 when d is not listed. */
static inline int fuzz_proto_index(const ProtobufCMessageDescriptor *d) {
  for (int k = 0; k < FUZZ_PROTO_COUNT; k++)
    if (fuzz_proto_messages[k] == d)
      return k;
  return -1;
}

#endif
