/* bench_plan.c — zb_bench_plan: tables of what every schedule family costs
 * and how fast libzb generates it, over p in {4..64} and m in {p..16p},
 * under three cost settings. Sections:
 *   families  bubble_ratio, bubble_ratio_paper, peak memory, generation time
 *   margin    zb-auto at limit 1p vs zb-h1 and at 2p vs zb-h2 (makespans)
 *   speed     generation time against the targets (PASS/MISS; never fails)
 * It prints; it never fails the process on a slow or refused cell. Each
 * cell runs in a forked child under a time limit, so a generator that does
 * not return costs that cell, not the run. The whole process is pinned to
 * one CPU so timings are single-core.
 */
#define _GNU_SOURCE /* sched_setaffinity, CPU_SET */
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_planner.h"

/* ------------------------------------------------------------------ */
/* Cost settings                                                       */
/* ------------------------------------------------------------------ */

typedef enum bench_setting { SET_EQUAL = 0, SET_UNEVEN, SET_STAGES, SET_COUNT } bench_setting;

static const char *const bench_setting_names[SET_COUNT] = {"(a) equal", "(b) uneven", "(c) uneven per-stage"};

/* The per-stage factor of setting (c): the (stage+1)-th output of Knuth's
 * MMIX LCG (x <- 6364136223846793005 x + 1442695040888963407 mod 2^64)
 * from the fixed seed 2024; its top 53 bits give u in [0, 1); factor =
 * 0.8 + 0.4 u. (Successive outputs of one stream, rather than one step per
 * seed, which would make u an arithmetic progression mod 1.) */
static double bench_stage_factor(int stage) {
  uint64_t x = 2024;
  for (int k = 0; k <= stage; k++)
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
  return 0.8 + 0.4 * (double)(x >> 11) / 9007199254740992.0;
}

/* Costs of setting s for p ranks with v chunks (one rank's share divided
 * among chunks) and a limit in units of one rank's M_F (<= 0: none). */
static zb_costs *bench_costs(bench_setting s, int p, int v, double limit_units) {
  zb_rank_costs rc = zb_rank_costs_default();
  if (s != SET_EQUAL) {
    rc.t_b = 1.3;
    rc.t_w = 0.7;
    rc.t_comm = 0.05;
  }
  zb_costs *c = zb_costs_from_rank_share(p, v, &rc, limit_units > 0 ? limit_units * rc.m_f : 0);
  if (s == SET_STAGES)
    for (int st = 0; st < c->n_stages; st++) {
      double f = bench_stage_factor(st);
      c->t_f[st] *= f;
      c->t_b[st] *= f;
      c->t_w[st] *= f;
    }
  return c;
}

/* ------------------------------------------------------------------ */
/* One cell: generate (timed, repeated), validate, simulate            */
/* ------------------------------------------------------------------ */

typedef enum cell_status {
  CELL_OK = 0,
  CELL_REFUSED, /* the generator returned an error */
  CELL_INVALID, /* the validator rejected the result */
  CELL_TIMEOUT, /* the child ran past the time limit */
  CELL_CRASH,   /* the child died otherwise */
} cell_status;

typedef struct cell_req {
  zb_family family;
  int p, v, m;
  bench_setting setting;
  double limit_units; /* <= 0: none (zb-auto then uses 1p) */
  int max_runs;       /* timing repeats at most */
  double budget_s;    /* stop repeating once this much time is spent */
} cell_req;

typedef struct cell {
  cell_status status;
  double makespan, bubble, bubble_paper, peak; /* peak: max over ranks, M_F units */
  double gen_ms;                               /* median generation time */
  int runs;
  char why[320];
} cell;

static int bench_cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Runs rq in this process: once through libzb's pipeline (compute-only
 * lists, validated and simulated, as the paper compares them), then the
 * generator alone up to max_runs times within the budget for its median. */
