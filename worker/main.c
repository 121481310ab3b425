/* zb-worker: attaches to zb-coordinator (a server stream carries its
 * commands), heartbeats, and runs each assignment on a job thread with the
 * executor, a compute backend and a p2p transport, reporting every
 * iteration. It re-attaches with backoff when the coordinator goes away.
 *
 * Backends: sim (sleeps the planned op times), and cpu where it is built in
 * (ZB_WITH_CPU_BACKEND: OpenBLAS was found): the built-in model trained
 * with AdamW on each rank's own stages, one step per iteration with global
 * gradient-norm clipping and a NaN/Inf check, post-validated or
 * synchronous (zb_step.h); the global values are reduced over the job's
 * transport along the ranks. A cpu job with model.checkpoint_every saves
 * each hosted stage's weights and AdamW state (zb_checkpoint.h) every N
 * iterations and when it ends early, and a resumed job (model
 * resume_from_job_id) loads them before its first iteration.
 *
 * Threads: the main thread owns the Attach stream and the heartbeat; the
 * job thread runs one assignment at a time. They share `worker` under its
 * mutex: the current job's stop flag and a pending plan update. */
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "zb/v1/zb.pb-c.h"
#include "zb_alloc.h"
#include "zb_checkpoint.h"
#include "zb_dump.h"
#include "zb_executor.h"
#include "zb_file.h"
#include "zb_format.h"
#include "zb_log.h"
#include "zb_optimizer.h"
#include "zb_plan.h"
#include "zb_rpc.h"
#include "zb_step.h"
#include "zb_step_chain.h"
#include "zb_wire.h"

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: zb-worker [--coordinator ADDR] [--id ID] [--listen ADDR] [--heartbeat-ms N]\n"
    "                 [--log-level L] [--version] [--help]\n"
    "\n"
    "Attaches to zb-coordinator and runs the ranks it is assigned: compute on a\n"
    "backend (sim; cpu, the built-in model with AdamW, when built with OpenBLAS),\n"
    "activations and gradients to its neighbours over a transport (tcp here), a\n"
    "report per iteration.\n"
    "\n"
    "  --coordinator ADDR  zb-coordinator's gRPC address (default 127.0.0.1:7070)\n"
    "  --id ID             worker id (default HOSTNAME-PID)\n"
    "  --listen ADDR       data address for peers (default 127.0.0.1:0: a free port,\n"
    "                      chosen at start and kept across jobs)\n"
    "  --heartbeat-ms N    heartbeat period (default 1000)\n"
    "  --log-level L       debug, info, warn, error (default info)\n";

typedef struct worker {
  char id[64];
  char data_address[128];
  char hostname[64];
  zb_rpc_client *rpc;
  atomic_bool shutdown;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* guarded by mu */
  Zb__V1__Assignment *next_job; /* an assignment waiting for the job thread */
  Zb__V1__Assignment *update;   /* a plan update for the running job */
  char running_job[64];         /* "" when idle */
  atomic_bool *job_stop;        /* the running job's stop flag */
} worker;

static volatile sig_atomic_t got_signal;
static void on_signal(int sig) {
  got_signal = sig;
}

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Picks the data port once: bind port 0, read it, release it. The
 * transport binds it again per job (SO_REUSEADDR), so the address the
 * coordinator knows stays valid across jobs. */
static bool pick_data_address(const char *listen, char *out, size_t len) {
  const char *colon = strrchr(listen, ':');
  if (!colon)
    return false;
  int port = atoi(colon + 1);
  if (port == 0) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &sl)) {
      if (fd >= 0)
        close(fd);
      return false;
    }
    port = ntohs(sa.sin_port);
    close(fd);
  }
  snprintf(out, len, "%.*s:%d", (int)(colon - listen), listen, port);
  return true;
}

/* ---- reports ---- */

typedef enum report_result { REPORT_OK, REPORT_STOP, REPORT_FAILED } report_result;

/* Sends one Report. REPORT_STOP: the coordinator asked the rank to stop;
 * REPORT_FAILED: the call failed (the coordinator refused it, or did not
 * answer in time), with the status in why when given. */
static report_result report(worker *w, const Zb__V1__ReportRequest *req, char *why, size_t why_len) {
  ProtobufCMessage *resp = NULL;
  char details[256];
  grpc_status_code st =
      zb_rpc_unary(w->rpc, "/zb.v1.Zb/Report", &req->base, &zb__v1__report_response__descriptor, &resp, 5000,
                   false, details, sizeof details);
  if (st != GRPC_STATUS_OK) {
    if (req->job_id && req->job_id[0])
      ZB_WARN("report for job %s rank %d: %s: %s", req->job_id, req->rank, zb_rpc_status_name(st), details);
    if (why)
      snprintf(why, why_len, "%s: %s", zb_rpc_status_name(st), details);
    return REPORT_FAILED;
  }
  bool stop = ((Zb__V1__ReportResponse *)resp)->stop;
  protobuf_c_message_free_unpacked(resp, NULL);
  return stop ? REPORT_STOP : REPORT_OK;
}

/* ---- the job thread ---- */

typedef struct job_run {
  worker *w;
  const Zb__V1__Assignment *a;
  int plan_version;
  int switch_at;  /* iteration a pending update starts at; -1: none */
  char lost[300]; /* why an iteration's report failed; "" if none did */
} job_run;

/* Builds what the executor needs from an assignment. */
static zb_err job_plan(const Zb__V1__Assignment *a, zb_schedule **sched, zb_costs **costs, zb_diag *diag) {
  zb_family f;
  zb_err err = zb_family_parse(a->schedule, &f, diag);
  if (err)
    return err;
  int S = (int)a->n_stage_seconds;
  if (a->ranks < 1 || S < a->ranks || S % a->ranks != 0 || (int)a->n_stage_m_f != S ||
      (int)a->n_stage_m_b != S || (int)a->n_stage_m_w != S || !a->actions)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment: inconsistent stage tables (%d stages, %d ranks)", S, a->ranks);
  if (a->microbatches < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "assignment: microbatches %d (the coordinator is older "
                       "than this worker?)",
                       a->microbatches);
  *sched = zb_schedule_new(a->ranks, S / a->ranks, a->microbatches, zb_family_placement(f));
  if ((err = zb_wire_rank_actions_parse(a->actions, *sched, diag))) {
    zb_schedule_free(*sched);
    *sched = NULL;
    return err;
  }
  zb_format_fill_peers(*sched);
  *costs = zb_costs_new(S);
  for (int s = 0; s < S; s++) {
    (*costs)->t_f[s] = a->stage_seconds[s]->t_f;
    (*costs)->t_b[s] = a->stage_seconds[s]->t_b;
    (*costs)->t_w[s] = a->stage_seconds[s]->t_w;
    (*costs)->m_f[s] = a->stage_m_f[s];
    (*costs)->m_b[s] = a->stage_m_b[s];
    (*costs)->m_w[s] = a->stage_m_w[s];
  }
  return ZB_OK;
}

