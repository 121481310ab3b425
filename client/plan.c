/* plan.c — the `plan` noun, offline on libzb.
 *
 * `zbctl plan` generates one schedule (or reads one from a CSV), lowers it
 * to point-to-point sends and receives, validates it, simulates it under
 * the cost model and writes it in one format. `zbctl plan compare` runs
 * every family on one shape and prints one row each. Costs and memory on
 * the command line describe one rank's whole share of the model (DESIGN
 * §3); libzb divides them among a family's chunks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_buf.h"
#include "zb_format.h"
#include "zb_lower.h"
#include "zb_plan.h"
#include "zb_sim.h"
#include "zb_validate.h"
#include "zbctl.h"

const char zbctl_plan_help[] =
    "usage: zbctl plan --schedule NAME --ranks P --microbatches M [OPTIONS]\n"
    "       zbctl plan --from-csv FILE [--placement loop|v] [OPTIONS]\n"
    "       zbctl plan compare --ranks P --microbatches M [...]   (see 'zbctl plan compare --help')\n"
    "\n"
    "Generates a schedule with libzb (or reads one from a PyTorch/torchtitan CSV),\n"
    "lowers it to point-to-point sends and receives, validates it (completeness,\n"
    "dependencies, placement, memory limit, deadlock), simulates it under the cost\n"
    "model and writes it out. Works offline.\n"
    "\n"
    "Schedule:\n"
    "  --schedule NAME       gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-auto,\n"
    "                        zb-v, v-half, v-min\n"
    "  --ranks P             pipeline ranks, p >= 1\n"
    "  --microbatches M      microbatches per iteration, m >= 1\n"
    "  --chunks V            stages per rank (default: the family's own; 2 for\n"
    "                        interleaved-1f1b and the V families, 1 otherwise)\n"
    "  --objective O         zb-auto only: makespan (default; one iteration whose\n"
    "                        optimizer step synchronises all ranks) or span (the\n"
    "                        longest per-rank span, the paper's bubble definition)\n"
    "  --from-csv FILE       read the schedule from FILE ('-': stdin) instead: one\n"
    "                        row per rank of action strings (0F1, 2I0 = B, 3W1,\n"
    "                        1B0 = fused BW, 1SEND_F0, ...); the shape comes from\n"
    "                        the file. It is validated before anything is written.\n"
    "  --placement loop|v    stage placement of a --from-csv file (default loop)\n"
    "\n"
    "Cost model (one rank's whole share of the model; a family with V chunks per\n"
    "rank gives each chunk op 1/V of the times and memory deltas):\n"
    "  --costs F,B,W[,COMM]  T_F, T_B, T_W, and T_comm per hop between ranks (not\n"
    "                        divided among chunks); default 1,1,1,0\n"
    "  --stage-costs FILE    per-stage times instead of --costs' T_F,T_B,T_W: one\n"
    "                        line 'T_F,T_B,T_W' per stage (already per chunk), p*v\n"
    "                        lines, '#' comments; T_comm still comes from --costs\n"
    "  --mem F,B,W           memory deltas M_F > 0, M_B <= 0, M_W <= 0, summing to 0;\n"
    "                        default 1,-0.5,-0.5\n"
    "  --mem-limit X         per-rank memory limit: 'Np' is N times 1F1B's peak (N*p\n"
    "                        units), a plain number is in units of one rank's M_F.\n"
    "                        zb-auto plans within it (without it: 1p); every\n"
    "                        schedule is validated against it (without it: no limit)\n"
    "\n"
    "Output:\n"
    "  --format FMT          ascii    terminal timeline and figures (default)\n"
    "                        json     the plan, its figures and the lowered actions\n"
    "                        csv      compute-only CSV; reads back with --from-csv\n"
    "                        csv-comm CSV with the SEND/RECV actions (lowered)\n"
    "                        trace    Chrome trace (chrome://tracing, Perfetto)\n"
    "                        svg      SVG timeline\n"
    "  --width N             columns of the ascii timeline (default 100)\n"
    "  -o, --output FILE     write to FILE (atomically: FILE.tmp, then renamed)\n"
    "                        instead of stdout\n"
    "  --remote              plan through zb-coordinator's Plan RPC instead of\n"
    "                        locally (ascii summary or json; --costs, not\n"
    "                        --stage-costs)\n"
    "  --coordinator ADDR    its address (default $ZB_COORDINATOR, else\n"
    "                        127.0.0.1:7070)\n"
    "  -h, --help            show this text\n"
    "\n"
    "Figures: makespan (one iteration); bubble_ratio, global: 1 - busy/(p*makespan);\n"
    "bubble_ratio_paper, the ZB paper's (section 5.3): (S_max - m(T_F+T_B+T_W))/S_max\n"
    "with S_max the longest per-rank span; peak memory per rank in units of one\n"
    "rank's M_F (1F1B's peak is p).\n"
    "\n"
    "Exit status: 0 success; 1 failure (an invalid or infeasible schedule, a file\n"
    "that cannot be read or parsed, output that cannot be written); 2 usage error\n"
    "(bad or missing option, unknown schedule, a shape the family refuses).\n";

const char zbctl_plan_compare_help[] =
    "usage: zbctl plan compare --ranks P --microbatches M [OPTIONS]\n"
    "\n"
    "Generates, lowers, validates and simulates every schedule family on one shape\n"
    "and the same costs, and prints one row per family: makespan, bubble_ratio\n"
    "(global: 1 - busy/(p*makespan)), bubble_ratio_paper (the ZB paper's:\n"
    "(S_max - m(T_F+T_B+T_W))/S_max), peak memory (the largest over ranks, in units\n"
    "of one rank's M_F; 1F1B's peak is p) and generation time. A family that\n"
    "refuses the shape gets its reason in its row instead; that is not a failure.\n"
    "\n"
    "Options:\n"
    "  --ranks P             pipeline ranks, p >= 1\n"
    "  --microbatches M      microbatches per iteration, m >= 1\n"
    "  --chunks V            chunks per rank of interleaved-1f1b (default 2); the\n"
    "                        other families use their own\n"
    "  --costs F,B,W[,COMM]  one rank's T_F, T_B, T_W and T_comm per hop; default\n"
    "                        1,1,1,0\n"
    "  --mem F,B,W           one rank's memory deltas; default 1,-0.5,-0.5\n"
    "  --mem-limit X         zb-auto's limit: 'Np' (N*p units) or units of one\n"
    "                        rank's M_F; default 1p. Other families are not limited.\n"
    "  --objective O         zb-auto's target: makespan (default) or span\n"
    "  --format FMT          table (default) or json\n"
    "  -o, --output FILE     write to FILE (atomically) instead of stdout\n"
    "  -h, --help            show this text\n"
    "\n"
    "Exit status: 0 success (refusals included); 1 when a generated schedule fails\n"
    "lowering, validation or simulation; 2 usage error.\n";

/* Bounds of the shape options: far above any real pipeline, low enough
 * that p*v*m stays in int. */
