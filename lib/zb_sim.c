#include "zb_sim.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_sim_internal.h"

/* Cells of f_end (and of b_end) up to which they are laid out stage by
 * stage: 512 KiB, what the second level of cache holds. */
#define SIM_STAGE_MAJOR_CELLS 65536

/* What a run keeps, as sim_advance_rank is compiled for each and a
 * result is allocated for (sim_result_alloc): nothing (a makespan),
 * figures, and start times or both times of every action. */
enum { SIM_KEEP_NONE, SIM_KEEP_FIGURES, SIM_KEEP_STARTS, SIM_KEEP_TIMES };

/* Everything one simulation run tracks. f_end and b_end hold completion
 * times of F and B per (stage, microbatch), NAN until done; the per-rank
 * arrays say where each rank's list stands. res, when given, is filled as
 * actions complete (its arrays allocated by the caller). */
typedef struct sim_state {
  const zb_schedule *s;
  const zb_costs *c;
  zb_sim_result *res;
  int S, m;
  double *f_end, *b_end;
  size_t stage_step, mb_step; /* where cell (stage, mb) lies (sim_slot) */
  int *stage_rank;            /* per stage: the rank that hosts it */
  double *op_time, *op_mem;   /* zb_costs_op_table of c */
  int *work;                  /* ranks to advance (a stack), each at most once */
  int n_work;
  bool *queued;       /* per rank: on work, or being advanced */
  size_t *waits;      /* per rank: the cell it stopped for (sim_key), SIM_NO_WAIT if none */
  int *pos;           /* next action index per rank */
  double *now;        /* time each rank is free again */
  double *first;      /* start of each rank's first compute op; NAN: none yet */
  double *mem;        /* memory held per rank so far */
  double *rlo, *rnow; /* per rank: its reduction stream's stretch (zb_sim_reduce_issue) */
  bool async;         /* reductions on their own stream (else they hold the rank) */
  bool hide;          /* async with some t_reduce > 0 and figures kept: count what compute hides */
  int remaining;      /* actions not yet run, all ranks together */
  bool stray;         /* a compute action out of range was met: the run stops */
  int keep;           /* what the run keeps (SIM_KEEP_*, from res) */
} sim_state;

static double *sim_slot(double *arr, const sim_state *st, int stage, int mb) {
  return &arr[(size_t)stage * st->stage_step + (size_t)mb * st->mb_step];
}

/* Whether compute action a's cells are in the run's range (zb_in). */
static inline bool sim_in_range(const sim_state *st, const zb_action *a) {
  return zb_in(a->stage, st->S) & zb_in(a->mb, st->m);
}

/* A cell of f_end (b false) or b_end (b true) as one number: what a
 * stopped rank waits for, and what a producer announces. */
#define SIM_NO_WAIT SIZE_MAX
static size_t sim_key(const sim_state *st, bool b, int stage, int mb) {
  return 2 * ((size_t)stage * st->stage_step + (size_t)mb * st->mb_step) + b;
}

/* Where compute action a's cell lies in f_end and b_end (sim_slot): one
 * index per action, its neighbouring stages a stage_step either side. */
static inline size_t sim_at(const sim_state *st, const zb_action *a) {
  return (size_t)a->stage * st->stage_step + (size_t)a->mb * st->mb_step;
}

/* When the input of compute action a, run on `rank`, is available; NAN if
 * not yet produced. at: sim_at(st, a). */
static inline __attribute__((always_inline)) double sim_ready(const zb_costs *c, const sim_state *st,
                                                              int rank, const zb_action *a, size_t at) {
  int S = st->S;
  switch (a->op) {
  case ZB_OP_F: {
    if (a->stage == 0)
      return 0;
    double t = st->f_end[at - st->stage_step];
    if (isnan(t))
      return t;
    return st->stage_rank[a->stage - 1] == rank ? t : t + c->t_comm;
  }
  case ZB_OP_B:
  case ZB_OP_BW: {
    double own = st->f_end[at];
    if (isnan(own))
      return own;
    if (a->stage == S - 1)
      return own;
    double t = st->b_end[at + st->stage_step];
    if (isnan(t))
      return t;
    if (st->stage_rank[a->stage + 1] != rank)
      t += c->t_comm;
    return t > own ? t : own;
  }
  case ZB_OP_W: return st->b_end[at];
  default: return 0;
  }
}

