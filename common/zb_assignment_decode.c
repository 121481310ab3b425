/* zb_assignment_decode.c — decoding and checking an Assignment, in the
 * current form and the older all-ranks one. See zb_assignment.h. */
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_assignment.h"
#include "zb_format.h"
#include "zb_jobspec_fields.h"
#include "zb_wire.h"

/* Bounds that keep a hostile message from sizing our allocations; the job
 * spec's own limits are far below them. The scalars a worker sizes
 * buffers or loops from are held to the job spec's limits (zb_job_limits)
 * themselves: a coordinator never sends more. */
enum {
  DECODE_MAX_RANKS = ZB_MAX_RANKS,
  DECODE_MAX_STAGES = ZB_MAX_STAGES,
  DECODE_MAX_MICROBATCHES = ZB_MAX_MICROBATCHES
};

/* field's value within the job spec's limit for it. */
static zb_err check_limit(const char *field, long long v, zb_job_key key, zb_diag *diag) {
  const zb_int_limit *l = &zb_job_limits[key];
  if (v < l->min || v > l->max)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.%s: %lld is outside %lld..%lld", field, v,
                       l->min, l->max);
  return ZB_OK;
}

bool zb_action_op_of(Zb__V1__ActionKind k, zb_op *op) {
  switch (k) {
  case ZB__V1__ACTION_KIND__ACTION_KIND_F: *op = ZB_OP_F; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_B: *op = ZB_OP_B; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_W: *op = ZB_OP_W; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_BW: *op = ZB_OP_BW; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_SEND_F: *op = ZB_OP_SEND_F; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_RECV_F: *op = ZB_OP_RECV_F; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_SEND_B: *op = ZB_OP_SEND_B; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_RECV_B: *op = ZB_OP_RECV_B; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_REDUCE_GRAD: *op = ZB_OP_REDUCE_GRAD; return true;
  case ZB__V1__ACTION_KIND__ACTION_KIND_WAIT_REDUCE_GRAD: *op = ZB_OP_WAIT_REDUCE_GRAD; return true;
  default: return false;
  }
}

/* Action i of a decoded list (field names it in messages), checked against
 * the shape: a compute or comm kind, a stage of the plan, a microbatch
 * below m, a peer that is another rank (comm) or none (compute). */
static zb_err check_action(const zb_assignment *a, const zb_action *x, const char *field, size_t i,
                           zb_diag *diag) {
  int S = a->ranks * a->chunks;
  bool comm = zb_op_is_comm(x->op);
  bool reduce = x->op == ZB_OP_REDUCE_GRAD || x->op == ZB_OP_WAIT_REDUCE_GRAD;
  if (!comm && !zb_op_is_compute(x->op) && !reduce)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment.%s[%zu]: %s is not a compute, comm or reduction action", field, i,
                       zb_op_name(x->op));
  if (x->stage < 0 || x->stage >= S)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.%s[%zu]: stage %d is not one of %d", field, i,
                       x->stage, S);
  if (reduce) /* once per iteration: no microbatch, no peer (the stage group is implied) */
    return x->mb == -1 && x->peer == -1
               ? ZB_OK
               : zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                             "assignment.%s[%zu]: %s takes microbatch -1 and peer -1 (got %d, %d)", field, i,
                             zb_op_name(x->op), x->mb, x->peer);
  if (x->mb < 0 || x->mb >= a->microbatches)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.%s[%zu]: microbatch %d is not one of %d", field,
                       i, x->mb, a->microbatches);
  if (comm ? x->peer < 0 || x->peer >= a->ranks || x->peer == a->rank : x->peer != -1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.%s[%zu]: peer %d for %s on rank %d of %d", field,
                       i, x->peer, zb_op_name(x->op), a->rank, a->ranks);
  return ZB_OK;
}

