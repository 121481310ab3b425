#include "zb_schedule.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

zb_schedule *zb_schedule_new(int p, int v, int m, zb_placement placement) {
  if (p <= 0 || v <= 0 || m <= 0 || p > ZB_MAX_RANKS || v > ZB_MAX_STAGES / p || m > ZB_MAX_MICROBATCHES)
    return NULL;
  zb_schedule *s = zb_calloc(1, sizeof *s);
  s->p = p;
  s->v = v;
  s->m = m;
  s->placement = placement;
  s->ranks = zb_calloc((size_t)p, sizeof *s->ranks);
  return s;
}

zb_schedule *zb_schedule_new_room(int p, int v, int m, zb_placement placement, int per_mb) {
  zb_schedule *s = zb_schedule_new(p, v, m, placement);
  if (!s)
    return NULL;
  long long room = (long long)per_mb * m; /* past an int, push grows the lists as it must */
  int *n = zb_malloc(sizeof(int) * (size_t)p);
  for (int r = 0; r < p; r++)
    n[r] = room > INT_MAX ? INT_MAX : (int)room;
  zb_schedule_reserve_all(s, n);
  free(n);
  return s;
}

void zb_schedule_free(zb_schedule *s) {
  if (!s)
    return;
  for (int r = 0; r < s->p; r++)
    if (!s->ranks[r].in_block)
      free(s->ranks[r].actions);
  free(s->block);
  free(s->ranks);
  free(s);
}

zb_schedule *zb_schedule_clone(const zb_schedule *s) {
  zb_schedule *c = zb_schedule_new(s->p, s->v, s->m, s->placement);
  int *n = zb_malloc(sizeof(int) * (size_t)s->p);
  for (int r = 0; r < s->p; r++)
    n[r] = s->ranks[r].n;
  zb_schedule_reserve_all(c, n);
  for (int r = 0; r < s->p; r++) {
    c->ranks[r].n = n[r];
    if (n[r])
      memcpy(c->ranks[r].actions, s->ranks[r].actions, sizeof *s->ranks[r].actions * (size_t)n[r]);
  }
  free(n);
  return c;
}

/* Rank list l's room to cap actions (at least its n). */
static void schedule_resize(zb_rank_list *l, int cap) {
  l->cap = cap;
  if (!l->in_block) {
    l->actions = zb_realloc(l->actions, sizeof *l->actions * (size_t)l->cap);
    return;
  }
  zb_action *own = zb_malloc(sizeof *own * (size_t)l->cap); /* the block's neighbours follow it */
  memcpy(own, l->actions, sizeof *own * (size_t)l->n);
  l->actions = own;
  l->in_block = false;
}

void zb_schedule_grow(zb_schedule *s, int rank) {
  zb_rank_list *l = &s->ranks[rank];
  schedule_resize(l, l->cap ? l->cap * 2 : 16);
}

void zb_schedule_reserve(zb_schedule *s, int rank, int n) {
  if (n > s->ranks[rank].cap)
    schedule_resize(&s->ranks[rank], n);
}

/* Actions (a cache line and more) left between two lists of a block:
 * lists of 2^k actions would otherwise start a multiple of a large power
 * of two apart, and a pass that reads every rank's i-th action in turn
 * (the simulation) would find them all in a few sets of a cache that huge
 * pages index by physical address. */
#define SCHEDULE_BLOCK_GAP 6

void zb_schedule_reserve_all(zb_schedule *s, const int *n) {
  size_t total = 0;
  for (int r = 0; r < s->p; r++)
    total += (size_t)(n[r] > 0 ? n[r] : 0) + SCHEDULE_BLOCK_GAP;
  free(s->block);
  s->block = zb_malloc_large(sizeof *s->block * total);
  size_t at = 0;
  for (int r = 0; r < s->p; r++) {
    zb_rank_list *l = &s->ranks[r];
    free(l->in_block ? NULL : l->actions);
    *l = (zb_rank_list){.actions = s->block + at, .cap = n[r] > 0 ? n[r] : 0, .in_block = true};
    at += (size_t)l->cap + SCHEDULE_BLOCK_GAP;
  }
}

