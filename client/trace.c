/* trace.c — `zbctl trace JOB`: one traced iteration of a job, every rank's
 * measured per-op timeline (GetIteration; the coordinator already placed
 * the ranks on its clock) beside the plan of the schedule that ran it,
 * planned here with libzb from the job's spec (GetJob) as the coordinator
 * plans it. Written as a Chrome trace or an SVG (lib/zb_format.h,
 * zb_trace_write_measured and zb_svg_write_measured).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_format.h"
#include "zb_job_plan.h"
#include "zb_methods.h"
#include "zb_timeline_pb.h"
#include "zb_wire.h"
#include "zbctl.h"

const char zbctl_trace_help[] =
    "usage: zbctl trace JOB_ID [--iteration N] [-o trace|svg] [--output-file FILE]\n"
    "                   [--coordinator ADDR] [--timeout-ms N]\n"
    "\n"
    "Writes one traced iteration of a job: what every rank measured, op by op,\n"
    "beside what the plan predicted. A job traces iterations 0, N, 2N, ... (its\n"
    "spec's trace_every, default 10; -1: none); the coordinator places the ranks'\n"
    "timelines on its clock. The planned timeline is the schedule that ran the\n"
    "iteration, planned here from the job's shape and costs and simulated (after\n"
    "a schedule update: that family with its default chunks and no memory limit,\n"
    "as update-schedule plans it without --chunks and --mem-limit). The measured\n"
    "side's predicted figures are the coordinator's: from the spec's costs, or\n"
    "from the costs learned from the timelines (predicted_from_learned).\n"
    "\n"
    "  --iteration N         the iteration (0-based; default: the last traced one);\n"
    "                        one that was not traced is an error\n"
    "  -o, --output FMT      trace  Chrome trace JSON (chrome://tracing, Perfetto;\n"
    "                               default): process \"planned (...)\" with a\n"
    "                               thread per rank and an event per compute op at\n"
    "                               the simulated times, process \"measured\n"
    "                               iteration N\" with every compute op (cat F, B,\n"
    "                               W, BW) and transport group (cat comm) per\n"
    "                               rank; both from 0 = the first compute op's\n"
    "                               start; the bubble figures in the processes'\n"
    "                               args and in otherData\n"
    "                        svg    the planned lanes above the measured ones on\n"
    "                               one time axis (ms), a title with the figures\n"
    "  --output-file FILE    write to FILE (atomically) instead of stdout\n"
    "  --coordinator ADDR    zb-coordinator's gRPC address (default $ZB_COORDINATOR,\n"
    "                        else 127.0.0.1:7070)\n"
    "  --timeout-ms N        deadline of each call (default 10000)\n"
    "  -h, --help            show this text\n"
    "\n"
    "Exit status: 0 written; 1 no such job or iteration, the iteration was not\n"
    "traced, or the coordinator failed; 2 usage error.\n";

enum { T_ITERATION = 1, T_OUTPUT, T_FORMAT, T_COORD, T_TIMEOUT, T_HELP };

typedef struct trace_args {
  const char *job, *output, *coordinator;
  int iteration; /* -1: the last traced */
  bool svg;
  int timeout_ms;
} trace_args;

/* One option's value into a; false after printing a usage error. */
static bool trace_opt(trace_args *a, int id, const char *val) {
  switch (id) {
  case T_ITERATION: return cli_parse_int("trace", "--iteration", val, 0, 2147483647, &a->iteration);
  case T_OUTPUT: a->output = val; return true;
  case T_COORD: a->coordinator = val; return true;
  case T_TIMEOUT: return cli_parse_int("trace", "--timeout-ms", val, 1, 3600000, &a->timeout_ms);
  case T_FORMAT:
    if (strcmp(val, "trace") != 0 && strcmp(val, "svg") != 0) {
      cli_usage_error("trace", "--output takes trace or svg, not '%s'%s", val,
                      strchr(val, '.') || strchr(val, '/') ? "; to write a file use --output-file FILE" : "");
      return false;
    }
    a->svg = strcmp(val, "svg") == 0;
    return true;
  default: return false;
  }
}

