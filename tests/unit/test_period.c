/* test_period — a schedule's steady state repeated more or fewer times
 * (lib/zb_period.c): the lists it gives are the generator's own for
 * the longer run, it refuses what has no period, and large plans made
 * through it are valid and meet their families' bounds. */
#include "zb_lower.h"
#include "zb_period.h"
#include "zb_plan.h"
#include "zb_plan_internal.h"
#include "zb_planner.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbtest.h"

static zb_costs *costs_of_v(int p, int v, bool uneven) {
  zb_rank_costs rc = zb_rank_costs_default();
  if (uneven) /* the paper's T_F:T_B:T_W:T_comm */
    rc.t_f = 1, rc.t_b = 1.2, rc.t_w = 0.8, rc.t_comm = 0.05;
  return zb_costs_from_rank_share(p, v, &rc, 0);
}

static zb_costs *costs_of(int p, bool uneven) {
  return costs_of_v(p, 2, uneven);
}

/* The family's generator for m microbatches in full, not through
 * zb_plan_generate (which prolongs large plans); short_run: as
 * zb_plan_generate plans the short run it prolongs. */
static zb_schedule *direct(zb_family f, int p, int m, const zb_costs *c, bool short_run) {
  zb_plan_request r = {.family = f, .p = p, .v = 2, .m = m, .short_run = short_run};
  zb_schedule *s = NULL;
  zb_diag d = {{0}};
  zb_err err =
      f == ZB_FAMILY_ZB_INTERLEAVED ? zb_plan_zb_interleaved(&r, c, &s, &d) : zb_plan_v_family(&r, c, &s, &d);
  return err ? NULL : s;
}

/* Whether a and b hold the same lists (a NULL one holds none); where:
 * the first place they differ, for the message. */
static bool same_lists(const zb_schedule *a, const zb_schedule *b, char *where, size_t len) {
  snprintf(where, len, "%s", a && b ? "" : "a missing schedule");
  for (int r = 0; a && b && r < a->p; r++) {
    const zb_rank_list *x = &a->ranks[r], *y = &b->ranks[r];
    for (int i = 0; i < x->n || i < y->n; i++)
      if (i >= x->n || i >= y->n || x->actions[i].op != y->actions[i].op ||
          x->actions[i].stage != y->actions[i].stage || x->actions[i].mb != y->actions[i].mb ||
          x->actions[i].peer != y->actions[i].peer || x->actions[i].batch != y->actions[i].batch) {
        snprintf(where, len, "rank %d action %d", r, i);
        return false;
      }
  }
  return a && b;
}

/* A short run of each family, prolonged, is the long run's lists exactly:
 * both cost settings for the V families, equal costs for zb-interleaved
 * (under uneven costs its W placed by timing often has no period, and
 * where a short run has one it may end a little differently: valid, and
 * at p = 2 shorter). */
static void test_prolonged_equals_full(void) {
  static const struct {
    zb_family f;
    bool uneven;
  } cases[] = {
      {ZB_FAMILY_V_HALF, false}, {ZB_FAMILY_V_HALF, true},          {ZB_FAMILY_V_MIN, false},
      {ZB_FAMILY_V_MIN, true},   {ZB_FAMILY_ZB_INTERLEAVED, false},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++)
    for (int p = 64; p <= 128; p *= 2) {
      zb_costs *c = costs_of(p, cases[k].uneven);
      int m = (cases[k].f == ZB_FAMILY_ZB_INTERLEAVED ? 16 : 8) * p, q;
      zb_plan_request r = {.family = cases[k].f, .p = p, .v = 2, .m = m};
      int base = zb_plan_short_run(&r, &q); /* the run zb_plan_generate plans */
      CHECK_MSG(base > 0, "%s p=%d m=%d: no short run", zb_family_name(cases[k].f), p, m);
      zb_schedule *full = direct(cases[k].f, p, m, c, false), *run = direct(cases[k].f, p, base, c, true);
      zb_schedule *ext = run ? zb_period_extend(run, m, q) : NULL;
      CHECK_MSG(full && ext, "%s p=%d uneven=%d: no schedule", zb_family_name(cases[k].f), p,
                cases[k].uneven);
      char at[64];
      CHECK_MSG(same_lists(full, ext, at, sizeof at), "%s p=%d uneven=%d: lists differ at %s",
                zb_family_name(cases[k].f), p, cases[k].uneven, at);
      zb_schedule_free(full);
      zb_schedule_free(run);
      zb_schedule_free(ext);
      zb_costs_free(c);
    }
}

/* Taking periods out and putting them back gives the plan again, for
 * families that repeat every microbatch and every round of p. */
