/* zb-worker: attaches to zb-coordinator (a server stream carries its
 * commands), heartbeats, and runs each assignment on a job thread with the
 * executor, a compute backend and a p2p transport, reporting every
 * iteration. It re-attaches with backoff when the coordinator goes away.
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
#include <time.h>
#include <unistd.h>

#include "zb/v1/zb.pb-c.h"
#include "zb_alloc.h"
#include "zb_executor.h"
#include "zb_format.h"
#include "zb_log.h"
#include "zb_plan.h"
#include "zb_rpc.h"
#include "zb_wire.h"

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: zb-worker [--coordinator ADDR] [--id ID] [--listen ADDR] [--heartbeat-ms N]\n"
    "                 [--log-level L] [--version] [--help]\n"
    "\n"
    "Attaches to zb-coordinator and runs the ranks it is assigned: compute on a\n"
    "backend (sim here), activations and gradients to its neighbours over a\n"
    "transport (tcp here), a report per iteration.\n"
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
  *sched = zb_schedule_new(a->ranks, S / a->ranks, 1, zb_family_placement(f));
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

static bool on_iteration(void *ud, const zb_rank_iteration *it) {
  job_run *jr = ud;
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
  int next = first->first_iteration;
  while (!err && next < a->iterations && !atomic_load(stop)) {
    zb_schedule *sched = NULL;
    zb_costs *costs = NULL;
    zb_backend *be = NULL;
    zb_executor *ex = NULL;
    if ((err = job_plan(a, &sched, &costs, diag)))
      break;
    const zb_rank_list *l = &sched->ranks[a->rank];
    bool *peers = zb_calloc((size_t)a->ranks, sizeof(bool));
    zb_executor_peers(l->actions, l->n, a->ranks, peers);
    const char **addrs = zb_calloc((size_t)a->ranks, sizeof(char *));
    for (int q = 0; q < a->ranks && q < (int)a->n_peer_addresses; q++)
      addrs[q] = a->peer_addresses[q];
    err = zb_transport_connect(tr, addrs, peers, 30, diag);
    free(addrs);
    free(peers);
    zb_sim_backend_config bc = {.costs = costs,
                                .rank_mf =
                                    zb_costs_rank_mf(costs, sched->placement, sched->p, sched->v, a->rank),
                                .bytes_per_activation = (size_t)a->bytes_per_activation,
                                .stop = stop};
    if (!err)
      err = zb_backend_sim_new(&bc, &be, diag);
    zb_executor_config ec = {.rank = a->rank,
                             .nranks = a->ranks,
                             .actions = l->actions,
                             .n_actions = l->n,
                             .costs = costs,
                             .bytes_per_activation = (size_t)a->bytes_per_activation,
                             .stop = stop};
    if (!err)
      err = zb_executor_new(&ec, be, tr, &ex, diag);
    if (!err) {
      ZB_INFO("job %s rank %d: %s, iterations %d..%d", a->job_id, a->rank, a->schedule, next + 1,
              a->iterations);
      job_run jr = {.w = w, .a = a, .plan_version = a->plan_version};
      int done = 0;
      err = zb_executor_run(ex, next, a->iterations - next, on_iteration, &jr, &done, diag);
      next += done;
      if (!err && jr.lost[0])
        err = zb_diag_set(diag, ZB_ERR_IO, "%s", jr.lost);
    }
    zb_executor_free(ex);
    zb_backend_free(be);
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
  if (owned)
    protobuf_c_message_free_unpacked(&owned->base, NULL);
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
    char *backends[] = {"sim"}, *transports[] = {"tcp"};
    req.worker_id = w->id;
    req.data_address = w->data_address;
    req.n_backends = 1;
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