/* Returns -1 to go on, else the exit code. JOB_ID may come anywhere. */
static int trace_parse(const zbctl_command *cmd, int argc, char **argv, trace_args *a) {
  static const cli_opt opts[] = {{"iteration", 0, true, T_ITERATION}, {"output-file", 0, true, T_OUTPUT},
                                 {"output", 'o', true, T_FORMAT},     {"format", 0, true, T_FORMAT},
                                 {"coordinator", 0, true, T_COORD},   {"timeout-ms", 0, true, T_TIMEOUT},
                                 {"help", 'h', false, T_HELP}};
  *a = (trace_args){.coordinator = zbctl_default_coordinator(), .iteration = -1, .timeout_ms = 10000};
  cli_parser ps = {.cmd = "trace", .argc = argc, .argv = argv, .i = 0};
  while (ps.i < argc) {
    const char *s = argv[ps.i];
    if (s[0] != '-' || s[1] == '\0') {
      if (a->job)
        return cli_usage_error("trace", "unexpected argument '%s'", s);
      a->job = s;
      ps.i++;
      continue;
    }
    const char *val;
    int id = cli_next(&ps, opts, sizeof opts / sizeof opts[0], &val);
    if (id == CLI_ERROR)
      return ZBCTL_EXIT_USAGE;
    if (id == T_HELP) {
      fputs(cmd->help, stdout);
      return ZBCTL_EXIT_OK;
    }
    if (!trace_opt(a, id, val))
      return ZBCTL_EXIT_USAGE;
  }
  if (!a->job)
    return cli_usage_error("trace", "missing JOB_ID");
  return -1;
}

/* The job and the iteration, from two calls; exit code. */
static int trace_fetch(const trace_args *a, Zb__V1__Job **job, Zb__V1__IterationMetrics **it) {
  Zb__V1__GetJobRequest jreq = ZB__V1__GET_JOB_REQUEST__INIT;
  jreq.job_id = (char *)a->job;
  ProtobufCMessage *m = NULL;
  int rc = zbctl_remote_call("trace", a->coordinator, a->timeout_ms, ZB_METHOD_GET_JOB, &jreq.base,
                             &zb__v1__job__descriptor, &m);
  if (rc)
    return rc;
  *job = (Zb__V1__Job *)m;
  Zb__V1__GetIterationRequest ireq = ZB__V1__GET_ITERATION_REQUEST__INIT;
  ireq.job_id = (char *)a->job;
  ireq.iteration = a->iteration;
  m = NULL;
  rc = zbctl_remote_call("trace", a->coordinator, a->timeout_ms, ZB_METHOD_GET_ITERATION, &ireq.base,
                         &zb__v1__iteration_metrics__descriptor, &m);
  *it = (Zb__V1__IterationMetrics *)m;
  return rc;
}

/* The ranks' timelines on the coordinator's clock: ranks[r] for r < p,
 * each ops array allocated. Exit code; prints the problem. */
static int trace_decode(const Zb__V1__IterationMetrics *it, int p, zb_tl_rank *ranks) {
  for (size_t k = 0; k < it->n_ranks; k++) {
    const Zb__V1__RankIteration *ri = it->ranks[k];
    if (ri->rank < 0 || ri->rank >= p || ranks[ri->rank].ops) {
      cli_error("trace", "iteration %d: rank %d out of place (the job has %d ranks)", it->iteration, ri->rank,
                p);
      return ZBCTL_EXIT_FAIL;
    }
    zb_tl_op *ops = NULL;
    int n = 0;
    zb_diag d;
    if (ri->timeline &&
        zb_timeline_decode(ri->timeline, ri->start_monotonic_seconds + ri->clock_offset_seconds, &ops, &n,
                           &d)) {
      cli_error("trace", "iteration %d: rank %d: %s", it->iteration, ri->rank, d.msg);
      return ZBCTL_EXIT_FAIL;
    }
    ranks[ri->rank] = (zb_tl_rank){.ops = ops, .n = n};
  }
  return ZBCTL_EXIT_OK;
}

/* Plans the schedule that ran `it` from the job's spec; false (with a
 * warning: the measured half is still written) when it cannot. */
static bool trace_plan(const zb_job_spec *job_spec, const Zb__V1__IterationMetrics *it,
                       zb_planner_result *plan, char *name, size_t name_len) {
  zb_job_spec spec = *job_spec;
  if (it->schedule && it->schedule[0] && strcmp(it->schedule, spec.schedule) != 0) {
    /* switched by update-schedule: its defaults */
    snprintf(spec.schedule, sizeof spec.schedule, "%s", it->schedule);
    spec.chunks = 0;
    spec.mem_limit = 0;
  }
  snprintf(name, name_len, "planned (%s, simulated from the job's costs)", spec.schedule);
  zb_diag d;
  bool ok = zb_job_plan(&spec, ZB_OBJ_MAKESPAN, plan, &d) == ZB_OK && plan->lowered && plan->sim;
  if (ok) { /* the drawing needs every action's times */
    zb_costs *c = zb_costs_clone(plan->costs);
    ok = zb_planner_resimulate(plan, c, true, &d) == ZB_OK;
    zb_costs_free(c);
  }
  if (!ok) {
    cli_error("trace", "warning: cannot plan %s for the job's shape (%s); writing the measured timeline only",
              spec.schedule, d.msg);
    return false;
  }
  return true;
}

