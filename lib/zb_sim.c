#include "zb_sim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"

/* Completion times of F and B per (stage, microbatch); NAN until done. */
typedef struct sim_state {
  int S, m;
  double *f_end, *b_end;
} sim_state;

static double *sim_slot(double *arr, const sim_state *st, int stage, int mb) {
  return &arr[(size_t)stage * st->m + mb];
}

/* When the input of compute action a, run on `rank`, is available; NAN if
 * not yet produced. */
static double sim_ready(const zb_schedule *s, const zb_costs *c, const sim_state *st, int rank,
                        const zb_action *a) {
  int S = st->S;
  switch (a->op) {
  case ZB_OP_F: {
    if (a->stage == 0)
      return 0;
    double t = *sim_slot(st->f_end, st, a->stage - 1, a->mb);
    if (isnan(t))
      return t;
    return zb_stage_rank(s, a->stage - 1) == rank ? t : t + c->t_comm;
  }
  case ZB_OP_B:
  case ZB_OP_BW: {
    double own = *sim_slot(st->f_end, st, a->stage, a->mb);
    if (isnan(own))
      return own;
    if (a->stage == S - 1)
      return own;
    double t = *sim_slot(st->b_end, st, a->stage + 1, a->mb);
    if (isnan(t))
      return t;
    if (zb_stage_rank(s, a->stage + 1) != rank)
      t += c->t_comm;
    return t > own ? t : own;
  }
  case ZB_OP_W: return *sim_slot(st->b_end, st, a->stage, a->mb);
  default: return 0;
  }
}

static zb_err sim_check_ranges(const zb_schedule *s, const zb_costs *c, zb_diag *diag) {
  int S = zb_schedule_stages(s);
  if (!c)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "simulation needs a cost model");
  if (c->n_stages != S)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "costs describe %d stages, the schedule has %d", c->n_stages,
                       S);
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

/* Runs the lists; fills res when given (its arrays allocated by caller). */
static zb_err sim_run(const zb_schedule *s, const zb_costs *c, zb_sim_result *res, double *makespan_out,
                      double *span_out, zb_diag *diag) {
  zb_err err = sim_check_ranges(s, c, diag);
  if (err)
    return err;
  int p = s->p;
  sim_state st = {.S = zb_schedule_stages(s), .m = s->m};
  size_t cells = (size_t)st.S * (size_t)st.m;
  st.f_end = zb_malloc(sizeof(double) * cells);
  st.b_end = zb_malloc(sizeof(double) * cells);
  for (size_t k = 0; k < cells; k++)
    st.f_end[k] = st.b_end[k] = NAN;
  int *pos = zb_calloc((size_t)p, sizeof(int));
  double *now = zb_calloc((size_t)p, sizeof(double));
  double *first = zb_malloc(sizeof(double) * (size_t)p);
  double *mem = zb_calloc((size_t)p, sizeof(double));
  for (int r = 0; r < p; r++)
    first[r] = NAN;

  int remaining = 0;
  for (int r = 0; r < p; r++)
    remaining += s->ranks[r].n;
  while (remaining > 0) {
    int progressed = 0;
    for (int r = 0; r < p; r++) {
      const zb_rank_list *l = &s->ranks[r];
      while (pos[r] < l->n) {
        const zb_action *a = &l->actions[pos[r]];
        double start = now[r], end = now[r];
        if (zb_op_is_compute(a->op)) {
          double ready = sim_ready(s, c, &st, r, a);
          if (isnan(ready))
            break;
          if (ready > start)
            start = ready;
          end = start + zb_costs_time(c, a->op, a->stage);
          if (isnan(first[r]))
            first[r] = start;
          if (a->op == ZB_OP_F)
            *sim_slot(st.f_end, &st, a->stage, a->mb) = end;
          else if (a->op == ZB_OP_B || a->op == ZB_OP_BW)
            *sim_slot(st.b_end, &st, a->stage, a->mb) = end;
          now[r] = end;
          if (res) {
            res->busy[r] += end - start;
            mem[r] += zb_costs_mem(c, a->op, a->stage);
            if (mem[r] > res->peak_memory[r])
              res->peak_memory[r] = mem[r];
            res->span_end[r] = end;
          }
        }
        if (res) {
          res->start[r][pos[r]] = start;
          res->end[r][pos[r]] = end;
        }
        pos[r]++;
        remaining--;
        progressed++;
      }
    }
    if (!progressed)
      break;
  }

  if (remaining > 0) {
    char stuck[160] = "";
    int len = 0;
    for (int r = 0; r < p && len < (int)sizeof stuck - 40; r++)
      if (pos[r] < s->ranks[r].n) {
        const zb_action *a = &s->ranks[r].actions[pos[r]];
        len += snprintf(stuck + len, sizeof stuck - (size_t)len, "%s rank %d at #%d (%s s%d mb%d)",
                        len ? "," : "", r, pos[r], zb_op_name(a->op), a->stage, a->mb);
      }
    err = zb_diag_set(diag, ZB_ERR_DEADLOCK, "schedule cannot complete: %s", stuck);
    goto cleanup;
  }

  double makespan = 0, span = 0;
  for (int r = 0; r < p; r++) {
    if (now[r] > makespan)
      makespan = now[r];
    double sp = isnan(first[r]) ? 0 : now[r] - first[r];
    if (sp > span)
      span = sp;
    if (res)
      res->span_start[r] = isnan(first[r]) ? 0 : first[r];
  }
  if (makespan_out)
    *makespan_out = makespan;
  if (span_out)
    *span_out = span;

cleanup:
  free(st.f_end);
  free(st.b_end);
  free(pos);
  free(now);
  free(first);
  free(mem);
  return err;
}

