/* zbctl's service commands: jobs (submit, list, get, watch, cancel,
 * update-schedule), workers, and plan --remote (trace is in trace.c). Each talks to
 * zb-coordinator over gRPC (--coordinator ADDR, default $ZB_COORDINATOR
 * or 127.0.0.1:7070); every read command takes --output json. Server
 * errors are printed with their status and the field they name; the exit
 * code is 1. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_jobspec_yaml.h"
#include "zb_methods.h"
#include "zb_pbjson.h"
#include "zb_rpc.h"
#include "zb_wire.h"
#include "zbctl.h"

enum {
  OPT_COORD = 1,
  OPT_OUTPUT,
  OPT_TIMEOUT,
  OPT_SCHEDULE,
  OPT_CHUNKS,
  OPT_MEM_LIMIT,
  OPT_REASON,
  OPT_EVERY,
  OPT_TLS_CA,
  OPT_TLS_CERT,
  OPT_TLS_KEY,
  OPT_HELP
};

#define COMMON_OPTS                                                                                          \
  {"coordinator", 0, true, OPT_COORD}, {"output", 'o', true, OPT_OUTPUT},                                    \
      {"timeout-ms", 0, true, OPT_TIMEOUT}, {"tls-ca", 0, true, OPT_TLS_CA},                                 \
      {"tls-cert", 0, true, OPT_TLS_CERT}, {"tls-key", 0, true, OPT_TLS_KEY}, {                              \
    "help", 'h', false, OPT_HELP                                                                             \
  }
enum { N_COMMON_OPTS = 7 };

typedef struct remote_args {
  const char *coordinator;
  zb_tls_files tls; /* $ZBCTL_TLS_CA, _CERT, _KEY, then the flags */
  bool json;
  int timeout_ms;
  const char *positional;
} remote_args;

static const char common_help[] =
    "\n"
    "  --coordinator ADDR    zb-coordinator's gRPC address (default $ZB_COORDINATOR,\n"
    "                        else 127.0.0.1:7070)\n"
    "  -o, --output text|json  output format (default text)\n"
    "  --timeout-ms N        deadline of each call (default 10000)\n"
    "  --tls-ca FILE         mutual TLS: the cluster's CA (default $ZBCTL_TLS_CA),\n"
    "  --tls-cert FILE       your certificate, zb://user/NAME or zb://admin/NAME\n"
    "                        (default $ZBCTL_TLS_CERT), and\n"
    "  --tls-key FILE        its key (default $ZBCTL_TLS_KEY); none: plaintext\n"
    "  -h, --help            show this text\n";

const char zbctl_submit_help[] =
    "usage: zbctl submit JOB.yaml [--coordinator ADDR] [--output text|json]\n"
    "\nSubmits the job spec in JOB.yaml ('-': stdin) and prints its id. The spec is\n"
    "checked here first (unknown keys, wrong types and bad values name the key and\n"
    "line), then by the coordinator.\n";
const char zbctl_list_help[] = "usage: zbctl list [--coordinator ADDR] [--output text|json]\n"
                               "\nLists every job the coordinator knows, oldest first.\n";
const char zbctl_get_help[] = "usage: zbctl get JOB_ID [--coordinator ADDR] [--output text|json]\n"
                              "\nShows one job: its spec, state, reason and last iteration.\n";
const char zbctl_watch_help[] =
    "usage: zbctl watch JOB_ID [--every N] [--coordinator ADDR] [--output text|json]\n"
    "\nStreams a job's events from its start: state changes and, per iteration,\n"
    "the training loss and tokens/s (jobs that train a model: backend cpu or\n"
    "cuda) or\n"
    "samples/s, the measured and predicted bubble ratio (global) and peak memory\n"
    "per rank, with a progress bar. Exits when the job ends: 0 if it SUCCEEDED,\n"
    "1 otherwise. --output json prints one JSON event per line. When the\n"
    "coordinator cuts the stream because watch fell behind (its byte budget for\n"
    "a watcher), watch takes up after the last event it printed, saying so on\n"
    "stderr once: no event is missed or repeated.\n"
    "  --every N             print every Nth iteration (and the last; default 1)\n";