static void bench_measure(const cell_req *rq, cell *out) {
  memset(out, 0, sizeof *out);
  zb_costs *c = bench_costs(rq->setting, rq->p, rq->v, rq->limit_units);
  zb_planner_request req = {.family = rq->family,
                            .p = rq->p,
                            .v = rq->v,
                            .m = rq->m,
                            .costs = c,
                            .compute_only = true,
                            .clock = zb_clock_s};
  zb_planner_result pl;
  zb_diag d;
  if (zb_planner_run(&req, &pl, &d) != ZB_OK) {
    out->status = pl.failed <= ZB_PLANNER_GENERATE ? CELL_REFUSED : CELL_INVALID;
    snprintf(out->why, sizeof out->why, "%s", d.msg);
    goto cleanup;
  }
  double times[16];
  int max_runs = rq->max_runs < 1 ? 1 : rq->max_runs > 16 ? 16 : rq->max_runs;
  double dt = pl.generate_seconds, spent = dt;
  times[out->runs++] = dt;
  zb_plan_request gen = {.family = rq->family, .p = rq->p, .v = rq->v, .m = rq->m, .costs = pl.costs};
  while (out->runs < max_runs && spent + dt <= rq->budget_s) {
    zb_schedule *t = NULL;
    double t0 = zb_clock_s();
    zb_plan_generate(&gen, &t, NULL);
    dt = zb_clock_s() - t0;
    zb_schedule_free(t);
    times[out->runs++] = dt;
    spent += dt;
  }
  qsort(times, (size_t)out->runs, sizeof times[0], bench_cmp_double);
  out->gen_ms =
      1e3 * (out->runs % 2 ? times[out->runs / 2] : 0.5 * (times[out->runs / 2 - 1] + times[out->runs / 2]));
  out->makespan = pl.sim->makespan;
  out->bubble = pl.sim->bubble_ratio;
  out->bubble_paper = pl.sim->bubble_ratio_paper;
  out->peak = zb_sim_max_peak(pl.sim);
cleanup:
  zb_planner_result_free(&pl);
  zb_costs_free(c);
}

/* Options of the whole run. */
typedef struct bench_opts {
  bool quick;
  bool fork_cells;
  int cell_timeout_s;
  bool sections[3];
} bench_opts;

static bench_opts bench_cfg = {.fork_cells = true, .cell_timeout_s = 10};

static bool bench_read_all(int fd, void *buf, size_t n) {
  char *p = buf;
  while (n > 0) {
    ssize_t got = read(fd, p, n);
    if (got < 0 && errno == EINTR)
      continue;
    if (got <= 0)
      return false;
    p += got;
    n -= (size_t)got;
  }
  return true;
}

/* Runs rq in a forked child killed after the cell time limit (or in this
 * process with --no-fork, or when fork fails). */
