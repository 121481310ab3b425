/* zb_sim_device.c — the simulator's device-ordered mode (zb_sim.h,
 * docs/schedules.md, Execution model): what the executor does on a
 * device-ordered transport (nccl over the cuda backend). Each rank has a
 * compute stream and one comm stream. Compute ops run back to back in
 * list order, each when the previous one ended, its inputs are there (a
 * received one when its receive's group completed) and the host has
 * issued it (the window: the host posts a group only while fewer than
 * `window` are in flight). Comm groups run on the comm stream in list
 * order: a group starts when the previous one completed and, for its
 * sends, their producers ended; a transfer completes T_comm after both
 * its sides' groups started, and a group when all its transfers did. So
 * a group behind a late receive waits for it (head-of-line blocking).
 * Sends and receives pair by tag (kind, sending stage, microbatch), as
 * the executor's tags do.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "zb_alloc.h"
#include "zb_sim_internal.h"

typedef struct dev_state {
  const zb_schedule *s;
  const zb_costs *c;
  zb_sim_result *res;
  int S, m, window;
  double *f_end, *b_end;        /* compute ends per (stage, mb), NAN until done */
  double *sent, *posted, *done; /* per message (dev_msg): send group start, receive group start and end */
  int *stage_rank;
  double *op_time, *op_mem;
  int *ci, *gi;        /* per rank: next action of the compute walk and of the comm walk */
  int *groups_before;  /* per rank: groups that start before ci (the host posted them) */
  int *gk;             /* per rank: groups completed */
  double **gend;       /* per rank: each group's end, in list order */
  double *cnow, *gnow; /* per rank: compute stream free, comm stream free */
  double *gstart;      /* per rank: the start of the group at gi, NAN while not started */
  double *first, *mem;
  double *rlo, *rnow; /* per rank: its reduction stream (zb_sim_reduce_issue) */
  int remaining;
} dev_state;

/* A message's cell: its kind (F 0, B 1), sending stage and microbatch. */
static size_t dev_cell(const dev_state *d, int b, int stage, int mb) {
  return ((size_t)b * (size_t)d->S + (size_t)stage) * (size_t)d->m + (size_t)mb;
}

/* The message comm action a sends or receives (exec_tag's convention). */
static size_t dev_msg(const dev_state *d, const zb_action *a) {
  switch (a->op) {
  case ZB_OP_SEND_F: return dev_cell(d, 0, a->stage, a->mb);
  case ZB_OP_RECV_F: return dev_cell(d, 0, a->stage - 1, a->mb);
  case ZB_OP_SEND_B: return dev_cell(d, 1, a->stage, a->mb);
  default: return dev_cell(d, 1, a->stage + 1, a->mb);
  }
}

static bool dev_is_send(const zb_action *a) {
  return a->op == ZB_OP_SEND_F || a->op == ZB_OP_SEND_B;
}

/* Every compute and comm action's cells in range, messages included. */
static zb_err dev_check(const dev_state *d, zb_diag *diag) {
  for (int r = 0; r < d->s->p; r++)
    for (int i = 0; i < d->s->ranks[r].n; i++) {
      const zb_action *a = &d->s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op) && !zb_op_is_comm(a->op))
        continue;
      int from = a->op == ZB_OP_RECV_F ? a->stage - 1 : a->op == ZB_OP_RECV_B ? a->stage + 1 : a->stage;
      if (!zb_in(a->stage, d->S) || !zb_in(from, d->S) || !zb_in(a->mb, d->m))
        return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                           "rank %d action %d: stage %d / microbatch %d out of range", r, i, a->stage, a->mb);
    }
  return ZB_OK;
}

static double *dev_nans(size_t n) {
  double *v = zb_malloc_large(sizeof(double) * (n ? n : 1));
  for (size_t k = 0; k < n; k++)
    v[k] = NAN;
  return v;
}