zb_err zb_sim_check_costs(const zb_schedule *s, const zb_costs *c, zb_diag *diag) {
  int S = zb_schedule_stages(s);
  if (!c)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "simulation needs a cost model");
  if (c->n_stages != S)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "costs describe %d stages, the schedule has %d", c->n_stages,
                       S);
  return ZB_OK;
}

/* The first compute action, rank by rank, whose stage or microbatch is
 * out of range. The run itself checks each one it takes (sim_in_range)
 * and stops at one out of range; this pass, made only for a run that did
 * not complete, names the first in list order, whichever the run met. */
static zb_err sim_check_actions(const zb_schedule *s, zb_diag *diag) {
  int S = zb_schedule_stages(s);
  for (int r = 0; r < s->p; r++)
    for (int i = 0; i < s->ranks[r].n; i++) {
      const zb_action *a = &s->ranks[r].actions[i];
      if (!zb_op_is_compute(a->op))
        continue;
      if (a->stage < 0 || a->stage >= S || a->mb < 0 || a->mb >= s->m)
        return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                           "rank %d action %d: stage %d / microbatch %d out of range", r, i, a->stage, a->mb);
    }
  return ZB_OK;
}

static void sim_state_init(sim_state *st, const zb_schedule *s, const zb_costs *c, zb_sim_result *res) {
  int p = s->p;
  *st = (sim_state){.s = s, .c = c, .res = res, .S = zb_schedule_stages(s), .m = s->m};
  st->keep = !res          ? SIM_KEEP_NONE
             : !res->start ? SIM_KEEP_FIGURES
             : !res->end   ? SIM_KEEP_STARTS
                           : SIM_KEEP_TIMES;
  size_t cells = (size_t)st->S * (size_t)st->m;
  /* Small plans (a search simulates thousands) keep a stage's microbatches
   * side by side: a rank reads along its stages' rows, a line at a time. Past it, neighbouring stages reach a
   * microbatch at about the same time, and microbatch-major keeps what the ranks read together in a few lines
   * (p = 256, m = 4096: 266 -> 192 ms for V-Half). */
  bool mb_major = cells > SIM_STAGE_MAJOR_CELLS;
  st->stage_step = mb_major ? 1 : (size_t)st->m;
  st->mb_step = mb_major ? (size_t)st->S : 1;
  st->f_end = zb_malloc_large(sizeof(double) * cells);
  st->b_end = zb_malloc_large(sizeof(double) * cells);
  for (size_t k = 0; k < cells; k++)
    st->f_end[k] = st->b_end[k] = NAN;
  st->stage_rank = zb_malloc(sizeof(int) * (size_t)st->S);
  for (int k = 0; k < st->S; k++)
    st->stage_rank[k] = zb_stage_rank(s, k);
  st->op_time = zb_costs_op_table(c, false);
  st->op_mem = zb_costs_op_table(c, true);
  st->work = zb_malloc(sizeof(int) * (size_t)p);
  st->queued = zb_calloc((size_t)p, sizeof(bool));
  st->waits = zb_malloc(sizeof(size_t) * (size_t)p);
  st->pos = zb_calloc((size_t)p, sizeof(int));
  st->now = zb_calloc((size_t)p, sizeof(double));
  st->first = zb_malloc(sizeof(double) * (size_t)p);
  st->mem = zb_calloc((size_t)p, sizeof(double));
  st->rlo = zb_calloc((size_t)p, sizeof(double));
  st->rnow = zb_calloc((size_t)p, sizeof(double));
  for (int r = 0; r < p; r++) {
    st->first[r] = NAN;
    st->waits[r] = SIM_NO_WAIT;
    st->remaining += s->ranks[r].n;
  }
}

static void sim_state_free(sim_state *st) {
  free(st->f_end);
  free(st->b_end);
  free(st->stage_rank);
  free(st->op_time);
  free(st->op_mem);
  free(st->work);
  free(st->queued);
  free(st->waits);
  free(st->pos);
  free(st->now);
  free(st->first);
  free(st->mem);
  free(st->rlo);
  free(st->rnow);
}

/* Puts rank r on the work stack unless it is there or being advanced. */
static void sim_wake(sim_state *st, int r) {
  if (!st->queued[r]) {
    st->queued[r] = true;
    st->work[st->n_work++] = r;
  }
}