static void bench_cell(const cell_req *rq, cell *out) {
  int fds[2];
  if (!bench_cfg.fork_cells || pipe(fds) != 0) {
    bench_measure(rq, out);
    return;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    bench_measure(rq, out);
    return;
  }
  if (pid == 0) {
    close(fds[0]);
    alarm((unsigned)bench_cfg.cell_timeout_s);
    cell c;
    bench_measure(rq, &c);
    const char *p = (const char *)&c;
    size_t n = sizeof c;
    while (n > 0) {
      ssize_t w = write(fds[1], p, n);
      if (w < 0 && errno == EINTR)
        continue;
      if (w <= 0)
        _exit(1);
      p += w;
      n -= (size_t)w;
    }
    _exit(0);
  }
  close(fds[1]);
  bool got = bench_read_all(fds[0], out, sizeof *out);
  close(fds[0]);
  int st = 0;
  while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (got && WIFEXITED(st) && WEXITSTATUS(st) == 0)
    return;
  memset(out, 0, sizeof *out);
  if (WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM) {
    out->status = CELL_TIMEOUT;
    snprintf(out->why, sizeof out->why, "did not return within %d s (cell time limit)",
             bench_cfg.cell_timeout_s);
  } else {
    out->status = CELL_CRASH;
    snprintf(out->why, sizeof out->why, "generator process died (%s %d)",
             WIFSIGNALED(st) ? "signal" : "exit status", WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
  }
}

/* ------------------------------------------------------------------ */
/* Grid                                                                */
/* ------------------------------------------------------------------ */

static const int bench_ps_full[] = {4, 8, 16, 32, 64};
static const int bench_mmul[] = {1, 2, 4, 8, 16};
enum { BENCH_NP_FULL = 5, BENCH_NP_QUICK = 3, BENCH_NM = 5 };

static int bench_np(void) {
  return bench_cfg.quick ? BENCH_NP_QUICK : BENCH_NP_FULL;
}

static int bench_family_v(zb_family f) {
  return f == ZB_FAMILY_INTERLEAVED_1F1B ? 2 : zb_family_default_chunks(f);
}

/* Short column headers, in zb_family order. */
static const char *const bench_short[ZB_FAMILY_COUNT_] = {"gpipe", "1f1b",      "interl-1f1b", "zb-h1",
                                                          "zb-h2", "zb-auto",   "zb-v",        "v-half",
                                                          "v-min", "zb-interl", "dualpipe-v"};

/* Repeats for the families grid: more for fast generators. */
static void bench_grid_runs(cell_req *rq) {
  rq->max_runs = 5;
  rq->budget_s = 0.05;
}

/* ------------------------------------------------------------------ */
/* Section: families                                                   */
/* ------------------------------------------------------------------ */

typedef enum metric { MET_BUBBLE = 0, MET_PAPER, MET_PEAK, MET_GEN, MET_COUNT } metric;

static const char *const metric_titles[MET_COUNT] = {
    "bubble_ratio (global: 1 - busy/(p*makespan))",
    "bubble_ratio_paper (ZB paper 5.3: (S_max - m(T_F+T_B+T_W))/S_max)",
    "peak memory (max over ranks, units of one rank's M_F; 1F1B = p)",
    "generation time, ms (median of up to 5 runs within 50 ms; one run for slower cells)",
};

static void bench_print_cell(const cell *c, metric k) {
  if (c->status != CELL_OK) {
    printf(" %11s", c->status == CELL_TIMEOUT ? "TIMEOUT" : c->status == CELL_INVALID ? "INVALID" : "-");
    return;
  }
  switch (k) {
  case MET_BUBBLE: printf(" %11.4f", c->bubble); break;
  case MET_PAPER: printf(" %11.4f", c->bubble_paper); break;
  case MET_PEAK: printf(" %11.4g", c->peak); break;
  default: printf(" %11.3g", c->gen_ms); break;
  }
}

/* Prints each (family, reason) of the failed cells once, with the shapes. */
static void bench_print_reasons(const cell *cells, int np) {
  bool printed_header = false;
  bool *done = zb_calloc((size_t)np * BENCH_NM * ZB_FAMILY_COUNT_, sizeof(bool));
  for (int i = 0; i < np * BENCH_NM * ZB_FAMILY_COUNT_; i++) {
    if (cells[i].status == CELL_OK || done[i])
      continue;
    if (!printed_header) {
      printf("  '-' refused, TIMEOUT, INVALID (each reason once, with its shapes):\n");
      printed_header = true;
    }
    int f = i % ZB_FAMILY_COUNT_;
    printf("    %s: %s [", zb_family_name((zb_family)f), cells[i].why);
    const char *sep = "";
    for (int j = i; j < np * BENCH_NM * ZB_FAMILY_COUNT_; j++)
      if (j % ZB_FAMILY_COUNT_ == f && !done[j] && cells[j].status == cells[i].status &&
          strcmp(cells[j].why, cells[i].why) == 0) {
        int pi = j / (BENCH_NM * ZB_FAMILY_COUNT_), mi = (j / ZB_FAMILY_COUNT_) % BENCH_NM;
        printf("%sp=%d m=%d", sep, bench_ps_full[pi], bench_ps_full[pi] * bench_mmul[mi]);
        sep = ", ";
        done[j] = true;
      }
    printf("]\n");
  }
  free(done);
}

static void bench_section_families(void) {
  printf("== families: bubble ratios, peak memory and generation time ==\n");
  printf("interleaved-1f1b with v=2; zb-auto at its default limit (1p); the other families unlimited.\n");
  printf(
      "Each cell: generate, validate (compute-only lists), simulate. A family that times out twice in one\n"
      "setting is skipped for the rest of it.\n\n");
  int np = bench_np();
  size_t n = (size_t)np * BENCH_NM * ZB_FAMILY_COUNT_;
  cell *cells = zb_calloc(n, sizeof *cells);
  for (int s = 0; s < SET_COUNT; s++) {
    double t0 = zb_clock_s();
    int timeouts[ZB_FAMILY_COUNT_] = {0};
    for (int pi = 0; pi < np; pi++)
      for (int mi = 0; mi < BENCH_NM; mi++)
        for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
          cell *c = &cells[((size_t)pi * BENCH_NM + (size_t)mi) * ZB_FAMILY_COUNT_ + (size_t)f];
          if (timeouts[f] >= 2) {
            memset(c, 0, sizeof *c);
            c->status = CELL_TIMEOUT;
            snprintf(c->why, sizeof c->why, "skipped after 2 timeouts in this setting");
            continue;
          }
          int p = bench_ps_full[pi];
          cell_req rq = {.family = (zb_family)f,
                         .p = p,
                         .v = bench_family_v((zb_family)f),
                         .m = p * bench_mmul[mi],
                         .setting = (bench_setting)s};
          bench_grid_runs(&rq);
          bench_cell(&rq, c);
          if (c->status == CELL_TIMEOUT)
            timeouts[f]++;
        }
    for (int k = 0; k < MET_COUNT; k++) {
      printf("-- setting %s: %s\n", bench_setting_names[s], metric_titles[k]);
      printf("%4s %5s", "p", "m");
      for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
        printf(" %11s", bench_short[f]);
      printf("\n");
      for (int pi = 0; pi < np; pi++)
        for (int mi = 0; mi < BENCH_NM; mi++) {
          int p = bench_ps_full[pi];
          printf("%4d %5d", p, p * bench_mmul[mi]);
          for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
            bench_print_cell(&cells[((size_t)pi * BENCH_NM + (size_t)mi) * ZB_FAMILY_COUNT_ + (size_t)f],
                             (metric)k);
          printf("\n");
        }
      printf("\n");
    }
    bench_print_reasons(cells, np);
    printf("  (setting %s took %.1f s)\n\n", bench_setting_names[s], zb_clock_s() - t0);
  }
  free(cells);
}