const char zbctl_cancel_help[] =
    "usage: zbctl cancel JOB_ID [--reason TEXT] [--coordinator ADDR] [--output text|json]\n"
    "\nCancels a pending or running job; its workers are released.\n";
const char zbctl_resume_help[] = "usage: zbctl resume JOB_ID [--coordinator ADDR] [--output text|json]\n"
                                 "\nSubmits a new job with the spec of JOB_ID, a cpu or cuda job with\n"
                                 "checkpoints\n"
                                 "(model.checkpoint_every > 0) that was cancelled or failed: its ranks load\n"
                                 "the last iteration every rank checkpointed and go on from the next one\n"
                                 "(iterations keep their numbers). Prints the new job id.\n";
const char zbctl_update_help[] =
    "usage: zbctl update-schedule JOB_ID --schedule NAME [--chunks V] [--mem-limit X]\n"
    "                             [--coordinator ADDR] [--output text|json]\n"
    "\nReplaces a running job's schedule. The new plan applies from an iteration\n"
    "boundary that no rank has reached yet (printed); no iteration is lost.\n"
    "--mem-limit takes 'Np' or a number of M_F units, as in the job spec.\n";
const char zbctl_workers_help[] =
    "usage: zbctl workers [--coordinator ADDR] [--output text|json]\n"
    "\nLists the attached workers: id, data address, state, job and rank, backends\n"
    "and transports, and the GPU each one reported (name, memory, compute\n"
    "capability, CUDA driver; '-' for none; 'stand-in' marks the CPU stand-in\n"
    "of the CUDA APIs that tests use).\n";

/* Parses the common options plus `extra`; at most one positional. */
static int remote_parse(const zbctl_command *cmd, int argc, char **argv, const cli_opt *extra, size_t n_extra,
                        remote_args *a, bool want_positional,
                        bool (*on_extra)(const char *cmd, int id, const char *val, void *ctx), void *ctx) {
  cli_opt opts[16] = {COMMON_OPTS};
  size_t n = N_COMMON_OPTS;
  for (size_t k = 0; k < n_extra && n < 16; k++)
    opts[n++] = extra[k];
  a->coordinator = zbctl_default_coordinator();
  zbctl_tls_from_env(&a->tls);
  a->json = false;
  a->timeout_ms = 10000;
  a->positional = NULL;
  const char *name = cmd->verb ? cmd->verb : cmd->noun;
  /* the positional argument may come anywhere: take it out first */
  char **rest = calloc((size_t)argc + 1, sizeof *rest);
  int nrest = 0;
  for (int k = 0; k < argc; k++) {
    bool takes_value = false;
    if (argv[k][0] == '-' && argv[k][1] && !strchr(argv[k], '='))
      for (size_t o = 0; o < n; o++)
        if (opts[o].has_arg && ((argv[k][1] == '-' && strcmp(argv[k] + 2, opts[o].name) == 0) ||
                                (argv[k][1] == opts[o].short_name && !argv[k][2])))
          takes_value = true;
    if (argv[k][0] != '-' || strcmp(argv[k], "-") == 0) {
      if (!want_positional || a->positional) {
        free(rest);
        return cli_usage_error(name, "unexpected argument '%s'", argv[k]);
      }
      a->positional = argv[k];
      continue;
    }
    rest[nrest++] = argv[k];
    if (takes_value && k + 1 < argc)
      rest[nrest++] = argv[++k];
  }
  cli_parser ps = {.cmd = name, .argc = nrest, .argv = rest, .i = 0};
  const char *val;
  int id, rc = -1;
  while ((id = cli_next(&ps, opts, n, &val)) != CLI_END) {
    if (id == CLI_ERROR) {
      rc = ZBCTL_EXIT_USAGE;
      break;
    }
    if (id == OPT_HELP) {
      fputs(cmd->help, stdout);
      fputs(common_help, stdout);
      rc = ZBCTL_EXIT_OK;
      break;
    }
    if (id == OPT_COORD)
      a->coordinator = val;
    else if (id == OPT_TLS_CA || id == OPT_TLS_CERT || id == OPT_TLS_KEY) {
      char *dst = id == OPT_TLS_CA ? a->tls.ca : id == OPT_TLS_CERT ? a->tls.cert : a->tls.key;
      snprintf(dst, sizeof a->tls.ca, "%s", val);
    } else if (id == OPT_OUTPUT) {
      if (strcmp(val, "json") != 0 && strcmp(val, "text") != 0) {
        rc = cli_usage_error(name, "--output takes text or json, not '%s'", val);
        break;
      }
      a->json = strcmp(val, "json") == 0;
    } else if (id == OPT_TIMEOUT) {
      if (!cli_parse_int(name, "--timeout-ms", val, 1, 3600000, &a->timeout_ms)) {
        rc = ZBCTL_EXIT_USAGE;
        break;
      }
    } else if (!on_extra || !on_extra(name, id, val, ctx)) {
      rc = ZBCTL_EXIT_USAGE;
      break;
    }
  }
  free(rest);
  if (rc >= 0)
    return rc;
  if (want_positional && !a->positional)
    return cli_usage_error(name, "missing argument (see --help)");
  return -1;
}