/* Reports one iteration (loss: the mean training loss when has_loss) and
 * says whether to go on with the current plan: false when the coordinator
 * said stop, the report failed (jr->lost says why), or an update starts
 * at the next iteration. */
static bool report_iteration(job_run *jr, const zb_rank_iteration *it, bool has_loss, double loss,
                             const zb_step_result *step) {
  worker *w = jr->w;
  Zb__V1__RankIteration ri = ZB__V1__RANK_ITERATION__INIT;
  ri.rank = it->rank;
  ri.wall_seconds = it->wall_seconds;
  ri.busy_f_seconds = it->busy_f_seconds;
  ri.busy_b_seconds = it->busy_b_seconds;
  ri.busy_w_seconds = it->busy_w_seconds;
  ri.idle_seconds = it->idle_seconds;
  ri.bytes_sent = it->bytes_sent;
  ri.peak_memory = it->peak_memory;
  ri.peak_memory_bytes = it->peak_memory_bytes;
  ri.bubble_ratio = it->bubble_ratio;
  ri.start_monotonic_seconds = it->start_seconds;
  ri.has_loss = has_loss;
  ri.loss = has_loss ? loss : 0;
  if (step) {
    ri.has_grad_norm = true;
    ri.grad_norm = step->grad_norm;
    ri.clipped = step->clipped;
    ri.skipped = step->skipped;
  }
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = w->id;
  req.job_id = jr->a->job_id;
  req.rank = jr->a->rank;
  req.iteration = it->iteration;
  req.plan_version = jr->plan_version;
  req.metrics = &ri;
  char why[300];
  report_result rr = report(w, &req, why, sizeof why);
  if (rr == REPORT_STOP) {
    atomic_store(w->job_stop, true);
    return false;
  }
  if (rr == REPORT_FAILED) {
    /* The coordinator may never have counted this iteration: going on, or
     * stopping quietly, would leave the job waiting for it. The rank fails
     * and says why, so the job ends with a reason. */
    snprintf(jr->lost, sizeof jr->lost, "cannot report iteration %d: %.250s", it->iteration, why);
    return false;
  }
  /* a plan update starting at the next iteration: stop here and switch */
  pthread_mutex_lock(&w->mu);
  Zb__V1__Assignment *u = w->update;
  bool switch_now = u && u->first_iteration == it->iteration + 1;
  if (u && !switch_now && u->first_iteration <= it->iteration)
    ZB_ERROR("job %s: plan update for iteration %d arrived after it started", jr->a->job_id,
             u->first_iteration);
  pthread_mutex_unlock(&w->mu);
  return !switch_now;
}

/* ---- the cpu backend's training state ---- */

#ifdef ZB_WITH_CPU_BACKEND
#define WORKER_BACKENDS "sim and cpu"
#else
#define WORKER_BACKENDS "sim"
#endif

/* What a cpu job keeps on this rank from its first iteration to its last,
 * across plan updates: the backend (its stages hold the weights and
 * gradients), one AdamW per hosted stage, and the text it samples. */
typedef struct cpu_job {
  zb_backend *be;
  zb_adamw **opt; /* per hosted stage, in the backend's (ascending) order */
  zb_stepper *stepper;
  float **params, **grads; /* per hosted stage, into the backend's stages */
  int rank, nranks;
  int *stages, n_stages, total_stages, microbatches;
  bool last; /* hosts the last stage: computes and reports the loss */
  uint8_t *text;
  size_t text_len;
  zb_cpu_text source; /* points into text */
  /* checkpoints (zb_checkpoint.h): on when ckpt_every > 0 */
  char job_id[64];
  int ckpt_every;
  char ckpt_dir[512];
  char resume_from[64]; /* "" or the job whose checkpoints to load before the first iteration */
  int completed;        /* the last iteration whose step is done here; -1: none */
  int saved;            /* the iteration of the last checkpoint written; -1: none */
  bool torn;            /* an iteration failed after its step: the state is no iteration's */
  const atomic_bool *stop;
  /* gradient dumps (zb_dump.h): on when dump_dir[0] */
  char dump_dir[700]; /* DIR/JOB_ID */
  int dump_every, iterations;
  float **before;      /* per hosted stage: the parameters before this iteration's step */
  zb_model_spec model; /* what the dumps record of the model */
} cpu_job;

#ifdef ZB_WITH_CPU_BACKEND
/* The stages rank hosts under the assignment's plan, ascending; returns
 * how many (an allocated array in *out). */
static int hosted_stages(const zb_schedule *sched, int rank, int **out) {
  int S = sched->p * sched->v, n = 0;
  *out = zb_malloc(sizeof(int) * (size_t)S);
  for (int s = 0; s < S; s++)
    if (zb_placement_rank(sched->placement, sched->p, sched->v, s) == rank)
      (*out)[n++] = s;
  return n;
}

/* Creates the cpu job's state from its first assignment: the model the
 * Assignment names (loss_scale 1/m, so the accumulated gradients are those
 * of the mean loss over the iteration's microbatches), the text when this
 * rank hosts the first or the last stage, and the optimizers. */
