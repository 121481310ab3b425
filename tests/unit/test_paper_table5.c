/* The Zero Bubble paper's Table 5 (tests/data/zb_paper_table5.csv): with
 * its profiled costs, shapes and memory model, 1f1b, zb-h1 and zb-h2
 * reproduce the bubble rates it reports, and zb-auto at limits 1p and 2p
 * matches or beats its ZB-1p and ZB-2p rates. All figures are the paper's
 * bubble rate (bubble_ratio_paper, docs/schedules.md, Bubble definitions), compared to 4 decimals, the
 * precision the paper prints. */
#include <errno.h>

#include "zb_planner.h"
#include "zbtest.h"

enum {
  COL_MODEL,
  COL_LAYERS,
  COL_HEADS,
  COL_HIDDEN,
  COL_SEQ,
  COL_P,
  COL_M,
  COL_TF,
  COL_TB,
  COL_TW,
  COL_TCOMM,
  COL_1F1B,
  COL_1F1B_I,
  COL_ZB_H1,
  COL_ZB_H2,
  COL_ZB_1P,
  COL_ZB_2P,
  N_COLS
};

static const char *const col_names[N_COLS] = {"model",
                                              "layers",
                                              "heads",
                                              "hidden",
                                              "seq",
                                              "p",
                                              "m",
                                              "T_F",
                                              "T_B",
                                              "T_W",
                                              "T_comm",
                                              "bubble_1F1B",
                                              "bubble_1F1B_I",
                                              "bubble_ZB_H1",
                                              "bubble_ZB_H2",
                                              "bubble_ZB_1p",
                                              "bubble_ZB_2p"};

typedef struct paper_row {
  char model[16];
  double v[N_COLS];
} paper_row;

/* Reads the CSV: '#' lines are comments, the first other line the header
 * (checked against col_names), then one row per setting. */
static int load_rows(paper_row *rows, int max) {
  char path[512];
  snprintf(path, sizeof path, "%s/zb_paper_table5.csv", ZB_TEST_DATA_DIR);
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "  cannot open %s: %s\n", path, strerror(errno));
    return -1;
  }
  char line[1024];
  int n = 0;
  bool header = false;
  while (fgets(line, sizeof line, f)) {
    if (line[0] == '#' || line[0] == '\n')
      continue;
    line[strcspn(line, "\r\n")] = 0;
    char *save = NULL, *tok = strtok_r(line, ",", &save);
    if (!header) {
      for (int k = 0; k < N_COLS; k++, tok = strtok_r(NULL, ",", &save))
        if (!tok || strcmp(tok, col_names[k]) != 0) {
          fprintf(stderr, "  header column %d is '%s', expected '%s'\n", k, tok ? tok : "", col_names[k]);
          fclose(f);
          return -1;
        }
      header = true;
      continue;
    }
    if (n == max)
      break;
    paper_row *r = &rows[n];
    int k = 0;
    for (; k < N_COLS && tok; k++, tok = strtok_r(NULL, ",", &save)) {
      if (k == COL_MODEL)
        snprintf(r->model, sizeof r->model, "%s", tok);
      else
        r->v[k] = strtod(tok, NULL);
    }
    if (k != N_COLS) {
      fprintf(stderr, "  row %d has %d columns\n", n + 1, k);
      fclose(f);
      return -1;
    }
    n++;
  }
  fclose(f);
  return n;
}

/* The paper's memory model (Table 1, s = 1024): per microbatch F keeps
 * M_B = 34h + 5as, B frees M_B - M_W, W frees M_W = 32h. In units of M_B,
 * which is our M_F, so the limit np is n*p. */
static zb_costs *row_costs(const paper_row *r, double limit_p) {
  double h = r->v[COL_HIDDEN], a = r->v[COL_HEADS], s = r->v[COL_SEQ];
  double mb = 34 * h + 5 * a * s, mw = 32 * h;
  zb_rank_costs rc = {.t_f = r->v[COL_TF],
                      .t_b = r->v[COL_TB],
                      .t_w = r->v[COL_TW],
                      .t_comm = r->v[COL_TCOMM],
                      .m_f = 1,
                      .m_b = -(mb - mw) / mb,
                      .m_w = -mw / mb};
  int p = (int)r->v[COL_P];
  return zb_costs_from_rank_share(p, 1, &rc, limit_p * p);
}