const char *zb_op_name(zb_op op) {
  static const char *const names[ZB_OP_COUNT_] = {
      [ZB_OP_NONE] = "NONE",
      [ZB_OP_F] = "F",
      [ZB_OP_B] = "B",
      [ZB_OP_W] = "W",
      [ZB_OP_BW] = "BW",
      [ZB_OP_SEND_F] = "SEND_F",
      [ZB_OP_RECV_F] = "RECV_F",
      [ZB_OP_SEND_B] = "SEND_B",
      [ZB_OP_RECV_B] = "RECV_B",
      [ZB_OP_UNSHARD] = "UNSHARD",
      [ZB_OP_RESHARD] = "RESHARD",
      [ZB_OP_REDUCE_GRAD] = "REDUCE_GRAD",
      [ZB_OP_WAIT_SEND_F] = "WAIT_SEND_F",
      [ZB_OP_WAIT_SEND_B] = "WAIT_SEND_B",
      [ZB_OP_WAIT_REDUCE_GRAD] = "WAIT_REDUCE_GRAD",
  };
  return (op >= 0 && op < ZB_OP_COUNT_) ? names[op] : "?";
}

int zb_schedule_compute_count(const zb_schedule *s, int rank) {
  int n = 0;
  for (int i = 0; i < s->ranks[rank].n; i++)
    n += zb_op_is_compute(s->ranks[rank].actions[i].op);
  return n;
}

void zb_schedule_strip_comm(zb_schedule *s) {
  for (int r = 0; r < s->p; r++) {
    zb_rank_list *l = &s->ranks[r];
    int k = 0;
    for (int i = 0; i < l->n; i++)
      if (!zb_op_is_comm(l->actions[i].op))
        l->actions[k++] = l->actions[i];
    l->n = k;
  }
}

bool zb_schedule_has_comm(const zb_schedule *s) {
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (zb_op_is_comm(s->ranks[r].actions[i].op))
        return true;
  return false;
}

bool zb_schedule_splits_w(const zb_schedule *s) {
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      if (s->ranks[r].actions[i].op == ZB_OP_BW)
        return false;
  return true;
}

zb_rank_costs zb_rank_costs_default(void) {
  return (zb_rank_costs){.t_f = 1, .t_b = 1, .t_w = 1, .t_comm = 0, .m_f = 1, .m_b = -0.5, .m_w = -0.5};
}

zb_costs *zb_costs_new(int n_stages) {
  zb_costs *c = zb_calloc(1, sizeof *c);
  size_t n = (size_t)(n_stages > 0 ? n_stages : 1);
  c->n_stages = n_stages;
  c->t_f = zb_calloc(n, sizeof(double));
  c->t_b = zb_calloc(n, sizeof(double));
  c->t_w = zb_calloc(n, sizeof(double));
  c->t_reduce = zb_calloc(n, sizeof(double));
  c->m_f = zb_calloc(n, sizeof(double));
  c->m_b = zb_calloc(n, sizeof(double));
  c->m_w = zb_calloc(n, sizeof(double));
  return c;
}

void zb_costs_free(zb_costs *c) {
  if (!c)
    return;
  free(c->t_f);
  free(c->t_b);
  free(c->t_w);
  free(c->t_reduce);
  free(c->m_f);
  free(c->m_b);
  free(c->m_w);
  free(c);
}

zb_costs *zb_costs_clone(const zb_costs *c) {
  zb_costs *d = zb_costs_new(c->n_stages);
  size_t sz = sizeof(double) * (size_t)c->n_stages;
  memcpy(d->t_f, c->t_f, sz);
  memcpy(d->t_b, c->t_b, sz);
  memcpy(d->t_w, c->t_w, sz);
  memcpy(d->t_reduce, c->t_reduce, sz);
  memcpy(d->m_f, c->m_f, sz);
  memcpy(d->m_b, c->m_b, sz);
  memcpy(d->m_w, c->m_w, sz);
  d->t_comm = c->t_comm;
  d->mem_limit = c->mem_limit;
  return d;
}

