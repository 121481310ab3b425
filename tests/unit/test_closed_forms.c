/* The families' closed forms (docs/schedules.md, Families) at
 * T_F = T_B = T_W = 1 for one rank's share, T_comm = 0 and the default
 * memory deltas (M_F = 1, M_B = M_W = -0.5), so one rank's work is 3m and
 * memory is in units of one rank's M_F (1F1B's peak is p). Each shape is
 * generated with zb_plan_generate from zb_costs_from_rank_share, validated
 * and simulated with zb_simulate, over p in 1..16 and m in 1..64 (m a
 * multiple of p for interleaved-1f1b; v-half and v-min on their own grid,
 * see test_cf_v_half_v_min).
 *
 * Bounds this file proves over that grid (exact, both directions):
 *   1f1b, gpipe       bubble_ratio = (p-1)/(m+p-1) for every m.
 *   interleaved-1f1b  bubble_ratio = (p-1)/(v*m+p-1) for every m % p == 0,
 *                     v = 2, 3, 4 (the generator reaches it everywhere).
 *   zb-h1             bubble time = p-1 = (p-1)(T_F+T_B-T_W) iff m >= p;
 *                     for m < p it is 2p-1-m, the least any schedule can
 *                     have (see test_cf_zb_h1).
 *   zb-h2             bubble_ratio_paper = 0 iff m >= 2p-1.
 *   zb-v              bubble_ratio_paper = 0 iff m >= 2p-1 (the reference
 *                     needs 2p; the handcrafted ZB-V here gets 2p-1).
 * Below 2p-1 no schedule at all can reach a zero paper bubble, on either
 * placement (test_cf_zb_h2 and test_cf_zb_v derive why), so the m bounds
 * for zb-h2 and zb-v are the best possible. */
#include <stdarg.h>

#include "zb_planner.h"
#include "zbtest.h"

#define CF_EPS 1e-9
#define CF_PMAX 16
#define CF_MMAX 64

static int cf_reported;

