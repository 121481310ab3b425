/* zb-worker: attaches to zb-coordinator (a server stream carries its
 * commands), heartbeats, and runs each assignment on a job thread with the
 * executor, a compute backend and a p2p transport, reporting every
 * iteration. It re-attaches with backoff when the coordinator goes away.
 *
 * Backends: sim (sleeps the planned op times), and cpu where it is built in
 * (ZB_WITH_CPU_BACKEND: OpenBLAS was found): the built-in model trained
 * with AdamW on each rank's own stages (cpu_job.h); cuda and the nccl
 * transport where CUDA is built in and the --gpu device is there (gpu.c).
 *
 * This file is the main thread: flags, the Attach stream and its commands
 * (an Assignment is decoded here, so a bad one fails its rank at once),
 * heartbeats. The job thread is job.c's; see worker.h. */
#include <errno.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_log.h"
#include "zb_methods.h"
#include "zb_names.h"
#include "zb_sd.h"
#include "zb_transport.h"

#ifdef ZB_WITH_CPU_BACKEND
#include "zb_blas.h"
#endif

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static const char usage_text[] =
    "usage: zb-worker [--coordinator ADDR] [--id ID] [--listen ADDR] [--advertise-address HOST]\n"
    "                 [--heartbeat-ms N] [--max-message-bytes N] [--gpu N] [--memory-bytes N]\n"
    "                 [--log-level L]\n"
    "                 [--tls-ca FILE --tls-cert FILE --tls-key FILE] [--path-root DIR]...\n"
    "                 [--version] [--help]\n"
    "\n"
    "Attaches to zb-coordinator and runs the ranks it is assigned: compute on a\n"
    "backend (sim; cpu, the built-in model with AdamW, when built with OpenBLAS;\n"
    "cuda, the same model on a GPU, when built with CUDA and the GPU is there),\n"
    "activations and gradients to its neighbours over a transport (tcp; nccl\n"
    "with cuda), a report per iteration.\n"
    "\n"
    "  --coordinator ADDR  zb-coordinator's gRPC address (default 127.0.0.1:7070)\n"
    "  --id ID             worker id (default HOSTNAME-PID)\n"
    "  --listen ADDR       data address for peers (default 127.0.0.1:0: a free port,\n"
    "                      chosen at start and kept across jobs)\n"
    "  --advertise-address HOST  the host peers dial, with the bound port (default:\n"
    "                      the --listen host; this host's name when that is\n"
    "                      0.0.0.0 or ::). In Kubernetes, the pod's IP\n"
    "  --heartbeat-ms N    heartbeat period (default 1000); the coordinator may ask\n"
    "                      for a longer one (many workers attached)\n"
    "  --max-message-bytes N  largest message it receives from the coordinator,\n"
    "                      4096..1073741824 (default 1073741824, the most the\n"
    "                      coordinator's max_message_bytes allows: every plan the\n"
    "                      coordinator can send); told to the coordinator, which\n"
    "                      refuses jobs whose assignments would not fit\n"
    "  --gpu N             the CUDA device to use (default 0): an ordinal among the\n"
    "                      devices CUDA_VISIBLE_DEVICES leaves visible, which the\n"
    "                      CUDA runtime applies (CUDA_VISIBLE_DEVICES=3 --gpu 0 is\n"
    "                      physical GPU 3); run one worker per GPU. Without a\n"
    "                      device (or a build without CUDA) it offers no cuda\n"
    "                      backend and says why in its log\n"
    "  --memory-bytes N    host memory to advertise for cpu jobs (default: what is\n"
    "                      available at start, capped by this cgroup's memory\n"
    "                      limit; 0: advertise none); the coordinator refuses a\n"
    "                      job whose model cannot fit (a cuda job is judged by the\n"
    "                      GPU's memory)\n"
    "  --log-level L       debug, info, warn, error (default info)\n"
    "  --tls-ca FILE       mutual TLS with the coordinator: the cluster's CA,\n"
    "  --tls-cert FILE       this worker's certificate (zb://worker/ID, ID its --id)\n"
    "  --tls-key FILE        and its key; none of the three: plaintext (a coordinator\n"
    "                        in insecure mode, loopback development only)\n"
    "  --path-root DIR     a directory job specs may name (model.data, checkpoint_dir,\n"
    "                      dump_dir), repeatable; a job naming a path outside every\n"
    "                      root fails with the reason. None: any path this worker\n"
    "                      can reach (warned at start)\n";

