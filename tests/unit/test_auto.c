/* zb-auto's guarantees (docs/schedules.md, Families): on every shape and cost setting of a
 * grid it stays within its memory limit, validates, and its simulated
 * makespan is never worse than zb-h1's at limit 1p nor zb-h2's at limit 2p
 * on the same costs (equal, uneven, per-stage uneven, communication-heavy).
 * With the span objective the same holds for the longest per-rank span. */
#include <stdint.h>

#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

typedef enum setting { SET_EQUAL, SET_UNEVEN, SET_STAGES, SET_COMM, SET_COUNT } setting;
static const char *const setting_names[SET_COUNT] = {"equal", "uneven", "per-stage", "comm-heavy"};

/* A deterministic factor in [0.8, 1.2) per stage (an LCG, so the grid is
 * the same on every run). */
static double stage_factor(int stage) {
  uint64_t x = 88172645463325252ULL + (uint64_t)stage * 0x9E3779B97F4A7C15ULL;
  for (int k = 0; k < 3; k++)
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return 0.8 + 0.4 * (double)(x >> 11) / 9007199254740992.0;
}

/* Costs of setting `set` for p ranks (v = 1) with a limit of `units` M_F. */
static zb_costs *make_costs(setting set, int p, double units) {
  zb_rank_costs rc = zb_rank_costs_default();
  if (set != SET_EQUAL) {
    rc.t_b = 1.3;
    rc.t_w = 0.7;
    rc.t_comm = set == SET_COMM ? 0.5 : 0.05;
  }
  zb_costs *c = zb_costs_from_rank_share(p, 1, &rc, units * rc.m_f);
  if (set == SET_STAGES)
    for (int s = 0; s < p; s++) {
      double f = stage_factor(s);
      c->t_f[s] *= f;
      c->t_b[s] *= f;
      c->t_w[s] *= f;
    }
  return c;
}

/* Generates family f under c and returns its simulation (NULL on failure,
 * reported). Validates against c's memory limit when check_limit. */
static zb_sim_result *plan_and_simulate(zb_family f, int p, int m, const zb_costs *c, zb_objective obj,
                                        bool check_limit) {
  zb_plan_request req = {.family = f, .p = p, .v = 1, .m = m, .costs = c, .objective = obj};
  zb_schedule *s = NULL;
  zb_sim_result *sim = NULL;
  zb_diag d = {{0}};
  if (zb_plan_generate(&req, &s, &d) != ZB_OK) {
    fprintf(stderr, "  %s p=%d m=%d: %s\n", zb_family_name(f), p, m, d.msg);
    return NULL;
  }
  zb_violation viol;
  zb_costs unlimited = *c;
  unlimited.mem_limit = 0;
  if (zb_validate(s, check_limit ? c : &unlimited, &viol) != ZB_OK) {
    char buf[256];
    zb_violation_format(&viol, buf, sizeof buf);
    fprintf(stderr, "  %s p=%d m=%d limit %g: %s\n", zb_family_name(f), p, m, c->mem_limit, buf);
  } else if (zb_simulate(s, c, &sim, &d) != ZB_OK) {
    fprintf(stderr, "  %s p=%d m=%d: simulate: %s\n", zb_family_name(f), p, m, d.msg);
  }
  zb_schedule_free(s);
  return sim;
}

/* zb-auto at `units` p against the handcrafted `ref` on one shape; returns
 * the margin (ref - auto, >= 0 when auto is no worse) or -INFINITY on a
 * failure, which it reports. */
static double auto_margin(setting set, int p, int m, int units_p, zb_family ref, zb_objective obj) {
  zb_costs *c = make_costs(set, p, units_p * p);
  zb_sim_result *a = plan_and_simulate(ZB_FAMILY_ZB_AUTO, p, m, c, obj, true);
  zb_sim_result *h = plan_and_simulate(ref, p, m, c, obj, false);
  double margin = -INFINITY;
  if (a && h) {
    margin = obj == ZB_OBJ_SPAN ? h->max_span - a->max_span : h->makespan - a->makespan;
    for (int r = 0; r < p; r++)
      if (a->peak_memory[r] > c->mem_limit + 1e-9) {
        fprintf(stderr, "  zb-auto p=%d m=%d: rank %d peak %g over limit %g\n", p, m, r, a->peak_memory[r],
                c->mem_limit);
        margin = -INFINITY;
      }
    if (margin < -1e-9)
      fprintf(stderr, "  zb-auto %dp %s p=%d m=%d (%s): %s %g worse than %s\n", units_p, setting_names[set],
              p, m, obj == ZB_OBJ_SPAN ? "span" : "makespan", obj == ZB_OBJ_SPAN ? "span" : "makespan",
              -margin, zb_family_name(ref));
  }
  zb_sim_result_free(a);
  zb_sim_result_free(h);
  zb_costs_free(c);
  return margin;
}

static void grid(zb_objective obj) {
  static const int ps[] = {1, 2, 3, 4, 5, 6, 8, 12, 16};
  int failures = 0, cells = 0, better = 0;
  for (int set = 0; set < SET_COUNT; set++)
    for (size_t pi = 0; pi < sizeof ps / sizeof ps[0]; pi++) {
      int p = ps[pi];
      const int ms[] = {1, p / 2 + 1, p, 2 * p - 1, 2 * p, 3 * p + 1, 4 * p};
      for (size_t mi = 0; mi < sizeof ms / sizeof ms[0]; mi++) {
        int m = ms[mi];
        double m1 = auto_margin((setting)set, p, m, 1, ZB_FAMILY_ZB_H1, obj);
        double m2 = auto_margin((setting)set, p, m, 2, ZB_FAMILY_ZB_H2, obj);
        failures += (m1 < -1e-9) + (m2 < -1e-9);
        better += (m1 > 1e-9) + (m2 > 1e-9);
        cells += 2;
        if (failures > 10)
          ZBT_FAIL("too many failures");
      }
    }
  printf("  %s: %d cells, zb-auto strictly better in %d\n", obj == ZB_OBJ_SPAN ? "span" : "makespan", cells,
         better);
  CHECK_EQ(failures, 0);
  /* the greedy must also find something the handcrafted lists miss */
  CHECK(better > cells / 10);
}

