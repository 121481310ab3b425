/* zb_reduce.c — see zb_reduce.h. */
#include "zb_reduce.h"

#include <stdlib.h>

#include "zb_alloc.h"

bool zb_costs_reduces(const zb_costs *c) {
  if (!c || !c->t_reduce)
    return false;
  for (int s = 0; s < c->n_stages; s++)
    if (c->t_reduce[s] > 0)
      return true;
  return false;
}

static bool reduce_op(zb_op op) {
  return op == ZB_OP_REDUCE_GRAD || op == ZB_OP_WAIT_REDUCE_GRAD;
}

bool zb_schedule_has_reduce(const zb_schedule *s) {
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (reduce_op((zb_op)s->ranks[r].actions[i].op))
        return true;
  return false;
}

void zb_reduce_strip(zb_schedule *s) {
  for (int r = 0; r < s->p; r++) {
    zb_rank_list *l = &s->ranks[r];
    int k = 0;
    for (int i = 0; i < l->n; i++)
      if (!reduce_op((zb_op)l->actions[i].op))
        l->actions[k++] = l->actions[i];
    l->n = k;
  }
}

static zb_action reduce_action(zb_op op, int stage) {
  return (zb_action){.op = (uint8_t)op, .stage = stage, .mb = -1, .peer = -1};
}

/* Rank r's list with its reductions: last[k] is the index of the last W
 * or BW of the rank's k-th stage (stages[k]), -1 when it has none. */
static void reduce_rank(zb_rank_list *l, const int *stages, const int *last, int nst, zb_reduce_at at) {
  zb_action *out = zb_malloc(sizeof *out * (size_t)(l->n + nst + 1));
  int n = 0, tail = 0, *order = zb_malloc(sizeof(int) * (size_t)(nst + 1));
  for (int i = 0; i < l->n; i++) {
    out[n++] = l->actions[i];
    for (int k = 0; k < nst; k++)
      if (last[k] == i) {
        if (at == ZB_REDUCE_EARLIEST)
          out[n++] = reduce_action(ZB_OP_REDUCE_GRAD, stages[k]);
        else
          order[tail++] = stages[k];
      }
  }
  for (int k = 0; k < nst; k++)
    if (last[k] < 0) /* no W of its own: reduced at the end */
      order[tail++] = stages[k];
  for (int k = 0; k < tail; k++)
    out[n++] = reduce_action(ZB_OP_REDUCE_GRAD, order[k]);
  int final = -1; /* the stage of the last REDUCE_GRAD: what the wait names */
  for (int i = n - 1; i >= 0 && final < 0; i--)
    if (out[i].op == ZB_OP_REDUCE_GRAD)
      final = out[i].stage;
  if (final >= 0)
    out[n++] = reduce_action(ZB_OP_WAIT_REDUCE_GRAD, final);
  if (!l->in_block)
    free(l->actions);
  *l = (zb_rank_list){.actions = out, .n = n, .cap = l->n + nst + 1, .in_block = false};
  free(order);
}

void zb_reduce_insert(zb_schedule *s, zb_reduce_at at) {
  zb_reduce_strip(s);
  int S = zb_schedule_stages(s);
  int *stages = zb_malloc(sizeof(int) * (size_t)S), *last = zb_malloc(sizeof(int) * (size_t)S);
  for (int r = 0; r < s->p; r++) {
    int nst = 0;
    for (int st = 0; st < S; st++)
      if (zb_stage_rank(s, st) == r)
        stages[nst++] = st;
    const zb_rank_list *l = &s->ranks[r];
    for (int k = 0; k < nst; k++) {
      last[k] = -1;
      for (int i = l->n - 1; i >= 0 && last[k] < 0; i--) {
        const zb_action *a = &l->actions[i];
        if ((a->op == ZB_OP_W || a->op == ZB_OP_BW) && a->stage == stages[k])
          last[k] = i;
      }
    }
    reduce_rank(&s->ranks[r], stages, last, nst, at);
  }
  free(stages);
  free(last);
}