static volatile sig_atomic_t got_signal;

static void on_signal(int sig) {
  got_signal = sig;
}

void worker_sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* Opens the data port once, for the worker's life: every job's tcp
 * transport accepts on this socket, so the address the coordinator knows
 * stays this worker's (releasing it between jobs let another process take
 * the port). Advertises --listen's host with the bound port. */
/* A listen host that names no one address peers could dial. */
static bool wildcard_host(const char *host, int len) {
  return len == 0 || (len == 7 && strncmp(host, "0.0.0.0", 7) == 0) ||
         (len == 2 && strncmp(host, "::", 2) == 0) || (len == 4 && strncmp(host, "[::]", 4) == 0);
}

/* Binds the data port (kept for the worker's life) and sets the address
 * peers are told to dial: --advertise-address HOST with the bound port,
 * else the listen host, or this host's name when that is a wildcard. */
static bool open_data_port(worker *w, const char *listen, const char *advertise) {
  const char *colon = strrchr(listen, ':');
  zb_diag d = {{0}};
  int port = 0;
  if (!colon || zb_tcp_listen(listen, &w->data_fd, &port, &d) != ZB_OK) {
    ZB_ERROR("--listen %s: %s", listen, colon ? d.msg : "expected host:port");
    return false;
  }
  int len = (int)(colon - listen);
  const char *host = listen;
  if (advertise) {
    host = advertise;
    len = (int)strlen(advertise);
  } else if (wildcard_host(listen, len)) {
    host = w->hostname;
    len = (int)strlen(w->hostname);
    ZB_WARN("--listen %s names no address peers can dial: advertising %s:%d (set --advertise-address, "
            "e.g. a pod's IP)",
            listen, host, port);
  }
  bool v6 = memchr(host, ':', (size_t)len) && host[0] != '[';
  snprintf(w->data_address, sizeof w->data_address, "%s%.*s%s:%d", v6 ? "[" : "", len, host, v6 ? "]" : "",
           port);
  return true;
}

static void stop_running_job(worker *w, const char *job_id) {
  pthread_mutex_lock(&w->mu);
  if (w->job_stop && (!job_id || strcmp(w->running_job, job_id) == 0))
    atomic_store(w->job_stop, true);
  if (w->next_job && (!job_id || strcmp(w->next_job->job_id, job_id) == 0)) {
    worker_assignment_free(w->next_job);
    w->next_job = NULL;
  }
  pthread_mutex_unlock(&w->mu);
}

void worker_assignment_free(zb_assignment *a) {
  if (a)
    zb_assignment_free(a);
  free(a);
}

/* Hands a decoded assignment to the job thread: a plan update of the
 * running job (or of the job it is about to start: an update can follow
 * the first plan before the job thread took it, and must not replace it,
 * or this rank would start at the update's iteration), or the next job. */
static void take_assignment(worker *w, zb_assignment *a) {
  pthread_mutex_lock(&w->mu);
  bool ours =
      strcmp(w->running_job, a->job_id) == 0 || (w->next_job && strcmp(w->next_job->job_id, a->job_id) == 0);
  if (a->plan_version > 1 && ours) {
    ZB_INFO("job %s: plan update to %s from iteration %d", a->job_id, a->schedule, a->first_iteration + 1);
    worker_assignment_free(w->update);
    w->update = a;
  } else {
    ZB_INFO("assigned job %s rank %d of %d (%s)", a->job_id, a->rank, a->ranks, a->schedule);
    worker_assignment_free(w->next_job);
    w->next_job = a;
    pthread_cond_signal(&w->cv);
  }
  pthread_mutex_unlock(&w->mu);
}

/* Decodes an Assignment; one that does not decode fails its rank (and so
 * the job) with the decoder's reason. */
