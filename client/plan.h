/* plan.h — what the `plan` noun's files share (client/plan.c, plan_args.c,
 * plan_compare.c): the parsed command line, its options and the costs it
 * describes. Internal to zbctl. */
#ifndef ZBCTL_PLAN_H
#define ZBCTL_PLAN_H

#include <stdbool.h>
#include <stddef.h>

#include "zb_planner.h"
#include "zbctl.h"

#define PLAN_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* What the command line said; 0 / NULL where it said nothing. */
typedef struct plan_args {
  const char *cmd; /* "plan" or "plan compare", for messages */
  const char *schedule, *from_csv, *stage_costs, *output;
  int p, v, m, width;
  zb_rank_costs rc;
  bool have_limit, limit_per_p;
  double limit; /* as given: N of "Np", or units of one rank's M_F */
  bool have_objective, have_placement;
  zb_objective objective;
  zb_placement placement;
  int format;              /* plan_format or compare_format */
  bool remote;             /* plan through zb-coordinator's Plan RPC */
  const char *coordinator; /* its address; NULL: $ZB_COORDINATOR or the default */
} plan_args;

enum plan_opt_id {
  OPT_SCHEDULE = 1,
  OPT_RANKS,
  OPT_MICROBATCHES,
  OPT_CHUNKS,
  OPT_COSTS,
  OPT_STAGE_COSTS,
  OPT_MEM,
  OPT_MEM_LIMIT,
  OPT_OBJECTIVE,
  OPT_FORMAT,
  OPT_OUTPUT,
  OPT_FROM_CSV,
  OPT_PLACEMENT,
  OPT_WIDTH,
  OPT_REMOTE,
  OPT_COORDINATOR,
  OPT_HELP,
};

typedef enum plan_format {
  PLAN_FMT_ASCII = 0,
  PLAN_FMT_JSON,
  PLAN_FMT_CSV,
  PLAN_FMT_CSV_COMM,
  PLAN_FMT_TRACE,
  PLAN_FMT_SVG,
} plan_format;
/* What a's output needs of the plan: the compute-only lists (csv), and
 * every action's simulated times (the drawings: ascii, trace, svg). At
 * scale each is a large share of the peak, so the rest go without. */
static inline bool plan_keeps_compute(const plan_args *a) {
  return a->format == PLAN_FMT_CSV;
}
static inline bool plan_draws(const plan_args *a) {
  return a->format == PLAN_FMT_ASCII || a->format == PLAN_FMT_TRACE || a->format == PLAN_FMT_SVG;
}
typedef enum compare_format { COMPARE_FMT_TABLE = 0, COMPARE_FMT_JSON } compare_format;

#define PLAN_COUNT(a) (sizeof(a) / sizeof((a)[0]))

void plan_args_init(plan_args *a, const char *cmd);
/* Whether argv asks for --help (-h). */
bool plan_has_help(int argc, char **argv);
/* Parses argv into a. Returns -1 to go on, or the exit code to stop with. */
int plan_parse(const cli_opt *opts, size_t n_opts, const char *const *formats, int n_formats, int argc,
               char **argv, plan_args *a);
/* The memory limit in units of one rank's M_F for p ranks; 0: none. */
double plan_limit_units(const plan_args *a, int p);
/* Costs for p ranks with v chunks: one rank's share divided among chunks,
 * times from stage_text when given, the limit converted from M_F units.
 * Returns NULL after printing why; *code says how to exit then. */
zb_costs *plan_costs(const plan_args *a, int p, int v, const char *stage_text, double limit_units, int *code);
/* Plans family f with v chunks on a's shape under c (a's objective) with
 * libzb's pipeline, keeping the compute-only lists and timing the
 * generator. On failure diag says which step and why; free *r either way. */
/* zb-auto over every placement (zb_planner_search): the request's rank
 * costs and limit, chunks left open. */
zb_err plan_auto_search(const plan_args *a, zb_planner_result *r, zb_diag *diag);
zb_err plan_family(const plan_args *a, zb_family f, int v, const zb_costs *c, zb_planner_result *r,
                   zb_diag *diag);

#endif