/* Prints a failed call: "zbctl CMD: NOT_FOUND: job_id: no job 'j-9'". */
static int remote_error(const char *cmd, grpc_status_code st, const char *details, const char *coordinator) {
  if (st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED)
    cli_error(cmd, "%s: %s (is zb-coordinator running at %s?)", zb_rpc_status_name(st), details, coordinator);
  else
    cli_error(cmd, "%s: %s", zb_rpc_status_name(st), details);
  return ZBCTL_EXIT_FAIL;
}

static void print_json(const ProtobufCMessage *m) {
  zb_buf b = ZB_BUF_INIT;
  zb_pbjson_write(m, 0, &b);
  zb_buf_puts(&b, "\n");
  fwrite(b.data, 1, b.len, stdout);
  zb_buf_free(&b);
}

/* One call: returns the exit code; on success *resp is the caller's. */
static int remote_call(const char *cmd, const remote_args *a, const char *method, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *desc, ProtobufCMessage **resp) {
  zb_rpc_client *c = zbctl_client(cmd, a->coordinator, &a->tls);
  if (!c)
    return ZBCTL_EXIT_USAGE;
  char details[512];
  grpc_status_code st =
      zb_rpc_unary(c, method, req, desc, resp, a->timeout_ms, false, details, sizeof details);
  zb_rpc_client_free(c);
  if (st != GRPC_STATUS_OK)
    return remote_error(cmd, st, details, a->coordinator);
  return ZBCTL_EXIT_OK;
}

int zbctl_remote_call(const char *cmd, const char *coordinator, int timeout_ms, const char *method,
                      const ProtobufCMessage *req, const ProtobufCMessageDescriptor *desc,
                      ProtobufCMessage **resp) {
  remote_args a = {.coordinator = coordinator, .timeout_ms = timeout_ms};
  zbctl_tls_from_env(&a.tls);
  return remote_call(cmd, &a, method, req, desc, resp);
}

/* Prints an answer as text; ctx is the command's. */
typedef void (*print_fn)(const ProtobufCMessage *resp, const void *ctx);

/* One call, its answer printed: as JSON with --json, else by print. */
static int remote_show(const char *cmd, const remote_args *a, const char *method, const ProtobufCMessage *req,
                       const ProtobufCMessageDescriptor *desc, print_fn print, const void *ctx) {
  ProtobufCMessage *resp = NULL;
  int rc = remote_call(cmd, a, method, req, desc, &resp);
  if (rc)
    return rc;
  if (a->json)
    print_json(resp);
  else
    print(resp, ctx);
  protobuf_c_message_free_unpacked(resp, NULL);
  return ZBCTL_EXIT_OK;
}

/* A SubmitJobResponse: the new job's id. */
static void print_job_id(const ProtobufCMessage *resp, const void *ctx) {
  (void)ctx;
  printf("%s\n", ((const Zb__V1__SubmitJobResponse *)resp)->job_id);
}

static const char *state_short(Zb__V1__JobState s) {
  return zb_job_state_name((int)s);
}

static void fmt_time(int64_t ms, char *buf, size_t len) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  localtime_r(&t, &tm);
  strftime(buf, len, "%Y-%m-%d %H:%M:%S", &tm);
}

/* ---- submit ---- */