/* Prints the first few failures of a test; counts all of them. */
__attribute__((format(printf, 2, 3))) static void cf_fail(int *failures, const char *fmt, ...) {
  (*failures)++;
  if (cf_reported++ >= 12)
    return;
  va_list ap;
  va_start(ap, fmt);
  fputs("  ", stderr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

/* Plans family f at (p, v, m) under unit rank-share costs (compute-only
 * lists: the closed forms leave comm out), validated and simulated. Returns the result (caller frees) or NULL
 * after reporting why. */
static zb_sim_result *cf_run(zb_family f, int p, int v, int m) {
  zb_planner_request req = {
      .family = f, .p = p, .v = v, .m = m, .rank = zb_rank_costs_default(), .compute_only = true};
  zb_planner_result pl;
  zb_diag d = {{0}};
  zb_sim_result *r = NULL;
  if (zb_planner_run(&req, &pl, &d) != ZB_OK)
    fprintf(stderr, "  %s p=%d v=%d m=%d: %s\n", zb_family_name(f), p, v, m, d.msg);
  else {
    r = pl.sim;
    pl.sim = NULL; /* kept past the result */
  }
  zb_planner_result_free(&pl);
  return r;
}

/* Largest peak memory over r's ranks, in units of one rank's M_F. */
static double cf_max_peak(const zb_sim_result *r) {
  double pk = 0;
  for (int k = 0; k < r->p; k++)
    if (r->peak_memory_units[k] > pk)
      pk = r->peak_memory_units[k];
  return pk;
}

static int cf_min(int a, int b) {
  return a < b ? a : b;
}

/* 1F1B and GPipe at even costs: rank 0 starts at 0 and ends last, after
 * its 3m of work and (p-1)(T_F+T_B+T_W) = 3(p-1) of bubble, so makespan =
 * S_max = 3(m+p-1) and both ratios are (p-1)/(m+p-1). */
static void test_cf_1f1b_gpipe_bubble(void) {
  const zb_family fams[] = {ZB_FAMILY_GPIPE, ZB_FAMILY_1F1B};
  int failures = 0, checked = 0;
  cf_reported = 0;
  for (int k = 0; k < 2; k++)
    for (int p = 1; p <= CF_PMAX; p++)
      for (int m = 1; m <= CF_MMAX; m++) {
        zb_sim_result *r = cf_run(fams[k], p, 1, m);
        if (!r) {
          failures++;
          continue;
        }
        double want = (double)(p - 1) / (m + p - 1);
        if (fabs(r->bubble_ratio - want) > CF_EPS || fabs(r->bubble_ratio_paper - want) > CF_EPS ||
            fabs(r->makespan - 3.0 * (m + p - 1)) > CF_EPS)
          cf_fail(&failures, "%s p=%d m=%d: bubble_ratio %.12g paper %.12g, want %.12g",
                  zb_family_name(fams[k]), p, m, r->bubble_ratio, r->bubble_ratio_paper, want);
        checked++;
        zb_sim_result_free(r);
      }
  CHECK_EQ(failures, 0);
  CHECK_EQ(checked, 2 * CF_PMAX * CF_MMAX);
}

/* 1F1B: rank r warms up with min(p-1-r, m) forwards and runs one more
 * before its first backward, so its peak is min(p-r, m) units: rank 0's
 * is min(p, m), 1F1B's p. GPipe holds all m forwards on every rank. */
static void test_cf_1f1b_gpipe_memory(void) {
  int failures = 0;
  cf_reported = 0;
  for (int p = 1; p <= CF_PMAX; p++)
    for (int m = 1; m <= CF_MMAX; m++) {
      zb_sim_result *a = cf_run(ZB_FAMILY_1F1B, p, 1, m), *g = cf_run(ZB_FAMILY_GPIPE, p, 1, m);
      if (!a || !g) {
        failures++;
      } else {
        for (int k = 0; k < p; k++)
          if (fabs(a->peak_memory_units[k] - cf_min(p - k, m)) > CF_EPS ||
              fabs(g->peak_memory_units[k] - m) > CF_EPS) {
            cf_fail(&failures, "p=%d m=%d rank %d: 1f1b peak %g (want %d), gpipe %g (want %d)", p, m, k,
                    a->peak_memory_units[k], cf_min(p - k, m), g->peak_memory_units[k], m);
            break;
          }
        if (fabs(a->peak_memory_units[0] - cf_min(p, m)) > CF_EPS || cf_max_peak(a) > p + CF_EPS)
          cf_fail(&failures, "p=%d m=%d: 1f1b rank-0 peak %g, max %g", p, m, a->peak_memory_units[0],
                  cf_max_peak(a));
      }
      zb_sim_result_free(a);
      zb_sim_result_free(g);
    }
  CHECK_EQ(failures, 0);
}

/* Interleaved 1F1B (Megatron): with v chunks the warm-up and cool-down
 * shrink to (p-1)(T_F+T_B+T_W)/v, so makespan = 3m + 3(p-1)/v and
 * bubble_ratio = (p-1)/(v*m+p-1). Memory: rank 0 warms up with (v-1)p +
 * 2(p-1) chunk forwards and runs one more before its first backward,
 * ((v+1)p-1)/v = p + (p-1)/v units (1 + (p-1)/(pv) of 1F1B's p), once m
 * >= 2p (at m = p it holds all m forwards: p units). */
static void test_cf_interleaved(void) {
  int failures = 0, checked = 0;
  cf_reported = 0;
  for (int v = 2; v <= 4; v++)
    for (int p = 1; p <= CF_PMAX; p++)
      for (int m = p; m <= CF_MMAX; m += p) {
        zb_sim_result *r = cf_run(ZB_FAMILY_INTERLEAVED_1F1B, p, v, m);
        if (!r) {
          failures++;
          continue;
        }
        double want = (double)(p - 1) / (v * m + p - 1);
        double pk0 = m >= 2 * p ? p + (double)(p - 1) / v : p;
        if (fabs(r->bubble_ratio - want) > CF_EPS ||
            fabs(r->makespan - (3.0 * m + 3.0 * (p - 1) / v)) > CF_EPS)
          cf_fail(&failures, "v=%d p=%d m=%d: bubble_ratio %.12g, want %.12g", v, p, m, r->bubble_ratio,
                  want);
        else if (fabs(r->peak_memory_units[0] - pk0) > CF_EPS)
          cf_fail(&failures, "v=%d p=%d m=%d: rank-0 peak %.12g, want %.12g", v, p, m,
                  r->peak_memory_units[0], pk0);
        checked++;
        zb_sim_result_free(r);
      }
  CHECK_EQ(failures, 0);
  CHECK(checked > 3 * 200);
}

/* ZB-H1. Bubble time (makespan - 3m, all of it on rank 0, the critical
 * rank, so also S_max - 3m) is (p-1)(T_F+T_B-T_W) = p-1 for every m >= p:
 * a third of 1F1B's 3(p-1), simulated alongside. It does not hold for any
 * m < p with p >= 2: rank 0's first B needs microbatch 0's forward through
 * all p stages and its backward through p-1 of them, so cannot start
 * before 2p-1; until then rank 0 can only run its m forwards, so it idles
 * at least 2p-1-m > p-1 and ends no earlier than 2p-1 + 2m. ZB-H1 reaches
 * that bound: bubble time exactly 2p-1-m for m < p. Memory: rank 0 holds
 * 1F1B's min(p, m); every rank stays within 1F1B's peak p. */
static void test_cf_zb_h1(void) {
  int failures = 0;
  cf_reported = 0;
  for (int p = 1; p <= CF_PMAX; p++)
    for (int m = 1; m <= CF_MMAX; m++) {
      zb_sim_result *r = cf_run(ZB_FAMILY_ZB_H1, p, 1, m), *a = cf_run(ZB_FAMILY_1F1B, p, 1, m);
      if (!r || !a) {
        failures++;
      } else {
        double bubble = r->makespan - 3.0 * m, span_bubble = r->max_span - 3.0 * m;
        double want = m >= p ? p - 1 : 2 * p - 1 - m;
        if (fabs(bubble - want) > CF_EPS || fabs(span_bubble - want) > CF_EPS)
          cf_fail(&failures, "zb-h1 p=%d m=%d: bubble time %g (span %g), want %g", p, m, bubble, span_bubble,
                  want);
        else if (m >= p && fabs(3 * bubble - (a->makespan - 3.0 * m)) > CF_EPS)
          cf_fail(&failures, "zb-h1 p=%d m=%d: bubble %g is not 1/3 of 1F1B's %g", p, m, bubble,
                  a->makespan - 3.0 * m);
        else if (fabs(r->peak_memory_units[0] - a->peak_memory_units[0]) > CF_EPS ||
                 cf_max_peak(r) > p + CF_EPS)
          cf_fail(&failures, "zb-h1 p=%d m=%d: peak rank 0 %g (1f1b %g), max %g > %d", p, m,
                  r->peak_memory_units[0], a->peak_memory_units[0], cf_max_peak(r), p);
      }
      zb_sim_result_free(r);
      zb_sim_result_free(a);
    }
  CHECK_EQ(failures, 0);
}

/* ZB-H2: bubble_ratio_paper is 0 exactly when m >= 2p-1. It cannot be 0
 * for m < 2p-1 on loop placement (p >= 2): rank 0's first B cannot start
 * before 2p-1 after its first F (see test_cf_zb_h1) and before it the rank
 * can run only its m forwards of length 1, so it idles inside its span.
 * At m >= 2p-1 every rank's span is its 3m of work; rank p-1 cannot start
 * before the forward chain reaches it at p-1, so makespan >= 3m + p-1, and
 * ZB-H2 meets that: bubble_ratio = (p-1)/(3m+p-1), the ramp-up that the
 * optimizer sync pays (post-validation removes it). Memory: rank 0 warms up
 * with 2(p-1) forwards and runs one more before its first B: min(2p-1, m)
 * units; no rank above 2p-1. */
static void test_cf_zb_h2(void) {
  int failures = 0;
  cf_reported = 0;
  for (int p = 1; p <= CF_PMAX; p++)
    for (int m = 1; m <= CF_MMAX; m++) {
      zb_sim_result *r = cf_run(ZB_FAMILY_ZB_H2, p, 1, m);
      if (!r) {
        failures++;
        continue;
      }
      if (m >= 2 * p - 1) {
        double want = (double)(p - 1) / (3 * m + p - 1);
        if (fabs(r->bubble_ratio_paper) > CF_EPS || fabs(r->max_span - 3.0 * m) > CF_EPS ||
            fabs(r->bubble_ratio - want) > CF_EPS)
          cf_fail(&failures, "zb-h2 p=%d m=%d: paper %.12g (want 0), bubble_ratio %.12g (want %.12g)", p, m,
                  r->bubble_ratio_paper, r->bubble_ratio, want);
      } else if (!(r->bubble_ratio_paper > CF_EPS)) {
        cf_fail(&failures, "zb-h2 p=%d m=%d: paper bubble %.12g below what any schedule can reach", p, m,
                r->bubble_ratio_paper);
      }
      if (fabs(r->peak_memory_units[0] - cf_min(2 * p - 1, m)) > CF_EPS ||
          cf_max_peak(r) > 2 * p - 1 + CF_EPS)
        cf_fail(&failures, "zb-h2 p=%d m=%d: peak rank 0 %g (want %d), max %g", p, m, r->peak_memory_units[0],
                cf_min(2 * p - 1, m), cf_max_peak(r));
      zb_sim_result_free(r);
    }
  CHECK_EQ(failures, 0);
}

/* ZB-V (V placement, v = 2; each chunk op takes 1/2): bubble_ratio_paper
 * is 0 exactly when m >= 2p-1. Below that no V schedule can reach 0:
 * stage 2p-1 (rank 0's second chunk) needs a microbatch's forward through
 * 2p-1 earlier stages, so rank 0 can run only stage-0 forwards (1/2 each)
 * for p - 1/2 after its first op, which m < 2p-1 of them cannot fill. At
 * m >= 2p-1 rank p-1 starts no earlier than (p-1)/2, so makespan >= 3m +
 * (p-1)/2, which ZB-V meets. Memory: every rank within 1F1B's p units; at
 * m >= 2p-1 rank 0 warms up with 2p-1 chunk-0 forwards (p - 1/2) and adds
 * a chunk-1 forward before its first B: exactly p. */
static void test_cf_zb_v(void) {
  int failures = 0, checked = 0;
  cf_reported = 0;
  for (int p = 1; p <= CF_PMAX; p++)
    for (int m = 1; m <= CF_MMAX; m++) {
      zb_sim_result *r = cf_run(ZB_FAMILY_ZB_V, p, 2, m);
      if (!r) {
        failures++;
        continue;
      }
      checked++;
      if (m >= 2 * p - 1) {
        if (fabs(r->bubble_ratio_paper) > CF_EPS || fabs(r->makespan - (3.0 * m + (p - 1) / 2.0)) > CF_EPS)
          cf_fail(&failures, "zb-v p=%d m=%d: paper %.12g (want 0), makespan %g (want %g)", p, m,
                  r->bubble_ratio_paper, r->makespan, 3.0 * m + (p - 1) / 2.0);
        else if (fabs(r->peak_memory_units[0] - p) > CF_EPS)
          cf_fail(&failures, "zb-v p=%d m=%d: rank-0 peak %g, want %d", p, m, r->peak_memory_units[0], p);
      } else if (!(r->bubble_ratio_paper > CF_EPS)) {
        cf_fail(&failures, "zb-v p=%d m=%d: paper bubble %.12g below what any schedule can reach", p, m,
                r->bubble_ratio_paper);
      }
      if (cf_max_peak(r) > p + CF_EPS)
        cf_fail(&failures, "zb-v p=%d m=%d: peak %g above 1F1B's %d", p, m, cf_max_peak(r), p);
      zb_sim_result_free(r);
    }
  CHECK_EQ(failures, 0);
  CHECK_EQ(checked, CF_PMAX * CF_MMAX);
}

/* V-Half and V-Min, built from their repeating blocks (zb_plan_vblock.c),
 * against the closed forms of "Pipeline Parallelism with Controllable
 * Memory" at equal costs: activation memory within (p+2)/2 and (p+4)/3
 * microbatches, bubble_ratio_paper within p/(2m) and 2p/(3m), for p = 4..32
 * and m = 2p..8p (a grid through that range: the full one is a bench's
 * job, slow under sanitizers). Memory is in units of one rank's M_F, one
 * microbatch's activations over the rank's whole share of the model (both
 * chunks; 1F1B's peak is p), under two conventions: zb's default
 * (M_F = 1, M_B = M_W = -1/2: B frees what W does not need) and the
 * paper's (M_F = 1, M_B = 0, M_W = -1: everything stays until W). Prints
 * the worst ratio of each to its bound. */
static void test_cf_v_half_v_min(void) {
  const zb_family fams[] = {ZB_FAMILY_V_HALF, ZB_FAMILY_V_MIN};
  const int ps[] = {4, 5, 6, 8, 11, 16, 24, 32};
  const double mem_b[] = {-0.5, 0}, mem_w[] = {-0.5, -1};
  int failures = 0;
  cf_reported = 0;
  for (int k = 0; k < 2; k++)
    for (int conv = 0; conv < 2; conv++) {
      double worst_mem = 0, worst_bubble = 0;
      for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++) {
        int p = ps[i];
        const int ms[] = {2 * p, 2 * p + 1, 3 * p, 4 * p, 5 * p + 3, 8 * p};
        for (size_t j = 0; j < sizeof ms / sizeof ms[0]; j++) {
          int m = ms[j];
          zb_planner_request req = {.family = fams[k], .p = p, .v = 2, .m = m, .compute_only = true};
          req.rank = zb_rank_costs_default();
          req.rank.m_b = mem_b[conv];
          req.rank.m_w = mem_w[conv];
          zb_planner_result pl;
          zb_diag d = {{0}};
          if (zb_planner_run(&req, &pl, &d) != ZB_OK) {
            cf_fail(&failures, "%s p=%d m=%d: %s", zb_family_name(fams[k]), p, m, d.msg);
            continue;
          }
          double pk = cf_max_peak(pl.sim), paper = pl.sim->bubble_ratio_paper;
          double mem_bound = k == 0 ? (p + 2) / 2.0 : (p + 4) / 3.0;
          double bubble_bound = k == 0 ? p / (2.0 * m) : 2.0 * p / (3.0 * m);
          if (pk > mem_bound + CF_EPS || paper > bubble_bound + CF_EPS)
            cf_fail(&failures, "%s p=%d m=%d (M_B %g): peak %g (bound %g), paper bubble %.4f (bound %.4f)",
                    zb_family_name(fams[k]), p, m, mem_b[conv], pk, mem_bound, paper, bubble_bound);
          worst_mem = pk / mem_bound > worst_mem ? pk / mem_bound : worst_mem;
          worst_bubble = paper / bubble_bound > worst_bubble ? paper / bubble_bound : worst_bubble;
          zb_planner_result_free(&pl);
        }
      }
      printf("  %s, M_B = %g, M_W = %g: worst peak %.3f of its bound, worst paper bubble %.3f of its bound\n",
             zb_family_name(fams[k]), mem_b[conv], mem_w[conv], worst_mem, worst_bubble);
    }
  CHECK_EQ(failures, 0);
}

/* The two bubble ratios are named apart: at m >= 2p-1 ZB-H2 and ZB-V have
 * no bubble inside any rank's span (bubble_ratio_paper = 0) but the global
 * bubble_ratio still counts the ramp-up the optimizer sync pays, (p-1)T_F
 * on loop placement and (p-1)T_F/2 on V: (p-1)/(3m+p-1) and
 * ((p-1)/2)/(3m+(p-1)/2). */
static void test_cf_bubble_ratios_named_apart(void) {
  int failures = 0;
  cf_reported = 0;
  for (int p = 2; p <= CF_PMAX; p++) {
    const int ms[] = {2 * p - 1, 2 * p, CF_MMAX};
    for (int j = 0; j < 3; j++) {
      int m = ms[j];
      zb_sim_result *h2 = cf_run(ZB_FAMILY_ZB_H2, p, 1, m), *zv = cf_run(ZB_FAMILY_ZB_V, p, 2, m);
      if (!h2 || !zv) {
        failures++;
      } else {
        double want_h2 = (p - 1.0) / (3.0 * m + p - 1), want_v = (p - 1) / 2.0 / (3.0 * m + (p - 1) / 2.0);
        if (!(h2->bubble_ratio > 1e-6) || fabs(h2->bubble_ratio_paper) > CF_EPS ||
            fabs(h2->bubble_ratio - want_h2) > CF_EPS)
          cf_fail(&failures, "zb-h2 p=%d m=%d: bubble_ratio %.12g paper %.12g", p, m, h2->bubble_ratio,
                  h2->bubble_ratio_paper);
        if (!(zv->bubble_ratio > 1e-6) || fabs(zv->bubble_ratio_paper) > CF_EPS ||
            fabs(zv->bubble_ratio - want_v) > CF_EPS)
          cf_fail(&failures, "zb-v p=%d m=%d: bubble_ratio %.12g paper %.12g", p, m, zv->bubble_ratio,
                  zv->bubble_ratio_paper);
      }
      zb_sim_result_free(h2);
      zb_sim_result_free(zv);
    }
  }
  CHECK_EQ(failures, 0);
}

ZBT_MAIN(ZBT(test_cf_1f1b_gpipe_bubble), ZBT(test_cf_1f1b_gpipe_memory), ZBT(test_cf_interleaved),
         ZBT(test_cf_zb_h1), ZBT(test_cf_zb_h2), ZBT(test_cf_zb_v), ZBT(test_cf_v_half_v_min),
         ZBT(test_cf_bubble_ratios_named_apart))