/* Wakes rank r if it stopped for the cell of key: a rank stopped for
 * another cell would only look and stop again (half of all wakes at
 * scale, each a few cache misses). */
static void sim_wake_for(sim_state *st, int r, size_t key) {
  if (st->waits[r] == key) {
    st->waits[r] = SIM_NO_WAIT;
    sim_wake(st, r);
  }
}

/* One rank's running figures while it advances, in locals: through
 * the arrays, every op would store and reload them (stores to the time
 * arrays may alias them). */
typedef struct sim_figures {
  double first, busy, mem, peak, span_end;
} sim_figures;

/* Runs compute action a on rank r if its input is ready: records its
 * completion, advances the rank's clock and figures f. Sets *start /
 * *end; returns false (and changes nothing) when not ready. */
static inline __attribute__((always_inline)) bool sim_run_compute(sim_state *st, int r, const zb_action *a,
                                                                  double *start, double *end, sim_figures *f,
                                                                  bool figures) {
  size_t at = sim_at(st, a);
  double ready = sim_ready(st->c, st, r, a, at);
  if (isnan(ready))
    return false;
  /* An overlapped pair (DualPipeV's F&B) is one op with both costs: it
   * starts when both inputs are there, the second right after the first
   * (the two must be of different microbatches; else they run apart). */
  if (a->overlap) {
    const zb_rank_list *l = &st->s->ranks[r];
    const zb_action *next = a + 1 < l->actions + l->n ? a + 1 : NULL;
    if (next && zb_op_is_compute(next->op) && !sim_in_range(st, next)) {
      st->stray = true;
      return false;
    }
    if (next && zb_op_is_compute(next->op) && next->mb != a->mb) {
      double ready2 = sim_ready(st->c, st, r, next, sim_at(st, next));
      if (isnan(ready2))
        return false;
      ready = ready2 > ready ? ready2 : ready;
    }
  }
  if (ready > *start)
    *start = ready;
  size_t op_at = zb_costs_op_at((zb_op)a->op, a->stage, st->S);
  *end = *start + st->op_time[op_at];
  if (isnan(f->first))
    f->first = *start;
  /* An output wakes the rank that consumes it (its F or RECV_F, its B or
   * RECV_B), which may have stopped waiting for it. */
  if (a->op == ZB_OP_F) {
    st->f_end[at] = *end;
    if (a->stage + 1 < st->S) /* sim_key of the cell, by its index */
      sim_wake_for(st, st->stage_rank[a->stage + 1], 2 * at);
  } else if (a->op == ZB_OP_B || a->op == ZB_OP_BW) {
    st->b_end[at] = *end;
    if (a->stage > 0)
      sim_wake_for(st, st->stage_rank[a->stage - 1], 2 * at + 1);
  }
  if (figures && st->hide) /* keeps figures: res and its sums are there */
    st->res->reduce_hidden[r] += zb_sim_reduce_overlap(*start, *end, st->rlo[r], st->rnow[r]);
  if (figures) {
    f->busy += *end - *start;
    f->mem += st->op_mem[op_at];
    f->peak = f->mem > f->peak ? f->mem : f->peak;
    f->span_end = *end;
  }
  return true;
}

/* When the tensor a RECV action waits for is there (its producer's end,
 * plus T_comm); NAN while the producer has not run. RECV_F of stage s
 * carries F of s - 1; RECV_B of stage s carries B (or BW) of s + 1. */
static double sim_recv_arrival(const sim_state *st, const zb_action *a) {
  int from = a->op == ZB_OP_RECV_F ? a->stage - 1 : a->stage + 1;
  if (from < 0 || from >= st->S || a->mb < 0 || a->mb >= st->m)
    return 0; /* out of range: the validator's to report, not a wait */
  double t = *sim_slot(a->op == ZB_OP_RECV_F ? st->f_end : st->b_end, st, from, a->mb);
  return isnan(t) ? t : t + st->c->t_comm;
}