static void on_assign(worker *w, const Zb__V1__Assignment *pb) {
  zb_assignment *a = zb_calloc(1, sizeof *a);
  zb_diag d = {{0}};
  if (zb_assignment_decode(pb, a, &d) == ZB_OK) {
    take_assignment(w, a);
    return;
  }
  worker_assignment_free(a);
  ZB_ERROR("job %s rank %d: %s", pb->job_id ? pb->job_id : "?", pb->rank, d.msg);
  if (pb->job_id && pb->job_id[0]) {
    stop_running_job(w, pb->job_id);
    worker_report_end(w, pb->job_id, pb->rank, d.msg, false);
  }
}

/* Takes a command from the stream; cmd is consumed. */
static void on_command(worker *w, Zb__V1__Command *cmd) {
  if (cmd->kind_case == ZB__V1__COMMAND__KIND_ASSIGN) {
    on_assign(w, cmd->assign);
  } else if (cmd->kind_case == ZB__V1__COMMAND__KIND_NCCL_ID) {
    worker_take_nccl_id(w, cmd->nccl_id);
  } else if (cmd->kind_case == ZB__V1__COMMAND__KIND_RELEASE_JOB_ID) {
    ZB_INFO("released from job %s", cmd->release_job_id);
    stop_running_job(w, cmd->release_job_id);
  }
  protobuf_c_message_free_unpacked(&cmd->base, NULL);
}

/* Keep-alives for systemd's WatchdogSec (0: none) from the control loop,
 * which turns at least every 200 ms while the worker is sound. */
static void watchdog_ping(uint64_t period_ms, double *last) {
  if (period_ms && zb_clock_s() - *last >= (double)period_ms / 2000.0) {
    *last = zb_clock_s();
    zb_sd_notify("WATCHDOG=1");
  }
}

/* A worker that cannot reach its coordinator says so, at 5 s and then
 * every 30 s (its Attach waits for the channel, which never fails). */
static void warn_unattached(const char *coordinator, double opened, double *next_warn) {
  double waited = zb_clock_s() - opened;
  if (waited < *next_warn)
    return;
  ZB_WARN("not attached to %s after %.0f s: is zb-coordinator running there, and reachable? (still trying)",
          coordinator, waited);
  *next_warn = waited + 30;
}

/* What the worker offers, and the job it still runs from before (a
 * restarted coordinator takes it back): into req, whose strings point
 * into w and the caller's arrays. */
static void attach_request(worker *w, Zb__V1__AttachRequest *req, char *backends[3], char *transports[2],
                           char running[64]) {
  size_t nb = 0, nt = 0;
  backends[nb++] = (char *)ZB_BACKEND_SIM;
#ifdef ZB_WITH_CPU_BACKEND
  backends[nb++] = (char *)ZB_BACKEND_CPU;
#endif
  transports[nt++] = "tcp";
  if (w->has_cuda) { /* gpu.c found the device */
    backends[nb++] = (char *)ZB_BACKEND_CUDA;
    transports[nt++] = "nccl";
  }
  req->worker_id = w->id;
  req->data_address = w->data_address;
  req->n_backends = nb;
  req->backends = backends;
  req->n_transports = nt;
  req->transports = transports;
  req->hostname = w->hostname;
  req->gpu = w->gpu;
  req->blas = w->blas;
  req->max_receive_bytes = w->max_receive_bytes;
  req->memory_bytes = w->memory_bytes;
  req->gpu_memory_bytes = w->gpu_memory_bytes;
  pthread_mutex_lock(&w->mu);
  snprintf(running, 64, "%s", w->running_job);
  req->running_rank = running[0] ? w->running_rank : 0;
  pthread_mutex_unlock(&w->mu);
  req->running_job_id = running;
}

/* The CBLAS the cpu backend computes with, as the library describes
 * itself (docs/model.md, BLAS); "none" without the cpu backend. */
static void worker_blas(char *out, size_t cap) {
#ifdef ZB_WITH_CPU_BACKEND
  zb_blas_describe(out, cap);
#else
  snprintf(out, cap, "none");
#endif
}

/* The heartbeat period: the worker's own (--heartbeat-ms), or the longer
 * one its coordinator asks for on a Command (docs/wire.md, Heartbeats). */