static zb_sim_result *sim_result_alloc(const zb_schedule *s) {
  zb_sim_result *r = zb_calloc(1, sizeof *r);
  size_t p = (size_t)s->p;
  r->p = s->p;
  r->busy = zb_calloc(p, sizeof(double));
  r->span_start = zb_calloc(p, sizeof(double));
  r->span_end = zb_calloc(p, sizeof(double));
  r->peak_memory = zb_calloc(p, sizeof(double));
  r->peak_memory_units = zb_calloc(p, sizeof(double));
  r->start = zb_calloc(p, sizeof(double *));
  r->end = zb_calloc(p, sizeof(double *));
  for (int k = 0; k < s->p; k++) {
    size_t n = (size_t)(s->ranks[k].n ? s->ranks[k].n : 1);
    r->start[k] = zb_calloc(n, sizeof(double));
    r->end[k] = zb_calloc(n, sizeof(double));
  }
  return r;
}

zb_err zb_simulate(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag) {
  zb_sim_result *r = sim_result_alloc(s);
  zb_err err = sim_run(s, c, r, &r->makespan, &r->max_span, diag);
  if (err) {
    zb_sim_result_free(r);
    return err;
  }
  double busy_sum = 0, busy_max = 0;
  for (int k = 0; k < s->p; k++) {
    busy_sum += r->busy[k];
    if (r->busy[k] > busy_max)
      busy_max = r->busy[k];
    double unit = zb_costs_rank_mf(c, s->placement, s->p, s->v, k);
    r->peak_memory_units[k] = unit > 0 ? r->peak_memory[k] / unit : 0;
  }
  r->bubble_ratio = r->makespan > 0 ? 1.0 - busy_sum / (s->p * r->makespan) : 0;
  /* The paper's m(T_F+T_B+T_W) is one rank's work; with per-stage costs we
   * take the most loaded rank's, which is that figure when costs are even. */
  r->bubble_ratio_paper = r->max_span > 0 ? (r->max_span - busy_max) / r->max_span : 0;
  *out = r;
  return ZB_OK;
}

zb_err zb_simulate_makespan(const zb_schedule *s, const zb_costs *c, double *makespan, double *max_span) {
  return sim_run(s, c, NULL, makespan, max_span, NULL);
}

void zb_sim_result_free(zb_sim_result *r) {
  if (!r)
    return;
  for (int k = 0; k < r->p; k++) {
    free(r->start[k]);
    free(r->end[k]);
  }
  free(r->start);
  free(r->end);
  free(r->busy);
  free(r->span_start);
  free(r->span_end);
  free(r->peak_memory);
  free(r->peak_memory_units);
  free(r);
}
