/* bench_service.c — zb_bench_service: what the service costs, on real
 * processes over loopback (a zb-coordinator and sim-backend zb-workers
 * started here, logs in a temp directory). Its figures:
 *   (a) runtime overhead: measured iteration time over the simulated
 *       makespan of the same plan, for 1f1b, zb-h1 and zb-v at p=4, m=16
 *       and p=16, m=64 with 10 ms ops (one rank's share);
 *   (b) the coordinator's ingest rate of Report calls from 64 concurrent
 *       reporters (attached workers sending heartbeat Reports), and its
 *       CPU time per Report;
 *   (c) SubmitJob to the first op executed, p50/p99 over many small jobs;
 *   (d) what per-op timelines cost: the p=16, m=64 job of (a) with tracing
 *       off, every 10th iteration (the default) and every iteration, runs
 *       interleaved, as ratios of the median iteration time to off's;
 *   (e) adaptive re-planning under drift: a zb-auto job (p=4, m=8, 20 ms
 *       ops) whose rank 1 slows by 30% at iteration 20 (the workers' test
 *       knobs), with adaptation on and off: median iteration time of the
 *       last third, adaptive over static;
 *   (f) the coordinator's CPU with 1,000 attached idle workers
 *       (bench_service_idle.c).
 * (b) and (f) read the coordinator's process CPU time (bench_service.h).
 * It prints; it never fails on a slow figure (targets are printed beside).
 * Usage: zb_bench_service [--quick] [a] [b] [c] [d] [e] [f]   (--quick: fewer iterations and
 * jobs; letters pick sections, default all)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "bench_service.h"
#include "zb/v1/zb.pb-c.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_job_plan.h"
#include "zb_methods.h"
#include "zb_rpc.h"
#include "zb_wire.h"

extern char **environ;

#ifndef ZB_COORDINATOR_BIN
#error "ZB_COORDINATOR_BIN must name the zb-coordinator binary"
#endif

void sleep_s(double s) {
  struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
  nanosleep(&ts, NULL);
}

/* ---- processes ---- */

char bench_dir[256];

/* argv[0] with the environment plus extra (NULL-terminated; may be NULL). */
static pid_t spawn_env(const char *log_name, char *const argv[], char *const extra[]) {
  char log[512];
  snprintf(log, sizeof log, "%s/%s.log", bench_dir, log_name);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  size_t n_env = 0, n_extra = 0;
  while (environ[n_env])
    n_env++;
  while (extra && extra[n_extra])
    n_extra++;
  char **envp = zb_malloc(sizeof *envp * (n_env + n_extra + 1));
  memcpy(envp, environ, sizeof *envp * n_env);
  if (n_extra)
    memcpy(envp + n_env, extra, sizeof *envp * n_extra);
  envp[n_env + n_extra] = NULL;
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, envp);
  free(envp);
  posix_spawn_file_actions_destroy(&fa);
  if (rc != 0) {
    fprintf(stderr, "zb_bench_service: cannot start %s: %s\n", argv[0], strerror(rc));
    exit(1);
  }
  return pid;
}

static pid_t spawn(const char *log_name, char *const argv[]) {
  return spawn_env(log_name, argv, NULL);
}