static int heartbeat_period(int own_ms, int current_ms, const Zb__V1__Command *cmd) {
  if (cmd->heartbeat_ms <= 0)
    return current_ms;
  int ms = cmd->heartbeat_ms > own_ms ? cmd->heartbeat_ms : own_ms;
  if (ms != current_ms)
    ZB_DEBUG("heartbeat every %d ms (the coordinator asks for %d, --heartbeat-ms %d)", ms, cmd->heartbeat_ms,
             own_ms);
  return ms;
}

static void control_loop(worker *w, const char *coordinator, int heartbeat_ms) {
  int backoff_ms = 100;
  uint64_t watchdog_ms = zb_sd_watchdog_usec() / 1000;
  double last_watchdog = 0;
  while (!got_signal) {
    Zb__V1__AttachRequest req = ZB__V1__ATTACH_REQUEST__INIT;
    char *backends[3], *transports[2], running[64];
    attach_request(w, &req, backends, transports, running);
    zb_rpc_stream *st = zb_rpc_stream_open(w->rpc, ZB_METHOD_ATTACH, &req.base, 0, true);
    double last_beat = 0, opened = zb_clock_s(), next_warn = 5;
    bool attached = false;
    int beat_ms = heartbeat_ms; /* until this coordinator asks for another */
    for (;;) {
      if (got_signal)
        break;
      watchdog_ping(watchdog_ms, &last_watchdog);
      if (!attached)
        warn_unattached(coordinator, opened, &next_warn);
      ProtobufCMessage *msg;
      int got = zb_rpc_stream_read(st, &zb__v1__command__descriptor, &msg, 200);
      if (got == 0)
        break;
      if (got == 1) {
        if (!attached) {
          ZB_INFO("attached to %s as %s (data %s)%s%s", coordinator, w->id, w->data_address,
                  running[0] ? ", running job " : "", running);
          zb_sd_notifyf("STATUS=attached to %s as %s", coordinator, w->id);
          if (running[0])
            worker_report_resend(w);
        }
        attached = true;
        backoff_ms = 100;
        beat_ms = heartbeat_period(heartbeat_ms, beat_ms, (Zb__V1__Command *)msg);
        on_command(w, (Zb__V1__Command *)msg);
      }
      if (attached && zb_clock_s() - last_beat >= beat_ms / 1000.0) {
        last_beat = zb_clock_s();
        Zb__V1__ReportRequest beat = ZB__V1__REPORT_REQUEST__INIT;
        beat.worker_id = w->id;
        worker_report(w, &beat, NULL, 0);
      }
    }
    char details[256] = "";
    grpc_status_code code = GRPC_STATUS_CANCELLED;
    if (!got_signal)
      code = zb_rpc_stream_status(st, details, sizeof details);
    zb_rpc_stream_free(st);
    if (got_signal)
      break;
    /* The coordinator went away: the job goes on (its reports wait for the
     * next coordinator, WORKER_REPORT_RIDE_OUT_S at most), and attaching
     * again names it so that a restarted coordinator takes it back or
     * releases it. The next coordinator's clock is another (a restarted
     * one, or another host's), so the offset samples start over. */
    pthread_mutex_lock(&w->mu);
    memset(&w->clock, 0, sizeof w->clock);
    pthread_mutex_unlock(&w->mu);
    ZB_WARN("attach stream ended (%s: %s); re-attaching in %d ms", zb_rpc_status_name(code), details,
            backoff_ms);
    zb_sd_notifyf("STATUS=re-attaching to %s (%s)", coordinator, zb_rpc_status_name(code));
    worker_sleep_ms(backoff_ms);
    backoff_ms = backoff_ms * 2 > 2000 ? 2000 : backoff_ms * 2;
  }
}

/* The flags; the defaults are filled by the caller. */
typedef struct worker_flags {
  const char *coordinator, *listen, *id, *advertise;
  int heartbeat_ms, level;
  long long max_message_bytes, gpu, memory_bytes; /* memory_bytes -1: probe */
  zb_tls_files tls;
  const char *path_roots[WORKER_MAX_PATH_ROOTS + 1];
  int n_path_roots;
} worker_flags;