/* ------------------------------------------------------------------ */
/* Section: margin                                                     */
/* ------------------------------------------------------------------ */

/* Relative improvement of `ours` over `ref`: (ref - ours) / ref. */
static double bench_margin(double ours, double ref) {
  return ref > 0 ? (ref - ours) / ref : 0;
}

static void bench_print_pair(const cell *ours, const cell *ref, int *neg, int *bad) {
  if (ours->status != CELL_OK || ref->status != CELL_OK) {
    printf(" %10s %10s %8s", ours->status == CELL_OK ? "" : "-", ref->status == CELL_OK ? "" : "-", "-");
    (*bad)++;
    return;
  }
  double mg = bench_margin(ours->makespan, ref->makespan);
  bool negative = mg < -1e-9;
  if (negative)
    (*neg)++;
  printf(" %10.6g %10.6g %7.2f%%%s", ours->makespan, ref->makespan, 100 * mg, negative ? "!" : " ");
}

static void bench_section_margin(void) {
  printf("== zb-auto margin: relative makespan improvement (ref - auto)/ref, >= 0 expected ==\n");
  printf("zb-auto at limit 1p (p units of M_F) vs zb-h1; zb-auto at limit 2p vs zb-h2 (which needs (2p-1)/p\n"
         "of 1F1B's memory, so it fits 2p). zb-h1 / zb-h2 unlimited; same costs. '!' marks a negative "
         "margin.\n\n");
  int np = bench_np(), neg = 0, bad = 0, n = 0;
  double worst = INFINITY;
  for (int s = 0; s < SET_COUNT; s++) {
    printf("-- setting %s\n", bench_setting_names[s]);
    printf("%4s %5s %10s %10s %8s  %10s %10s %8s\n", "p", "m", "auto@1p", "zb-h1", "margin", "auto@2p",
           "zb-h2", "margin");
    for (int pi = 0; pi < np; pi++)
      for (int mi = 0; mi < BENCH_NM; mi++) {
        int p = bench_ps_full[pi], m = p * bench_mmul[mi];
        cell_req base = {.p = p, .v = 1, .m = m, .setting = (bench_setting)s, .max_runs = 1, .budget_s = 0};
        cell a1, h1, a2, h2;
        cell_req rq = base;
        rq.family = ZB_FAMILY_ZB_AUTO;
        rq.limit_units = p;
        bench_cell(&rq, &a1);
        rq.limit_units = 2.0 * p;
        bench_cell(&rq, &a2);
        rq = base;
        rq.family = ZB_FAMILY_ZB_H1;
        bench_cell(&rq, &h1);
        rq.family = ZB_FAMILY_ZB_H2;
        bench_cell(&rq, &h2);
        printf("%4d %5d", p, m);
        bench_print_pair(&a1, &h1, &neg, &bad);
        printf(" ");
        bench_print_pair(&a2, &h2, &neg, &bad);
        printf("\n");
        if (a1.status == CELL_OK && h1.status == CELL_OK) {
          double mg = bench_margin(a1.makespan, h1.makespan);
          worst = mg < worst ? mg : worst;
        }
        if (a2.status == CELL_OK && h2.status == CELL_OK) {
          double mg = bench_margin(a2.makespan, h2.makespan);
          worst = mg < worst ? mg : worst;
        }
        n += 2;
        const cell *why[4] = {&a1, &h1, &a2, &h2};
        const char *who[4] = {"zb-auto@1p", "zb-h1", "zb-auto@2p", "zb-h2"};
        for (int k = 0; k < 4; k++)
          if (why[k]->status != CELL_OK)
            printf("      %s: %s\n", who[k], why[k]->why);
      }
    printf("\n");
  }
  printf("margin summary: %d comparisons, %d negative, %d not comparable; worst margin %.2f%%\n\n", n, neg,
         bad, isfinite(worst) ? 100 * worst : 0.0);
}