static void test_shrink_then_extend(void) {
  static const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_V, ZB_FAMILY_INTERLEAVED_1F1B};
  int p = 32, m = 512;
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
    int v = zb_family_default_chunks(fams[f]), q = fams[f] == ZB_FAMILY_INTERLEAVED_1F1B ? p : 1;
    zb_costs *c = costs_of_v(p, v, false);
    zb_plan_request r = {.family = fams[f], .p = p, .v = v, .m = m, .costs = c};
    zb_schedule *s = NULL;
    zb_diag d = {{0}};
    CHECK_EQ(zb_plan_generate(&r, &s, &d), ZB_OK);
    zb_schedule *run = zb_period_shrink(s, q, 3), *back = run ? zb_period_extend(run, m, q) : NULL;
    CHECK_MSG(run && run->m < m && (m - run->m) % q == 0, "%s: shrunk to %d", zb_family_name(fams[f]),
              run ? run->m : -1);
    char at[64];
    CHECK_MSG(same_lists(back, s, at, sizeof at), "%s: not the plan again (%s)", zb_family_name(fams[f]), at);
    zb_schedule_free(s);
    zb_schedule_free(run);
    zb_schedule_free(back);
    zb_costs_free(c);
  }
}

/* What has no period is refused, not repeated wrongly. */
static void test_refuses_without_period(void) {
  zb_costs *c = costs_of(8, false);
  zb_schedule *vh = direct(ZB_FAMILY_V_HALF, 8, 64, c, false),
              *short_run = direct(ZB_FAMILY_V_HALF, 8, 8, c, true);
  CHECK(vh && short_run);
  zb_schedule *fewer = zb_period_extend(vh, 32, 1);
  CHECK_MSG(!fewer, "fewer microbatches than the run");
  zb_schedule *off = zb_period_extend(vh, 101, 2);
  CHECK_MSG(!off, "101 - 64 is not a multiple of the period 2");
  /* 8 microbatches on 8 ranks: warm-up and cool-down, no steady state */
  zb_schedule *none = zb_period_extend(short_run, 64, 1);
  CHECK_MSG(!none, "a run with no three periods of steady state");
  /* comm actions: not a generator's output */
  zb_schedule *comm = zb_schedule_clone(vh);
  zb_schedule_push(comm, 0, (zb_action){.op = ZB_OP_SEND_F, .stage = 0, .mb = 0, .peer = 1});
  zb_schedule *lowered = zb_period_extend(comm, 80, 1);
  CHECK_MSG(!lowered, "lists with comm actions");
  /* a marker (no microbatch to move on) in rank 0's warm-up, outside its
   * stretch: refused all the same */
  zb_schedule *marked = zb_schedule_clone(vh);
  marked->ranks[0].actions[0].op = ZB_OP_UNSHARD;
  zb_schedule *marked_long = zb_period_extend(marked, 80, 1);
  CHECK_MSG(!marked_long, "lists with a marker");
  zb_schedule_free(marked);
  zb_schedule_free(marked_long);
  /* one action out of step breaks rank 3's period: no stretch left long
   * enough in a run this short */
  zb_schedule *broken = direct(ZB_FAMILY_V_HALF, 8, 24, c, true);
  for (int i = 0; broken && i + 1 < broken->ranks[3].n; i += 12) {
    zb_action t = broken->ranks[3].actions[i];
    broken->ranks[3].actions[i] = broken->ranks[3].actions[i + 1];
    broken->ranks[3].actions[i + 1] = t;
  }
  zb_schedule *bad = broken ? zb_period_extend(broken, 64, 1) : NULL;
  CHECK_MSG(broken && !bad, "a rank whose order never repeats");
  /* a W out of microbatch order, after the stretch: moving what follows a
   * cut would make it a second W of a later microbatch */
  zb_schedule *late = zb_schedule_new(1, 1, 10, ZB_PLACE_LOOP);
  zb_schedule_push_op(late, 0, ZB_OP_F, 0, 0);
  zb_schedule_push_op(late, 0, ZB_OP_B, 0, 0);
  for (int mb = 1; mb < 10; mb++) {
    zb_schedule_push_op(late, 0, ZB_OP_F, 0, mb);
    zb_schedule_push_op(late, 0, ZB_OP_B, 0, mb);
    zb_schedule_push_op(late, 0, ZB_OP_W, 0, mb);
  }
  zb_schedule_push_op(late, 0, ZB_OP_W, 0, 0);
  zb_schedule *late_long = zb_period_extend(late, 20, 1), *late_short = zb_period_shrink(late, 1, 3);
  CHECK_MSG(!late_long && !late_short, "a list out of microbatch order");
  /* a period longer than the run: refused, not an overflow */
  zb_schedule *huge = zb_period_extend(vh, vh->m, 400000000);
  CHECK_MSG(!huge, "a period of 400 million microbatches");
  zb_schedule_free(late);
  zb_schedule_free(late_long);
  zb_schedule_free(late_short);
  zb_schedule_free(huge);
  zb_schedule *good = zb_period_extend(vh, 80, 1);
  CHECK_MSG(good && good->m == 80 && good->ranks[0].n == vh->ranks[0].n + 16 * 6, "a true steady state");
  zb_schedule_free(vh);
  zb_schedule_free(short_run);
  zb_schedule_free(comm);
  zb_schedule_free(broken);
  zb_schedule_free(good);
  zb_costs_free(c);
}