static void dev_init(dev_state *d, const zb_schedule *s, const zb_costs *c, int window, zb_sim_result *res) {
  int p = s->p;
  *d = (dev_state){.s = s, .c = c, .res = res, .S = zb_schedule_stages(s), .m = s->m, .window = window};
  size_t cells = (size_t)d->S * (size_t)d->m;
  d->f_end = dev_nans(cells);
  d->b_end = dev_nans(cells);
  d->sent = dev_nans(2 * cells);
  d->posted = dev_nans(2 * cells);
  d->done = dev_nans(2 * cells);
  d->stage_rank = zb_malloc(sizeof(int) * (size_t)d->S);
  for (int k = 0; k < d->S; k++)
    d->stage_rank[k] = zb_stage_rank(s, k);
  d->op_time = zb_costs_op_table(c, false);
  d->op_mem = zb_costs_op_table(c, true);
  d->ci = zb_calloc((size_t)p, sizeof(int));
  d->gi = zb_calloc((size_t)p, sizeof(int));
  d->groups_before = zb_calloc((size_t)p, sizeof(int));
  d->gk = zb_calloc((size_t)p, sizeof(int));
  d->gend = zb_calloc((size_t)p, sizeof(double *));
  d->cnow = zb_calloc((size_t)p, sizeof(double));
  d->gnow = zb_calloc((size_t)p, sizeof(double));
  d->gstart = dev_nans((size_t)p);
  d->first = dev_nans((size_t)p);
  d->mem = zb_calloc((size_t)p, sizeof(double));
  d->rlo = zb_calloc((size_t)p, sizeof(double));
  d->rnow = zb_calloc((size_t)p, sizeof(double));
  for (int r = 0; r < p; r++) {
    const zb_rank_list *l = &s->ranks[r];
    d->gend[r] = zb_malloc(sizeof(double) * (size_t)(zb_comm_group_count(l->actions, l->n) + 1));
    d->remaining += l->n;
  }
}

static void dev_free(dev_state *d) {
  for (int r = 0; r < d->s->p; r++)
    free(d->gend[r]);
  free(d->gend);
  free(d->f_end);
  free(d->b_end);
  free(d->sent);
  free(d->posted);
  free(d->done);
  free(d->stage_rank);
  free(d->op_time);
  free(d->op_mem);
  free(d->ci);
  free(d->gi);
  free(d->groups_before);
  free(d->gk);
  free(d->cnow);
  free(d->gnow);
  free(d->gstart);
  free(d->first);
  free(d->mem);
  free(d->rlo);
  free(d->rnow);
}

static void dev_record(dev_state *d, int r, int i, double start, double end) {
  if (d->res && d->res->start) {
    d->res->start[r][i] = start;
    if (d->res->end)
      d->res->end[r][i] = end;
  }
  d->remaining--;
}

/* When compute action a's inputs are there on rank r: a local input at
 * its producer's end, a received one at its receive group's end; NAN
 * while unknown. */
static double dev_ready(const dev_state *d, int r, const zb_action *a) {
  size_t at = (size_t)a->stage * (size_t)d->m + (size_t)a->mb;
  switch (a->op) {
  case ZB_OP_F:
    if (a->stage == 0)
      return 0;
    if (d->stage_rank[a->stage - 1] == r)
      return d->f_end[at - (size_t)d->m];
    return d->done[dev_cell(d, 0, a->stage - 1, a->mb)];
  case ZB_OP_B:
  case ZB_OP_BW: {
    double own = d->f_end[at], t = own;
    if (a->stage + 1 < d->S)
      t = d->stage_rank[a->stage + 1] == r ? d->b_end[at + (size_t)d->m]
                                           : d->done[dev_cell(d, 1, a->stage + 1, a->mb)];
    return isnan(own) || isnan(t) ? NAN : fmax(own, t);
  }
  case ZB_OP_W: return d->b_end[at];
  default: return 0;
  }
}

/* When the host has issued rank r's next compute op: the groups before
 * it are posted, so all but window - 1 of them have completed. */
static double dev_issued(const dev_state *d, int r) {
  /* posting group k waits for group k - window (the transport's ring),
   * and the groups before the op are 0 .. groups_before - 1 */
  int g = d->groups_before[r] - 1 - d->window;
  if (d->window <= 0 || g < 0)
    return 0;
  return g < d->gk[r] ? d->gend[r][g] : NAN;
}

/* Runs rank r's next compute op (an overlapped pair starts when both
 * inputs are there); false when it cannot run yet. */
static bool dev_compute(dev_state *d, int r, int i) {
  const zb_rank_list *l = &d->s->ranks[r];
  const zb_action *a = &l->actions[i];
  double ready = dev_ready(d, r, a), issued = dev_issued(d, r);
  if (a->overlap && i + 1 < l->n && zb_op_is_compute(a[1].op) && a[1].mb != a->mb) {
    double second = dev_ready(d, r, a + 1);
    ready = isnan(second) ? NAN : fmax(ready, second); /* fmax would drop a NAN */
  }
  if (isnan(ready) || isnan(issued))
    return false;
  double start = fmax(d->cnow[r], fmax(ready, issued));
  size_t op_at = zb_costs_op_at(a->op, a->stage, d->S);
  double end = start + d->op_time[op_at];
  size_t at = (size_t)a->stage * (size_t)d->m + (size_t)a->mb;
  if (a->op == ZB_OP_F)
    d->f_end[at] = end;
  else if (a->op == ZB_OP_B || a->op == ZB_OP_BW)
    d->b_end[at] = end;
  d->cnow[r] = end;
  if (isnan(d->first[r]))
    d->first[r] = start;
  if (d->res) {
    d->res->reduce_hidden[r] += zb_sim_reduce_overlap(start, end, d->rlo[r], d->rnow[r]);
    d->res->busy[r] += end - start;
    d->mem[r] += d->op_mem[op_at];
    d->res->peak_memory[r] = fmax(d->res->peak_memory[r], d->mem[r]);
  }
  dev_record(d, r, i, start, end);
  return true;
}