/* Warns when a rank measured another number of compute ops than its plan
 * holds (the plan is then not the one that ran). */
static void trace_check_counts(const zb_schedule *s, const zb_tl_rank *ranks, int p) {
  for (int r = 0; r < p && r < s->p; r++) {
    int measured = 0;
    for (int i = 0; i < ranks[r].n; i++)
      measured += ranks[r].ops[i].group_size == 0;
    if (ranks[r].n > 0 && measured != zb_schedule_compute_count(s, r))
      cli_error("trace", "warning: rank %d ran %d compute ops, the plan drawn has %d", r, measured,
                zb_schedule_compute_count(s, r));
  }
}

/* Fails (exit 1) for an iteration without timelines, naming trace_every. */
static int trace_require_aligned(const trace_args *a, const Zb__V1__IterationMetrics *it, int trace_every) {
  if (it->aligned)
    return ZBCTL_EXIT_OK;
  if (trace_every > 0)
    cli_error("trace",
              "job %s iteration %d was not traced: it traces iterations 0, %d, %d, ... (trace_every %d); "
              "leave out --iteration for the last traced one",
              a->job, it->iteration, trace_every, 2 * trace_every, trace_every);
  else
    cli_error("trace", "job %s iteration %d was not traced: the job traces no iteration (trace_every -1)",
              a->job, it->iteration);
  return ZBCTL_EXIT_FAIL;
}

/* Decodes, plans and writes the output; exit code. */
static int trace_write(const trace_args *a, const zb_job_spec *spec, const Zb__V1__IterationMetrics *it) {
  int p = spec->ranks;
  zb_tl_rank *ranks = zb_calloc((size_t)p, sizeof *ranks);
  int rc = trace_decode(it, p, ranks);
  zb_planner_result plan = {0};
  char name[160];
  bool planned = !rc && trace_plan(spec, it, &plan, name, sizeof name);
  if (planned)
    trace_check_counts(plan.lowered, ranks, p);
  zb_measured_view v = {.planned_name = name,
                        .sched = planned ? plan.lowered : NULL,
                        .sim = planned ? plan.sim : NULL,
                        .iteration = it->iteration,
                        .schedule = it->schedule,
                        .p = p,
                        .ranks = ranks,
                        .span = it->span_seconds,
                        .bubble_ratio = it->bubble_ratio,
                        .bubble_ratio_paper = it->bubble_ratio_paper,
                        .predicted_bubble_ratio = it->predicted_bubble_ratio,
                        .predicted_bubble_ratio_paper = it->predicted_bubble_ratio_paper,
                        .predicted_from_learned = it->predicted_from_learned};
  zb_buf b = ZB_BUF_INIT;
  if (!rc) {
    if (a->svg)
      zb_svg_write_measured(&v, &b);
    else
      zb_trace_write_measured(&v, &b);
    rc = cli_write_output("trace", a->output, &b) ? ZBCTL_EXIT_OK : ZBCTL_EXIT_FAIL;
  }
  zb_buf_free(&b);
  zb_planner_result_free(&plan);
  for (int r = 0; r < p; r++)
    free((void *)ranks[r].ops);
  free(ranks);
  return rc;
}

int zbctl_trace(const zbctl_command *cmd, int argc, char **argv) {
  trace_args a;
  int rc = trace_parse(cmd, argc, argv, &a);
  if (rc >= 0)
    return rc;
  Zb__V1__Job *job = NULL;
  Zb__V1__IterationMetrics *it = NULL;
  rc = trace_fetch(&a, &job, &it);
  zb_job_spec spec;
  zb_job_spec_default(&spec);
  zb_diag d;
  if (!rc && (!job->spec || zb_wire_spec_from_pb(job->spec, &spec, &d) != ZB_OK)) {
    cli_error("trace", "job %s: its spec: %s", a.job, job->spec ? d.msg : "missing");
    rc = ZBCTL_EXIT_FAIL;
  }
  if (!rc)
    rc = trace_require_aligned(&a, it, spec.trace_every);
  if (!rc)
    rc = trace_write(&a, &spec, it);
  zb_job_spec_free(&spec);
  if (it)
    protobuf_c_message_free_unpacked(&it->base, NULL);
  if (job)
    protobuf_c_message_free_unpacked(&job->base, NULL);
  return rc;
}
