#include "zb_lower.h"

#include <math.h>
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_sim.h"

/* A pending transfer: the output of a producer op that another rank needs. */
typedef struct lower_xfer {
  double at; /* producer end */
  long seq;  /* emission order, for deterministic ties */
  zb_action send, recv;
  int from, to;
} lower_xfer;

typedef struct xfer_heap {
  lower_xfer *a;
  int n, cap;
} xfer_heap;

static bool xfer_less(const lower_xfer *x, const lower_xfer *y) {
  return x->at < y->at || (x->at == y->at && x->seq < y->seq);
}

static void xfer_push(xfer_heap *h, lower_xfer x) {
  if (h->n == h->cap) {
    h->cap = h->cap ? h->cap * 2 : 64;
    h->a = zb_realloc(h->a, sizeof *h->a * (size_t)h->cap);
  }
  int i = h->n++;
  h->a[i] = x;
  while (i > 0 && xfer_less(&h->a[i], &h->a[(i - 1) / 2])) {
    lower_xfer t = h->a[i];
    h->a[i] = h->a[(i - 1) / 2];
    h->a[(i - 1) / 2] = t;
    i = (i - 1) / 2;
  }
}

static lower_xfer xfer_pop(xfer_heap *h) {
  lower_xfer top = h->a[0];
  h->a[0] = h->a[--h->n];
  int i = 0;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->n && xfer_less(&h->a[l], &h->a[m]))
      m = l;
    if (r < h->n && xfer_less(&h->a[r], &h->a[m]))
      m = r;
    if (m == i)
      break;
    lower_xfer t = h->a[i];
    h->a[i] = h->a[m];
    h->a[m] = t;
    i = m;
  }
  return top;
}

/* Whether the remote inputs of compute action a on rank r were emitted. */
static bool lower_inputs_ready(const zb_schedule *s, const unsigned char *f_sent, const unsigned char *b_sent,
                               int r, const zb_action *a) {
  int S = zb_schedule_stages(s);
  if (a->op == ZB_OP_F && a->stage > 0 && zb_stage_rank(s, a->stage - 1) != r)
    return f_sent[(size_t)(a->stage - 1) * s->m + a->mb];
  if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage < S - 1 && zb_stage_rank(s, a->stage + 1) != r)
    return b_sent[(size_t)(a->stage + 1) * s->m + a->mb];
  return true;
}

zb_err zb_lower(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag) {
  if (zb_schedule_has_comm(s))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "schedule is already lowered (it has SEND/RECV actions)");
  zb_costs *unit = NULL;
  if (!c) {
    zb_rank_costs rc = zb_rank_costs_default();
    c = unit = zb_costs_from_rank_share(s->p, s->v, &rc, 0);
  }
  zb_sim_result *sim = NULL;
  zb_err err = zb_simulate(s, c, &sim, diag);
  if (err) {
    zb_costs_free(unit);
    return err;
  }
  int p = s->p, S = zb_schedule_stages(s);
  size_t cells = (size_t)S * (size_t)s->m;
  unsigned char *f_sent = zb_calloc(cells, 1), *b_sent = zb_calloc(cells, 1);
  int *pos = zb_calloc((size_t)p, sizeof(int));
  xfer_heap h = {0};
  long seq = 0;
  zb_schedule *o = zb_schedule_new(p, s->v, s->m, s->placement);

  for (;;) {
    int best = -1;
    double best_t = INFINITY;
    for (int r = 0; r < p; r++) {
      if (pos[r] >= s->ranks[r].n)
        continue;
      const zb_action *a = &s->ranks[r].actions[pos[r]];
      double t = sim->start[r][pos[r]];
      if (t < best_t && lower_inputs_ready(s, f_sent, b_sent, r, a)) {
        best = r;
        best_t = t;
      }
    }
    if (h.n > 0 && (best < 0 || h.a[0].at <= best_t)) {
      lower_xfer x = xfer_pop(&h);
      zb_schedule_push(o, x.from, x.send);
      zb_schedule_push(o, x.to, x.recv);
      if (x.send.op == ZB_OP_SEND_F)
        f_sent[(size_t)x.send.stage * s->m + x.send.mb] = 1;
      else
        b_sent[(size_t)x.send.stage * s->m + x.send.mb] = 1;
      continue;
    }
    if (best < 0)
      break;
    const zb_action *a = &s->ranks[best].actions[pos[best]];
    double end = sim->end[best][pos[best]];
    pos[best]++;
    zb_schedule_push(o, best, *a);
    if (a->op == ZB_OP_F && a->stage + 1 < S && zb_stage_rank(s, a->stage + 1) != best) {
      int to = zb_stage_rank(s, a->stage + 1);
      lower_xfer x = {.at = end, .seq = seq++, .from = best, .to = to};
      x.send = (zb_action){.op = ZB_OP_SEND_F, .stage = a->stage, .mb = a->mb, .peer = to};
      x.recv = (zb_action){.op = ZB_OP_RECV_F, .stage = a->stage + 1, .mb = a->mb, .peer = best};
      xfer_push(&h, x);
    } else if ((a->op == ZB_OP_B || a->op == ZB_OP_BW) && a->stage > 0 &&
               zb_stage_rank(s, a->stage - 1) != best) {
      int to = zb_stage_rank(s, a->stage - 1);
      lower_xfer x = {.at = end, .seq = seq++, .from = best, .to = to};
      x.send = (zb_action){.op = ZB_OP_SEND_B, .stage = a->stage, .mb = a->mb, .peer = to};
      x.recv = (zb_action){.op = ZB_OP_RECV_B, .stage = a->stage - 1, .mb = a->mb, .peer = best};
      xfer_push(&h, x);
    }
  }
  for (int r = 0; r < p; r++)
    if (pos[r] < s->ranks[r].n) {
      err = zb_diag_set(diag, ZB_ERR_DEADLOCK, "lowering stuck at rank %d action %d", r, pos[r]);
      zb_schedule_free(o);
      o = NULL;
      break;
    }
  if (o) /* comm actions that follow each other are posted as one group */
    for (int r = 0; r < p; r++) {
      zb_rank_list *l = &o->ranks[r];
      for (int i = 0; i + 1 < l->n; i++)
        l->actions[i].batch = zb_op_is_comm(l->actions[i].op) && zb_op_is_comm(l->actions[i + 1].op);
    }
  free(h.a);
  free(pos);
  free(f_sent);
  free(b_sent);
  zb_sim_result_free(sim);
  zb_costs_free(unit);
  *out = o;
  return err;
}
