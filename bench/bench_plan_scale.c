/* zb_bench_scale — the whole planning pipeline of every family at scale
 * (default p = 256, m = 4096): generate, lower, validate and simulate,
 * each timed, and the process's peak memory, per family in a child
 * process with a time limit. The phases are the coordinator's
 * (zb_job_plan): the compute-only lists are freed once lowered, the
 * simulation keeps the figures only, and the plan borrows up to 4 threads
 * (lowering's ranks in shares, validation beside simulation, and with
 * three or more its deadlock run beside its scan; the
 * validation and simulation columns are then each one's own time, the
 * total their longer). The zb-auto row runs its whole choice among plans,
 * every placement, as zbctl plan and the coordinator do (zb_planner_run).
 * Targets (issues 12, 27): the whole plan under 1 s and 500 MB. Prints
 * PASS/MISS; never fails on a slow family.
 *
 * usage: zb_bench_scale [P M] [--timeout S] [--family NAME] [--chunks V]
 *                       [--t-comm T] [--repeat N] [--threads N]
 * (--repeat: each family N times, 3 unless told, the fastest run's
 * figures: the development VM's timings vary by a third from run to run,
 * and a first run after a pause pays for memory its host took back;
 * --threads 1: the pipeline on one thread; --chunks: interleaved 1F1B's
 * chunks, 2 unless told. Every family runs at its default chunks, and
 * interleaved 1F1B once more with 4, the case issue 12 names; --t-comm:
 * the time of a transfer, 0 as in the default costs. A "lowering" in the
 * sim column: lowering's own simulation gave the figures, as it does when
 * no receive waits longer than the compute plan's timeline allows, always
 * with T_comm = 0 (zb_lower_par_figures), and validation ran alone.) */
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zb_clock.h"
#include "zb_lower.h"
#include "zb_par_threads.h"
#include "zb_plan.h"
#include "zb_planner.h"
#include "zb_sim.h"
#include "zb_validate.h"

typedef struct phases {
  int ok;
  double ms[4]; /* generate, lower, validate, simulate */
  double total; /* wall: validation and simulation may overlap */
  bool shared;  /* the figures came from lowering's own simulation (zb_lower_par_figures) */
  bool search;  /* zb-auto's whole search (run_search): no phase columns */
  char chose[40];
  double rss_mb;
  char why[200];
} phases;

/* Validation and simulation of the lowered plan, as the planner runs them
 * (zb_planner.c): each its own output, timed on its own. */
typedef struct check_job {
  const zb_schedule *low;
  const zb_costs *c;
  const zb_par *par;
  zb_violation viol;
  zb_err valid_err, sim_err;
  zb_sim_result *sim;
  zb_diag d;
  double ms[2];
} check_job;

static void check_piece(void *arg, int k) {
  check_job *j = arg;
  double t0 = zb_clock_s();
  if (k == 0)
    j->valid_err = zb_validate_par(j->low, j->c, j->par, &j->viol);
  else
    j->sim_err = zb_simulate_figures(j->low, j->c, &j->sim, &j->d);
  j->ms[k] = 1e3 * (zb_clock_s() - t0);
}

/* The chunks a row plans with: interleaved 1F1B at its default of 2
 * unless the row names more (the 4-chunk row), every other family at its
 * own default. */
static int row_chunks(zb_family f, int chunks) {
  if (f != ZB_FAMILY_INTERLEAVED_1F1B)
    return zb_family_default_chunks(f);
  return chunks > 0 ? chunks : 2;
}

/* What every row runs under. */
typedef struct bench_cfg {
  int p, m, timeout_s, repeat;
  double t_comm; /* seconds per transfer, in units of the default costs */
  const zb_par *par;
} bench_cfg;

