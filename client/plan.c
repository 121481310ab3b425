/* plan.c — the `plan` noun, offline on libzb.
 *
 * `zbctl plan` generates one schedule with libzb's pipeline (zb_planner.h:
 * generate, lower, validate, simulate), or reads one from a CSV, and
 * writes it in one format. `zbctl plan compare` (plan_compare.c) runs
 * every family on one shape. Costs and memory on the command line describe
 * one rank's whole share of the model (docs/schedules.md, Cost and memory
 * model); libzb divides them among a family's chunks.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plan.h"
#include "zb_alloc.h"
#include "zb_buf.h"
#include "zb_clock.h"
#include "zb_format.h"
#include "zb_planner.h"

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
    "                        zb-v, v-half, v-min, zb-interleaved, dualpipe-v\n"
    "  --ranks P             pipeline ranks, p >= 1\n"
    "  --microbatches M      microbatches per iteration, m >= 1\n"
    "  --chunks V            stages per rank (default: the family's own; 2 for\n"
    "                        interleaved-1f1b and the V families, 1 otherwise)\n"
    "  --objective O         zb-auto only: makespan (default; one iteration whose\n"
    "                        optimizer step synchronises all ranks) or span (the\n"
    "                        longest per-rank span, the paper's bubble definition)\n"
    "  --from-csv FILE       read the schedule from FILE ('-': stdin) instead: one\n"
    "                        row per rank of action strings (0F1, 2I0 = B, 3W1,\n"
    "                        1B0 = fused BW, 1SEND_F0, (0F3;3B1)OVERLAP_F_B, and\n"
    "                        PyTorch's waits and FSDP kinds as markers); the shape\n"
    "                        comes from the file. It is validated before anything\n"
    "                        is written.\n"
    "  --placement loop|v    stage placement of a --from-csv file (default: from the\n"
    "                        file: V when every row r holds only stages r and\n"
    "                        2p-1-r, else loop)\n"
    "\n"
    "Cost model (one rank's whole share of the model; a family with V chunks per\n"
    "rank gives each chunk op 1/V of the times and memory deltas):\n"
    "  --costs F,B,W[,COMM]  T_F, T_B, T_W, and T_comm per hop between ranks (not\n"
    "                        divided among chunks); default 1,1,1,0\n"
    "  --stage-costs FILE    per-stage times instead of --costs' T_F,T_B,T_W: one\n"
    "                        line 'T_F,T_B,T_W' per stage (already per chunk), p*v\n"
    "                        lines, '#' comments; T_comm still comes from --costs\n"
    "  --mem F,B,W           memory deltas M_F > 0, M_W <= 0, summing to 0 (M_B may be > 0);\n"
    "                        default 1,-0.5,-0.5\n"
    "  --mem-limit X         per-rank memory limit: 'Np' is N times 1F1B's peak (N*p\n"
    "                        units), a plain number is in units of one rank's M_F.\n"
    "                        zb-auto plans within it (without it: 1p); every\n"
    "                        schedule is validated against it (without it: no limit)\n"
    "\n"
    "Output:\n"
    "  -o, --output FMT      (or --format FMT), as every zbctl command:\n"
    "                        ascii    terminal timeline and figures (default)\n"
    "                        json     the plan, its figures and the lowered actions\n"
    "                        csv      compute-only CSV; reads back with --from-csv\n"
    "                        csv-comm PyTorch's compute_comms CSV: lowered lists,\n"
    "                                 WAIT_SENDs, each stage's REDUCE_GRAD (runs\n"
    "                                 with _PipelineScheduleRuntime's defaults)\n"
    "                        trace    Chrome trace (chrome://tracing, Perfetto)\n"
    "                        svg      SVG timeline\n"
    "  --width N             columns of the ascii timeline (default 100)\n"
    "  --output-file FILE    write to FILE (atomically: FILE.tmp, then renamed)\n"
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
    "rank's M_F (1F1B's peak is p). Every plan, generated or read, is simulated\n"
    "twice: the headline figures (shown first; JSON's top level) are the lowered\n"
    "plan's, as workers run it, each transfer a send and receive that meet;\n"
    "'compute-only' (JSON: compute_only) are the compute lists' alone, each\n"
    "transfer only T_comm of latency (the paper's view). With T_comm = 0 they\n"
    "agree. A plan written with -o csv and read back with --from-csv has the\n"
    "same figures.\n"
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
    "zb-auto's row searches every placement within its limit (loop with 1 to 4\n"
    "chunks, V), as zbctl plan's zb-auto does, and names the family it chose; its\n"
    "v column is the chosen chunks.\n"
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
    "  -o, --output FMT      table (default) or json (--format FMT too)\n"
    "  --output-file FILE    write to FILE (atomically) instead of stdout\n"
    "  -h, --help            show this text\n"
    "\n"
    "Exit status: 0 success (refusals included); 1 when a generated schedule fails\n"
    "lowering, validation or simulation; 2 usage error.\n";

/* Bounds of the shape options: far above any real pipeline, low enough
 * that p*v*m stays in int. */
static const char *const plan_format_names[] = {"ascii", "json", "csv", "csv-comm", "trace", "svg"};

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
    {"output", 'o', true, OPT_FORMAT},
    {"output-file", 0, true, OPT_OUTPUT},
    {"from-csv", 0, true, OPT_FROM_CSV},
    {"placement", 0, true, OPT_PLACEMENT},
    {"width", 0, true, OPT_WIDTH},
    {"remote", 0, false, OPT_REMOTE},
    {"coordinator", 0, true, OPT_COORDINATOR},
    {"help", 'h', false, OPT_HELP},
};