static zb_err cpu_job_open(cpu_job *cj, const Zb__V1__Assignment *a, const zb_schedule *sched,
                           const atomic_bool *stop, zb_diag *diag) {
  if (!a->model)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "assignment: a cpu job without a model");
  zb_job_spec defaults;
  zb_job_spec_default(&defaults);
  zb_model_spec ms = defaults.model;
  zb_err err = zb_wire_model_from_pb(a->model, &ms, diag);
  if (err)
    return err;
  snprintf(cj->job_id, sizeof cj->job_id, "%s", a->job_id);
  cj->ckpt_every = ms.checkpoint_every;
  snprintf(cj->ckpt_dir, sizeof cj->ckpt_dir, "%s", ms.checkpoint_dir);
  snprintf(cj->resume_from, sizeof cj->resume_from, "%s", ms.resume_from);
  if (ms.dump_dir[0]) {
    snprintf(cj->dump_dir, sizeof cj->dump_dir, "%s/%s", ms.dump_dir, a->job_id);
    if ((err = zb_file_mkdirs("dump", cj->dump_dir, diag)))
      return err;
  }
  cj->dump_every = ms.dump_every > 0 ? ms.dump_every : 1;
  cj->iterations = a->iterations;
  cj->model = ms;
  cj->completed = cj->saved = -1;
  cj->stop = stop;
  cj->n_stages = hosted_stages(sched, a->rank, &cj->stages);
  cj->total_stages = sched->p * sched->v;
  cj->microbatches = sched->m;
  bool first = false;
  for (int i = 0; i < cj->n_stages; i++) {
    first |= cj->stages[i] == 0;
    cj->last |= cj->stages[i] == cj->total_stages - 1;
  }
  if (first || cj->last) {
    if ((err = zb_file_slurp("model.data", ms.data, &cj->text, &cj->text_len, diag)))
      return err;
    if (cj->text_len < (size_t)ms.seq_len + 1)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                         "model.data: '%s' has %zu bytes; seq_len %d needs at least %d", ms.data,
                         cj->text_len, ms.seq_len, ms.seq_len + 1);
    cj->source = (zb_cpu_text){.text = cj->text, .len = cj->text_len, .seed = (uint64_t)ms.seed};
  }
  zb_cpu_backend_config bc = {
      .rank = a->rank,
      .stages = cj->stages,
      .n_stages = cj->n_stages,
      .total_stages = cj->total_stages,
      .model = {.hidden = ms.hidden,
                .heads = ms.heads,
                .layers = ms.layers,
                .seq_len = ms.seq_len,
                .batch = ms.batch,
                .seed = (uint64_t)ms.seed,
                .loss_scale = 1.0f / (float)sched->m},
      .data = {cj->text ? zb_backend_cpu_text_fill : NULL, &cj->source},
      .stop = stop,
      .inject_nan = {ms.inject_nan, ms.nan_iteration, ms.nan_microbatch},
  };
  if ((err = zb_backend_cpu_new(&bc, &cj->be, diag)))
    return err;
  zb_adamw_config oc = {
      .lr = ms.lr, .weight_decay = ms.weight_decay, .beta1 = ms.beta1, .beta2 = ms.beta2, .eps = ms.eps};
  cj->opt = zb_calloc((size_t)cj->n_stages, sizeof *cj->opt);
  cj->params = zb_calloc((size_t)cj->n_stages, sizeof *cj->params);
  cj->grads = zb_calloc((size_t)cj->n_stages, sizeof *cj->grads);
  cj->before = zb_calloc((size_t)cj->n_stages, sizeof *cj->before);
  cj->rank = a->rank;
  cj->nranks = a->ranks;
  size_t params = 0;
  for (int i = 0; i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    cj->params[i] = zb_model_params(st);
    cj->grads[i] = zb_model_grads(st);
    if (cj->dump_dir[0])
      cj->before[i] = zb_malloc(sizeof(float) * (zb_model_n_params(st) ? zb_model_n_params(st) : 1));
    if ((err = zb_adamw_new(&oc, zb_model_n_params(st), &cj->opt[i], diag)))
      return err;
    params += zb_model_n_params(st);
    /* decay the matrices (weights, embeddings), not the vectors (biases,
     * LayerNorm gains and shifts): the usual AdamW grouping */
    const float *base = zb_model_params(st);
    for (int t = 0; t < zb_model_n_tensors(st); t++) {
      const zb_model_tensor *tt = zb_model_tensor_at(st, t);
      if (tt->rows == 1 &&
          (err = zb_adamw_set_decay(cj->opt[i], (size_t)(tt->param - base), tt->numel, false, diag)))
        return err;
    }
  }
  zb_step_mode mode =
      strcmp(ms.step, ZB_STEP_SYNCHRONOUS_NAME) == 0 ? ZB_STEP_SYNCHRONOUS : ZB_STEP_POST_VALIDATED;
  if ((err = zb_stepper_new(cj->n_stages, cj->opt, ms.clip_norm, mode, &cj->stepper, diag)))
    return err;
  char list[128] = "";
  for (int i = 0; i < cj->n_stages; i++) {
    size_t len = strlen(list);
    snprintf(list + len, sizeof list - len, "%s%d", i ? "," : "", cj->stages[i]);
  }
  ZB_INFO("job %s rank %d: cpu model h=%d heads=%d layers=%d seq_len=%d batch=%d; stages %s of %d, %zu "
          "parameters here; AdamW lr %g, clip_norm %g, %s step",
          a->job_id, a->rank, ms.hidden, ms.heads, ms.layers, ms.seq_len, ms.batch, list, cj->total_stages,
          params, ms.lr, ms.clip_norm, ms.step);
  return ZB_OK;
}

/* Whether iteration is one the job dumps: 0, every, 2*every, ... and the last. */
static bool cpu_job_dumps(const cpu_job *cj, int iteration) {
  return cj->dump_dir[0] && (iteration % cj->dump_every == 0 || iteration == cj->iterations - 1);
}