/* Action i of the columns, checked against the shape. */
static zb_err decode_action(const Zb__V1__ActionList *al, size_t i, const zb_assignment *a, zb_action *out,
                            zb_diag *diag) {
  /* each before it narrows to an action's bits */
  if (al->peer[i] < -1 || al->peer[i] >= a->ranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment.action_list[%zu]: peer %d is not one of %d ranks", i, (int)al->peer[i],
                       a->ranks);
  if (al->stage[i] < 0 || al->stage[i] >= a->ranks * a->chunks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.action_list[%zu]: stage %d is not one of %d", i,
                       (int)al->stage[i], a->ranks * a->chunks);
  if (al->microbatch[i] < -1 || al->microbatch[i] >= a->microbatches)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment.action_list[%zu]: microbatch %d is not one of %d", i,
                       (int)al->microbatch[i], a->microbatches);
  zb_action x = {.stage = al->stage[i], .mb = al->microbatch[i], .peer = al->peer[i]};
  zb_op op;
  if (zb_action_op_of(al->kind[i], &op))
    x.op = (uint8_t)op;
  else
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.action_list[%zu]: unknown kind %d", i,
                       (int)al->kind[i]);
  zb_err err = check_action(a, &x, "action_list", i, diag);
  if (err)
    return err;
  if (al->group_with_next[i] && !zb_op_is_comm(x.op))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.action_list[%zu]: a %s cannot open a group", i,
                       zb_op_name(x.op));
  x.batch = al->group_with_next[i];
  *out = x;
  return ZB_OK;
}

static zb_err decode_actions(const Zb__V1__ActionList *al, zb_assignment *a, zb_diag *diag) {
  size_t n = al->n_kind;
  if (al->n_stage != n || al->n_microbatch != n || al->n_peer != n || al->n_group_with_next != n)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment.action_list: columns of unequal length (kind %zu, stage %zu, microbatch "
                       "%zu, peer %zu, group_with_next %zu)",
                       n, al->n_stage, al->n_microbatch, al->n_peer, al->n_group_with_next);
  if (n > (size_t)INT_MAX)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.action_list: %zu actions", n);
  for (size_t i = 0; i < n; i++) {
    zb_action x = {0};
    zb_err err = decode_action(al, i, a, &x, diag);
    if (err)
      return err;
    zb_schedule_push(a->sched, a->rank, x);
  }
  return ZB_OK;
}

/* The older form: PyTorch action strings, peers from the placement. The
 * strings name any kind, stage and microbatch, so each action is checked
 * as a column's is (a comm action whose partner stage is outside the plan
 * has peer -1). */
static zb_err decode_action_strings(const Zb__V1__RankActions *ra, zb_assignment *a, zb_diag *diag) {
  if (ra->rank != a->rank)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.actions.rank: %d, the assignment is rank %d",
                       ra->rank, a->rank);
  zb_err err = zb_wire_rank_actions_parse(ra, a->sched, diag);
  if (err)
    return err;
  zb_format_fill_peers(a->sched);
  const zb_rank_list *l = &a->sched->ranks[a->rank];
  for (int i = 0; i < l->n && !err; i++)
    err = check_action(a, &l->actions[i], "actions", (size_t)i, diag);
  return err;
}

static zb_err decode_peers(const Zb__V1__Assignment *pb, zb_assignment *a, zb_diag *diag) {
  int world = zb_assignment_world(a);
  a->peer_addresses = zb_calloc((size_t)world, sizeof(char *));
  if (pb->n_peers == 0) { /* the older form: by rank */
    for (size_t q = 0; q < pb->n_peer_addresses && q < (size_t)a->ranks; q++)
      a->peer_addresses[q] = zb_strdup(pb->peer_addresses[q] ? pb->peer_addresses[q] : "");
    return ZB_OK;
  }
  for (size_t k = 0; k < pb->n_peers; k++) {
    const Zb__V1__PeerAddress *p = pb->peers[k];
    if (p->rank < 0 || p->rank >= world || a->peer_addresses[p->rank])
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "assignment.peers[%zu]: rank %d is not a rank of %d or repeated", k, p->rank, world);
    a->peer_addresses[p->rank] = zb_strdup(p->address ? p->address : "");
  }
  return ZB_OK;
}

static zb_err decode_stage(zb_costs *c, const Zb__V1__HostedStage *h, size_t k, zb_diag *diag) {
  if (h->stage < 0 || h->stage >= c->n_stages)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.stages[%zu]: stage %d is not one of %d", k,
                       h->stage, c->n_stages);
  int s = h->stage;
  c->t_f[s] = h->t_f;
  c->t_b[s] = h->t_b;
  c->t_w[s] = h->t_w;
  c->m_f[s] = h->m_f;
  c->m_b[s] = h->m_b;
  c->m_w[s] = h->m_w;
  if (!isfinite(h->t_reduce) || h->t_reduce < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.stages[%zu]: t_reduce %g is not a time", k,
                       h->t_reduce);
  c->t_reduce[s] = h->t_reduce;
  return ZB_OK;
}