int zbctl_submit(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  int rc = remote_parse(cmd, argc, argv, NULL, 0, &a, true, NULL, NULL);
  if (rc >= 0)
    return rc;
  char *text;
  size_t len;
  if (!cli_read_file("submit", a.positional, &text, &len))
    return ZBCTL_EXIT_FAIL;
  zb_job_spec spec;
  zb_diag d;
  zb_jobspec_files files = zb_jobspec_files_plain(); /* model.config, sent as its text */
  zb_err err = zb_job_spec_parse_files(text, len, &files, &spec, &d);
  free(text);
  if (err) {
    cli_error("submit", "%s: %s", a.positional, d.msg);
    return ZBCTL_EXIT_FAIL;
  }
  Zb__V1__SubmitJobRequest req = ZB__V1__SUBMIT_JOB_REQUEST__INIT;
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&spec, &pb);
  req.spec = &pb;
  rc = remote_show("submit", &a, ZB_METHOD_SUBMIT_JOB, &req.base, &zb__v1__submit_job_response__descriptor,
                   print_job_id, NULL);
  zb_wire_spec_pb_clear(&pb);
  zb_job_spec_free(&spec);
  return rc;
}

/* ---- list / get ---- */

static void print_job_line(const Zb__V1__Job *j) {
  const Zb__V1__JobSpec *s = j->spec;
  printf("%-8s %-16s %-10s %-16s %5d %5d %5d/%-5d %s\n", j->id, s ? s->name : "?", state_short(j->state),
         j->schedule, s ? s->ranks : 0, s ? s->microbatches : 0, j->iterations_done, s ? s->iterations : 0,
         j->reason);
}

static void print_job_table(const ProtobufCMessage *resp, const void *ctx) {
  (void)ctx;
  const Zb__V1__ListJobsResponse *r = (const void *)resp;
  printf("%-8s %-16s %-10s %-16s %5s %5s %11s %s\n", "ID", "NAME", "STATE", "SCHEDULE", "RANKS", "MB",
         "ITERATIONS", "REASON");
  for (size_t k = 0; k < r->n_jobs; k++)
    print_job_line(r->jobs[k]);
}

/* Every page of ListJobs, shown as one list. */
int zbctl_list(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  int rc = remote_parse(cmd, argc, argv, NULL, 0, &a, false, NULL, NULL);
  if (rc >= 0)
    return rc;
  Zb__V1__ListJobsResponse **pages = NULL, all = ZB__V1__LIST_JOBS_RESPONSE__INIT;
  int n_pages = 0;
  rc = ZBCTL_EXIT_OK;
  for (const char *token = "";;) {
    Zb__V1__ListJobsRequest req = ZB__V1__LIST_JOBS_REQUEST__INIT;
    req.page_size = 1000;
    req.page_token = (char *)token;
    ProtobufCMessage *resp = NULL;
    if ((rc = remote_call("list", &a, ZB_METHOD_LIST_JOBS, &req.base, &zb__v1__list_jobs_response__descriptor,
                          &resp)))
      break;
    pages = zb_realloc(pages, sizeof *pages * (size_t)(n_pages + 1));
    Zb__V1__ListJobsResponse *page = pages[n_pages++] = (void *)resp;
    all.jobs = zb_realloc(all.jobs, sizeof *all.jobs * (all.n_jobs + page->n_jobs + 1));
    for (size_t k = 0; k < page->n_jobs; k++)
      all.jobs[all.n_jobs++] = page->jobs[k];
    token = page->next_page_token;
    if (!token || !*token || !page->n_jobs)
      break;
  }
  if (!rc && a.json)
    print_json(&all.base);
  else if (!rc)
    print_job_table(&all.base, NULL);
  for (int k = 0; k < n_pages; k++)
    protobuf_c_message_free_unpacked(&pages[k]->base, NULL);
  free(pages);
  free(all.jobs);
  return rc;
}

/* The share of each rank's wall time its ops waited for a CPU core (busy
 * time, not bubble), when any rank measured some. */
static void print_cpu_wait(const Zb__V1__IterationMetrics *it) {
  bool any = false;
  for (size_t r = 0; r < it->n_ranks; r++)
    any |= it->ranks[r]->cpu_wait_seconds > 0;
  if (!any)
    return;
  printf("\n  waiting for a CPU (of wall):");
  for (size_t r = 0; r < it->n_ranks; r++) {
    const Zb__V1__RankIteration *ri = it->ranks[r];
    printf(" r%d:%.3f", ri->rank, ri->wall_seconds > 0 ? ri->cpu_wait_seconds / ri->wall_seconds : 0.0);
  }
}