/* Writes every hosted stage's dump of iteration (after its step). */
static zb_err cpu_job_dump(cpu_job *cj, int iteration, const zb_step_result *step, double loss, zb_diag *diag) {
  const zb_model_spec *ms = &cj->model;
  zb_err err = ZB_OK;
  for (int i = 0; !err && i < cj->n_stages; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
    const zb_model_config *mc = zb_model_stage_config(st);
    int nt = zb_model_n_tensors(st);
    zb_dump_tensor *tensors = zb_calloc((size_t)(nt ? nt : 1), sizeof *tensors);
    for (int t = 0; t < nt; t++) {
      const zb_model_tensor *tt = zb_model_tensor_at(st, t);
      snprintf(tensors[t].name, sizeof tensors[t].name, "%s", tt->name);
      tensors[t].rows = tt->rows;
      tensors[t].cols = tt->cols;
    }
    bool last = cj->stages[i] == cj->total_stages - 1;
    zb_dump d = {.iteration = iteration,
                 .stage = cj->stages[i],
                 .n_stages = cj->total_stages,
                 .rank = cj->rank,
                 .microbatches = cj->microbatches,
                 .vocab = mc->vocab,
                 .hidden = ms->hidden,
                 .heads = ms->heads,
                 .layers = ms->layers,
                 .seq_len = ms->seq_len,
                 .batch = ms->batch,
                 .seed = (uint64_t)ms->seed,
                 .flags = (last ? ZB_DUMP_HAS_LOSS : 0) | (step->clipped ? ZB_DUMP_CLIPPED : 0) |
                          (step->skipped ? ZB_DUMP_SKIPPED : 0),
                 .loss = last ? loss : 0,
                 .grad_norm = step->grad_norm,
                 .n_tensors = nt,
                 .tensors = tensors,
                 .n = zb_model_n_params(st),
                 .before = cj->before[i],
                 .grads = cj->grads[i],
                 .after = cj->params[i]};
    snprintf(d.job_id, sizeof d.job_id, "%s", cj->job_id);
    snprintf(d.data, sizeof d.data, "%s", ms->data);
    char path[800];
    snprintf(path, sizeof path, "%s/it%d-stage%d.dump", cj->dump_dir, iteration, cj->stages[i]);
    err = zb_dump_save(path, &d, diag);
    free(tensors);
  }
  return err;
}

/* After an iteration's W ops: the step on every hosted stage, checked
 * globally (zb_step.h; the reduction runs along the ranks over tr), then
 * the loss when this rank has the last stage. */
static zb_err cpu_job_step(cpu_job *cj, zb_transport *tr, int iteration, bool *has_loss, double *loss,
                           zb_step_result *step, zb_diag *diag) {
  zb_step_chain chain = {.tr = tr, .rank = cj->rank, .nranks = cj->nranks, .iteration = iteration};
  bool dump = cpu_job_dumps(cj, iteration);
  for (int i = 0; dump && i < cj->n_stages; i++)
    memcpy(cj->before[i], cj->params[i],
           sizeof(float) * zb_model_n_params(zb_backend_cpu_stage(cj->be, i, NULL)));
  zb_err err = zb_stepper_step(cj->stepper, cj->params, (const float *const *)cj->grads, zb_step_reduce_chain,
                               &chain, step, diag);
  if (err)
    return err;
  *has_loss = false;
  if (cj->last) {
    int count = 0;
    err = zb_backend_cpu_loss(cj->be, loss, &count, diag);
    cj->torn = err || count != cj->microbatches; /* stepped, yet the iteration fails */
    if (err)
      return err;
    if (count != cj->microbatches)
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "cpu job: the loss of %d microbatches, expected %d", count,
                         cj->microbatches);
    *has_loss = true;
  }
  if (dump && (err = cpu_job_dump(cj, iteration, step, *has_loss ? *loss : 0, diag)))
    cj->torn = true;
  return err;
}

/* A plan update keeps the cpu job's state only if this rank hosts the
 * same stages of the same model (the coordinator refuses other updates of
 * cpu jobs; this is the worker's own guard). */
static zb_err cpu_job_check_update(const cpu_job *cj, const zb_schedule *sched, int rank, zb_diag *diag) {
  int *stages;
  int n = hosted_stages(sched, rank, &stages);
  bool same = n == cj->n_stages && sched->p * sched->v == cj->total_stages && sched->m == cj->microbatches &&
              memcmp(stages, cj->stages, sizeof(int) * (size_t)n) == 0;
  free(stages);
  if (!same)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "plan update: a cpu job cannot change the stages a rank hosts (%d of %d before, %d of %d "
        "now) or its microbatches; the weights stay where they are",
        cj->n_stages, cj->total_stages, n, sched->p * sched->v);
  return ZB_OK;
}

/* ---- checkpoints of a cpu job (zb_checkpoint.h) ---- */

/* DIR/JOB/rank<r>-stage<s>.ckpt, or with prev its previous version
 * (.ckpt.prev): each save keeps the one before, because ranks stopped
 * mid-iteration may have completed different iterations (at most one
 * apart), and a resume needs one iteration that every rank holds. */
static void ckpt_path(const cpu_job *cj, const char *job_id, int stage, bool prev, char *buf, size_t len) {
  snprintf(buf, len, "%s/%s/rank%d-stage%d.ckpt%s", cj->ckpt_dir, job_id, cj->rank, stage,
           prev ? ".prev" : "");
}

/* The header and buffers of hosted stage i's checkpoint; sizes is an
 * allocated array the caller frees. */
static zb_ckpt ckpt_of(const cpu_job *cj, const char *job_id, int i, uint64_t **sizes) {
  zb_model_stage *st = zb_backend_cpu_stage(cj->be, i, NULL);
  int nt = zb_model_n_tensors(st);
  *sizes = zb_malloc(sizeof(uint64_t) * (size_t)(nt ? nt : 1));
  for (int t = 0; t < nt; t++)
    (*sizes)[t] = zb_model_tensor_at(st, t)->numel;
  zb_ckpt c = {.stage = cj->stages[i], .n_tensors = nt, .sizes = *sizes, .n = zb_model_n_params(st)};
  snprintf(c.job_id, sizeof c.job_id, "%s", job_id);
  return c;
}