static void test_never_worse_makespan(void) {
  grid(ZB_OBJ_MAKESPAN);
}
static void test_never_worse_span(void) {
  grid(ZB_OBJ_SPAN);
}

/* Limits between 1p and 2p and below 1p: always honoured, and a looser
 * limit never gives a longer makespan. */
static void test_limits_honoured_and_monotone(void) {
  static const double units[] = {0.5, 0.75, 1, 1.25, 1.5, 2, 3};
  for (int set = 0; set < SET_COUNT; set++)
    for (int p = 2; p <= 8; p += 3)
      for (int m = p; m <= 4 * p; m += p) {
        double prev = INFINITY;
        for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
          zb_costs *c = make_costs((setting)set, p, units[k] * p);
          zb_sim_result *a = plan_and_simulate(ZB_FAMILY_ZB_AUTO, p, m, c, ZB_OBJ_MAKESPAN, true);
          zb_costs_free(c);
          CHECK_MSG(a != NULL, "zb-auto %s p=%d m=%d at %gp failed", setting_names[set], p, m, units[k]);
          for (int r = 0; r < p; r++)
            CHECK_MSG(a->peak_memory_units[r] <= units[k] * p + 1e-9, "rank %d peak %g over %gp", r,
                      a->peak_memory_units[r], units[k]);
          double mk = a->makespan;
          zb_sim_result_free(a);
          /* the greedy is a heuristic: allow a hair, but no real regression */
          CHECK_MSG(mk <= prev * 1.02 + 1e-9, "%s p=%d m=%d: %gp gives %g, tighter limit gave %g",
                    setting_names[set], p, m, units[k], mk, prev);
          prev = mk < prev ? mk : prev;
        }
      }
}

/* B that grows memory (flash attention's profile, docs/model.md: M_B > 0,
 * W frees the rest): the costs are accepted and zb-auto still keeps every
 * rank's running peak, B included, within the limit. */
static void test_b_growing_memory(void) {
  static const double units[] = {1.5, 2, 3};
  for (int p = 2; p <= 8; p += 3)
    for (size_t k = 0; k < sizeof units / sizeof units[0]; k++) {
      zb_costs *c = make_costs(SET_UNEVEN, p, units[k] * p);
      for (int st = 0; st < p; st++)
        c->m_b[st] = 0.3 * c->m_f[st], c->m_w[st] = -1.3 * c->m_f[st];
      CHECK(zb_costs_check(c, NULL) == ZB_OK);
      zb_sim_result *a = plan_and_simulate(ZB_FAMILY_ZB_AUTO, p, 3 * p, c, ZB_OBJ_MAKESPAN, true);
      zb_costs_free(c);
      CHECK_MSG(a != NULL, "zb-auto p=%d at %gp with M_B > 0 failed", p, units[k]);
      for (int r = 0; a && r < p; r++)
        CHECK_MSG(a->peak_memory_units[r] <= units[k] * p + 1e-9, "rank %d peak %g over %gp", r,
                  a->peak_memory_units[r], units[k]);
      zb_sim_result_free(a);
    }
}

/* Below one microbatch's M_F nothing fits: a clear refusal. */
static void test_infeasible_limit_refused(void) {
  zb_costs *c = make_costs(SET_UNEVEN, 4, 0.9);
  zb_plan_request req = {.family = ZB_FAMILY_ZB_AUTO, .p = 4, .v = 1, .m = 8, .costs = c};
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  CHECK_EQ(zb_plan_generate(&req, &s, &d), ZB_ERR_INFEASIBLE);
  CHECK(s == NULL);
  CHECK_MSG(strstr(d.msg, "memory limit") && strstr(d.msg, "0.9"), "message: %s", d.msg);
  zb_costs_free(c);
}

/* Deterministic: the same request gives the same lists. */
static void test_deterministic(void) {
  zb_costs *c = make_costs(SET_STAGES, 8, 16);
  zb_plan_request req = {.family = ZB_FAMILY_ZB_AUTO, .p = 8, .v = 1, .m = 24, .costs = c};
  zb_schedule *a = NULL, *b = NULL;
  CHECK_EQ(zb_plan_generate(&req, &a, NULL), ZB_OK);
  CHECK_EQ(zb_plan_generate(&req, &b, NULL), ZB_OK);
  bool same = true;
  for (int r = 0; r < 8 && same; r++) {
    same = a->ranks[r].n == b->ranks[r].n;
    for (int i = 0; same && i < a->ranks[r].n; i++) {
      const zb_action *x = &a->ranks[r].actions[i], *y = &b->ranks[r].actions[i];
      same = x->op == y->op && x->stage == y->stage && x->mb == y->mb;
    }
  }
  zb_schedule_free(a);
  zb_schedule_free(b);
  zb_costs_free(c);
  CHECK(same);
}

ZBT_MAIN(ZBT(test_never_worse_makespan), ZBT(test_never_worse_span), ZBT(test_limits_honoured_and_monotone),
         ZBT(test_b_growing_memory), ZBT(test_infeasible_limit_refused), ZBT(test_deterministic))