static void stop(pid_t pid) {
  if (pid <= 0)
    return;
  kill(pid, SIGTERM);
  for (int k = 0; k < 100; k++) {
    if (waitpid(pid, NULL, WNOHANG) == pid)
      return;
    sleep_s(0.02);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

int attached_workers(cluster *c) {
  Zb__V1__ListWorkersRequest req = ZB__V1__LIST_WORKERS_REQUEST__INIT;
  ProtobufCMessage *resp = NULL;
  char det[256];
  if (zb_rpc_unary(c->rpc, ZB_METHOD_LIST_WORKERS, &req.base, &zb__v1__list_workers_response__descriptor,
                   &resp, 2000, true, det, sizeof det) != GRPC_STATUS_OK)
    return -1;
  int n = (int)((Zb__V1__ListWorkersResponse *)resp)->n_workers;
  protobuf_c_message_free_unpacked(resp, NULL);
  return n;
}

double proc_cpu_seconds(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE *f = fopen(path, "r");
  if (!f)
    return -1;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  /* the command (field 2) may hold spaces: fields count from its ')' */
  const char *p = strrchr(buf, ')');
  unsigned long long utime, stime;
  if (!p || sscanf(p + 1, " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
    return -1;
  return (double)(utime + stime) / (double)sysconf(_SC_CLK_TCK);
}

long long proc_ctx_switches(pid_t pid) {
  char path[64];
  snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
  DIR *d = opendir(path);
  if (!d)
    return -1;
  long long total = 0;
  for (struct dirent *e; (e = readdir(d));) {
    if (e->d_name[0] == '.')
      continue;
    char status[512], line[256];
    snprintf(status, sizeof status, "%s/%s/status", path, e->d_name);
    FILE *f = fopen(status, "r");
    long long n;
    while (f && fgets(line, sizeof line, f))
      if ((sscanf(line, "voluntary_ctxt_switches: %lld", &n) == 1 ||
           sscanf(line, "nonvoluntary_ctxt_switches: %lld", &n) == 1))
        total += n;
    if (f)
      fclose(f);
  }
  closedir(d);
  return total;
}

/* The coordinator and n_workers workers; worker k gets env[k] (a
 * NULL-terminated list, or NULL) when env is given, and then workers start
 * one at a time, each attached before the next (so worker k runs rank k
 * of a job on all of them). */
static void cluster_start_all(cluster *c, int n_workers, const char *tag, char *const *const *env,
                              int heartbeat_timeout_ms);

static void cluster_start_env(cluster *c, int n_workers, const char *tag, char *const *const *env) {
  cluster_start_all(c, n_workers, tag, env, 10000);
}

static void cluster_start(cluster *c, int n_workers, const char *tag) {
  cluster_start_all(c, n_workers, tag, NULL, 10000);
}

void cluster_start_timeout(cluster *c, int n_workers, const char *tag, int heartbeat_timeout_ms) {
  cluster_start_all(c, n_workers, tag, NULL, heartbeat_timeout_ms);
}

static void cluster_start_all(cluster *c, int n_workers, const char *tag, char *const *const *env,
                              int heartbeat_timeout_ms) {
  memset(c, 0, sizeof *c);
  char data[300], ports[300], timeout[16];
  snprintf(timeout, sizeof timeout, "%d", heartbeat_timeout_ms);
  snprintf(data, sizeof data, "%s/data-%s", bench_dir, tag);
  snprintf(ports, sizeof ports, "%s/ports-%s", bench_dir, tag);
  unlink(ports);
  char *cargv[] = {ZB_COORDINATOR_BIN,
                   "--listen",
                   "127.0.0.1:0",
                   "--metrics-listen",
                   "127.0.0.1:0",
                   "--data-dir",
                   data,
                   "--port-file",
                   ports,
                   "--log-level",
                   "warn",
                   "--heartbeat-timeout-ms",
                   timeout,
                   NULL};
  c->coord = spawn("coordinator", cargv);
  int port = 0;
  for (int k = 0; k < 500 && !port; k++) {
    FILE *f = fopen(ports, "r");
    if (f) {
      if (fscanf(f, "%d", &port) != 1)
        port = 0;
      fclose(f);
    }
    if (!port)
      sleep_s(0.01);
  }
  if (!port) {
    fprintf(stderr, "zb_bench_service: the coordinator did not start (see %s/coordinator.log)\n", bench_dir);
    exit(1);
  }
  snprintf(c->addr, sizeof c->addr, "127.0.0.1:%d", port);
  c->rpc = zb_rpc_client_new(c->addr, 64 << 20);
  for (int k = 0; k < n_workers; k++) {
    char id[32];
    snprintf(id, sizeof id, "%s-w%d", tag, k);
    char *wargv[] = {ZB_WORKER_BIN, "--coordinator", c->addr, "--id", id, "--log-level", "warn", NULL};
    c->workers[c->n_workers++] = spawn_env("workers", wargv, env ? env[k] : NULL);
    for (int t = 0; env && t < 1000 && attached_workers(c) < k + 1; t++)
      sleep_s(0.01);
  }
  /* wait until all are attached */
  for (int k = 0; k < 1000; k++) {
    if (attached_workers(c) >= n_workers)
      return;
    sleep_s(0.02);
  }
  fprintf(stderr, "zb_bench_service: workers did not attach (see %s/workers.log)\n", bench_dir);
  exit(1);
}

void cluster_stop(cluster *c) {
  for (int k = 0; k < c->n_workers; k++)
    stop(c->workers[k]);
  zb_rpc_client_free(c->rpc);
  stop(c->coord);
}

/* ---- jobs ---- */

static zb_job_spec bench_spec(const char *schedule, int p, int m, double op_s, int iterations) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  snprintf(s.name, sizeof s.name, "bench");
  s.ranks = p;
  s.microbatches = m;
  snprintf(s.schedule, sizeof s.schedule, "%s", schedule);
  s.costs.t_f = s.costs.t_b = s.costs.t_w = op_s;
  s.costs.t_comm = 0;
  s.iterations = iterations;
  s.bytes_per_activation = 65536;
  return s;
}

/* Submits spec; returns the job id (static buffer) or NULL. */
static const char *submit(cluster *c, const zb_job_spec *spec) {
  static char id[64];
  Zb__V1__SubmitJobRequest req = ZB__V1__SUBMIT_JOB_REQUEST__INIT;
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(spec, &pb);
  req.spec = &pb;
  ProtobufCMessage *resp = NULL;
  char det[512];
  grpc_status_code st =
      zb_rpc_unary(c->rpc, ZB_METHOD_SUBMIT_JOB, &req.base, &zb__v1__submit_job_response__descriptor, &resp,
                   10000, false, det, sizeof det);
  zb_wire_spec_pb_clear(&pb);
  if (st != GRPC_STATUS_OK) {
    fprintf(stderr, "zb_bench_service: submit: %s: %s\n", zb_rpc_status_name(st), det);
    return NULL;
  }
  snprintf(id, sizeof id, "%s", ((Zb__V1__SubmitJobResponse *)resp)->job_id);
  protobuf_c_message_free_unpacked(resp, NULL);
  return id;
}

/* Streams the job's events to its end; fills walls[i] with iteration i's
 * wall time and *first_op with rank 0's first iteration start. Returns
 * the final state. */
static int watch(cluster *c, const char *job_id, double *walls, int max_walls, double *first_op) {
  Zb__V1__WatchJobRequest req = ZB__V1__WATCH_JOB_REQUEST__INIT;
  req.job_id = (char *)job_id;
  zb_rpc_stream *st = zb_rpc_stream_open(c->rpc, ZB_METHOD_WATCH_JOB, &req.base, 600000, false);
  int state = 0, got;
  ProtobufCMessage *msg;
  while ((got = zb_rpc_stream_read(st, &zb__v1__job_event__descriptor, &msg, -1)) != 0) {
    if (got < 0)
      continue;
    Zb__V1__JobEvent *ev = (void *)msg;
    state = ev->state;
    const Zb__V1__IterationMetrics *it = ev->iteration;
    if (it && it->iteration < max_walls)
      walls[it->iteration] = it->wall_seconds;
    if (it && it->iteration == 0 && first_op) {
      double first = INFINITY;
      for (size_t r = 0; r < it->n_ranks; r++)
        if (it->ranks[r]->start_monotonic_seconds < first)
          first = it->ranks[r]->start_monotonic_seconds;
      *first_op = first;
    }
    protobuf_c_message_free_unpacked(msg, NULL);
  }
  char det[256];
  zb_rpc_stream_status(st, det, sizeof det);
  zb_rpc_stream_free(st);
  return state;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- (a) overhead ---- */

static void bench_overhead(bool quick) {
  printf("== (a) runtime overhead: measured iteration time / simulated makespan ==\n");
  printf(
      "sim backend, 10 ms ops (one rank's share: T_F=T_B=T_W=10 ms, T_comm=0), 64 KiB per activation over\n"
      "TCP on loopback; median of the iterations after the first (which includes connecting).\n\n");
  printf("%-8s %4s %4s %12s %12s %8s %8s\n", "schedule", "p", "m", "sim (s)", "measured (s)", "ratio",
         "target");
  static const char *const schedules[] = {"1f1b", "zb-h1", "zb-v"};
  static const int shapes[][2] = {{4, 16}, {16, 64}};
  for (size_t si = 0; si < 2; si++) {
    int p = shapes[si][0], m = shapes[si][1];
    int iterations = quick ? 3 : 5;
    cluster c;
    char tag[16];
    snprintf(tag, sizeof tag, "a%d", p);
    cluster_start(&c, p, tag);
    for (size_t k = 0; k < 3; k++) {
      zb_job_spec spec = bench_spec(schedules[k], p, m, 0.010, iterations);
      zb_planner_result plan;
      zb_diag d;
      if (zb_job_plan(&spec, ZB_OBJ_MAKESPAN, &plan, &d) != ZB_OK) {
        printf("%-8s %4d %4d  plan failed: %s\n", schedules[k], p, m, d.msg);
        zb_planner_result_free(&plan);
        continue;
      }
      double sim = plan.sim->makespan;
      zb_planner_result_free(&plan);
      const char *id = submit(&c, &spec);
      double walls[16] = {0};
      int state = id ? watch(&c, id, walls, 16, NULL) : 0;
      if (state != ZB__V1__JOB_STATE__JOB_STATE_SUCCEEDED) {
        printf("%-8s %4d %4d  job did not succeed (state %d)\n", schedules[k], p, m, state);
        continue;
      }
      double med = median(walls + 1, iterations - 1);
      printf("%-8s %4d %4d %12.4f %12.4f %8.4f %8s\n", schedules[k], p, m, sim, med, med / sim,
             p == 4 ? "<= 1.05" : "<= 1.10");
      fflush(stdout);
    }
    cluster_stop(&c);
  }
  printf("\n");
}

/* ---- (b) Report ingest ---- */

typedef struct reporter {
  const char *addr;
  int index;
  double seconds;
  bool attach; /* hold an Attach stream open, as a worker does (not on the floor server) */
  long done, failed;
  atomic_int *ready;
  atomic_bool *go; /* set once every reporter is attached: the measured part starts */
} reporter;

static void *reporter_main(void *arg) {
  reporter *r = arg;
  zb_rpc_client *c = zb_rpc_client_new(r->addr, 1 << 20);
  char id[32];
  snprintf(id, sizeof id, "bench-r%d", r->index);
  zb_rpc_stream *st = NULL;
  if (r->attach) {
    Zb__V1__AttachRequest att = ZB__V1__ATTACH_REQUEST__INIT;
    att.worker_id = id;
    att.data_address = "127.0.0.1:9";
    st = zb_rpc_stream_open(c, ZB_METHOD_ATTACH, &att.base, 0, true);
    ProtobufCMessage *msg;
    if (zb_rpc_stream_read(st, &zb__v1__command__descriptor, &msg, 10000) == 1) /* the first ping: attached */
      protobuf_c_message_free_unpacked(msg, NULL);
  }
  atomic_fetch_add(r->ready, 1);
  while (!atomic_load(r->go))
    sleep_s(0.001);
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = id;
  double end = zb_clock_s() + r->seconds;
  char det[128];
  while (zb_clock_s() < end) {
    ProtobufCMessage *resp = NULL;
    if (zb_rpc_unary(c, ZB_METHOD_REPORT, &req.base, &zb__v1__report_response__descriptor, &resp, 5000, false,
                     det, sizeof det) == GRPC_STATUS_OK) {
      r->done++;
      protobuf_c_message_free_unpacked(resp, NULL);
    } else {
      r->failed++;
    }
  }
  if (st)
    zb_rpc_stream_free(st);
  zb_rpc_client_free(c);
  return NULL;
}

/* One measured run of N reporters against the server at addr (process
 * pid): the server's CPU per Report, its share of a core and its context
 * switches per Report. */
typedef struct ingest_run {
  long done, failed;
  double elapsed, cpu, us_per_report, ctx_per_report;
} ingest_run;

static ingest_run ingest(const char *addr, pid_t pid, bool attach, double seconds) {
  enum { N = 64 };
  reporter rs[N];
  pthread_t th[N];
  atomic_int ready = 0;
  atomic_bool go = false;
  for (int k = 0; k < N; k++) {
    rs[k] = (reporter){
        .addr = addr, .index = k, .seconds = seconds, .attach = attach, .ready = &ready, .go = &go};
    pthread_create(&th[k], NULL, reporter_main, &rs[k]);
  }
  for (int t = 0; t < 3000 && atomic_load(&ready) < N; t++)
    sleep_s(0.01);
  double cpu0 = proc_cpu_seconds(pid), t0 = zb_clock_s();
  long long ctx0 = proc_ctx_switches(pid);
  atomic_store(&go, true);
  for (int k = 0; k < N; k++)
    pthread_join(th[k], NULL);
  ingest_run out = {.elapsed = zb_clock_s() - t0, .us_per_report = -1, .ctx_per_report = -1};
  double cpu1 = proc_cpu_seconds(pid);
  long long ctx1 = proc_ctx_switches(pid);
  for (int k = 0; k < N; k++) {
    out.done += rs[k].done;
    out.failed += rs[k].failed;
  }
  if (cpu0 >= 0 && cpu1 >= 0 && out.done > 0) {
    out.cpu = cpu1 - cpu0;
    out.us_per_report = 1e6 * out.cpu / (double)out.done;
  }
  if (ctx0 >= 0 && ctx1 >= 0 && out.done > 0)
    out.ctx_per_report = (double)(ctx1 - ctx0) / (double)out.done;
  return out;
}

/* The coordinator's CPU per Report: its process's user and system time
 * over the measured part (every reporter attached; attaching is not
 * counted) divided by the Reports it answered then; beside it the same
 * load on the floor server (bench_service_floor.c), run just after. */
static void bench_ingest(bool quick) {
  printf("== (b) Report ingest: 64 concurrent reporters (attached, heartbeat Reports), unary calls ==\n");
  double seconds = quick ? 2 : 5;
  cluster c;
  cluster_start(&c, 0, "b");
  ingest_run zb = ingest(c.addr, c.coord, true, seconds);
  cluster_stop(&c);
  char floor_addr[64];
  pid_t floor_pid = floor_server_start(floor_addr, sizeof floor_addr);
  ingest_run fl = {.us_per_report = -1};
  if (floor_pid > 0) {
    fl = ingest(floor_addr, floor_pid, false, seconds);
    kill(floor_pid, SIGKILL);
    waitpid(floor_pid, NULL, 0);
  }
  printf("%ld Reports in %.2f s (%ld failed): %.0f Reports/s  (target >= 10000)\n", zb.done, zb.elapsed,
         zb.failed, (double)zb.done / zb.elapsed);
  if (zb.us_per_report >= 0)
    printf("coordinator CPU per Report: %.1f us  (target <= 10 us; its process's user+system time, %.2f s, "
           "over the Reports it answered; %.0f%% of a core)\n",
           zb.us_per_report, zb.cpu, 100 * zb.cpu / zb.elapsed);
  else
    printf("coordinator CPU per Report: not measured (/proc/%d/stat unreadable)\n", (int)c.coord);
  if (zb.ctx_per_report >= 0)
    printf("coordinator context switches per Report: %.2f  (all its threads)\n", zb.ctx_per_report);
  if (fl.us_per_report > 0 && zb.us_per_report > 0)
    printf(
        "floor: a bare gRPC C-core server (one thread, empty answers) %.1f us per Report at %.0f Reports/s; "
        "coordinator / floor: %.2f\n",
        fl.us_per_report, (double)fl.done / fl.elapsed, zb.us_per_report / fl.us_per_report);
  else
    printf("floor: not measured (the floor server did not start or answer)\n");
  printf("\n");
}

/* ---- (c) submit to first op ---- */

static void bench_latency(bool quick) {
  int jobs = quick ? 30 : 100;
  printf("== (c) SubmitJob to the first op executed: %d jobs, p=4, m=4, 1 ms ops, 1 iteration ==\n", jobs);
  printf("from just before SubmitJob to the earliest rank's first-iteration start (CLOCK_MONOTONIC; one "
         "host)\n");
  cluster c;
  cluster_start(&c, 4, "c");
  double *lat = zb_malloc(sizeof(double) * (size_t)jobs);
  int n = 0;
  for (int k = 0; k < jobs; k++) {
    zb_job_spec spec = bench_spec("1f1b", 4, 4, 0.001, 1);
    double t0 = zb_clock_s();
    const char *id = submit(&c, &spec);
    double first = NAN, walls[1];
    if (id && watch(&c, id, walls, 1, &first) == ZB__V1__JOB_STATE__JOB_STATE_SUCCEEDED && isfinite(first))
      lat[n++] = first - t0;
  }
  qsort(lat, (size_t)n, sizeof *lat, cmp_double);
  if (n > 0) {
    int i99 = (int)ceil(0.99 * n) - 1;
    printf("%d jobs: p50 %.2f ms, p99 %.2f ms, max %.2f ms  (target p99 < 50 ms)\n\n", n, 1e3 * lat[n / 2],
           1e3 * lat[i99 < 0 ? 0 : i99], 1e3 * lat[n - 1]);
  } else {
    printf("no job succeeded\n\n");
  }
  free(lat);
  cluster_stop(&c);
}

/* ---- (d) tracing overhead ---- */

/* One job's iterations after the first into walls; their count. */
static int run_traced(cluster *c, int trace_every, int iterations, double *walls) {
  zb_job_spec spec = bench_spec("zb-h1", 16, 64, 0.010, iterations);
  spec.trace_every = trace_every;
  const char *id = submit(c, &spec);
  double w[32] = {0};
  if (!id || watch(c, id, w, 32, NULL) != ZB__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
    return 0;
  for (int i = 1; i < iterations; i++)
    walls[i - 1] = w[i];
  return iterations - 1;
}

static void bench_tracing(bool quick) {
  printf("== (d) per-op timelines: iteration time with tracing on / off ==\n");
  printf("zb-h1, p=16, m=64, sim backend, 10 ms ops; jobs with trace_every off, 10 and 1 run in turn,\n"
         "%s rounds; median iteration time (the first of each job excluded).\n\n",
         quick ? "2" : "3");
  static const int every[] = {0, 10, 1};
  static const char *const names[] = {"off", "every 10th (default)", "every iteration"};
  int iterations = quick ? 6 : 11, rounds = quick ? 2 : 3;
  double walls[3][96];
  int n[3] = {0, 0, 0};
  cluster c;
  cluster_start(&c, 16, "d");
  for (int r = 0; r < rounds; r++)
    for (int k = 0; k < 3; k++)
      n[k] += run_traced(&c, every[k], iterations, walls[k] + n[k]);
  cluster_stop(&c);
  if (!n[0]) {
    printf("the untraced jobs failed\n\n");
    return;
  }
  double off = median(walls[0], n[0]);
  printf("%-22s %12s %8s %8s\n", "tracing", "median (s)", "ratio", "target");
  for (int k = 0; k < 3; k++) {
    if (!n[k]) {
      printf("%-22s  jobs failed\n", names[k]);
      continue;
    }
    double med = k ? median(walls[k], n[k]) : off;
    printf("%-22s %12.4f %8.4f %8s\n", names[k], med, med / off, k ? "<= 1.02" : "");
  }
  printf("\n");
}

/* ---- (e) adaptive re-planning under drift ---- */

static double drift_job(cluster *c, bool adaptive, int iterations) {
  zb_job_spec spec = bench_spec("zb-auto", 4, 8, 0.020, iterations);
  spec.chunks = 1; /* zb-auto's own re-planning on loop placement (chunks 0 would search every placement) */
  spec.trace_every = 1;
  spec.adaptive.enabled = adaptive;
  const char *id = submit(c, &spec);
  double w[64] = {0};
  if (!id || watch(c, id, w, 64, NULL) != ZB__V1__JOB_STATE__JOB_STATE_SUCCEEDED)
    return 0;
  int from = iterations - iterations / 3;
  return median(w + from, iterations - from);
}

static void bench_drift(bool quick) {
  int iterations = quick ? 30 : 45, at = quick ? 10 : 20;
  printf("== (e) adaptive re-planning: one stage slows by 30%% at iteration %d ==\n", at);
  printf(
      "zb-auto, p=4, m=8, sim backend, 20 ms ops, trace_every 1; rank 1's worker runs its ops 1.3x slower\n"
      "from iteration %d on; %d iterations; median iteration time of the last third.\n\n",
      at, iterations);
  char from[32];
  snprintf(from, sizeof from, "ZB_TEST_SIM_SLOWDOWN_FROM=%d", at);
  char *slow[] = {"ZB_TEST_SIM_SLOWDOWN=1.3", from, NULL};
  char *const *env[4] = {NULL, slow, NULL, NULL};
  cluster c;
  cluster_start_env(&c, 4, "e", env);
  double stat = drift_job(&c, false, iterations), adap = drift_job(&c, true, iterations);
  cluster_stop(&c);
  if (stat <= 0 || adap <= 0) {
    printf("a job failed\n\n");
    return;
  }
  printf("%-10s %12s\n%-10s %12.4f\n%-10s %12.4f\nadaptive / static: %.4f  (target < 1)\n\n", "job",
         "median (s)", "static", stat, "adaptive", adap, adap / stat);
}

int main(int argc, char **argv) {
  bool quick = false, want[6] = {false, false, false, false, false, false}, any = false;
  if (argc == 3 && strcmp(argv[1], "--floor-server") == 0)
    return floor_server_main(argv[2]);
  for (int k = 1; k < argc; k++) {
    if (strcmp(argv[k], "--quick") == 0)
      quick = true;
    else if (strlen(argv[k]) == 1 && argv[k][0] >= 'a' && argv[k][0] <= 'f')
      want[argv[k][0] - 'a'] = any = true;
    else {
      fprintf(stderr,
              "usage: zb_bench_service [--quick] [a] [b] [c] [d] [e] [f]   (sections; default all)\n");
      return 2;
    }
  }
  if (!any)
    want[0] = want[1] = want[2] = want[3] = want[4] = want[5] = true;
  signal(SIGPIPE, SIG_IGN);
  snprintf(bench_dir, sizeof bench_dir, "/tmp/zb-bench-XXXXXX");
  if (!mkdtemp(bench_dir)) {
    perror("mkdtemp");
    return 1;
  }
  printf("zb_bench_service: zb-coordinator and zb-workers on loopback; logs in %s\n", bench_dir);
  printf("build type: %s (the bench and the daemons it starts come from one build tree)\n\n", ZB_BUILD_TYPE);
  if (want[0])
    bench_overhead(quick);
  if (want[1])
    bench_ingest(quick);
  if (want[2])
    bench_latency(quick);
  if (want[3])
    bench_tracing(quick);
  if (want[4])
    bench_drift(quick);
  if (want[5])
    bench_idle(quick);
  return 0;
}