/* Saves every hosted stage after iteration `iteration` (the state now). */
static zb_err cpu_job_save(cpu_job *cj, int iteration, zb_diag *diag) {
  if (cj->saved == iteration)
    return ZB_OK; /* the periodic save just wrote this state */
  char dir[700];
  snprintf(dir, sizeof dir, "%s/%s", cj->ckpt_dir, cj->job_id);
  zb_err err = zb_file_mkdirs("checkpoint", dir, diag);
  for (int i = 0; !err && i < cj->n_stages; i++) {
    uint64_t *sizes;
    zb_ckpt c = ckpt_of(cj, cj->job_id, i, &sizes);
    const float *m, *v;
    zb_adamw_state(cj->opt[i], &c.steps, &m, &v);
    c.iteration = iteration;
    /* zb_ckpt_save only reads the arrays */
    c.params = cj->params[i];
    c.m = (float *)m;
    c.v = (float *)v;
    char path[800], prev[800], tmp[820];
    ckpt_path(cj, cj->job_id, cj->stages[i], false, path, sizeof path);
    ckpt_path(cj, cj->job_id, cj->stages[i], true, prev, sizeof prev);
    /* the current file becomes .prev by a hard link renamed into place, so
     * at every moment the file itself is there, old or new */
    snprintf(tmp, sizeof tmp, "%s.tmp", prev);
    unlink(tmp);
    if (link(path, tmp) == 0) {
      if (rename(tmp, prev) != 0)
        err = zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot keep it as .prev: %s", path,
                          strerror(errno));
    } else if (errno != ENOENT) {
      err = zb_diag_set(diag, ZB_ERR_IO, "checkpoint '%s': cannot link it to '%s': %s", path, tmp,
                        strerror(errno));
    }
    if (!err)
      err = zb_ckpt_save(path, &c, diag);
    free(sizes);
  }
  if (!err) {
    cj->saved = iteration;
    ZB_INFO("job %s rank %d: checkpoint after iteration %d in %s", cj->job_id, cj->rank, iteration, dir);
  }
  return err;
}

/* The iterations checkpointed for hosted stage i of job `from`: up to two
 * (the file and .prev), -1 where absent. A file that is there but is not a
 * valid checkpoint of this stage is an error naming it. */
static zb_err ckpt_candidates(cpu_job *cj, const char *from, int i, int32_t out[2], zb_diag *diag) {
  uint64_t *sizes;
  zb_ckpt c = ckpt_of(cj, from, i, &sizes);
  float *buf = zb_malloc(sizeof(float) * 3 * (c.n ? c.n : 1));
  c.params = buf;
  c.m = buf + c.n;
  c.v = buf + 2 * c.n;
  zb_err err = ZB_OK;
  for (int k = 0; k < 2 && !err; k++) {
    char path[800];
    ckpt_path(cj, from, cj->stages[i], k == 1, path, sizeof path);
    out[k] = -1;
    struct stat sb;
    if (stat(path, &sb) != 0 && errno == ENOENT)
      continue;
    if (!(err = zb_ckpt_load(path, &c, diag)))
      out[k] = c.iteration;
  }
  free(buf);
  free(sizes);
  return err;
}

/* Loads job cj->resume_from's checkpoint into every hosted stage: the
 * last iteration that every stage of every rank holds. The ranks agree on
 * it along the chain 0 -> p-1 and back (like the optimizer's check), each
 * sending the iterations it could load (two int32, -1: none), intersected
 * on the way up; a rank that cannot read its files sends none, so all
 * fail together and it reports why. *k: the iteration loaded. */
static zb_err cpu_job_resume(cpu_job *cj, zb_transport *tr, int *k, zb_diag *diag) {
  int32_t cand[2] = {-1, -1};
  zb_err err = ZB_OK;
  for (int i = 0; i < cj->n_stages && !err; i++) {
    int32_t got[2];
    if ((err = ckpt_candidates(cj, cj->resume_from, i, got, diag)))
      break;
    if (i == 0) {
      cand[0] = got[0];
      cand[1] = got[1];
      continue;
    }
    for (int q = 0; q < 2; q++)
      if (cand[q] != got[0] && cand[q] != got[1])
        cand[q] = -1;
  }
  /* three int32: the candidates and whether some rank failed to read */
  int32_t mine[3] = {err ? -1 : cand[0], err ? -1 : cand[1], err ? 1 : 0}, msg[3];
  zb_tag up = {.kind = ZB_OP_F, .stage = -2, .mb = 0}, down = {.kind = ZB_OP_B, .stage = -2, .mb = 0};
  zb_diag tdiag = {{0}};
  zb_err terr = ZB_OK;
  if (cj->rank > 0 && !(terr = zb_transport_recv(tr, cj->rank - 1, up, msg, sizeof msg, &tdiag))) {
    for (int q = 0; q < 2; q++)
      if (mine[q] != msg[0] && mine[q] != msg[1])
        mine[q] = -1;
    mine[2] |= msg[2];
  }
  if (!terr && cj->rank < cj->nranks - 1 &&
      !(terr = zb_transport_send(tr, cj->rank + 1, up, mine, sizeof mine, &tdiag)) &&
      !(terr = zb_transport_recv(tr, cj->rank + 1, down, msg, sizeof msg, &tdiag)))
    memcpy(mine, msg, sizeof mine);
  if (!terr && cj->rank > 0)
    terr = zb_transport_send(tr, cj->rank - 1, down, mine, sizeof mine, &tdiag);
  if (err)
    return err;
  if (terr)
    return zb_diag_set(diag, terr, "resume from job %s: %s", cj->resume_from, tdiag.msg);
  if (mine[2]) {
    /* another rank cannot read its files and reports why; the job fails
     * with the first error, so give that one (naming the file) a head
     * start: the coordinator then releases this rank, which stops quietly */
    for (int t = 0; t < 20 && !atomic_load(cj->stop); t++)
      sleep_ms(100);
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "resume from job %s: another rank cannot read its checkpoint", cj->resume_from);
  }
  cand[0] = mine[0];
  cand[1] = mine[1];
  *k = cand[0] > cand[1] ? cand[0] : cand[1];
  if (*k < 0)
    return zb_diag_set(
        diag, ZB_ERR_INVALID_ARG,
        "resume from job %s: no iteration is checkpointed by every rank under %s/%s (or a rank "
        "could not read its files; see its error)",
        cj->resume_from, cj->ckpt_dir, cj->resume_from);
  for (int i = 0; i < cj->n_stages && !err; i++) {
    uint64_t *sizes;
    zb_ckpt c = ckpt_of(cj, cj->resume_from, i, &sizes);
    float *mv = zb_malloc(sizeof(float) * 2 * (c.n ? c.n : 1));
    c.params = cj->params[i];
    c.m = mv;
    c.v = mv + c.n;
    char path[800];
    ckpt_path(cj, cj->resume_from, cj->stages[i], false, path, sizeof path);
    if (!(err = zb_ckpt_load(path, &c, diag)) && c.iteration != *k) {
      ckpt_path(cj, cj->resume_from, cj->stages[i], true, path, sizeof path);
      err = zb_ckpt_load(path, &c, diag);
    }
    if (!err && c.iteration != *k)
      err = zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                        "checkpoint '%s': iteration %d, expected %d (changed under us?)", path, c.iteration,
                        *k);
    if (!err)
      err = zb_adamw_set_state(cj->opt[i], c.steps, c.m, c.v, c.n, diag);
    free(mv);
    free(sizes);
  }
  if (!err) {
    cj->completed = cj->saved = -1;
    ZB_INFO("job %s rank %d: resumed from job %s's checkpoint after iteration %d", cj->job_id, cj->rank,
            cj->resume_from, *k);
  }
  cj->resume_from[0] = 0;
  return err;
}
#endif