enum { PLAN_MAX_RANKS = 4096, PLAN_MAX_CHUNKS = 64, PLAN_MAX_MICROBATCHES = 1000000 };

typedef enum plan_format {
  PLAN_FMT_ASCII = 0,
  PLAN_FMT_JSON,
  PLAN_FMT_CSV,
  PLAN_FMT_CSV_COMM,
  PLAN_FMT_TRACE,
  PLAN_FMT_SVG,
} plan_format;

static const char *const plan_format_names[] = {"ascii", "json", "csv", "csv-comm", "trace", "svg"};

typedef enum compare_format { COMPARE_FMT_TABLE = 0, COMPARE_FMT_JSON } compare_format;

static const char *const compare_format_names[] = {"table", "json"};

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

static const cli_opt plan_options[] = {
    {"schedule", 0, true, OPT_SCHEDULE},
    {"ranks", 0, true, OPT_RANKS},
    {"microbatches", 0, true, OPT_MICROBATCHES},
    {"chunks", 0, true, OPT_CHUNKS},
    {"costs", 0, true, OPT_COSTS},
    {"stage-costs", 0, true, OPT_STAGE_COSTS},
    {"mem", 0, true, OPT_MEM},
    {"mem-limit", 0, true, OPT_MEM_LIMIT},
    {"objective", 0, true, OPT_OBJECTIVE},
    {"format", 0, true, OPT_FORMAT},
    {"output", 'o', true, OPT_OUTPUT},
    {"from-csv", 0, true, OPT_FROM_CSV},
    {"placement", 0, true, OPT_PLACEMENT},
    {"width", 0, true, OPT_WIDTH},
    {"remote", 0, false, OPT_REMOTE},
    {"coordinator", 0, true, OPT_COORDINATOR},
    {"help", 'h', false, OPT_HELP},
};