static void print_iteration(const Zb__V1__IterationMetrics *it, int iterations, bool bar,
                            double tokens_per_sample);
/* Tokens in one microbatch of a job that trains a model (batch x seq_len);
 * 0 for other jobs. */
static double job_tokens_per_sample(const Zb__V1__JobSpec *spec) {
  if (!spec || !spec->model || !zb_backend_runs_model(spec->backend))
    return 0;
  return (double)spec->model->batch * spec->model->seq_len;
}

/* A Job in full: shape, model, progress and its last iteration. */
static void print_job(const ProtobufCMessage *resp, const void *ctx) {
  (void)ctx;
  const Zb__V1__Job *j = (const void *)resp;
  char created[32], updated[32];
  fmt_time(j->created_unix_ms, created, sizeof created);
  fmt_time(j->updated_unix_ms, updated, sizeof updated);
  const Zb__V1__JobSpec *s = j->spec;
  printf("job        %s (%s)\nstate      %s: %s\nschedule   %s (submitted as %s)\n", j->id, s ? s->name : "?",
         state_short(j->state), j->reason, j->schedule, s ? s->schedule : "?");
  char chunks[24] = "the family's"; /* 0 in the spec: the family's own (docs/formats.md) */
  if (s && s->chunks)
    snprintf(chunks, sizeof chunks, "%d", s->chunks);
  if (s)
    printf("shape      p=%d m=%d chunks %s; %d iterations; backend %s, transport %s, precision %s, %lld "
           "bytes/activation\n",
           s->ranks, s->microbatches, chunks, s->iterations, s->backend, s->transport,
           s->precision && s->precision[0] ? s->precision : "fp32", (long long)s->bytes_per_activation);
  if (s && s->model) {
    const Zb__V1__ModelSpec *m = s->model;
    printf("model      hidden %d, heads %d, layers %d, seq_len %d, batch %d, seed %llu; data %s\n"
           "optimizer  AdamW lr %g, weight_decay %g, betas (%g, %g), eps %g; clip_norm %g, step %s\n",
           m->hidden, m->heads, m->layers, m->seq_len, m->batch, (unsigned long long)m->seed, m->data, m->lr,
           m->weight_decay ? m->weight_decay->value : 0, m->beta1 ? m->beta1->value : 0,
           m->beta2 ? m->beta2->value : 0, m->eps, m->clip_norm ? m->clip_norm->value : 1.0,
           m->step && m->step[0] ? m->step : "post-validated");
    if (m->architecture && m->architecture[0] && strcmp(m->architecture, "builtin") != 0)
      printf("arch       %s (config.json given); weights %s\n", m->architecture,
             m->weights && m->weights[0] ? m->weights : "seeded initialisation");
    if (m->checkpoint_every > 0)
      printf("checkpoint every %d iterations and on cancel, in %s/%s%s%s\n", m->checkpoint_every,
             m->checkpoint_dir, j->id,
             m->resume_from_job_id && m->resume_from_job_id[0] ? "; resumed from " : "",
             m->resume_from_job_id ? m->resume_from_job_id : "");
    if (m->dump_dir && m->dump_dir[0])
      printf("dumps      iterations 0, %d, ... and the last, in %s/%s (check: zb-gradcheck %s/%s)\n",
             m->dump_every > 0 ? m->dump_every : 1, m->dump_dir, j->id, m->dump_dir, j->id);
  }
  zbctl_print_placement(j);
  printf("progress   %d/%d iterations\ncreated    %s\nupdated    %s\n", j->iterations_done,
         s ? s->iterations : 0, created, updated);
  if (j->last)
    print_iteration(j->last, s ? s->iterations : 0, false, job_tokens_per_sample(s));
  zbctl_print_learned(j);
}