static void cpu_job_close(cpu_job *cj) {
  zb_stepper_free(cj->stepper);
  for (int i = 0; cj->before && i < cj->n_stages; i++)
    free(cj->before[i]);
  free(cj->before);
  free(cj->params);
  free(cj->grads);
  for (int i = 0; cj->opt && i < cj->n_stages; i++)
    zb_adamw_free(cj->opt[i]);
  free(cj->opt);
  zb_backend_free(cj->be);
  free(cj->stages);
  free(cj->text);
  memset(cj, 0, sizeof *cj);
}

/* The backend for one plan of the job: a fresh sim backend (*owned, freed
 * by the caller), or the cpu job's, created on its first plan and kept. */
static zb_err job_backend(const Zb__V1__Assignment *a, const zb_schedule *sched, const zb_costs *costs,
                          const atomic_bool *stop, cpu_job *cj, zb_backend **be, zb_backend **owned,
                          zb_diag *diag) {
  *be = *owned = NULL;
  if (strcmp(a->backend, "cpu") == 0) {
#ifdef ZB_WITH_CPU_BACKEND
    zb_err err =
        cj->be ? cpu_job_check_update(cj, sched, a->rank, diag) : cpu_job_open(cj, a, sched, stop, diag);
    if (!err)
      *be = cj->be;
    return err;
#else
    (void)cj;
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                       "backend cpu: this zb-worker was built without it (no OpenBLAS)");
#endif
  }
  if (a->backend[0] && strcmp(a->backend, "sim") != 0)
    return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "backend %s: this zb-worker offers %s", a->backend,
                       WORKER_BACKENDS);
  zb_sim_backend_config bc = {.costs = costs,
                              .rank_mf =
                                  zb_costs_rank_mf(costs, sched->placement, sched->p, sched->v, a->rank),
                              .bytes_per_activation = (size_t)a->bytes_per_activation,
                              .stop = stop};
  zb_err err = zb_backend_sim_new(&bc, owned, diag);
  *be = *owned;
  return err;
}

/* Runs one iteration: for a cpu job, begin_iteration before it and the
 * optimizer step after it (*stepped says the step ran and fills *step). */
static zb_err job_iteration(zb_executor *ex, zb_transport *tr, cpu_job *cj, int iteration,
                            zb_rank_iteration *it, bool *has_loss, double *loss, bool *stepped,
                            zb_step_result *step, zb_diag *diag) {
  *has_loss = false;
  *stepped = false;
  zb_err err = ZB_OK;
#ifdef ZB_WITH_CPU_BACKEND
  if (cj->be)
    err = zb_backend_cpu_begin_iteration(cj->be, iteration, diag);
  if (!err)
    err = zb_executor_run_iteration(ex, iteration, it, diag);
  if (!err && cj->be) {
    err = cpu_job_step(cj, tr, iteration, has_loss, loss, step, diag);
    *stepped = !err;
  }
#else
  (void)cj;
  (void)tr;
  (void)loss;
  (void)step;
  err = zb_executor_run_iteration(ex, iteration, it, diag);
#endif
  return err;
}

static uint64_t job_session(const char *job_id) {
  uint64_t h = 1469598103934665603ULL; /* FNV-1a: both ends derive the same */
  for (const char *p = job_id; *p; p++)
    h = (h ^ (uint8_t)*p) * 1099511628211ULL;
  return h;
}

/* Runs one assignment (and the updates that follow) to its end. Returns
 * an error message in diag when the rank failed (not when stopped). */
