/* zb against the Zero Bubble authors' own generators over their reference
 * grid (tests/data/zb_authors_grid.csv: p in {4, 8, 16, 32}, m in {p, 2p,
 * 4p, 8p}, equal costs and 1:1.2:0.8:0.05, memory M = 1, 0, -1; their
 * lists figured by zb, compute-only; 280 of the 288 points, as their
 * ZB-H2 has no order at m = p). Each row's zb counterpart is planned
 * at the row's peak, compute-only as the row is, and its paper bubble
 * ratio must be no higher than theirs (to 5e-5, the 4 decimals such
 * figures are printed with): 1F1B, interleaved 1F1B (2 chunks), ZB-H1,
 * ZB-H2 and ZB-V as themselves, V-Half and V-Min within the row's peak, their
 * automatic schedules at 1p and 2p memory against zb-auto (every
 * placement, the span objective, the paper's) at that limit.
 *
 * The points zb does not yet reach are listed below by name: the test
 * says how far each is behind and fails if any other point falls behind,
 * or if a listed one is reached (then it leaves the list). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_planner.h"
#include "zbtest.h"

#define GRID_CSV ZB_TEST_DATA_DIR "/zb_authors_grid.csv"
#define TOL 5e-5

typedef struct grid_row {
  char gen[24], costs[8];
  int p, m;
  double peak, bubble;
} grid_row;

/* Points still behind the authors (docs/schedules.md, Against the
 * authors' generators), ended by a NULL gen: none at present. The last
 * seven closed were zb-auto within 2p at p=4, m=8 under uneven costs
 * (0.0607 against 0.0588; the greedy run that evens the ranks' idle time
 * out) and V-Half at p >= 16 under uneven costs (0.3-4% behind; the held
 * squeeze). */
static const struct {
  const char *gen;
  int p, m;
  const char *costs;
} open_points[] = {
    {NULL, 0, 0, NULL},
};

static bool is_open(const grid_row *g) {
  for (size_t k = 0; open_points[k].gen; k++)
    if (strcmp(open_points[k].gen, g->gen) == 0 && open_points[k].p == g->p && open_points[k].m == g->m &&
        strcmp(open_points[k].costs, g->costs) == 0)
      return true;
  return false;
}

static int read_grid(grid_row *rows, int cap) {
  FILE *f = fopen(GRID_CSV, "r");
  if (!f)
    return -1;
  char line[256];
  int n = 0;
  while (fgets(line, sizeof line, f) && n < cap) {
    grid_row g;
    double makespan;
    if (line[0] == '#' || sscanf(line, "%23[^,],%d,%d,%7[^,],%lf,%lf,%lf", g.gen, &g.p, &g.m, g.costs,
                                 &g.peak, &g.bubble, &makespan) != 7)
      continue;
    rows[n++] = g;
  }
  fclose(f);
  return n;
}

/* zb's paper bubble for row g, or NAN when it does not plan. */
static double zb_bubble(const grid_row *g) {
  zb_rank_costs rc = {.t_f = 1, .t_b = 1, .t_w = 1, .m_f = 1, .m_b = 0, .m_w = -1};
  if (strcmp(g->costs, "uneven") == 0)
    rc.t_b = 1.2, rc.t_w = 0.8, rc.t_comm = 0.05;
  static const struct {
    const char *gen;
    zb_family f;
    int v;
    bool limited;
  } map[] = {
      {"1f1b", ZB_FAMILY_1F1B, 0, false},    {"interleaved-1f1b", ZB_FAMILY_INTERLEAVED_1F1B, 2, false},
      {"zb-h1", ZB_FAMILY_ZB_H1, 0, false},  {"zb-h2", ZB_FAMILY_ZB_H2, 0, false},
      {"zb-1p", ZB_FAMILY_ZB_AUTO, 0, true}, {"zb-2p", ZB_FAMILY_ZB_AUTO, 0, true},
      {"zb-v", ZB_FAMILY_ZB_V, 0, false},    {"v-half", ZB_FAMILY_V_HALF, 0, true},
      {"v-min", ZB_FAMILY_V_MIN, 0, true}};
  for (size_t k = 0; k < sizeof map / sizeof map[0]; k++) {
    if (strcmp(map[k].gen, g->gen) != 0)
      continue;
    zb_planner_request req = {.family = map[k].f,
                              .p = g->p,
                              .v = map[k].v,
                              .m = g->m,
                              .rank = rc,
                              .mem_limit = map[k].limited ? g->peak : 0,
                              .objective = ZB_OBJ_SPAN,
                              .compute_only = true};
    zb_planner_result r;
    double b = NAN;
    if (zb_planner_run(&req, &r, NULL) == ZB_OK && zb_sim_max_peak(r.sim) <= g->peak + 1e-9)
      b = r.sim->bubble_ratio_paper;
    zb_planner_result_free(&r);
    return b;
  }
  return NAN;
}

static void test_at_or_below_the_authors(void) {
  static grid_row rows[320];
  int n = read_grid(rows, 320);
  CHECK_MSG(n == 280, "%s: %d rows", GRID_CSV, n);
  int behind = 0, still_open = 0, reached_open = 0;
  for (int k = 0; k < n; k++) {
    const grid_row *g = &rows[k];
    double b = zb_bubble(g);
    bool ok = b <= g->bubble + TOL;
    if (is_open(g)) {
      printf("  open: %-7s p=%-2d m=%-3d %-6s zb %.4f, the authors' %.4f\n", g->gen, g->p, g->m, g->costs, b,
             g->bubble);
      still_open += !ok;
      reached_open += ok;
    } else if (!ok) {
      fprintf(stderr, "  behind: %s p=%d m=%d %s: zb %.4f, the authors' %.4f (peak %g)\n", g->gen, g->p, g->m,
              g->costs, b, g->bubble, g->peak);
      behind++;
    }
  }
  printf("  %d points: %d at or below the authors, %d open\n", n, n - behind - still_open, still_open);
  CHECK_EQ(behind, 0);
  CHECK_MSG(reached_open == 0, "%d listed open points are reached: take them off the list", reached_open);
}

ZBT_MAIN(ZBT(test_at_or_below_the_authors))
