/* zb_validate_reduce.c — the validator's rules for the gradient reduction
 * (zb_reduce.h; docs/schedules.md, Gradient reduction). Lists without
 * any reduction action pass (one replica: nothing to reduce). Lists with
 * one must reduce every stage exactly once, on the rank that hosts it,
 * after every W (or BW) of that stage there, and wait for every
 * reduction before the step: a WAIT_REDUCE_GRAD after each REDUCE_GRAD
 * of its rank, naming a stage whose REDUCE_GRAD came before it (zb puts
 * one wait last, naming the last stage reduced; PyTorch one after each). */
#include "zb_validate_internal.h"

/* Notes a violation of kind k unless one was noted already. */
#define NOTE(x, k, r, i, a, ...)                                                                             \
  do {                                                                                                       \
    if ((x)->first[k].kind == ZB_VIOL_NONE)                                                                  \
      zb_validate_violation(&(x)->first[k], k, r, i, a, __VA_ARGS__);                                        \
  } while (0)

void zb_validate_reduce_rank_begin(vctx *x) {
  x->last_reduce = x->last_reduce_stage = x->last_wait = -1;
}

void zb_validate_reduce_action(vctx *x, int r, int i, const zb_action *a) {
  x->any_reduce = true;
  int st = a->stage; /* in range and on this rank: the scan checked both */
  if (a->op == ZB_OP_WAIT_REDUCE_GRAD) {
    if (x->reduce_at[st] < 0 || x->stage_rank[st] != r)
      NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a,
           "waits for the reduction of stage %d, but no REDUCE_GRAD of stage %d comes before it on rank %d",
           st, st, r);
    x->last_wait = i;
    return;
  }
  if (x->reduce_at[st] >= 0) {
    NOTE(x, ZB_VIOL_DUPLICATE, r, i, a, "REDUCE_GRAD of stage %d appears more than once (first at index %d)",
         st, x->reduce_at[st]);
    return;
  }
  x->reduce_at[st] = i;
  x->last_reduce = i;
  x->last_reduce_stage = st;
}

void zb_validate_reduce_weight(vctx *x, int r, int i, const zb_action *a) {
  int at = x->reduce_at[a->stage];
  if (at >= 0 && x->stage_rank[a->stage] == r)
    NOTE(x, ZB_VIOL_DEPENDENCY, r, i, a,
         "runs after REDUCE_GRAD of stage %d (index %d), which would reduce without its gradient", a->stage,
         at);
}

void zb_validate_reduce_rank_end(vctx *x, int r) {
  if (x->last_reduce >= 0 && x->last_wait < x->last_reduce) {
    zb_action a = {.op = ZB_OP_REDUCE_GRAD, .stage = x->last_reduce_stage, .mb = -1, .peer = -1};
    NOTE(x, ZB_VIOL_DEPENDENCY, r, x->last_reduce, &a,
         "REDUCE_GRAD of stage %d is never waited for: no WAIT_REDUCE_GRAD after it on rank %d",
         x->last_reduce_stage, r);
  }
}

zb_err zb_validate_reduce_missing(const vctx *x, zb_violation *out) {
  if (!x->any_reduce)
    return ZB_OK;
  for (int st = 0; st < x->S; st++)
    if (x->reduce_at[st] < 0) {
      zb_action a = {.op = ZB_OP_REDUCE_GRAD, .stage = st, .mb = -1, .peer = -1};
      return zb_validate_violation(
          out, ZB_VIOL_MISSING, x->stage_rank[st], -1, &a,
          "REDUCE_GRAD of stage %d never runs on rank %d (the lists reduce other stages)", st,
          x->stage_rank[st]);
    }
  return ZB_OK;
}
