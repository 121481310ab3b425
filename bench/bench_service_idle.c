/* bench_service_idle.c — section (f) of zb_bench_service: the
 * coordinator's own CPU while 1,000 idle workers are attached.
 *
 * The workers are simulated here, by one thread on one completion queue,
 * each as a zb-worker behaves on the wire: its own connection (a channel
 * with a private subchannel pool, as a separate process would have, and
 * zb-worker's channel arguments: no bandwidth-delay probes, common/zb_rpc.c),
 * one Attach stream held open and read, and a heartbeat Report (worker_id
 * and sent_seconds) every heartbeat period, 5 s deadline, one at a time.
 * The period is zb-worker's default, 1000 ms, or the longer one the
 * coordinator asks for on a Command (Command.heartbeat_ms), as zb-worker
 * does; the first beat of each comes at a random point of its first
 * period, since real workers start at different times. The figure is the
 * coordinator process's user+system time over a window (10 s; --quick
 * 5 s) after every worker attached and a warm-up, over the window's
 * length. */
#include <grpc/byte_buffer_reader.h>
#include <grpc/grpc.h>
#include <grpc/grpc_security.h>
#include <grpc/support/alloc.h>
#include <grpc/support/time.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bench_service.h"
#include "zb/v1/zb.pb-c.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_methods.h"

enum { IDLE_WORKERS = 1000, IDLE_TIMEOUT_MS = 5000, IDLE_BEAT_MS = 1000 };

typedef enum sim_ev { SIM_START, SIM_STATUS, SIM_RECV, SIM_BEAT } sim_ev;

typedef struct sim_worker sim_worker;
typedef struct sim_tag {
  sim_ev kind;
  sim_worker *w;
} sim_tag;

/* One simulated worker: its connection, its Attach stream, its heartbeat. */
struct sim_worker {
  char id[32];
  grpc_channel *ch;
  grpc_call *attach, *beat;
  sim_tag t_start, t_status, t_recv, t_beat;
  int pending; /* its tags gRPC still holds */
  grpc_metadata_array md_init, md_trail, beat_md_init, beat_md_trail;
  grpc_status_code status, beat_status;
  grpc_slice det, beat_det;
  grpc_byte_buffer *recv, *beat_recv;
  bool attached, ended;
  double next_beat, period;
};

/* What the simulation counts; the window's share is taken by difference. */
typedef struct sim_counts {
  long attached, commands, beats_ok, beats_failed, ended;
} sim_counts;

typedef struct sim {
  grpc_completion_queue *cq;
  sim_worker *ws;
  int n;
  sim_counts counts;
} sim;

static gpr_timespec in_ms(int ms) {
  return gpr_time_add(gpr_now(GPR_CLOCK_MONOTONIC), gpr_time_from_millis(ms, GPR_TIMESPAN));
}

static grpc_byte_buffer *pack(const ProtobufCMessage *m) {
  size_t n = protobuf_c_message_get_packed_size(m);
  grpc_slice s = grpc_slice_malloc(n);
  protobuf_c_message_pack(m, GRPC_SLICE_START_PTR(s));
  grpc_byte_buffer *bb = grpc_raw_byte_buffer_create(&s, 1);
  grpc_slice_unref(s);
  return bb;
}

static void start_batch(sim_worker *w, grpc_call *call, const grpc_op *ops, size_t n, sim_tag *tag) {
  if (grpc_call_start_batch(call, ops, n, tag, NULL) == GRPC_CALL_OK)
    w->pending++;
  else
    fprintf(stderr, "zb_bench_service: %s: start_batch failed\n", w->id);
}

/* The client's first ops of a call: headers, the one request, half-close
 * and the server's headers. */
static size_t open_ops(grpc_op *ops, grpc_byte_buffer *send, grpc_metadata_array *md_init) {
  memset(ops, 0, 4 * sizeof *ops);
  ops[0].op = GRPC_OP_SEND_INITIAL_METADATA;
  ops[1].op = GRPC_OP_SEND_MESSAGE;
  ops[1].data.send_message.send_message = send;
  ops[2].op = GRPC_OP_SEND_CLOSE_FROM_CLIENT;
  ops[3].op = GRPC_OP_RECV_INITIAL_METADATA;
  ops[3].data.recv_initial_metadata.recv_initial_metadata = md_init;
  return 4;
}