static void run_phases(zb_family f, int v, const bench_cfg *cfg, phases *out) {
  memset(out, 0, sizeof *out);
  int p = cfg->p, m = cfg->m;
  const zb_par *par = cfg->par;
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_comm = cfg->t_comm;
  zb_costs *c = zb_costs_from_rank_share(p, v, &rc, 0);
  zb_plan_request gen = {.family = f, .p = p, .v = v, .m = m, .costs = c, .par = par};
  zb_schedule *s = NULL, *low = NULL, *run = NULL;
  int period = 0;
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  zb_err err = zb_plan_generate_run(&gen, &s, &run, &period, &d);
  double t1 = zb_clock_s();
  zb_sim_result *figures = NULL;
  if (!err) /* from the generator's short run, if any, as the planner lowers */
    err = zb_lower_par_figures(s, run, period, c, par, &low, &figures, &d);
  zb_schedule_free(s); /* as the coordinator's pipeline does (zb_job_plan) */
  zb_schedule_free(run);
  s = run = NULL;
  double t2 = zb_clock_s();
  /* as zb_planner.c: validation alone on the runner when lowering gave
   * the figures, else beside the simulation */
  check_job job = {.low = low, .c = c, .par = zb_par_width(par) > 2 || figures ? par : NULL};
  out->shared = figures != NULL;
  if (!err) {
    if (figures) {
      check_piece(&job, 0);
      job.sim = figures;
    } else
      zb_par_run(par, check_piece, &job, 2);
    if (job.valid_err)
      err = zb_diag_set(&d, ZB_ERR_INVALID_SCHEDULE, "invalid: %s", job.viol.detail);
    else if (job.sim_err)
      err = zb_diag_set(&d, job.sim_err, "%s", job.d.msg);
  }
  double t3 = zb_clock_s();
  out->ok = !err;
  snprintf(out->why, sizeof out->why, "%.190s", err ? d.msg : "");
  out->ms[0] = 1e3 * (t1 - t0);
  out->ms[1] = 1e3 * (t2 - t1);
  out->ms[2] = job.ms[0];
  out->ms[3] = job.ms[1];
  out->total = 1e3 * (t3 - t0);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  out->rss_mb = (double)ru.ru_maxrss / 1024.0;
  zb_sim_result_free(job.sim);
  zb_schedule_free(low);
  zb_schedule_free(s);
  zb_costs_free(c);
}

/* zb-auto's whole choice among plans, as zbctl plan and the coordinator
 * run it (zb_planner_run over every placement, figures only): the search
 * is its generation column, the winner's lowering, validation and
 * simulation are in the total. */
static void run_search(const bench_cfg *cfg, phases *out) {
  memset(out, 0, sizeof *out);
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_comm = cfg->t_comm;
  zb_planner_request req = {.family = ZB_FAMILY_ZB_AUTO,
                            .p = cfg->p,
                            .m = cfg->m,
                            .rank = rc,
                            .figures_only = true,
                            .clock = zb_clock_s,
                            .par = cfg->par};
  zb_planner_result r;
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  zb_err err = zb_planner_run(&req, &r, &d);
  double t1 = zb_clock_s();
  out->ok = !err;
  snprintf(out->why, sizeof out->why, "%.190s", err ? d.msg : "");
  out->total = 1e3 * (t1 - t0);
  out->ms[0] = out->total; /* the search and the winner's generation */
  out->ms[1] = out->ms[2] = out->ms[3] = NAN;
  out->search = true;
  snprintf(out->chose, sizeof out->chose, "%s v=%d", zb_family_name(r.chosen), r.v);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  out->rss_mb = (double)ru.ru_maxrss / 1024.0;
  zb_planner_result_free(&r);
}

/* run_phases in a child killed after timeout_s. */
static void run_child(zb_family f, int v, const bench_cfg *cfg, phases *out) {
  int fds[2];
  if (pipe(fds) != 0) {
    run_phases(f, v, cfg, out);
    return;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm((unsigned)cfg->timeout_s);
    phases ph;
    if (f == ZB_FAMILY_ZB_AUTO)
      run_search(cfg, &ph);
    else
      run_phases(f, v, cfg, &ph);
    ssize_t w = write(fds[1], &ph, sizeof ph);
    _exit(w == (ssize_t)sizeof ph ? 0 : 1);
  }
  close(fds[1]);
  ssize_t got = pid > 0 ? read(fds[0], out, sizeof *out) : -1;
  close(fds[0]);
  int st = 0;
  while (pid > 0 && waitpid(pid, &st, 0) < 0 && errno == EINTR) {
  }
  if (got != (ssize_t)sizeof *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->why, sizeof out->why, "%s",
             WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM ? "timeout" : "died");
  }
}