int zbctl_get(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  int rc = remote_parse(cmd, argc, argv, NULL, 0, &a, true, NULL, NULL);
  if (rc >= 0)
    return rc;
  Zb__V1__GetJobRequest req = ZB__V1__GET_JOB_REQUEST__INIT;
  req.job_id = (char *)a.positional;
  return remote_show("get", &a, ZB_METHOD_GET_JOB, &req.base, &zb__v1__job__descriptor, print_job, NULL);
}

/* ---- watch ---- */

/* tokens_per_sample > 0 (jobs that train a model): throughput in tokens/s,
 * else in microbatches (samples) per second. */
static void print_iteration(const Zb__V1__IterationMetrics *it, int iterations, bool bar,
                            double tokens_per_sample) {
  char progress[48] = "";
  if (bar && iterations > 0) {
    int width = 20, done = (it->iteration + 1) * width / iterations;
    progress[0] = '[';
    for (int k = 0; k < width; k++)
      progress[1 + k] = k < done ? '#' : '.';
    progress[1 + width] = ']';
    progress[2 + width] = 0;
  }
  char loss[32] = ""; /* only jobs that train a model (cpu) have one */
  if (it->has_loss)
    snprintf(loss, sizeof loss, "  loss %.4f", it->loss);
  char step[64] = ""; /* the optimizer's global check (cpu jobs) */
  if (it->has_grad_norm)
    snprintf(step, sizeof step, "  grad norm %.3g%s", it->grad_norm,
             it->skipped   ? " skipped (non-finite)"
             : it->clipped ? " clipped"
                           : "");
  char rate[40];
  if (tokens_per_sample > 0)
    snprintf(rate, sizeof rate, "%9.0f tokens/s", it->samples_per_second * tokens_per_sample);
  else
    snprintf(rate, sizeof rate, "%9.1f samples/s", it->samples_per_second);
  printf("%s iter %d/%d  %-8s%s%s %s  bubble %.4f (predicted %.4f)  peak mem", progress, it->iteration + 1,
         iterations, it->schedule, loss, step, rate, it->bubble_ratio, it->predicted_bubble_ratio);
  for (size_t r = 0; r < it->n_ranks; r++)
    printf(" r%d:%.3g", it->ranks[r]->rank, it->ranks[r]->peak_memory);
  printf("\n  rank bubble:");
  for (size_t r = 0; r < it->n_ranks; r++)
    printf(" r%d:%.3f", it->ranks[r]->rank, it->ranks[r]->bubble_ratio);
  print_cpu_wait(it);
  printf("\n");
  zbctl_print_sampled(it);
}

/* How zbctl watch prints events, and the state the last one gave. */
typedef struct watch_print {
  bool json;
  int every, iterations;
  double tokens_per_sample;
  int final_state;
} watch_print;

static void watch_print_event(const Zb__V1__JobEvent *ev, void *ctx) {
  watch_print *pr = ctx;
  pr->final_state = ev->state;
  if (pr->json) {
    zb_buf b = ZB_BUF_INIT;
    zb_pbjson_write(&ev->base, -1, &b);
    zb_buf_puts(&b, "\n");
    fwrite(b.data, 1, b.len, stdout);
    zb_buf_free(&b);
  } else if (ev->iteration) {
    /* every Nth iteration, and always the last and anything unusual */
    const Zb__V1__IterationMetrics *it = ev->iteration;
    if ((it->iteration + 1) % pr->every == 0 || it->iteration + 1 == pr->iterations || pr->every == 1 ||
        it->n_straggler_ranks > 0)
      print_iteration(it, pr->iterations, true, pr->tokens_per_sample);
  } else {
    char when[32];
    fmt_time(ev->unix_ms, when, sizeof when);
    printf("%s  %-10s %s\n", when, state_short(ev->state), ev->reason);
  }
  fflush(stdout);
}

static bool watch_opt(const char *cmd, int id, const char *val, void *ctx) {
  return id == OPT_EVERY && cli_parse_int(cmd, "--every", val, 1, 1000000, ctx);
}