/* A number flag in [lo, hi]; false after saying why. */
static bool flag_number(const char *flag, const char *arg, long long lo, long long hi, long long *out) {
  char *end;
  errno = 0;
  long long v = strtoll(arg, &end, 10);
  if (errno || end == arg || *end || v < lo || v > hi) {
    fprintf(stderr, "zb-worker: %s takes %lld..%lld, not '%s'\n", flag, lo, hi, arg);
    return false;
  }
  *out = v;
  return true;
}

/* Parses argv into *f; returns -1 to go on, else the exit code. */
static int parse_flags(int argc, char **argv, worker_flags *f) {
  static const struct option opts[] = {{"coordinator", required_argument, NULL, 'c'},
                                       {"id", required_argument, NULL, 'i'},
                                       {"listen", required_argument, NULL, 'l'},
                                       {"advertise-address", required_argument, NULL, 'a'},
                                       {"heartbeat-ms", required_argument, NULL, 'b'},
                                       {"max-message-bytes", required_argument, NULL, 'M'},
                                       {"gpu", required_argument, NULL, 'g'},
                                       {"memory-bytes", required_argument, NULL, 'm'},
                                       {"log-level", required_argument, NULL, 'L'},
                                       {"tls-ca", required_argument, NULL, 'A'},
                                       {"tls-cert", required_argument, NULL, 'C'},
                                       {"tls-key", required_argument, NULL, 'K'},
                                       {"path-root", required_argument, NULL, 'P'},
                                       {"version", no_argument, NULL, 'V'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  long long v;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 'c': f->coordinator = optarg; break;
    case 'i': f->id = optarg; break;
    case 'l': f->listen = optarg; break;
    case 'a':
      if (!optarg[0] || strlen(optarg) > 100 || strpbrk(optarg, " \t/")) {
        fprintf(stderr, "zb-worker: --advertise-address takes a host name or IP address, not '%s'\n", optarg);
        return 2;
      }
      f->advertise = optarg;
      break;
    case 'b':
      if (!flag_number("--heartbeat-ms", optarg, 50, 60000, &v))
        return 2;
      f->heartbeat_ms = (int)v;
      break;
    case 'M':
      if (!flag_number("--max-message-bytes", optarg, 4096, 1073741824, &f->max_message_bytes))
        return 2;
      break;
    case 'g':
      if (!flag_number("--gpu", optarg, 0, 1023, &f->gpu))
        return 2;
      break;
    case 'm':
      if (!flag_number("--memory-bytes", optarg, 0, 1LL << 60, &f->memory_bytes))
        return 2;
      break;
    case 'L':
      if ((f->level = zb_log_level_parse(optarg)) < 0) {
        fprintf(stderr, "zb-worker: --log-level takes debug, info, warn or error, not '%s'\n", optarg);
        return 2;
      }
      break;
    case 'A': snprintf(f->tls.ca, sizeof f->tls.ca, "%s", optarg); break;
    case 'C': snprintf(f->tls.cert, sizeof f->tls.cert, "%s", optarg); break;
    case 'K': snprintf(f->tls.key, sizeof f->tls.key, "%s", optarg); break;
    case 'P':
      if (f->n_path_roots == WORKER_MAX_PATH_ROOTS) {
        fprintf(stderr, "zb-worker: --path-root: at most %d\n", WORKER_MAX_PATH_ROOTS);
        return 2;
      }
      f->path_roots[f->n_path_roots++] = optarg;
      break;
    case 'V': {
      char blas[128];
      worker_blas(blas, sizeof blas);
      printf("zb-worker %s\nblas: %s\n", ZB_VERSION, blas);
      return 0;
    }
    case 'h': fputs(usage_text, stdout); return 0;
    default: fputs(usage_text, stderr); return 2;
    }
  }
  if (optind < argc) {
    fprintf(stderr, "zb-worker: unexpected argument '%s'\n%s", argv[optind], usage_text);
    return 2;
  }
  return -1;
}

/* The --path-root directories, resolved; false with the reason in d. */
static bool add_path_roots(worker *w, const worker_flags *f, zb_diag *d) {
  for (int k = 0; k < f->n_path_roots; k++)
    if (worker_add_path_root(w, f->path_roots[k], d) != ZB_OK)
      return false;
  if (!f->n_path_roots)
    ZB_WARN("no --path-root: a cpu or cuda job may read and write any path this worker can");
  return true;
}