/* The first cell compute action a waits for (sim_ready's order). */
static size_t sim_compute_wait(const sim_state *st, const zb_action *a) {
  switch (a->op) {
  case ZB_OP_F: return sim_key(st, false, a->stage - 1, a->mb);
  case ZB_OP_B:
  case ZB_OP_BW:
    if (isnan(*sim_slot(st->f_end, st, a->stage, a->mb)))
      return sim_key(st, false, a->stage, a->mb);
    return sim_key(st, true, a->stage + 1, a->mb);
  case ZB_OP_W: return sim_key(st, true, a->stage, a->mb);
  default: return SIM_NO_WAIT;
  }
}

/* The cell rank r waits for at action a, where it stopped. */
static size_t sim_wait_key(const sim_state *st, int r, const zb_action *a) {
  if (a->op == ZB_OP_RECV_F)
    return sim_key(st, false, a->stage - 1, a->mb);
  if (a->op == ZB_OP_RECV_B)
    return sim_key(st, true, a->stage + 1, a->mb);
  if (!a->overlap || isnan(sim_ready(st->c, st, r, a, sim_at(st, a))))
    return sim_compute_wait(st, a);
  return sim_compute_wait(st, a + 1); /* an overlapped pair stopped for its second */
}

/* A REDUCE_GRAD or WAIT_REDUCE_GRAD of rank r reached at *now: host
 * blocking, the reduction holds the rank for its time; async, it goes on
 * the rank's reduction stream and only the wait holds the rank until that
 * stream is done. Sets its *start and *end. */
static void sim_reduce(sim_state *st, int r, const zb_action *a, double *now, double *start, double *end) {
  if (a->op == ZB_OP_WAIT_REDUCE_GRAD) {
    *start = *now;
    *now = st->rnow[r] > *now ? st->rnow[r] : *now;
    *end = *now;
    return;
  }
  double t = zb_sim_reduce_time(st->c, a);
  *start = zb_sim_reduce_issue(*now, t, &st->rlo[r], &st->rnow[r]);
  *end = *start + t;
  if (!st->async)
    *now = *end;
  if (st->res && st->res->reduce_time)
    st->res->reduce_time[r] += t;
}

/* Runs rank r's list as far as inputs allow, keeping what keep says
 * (a constant in each copy: no test per action).
 * Comm actions take no time of their own, but a RECV holds its rank until
 * its tensor has arrived, as the executor's transport group does (sends
 * complete at once: the tcp transport's buffers take them). */
static inline __attribute__((always_inline)) void sim_advance_rank_keeping(sim_state *st, int r, int keep) {
  const zb_rank_list *l = &st->s->ranks[r];
  bool figures = keep != SIM_KEEP_NONE;
  zb_sim_result *res = keep >= SIM_KEEP_STARTS ? st->res : NULL; /* per-action times wanted */
  int pos = st->pos[r]; /* in locals: stores to the time arrays could alias them */
  double now = st->now[r];
  sim_figures f = {.first = st->first[r], .mem = st->mem[r]};
  if (figures)
    f = (sim_figures){.first = f.first,
                      .busy = st->res->busy[r],
                      .mem = f.mem,
                      .peak = st->res->peak_memory[r],
                      .span_end = st->res->span_end[r]};
  while (pos < l->n) {
    const zb_action *a = &l->actions[pos];
    /* ranks take turns, too many streams for the hardware prefetcher: a
     * lowered plan at scale spends most of its time waiting for lists */
    if (pos + ZB_PREFETCH_ACTIONS < l->n)
      __builtin_prefetch(a + ZB_PREFETCH_ACTIONS);
    double start = now, end = now;
    if (zb_op_is_compute(a->op)) {
      if (!sim_in_range(st, a)) {
        st->stray = true;
        break;
      }
      if (!sim_run_compute(st, r, a, &start, &end, &f, figures))
        break;
      now = end;
    } else if (a->op == ZB_OP_RECV_F || a->op == ZB_OP_RECV_B) {
      double arrival = sim_recv_arrival(st, a);
      if (isnan(arrival))
        break;
      now = arrival > now ? arrival : now;
      start = end = now; /* a RECV happens when its tensor is there */
    } else if (a->op == ZB_OP_REDUCE_GRAD || a->op == ZB_OP_WAIT_REDUCE_GRAD) {
      sim_reduce(st, r, a, &now, &start, &end);
    }
    if (res) {
      res->start[r][pos] = start;
      if (keep == SIM_KEEP_TIMES)
        res->end[r][pos] = end;
    }
    pos++;
  }
  if (pos < l->n && !st->stray)
    st->waits[r] = sim_wait_key(st, r, &l->actions[pos]);
  st->remaining -= pos - st->pos[r];
  st->pos[r] = pos;
  st->now[r] = now;
  st->first[r] = f.first;
  st->mem[r] = f.mem;
  if (figures) {
    st->res->busy[r] = f.busy;
    st->res->peak_memory[r] = f.peak;
    st->res->span_end[r] = f.span_end;
  }
}

