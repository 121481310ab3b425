/* zb_wire.h — the thin layer between protobuf (zb.v1) and libzb, so lib/
 * never sees protobuf types: job specs in both directions and plans as
 * PlanResponse. (Assignments have their own codec, zb_assignment.h.)
 *
 * Ownership: a Zb__V1__JobSpec filled by
 * zb_wire_spec_to_pb points into the zb_job_spec it came from (strings)
 * and owns only its costs, stage_costs and model messages: release those
 * with zb_wire_spec_pb_clear() before the zb_job_spec goes away.
 */
#ifndef ZB_WIRE_H
#define ZB_WIRE_H

#include "zb/v1/zb.pb-c.h"
#include "zb_job_state.h"
#include "zb_jobspec.h"
#include "zb_planner.h"

/* Copies a proto string (NULL: "") into a fixed field of cap bytes;
 * ZB_ERR_INVALID_ARG naming field when it does not fit. */
zb_err zb_wire_copy_str(char *dst, size_t cap, const char *src, const char *field, zb_diag *diag);

/* Proto → spec, with the wire's zero-means-default rules (JobSpec in
 * zb.proto) applied; then zb_job_spec_check(). diag names the field. */
zb_err zb_wire_spec_from_pb(const Zb__V1__JobSpec *pb, zb_job_spec *out, zb_diag *diag);
/* ModelSpec → the model of a spec, over the values *out already holds
 * (the defaults): a zero or absent field keeps them (zb.proto). Checks
 * nothing but what cannot be held (a seed past LLONG_MAX, a path too
 * long); zb_job_spec_check does the rest. */
zb_err zb_wire_model_from_pb(const Zb__V1__ModelSpec *pb, zb_model_spec *out, zb_diag *diag);
/* The model → *pb with every field set; pb's strings point into m and its
 * weight_decay, beta1 and beta2 at dv[0..2], which the caller provides.
 * Nothing is allocated. */
/* The messages a ModelSpec points into; m first, so a block allocated as
 * one is freed by its ModelSpec's address. */
typedef struct zb_wire_model_pb {
  Zb__V1__ModelSpec m;
  Zb__V1__DoubleValue dv[4];
  Zb__V1__NanInjection nan;
} zb_wire_model_pb;
void zb_wire_model_to_pb(const zb_model_spec *m, zb_wire_model_pb *out);
/* Spec → proto (see ownership above). A cpu or cuda job's model is always
 * sent, resolved. */
void zb_wire_spec_to_pb(const zb_job_spec *spec, Zb__V1__JobSpec *pb);
void zb_wire_spec_pb_clear(Zb__V1__JobSpec *pb);

/* Fills resp from plan (actions as PyTorch strings per rank, and with
 * action_lists the structured lists with their transport groups); the
 * strings and arrays are allocated and freed by
 * zb_wire_plan_response_clear(). */
void zb_wire_plan_response(const zb_planner_result *plan, bool action_lists, Zb__V1__PlanResponse *resp);
void zb_wire_plan_response_clear(Zb__V1__PlanResponse *resp);

/* Rank r's action strings, into an allocated RankActions (free with
 * zb_wire_rank_actions_clear). */
void zb_wire_rank_actions(const zb_schedule *s, int r, Zb__V1__RankActions *out);
void zb_wire_rank_actions_clear(Zb__V1__RankActions *ra);

/* Parses a RankActions back into rank r's list of a schedule of shape (p,
 * v, m, placement) with peers filled; ZB_ERR_PARSE names the bad action. */
zb_err zb_wire_rank_actions_parse(const Zb__V1__RankActions *ra, zb_schedule *s, zb_diag *diag);

#endif