static const cli_opt compare_options[] = {
    {"ranks", 0, true, OPT_RANKS},
    {"microbatches", 0, true, OPT_MICROBATCHES},
    {"chunks", 0, true, OPT_CHUNKS},
    {"costs", 0, true, OPT_COSTS},
    {"mem", 0, true, OPT_MEM},
    {"mem-limit", 0, true, OPT_MEM_LIMIT},
    {"objective", 0, true, OPT_OBJECTIVE},
    {"format", 0, true, OPT_FORMAT},
    {"output", 'o', true, OPT_OUTPUT},
    {"help", 'h', false, OPT_HELP},
};

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

static void plan_args_init(plan_args *a, const char *cmd) {
  memset(a, 0, sizeof *a);
  a->cmd = cmd;
  a->rc = zb_rank_costs_default();
  a->objective = ZB_OBJ_MAKESPAN;
  a->placement = ZB_PLACE_LOOP;
}

/* ------------------------------------------------------------------ */
/* Arguments                                                           */
/* ------------------------------------------------------------------ */

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
  cli_usage_error(cmd, "%s must be one of %s (got '%s')", flag, list, val);
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

static bool plan_has_help(int argc, char **argv) {
  for (int k = 0; k < argc; k++)
    if (strcmp(argv[k], "--help") == 0 || strcmp(argv[k], "-h") == 0)
      return true;
  return false;
}

