/* zb_bench_scale — the whole planning pipeline of every family at scale
 * (default p = 256, m = 4096): generate, lower, validate and simulate,
 * each timed, and the process's peak memory, per family in a child
 * process with a time limit. The phases are the coordinator's
 * (zb_job_plan): the compute-only lists are freed once lowered, and the
 * simulation keeps the figures only. Targets (issue 12): the whole plan
 * under 1 s and 500 MB. Prints PASS/MISS; never fails on a slow family.
 *
 * usage: zb_bench_scale [P M] [--timeout S] [--family NAME] [--repeat N]
 * (--repeat: each family N times, the fastest run's figures; this
 * machine's timings vary by a third from run to run) */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zb_clock.h"
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"

typedef struct phases {
  int ok;
  double ms[4]; /* generate, lower, validate, simulate */
  double rss_mb;
  char why[200];
} phases;

static void run_phases(zb_family f, int p, int m, phases *out) {
  memset(out, 0, sizeof *out);
  int v = f == ZB_FAMILY_INTERLEAVED_1F1B ? 2 : zb_family_default_chunks(f);
  zb_rank_costs rc = zb_rank_costs_default();
  zb_costs *c = zb_costs_from_rank_share(p, v, &rc, 0);
  zb_plan_request gen = {.family = f, .p = p, .v = v, .m = m, .costs = c};
  zb_schedule *s = NULL, *low = NULL;
  zb_sim_result *sim = NULL;
  zb_violation viol;
  zb_diag d = {{0}};
  double t0 = zb_clock_s();
  zb_err err = zb_plan_generate(&gen, &s, &d);
  double t1 = zb_clock_s();
  if (!err)
    err = zb_lower(s, c, &low, &d);
  zb_schedule_free(s); /* as the coordinator's pipeline does (zb_job_plan) */
  s = NULL;
  double t2 = zb_clock_s();
  if (!err && zb_validate(low, c, &viol) != ZB_OK)
    err = zb_diag_set(&d, ZB_ERR_INVALID_SCHEDULE, "invalid");
  double t3 = zb_clock_s();
  if (!err)
    err = zb_simulate_figures(low, c, &sim, &d);
  double t4 = zb_clock_s();
  out->ok = !err;
  snprintf(out->why, sizeof out->why, "%.190s", err ? d.msg : "");
  double t[5] = {t0, t1, t2, t3, t4};
  for (int k = 0; k < 4; k++)
    out->ms[k] = 1e3 * (t[k + 1] - t[k]);
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  out->rss_mb = (double)ru.ru_maxrss / 1024.0;
  zb_sim_result_free(sim);
  zb_schedule_free(low);
  zb_schedule_free(s);
  zb_costs_free(c);
}

/* run_phases in a child killed after timeout_s. */
static void run_child(zb_family f, int p, int m, int timeout_s, phases *out) {
  int fds[2];
  if (pipe(fds) != 0) {
    run_phases(f, p, m, out);
    return;
  }
  fflush(stdout);
  pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    alarm((unsigned)timeout_s);
    phases ph;
    run_phases(f, p, m, &ph);
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

int main(int argc, char **argv) {
  int p = 256, m = 4096, timeout_s = 120, repeat = 1, only = -1;
  for (int i = 1; i < argc; i++) {
    zb_family fam;
    if (strcmp(argv[i], "--timeout") == 0 && i + 1 < argc)
      timeout_s = atoi(argv[++i]);
    else if (strcmp(argv[i], "--repeat") == 0 && i + 1 < argc && atoi(argv[i + 1]) > 0)
      repeat = atoi(argv[++i]);
    else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc &&
             zb_family_parse(argv[i + 1], &fam, NULL) == ZB_OK) {
      only = (int)fam;
      i++;
    } else if (i + 1 < argc && atoi(argv[i]) > 0 && atoi(argv[i + 1]) > 0) {
      p = atoi(argv[i]);
      m = atoi(argv[++i]);
    } else {
      fprintf(stderr, "usage: zb_bench_scale [P M] [--timeout S] [--family NAME] [--repeat N]\n");
      return 2;
    }
  }
  printf("zb_bench_scale: p=%d m=%d, equal costs, each family in a child (limit %d s); targets: 1000 ms, 500 "
         "MB\n\n",
         p, m, timeout_s);
  printf("%-18s %10s %10s %10s %10s %10s %9s  %s\n", "schedule", "gen ms", "lower ms", "valid ms", "sim ms",
         "total ms", "peak MB", "verdict");
  int pass = 0, ran = 0;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    if (only >= 0 && f != only)
      continue;
    phases ph;
    double total = 0;
    for (int k = 0; k < repeat; k++) {
      phases one;
      run_child((zb_family)f, p, m, timeout_s, &one);
      double t = one.ms[0] + one.ms[1] + one.ms[2] + one.ms[3];
      if (k == 0 || (one.ok && t < total)) {
        ph = one;
        total = t;
      }
    }
    ran++;
    bool met = ph.ok && total < 1000 && ph.rss_mb < 500;
    pass += met;
    printf("%-18s", zb_family_name((zb_family)f));
    if (ph.ok)
      printf(" %10.1f %10.1f %10.1f %10.1f %10.1f %9.0f  %s\n", ph.ms[0], ph.ms[1], ph.ms[2], ph.ms[3], total,
             ph.rss_mb, met ? "PASS" : "MISS");
    else
      printf("  %s\n", ph.why);
  }
  printf("\nscale summary: %d of %d families within both targets\n", pass, ran);
  return 0;
}