static void sim_advance_rank(sim_state *st, int r) {
  switch (st->keep) {
  case SIM_KEEP_NONE: sim_advance_rank_keeping(st, r, SIM_KEEP_NONE); break;
  case SIM_KEEP_FIGURES: sim_advance_rank_keeping(st, r, SIM_KEEP_FIGURES); break;
  case SIM_KEEP_STARTS: sim_advance_rank_keeping(st, r, SIM_KEEP_STARTS); break;
  default: sim_advance_rank_keeping(st, r, SIM_KEEP_TIMES); break;
  }
}

/* Explains a run that stopped with actions left: where each rank waits. */
static zb_err sim_report_deadlock(const sim_state *st, zb_diag *diag) {
  const zb_schedule *s = st->s;
  char stuck[160] = "";
  int len = 0;
  for (int r = 0; r < s->p && len < (int)sizeof stuck - 40; r++)
    if (st->pos[r] < s->ranks[r].n) {
      const zb_action *a = &s->ranks[r].actions[st->pos[r]];
      len += snprintf(stuck + len, sizeof stuck - (size_t)len, "%s rank %d at #%d (%s s%d mb%d)",
                      len ? "," : "", r, st->pos[r], zb_op_name(a->op), a->stage, a->mb);
    }
  return zb_diag_set(diag, ZB_ERR_DEADLOCK, "schedule cannot complete: %s", stuck);
}

/* Makespan (last rank to finish) and the longest first-to-last compute
 * span of a completed run; fills res->span_start when given. */
static void sim_totals(const sim_state *st, double *makespan_out, double *span_out) {
  double makespan = 0, span = 0;
  for (int r = 0; r < st->s->p; r++) {
    double end = st->rnow[r] > st->now[r] ? st->rnow[r] : st->now[r]; /* a reduction left running counts */
    if (end > makespan)
      makespan = end;
    double sp = isnan(st->first[r]) ? 0 : end - st->first[r];
    if (sp > span)
      span = sp;
    if (st->res)
      st->res->span_start[r] = isnan(st->first[r]) ? 0 : st->first[r];
  }
  if (makespan_out)
    *makespan_out = makespan;
  if (span_out)
    *span_out = span;
}

/* Wakes every rank with actions left; false when there is none. */
static bool sim_wake_all(sim_state *st) {
  bool any = false;
  for (int r = st->s->p - 1; r >= 0; r--)
    if (st->pos[r] < st->s->ranks[r].n) {
      st->waits[r] = SIM_NO_WAIT;
      sim_wake(st, r);
      any = true;
    }
  return any;
}

/* Runs the lists: a rank is advanced until it waits for an input, and
 * advanced again once that input's producer wakes it, so each action is
 * looked at a bounded number of times (the result does not depend on the
 * order: every time follows from the dependencies). A producer wakes the
 * host of the consuming stage; an action on another rank (a misplaced
 * one) is found by waking every rank once no rank moves, and work left
 * when that moves nothing either is a deadlock. Fills res when given. */
static zb_err sim_run(const zb_schedule *s, const zb_costs *c, zb_sim_result *res, double *makespan_out,
                      double *span_out, bool checked, bool async, zb_diag *diag) {
  zb_err err = checked ? ZB_OK : zb_sim_check_costs(s, c, diag);
  if (err)
    return err;
  sim_state st;
  sim_state_init(&st, s, c, res);
  st.async = async;
  for (int k = 0; async && res && res->reduce_hidden && k < c->n_stages && c->t_reduce; k++)
    st.hide = st.hide || c->t_reduce[k] > 0;
  for (int left = -1; st.remaining != left && !st.stray && sim_wake_all(&st);) {
    left = st.remaining;
    while (st.n_work > 0 && !st.stray) {
      int r = st.work[--st.n_work];
      sim_advance_rank(&st, r);
      st.queued[r] = false;
    }
  }
  if (st.remaining > 0) { /* out of range (lists in range by promise: only if met), else stuck */
    if (!checked || st.stray)
      err = sim_check_actions(s, diag);
    if (!err)
      err = sim_report_deadlock(&st, diag);
  } else
    sim_totals(&st, makespan_out, span_out);
  sim_state_free(&st);
  return err;
}