static void post_recv(sim_worker *w) {
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_MESSAGE;
  op.data.recv_message.recv_message = &w->recv;
  w->recv = NULL;
  start_batch(w, w->attach, &op, 1, &w->t_recv);
}

static void attach_open(sim *s, sim_worker *w, const char *target) {
  grpc_arg args[2] = {
      /* a connection of its own, not one shared by every channel here */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, .value.integer = 1},
      /* as zb-worker's client (common/zb_rpc.c) */
      {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_HTTP2_BDP_PROBE, .value.integer = 0}};
  grpc_channel_args ch_args = {.num_args = 2, .args = args};
  grpc_channel_credentials *creds = grpc_insecure_credentials_create();
  w->ch = grpc_channel_create(target, creds, &ch_args);
  grpc_channel_credentials_release(creds);
  grpc_slice m = grpc_slice_from_static_string(ZB_METHOD_ATTACH);
  w->attach = grpc_channel_create_call(w->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, m, NULL,
                                       gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
  w->t_start = (sim_tag){SIM_START, w};
  w->t_status = (sim_tag){SIM_STATUS, w};
  w->t_recv = (sim_tag){SIM_RECV, w};
  w->t_beat = (sim_tag){SIM_BEAT, w};
  w->det = w->beat_det = grpc_empty_slice();
  grpc_metadata_array_init(&w->md_init);
  grpc_metadata_array_init(&w->md_trail);
  grpc_op op;
  memset(&op, 0, sizeof op);
  op.op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  op.data.recv_status_on_client.trailing_metadata = &w->md_trail;
  op.data.recv_status_on_client.status = &w->status;
  op.data.recv_status_on_client.status_details = &w->det;
  start_batch(w, w->attach, &op, 1, &w->t_status);
  Zb__V1__AttachRequest req = ZB__V1__ATTACH_REQUEST__INIT;
  req.worker_id = w->id;
  req.data_address = "127.0.0.1:9";
  char *backends[] = {"sim"}, *transports[] = {"tcp"};
  req.n_backends = 1;
  req.backends = backends;
  req.n_transports = 1;
  req.transports = transports;
  grpc_byte_buffer *send = pack(&req.base);
  grpc_op ops[4];
  start_batch(w, w->attach, ops, open_ops(ops, send, &w->md_init), &w->t_start);
  grpc_byte_buffer_destroy(send);
  post_recv(w);
}

/* A heartbeat as zb-worker sends one (worker/report.c): its id and its
 * send time, a 5 s deadline. */
static void beat_start(sim *s, sim_worker *w) {
  grpc_slice m = grpc_slice_from_static_string(ZB_METHOD_REPORT);
  w->beat = grpc_channel_create_call(w->ch, NULL, GRPC_PROPAGATE_DEFAULTS, s->cq, m, NULL, in_ms(5000), NULL);
  grpc_metadata_array_init(&w->beat_md_init);
  grpc_metadata_array_init(&w->beat_md_trail);
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = w->id;
  req.sent_seconds = zb_clock_s();
  grpc_byte_buffer *send = pack(&req.base);
  grpc_op ops[6];
  size_t n = open_ops(ops, send, &w->beat_md_init);
  memset(ops + n, 0, 2 * sizeof *ops);
  ops[n].op = GRPC_OP_RECV_MESSAGE;
  ops[n++].data.recv_message.recv_message = &w->beat_recv;
  ops[n].op = GRPC_OP_RECV_STATUS_ON_CLIENT;
  ops[n].data.recv_status_on_client.trailing_metadata = &w->beat_md_trail;
  ops[n].data.recv_status_on_client.status = &w->beat_status;
  ops[n++].data.recv_status_on_client.status_details = &w->beat_det;
  start_batch(w, w->beat, ops, n, &w->t_beat);
  grpc_byte_buffer_destroy(send);
}