static zb_err decode_costs(const Zb__V1__Assignment *pb, zb_assignment *a, zb_diag *diag) {
  int S = a->ranks * a->chunks;
  zb_costs *c = a->costs = zb_costs_new(S);
  if (pb->n_stages == 0) { /* the older form: every stage */
    if ((int)pb->n_stage_seconds != S || (int)pb->n_stage_m_f != S || (int)pb->n_stage_m_b != S ||
        (int)pb->n_stage_m_w != S)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "assignment: inconsistent stage tables (%d stages, %d ranks)",
                         (int)pb->n_stage_seconds, a->ranks);
    for (int s = 0; s < S; s++) {
      Zb__V1__HostedStage h = {.stage = s,
                               .t_f = pb->stage_seconds[s]->t_f,
                               .t_b = pb->stage_seconds[s]->t_b,
                               .t_w = pb->stage_seconds[s]->t_w,
                               .m_f = pb->stage_m_f[s],
                               .m_b = pb->stage_m_b[s],
                               .m_w = pb->stage_m_w[s]};
      decode_stage(c, &h, (size_t)s, NULL);
    }
    return ZB_OK;
  }
  for (size_t k = 0; k < pb->n_stages; k++) {
    zb_err err = decode_stage(c, pb->stages[k], k, diag);
    if (err)
      return err;
  }
  return ZB_OK;
}

/* The GEMM precision: "" (a coordinator older than the field) is fp32. */
static zb_err decode_precision(const Zb__V1__Assignment *pb, zb_assignment *a, zb_diag *diag) {
  static const char *const names[] = {ZB_PRECISION_FP32_NAME, "tf32", "bf16"};
  const char *p = pb->precision && pb->precision[0] ? pb->precision : ZB_PRECISION_FP32_NAME;
  for (size_t k = 0; k < sizeof names / sizeof names[0]; k++)
    if (strcmp(p, names[k]) == 0) {
      snprintf(a->precision, sizeof a->precision, "%s", names[k]);
      return ZB_OK;
    }
  return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.precision: '%.16s' is not fp32, tf32 or bf16", p);
}

/* The scalars and the shape. */
static zb_err decode_header(const Zb__V1__Assignment *pb, zb_assignment *a, zb_diag *diag) {
  zb_err err;
  if ((err = zb_wire_copy_str(a->job_id, sizeof a->job_id, pb->job_id, "assignment.job_id", diag)) ||
      (err = zb_wire_copy_str(a->schedule, sizeof a->schedule, pb->schedule, "assignment.schedule", diag)) ||
      (err = zb_wire_copy_str(a->backend, sizeof a->backend, pb->backend, "assignment.backend", diag)) ||
      (err =
           zb_wire_copy_str(a->transport, sizeof a->transport, pb->transport, "assignment.transport", diag)))
    return err;
  if ((err = zb_family_parse(a->schedule, &a->family, diag)))
    return err;
  if ((err = decode_precision(pb, a, diag)))
    return err;
  a->rank = pb->rank;
  a->ranks = pb->ranks;
  /* the older form has no chunks: its stage table covers every stage */
  a->chunks = pb->chunks > 0 || pb->ranks < 1 ? pb->chunks : (int)(pb->n_stage_seconds / (size_t)pb->ranks);
  a->microbatches = pb->microbatches;
  a->plan_version = pb->plan_version;
  a->first_iteration = pb->first_iteration;
  a->iterations = pb->iterations;
  a->bytes_per_activation = pb->bytes_per_activation;
  a->trace_every = pb->trace_every > 0 ? pb->trace_every : 0;
  a->transfer_timeout_s = pb->transfer_timeout_s > 0 ? pb->transfer_timeout_s : ZB_TRANSFER_TIMEOUT_DEFAULT_S;
  if (pb->data_secret.len != 0 && pb->data_secret.len != ZB_DATA_SECRET_BYTES)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.data_secret: %zu bytes, not %d",
                       pb->data_secret.len, ZB_DATA_SECRET_BYTES);
  a->has_data_secret = pb->data_secret.len == ZB_DATA_SECRET_BYTES;
  if (a->has_data_secret)
    memcpy(a->data_secret, pb->data_secret.data, ZB_DATA_SECRET_BYTES);
  if (a->ranks < 1 || a->ranks > DECODE_MAX_RANKS || a->rank < 0 || a->rank >= a->ranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.rank: rank %d of %d ranks", a->rank, a->ranks);
  if (a->chunks < 1 || (long long)a->chunks * a->ranks > DECODE_MAX_STAGES)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.chunks: %d chunks of %d ranks", a->chunks,
                       a->ranks);
  if (a->microbatches < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment.microbatches: %d (the coordinator is older than this worker?)",
                       a->microbatches);
  if (a->microbatches > DECODE_MAX_MICROBATCHES)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.microbatches: %d, more than %d", a->microbatches,
                       DECODE_MAX_MICROBATCHES);
  if ((err = check_limit("iterations", a->iterations, ZB_JK_ITERATIONS, diag)) ||
      (err = check_limit("bytes_per_activation", a->bytes_per_activation, ZB_JK_BYTES, diag)) ||
      (err = check_limit("trace_every", a->trace_every, ZB_JK_TRACE_EVERY, diag)) ||
      (err = check_limit("transfer_timeout_s", a->transfer_timeout_s, ZB_JK_TRANSFER_TIMEOUT, diag)))
    return err;
  if (a->first_iteration < 0 || a->first_iteration > a->iterations)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.first_iteration: %d, not in 0..%d (iterations)",
                       a->first_iteration, a->iterations);
  return ZB_OK;
}