/* ------------------------------------------------------------------ */
/* Section: speed targets                                              */
/* ------------------------------------------------------------------ */

typedef struct speed_target {
  zb_family family;
  int p, m;
  double target_ms;
} speed_target;

static const speed_target bench_targets[] = {
    {ZB_FAMILY_ZB_AUTO, 8, 32, 1},           {ZB_FAMILY_ZB_AUTO, 32, 256, 20},
    {ZB_FAMILY_ZB_AUTO, 64, 1024, 500},      {ZB_FAMILY_ZB_V, 32, 256, 20},
    {ZB_FAMILY_V_HALF, 32, 256, 20},         {ZB_FAMILY_V_MIN, 32, 256, 20},
    {ZB_FAMILY_ZB_INTERLEAVED, 32, 256, 20}, {ZB_FAMILY_GPIPE, 64, 1024, 10},
    {ZB_FAMILY_1F1B, 64, 1024, 10},          {ZB_FAMILY_INTERLEAVED_1F1B, 64, 1024, 10},
    {ZB_FAMILY_ZB_H1, 64, 1024, 10},         {ZB_FAMILY_ZB_H2, 64, 1024, 10},
};

/* zb-auto's search over every placement (zb_planner_search): the whole
 * compute-only search, from one rank's share of the costs (setting (a) and
 * (b); (c) gives per-stage times, which keep it on one placement), median
 * of 5 runs. */