int zbctl_watch(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  int every = 1;
  static const cli_opt extra[] = {{"every", 0, true, OPT_EVERY}};
  int rc = remote_parse(cmd, argc, argv, extra, 1, &a, true, watch_opt, &every);
  if (rc >= 0)
    return rc;
  zb_rpc_client *c = zbctl_client("watch", a.coordinator, &a.tls);
  if (!c)
    return ZBCTL_EXIT_USAGE;
  /* the job's spec, for the iteration count of the progress bar */
  Zb__V1__GetJobRequest greq = ZB__V1__GET_JOB_REQUEST__INIT;
  greq.job_id = (char *)a.positional;
  ProtobufCMessage *gresp = NULL;
  char details[512];
  grpc_status_code st = zb_rpc_unary(c, ZB_METHOD_GET_JOB, &greq.base, &zb__v1__job__descriptor, &gresp,
                                     a.timeout_ms, false, details, sizeof details);
  if (st != GRPC_STATUS_OK) {
    zb_rpc_client_free(c);
    return remote_error("watch", st, details, a.coordinator);
  }
  const Zb__V1__JobSpec *spec = ((Zb__V1__Job *)gresp)->spec;
  int iterations = spec ? spec->iterations : 0;
  double tokens_per_sample = job_tokens_per_sample(spec);
  protobuf_c_message_free_unpacked(gresp, NULL);
  watch_print pr = {
      .json = a.json, .every = every, .iterations = iterations, .tokens_per_sample = tokens_per_sample};
  st = zbctl_watch_events(c, a.positional, watch_print_event, &pr, details, sizeof details);
  zb_rpc_client_free(c);
  if (st != GRPC_STATUS_OK)
    return remote_error("watch", st, details, a.coordinator);
  return pr.final_state == ZB__V1__JOB_STATE__JOB_STATE_SUCCEEDED ? ZBCTL_EXIT_OK : ZBCTL_EXIT_FAIL;
}

/* ---- cancel ---- */

static bool cancel_opt(const char *cmd, int id, const char *val, void *ctx) {
  (void)cmd;
  if (id != OPT_REASON)
    return false;
  *(const char **)ctx = val;
  return true;
}

static void print_job_state(const ProtobufCMessage *resp, const void *ctx) {
  (void)ctx;
  const Zb__V1__Job *j = (const void *)resp;
  printf("%s %s: %s\n", j->id, state_short(j->state), j->reason);
}

int zbctl_cancel(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  const char *reason = NULL;
  static const cli_opt extra[] = {{"reason", 0, true, OPT_REASON}};
  int rc = remote_parse(cmd, argc, argv, extra, 1, &a, true, cancel_opt, &reason);
  if (rc >= 0)
    return rc;
  Zb__V1__CancelJobRequest req = ZB__V1__CANCEL_JOB_REQUEST__INIT;
  req.job_id = (char *)a.positional;
  req.reason = (char *)(reason ? reason : "");
  return remote_show("cancel", &a, ZB_METHOD_CANCEL_JOB, &req.base, &zb__v1__job__descriptor, print_job_state,
                     NULL);
}

/* ---- resume ---- */

int zbctl_resume(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  int rc = remote_parse(cmd, argc, argv, NULL, 0, &a, true, NULL, NULL);
  if (rc >= 0)
    return rc;
  Zb__V1__SubmitJobRequest req = ZB__V1__SUBMIT_JOB_REQUEST__INIT;
  req.resume_from_job_id = (char *)a.positional;
  return remote_show("resume", &a, ZB_METHOD_SUBMIT_JOB, &req.base, &zb__v1__submit_job_response__descriptor,
                     print_job_id, NULL);
}

/* ---- update-schedule ---- */

typedef struct update_opts {
  const char *schedule, *mem_limit;
  int chunks;
} update_opts;

static bool update_opt(const char *cmd, int id, const char *val, void *ctx) {
  update_opts *u = ctx;
  if (id == OPT_SCHEDULE)
    u->schedule = val;
  else if (id == OPT_CHUNKS)
    return cli_parse_int(cmd, "--chunks", val, 1, 64, &u->chunks);
  else if (id == OPT_MEM_LIMIT)
    u->mem_limit = val;
  else
    return false;
  return true;
}

static void print_update(const ProtobufCMessage *resp, const void *ctx) {
  const update_opts *u = ctx;
  const Zb__V1__UpdateScheduleResponse *r = (const void *)resp;
  printf("%s: %s from iteration %d\n", r->job ? r->job->id : "?", u->schedule, r->from_iteration + 1);
}