/* Times (one cache line) between two ranks' slices of a result's block. */
#define SIM_TIMES_GAP 8

static zb_sim_result *sim_result_alloc(const zb_schedule *s, int keep) {
  zb_sim_result *r = zb_calloc(1, sizeof *r);
  size_t p = (size_t)s->p;
  r->p = s->p;
  r->busy = zb_calloc(p, sizeof(double));
  r->span_start = zb_calloc(p, sizeof(double));
  r->span_end = zb_calloc(p, sizeof(double));
  r->peak_memory = zb_calloc(p, sizeof(double));
  r->peak_memory_units = zb_calloc(p, sizeof(double));
  r->reduce_time = zb_calloc(p, sizeof(double));
  r->reduce_hidden = zb_calloc(p, sizeof(double));
  r->reduce_exposed = zb_calloc(p, sizeof(double));
  if (keep == SIM_KEEP_FIGURES)
    return r;
  /* each kind of time in one block, the ranks' arrays slices of it
   * (start[0] and end[0] its base: zb_sim_result_free), a cache line
   * apart (see zb_schedule_reserve_all: lists of 2^k actions) */
  size_t total = 0;
  for (int k = 0; k < s->p; k++)
    total += (size_t)(s->ranks[k].n ? s->ranks[k].n : 1) + SIM_TIMES_GAP;
  r->start = zb_calloc(p, sizeof(double *));
  r->end = keep == SIM_KEEP_TIMES ? zb_calloc(p, sizeof(double *)) : NULL;
  /* not cleared: a run that completes writes every action's time, and
   * one that does not frees the result */
  r->start[0] = zb_malloc_large(total * sizeof(double));
  if (r->end)
    r->end[0] = zb_malloc_large(total * sizeof(double));
  for (int k = 1; k < s->p; k++) {
    size_t n = (size_t)(s->ranks[k - 1].n ? s->ranks[k - 1].n : 1) + SIM_TIMES_GAP;
    r->start[k] = r->start[k - 1] + n;
    if (r->end)
      r->end[k] = r->end[k - 1] + n;
  }
  return r;
}

/* The run into r (fresh from sim_result_alloc for s) and its figures. */
static zb_err sim_into(const zb_schedule *s, const zb_costs *c, zb_sim_result *r, bool async, zb_diag *diag) {
  zb_err err = sim_run(s, c, r, &r->makespan, &r->max_span, false, async, diag);
  if (err)
    return err;
  zb_sim_fill_figures(s, c, r);
  return ZB_OK;
}

void zb_sim_fill_figures(const zb_schedule *s, const zb_costs *c, zb_sim_result *r) {
  double busy_sum = 0, busy_max = 0;
  for (int k = 0; k < s->p; k++) {
    busy_sum += r->busy[k];
    if (r->busy[k] > busy_max)
      busy_max = r->busy[k];
    double unit = zb_costs_rank_mf(c, s->placement, s->p, s->v, k);
    r->peak_memory_units[k] = unit > 0 ? r->peak_memory[k] / unit : 0;
    if (r->reduce_time)
      r->reduce_exposed[k] = r->reduce_time[k] - r->reduce_hidden[k];
  }
  r->bubble_ratio = r->makespan > 0 ? 1.0 - busy_sum / (s->p * r->makespan) : 0;
  /* The paper's m(T_F+T_B+T_W) is one rank's work; with per-stage costs we
   * take the most loaded rank's, which is that figure when costs are even. */
  r->bubble_ratio_paper = r->max_span > 0 ? (r->max_span - busy_max) / r->max_span : 0;
  if (r->start && !r->end && !r->op_time) { /* ends from starts: zb_sim_end */
    r->op_time = zb_costs_op_table(c, false);
    r->n_stages = c->n_stages;
  }
}