static void bench_search_speed(int *pass, int *total) {
  static const struct {
    int p, m;
    double target_ms;
  } rows[] = {{32, 256, 50}, {64, 1024, 500}};
  for (size_t k = 0; k < sizeof rows / sizeof rows[0]; k++) {
    printf("%-16s %4d %5d", "zb-auto search", rows[k].p, rows[k].m);
    double worst = 0;
    for (int s = 0; s < 2; s++) {
      zb_rank_costs rc = zb_rank_costs_default();
      if (s == 1) {
        rc.t_b = 1.3;
        rc.t_w = 0.7;
        rc.t_comm = 0.05;
      }
      zb_planner_request req = {
          .family = ZB_FAMILY_ZB_AUTO, .p = rows[k].p, .m = rows[k].m, .rank = rc, .compute_only = true};
      double t[5];
      for (int run = 0; run < 5; run++) {
        zb_planner_result r;
        double t0 = zb_clock_s();
        zb_planner_run(&req, &r, NULL);
        t[run] = 1e3 * (zb_clock_s() - t0);
        zb_planner_result_free(&r);
      }
      qsort(t, 5, sizeof t[0], bench_cmp_double);
      printf(" %10.3f", t[2]);
      worst = t[2] > worst ? t[2] : worst;
    }
    bool met = worst < rows[k].target_ms;
    *pass += met;
    (*total)++;
    printf(" %10s %8.0f ms  %s\n", "-", rows[k].target_ms, met ? "PASS" : "MISS");
  }
}

static void bench_section_speed(void) {
  printf("== speed targets: zb_plan_generate wall time on one core (median of up to 9 runs within 2 s) ==\n");
  printf("Measured under all three cost settings; PASS/MISS judges the slowest. interleaved-1f1b with v=2;\n"
         "zb-auto at its default limit (1p). Informational: a MISS does not fail the run.\n\n");
  printf("%-16s %4s %5s %10s %10s %10s %10s  %s\n", "schedule", "p", "m", "(a) ms", "(b) ms", "(c) ms",
         "target", "verdict");
  int pass = 0, total = 0;
  for (size_t k = 0; k < sizeof bench_targets / sizeof bench_targets[0]; k++) {
    const speed_target *t = &bench_targets[k];
    double worst = 0;
    bool ok = true;
    char why[sizeof(((cell *)0)->why)] = "";
    printf("%-16s %4d %5d", zb_family_name(t->family), t->p, t->m);
    for (int s = 0; s < SET_COUNT; s++) {
      if (!ok) { /* one timeout is enough: the limit would only be hit again */
        printf(" %10s", "skipped");
        continue;
      }
      cell_req rq = {.family = t->family,
                     .p = t->p,
                     .v = bench_family_v(t->family),
                     .m = t->m,
                     .setting = (bench_setting)s,
                     .max_runs = 9,
                     .budget_s = 2.0};
      cell c;
      bench_cell(&rq, &c);
      if (c.status == CELL_OK || c.status == CELL_INVALID) {
        printf(" %10.3f", c.gen_ms);
        worst = c.gen_ms > worst ? c.gen_ms : worst;
      } else {
        printf(" %10s", c.status == CELL_TIMEOUT ? "TIMEOUT" : "-");
        ok = false;
      }
      if (c.status != CELL_OK && !why[0])
        snprintf(why, sizeof why, "%s", c.why);
    }
    bool met = ok && worst < t->target_ms;
    pass += met;
    total++;
    printf(" %8.0f ms  %s%s%s\n", t->target_ms, met ? "PASS" : "MISS", why[0] ? "  " : "", why);
  }
  bench_search_speed(&pass, &total);
  printf("\nspeed summary: %d of %d targets met\n\n", pass, total);
}

/* ------------------------------------------------------------------ */
/* main                                                                */
/* ------------------------------------------------------------------ */

static const char *const bench_section_names[3] = {"families", "margin", "speed"};