static void beat_done(sim *s, sim_worker *w) {
  if (w->beat_status == GRPC_STATUS_OK)
    s->counts.beats_ok++;
  else
    s->counts.beats_failed++;
  if (w->beat_recv)
    grpc_byte_buffer_destroy(w->beat_recv);
  w->beat_recv = NULL;
  grpc_slice_unref(w->beat_det);
  w->beat_det = grpc_empty_slice();
  grpc_metadata_array_destroy(&w->beat_md_init);
  grpc_metadata_array_destroy(&w->beat_md_trail);
  grpc_call_unref(w->beat);
  w->beat = NULL;
  w->next_beat += w->period;
  double now = zb_clock_s();
  if (w->next_beat < now) /* late (a slow answer): the next one is a period from now, as a worker's is */
    w->next_beat = now + w->period;
}

/* One Command on the stream: the first says the worker is attached; one
 * with heartbeat_ms sets the period, as zb-worker's control loop does. */
static void on_command(sim *s, sim_worker *w) {
  s->counts.commands++;
  grpc_byte_buffer_reader r;
  Zb__V1__Command *cmd = NULL;
  if (grpc_byte_buffer_reader_init(&r, w->recv)) {
    grpc_slice sl = grpc_byte_buffer_reader_readall(&r);
    cmd = zb__v1__command__unpack(NULL, GRPC_SLICE_LENGTH(sl), GRPC_SLICE_START_PTR(sl));
    grpc_slice_unref(sl);
    grpc_byte_buffer_reader_destroy(&r);
  }
  int ms = cmd && cmd->heartbeat_ms > IDLE_BEAT_MS ? cmd->heartbeat_ms : IDLE_BEAT_MS;
  if (cmd)
    zb__v1__command__free_unpacked(cmd, NULL);
  if (!w->attached) {
    w->attached = true;
    s->counts.attached++;
    w->next_beat = zb_clock_s() + ms / 1000.0 * (double)rand() / RAND_MAX;
  }
  w->period = ms / 1000.0;
}

static void on_event(sim *s, const grpc_event *ev) {
  sim_tag *t = ev->tag;
  sim_worker *w = t->w;
  w->pending--;
  switch (t->kind) {
  case SIM_START: return;
  case SIM_STATUS:
    w->ended = true;
    s->counts.ended++;
    return;
  case SIM_RECV:
    if (!w->recv)
      return; /* the stream ended; its status says how */
    on_command(s, w);
    grpc_byte_buffer_destroy(w->recv);
    w->recv = NULL;
    if (!w->ended)
      post_recv(w);
    return;
  case SIM_BEAT: beat_done(s, w); return;
  }
}

/* Runs the simulation until `until` (zb_clock_s), starting heartbeats
 * when they are due; stop_when_attached: return once every worker is. */
static void sim_run(sim *s, double until, bool stop_when_attached) {
  double last_scan = 0;
  for (double now = zb_clock_s(); now < until; now = zb_clock_s()) {
    if (stop_when_attached && s->counts.attached == s->n)
      return;
    grpc_event ev = grpc_completion_queue_next(s->cq, in_ms(2), NULL);
    if (ev.type == GRPC_OP_COMPLETE)
      on_event(s, &ev);
    if (now - last_scan < 0.002)
      continue;
    last_scan = now;
    for (int k = 0; k < s->n; k++) {
      sim_worker *w = &s->ws[k];
      if (w->attached && !w->ended && !w->beat && now >= w->next_beat)
        beat_start(s, w);
    }
  }
}

/* Cancels every call, waits for gRPC to give back every tag, frees all. */
static void sim_free(sim *s) {
  for (int k = 0; k < s->n; k++) {
    grpc_call_cancel(s->ws[k].attach, NULL);
    if (s->ws[k].beat)
      grpc_call_cancel(s->ws[k].beat, NULL);
  }
  for (int k = 0; k < s->n; k++)
    while (s->ws[k].pending > 0) {
      grpc_event ev = grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL);
      if (ev.type == GRPC_OP_COMPLETE)
        on_event(s, &ev);
    }
  for (int k = 0; k < s->n; k++) {
    sim_worker *w = &s->ws[k];
    grpc_call_unref(w->attach);
    grpc_slice_unref(w->det);
    grpc_slice_unref(w->beat_det);
    grpc_metadata_array_destroy(&w->md_init);
    grpc_metadata_array_destroy(&w->md_trail);
    grpc_channel_destroy(w->ch);
  }
  grpc_completion_queue_shutdown(s->cq);
  while (grpc_completion_queue_next(s->cq, gpr_inf_future(GPR_CLOCK_MONOTONIC), NULL).type !=
         GRPC_QUEUE_SHUTDOWN)
    ;
  grpc_completion_queue_destroy(s->cq);
  free(s->ws);
}

