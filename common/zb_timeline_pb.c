/* zb_timeline_pb.c — OpTimeline columns (zb_timeline_pb.h). */
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_assignment.h"
#include "zb_timeline_pb.h"

static uint32_t to_us(double s) {
  double us = s * 1e6 + 0.5;
  return us <= 0 ? 0 : us >= 4294967295.0 ? 4294967295u : (uint32_t)us;
}

/* An empty message with room for n rows in every column. */
static Zb__V1__OpTimeline *alloc_cols(size_t n) {
  Zb__V1__OpTimeline *t = zb_malloc(sizeof *t);
  zb__v1__op_timeline__init(t);
  size_t room = n ? n : 1;
  t->kind = zb_malloc(sizeof *t->kind * room);
  t->stage = zb_malloc(sizeof *t->stage * room);
  t->microbatch = zb_malloc(sizeof *t->microbatch * room);
  t->start_us = zb_malloc(sizeof *t->start_us * room);
  t->duration_us = zb_malloc(sizeof *t->duration_us * room);
  t->group_size = zb_malloc(sizeof *t->group_size * room);
  t->n_kind = t->n_stage = t->n_microbatch = t->n_start_us = t->n_duration_us = t->n_group_size = n;
  return t;
}

Zb__V1__OpTimeline *zb_timeline_encode(const zb_tl_op *ops, int n) {
  Zb__V1__OpTimeline *t = alloc_cols(n > 0 ? (size_t)n : 0);
  for (int i = 0; i < n; i++) {
    t->kind[i] = zb_action_kind_of(ops[i].op);
    t->stage[i] = ops[i].stage;
    t->microbatch[i] = ops[i].mb;
    t->start_us[i] = to_us(ops[i].start);
    t->duration_us[i] = to_us(ops[i].end - ops[i].start);
    t->group_size[i] = ops[i].group_size > 0 ? (uint32_t)ops[i].group_size : 0;
  }
  return t;
}

Zb__V1__OpTimeline *zb_timeline_pb_copy(const Zb__V1__OpTimeline *t) {
  if (!t)
    return NULL;
  size_t n = t->n_kind;
  if (t->n_stage < n || t->n_microbatch < n || t->n_start_us < n || t->n_duration_us < n ||
      t->n_group_size < n)
    n = 0; /* ragged: the decoder refuses the original; the copy is empty */
  Zb__V1__OpTimeline *c = alloc_cols(n);
  if (n) {
    memcpy(c->kind, t->kind, sizeof *c->kind * n);
    memcpy(c->stage, t->stage, sizeof *c->stage * n);
    memcpy(c->microbatch, t->microbatch, sizeof *c->microbatch * n);
    memcpy(c->start_us, t->start_us, sizeof *c->start_us * n);
    memcpy(c->duration_us, t->duration_us, sizeof *c->duration_us * n);
    memcpy(c->group_size, t->group_size, sizeof *c->group_size * n);
  }
  return c;
}

void zb_timeline_pb_free(Zb__V1__OpTimeline *t) {
  if (t)
    protobuf_c_message_free_unpacked(&t->base, NULL);
}

zb_err zb_timeline_decode(const Zb__V1__OpTimeline *t, double base, zb_tl_op **ops, int *n, zb_diag *diag) {
  *ops = NULL;
  *n = 0;
  size_t k = t->n_kind;
  if (t->n_stage != k || t->n_microbatch != k || t->n_start_us != k || t->n_duration_us != k ||
      t->n_group_size != k)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "timeline: columns of %zu kinds, %zu stages, %zu microbatches, %zu starts, %zu durations, "
        "%zu group sizes; all must be equal",
        k, t->n_stage, t->n_microbatch, t->n_start_us, t->n_duration_us, t->n_group_size);
  zb_tl_op *out = zb_malloc(sizeof *out * (k ? k : 1));
  for (size_t i = 0; i < k; i++) {
    zb_tl_op *o = &out[i];
    bool known = zb_action_op_of(t->kind[i], &o->op);
    if (!known || zb_op_is_comm(o->op) == (t->group_size[i] == 0)) {
      free(out);
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "timeline.kind[%zu]: %s", i,
                         !known
                             ? "not one of F, B, W, BW, SEND_F, RECV_F, SEND_B, RECV_B, REDUCE_GRAD, "
                               "WAIT_REDUCE_GRAD"
                             : "a compute op or a reduction has no group size, a transport group one of at "
                               "least 1");
    }
    o->stage = t->stage[i];
    o->mb = t->microbatch[i];
    o->group_size = (int)t->group_size[i];
    o->start = base + t->start_us[i] * 1e-6;
    o->end = o->start + t->duration_us[i] * 1e-6;
  }
  *ops = out;
  *n = (int)k;
  return ZB_OK;
}
