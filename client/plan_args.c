/* plan_args.c — the `plan` noun's command line: options, the memory limit,
 * and the costs it describes (one rank's share, or per-stage times from a
 * --stage-costs file). See plan.h. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "zb_clock.h"
#include "zb_par_threads.h"

enum { PLAN_MAX_RANKS = 4096, PLAN_MAX_CHUNKS = 64, PLAN_MAX_MICROBATCHES = 1000000 };
_Static_assert(PLAN_MAX_RANKS <= ZB_MAX_RANKS, "--ranks fits a schedule (zb_schedule_new)");

void plan_args_init(plan_args *a, const char *cmd) {
  memset(a, 0, sizeof *a);
  a->cmd = cmd;
  a->rc = zb_rank_costs_default();
  a->objective = ZB_OBJ_MAKESPAN;
  a->placement = ZB_PLACE_INFER;
}

/* Arguments                                                           */

static bool plan_parse_choice(const char *cmd, const char *flag, const char *val, const char *const *names,
                              int n, int *out) {
  for (int k = 0; k < n; k++)
    if (strcmp(val, names[k]) == 0) {
      *out = k;
      return true;
    }
  char list[128] = "";
  for (int k = 0; k < n; k++) {
    strncat(list, k ? ", " : "", sizeof list - strlen(list) - 1);
    strncat(list, names[k], sizeof list - strlen(list) - 1);
  }
  /* zbctl plan's --output named a file before it named the format, as
   * every other command's does */
  bool file = strcmp(flag, "--output") == 0 && (strchr(val, '/') || strchr(val, '.'));
  cli_usage_error(cmd, "%s must be one of %s (got '%s')%s", flag, list, val,
                  file ? "; to write a file use --output-file FILE" : "");
  return false;
}

/* --mem-limit: "Np" (N times 1F1B's peak) or a plain number of M_F units. */
static bool plan_parse_limit(const char *cmd, const char *val, plan_args *a) {
  size_t n = strlen(val);
  bool per_p = n > 0 && val[n - 1] == 'p';
  char num[64];
  double x = 0;
  bool ok = n > (per_p ? 1u : 0u) && n < sizeof num;
  if (ok) {
    memcpy(num, val, n - (per_p ? 1 : 0));
    num[n - (per_p ? 1 : 0)] = '\0';
    char *end;
    x = strtod(num, &end);
    ok = *end == '\0' && num[0] != ' ' && isfinite(x) && x > 0;
  }
  if (!ok) {
    cli_usage_error(cmd,
                    "--mem-limit takes 'Np' (N times 1F1B's peak) or a positive number of M_F units "
                    "(got '%s')",
                    val);
    return false;
  }
  a->have_limit = true;
  a->limit_per_p = per_p;
  a->limit = x;
  return true;
}

bool plan_has_help(int argc, char **argv) {
  for (int k = 0; k < argc; k++)
    if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0)
      return true;
  return false;
}

int plan_parse(const cli_opt *opts, size_t n_opts, const char *const *formats, int n_formats, int argc,
               char **argv, plan_args *a) {
  cli_parser ps = {.cmd = a->cmd, .argc = argc, .argv = argv};
  const char *val;
  double x[4];
  int n, id, k;
  while ((id = cli_next(&ps, opts, n_opts, &val)) > 0) {
    bool ok = true;
    switch (id) {
    case OPT_SCHEDULE: a->schedule = val; break;
    case OPT_RANKS: ok = cli_parse_int(a->cmd, "--ranks", val, 1, PLAN_MAX_RANKS, &a->p); break;
    case OPT_MICROBATCHES:
      ok = cli_parse_int(a->cmd, "--microbatches", val, 1, PLAN_MAX_MICROBATCHES, &a->m);
      break;
    case OPT_CHUNKS: ok = cli_parse_int(a->cmd, "--chunks", val, 1, PLAN_MAX_CHUNKS, &a->v); break;
    case OPT_COSTS:
      if ((ok = cli_parse_doubles(a->cmd, "--costs", val, 3, 4, x, &n))) {
        a->rc.t_f = x[0];
        a->rc.t_b = x[1];
        a->rc.t_w = x[2];
        if (n == 4)
          a->rc.t_comm = x[3];
      }
      break;
    case OPT_STAGE_COSTS: a->stage_costs = val; break;
    case OPT_MEM:
      if ((ok = cli_parse_doubles(a->cmd, "--mem", val, 3, 3, x, &n))) {
        a->rc.m_f = x[0];
        a->rc.m_b = x[1];
        a->rc.m_w = x[2];
      }
      break;
    case OPT_MEM_LIMIT: ok = plan_parse_limit(a->cmd, val, a); break;
    case OPT_OBJECTIVE: {
      static const char *const names[] = {"makespan", "span"};
      if ((ok = plan_parse_choice(a->cmd, "--objective", val, names, 2, &k))) {
        a->objective = k == 0 ? ZB_OBJ_MAKESPAN : ZB_OBJ_SPAN;
        a->have_objective = true;
      }
      break;
    }
    case OPT_FORMAT: ok = plan_parse_choice(a->cmd, "--output", val, formats, n_formats, &a->format); break;
    case OPT_OUTPUT: a->output = val; break;
    case OPT_FROM_CSV: a->from_csv = val; break;
    case OPT_PLACEMENT: {
      static const char *const names[] = {"loop", "v"};
      if ((ok = plan_parse_choice(a->cmd, "--placement", val, names, 2, &k))) {
        a->placement = k == 0 ? ZB_PLACE_LOOP : ZB_PLACE_V;
        a->have_placement = true;
      }
      break;
    }
    case OPT_WIDTH: ok = cli_parse_int(a->cmd, "--width", val, 10, 10000, &a->width); break;
    case OPT_REMOTE: a->remote = true; break;
    case OPT_COORDINATOR: a->coordinator = val; break;
    default: break; /* OPT_HELP: handled before parsing */
    }
    if (!ok)
      return ZBCTL_EXIT_USAGE;
  }
  return id == CLI_ERROR ? ZBCTL_EXIT_USAGE : -1;
}