/* Output of one plan                                                  */

typedef struct plan_output {
  const char *name;                 /* family or file name */
  const zb_schedule *compute;       /* for csv */
  const zb_schedule *lowered;       /* for csv-comm */
  const zb_schedule *shown;         /* for the other formats, with sim */
  const zb_sim_result *sim;         /* the headline: of the lowered plan, as workers run it */
  const zb_sim_result *sim_compute; /* of the compute-only lists */
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
  if (o->sim_compute)
    zb_buf_printf(b,
                  "compute-only lists (transfers as latency, the paper's view): makespan %g, bubble_ratio "
                  "%.4f, bubble_ratio_paper %.4f\n",
                  o->sim_compute->makespan, o->sim_compute->bubble_ratio, o->sim_compute->bubble_ratio_paper);
  zb_buf_printf(b, "max peak memory %.4g M_F", zb_sim_max_peak(o->sim));
  if (o->limit_units > 0)
    zb_buf_printf(b, " (limit %.4g)", o->limit_units);
  if (o->gen_seconds >= 0)
    zb_buf_printf(b, "; generated in %.3f ms", o->gen_seconds * 1e3);
  zb_buf_puts(b, "; valid\n");
}

static int plan_emit(const plan_args *a, const plan_output *o) {
  zb_buf b = ZB_BUF_INIT;
  cli_stream out; /* written as it is formatted: at scale a document is hundreds of MB */
  if (!cli_stream_begin(&out, a->cmd, a->output, &b))
    return ZBCTL_EXIT_FAIL;
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
        .sim_compute = o->sim_compute,
        .generation_seconds = o->gen_seconds >= 0 ? o->gen_seconds : 0,
    };
    zb_json_write(&r, &b);
    break;
  }
  case PLAN_FMT_CSV: zb_csv_write(o->compute, &b); break;
  case PLAN_FMT_CSV_COMM: zb_csv_write_comms(o->lowered, &b); break;
  case PLAN_FMT_TRACE: zb_trace_write(o->shown, o->sim, &b); break;
  case PLAN_FMT_SVG: zb_svg_write(o->shown, o->sim, &b); break;
  }
  bool ok = cli_stream_end(&out, &b);
  zb_buf_free(&b);
  return ok ? ZBCTL_EXIT_OK : ZBCTL_EXIT_FAIL;
}

/* zbctl plan --from-csv                                               */

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
  zb_schedule *s = NULL;
  zb_costs *c = NULL;
  zb_planner_result r = {0};
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
  zb_planner_given_request req = {.name = a->from_csv,
                                  .schedule = s,
                                  .costs = c,
                                  .keep_compute = plan_keeps_compute(a),
                                  .figures_only = !plan_draws(a)};
  if (zb_planner_given(&req, &r, &d) != ZB_OK) {
    bool hint = r.violation.kind == ZB_VIOL_PLACEMENT && s->placement == ZB_PLACE_LOOP && s->v == 2 &&
                a->have_placement;
    cli_error(a->cmd, "%s%s", d.msg, hint ? " (a V-shaped schedule? try --placement v)" : "");
    goto cleanup;
  }
  if (r.relowered)
    fprintf(stderr,
            "zbctl plan: %s: PyTorch's compute_comms order (asynchronous sends and receives): "
            "planned from its compute order, lowered anew\n",
            a->from_csv);
  plan_output o = {
      .name = a->from_csv,
      .compute = r.compute,
      .lowered = r.lowered,
      .shown = r.lowered,
      .sim = r.sim,
      .sim_compute = r.sim_compute,
      .costs = c,
      .rank_costs = stage_text ? NULL : &a->rc,
      .limit_units = units,
      .gen_seconds = -1,
  };
  code = plan_emit(a, &o);
cleanup:
  free(text);
  zb_schedule_free(s);
  zb_costs_free(c);
  zb_planner_result_free(&r);
  return code;
}

/* zbctl plan                                                          */

/* Exit code for a failed plan: the generator refusing what the user asked
 * for is a usage error, anything later a failure. */
static int plan_exit_for(const zb_planner_result *r, zb_err err) {
  if (r->failed <= ZB_PLANNER_GENERATE && (err == ZB_ERR_INVALID_ARG || err == ZB_ERR_UNSUPPORTED))
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
  zb_planner_result r = {0};
  zb_costs *c = plan_costs(a, a->p, v, stage_text, units, &code);
  if (!c)
    goto cleanup;
  zb_diag pd;
  /* zb-auto without --chunks or --stage-costs searches every placement */
  bool search = f == ZB_FAMILY_ZB_AUTO && !a->v && !stage_text;
  zb_err err = search ? plan_auto_search(a, &r, &pd) : plan_family(a, f, v, c, &r, &pd);
  if (err) {
    cli_error(a->cmd, "%s", pd.msg);
    code = plan_exit_for(&r, err);
    goto cleanup;
  }
  char name[96];
  snprintf(name, sizeof name, "zb-auto (chose %s, %d chunk%s)", zb_family_name(r.chosen), r.v,
           r.v == 1 ? "" : "s");
  plan_output o = {
      .name = search ? name : zb_family_name(f),
      .compute = r.compute,
      .lowered = r.lowered,
      .shown = r.lowered,
      .sim = r.sim,
      .sim_compute = r.sim_compute,
      .costs = search ? r.costs : c,
      .rank_costs = stage_text ? NULL : &a->rc,
      .limit_units = units,
      .gen_seconds = r.generate_seconds,
  };
  code = plan_emit(a, &o);
cleanup:
  zb_planner_result_free(&r);
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