/* Short runs whose ranks each repeat a pattern of the warm-up for a while
 * (V-Half at p = 32 with 36 microbatches: prolonged, it deadlocks): what
 * comes back from any run length is valid. */
static void test_any_run_length_valid(void) {
  zb_costs *c = costs_of(32, false);
  int prolonged = 0;
  for (int f = 0; f < 2; f++)
    for (int m = 16; m <= 80; m++) {
      zb_family fam = f ? ZB_FAMILY_V_MIN : ZB_FAMILY_V_HALF;
      zb_schedule *run = direct(fam, 32, m, c, true), *ext = run ? zb_period_extend(run, m + 40, 1) : NULL;
      zb_violation why;
      prolonged += ext != NULL;
      CHECK_MSG(!ext || zb_validate(ext, c, &why) == ZB_OK, "%s: a run of %d prolonged is invalid",
                zb_family_name(fam), m);
      zb_schedule_free(run);
      zb_schedule_free(ext);
    }
  CHECK_MSG(prolonged >= 20, "only %d of the runs were prolonged", prolonged);
  zb_costs_free(c);
  /* zb-interleaved repeats every p microbatches, and two periods make a
   * stretch there: every run length a multiple of p apart from the long
   * one */
  c = costs_of(16, false);
  for (int m = 32; m <= 160; m += 16) {
    zb_schedule *run = direct(ZB_FAMILY_ZB_INTERLEAVED, 16, m, c, true);
    zb_schedule *ext = run ? zb_period_extend(run, m + 64, 16) : NULL;
    zb_violation why;
    CHECK_MSG(!ext || zb_validate(ext, c, &why) == ZB_OK, "zb-interleaved: a run of %d prolonged is invalid",
              m);
    zb_schedule_free(run);
    zb_schedule_free(ext);
  }
  zb_costs_free(c);
}

/* Large plans are lowered through their steady state (a short run
 * lowered, its period repeated): the lists of the full merge, for the
 * families that repeat every microbatch, under both cost settings (where
 * uneven costs break the timeline's period, lowering merges in full). */
static void test_lowered_through_period(void) {
  static const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_V, ZB_FAMILY_V_HALF,
                                   ZB_FAMILY_V_MIN};
  int p = 64;
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++)
    for (int uneven = 0; uneven <= 1; uneven++) {
      int v = zb_family_default_chunks(fams[f]), m = 2048 / v;
      zb_costs *c = costs_of_v(p, v, uneven);
      zb_plan_request r = {.family = fams[f], .p = p, .m = m, .costs = c};
      zb_schedule *s = NULL, *fast = NULL, *full = NULL;
      zb_diag d = {{0}};
      CHECK_EQ(zb_plan_generate(&r, &s, &d), ZB_OK);
      zb_schedule *run = zb_period_shrink(s, 1, 5);
      CHECK_MSG(run && 2 * run->m <= m, "%s: a short run of %d", zb_family_name(fams[f]), run ? run->m : -1);
      CHECK_EQ(zb_lower(s, c, &fast, &d), ZB_OK);
      CHECK_EQ(zb_lower_full_par(s, c, NULL, &full, &d), ZB_OK);
      char at[64];
      CHECK_MSG(same_lists(fast, full, at, sizeof at), "%s uneven=%d: lowered lists differ at %s",
                zb_family_name(fams[f]), uneven, at);
      zb_schedule_free(run);
      zb_schedule_free(s);
      zb_schedule_free(fast);
      zb_schedule_free(full);
      zb_costs_free(c);
    }
}

/* The generators' own short runs lower the plan (zb_plan_generate_run,
 * zb_lower_par_run): the full merge's lists; a lowered plan is refused
 * as zb_lower refuses it. */