/* Parses argv into a. Returns -1 to go on, or the exit code to stop with. */
static int plan_parse(const cli_opt *opts, size_t n_opts, const char *const *formats, int n_formats, int argc,
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
    case OPT_FORMAT: ok = plan_parse_choice(a->cmd, "--format", val, formats, n_formats, &a->format); break;
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

/* The memory limit in units of one rank's M_F for p ranks; 0: none. */
static double plan_limit_units(const plan_args *a, int p) {
  if (!a->have_limit)
    return 0;
  return a->limit_per_p ? a->limit * p : a->limit;
}

/* ------------------------------------------------------------------ */
/* Costs                                                               */
/* ------------------------------------------------------------------ */

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

/* Costs for p ranks with v chunks: one rank's share divided among chunks,
 * times from stage_text when given, the limit converted from M_F units.
 * Returns NULL after printing why; *code says how to exit then. */
static zb_costs *plan_costs(const plan_args *a, int p, int v, const char *stage_text, double limit_units,
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

/* ------------------------------------------------------------------ */
/* One family, end to end                                              */
/* ------------------------------------------------------------------ */

typedef struct plan_run {
  zb_schedule *compute; /* as generated */
  zb_schedule *lowered; /* with SEND/RECV */
  zb_sim_result *sim;   /* of lowered */
  double gen_seconds;
  bool generated; /* false: the generator refused (diag says why) */
  zb_diag diag;
} plan_run;

static void plan_run_free(plan_run *r) {
  zb_schedule_free(r->compute);
  zb_schedule_free(r->lowered);
  zb_sim_result_free(r->sim);
  memset(r, 0, sizeof *r);
}

/* Generates family f on (p, v, m) under c (timing the generator), lowers,
 * validates and simulates the lowered lists. On failure r->diag says
 * where and why; the caller frees r either way. */
static zb_err plan_family(zb_family f, int p, int v, int m, const zb_costs *c, zb_objective obj,
                          plan_run *r) {
  zb_plan_request req = {.family = f, .p = p, .v = v, .m = m, .costs = c, .objective = obj};
  double t0 = cli_now();
  zb_err err = zb_plan_generate(&req, &r->compute, &r->diag);
  r->gen_seconds = cli_now() - t0;
  if (err)
    return err;
  r->generated = true;
  zb_diag d;
  if ((err = zb_lower(r->compute, c, &r->lowered, &d)))
    return zb_diag_set(&r->diag, err, "%s: lowering failed: %s", zb_family_name(f), d.msg);
  zb_violation viol;
  if ((err = zb_validate(r->lowered, c, &viol))) {
    char line[256];
    zb_violation_format(&viol, line, (int)sizeof line);
    return zb_diag_set(&r->diag, err, "%s: invalid schedule: %s", zb_family_name(f), line);
  }
  if ((err = zb_simulate(r->lowered, c, &r->sim, &d)))
    return zb_diag_set(&r->diag, err, "%s: simulation failed: %s", zb_family_name(f), d.msg);
  return ZB_OK;
}

static double plan_max_peak(const zb_sim_result *sim) {
  double peak = 0;
  for (int k = 0; k < sim->p; k++)
    if (sim->peak_memory_units[k] > peak)
      peak = sim->peak_memory_units[k];
  return peak;
}

/* ------------------------------------------------------------------ */
/* Output of one plan                                                  */
/* ------------------------------------------------------------------ */

typedef struct plan_output {
  const char *name;           /* family or file name */
  const zb_schedule *compute; /* for csv */
  const zb_schedule *lowered; /* for csv-comm */
  const zb_schedule *shown;   /* for the other formats, with sim */
  const zb_sim_result *sim;
  const zb_costs *costs;
  const zb_rank_costs *rank_costs; /* NULL with per-stage times */
  double limit_units;
  double gen_seconds; /* < 0: not generated (read from a file) */
} plan_output;

static void plan_ascii(const plan_args *a, const plan_output *o, zb_buf *b) {
  const zb_schedule *s = o->shown;
  zb_buf_printf(b, "%s: p=%d v=%d m=%d, %s placement; ", o->name, s->p, s->v, s->m,
                s->placement == ZB_PLACE_V ? "V" : "loop");
  if (o->rank_costs)
    zb_buf_printf(b, "one rank's share T_F=%g T_B=%g T_W=%g T_comm=%g\n", o->rank_costs->t_f,
                  o->rank_costs->t_b, o->rank_costs->t_w, o->costs->t_comm);
  else
    zb_buf_printf(b, "per-stage times from %s, T_comm=%g\n", a->stage_costs, o->costs->t_comm);
  zb_ascii_write(s, o->sim, a->width, b);
  zb_buf_printf(b, "max peak memory %.4g M_F", plan_max_peak(o->sim));
  if (o->limit_units > 0)
    zb_buf_printf(b, " (limit %.4g)", o->limit_units);
  if (o->gen_seconds >= 0)
    zb_buf_printf(b, "; generated in %.3f ms", o->gen_seconds * 1e3);
  zb_buf_puts(b, "; valid\n");
}

static int plan_emit(const plan_args *a, const plan_output *o) {
  zb_buf b = ZB_BUF_INIT;
  switch ((plan_format)a->format) {
  case PLAN_FMT_ASCII: plan_ascii(a, o, &b); break;
  case PLAN_FMT_JSON: {
    zb_plan_report r = {
        .schedule = o->name,
        .sched = o->shown,
        .costs = o->costs,
        .rank_costs = o->rank_costs,
        .mem_limit_units = o->limit_units,
        .sim = o->sim,
        .generation_seconds = o->gen_seconds >= 0 ? o->gen_seconds : 0,
    };
    zb_json_write(&r, &b);
    break;
  }
  case PLAN_FMT_CSV: zb_csv_write(o->compute, &b); break;
  case PLAN_FMT_CSV_COMM: zb_csv_write(o->lowered, &b); break;
  case PLAN_FMT_TRACE: zb_trace_write(o->shown, o->sim, &b); break;
  case PLAN_FMT_SVG: zb_svg_write(o->shown, o->sim, &b); break;
  }
  bool ok = cli_write_output(a->cmd, a->output, &b);
  zb_buf_free(&b);
  return ok ? ZBCTL_EXIT_OK : ZBCTL_EXIT_FAIL;
}

/* ------------------------------------------------------------------ */
/* zbctl plan --from-csv                                               */
/* ------------------------------------------------------------------ */

static int plan_from_csv(const plan_args *a, const char *stage_text) {
  const char *conflict = a->schedule         ? "--schedule"
                         : a->p              ? "--ranks"
                         : a->m              ? "--microbatches"
                         : a->v              ? "--chunks"
                         : a->have_objective ? "--objective"
                                             : NULL;
  if (conflict)
    return cli_usage_error(a->cmd, "--from-csv takes the schedule and its shape from the file; drop %s",
                           conflict);
  int code = ZBCTL_EXIT_FAIL;
  char *text = NULL;
  size_t len = 0;
  zb_schedule *s = NULL, *compute = NULL, *lowered = NULL;
  zb_costs *c = NULL;
  zb_sim_result *sim = NULL;
  zb_diag d;
  if (!cli_read_file(a->cmd, a->from_csv, &text, &len))
    goto cleanup;
  if (zb_csv_parse(text, len, a->placement, &s, &d) != ZB_OK) {
    cli_error(a->cmd, "%s: %s", a->from_csv, d.msg);
    goto cleanup;
  }
  double units = plan_limit_units(a, s->p);
  if (!(c = plan_costs(a, s->p, s->v, stage_text, units, &code)))
    goto cleanup;
  zb_violation viol;
  if (zb_validate(s, c, &viol) != ZB_OK) {
    char line[256];
    zb_violation_format(&viol, line, (int)sizeof line);
    bool hint = viol.kind == ZB_VIOL_PLACEMENT && s->placement == ZB_PLACE_LOOP && s->v == 2;
    cli_error(a->cmd, "%s: invalid schedule: %s%s", a->from_csv, line,
              hint ? " (a V-shaped schedule? try --placement v)" : "");
    goto cleanup;
  }
  if (zb_simulate(s, c, &sim, &d) != ZB_OK) {
    cli_error(a->cmd, "%s: simulation failed: %s", a->from_csv, d.msg);
    goto cleanup;
  }
  bool has_comm = zb_schedule_has_comm(s);
  if (a->format == PLAN_FMT_CSV && has_comm) {
    compute = zb_schedule_clone(s);
    zb_schedule_strip_comm(compute);
  }
  if (a->format == PLAN_FMT_CSV_COMM && !has_comm && zb_lower(s, c, &lowered, &d) != ZB_OK) {
    cli_error(a->cmd, "%s: lowering failed: %s", a->from_csv, d.msg);
    goto cleanup;
  }
  plan_output o = {
      .name = a->from_csv,
      .compute = compute ? compute : s,
      .lowered = lowered ? lowered : s,
      .shown = s,
      .sim = sim,
      .costs = c,
      .rank_costs = stage_text ? NULL : &a->rc,
      .limit_units = units,
      .gen_seconds = -1,
  };
  code = plan_emit(a, &o);
cleanup:
  free(text);
  zb_schedule_free(s);
  zb_schedule_free(compute);
  zb_schedule_free(lowered);
  zb_costs_free(c);
  zb_sim_result_free(sim);
  return code;
}

/* ------------------------------------------------------------------ */
/* zbctl plan                                                          */
/* ------------------------------------------------------------------ */

/* Exit code for a failed plan_family: the generator refusing what the
 * user asked for is a usage error, anything later a failure. */
static int plan_exit_for(const plan_run *r, zb_err err) {
  if (!r->generated && (err == ZB_ERR_INVALID_ARG || err == ZB_ERR_UNSUPPORTED))
    return ZBCTL_EXIT_USAGE;
  return ZBCTL_EXIT_FAIL;
}

static int plan_generated(const plan_args *a, const char *stage_text) {
  zb_family f;
  zb_diag d;
  if (zb_family_parse(a->schedule, &f, &d) != ZB_OK)
    return cli_usage_error(a->cmd, "%s", d.msg);
  if (!a->p)
    return cli_usage_error(a->cmd, "missing --ranks P");
  if (!a->m)
    return cli_usage_error(a->cmd, "missing --microbatches M");
  if (a->have_placement)
    return cli_usage_error(a->cmd, "--placement is for --from-csv; %s always uses %s placement",
                           zb_family_name(f), zb_family_placement(f) == ZB_PLACE_V ? "V" : "loop");
  if (a->have_objective && f != ZB_FAMILY_ZB_AUTO)
    return cli_usage_error(a->cmd, "--objective applies to zb-auto only");
  int v = a->v ? a->v : zb_family_default_chunks(f);
  if (zb_plan_check_shape(f, a->p, v, a->m, &d) != ZB_OK)
    return cli_usage_error(a->cmd, "%s", d.msg);
  double units = plan_limit_units(a, a->p);
  int code = ZBCTL_EXIT_FAIL;
  plan_run r = {0};
  zb_costs *c = plan_costs(a, a->p, v, stage_text, units, &code);
  if (!c)
    goto cleanup;
  zb_err err = plan_family(f, a->p, v, a->m, c, a->objective, &r);
  if (err) {
    cli_error(a->cmd, "%s", r.diag.msg);
    code = plan_exit_for(&r, err);
    goto cleanup;
  }
  plan_output o = {
      .name = zb_family_name(f),
      .compute = r.compute,
      .lowered = r.lowered,
      .shown = r.lowered,
      .sim = r.sim,
      .costs = c,
      .rank_costs = stage_text ? NULL : &a->rc,
      .limit_units = units,
      .gen_seconds = r.gen_seconds,
  };
  code = plan_emit(a, &o);
cleanup:
  plan_run_free(&r);
  zb_costs_free(c);
  return code;
}

/* zbctl plan --remote: the same request, planned by zb-coordinator. */
static int plan_remote(const plan_args *a, const char *stage_text) {
#ifdef ZB_WITH_SERVICE
  if (a->from_csv)
    return cli_usage_error(a->cmd, "--remote plans a --schedule; --from-csv is offline only");
  if (stage_text)
    return cli_usage_error(a->cmd, "--remote takes --costs; --stage-costs is offline only");
  if (a->format != 0 && a->format != 1)
    return cli_usage_error(a->cmd, "--remote prints ascii (a summary) or json");
  if (a->output)
    return cli_usage_error(a->cmd, "--remote prints to stdout; -o is offline only");
  if (!a->p || !a->m)
    return cli_usage_error(a->cmd, "missing --ranks P or --microbatches M");
  zb_job_spec spec;
  zb_job_spec_default(&spec);
  snprintf(spec.name, sizeof spec.name, "plan");
  spec.ranks = a->p;
  spec.microbatches = a->m;
  snprintf(spec.schedule, sizeof spec.schedule, "%s", a->schedule);
  spec.chunks = a->v;
  spec.mem_limit = plan_limit_units(a, a->p);
  spec.costs = a->rc;
  return zbctl_plan_remote(a->coordinator, 60000, &spec,
                           a->have_objective ? (a->objective == ZB_OBJ_SPAN ? "span" : "makespan") : NULL,
                           a->format == 1);
#else
  (void)stage_text;
  return cli_usage_error(a->cmd,
                         "--remote needs zbctl built with the service (gRPC); this build is offline only");
#endif
}

int zbctl_plan_run(const zbctl_command *cmd, int argc, char **argv) {
  if (plan_has_help(argc, argv)) {
    fputs(cmd->help, stdout);
    return ZBCTL_EXIT_OK;
  }
  plan_args a;
  plan_args_init(&a, "plan");
  int code = plan_parse(plan_options, PLAN_COUNT(plan_options), plan_format_names,
                        (int)PLAN_COUNT(plan_format_names), argc, argv, &a);
  if (code >= 0)
    return code;
  if (!a.from_csv && !a.schedule)
    return cli_usage_error(a.cmd, "missing --schedule NAME (or --from-csv FILE)");
  char *stage_text = NULL;
  size_t stage_len;
  if (a.stage_costs && !cli_read_file(a.cmd, a.stage_costs, &stage_text, &stage_len))
    return ZBCTL_EXIT_FAIL;
  if (a.remote)
    code = plan_remote(&a, stage_text);
  else
    code = a.from_csv ? plan_from_csv(&a, stage_text) : plan_generated(&a, stage_text);
  free(stage_text);
  return code;
}

/* ------------------------------------------------------------------ */
/* zbctl plan compare                                                  */
/* ------------------------------------------------------------------ */

typedef struct compare_row {
  int v;
  bool ok, generated;
  double makespan, bubble, bubble_paper, peak, gen_ms;
  zb_diag why; /* when !ok */
} compare_row;

static void compare_table(const plan_args *a, int vi, double units, const compare_row *rows, zb_buf *b) {
  zb_buf_printf(b, "p=%d m=%d; one rank's share: T_F=%g T_B=%g T_W=%g T_comm=%g, M_F=%g M_B=%g M_W=%g\n",
                a->p, a->m, a->rc.t_f, a->rc.t_b, a->rc.t_w, a->rc.t_comm, a->rc.m_f, a->rc.m_b, a->rc.m_w);
  zb_buf_printf(b, "interleaved-1f1b: v=%d; zb-auto: memory limit %g M_F (%gp), objective %s\n", vi, units,
                units / a->p, a->objective == ZB_OBJ_SPAN ? "span" : "makespan");
  zb_buf_puts(b, "bubble_ratio: global, 1 - busy/(p*makespan); bubble_ratio_paper: the ZB paper's, "
                 "(S_max - m(T_F+T_B+T_W))/S_max; peak_mem: max over ranks, M_F units\n\n");
  zb_buf_printf(b, "%-16s %2s %12s %12s %18s %9s %10s\n", "schedule", "v", "makespan", "bubble_ratio",
                "bubble_ratio_paper", "peak_mem", "gen_ms");
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    const compare_row *r = &rows[f];
    if (r->ok)
      zb_buf_printf(b, "%-16s %2d %12.6g %12.4f %18.4f %9.4g %10.3f\n", zb_family_name((zb_family)f), r->v,
                    r->makespan, r->bubble, r->bubble_paper, r->peak, r->gen_ms);
    else
      zb_buf_printf(b, "%-16s %2d  %s: %s\n", zb_family_name((zb_family)f), r->v,
                    r->generated ? "FAILED" : "refused", r->why.msg);
  }
}

static void compare_json(const plan_args *a, int vi, double units, const compare_row *rows, zb_buf *b) {
  zb_buf_printf(b, "{\n  \"ranks\": %d,\n  \"microbatches\": %d,\n  \"interleaved_chunks\": %d,\n", a->p,
                a->m, vi);
  zb_buf_puts(b, "  \"costs\": {");
  const char *names[7] = {"t_f", "t_b", "t_w", "t_comm", "m_f", "m_b", "m_w"};
  const double vals[7] = {a->rc.t_f, a->rc.t_b, a->rc.t_w, a->rc.t_comm, a->rc.m_f, a->rc.m_b, a->rc.m_w};
  for (int k = 0; k < 7; k++) {
    zb_buf_printf(b, "%s\"%s\": ", k ? ", " : "", names[k]);
    zb_buf_json_num(b, vals[k]);
  }
  zb_buf_puts(b, "},\n  \"zb_auto_mem_limit\": ");
  zb_buf_json_num(b, units);
  zb_buf_printf(b, ",\n  \"zb_auto_objective\": \"%s\",\n  \"families\": [",
                a->objective == ZB_OBJ_SPAN ? "span" : "makespan");
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    const compare_row *r = &rows[f];
    zb_buf_puts(b, f ? ",\n    {\"schedule\": " : "\n    {\"schedule\": ");
    zb_buf_json_str(b, zb_family_name((zb_family)f));
    zb_buf_printf(b, ", \"chunks\": %d", r->v);
    const char *keys[5] = {"makespan", "bubble_ratio", "bubble_ratio_paper", "peak_memory", "generation_ms"};
    const double nums[5] = {r->makespan, r->bubble, r->bubble_paper, r->peak, r->gen_ms};
    for (int k = 0; k < 5; k++) {
      zb_buf_printf(b, ", \"%s\": ", keys[k]);
      zb_buf_json_num(b, r->ok ? nums[k] : NAN);
    }
    zb_buf_puts(b, ", \"error\": ");
    if (r->ok)
      zb_buf_puts(b, "null");
    else
      zb_buf_json_str(b, r->why.msg);
    zb_buf_puts(b, "}");
  }
  zb_buf_puts(b, "\n  ]\n}\n");
}