int main(int argc, char **argv) {
  worker w;
  memset(&w, 0, sizeof w);
  worker_flags f = {.coordinator = "127.0.0.1:7070",
                    .listen = "127.0.0.1:0",
                    .heartbeat_ms = 1000,
                    .level = ZB_LOG_INFO,
                    .max_message_bytes = 1073741824,
                    .memory_bytes = -1};
  int code = parse_flags(argc, argv, &f);
  if (code >= 0)
    return code;
  const char *coordinator = f.coordinator, *listen = f.listen, *id = f.id;
  int heartbeat_ms = f.heartbeat_ms, level = f.level;
  w.max_receive_bytes = f.max_message_bytes;
  gethostname(w.hostname, sizeof w.hostname - 1);
  worker_blas(w.blas, sizeof w.blas);
  if (id)
    snprintf(w.id, sizeof w.id, "%s", id);
  else
    snprintf(w.id, sizeof w.id, "%.40s-%d", w.hostname, (int)getpid());
  char name[80];
  snprintf(name, sizeof name, "worker %s", w.id);
  zb_log_init(name, (zb_log_level)level);
  w.data_fd = -1;
  if (!open_data_port(&w, listen, f.advertise))
    return 1;
  const char *skew = getenv("ZB_TEST_CLOCK_SKEW_SECONDS"); /* a test knob: a worker on a skewed clock */
  if (skew && skew[0]) {
    w.clock_skew = strtod(skew, NULL);
    ZB_WARN("ZB_TEST_CLOCK_SKEW_SECONDS: this worker's reported times are %+.3f s off its clock",
            w.clock_skew);
  }
  const char *slow = getenv("ZB_TEST_SIM_SLOWDOWN"); /* a test knob: a slow rank */
  if (slow && slow[0]) {
    w.sim_slowdown = strtod(slow, NULL);
    const char *from = getenv("ZB_TEST_SIM_SLOWDOWN_FROM");
    w.sim_slowdown_from = from ? atoi(from) : 0;
    ZB_WARN("ZB_TEST_SIM_SLOWDOWN: sim ops take %.2f times their configured time from iteration %d",
            w.sim_slowdown, w.sim_slowdown_from);
  }
  w.gpu_ordinal = (int)f.gpu;
  worker_gpu_probe(&w, (int)f.gpu);
  w.memory_bytes = f.memory_bytes >= 0 ? f.memory_bytes : worker_host_memory();
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  pthread_mutex_init(&w.mu, NULL);
  pthread_cond_init(&w.cv, NULL);
  zb_tls *tls = NULL;
  zb_diag td;
  if (zb_tls_load(&f.tls, &tls, &td) != ZB_OK || !add_path_roots(&w, &f, &td)) {
    ZB_ERROR("%s", td.msg);
    return 1;
  }
  w.rpc = zb_rpc_client_new_tls(coordinator, w.max_receive_bytes, tls);
  zb_tls_free(tls); /* the channel keeps its own copy */
  pthread_t jt;
  pthread_create(&jt, NULL, job_thread, &w);
  ZB_INFO("zb-worker %s: coordinator %s, data address %s, memory %.1f GiB%s, blas %s", ZB_VERSION,
          coordinator, w.data_address, (double)w.memory_bytes / (1 << 30),
          w.memory_bytes ? "" : " (not advertised)", w.blas);
  zb_sd_notifyf("READY=1\nSTATUS=attaching to %s", coordinator);
  control_loop(&w, coordinator, heartbeat_ms);
  zb_sd_notify("STOPPING=1");
  ZB_INFO("signal %d: stopping", (int)got_signal);
  atomic_store(&w.shutdown, true);
  stop_running_job(&w, NULL);
  pthread_mutex_lock(&w.mu);
  pthread_cond_signal(&w.cv);
  pthread_mutex_unlock(&w.mu);
  pthread_join(jt, NULL);
  zb_rpc_client_free(w.rpc);
  close(w.data_fd);
  zb_roots_close(&w.roots);
  pthread_mutex_destroy(&w.mu);
  pthread_cond_destroy(&w.cv);
  return 0;
}