static zb_err job_execute(worker *w, const Zb__V1__Assignment *first, atomic_bool *stop, zb_diag *diag) {
  zb_transport *tr = NULL;
  zb_tcp_config tc = {.rank = first->rank,
                      .nranks = first->ranks,
                      .listen = w->data_address,
                      .session = job_session(first->job_id),
                      .stop = stop,
                      .idle_timeout_s = 30};
  zb_err err = zb_transport_tcp_new(&tc, &tr, diag);
  if (err)
    return err;
  const Zb__V1__Assignment *a = first;
  Zb__V1__Assignment *owned = NULL; /* an update we took over */
  cpu_job cj = {0};                 /* a cpu job's weights and optimizer state, across plans */
  int next = first->first_iteration;
  while (!err && next < a->iterations && !atomic_load(stop)) {
    zb_schedule *sched = NULL;
    zb_costs *costs = NULL;
    zb_backend *be = NULL, *sim = NULL;
    zb_executor *ex = NULL;
    if ((err = job_plan(a, &sched, &costs, diag)))
      break;
    const zb_rank_list *l = &sched->ranks[a->rank];
    bool *peers = zb_calloc((size_t)a->ranks, sizeof(bool));
    zb_executor_peers(l->actions, l->n, a->ranks, peers);
    if (strcmp(a->backend, "cpu") == 0) {
      /* the optimizer's global check runs along the ranks (zb_step_reduce_chain):
       * r and r+1 are neighbours in loop and V placement, but connect says so
       * rather than rely on it (connect is additive: known peers are skipped) */
      if (a->rank > 0)
        peers[a->rank - 1] = true;
      if (a->rank + 1 < a->ranks)
        peers[a->rank + 1] = true;
    }
    const char **addrs = zb_calloc((size_t)a->ranks, sizeof(char *));
    for (int q = 0; q < a->ranks && q < (int)a->n_peer_addresses; q++)
      addrs[q] = a->peer_addresses[q];
    err = zb_transport_connect(tr, addrs, peers, 30, diag);
    free(addrs);
    free(peers);
    if (!err)
      err = job_backend(a, sched, costs, stop, &cj, &be, &sim, diag);
    zb_executor_config ec = {.rank = a->rank,
                             .nranks = a->ranks,
                             .actions = l->actions,
                             .n_actions = l->n,
                             .costs = costs,
                             .bytes_per_activation = (size_t)a->bytes_per_activation,
                             .stop = stop};
    if (!err)
      err = zb_executor_new(&ec, be, tr, &ex, diag);
#ifdef ZB_WITH_CPU_BACKEND
    if (!err && cj.be && cj.resume_from[0]) { /* a resumed job: its first plan loads the checkpoint */
      int k = -1;
      if (!(err = cpu_job_resume(&cj, tr, &k, diag))) {
        if (k + 1 >= a->iterations)
          err =
              zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                          "resume: the checkpoint is after iteration %d, the job's last: nothing to run", k);
        next = k + 1;
      }
    }
#endif
    if (!err) {
      ZB_INFO("job %s rank %d: %s, iterations %d..%d", a->job_id, a->rank, a->schedule, next + 1,
              a->iterations);
      job_run jr = {.w = w, .a = a, .plan_version = a->plan_version};
      bool go_on = true;
      /* one iteration at a time: a cpu job steps its optimizer between them */
      while (go_on && next < a->iterations && !atomic_load(stop)) {
        zb_rank_iteration it;
        bool has_loss, stepped;
        double loss = 0;
        zb_step_result step;
        if ((err = job_iteration(ex, tr, &cj, next, &it, &has_loss, &loss, &stepped, &step, diag)))
          break;
        if (has_loss)
          ZB_DEBUG("job %s iteration %d: loss %.6f", a->job_id, next, loss);
        if (stepped && (step.skipped || step.clipped))
          ZB_DEBUG("job %s rank %d iteration %d: grad norm %g, step %s", a->job_id, a->rank, next,
                   step.grad_norm, step.skipped ? "skipped (non-finite)" : "clipped");
#ifdef ZB_WITH_CPU_BACKEND
        if (stepped) {
          cj.completed = next;
          /* before the report: a reported iteration N-1, 2N-1, ... is on disk */
          if (cj.ckpt_every > 0 && (next + 1) % cj.ckpt_every == 0 && (err = cpu_job_save(&cj, next, diag)))
            break;
        }
#endif
        next++;
        go_on = report_iteration(&jr, &it, has_loss, loss, stepped ? &step : NULL);
      }
      if (!err && jr.lost[0])
        err = zb_diag_set(diag, ZB_ERR_IO, "%s", jr.lost);
    }
    zb_executor_free(ex);
    zb_backend_free(sim);
    zb_schedule_free(sched);
    zb_costs_free(costs);
    if (err || next >= a->iterations || atomic_load(stop))
      break;
    /* stopped early for an update: take it over */
    pthread_mutex_lock(&w->mu);
    Zb__V1__Assignment *u = w->update;
    w->update = NULL;
    pthread_mutex_unlock(&w->mu);
    if (!u || u->first_iteration != next) {
      err = zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                        "stopped at iteration %d for a plan update that is not there", next);
      if (u)
        protobuf_c_message_free_unpacked(&u->base, NULL);
      break;
    }
    if (owned)
      protobuf_c_message_free_unpacked(&owned->base, NULL);
    owned = u;
    a = u;
  }
#ifdef ZB_WITH_CPU_BACKEND
  /* cancelled, released or failed before the end: keep the last completed
   * iteration, so a resume loses at most the one in flight */
  if (cj.be && cj.ckpt_every > 0 && next < a->iterations && cj.completed >= 0 && !cj.torn) {
    zb_diag sd = {{0}};
    if (cpu_job_save(&cj, cj.completed, &sd))
      ZB_ERROR("job %s rank %d: %s", cj.job_id, cj.rank, sd.msg);
  }
#endif
  if (owned)
    protobuf_c_message_free_unpacked(&owned->base, NULL);
  cpu_job_close(&cj);
  zb_transport_free(tr);
  return err;
}

static void *job_thread(void *arg) {
  worker *w = arg;
  for (;;) {
    pthread_mutex_lock(&w->mu);
    while (!w->next_job && !atomic_load(&w->shutdown))
      pthread_cond_wait(&w->cv, &w->mu);
    Zb__V1__Assignment *a = w->next_job;
    w->next_job = NULL;
    if (!a) {
      pthread_mutex_unlock(&w->mu);
      return NULL;
    }
    atomic_bool stop = false;
    w->job_stop = &stop;
    snprintf(w->running_job, sizeof w->running_job, "%s", a->job_id);
    pthread_mutex_unlock(&w->mu);

    zb_diag d = {{0}};
    zb_err err = job_execute(w, a, &stop, &d);
    bool stopped = atomic_load(&stop);
    Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
    req.worker_id = w->id;
    req.job_id = a->job_id;
    req.rank = a->rank;
    if (err && !stopped) {
      ZB_ERROR("job %s rank %d failed: %s", a->job_id, a->rank, d.msg);
      req.error = d.msg;
      report(w, &req, NULL, 0);
    } else if (!err && !stopped) {
      req.done = true;
      report(w, &req, NULL, 0);
      ZB_INFO("job %s rank %d: done", a->job_id, a->rank);
    } else {
      ZB_INFO("job %s rank %d: stopped", a->job_id, a->rank);
    }
    pthread_mutex_lock(&w->mu);
    w->job_stop = NULL;
    w->running_job[0] = 0;
    if (w->update) {
      protobuf_c_message_free_unpacked(&w->update->base, NULL);
      w->update = NULL;
    }
    pthread_mutex_unlock(&w->mu);
    protobuf_c_message_free_unpacked(&a->base, NULL);
  }
}

/* ---- the control loop ---- */

static void stop_running_job(worker *w, const char *job_id) {
  pthread_mutex_lock(&w->mu);
  if (w->job_stop && (!job_id || strcmp(w->running_job, job_id) == 0))
    atomic_store(w->job_stop, true);
  if (w->next_job && (!job_id || strcmp(w->next_job->job_id, job_id) == 0)) {
    protobuf_c_message_free_unpacked(&w->next_job->base, NULL);
    w->next_job = NULL;
  }
  pthread_mutex_unlock(&w->mu);
}