/* One row: a family at v chunks, the fastest of repeat runs. */
static bool run_row(zb_family f, int v, const bench_cfg *cfg) {
  phases ph = {0};
  double total = 0;
  for (int k = 0; k < cfg->repeat; k++) {
    phases one;
    run_child(f, v, cfg, &one);
    if (k == 0 || (one.ok && one.total < total)) {
      ph = one;
      total = one.total;
    }
  }
  bool met = ph.ok && total < 1000 && ph.rss_mb < 500;
  char name[40];
  if (f == ZB_FAMILY_ZB_AUTO) /* its chunks are the search's to choose */
    snprintf(name, sizeof name, "zb-auto (search)");
  else
    snprintf(name, sizeof name, "%s v=%d", zb_family_name(f), v);
  printf("%-22s", name);
  char sim[16] = "  lowering"; /* the figures came with the lowering */
  if (!ph.shared)
    snprintf(sim, sizeof sim, "%10.1f", ph.ms[3]);
  if (ph.ok && ph.search)
    printf(" %10.1f %32s %10.1f %9.0f  %s (the whole search; chose %s)\n", ph.ms[0], "", total, ph.rss_mb,
           met ? "PASS" : "MISS", ph.chose);
  else if (ph.ok)
    printf(" %10.1f %10.1f %10.1f %s %10.1f %9.0f  %s\n", ph.ms[0], ph.ms[1], ph.ms[2], sim, total, ph.rss_mb,
           met ? "PASS" : "MISS");
  else
    printf("  %s\n", ph.why);
  return met;
}

static const char usage[] =
    "usage: zb_bench_scale [P M] [--timeout S] [--family NAME] [--chunks V] [--t-comm T] [--repeat N]\n"
    "                      [--threads N]\n";

int main(int argc, char **argv) {
  bench_cfg cfg = {.p = 256, .m = 4096, .timeout_s = 120, .repeat = 3, .t_comm = 0};
  int only = -1, chunks = 0, cpus = zb_par_cpus();
  int threads = zb_par_plan_width(); /* as zb_job_plan */
  for (int i = 1; i < argc; i++) {
    zb_family fam;
    if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
      cfg.timeout_s = atoi(argv[++i]);
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
      threads = atoi(argv[++i]);
    else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
      cfg.repeat = atoi(argv[++i]);
    else if (strcmp(argv[i], "--chunks") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
      chunks = atoi(argv[++i]);
    else if (strcmp(argv[i], "--t-comm") == 0 && i + 1 < argc && atof(argv[i + 1]) >= 0)
      cfg.t_comm = atof(argv[++i]);
    else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc &&
             zb_family_parse(argv[i + 1], &fam, NULL) == ZB_OK) {
      only = (int)fam;
      i++;
    } else if (i + 1 < argc && atoi(argv[i]) > 0 && atoi(argv[i + 1]) > 0) {
      cfg.p = atoi(argv[i]);
      cfg.m = atoi(argv[++i]);
    } else {
      fprintf(stderr, "%s", usage);
      return 2;
    }
  }
  zb_par par = zb_par_threads(threads);
  cfg.par = &par;
  printf(
      "zb_bench_scale: p=%d m=%d, equal costs, T_comm %g, each row in a child (limit %d s), the fastest of "
      "%d run%s, %d thread%s (%d cpus); targets: 1000 ms, 500 MB\n\n",
      cfg.p, cfg.m, cfg.t_comm, cfg.timeout_s, cfg.repeat, cfg.repeat == 1 ? "" : "s", threads,
      threads == 1 ? "" : "s", cpus);
  printf("%-22s %10s %10s %10s %10s %10s %9s  %s\n", "schedule", "gen ms", "lower ms", "valid ms", "sim ms",
         "total ms", "peak MB", "verdict");
  int pass = 0, ran = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    if (only >= 0 && f != only)
      continue;
    pass += run_row((zb_family)f, row_chunks((zb_family)f, chunks), &cfg);
    ran++;
  }
  /* the issue's own case: interleaved 1F1B with 4 chunks */
  if (only < 0 && chunks == 0) {
    pass += run_row(ZB_FAMILY_INTERLEAVED_1F1B, 4, &cfg);
    ran++;
  }
  printf("\nscale summary: %d of %d rows within both targets\n", pass, ran);
  return 0;
}