/* Starts the group [i, j] on rank r's comm stream if its sends'
 * producers have ended; false if not yet. */
static bool dev_group_start(dev_state *d, int r, int i, int j) {
  double start = d->gnow[r];
  for (int k = i; k <= j; k++) {
    const zb_action *a = &d->s->ranks[r].actions[k];
    if (!dev_is_send(a))
      continue;
    size_t at = (size_t)a->stage * (size_t)d->m + (size_t)a->mb;
    double prod = a->op == ZB_OP_SEND_F ? d->f_end[at] : d->b_end[at];
    if (isnan(prod))
      return false;
    start = fmax(start, prod);
  }
  for (int k = i; k <= j; k++) {
    const zb_action *a = &d->s->ranks[r].actions[k];
    (dev_is_send(a) ? d->sent : d->posted)[dev_msg(d, a)] = start;
  }
  d->gstart[r] = start;
  return true;
}

/* Completes rank r's started group [i, j] once every transfer's other
 * side has started; false if one has not. */
static bool dev_group_end(dev_state *d, int r, int i, int j) {
  double start = d->gstart[r], end = start;
  for (int k = i; k <= j; k++) {
    const zb_action *a = &d->s->ranks[r].actions[k];
    double other = (dev_is_send(a) ? d->posted : d->sent)[dev_msg(d, a)];
    if (isnan(other))
      return false;
    end = fmax(end, fmax(start, other) + d->c->t_comm);
  }
  for (int k = i; k <= j; k++) {
    const zb_action *a = &d->s->ranks[r].actions[k];
    if (!dev_is_send(a))
      d->done[dev_msg(d, a)] = end;
    dev_record(d, r, k, start, end);
  }
  d->gnow[r] = end;
  d->gend[r][d->gk[r]++] = end;
  d->gstart[r] = NAN;
  return true;
}

/* One step of rank r's comm walk; false when it cannot move. */
static bool dev_comm_step(dev_state *d, int r) {
  const zb_rank_list *l = &d->s->ranks[r];
  int i = d->gi[r];
  while (i < l->n && !zb_op_is_comm(l->actions[i].op))
    i++;
  d->gi[r] = i;
  if (i >= l->n)
    return false;
  int j = zb_comm_group_end(l->actions, l->n, i);
  if (isnan(d->gstart[r]) && !dev_group_start(d, r, i, j))
    return false;
  if (!dev_group_end(d, r, i, j))
    return false;
  d->gi[r] = j + 1;
  return true;
}

/* A REDUCE_GRAD (onto the rank's reduction stream, after the compute
 * before it) or WAIT_REDUCE_GRAD (the compute stream waits for that
 * stream) at rank r's action i. */
static void dev_reduce(dev_state *d, int r, int i) {
  const zb_action *a = &d->s->ranks[r].actions[i];
  double start = d->cnow[r];
  if (a->op == ZB_OP_WAIT_REDUCE_GRAD) {
    d->cnow[r] = fmax(d->cnow[r], d->rnow[r]);
    dev_record(d, r, i, start, d->cnow[r]);
    return;
  }
  double t = zb_sim_reduce_time(d->c, a);
  start = zb_sim_reduce_issue(d->cnow[r], t, &d->rlo[r], &d->rnow[r]);
  if (d->res)
    d->res->reduce_time[r] += t;
  dev_record(d, r, i, start, start + t);
}

/* One step of rank r's compute walk (other actions take no time and are
 * passed, groups counted as posted); false when it cannot move. */