/* bubble_ratio_paper of family f on row r (limit_p > 0: zb-auto's limit in
 * units of p, also validated); NAN on failure. */
static double row_bubble(const paper_row *r, zb_family f, double limit_p) {
  int p = (int)r->v[COL_P], m = (int)r->v[COL_M];
  zb_costs *c = row_costs(r, limit_p);
  zb_planner_request req = {
      .family = f, .p = p, .v = 1, .m = m, .costs = c, .objective = ZB_OBJ_SPAN, .compute_only = true};
  zb_planner_result pl;
  zb_diag d = {{0}};
  double out = NAN;
  if (zb_planner_run(&req, &pl, &d) != ZB_OK)
    fprintf(stderr, "  %s %s m=%d: %s\n", r->model, zb_family_name(f), m, d.msg);
  else
    out = pl.sim->bubble_ratio_paper;
  zb_planner_result_free(&pl);
  zb_costs_free(c);
  return out;
}

/* x printed to 4 decimals, as the paper prints */
static double round4(double x) {
  return round(x * 1e4) / 1e4;
}

static paper_row rows[32];
static int n_rows;

static bool have_rows(void) {
  if (n_rows == 0)
    n_rows = load_rows(rows, 32);
  return n_rows > 0;
}

static void test_table_read(void) {
  CHECK(have_rows());
  /* the paper's four models, three microbatch counts each */
  CHECK_EQ(n_rows, 12);
  CHECK_STREQ(rows[0].model, "1.5B");
  CHECK_EQ((int)rows[11].v[COL_P], 32);
  CHECK_EQ((int)rows[11].v[COL_M], 256);
}

/* Handcrafted families: limit 0 (none) as the paper ran them. */
static void test_handcrafted_reproduce(void) {
  CHECK(have_rows());
  static const struct {
    zb_family f;
    int col;
  } fams[] = {{ZB_FAMILY_1F1B, COL_1F1B}, {ZB_FAMILY_ZB_H1, COL_ZB_H1}, {ZB_FAMILY_ZB_H2, COL_ZB_H2}};
  int mismatches = 0;
  for (int i = 0; i < n_rows; i++)
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
      double got = row_bubble(&rows[i], fams[k].f, 0), want = rows[i].v[fams[k].col];
      if (!(fabs(round4(got) - want) < 1e-9)) {
        fprintf(stderr, "  %s p=%g m=%g %s: %.6f, paper %.4f\n", rows[i].model, rows[i].v[COL_P],
                rows[i].v[COL_M], zb_family_name(fams[k].f), got, want);
        mismatches++;
      }
    }
  CHECK_EQ(mismatches, 0);
}

static void auto_vs_paper(double limit_p, int col) {
  CHECK(have_rows());
  int worse = 0;
  printf("  %-6s %3s %4s  %8s  %8s  %s\n", "model", "p", "m", "zb-auto", "paper", "margin");
  for (int i = 0; i < n_rows; i++) {
    double got = row_bubble(&rows[i], ZB_FAMILY_ZB_AUTO, limit_p), want = rows[i].v[col];
    bool ok = round4(got) <= want + 1e-9;
    printf("  %-6s %3g %4g  %8.4f  %8.4f  %+.5f%s\n", rows[i].model, rows[i].v[COL_P], rows[i].v[COL_M], got,
           want, want - got, ok ? "" : "  WORSE");
    worse += !ok;
  }
  CHECK_EQ(worse, 0);
}

static void test_zb_auto_1p(void) {
  auto_vs_paper(1, COL_ZB_1P);
}
static void test_zb_auto_2p(void) {
  auto_vs_paper(2, COL_ZB_2P);
}

ZBT_MAIN(ZBT(test_table_read), ZBT(test_handcrafted_reproduce), ZBT(test_zb_auto_1p), ZBT(test_zb_auto_2p))