static zb_err sim_with_result(const zb_schedule *s, const zb_costs *c, int keep, bool async,
                              zb_sim_result **out, zb_diag *diag) {
  zb_sim_result *r = sim_result_alloc(s, keep);
  zb_err err = sim_into(s, c, r, async, diag);
  if (err) {
    zb_sim_result_free(r);
    return err;
  }
  *out = r;
  return ZB_OK;
}

zb_sim_result *zb_sim_result_alloc(const zb_schedule *s, bool times) {
  return sim_result_alloc(s, times ? SIM_KEEP_TIMES : SIM_KEEP_FIGURES);
}

zb_sim_result *zb_sim_result_new_starts(const zb_schedule *s) {
  return sim_result_alloc(s, SIM_KEEP_STARTS);
}

zb_err zb_simulate_into(const zb_schedule *s, const zb_costs *c, zb_sim_result *r, zb_diag *diag) {
  return sim_into(s, c, r, false, diag);
}

void zb_sim_result_populate(zb_sim_result *r, const zb_schedule *s) {
  if (!r->start || s->p < 1)
    return;
  const double *last = r->start[s->p - 1] + (s->ranks[s->p - 1].n ? s->ranks[s->p - 1].n : 1);
  zb_populate(r->start[0], sizeof(double) * (size_t)(last - r->start[0]));
}

zb_err zb_simulate(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag) {
  return sim_with_result(s, c, SIM_KEEP_TIMES, false, out, diag);
}

zb_err zb_simulate_starts(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag) {
  return sim_with_result(s, c, SIM_KEEP_STARTS, false, out, diag);
}

zb_err zb_simulate_figures(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag) {
  return sim_with_result(s, c, SIM_KEEP_FIGURES, false, out, diag);
}

size_t zb_sim_scratch_bytes(const zb_schedule *s) {
  return 2 * sizeof(double) * (size_t)zb_schedule_stages(s) * (size_t)s->m; /* f_end and b_end */
}

zb_err zb_sim_async_reduce(const zb_schedule *s, const zb_costs *c, bool times, zb_sim_result **out,
                           zb_diag *diag) {
  return sim_with_result(s, c, times ? SIM_KEEP_TIMES : SIM_KEEP_FIGURES, true, out, diag);
}

zb_err zb_simulate_makespan(const zb_schedule *s, const zb_costs *c, double *makespan, double *max_span) {
  return sim_run(s, c, NULL, makespan, max_span, false, false, NULL);
}

zb_err zb_simulate_makespan_in_range(const zb_schedule *s, const zb_costs *c, double *makespan,
                                     double *max_span) {
  return sim_run(s, c, NULL, makespan, max_span, true, false, NULL);
}

void zb_sim_result_free(zb_sim_result *r) {
  if (!r)
    return;
  if (r->start) /* the blocks the ranks' arrays are slices of */
    free(r->start[0]);
  if (r->end)
    free(r->end[0]);
  free(r->start);
  free(r->end);
  free(r->busy);
  free(r->span_start);
  free(r->span_end);
  free(r->peak_memory);
  free(r->peak_memory_units);
  free(r->reduce_time);
  free(r->reduce_hidden);
  free(r->reduce_exposed);
  free(r->op_time);
  free(r);
}

static double *sim_copy_ranks(const double *v, int p) {
  if (!v)
    return NULL;
  double *out = zb_malloc((size_t)p * sizeof *out);
  memcpy(out, v, (size_t)p * sizeof *out);
  return out;
}

zb_sim_result *zb_sim_result_copy_figures(const zb_sim_result *r) {
  zb_sim_result *out = zb_calloc(1, sizeof *out);
  *out = *r;
  out->start = out->end = NULL;
  out->op_time = NULL;
  out->busy = sim_copy_ranks(r->busy, r->p);
  out->span_start = sim_copy_ranks(r->span_start, r->p);
  out->span_end = sim_copy_ranks(r->span_end, r->p);
  out->peak_memory = sim_copy_ranks(r->peak_memory, r->p);
  out->peak_memory_units = sim_copy_ranks(r->peak_memory_units, r->p);
  out->reduce_time = sim_copy_ranks(r->reduce_time, r->p);
  out->reduce_hidden = sim_copy_ranks(r->reduce_hidden, r->p);
  out->reduce_exposed = sim_copy_ranks(r->reduce_exposed, r->p);
  return out;
}