static bool dev_compute_step(dev_state *d, int r) {
  const zb_rank_list *l = &d->s->ranks[r];
  int i = d->ci[r];
  if (i >= l->n)
    return false;
  const zb_action *a = &l->actions[i];
  if (zb_op_is_comm(a->op)) {
    d->ci[r] = zb_comm_group_end(l->actions, l->n, i) + 1;
    d->groups_before[r]++;
    return true;
  }
  if (a->op == ZB_OP_REDUCE_GRAD || a->op == ZB_OP_WAIT_REDUCE_GRAD) {
    dev_reduce(d, r, i);
    d->ci[r] = i + 1;
    return true;
  }
  if (!zb_op_is_compute(a->op)) {
    dev_record(d, r, i, d->cnow[r], d->cnow[r]);
    d->ci[r] = i + 1;
    return true;
  }
  if (!dev_compute(d, r, i))
    return false;
  d->ci[r] = i + 1;
  return true;
}

/* Sweeps the ranks, each as far as it goes, until none moves. */
static void dev_run(dev_state *d) {
  for (bool moved = true; moved && d->remaining > 0;) {
    moved = false;
    for (int r = 0; r < d->s->p; r++)
      while (dev_compute_step(d, r) || dev_comm_step(d, r))
        moved = true;
  }
}

static zb_err dev_stuck(const dev_state *d, zb_diag *diag) {
  char stuck[200] = "";
  int len = 0;
  for (int r = 0; r < d->s->p && len < (int)sizeof stuck - 60; r++) {
    const zb_rank_list *l = &d->s->ranks[r];
    if (d->ci[r] < l->n || d->gi[r] < l->n)
      len += snprintf(stuck + len, sizeof stuck - (size_t)len, "%s rank %d compute at #%d, comm at #%d",
                      len ? "," : "", r, d->ci[r], d->gi[r]);
  }
  return zb_diag_set(diag, ZB_ERR_DEADLOCK, "schedule cannot complete on device-ordered streams:%s", stuck);
}

/* Each rank's span: its first compute start to the latest of its
 * streams' ends (an iteration ends when its groups and reductions are
 * drained). */
static void dev_totals(const dev_state *d, zb_sim_result *r) {
  for (int k = 0; k < d->s->p; k++) {
    double end = fmax(fmax(d->cnow[k], d->gnow[k]), d->rnow[k]);
    r->span_start[k] = isnan(d->first[k]) ? 0 : d->first[k];
    r->span_end[k] = end;
    r->makespan = fmax(r->makespan, end);
    r->max_span = fmax(r->max_span, end - r->span_start[k]);
  }
}

zb_err zb_simulate_device(const zb_schedule *s, const zb_costs *c, int window, zb_sim_result **out,
                          zb_diag *diag) {
  if (!zb_schedule_has_comm(s)) /* nothing on a comm stream: the compute timeline is the whole run */
    return zb_sim_async_reduce(s, c, true, out, diag);
  zb_err err = zb_sim_check_costs(s, c, diag);
  if (err)
    return err;
  zb_sim_result *res = zb_sim_result_alloc(s, true);
  dev_state d;
  dev_init(&d, s, c, window, res);
  err = dev_check(&d, diag);
  if (!err)
    dev_run(&d);
  if (!err && d.remaining > 0)
    err = dev_stuck(&d, diag);
  if (!err) {
    dev_totals(&d, res);
    zb_sim_fill_figures(s, c, res);
  }
  dev_free(&d);
  if (err) {
    zb_sim_result_free(res);
    return err;
  }
  *out = res;
  return ZB_OK;
}

zb_err zb_simulate_mode(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode, zb_sim_result **out,
                        zb_diag *diag) {
  if (mode == ZB_SIM_DEVICE)
    return zb_simulate_device(s, c, ZB_SIM_WINDOW, out, diag);
  return zb_simulate(s, c, out, diag);
}

zb_err zb_simulate_figures_mode(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode,
                                zb_sim_result **out, zb_diag *diag) {
  if (mode != ZB_SIM_DEVICE)
    return zb_simulate_figures(s, c, out, diag);
  if (!zb_schedule_has_comm(s))
    return zb_sim_async_reduce(s, c, false, out, diag);
  zb_sim_result *r = NULL;
  zb_err err = zb_simulate_device(s, c, ZB_SIM_WINDOW, &r, diag);
  if (!err) {
    *out = zb_sim_result_copy_figures(r);
    zb_sim_result_free(r);
  }
  return err;
}

zb_err zb_simulate_makespan_mode(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode, double *makespan,
                                 double *max_span) {
  if (mode != ZB_SIM_DEVICE)
    return zb_simulate_makespan(s, c, makespan, max_span);
  zb_sim_result *r = NULL;
  zb_err err = zb_simulate_figures_mode(s, c, mode, &r, NULL);
  if (!err) {
    *makespan = r->makespan;
    *max_span = r->max_span;
  }
  zb_sim_result_free(r);
  return err;
}