/* Each connection costs a descriptor here and one in the coordinator
 * (which raises its own limit): take the hard limit. */
static bool enough_descriptors(int n) {
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
    return false;
  if (rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    getrlimit(RLIMIT_NOFILE, &rl);
  }
  return rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= (rlim_t)n + 256;
}

static void idle_report(cluster *c, const sim *s, const sim_counts *d, double cpu, double window) {
  double lo = 1e9, hi = 0;
  for (int k = 0; k < s->n; k++) {
    lo = s->ws[k].period < lo ? s->ws[k].period : lo;
    hi = s->ws[k].period > hi ? s->ws[k].period : hi;
  }
  printf("heartbeat period at the end: %.0f..%.0f ms\n", 1e3 * lo, 1e3 * hi);
  printf("%ld heartbeat Reports answered in the window (%.0f/s, %ld failed), %ld Commands on the streams "
         "(%.0f/s), %ld streams ended; the coordinator lists %d workers\n",
         d->beats_ok, (double)d->beats_ok / window, d->beats_failed, d->commands,
         (double)d->commands / window, d->ended, attached_workers(c));
  if (cpu >= 0)
    printf("idle CPU at %d attached workers: %.2f%% of a core  (target < 5%%; its process's user+system "
           "time, %.2f s over %.0f s)\n\n",
           IDLE_WORKERS, 100 * cpu / window, cpu, window);
  else
    printf("idle CPU at %d attached workers: not measured (/proc/%d/stat unreadable)\n\n", IDLE_WORKERS,
           (int)c->coord);
}

void bench_idle(bool quick) {
  double window = quick ? 5 : 10, warmup = 3;
  printf("== (f) idle: the coordinator's CPU with %d attached workers (heartbeat timeout %d ms) ==\n",
         IDLE_WORKERS, IDLE_TIMEOUT_MS);
  printf("simulated workers, one connection and one Attach stream each, heartbeat Reports every %d ms\n"
         "or the longer period the coordinator asks for; a %.0f s window after all attached and %.0f s of\n"
         "warm-up\n",
         IDLE_BEAT_MS, window, warmup);
  if (!enough_descriptors(IDLE_WORKERS)) {
    printf("skipped: the open-files limit is below %d (ulimit -n)\n\n", IDLE_WORKERS + 256);
    return;
  }
  cluster c;
  cluster_start_timeout(&c, 0, "f", IDLE_TIMEOUT_MS);
  grpc_init();
  sim s = {.cq = grpc_completion_queue_create_for_next(NULL), .n = IDLE_WORKERS};
  s.ws = zb_calloc((size_t)s.n, sizeof *s.ws);
  srand(1);
  for (int k = 0; k < s.n; k++) {
    snprintf(s.ws[k].id, sizeof s.ws[k].id, "idle-w%d", k);
    attach_open(&s, &s.ws[k], c.addr);
  }
  sim_run(&s, zb_clock_s() + 120, true);
  if (s.counts.attached < s.n) {
    printf("only %ld of %d workers attached in 120 s\n\n", s.counts.attached, s.n);
  } else {
    sim_run(&s, zb_clock_s() + warmup, false);
    sim_counts before = s.counts;
    double cpu0 = proc_cpu_seconds(c.coord), t0 = zb_clock_s();
    sim_run(&s, t0 + window, false);
    double cpu1 = proc_cpu_seconds(c.coord), took = zb_clock_s() - t0;
    sim_counts d = {.commands = s.counts.commands - before.commands,
                    .beats_ok = s.counts.beats_ok - before.beats_ok,
                    .beats_failed = s.counts.beats_failed - before.beats_failed,
                    .ended = s.counts.ended - before.ended};
    idle_report(&c, &s, &d, cpu0 >= 0 && cpu1 >= 0 ? cpu1 - cpu0 : -1, took);
  }
  sim_free(&s);
  grpc_shutdown();
  cluster_stop(&c);
}