zb_costs *zb_costs_from_rank_share(int p, int v, const zb_rank_costs *rc, double mem_limit) {
  int S = p * v;
  zb_costs *c = zb_costs_new(S);
  for (int s = 0; s < S; s++) {
    c->t_f[s] = rc->t_f / v;
    c->t_b[s] = rc->t_b / v;
    c->t_w[s] = rc->t_w / v;
    c->t_reduce[s] = rc->t_reduce / v;
    c->m_f[s] = rc->m_f / v;
    c->m_b[s] = rc->m_b / v;
    c->m_w[s] = rc->m_w / v;
  }
  c->t_comm = rc->t_comm;
  c->mem_limit = mem_limit;
  return c;
}

zb_err zb_costs_check(const zb_costs *c, zb_diag *diag) {
  if (!isfinite(c->t_comm) || c->t_comm < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "T_comm must be a finite number >= 0 (got %g)", c->t_comm);
  for (int s = 0; s < c->n_stages; s++) {
    const double t[4] = {c->t_f[s], c->t_b[s], c->t_w[s], c->t_reduce[s]};
    const char *tn[4] = {"T_F", "T_B", "T_W", "T_reduce"};
    for (int k = 0; k < 4; k++)
      if (!isfinite(t[k]) || t[k] < 0)
        return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s of stage %d must be a finite number >= 0 (got %g)",
                           tn[k], s, t[k]);
    if (!isfinite(c->m_f[s]) || !isfinite(c->m_b[s]) || !isfinite(c->m_w[s]))
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "memory deltas of stage %d must be finite", s);
    /* B may grow memory (flash attention's B frees only its log-sum-exp
     * and keeps W's gradients): M_W <= 0 with the zero sum below keeps
     * M_F + M_B >= 0, what a microbatch holds between B and W */
    if (c->m_f[s] < 0 || c->m_w[s] > 0)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "memory deltas of stage %d need M_F >= 0 and M_W <= 0 (got %g, %g, %g)", s,
                         c->m_f[s], c->m_b[s], c->m_w[s]);
    double sum = c->m_f[s] + c->m_b[s] + c->m_w[s];
    if (fabs(sum) > 1e-9 * (1 + fabs(c->m_f[s])))
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "memory deltas of stage %d must sum to zero: M_F + M_B + M_W = %g", s, sum);
  }
  if (!isfinite(c->mem_limit))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "memory limit must be finite");
  return ZB_OK;
}

double zb_costs_rank_mf(const zb_costs *c, zb_placement pl, int p, int v, int rank) {
  double sum = 0;
  for (int s = 0; s < p * v && s < c->n_stages; s++)
    if (zb_placement_rank(pl, p, v, s) == rank)
      sum += c->m_f[s];
  return sum;
}

double *zb_costs_op_table(const zb_costs *c, bool mem) {
  int S = c->n_stages;
  double *t = zb_malloc(sizeof(double) * zb_costs_op_at(ZB_OP_BW + 1, 0, S));
  for (zb_op op = ZB_OP_F; op <= ZB_OP_BW; op++)
    for (int st = 0; st < S; st++)
      t[zb_costs_op_at(op, st, S)] = mem ? zb_costs_mem(c, op, st) : zb_costs_time(c, op, st);
  return t;
}

void zb_schedule_peers(const zb_schedule *s, int cap, int *peer, int *npeer) {
  int S = zb_schedule_stages(s);
  for (int st = 0; st < S; st++)
    for (int t = st - 1; t <= st + 1; t += 2) {
      int r = zb_stage_rank(s, st), q = t >= 0 && t < S ? zb_stage_rank(s, t) : r;
      bool seen = q == r;
      for (int k = 0; k < npeer[r] && !seen; k++)
        seen = peer[r * cap + k] == q;
      if (!seen)
        peer[r * cap + npeer[r]++] = q;
    }
}

int zb_comm_group_end(const zb_action *actions, int n, int i) {
  int j = i;
  while (j + 1 < n && actions[j].batch && zb_op_is_comm(actions[j + 1].op))
    j++;
  return j;
}

int zb_comm_group_count(const zb_action *actions, int n) {
  int groups = 0;
  for (int i = 0; i < n; i++)
    if (zb_op_is_comm(actions[i].op)) {
      i = zb_comm_group_end(actions, n, i);
      groups++;
    }
  return groups;
}