static zb_err decode_model(const Zb__V1__Assignment *pb, zb_assignment *a, zb_diag *diag) {
  zb_job_spec defaults;
  zb_job_spec_default(&defaults);
  a->model = defaults.model;
  if (!pb->model)
    return ZB_OK;
  a->has_model = true;
  zb_err err = zb_wire_model_from_pb(pb->model, &a->model, diag);
  /* the worker sizes the model's tensors and buffers from these */
  return err ? err : zb_model_spec_check_sizes(&a->model, "assignment.", diag);
}

/* replica, data_parallel, zero: 0s from an older coordinator read as
 * replica 0 of 1; d x ranks within the rank limit. */
static zb_err decode_dp(const Zb__V1__Assignment *pb, zb_assignment *a, zb_diag *diag) {
  a->data_parallel = pb->data_parallel > 0 ? pb->data_parallel : 1;
  a->replica = pb->replica;
  a->zero = pb->zero;
  if ((long long)a->data_parallel * a->ranks > DECODE_MAX_RANKS)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.data_parallel: %d replicas of %d ranks, over %d",
                       a->data_parallel, a->ranks, DECODE_MAX_RANKS);
  if (a->replica < 0 || a->replica >= a->data_parallel)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.replica: %d of %d replicas", a->replica,
                       a->data_parallel);
  if (a->zero != 0 && a->zero != 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.zero: %d, not 0 or 1", a->zero);
  return ZB_OK;
}

int zb_assignment_world(const zb_assignment *a) {
  return (a->data_parallel > 0 ? a->data_parallel : 1) * a->ranks;
}

int zb_assignment_global(const zb_assignment *a) {
  return a->replica * a->ranks + a->rank;
}

zb_err zb_assignment_decode(const Zb__V1__Assignment *pb, zb_assignment *out, zb_diag *diag) {
  memset(out, 0, sizeof *out);
  zb_err err = decode_header(pb, out, diag);
  if (!err)
    err = decode_dp(pb, out, diag);
  if (err)
    return err;
  out->sched = zb_schedule_new(out->ranks, out->chunks, out->microbatches, zb_family_placement(out->family));
  if (pb->action_list)
    err = decode_actions(pb->action_list, out, diag);
  else if (pb->actions)
    err = decode_action_strings(pb->actions, out, diag);
  else
    err = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment.action_list: required");
  if (!err)
    err = decode_peers(pb, out, diag);
  if (!err)
    err = decode_costs(pb, out, diag);
  if (!err)
    err = decode_model(pb, out, diag);
  return err;
}

void zb_assignment_free(zb_assignment *a) {
  zb_schedule_free(a->sched);
  zb_costs_free(a->costs);
  if (a->peer_addresses)
    for (int q = 0; q < zb_assignment_world(a); q++)
      free(a->peer_addresses[q]);
  free(a->peer_addresses);
  memset(a, 0, sizeof *a);
}

const char *zb_assignment_peer(const zb_assignment *a, int q) {
  return q >= 0 && q < zb_assignment_world(a) && a->peer_addresses ? a->peer_addresses[q] : NULL;
}