static void test_lowered_from_generator_run(void) {
  static const zb_family fams[] = {ZB_FAMILY_V_HALF, ZB_FAMILY_V_MIN, ZB_FAMILY_ZB_INTERLEAVED};
  int p = 64, m = 1024;
  for (size_t f = 0; f < sizeof fams / sizeof fams[0]; f++) {
    zb_costs *c = costs_of(p, false);
    zb_plan_request r = {.family = fams[f], .p = p, .m = m, .costs = c};
    zb_schedule *s = NULL, *run = NULL, *fast = NULL, *full = NULL, *again = NULL;
    int period = 0;
    zb_diag d = {{0}};
    CHECK_EQ(zb_plan_generate_run(&r, &s, &run, &period, &d), ZB_OK);
    CHECK_MSG(run && run->m < m && period == (fams[f] == ZB_FAMILY_ZB_INTERLEAVED ? p : 1),
              "%s: run %d, period %d", zb_family_name(fams[f]), run ? run->m : -1, period);
    CHECK_EQ(zb_lower_par_run(s, run, period, c, NULL, &fast, &d), ZB_OK);
    CHECK_EQ(zb_lower_full_par(s, c, NULL, &full, &d), ZB_OK);
    char at[64];
    CHECK_MSG(same_lists(fast, full, at, sizeof at), "%s: lowered lists differ at %s",
              zb_family_name(fams[f]), at);
    CHECK_EQ(zb_lower_par_run(full, run, period, c, NULL, &again, &d), ZB_ERR_INVALID_ARG);
    zb_schedule_free(s);
    zb_schedule_free(run);
    zb_schedule_free(fast);
    zb_schedule_free(full);
    zb_costs_free(c);
  }
}

/* Large plans through zb_plan_generate: valid, within the family's limit,
 * and at equal costs within the closed forms (V-Half p/(2m), V-Min
 * 2p/(3m)); zb-interleaved under uneven costs too, whose W placed by
 * timing often has no period (then it is planned in full). */
static void test_large_plans(void) {
  int p = 64, m = 1024;
  /* activation memory in units of one rank's M_F (test_plan_grid's
   * convention); zb-interleaved's is interleaved-1f1b's warm-up of
   * (v-1)p + 2(p-1) + 1 chunk forwards at 1/v each */
  const struct {
    zb_family f;
    bool uneven;
    double bound, units;
  } cases[] = {
      {ZB_FAMILY_V_HALF, false, 0.5, (p + 2) / 2.0},
      {ZB_FAMILY_V_MIN, false, 2.0 / 3.0, (p + 4) / 3.0},
      {ZB_FAMILY_ZB_INTERLEAVED, false, 0, (p + 2 * (p - 1) + 1) / 2.0},
      {ZB_FAMILY_ZB_INTERLEAVED, true, 0, (p + 2 * (p - 1) + 1) / 2.0},
  };
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    zb_costs *c = costs_of(p, cases[k].uneven);
    zb_plan_request r = {.family = cases[k].f, .p = p, .m = m, .costs = c};
    int q;
    CHECK_MSG(zb_plan_short_run(&r, &q) > 0, "%s p=%d m=%d is prolonged", zb_family_name(r.family), p, m);
    zb_schedule *s = NULL;
    zb_diag d = {{0}};
    CHECK_MSG(zb_plan_generate(&r, &s, &d) == ZB_OK, "%s: %s", zb_family_name(r.family), d.msg);
    zb_violation why;
    CHECK_MSG(zb_validate(s, c, &why) == ZB_OK, "%s: invalid", zb_family_name(r.family));
    zb_sim_result *sim = NULL;
    CHECK(zb_simulate_figures(s, c, &sim, &d) == ZB_OK);
    double bound = cases[k].bound * p / m;
    CHECK_MSG(cases[k].bound == 0 || sim->bubble_ratio_paper <= bound + 1e-9, "%s: bubble %.4f above %.4f",
              zb_family_name(r.family), sim->bubble_ratio_paper, bound);
    CHECK_MSG(zb_sim_max_peak(sim) <= cases[k].units + 1e-9, "%s: peak %.2f above %.2f M_F",
              zb_family_name(r.family), zb_sim_max_peak(sim), cases[k].units);
    zb_sim_result_free(sim);
    zb_schedule_free(s);
    zb_costs_free(c);
  }
}

ZBT_MAIN({"prolonged_equals_full", test_prolonged_equals_full},
         {"refuses_without_period", test_refuses_without_period},
         {"shrink_then_extend", test_shrink_then_extend}, {"any_run_length_valid", test_any_run_length_valid},
         {"lowered_through_period", test_lowered_through_period},
         {"lowered_from_generator_run", test_lowered_from_generator_run}, {"large_plans", test_large_plans})