double plan_limit_units(const plan_args *a, int p) {
  if (!a->have_limit)
    return 0;
  return a->limit_per_p ? a->limit * p : a->limit;
}

/* Costs                                                               */

/* Reads the stage times of a --stage-costs file (text) into c, which has
 * the schedule's stage count. */
static bool plan_stage_times(const char *cmd, const char *path, const char *text, zb_costs *c) {
  int line_no = 0, s = 0;
  const char *p = text;
  while (*p) {
    const char *nl = strchr(p, '\n');
    size_t len = nl ? (size_t)(nl - p) : strlen(p);
    line_no++;
    char line[256];
    size_t n = 0;
    for (size_t k = 0; k < len && n < sizeof line - 1; k++)
      if (p[k] != ' ' && p[k] != '\t' && p[k] != '\r')
        line[n++] = p[k];
    line[n] = '\0';
    p = nl ? nl + 1 : p + len;
    if (n == 0 || line[0] == '#')
      continue;
    double t[3];
    int got = 0;
    char *q = line, *end;
    while (got < 3) {
      t[got] = strtod(q, &end);
      if (end == q || !isfinite(t[got]) || t[got] < 0)
        break;
      got++;
      q = end;
      if (*q != ',')
        break;
      q++;
    }
    if (got != 3 || *q != '\0' || len >= sizeof line) {
      cli_error(cmd, "%s:%d: expected 'T_F,T_B,T_W' (three numbers >= 0)", path, line_no);
      return false;
    }
    if (s == c->n_stages) {
      cli_error(cmd, "%s:%d: more stages than the schedule's %d (p*v)", path, line_no, c->n_stages);
      return false;
    }
    c->t_f[s] = t[0];
    c->t_b[s] = t[1];
    c->t_w[s] = t[2];
    s++;
  }
  if (s != c->n_stages) {
    cli_error(cmd, "%s has %d stage line%s, the schedule has %d stages (p*v)", path, s, s == 1 ? "" : "s",
              c->n_stages);
    return false;
  }
  return true;
}

zb_costs *plan_costs(const plan_args *a, int p, int v, const char *stage_text, double limit_units,
                     int *code) {
  if (!(a->rc.m_f > 0)) {
    *code = cli_usage_error(a->cmd, "--mem needs M_F > 0 (memory is reported in units of it)");
    return NULL;
  }
  zb_costs *c = zb_costs_from_rank_share(p, v, &a->rc, limit_units * a->rc.m_f);
  if (stage_text && !plan_stage_times(a->cmd, a->stage_costs, stage_text, c)) {
    *code = ZBCTL_EXIT_FAIL;
    zb_costs_free(c);
    return NULL;
  }
  zb_diag d;
  if (zb_costs_check(c, &d) != ZB_OK) {
    if (stage_text) {
      cli_error(a->cmd, "%s: %s", a->stage_costs, d.msg);
      *code = ZBCTL_EXIT_FAIL;
    } else {
      *code = cli_usage_error(a->cmd, "--costs/--mem: %s", d.msg);
    }
    zb_costs_free(c);
    return NULL;
  }
  return c;
}

zb_err plan_auto_search(const plan_args *a, zb_planner_result *r, zb_diag *diag) {
  zb_par par = zb_par_threads(zb_par_plan_width());
  zb_planner_request req = {.family = ZB_FAMILY_ZB_AUTO,
                            .p = a->p,
                            .m = a->m,
                            .rank = a->rc,
                            .mem_limit = plan_limit_units(a, a->p),
                            .objective = a->objective,
                            .keep_compute = plan_keeps_compute(a),
                            .figures_only = !plan_draws(a),
                            .clock = zb_clock_s,
                            .par = &par};
  return zb_planner_run(&req, r, diag);
}

zb_err plan_family(const plan_args *a, zb_family f, int v, const zb_costs *c, zb_planner_result *r,
                   zb_diag *diag) {
  zb_par par = zb_par_threads(zb_par_plan_width());
  zb_planner_request req = {.family = f,
                            .p = a->p,
                            .v = v,
                            .m = a->m,
                            .costs = c,
                            .objective = a->objective,
                            .keep_compute = plan_keeps_compute(a),
                            .figures_only = !plan_draws(a),
                            .clock = zb_clock_s,
                            .par = &par};
  return zb_planner_run(&req, r, diag);
}