int zbctl_update_schedule(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  update_opts u = {0};
  static const cli_opt extra[] = {{"schedule", 0, true, OPT_SCHEDULE},
                                  {"chunks", 0, true, OPT_CHUNKS},
                                  {"mem-limit", 0, true, OPT_MEM_LIMIT}};
  int rc = remote_parse(cmd, argc, argv, extra, 3, &a, true, update_opt, &u);
  if (rc >= 0)
    return rc;
  if (!u.schedule)
    return cli_usage_error("update-schedule", "--schedule NAME is required");
  Zb__V1__UpdateScheduleRequest req = ZB__V1__UPDATE_SCHEDULE_REQUEST__INIT;
  req.job_id = (char *)a.positional;
  req.schedule = (char *)u.schedule;
  req.chunks = u.chunks;
  if (u.mem_limit) {
    /* 'Np' needs the job's ranks: ask for the job first */
    size_t n = strlen(u.mem_limit);
    char *end;
    double x = strtod(u.mem_limit, &end);
    bool per_p = n > 1 && u.mem_limit[n - 1] == 'p' && end == u.mem_limit + n - 1;
    if (!(per_p || *end == 0) || !(x > 0) || !isfinite(x))
      return cli_usage_error("update-schedule", "--mem-limit takes 'Np' or a positive number, not '%s'",
                             u.mem_limit);
    if (per_p) {
      Zb__V1__GetJobRequest greq = ZB__V1__GET_JOB_REQUEST__INIT;
      greq.job_id = (char *)a.positional;
      ProtobufCMessage *g = NULL;
      if ((rc = remote_call("update-schedule", &a, ZB_METHOD_GET_JOB, &greq.base, &zb__v1__job__descriptor,
                            &g)))
        return rc;
      Zb__V1__Job *j = (void *)g;
      x *= j->spec ? j->spec->ranks : 1;
      protobuf_c_message_free_unpacked(g, NULL);
    }
    req.mem_limit = x;
  }
  return remote_show("update-schedule", &a, ZB_METHOD_UPDATE_SCHEDULE, &req.base,
                     &zb__v1__update_schedule_response__descriptor, print_update, &u);
}

/* ---- workers ---- */

/* items joined with commas into out (cut at cap). */
static void join_list(char *out, size_t cap, char **items, size_t n) {
  out[0] = 0;
  for (size_t k = 0; k < n; k++) {
    size_t len = strlen(out);
    snprintf(out + len, cap - len, "%s%s", k ? "," : "", items[k]);
  }
}

static void print_workers(const ProtobufCMessage *resp, const void *ctx) {
  (void)ctx;
  const Zb__V1__ListWorkersResponse *r = (const void *)resp;
  printf("%-16s %-22s %-5s %-8s %4s %-14s %-10s %-22s %s\n", "ID", "DATA ADDRESS", "STATE", "JOB", "RANK",
         "BACKENDS", "TRANSPORTS", "BLAS", "GPU");
  for (size_t k = 0; k < r->n_workers; k++) {
    Zb__V1__Worker *w = r->workers[k];
    char rank[16], backends[128], transports[128];
    snprintf(rank, sizeof rank, "%d", w->rank);
    join_list(backends, sizeof backends, w->backends, w->n_backends);
    join_list(transports, sizeof transports, w->transports, w->n_transports);
    /* the GPU last and whole: the stand-in's name must stay readable */
    printf("%-16s %-22s %-5s %-8s %4s %-14s %-10s %-22s %s\n", w->id, w->data_address, w->state,
           w->job_id[0] ? w->job_id : "-", w->rank >= 0 ? rank : "-", backends, transports,
           w->blas[0] ? w->blas : "-", w->gpu && w->gpu[0] ? w->gpu : "-");
  }
}

int zbctl_workers(const zbctl_command *cmd, int argc, char **argv) {
  remote_args a;
  int rc = remote_parse(cmd, argc, argv, NULL, 0, &a, false, NULL, NULL);
  if (rc >= 0)
    return rc;
  Zb__V1__ListWorkersRequest req = ZB__V1__LIST_WORKERS_REQUEST__INIT;
  return remote_show("workers", &a, ZB_METHOD_LIST_WORKERS, &req.base,
                     &zb__v1__list_workers_response__descriptor, print_workers, NULL);
}