int zbctl_plan_compare(const zbctl_command *cmd, int argc, char **argv) {
  if (plan_has_help(argc, argv)) {
    fputs(cmd->help, stdout);
    return ZBCTL_EXIT_OK;
  }
  plan_args a;
  plan_args_init(&a, "plan compare");
  int code = plan_parse(compare_options, PLAN_COUNT(compare_options), compare_format_names,
                        (int)PLAN_COUNT(compare_format_names), argc, argv, &a);
  if (code >= 0)
    return code;
  if (!a.p)
    return cli_usage_error(a.cmd, "missing --ranks P");
  if (!a.m)
    return cli_usage_error(a.cmd, "missing --microbatches M");
  int vi = a.v ? a.v : 2;
  if (vi < 2)
    return cli_usage_error(a.cmd, "--chunks is interleaved-1f1b's and needs at least 2 (got %d)", vi);
  double units = a.have_limit ? plan_limit_units(&a, a.p) : a.p;
  zb_costs *probe = plan_costs(&a, a.p, 1, NULL, 0, &code);
  if (!probe)
    return code;
  zb_costs_free(probe);

  compare_row rows[ZB_FAMILY_COUNT_];
  code = ZBCTL_EXIT_OK;
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++) {
    zb_family fam = (zb_family)f;
    compare_row *row = &rows[f];
    memset(row, 0, sizeof *row);
    row->v = fam == ZB_FAMILY_INTERLEAVED_1F1B ? vi : zb_family_default_chunks(fam);
    double limit = fam == ZB_FAMILY_ZB_AUTO ? units * a.rc.m_f : 0;
    zb_costs *c = zb_costs_from_rank_share(a.p, row->v, &a.rc, limit);
    plan_run r = {0};
    zb_err err = plan_family(fam, a.p, row->v, a.m, c, a.objective, &r);
    if (err) {
      row->why = r.diag;
      row->generated = r.generated;
      if (r.generated) {
        cli_error(a.cmd, "%s", r.diag.msg);
        code = ZBCTL_EXIT_FAIL;
      }
    } else {
      row->ok = true;
      row->makespan = r.sim->makespan;
      row->bubble = r.sim->bubble_ratio;
      row->bubble_paper = r.sim->bubble_ratio_paper;
      row->peak = plan_max_peak(r.sim);
      row->gen_ms = r.gen_seconds * 1e3;
    }
    plan_run_free(&r);
    zb_costs_free(c);
  }
  zb_buf b = ZB_BUF_INIT;
  if (a.format == COMPARE_FMT_JSON)
    compare_json(&a, vi, units, rows, &b);
  else
    compare_table(&a, vi, units, rows, &b);
  if (!cli_write_output(a.cmd, a.output, &b))
    code = ZBCTL_EXIT_FAIL;
  zb_buf_free(&b);
  return code;
}