/* Takes a command from the stream; msg is consumed. */
static void on_command(worker *w, Zb__V1__Command *cmd) {
  if (cmd->kind_case == ZB__V1__COMMAND__KIND_ASSIGN) {
    Zb__V1__Assignment *a = cmd->assign;
    cmd->assign = NULL; /* keep it past the command */
    cmd->kind_case = ZB__V1__COMMAND__KIND__NOT_SET;
    pthread_mutex_lock(&w->mu);
    if (a->plan_version > 1 && strcmp(w->running_job, a->job_id) == 0) {
      ZB_INFO("job %s: plan update to %s from iteration %d", a->job_id, a->schedule, a->first_iteration + 1);
      if (w->update)
        protobuf_c_message_free_unpacked(&w->update->base, NULL);
      w->update = a;
    } else {
      ZB_INFO("assigned job %s rank %d of %d (%s)", a->job_id, a->rank, a->ranks, a->schedule);
      if (w->next_job)
        protobuf_c_message_free_unpacked(&w->next_job->base, NULL);
      w->next_job = a;
      pthread_cond_signal(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
  } else if (cmd->kind_case == ZB__V1__COMMAND__KIND_RELEASE_JOB_ID) {
    ZB_INFO("released from job %s", cmd->release_job_id);
    stop_running_job(w, cmd->release_job_id);
  }
  protobuf_c_message_free_unpacked(&cmd->base, NULL);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void control_loop(worker *w, int heartbeat_ms) {
  int backoff_ms = 100;
  while (!got_signal) {
    Zb__V1__AttachRequest req = ZB__V1__ATTACH_REQUEST__INIT;
#ifdef ZB_WITH_CPU_BACKEND
    char *backends[] = {"sim", "cpu"}, *transports[] = {"tcp"};
#else
    char *backends[] = {"sim"}, *transports[] = {"tcp"};
#endif
    req.worker_id = w->id;
    req.data_address = w->data_address;
    req.n_backends = sizeof backends / sizeof backends[0];
    req.backends = backends;
    req.n_transports = 1;
    req.transports = transports;
    req.hostname = w->hostname;
    req.gpu = "";
    zb_rpc_stream *st = zb_rpc_stream_open(w->rpc, "/zb.v1.Zb/Attach", &req.base, 0, true);
    double last_beat = 0;
    bool attached = false;
    for (;;) {
      if (got_signal)
        break;
      ProtobufCMessage *msg;
      int got = zb_rpc_stream_read(st, &zb__v1__command__descriptor, &msg, 200);
      if (got == 0)
        break;
      if (got == 1) {
        if (!attached)
          ZB_INFO("attached to %s as %s (data %s)", "the coordinator", w->id, w->data_address);
        attached = true;
        backoff_ms = 100;
        on_command(w, (Zb__V1__Command *)msg);
      }
      if (attached && now_s() - last_beat >= heartbeat_ms / 1000.0) {
        last_beat = now_s();
        Zb__V1__ReportRequest beat = ZB__V1__REPORT_REQUEST__INIT;
        beat.worker_id = w->id;
        report(w, &beat, NULL, 0);
      }
    }
    char details[256] = "";
    grpc_status_code code = GRPC_STATUS_CANCELLED;
    if (!got_signal)
      code = zb_rpc_stream_status(st, details, sizeof details);
    zb_rpc_stream_free(st);
    if (got_signal)
      break;
    /* The coordinator went away: our job cannot report, so it ends. */
    stop_running_job(w, NULL);
    ZB_WARN("attach stream ended (%s: %s); re-attaching in %d ms", zb_rpc_status_name(code), details,
            backoff_ms);
    sleep_ms(backoff_ms);
    backoff_ms = backoff_ms * 2 > 2000 ? 2000 : backoff_ms * 2;
  }
}

int main(int argc, char **argv) {
  worker w;
  memset(&w, 0, sizeof w);
  const char *coordinator = "127.0.0.1:7070", *listen = "127.0.0.1:0", *id = NULL;
  int heartbeat_ms = 1000, level = ZB_LOG_INFO;
  static const struct option opts[] = {{"coordinator", required_argument, NULL, 'c'},
                                       {"id", required_argument, NULL, 'i'},
                                       {"listen", required_argument, NULL, 'l'},
                                       {"heartbeat-ms", required_argument, NULL, 'b'},
                                       {"log-level", required_argument, NULL, 'L'},
                                       {"version", no_argument, NULL, 'V'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'c': coordinator = optarg; break;
    case 'i': id = optarg; break;
    case 'l': listen = optarg; break;
    case 'b': {
      char *end;
      long v = strtol(optarg, &end, 10);
      if (*end || v < 50 || v > 60000) {
        fprintf(stderr, "zb-worker: --heartbeat-ms takes 50..60000, not '%s'\n", optarg);
        return 2;
      }
      heartbeat_ms = (int)v;
      break;
    }
    case 'L':
      if ((level = zb_log_level_parse(optarg)) < 0) {
        fprintf(stderr, "zb-worker: --log-level takes debug, info, warn or error, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'V': printf("zb-worker %s\n", ZB_VERSION); return 0;
    case 'h': fputs(usage_text, stdout); return 0;
    default: fputs(usage_text, stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "zb-worker: unexpected argument '%s'\n%s", argv[optind], usage_text);
    return 2;
  }
  gethostname(w.hostname, sizeof w.hostname - 1);
  if (id)
    snprintf(w.id, sizeof w.id, "%s", id);
  else
    snprintf(w.id, sizeof w.id, "%.40s-%d", w.hostname, (int)getpid());
  char name[80];
  snprintf(name, sizeof name, "worker %s", w.id);
  zb_log_init(name, (zb_log_level)level);
  if (!pick_data_address(listen, w.data_address, sizeof w.data_address)) {
    ZB_ERROR("--listen %s: cannot pick a data port (%s)", listen, strerror(errno));
    return 1;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  w.rpc = zb_rpc_client_new(coordinator, 64 << 20);
  pthread_t jt;
  pthread_create(&jt, NULL, job_thread, &w);
  ZB_INFO("zb-worker %s: coordinator %s, data address %s", ZB_VERSION, coordinator, w.data_address);
  control_loop(&w, heartbeat_ms);
  ZB_INFO("signal %d: stopping", (int)got_signal);
  atomic_store(&w.shutdown, true);
  stop_running_job(&w, NULL);
  pthread_mutex_lock(&w.mu);
  pthread_cond_signal(&w.cv);
  pthread_mutex_unlock(&w.mu);
  pthread_join(jt, NULL);
  zb_rpc_client_free(w.rpc);
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  return 0;
}