static void bench_usage(FILE *f) {
  fprintf(
      f,
      "usage: zb_bench_plan [--quick] [--section families|margin|speed]... [--cell-timeout S] [--no-fork]\n"
      "\n"
      "Prints tables of every schedule family for p in {4, 8, 16, 32, 64} and m in {p, 2p, 4p, 8p, 16p}\n"
      "under three cost settings, the zb-auto margin over zb-h1/zb-h2, and generation speed against\n"
      "its targets. Never fails on a slow or refused cell; exit 0 unless the arguments are wrong.\n"
      "\n"
      "  --quick           p in {4, 8, 16} only (the speed section is unchanged)\n"
      "  --section NAME    run only this section (repeatable; default all three)\n"
      "  --cell-timeout S  time limit of one cell's child process (default 10 s)\n"
      "  --no-fork         run cells in this process (no time limit; for profilers)\n");
}

/* Pins the process to the CPU it runs on; returns that CPU or -1. */
static int bench_pin(void) {
  int cpu = sched_getcpu();
  if (cpu < 0)
    return -1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0 ? cpu : -1;
}

int main(int argc, char **argv) {
  bool any_section = false;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i];
    if (strcmp(a, "--quick") == 0) {
      bench_cfg.quick = true;
    } else if (strcmp(a, "--no-fork") == 0) {
      bench_cfg.fork_cells = false;
    } else if (strcmp(a, "--section") == 0 && i + 1 < argc) {
      const char *name = argv[++i];
      int k = 0;
      while (k < 3 && strcmp(name, bench_section_names[k]) != 0)
        k++;
      if (k == 3) {
        fprintf(stderr, "zb_bench_plan: unknown section '%s' (families, margin, speed)\n", name);
        return 2;
      }
      bench_cfg.sections[k] = true;
      any_section = true;
    } else if (strcmp(a, "--cell-timeout") == 0 && i + 1 < argc) {
      char *end;
      long t = strtol(argv[++i], &end, 10);
      if (*end || t < 1 || t > 3600) {
        fprintf(stderr, "zb_bench_plan: --cell-timeout takes seconds in 1..3600\n");
        return 2;
      }
      bench_cfg.cell_timeout_s = (int)t;
    } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      bench_usage(stdout);
      return 0;
    } else {
      fprintf(stderr, "zb_bench_plan: unknown argument '%s'\n", a);
      bench_usage(stderr);
      return 2;
    }
  }
  if (!any_section)
    for (int k = 0; k < 3; k++)
      bench_cfg.sections[k] = true;

  int cpu = bench_pin();
  double t0 = zb_clock_s();
  printf("zb_bench_plan: libzb schedule families; %s; %s; cell time limit %d s%s\n",
         bench_cfg.quick ? "--quick: p in {4, 8, 16}" : "p in {4, 8, 16, 32, 64}",
         cpu >= 0 ? "pinned to one CPU" : "not pinned (sched_setaffinity failed)", bench_cfg.cell_timeout_s,
         bench_cfg.fork_cells ? " (each cell in a child process)" : ", cells in-process");
  printf(
      "m in {p, 2p, 4p, 8p, 16p}. Costs are one rank's whole share; a family with v chunks gives each chunk\n"
      "op 1/v of the times and memory (T_comm per hop, undivided). Memory M_F=1, M_B=M_W=-0.5.\n");
  printf("  (a) equal: T_F=T_B=T_W=1, T_comm=0\n");
  printf("  (b) uneven: T_F=1, T_B=1.3, T_W=0.7, T_comm=0.05\n");
  printf("  (c) uneven per-stage: (b) with stage s's T_F, T_B, T_W (already divided among chunks) times\n"
         "      f(s) = 0.8 + 0.4 u(s), u(s) = top 53 bits / 2^53 of the (s+1)-th output of the MMIX LCG\n"
         "      x <- 6364136223846793005 x + 1442695040888963407 (mod 2^64) from seed 2024; f(0..7) =");
  for (int s = 0; s < 8; s++)
    printf(" %.3f", bench_stage_factor(s));
  printf("\n\n");

  if (bench_cfg.sections[0])
    bench_section_families();
  if (bench_cfg.sections[1])
    bench_section_margin();
  if (bench_cfg.sections[2])
    bench_section_speed();
  printf("total %.1f s\n", zb_clock_s() - t0);
  return 0;
}
