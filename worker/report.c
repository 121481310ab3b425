/* report.c — zb-worker's Reports: per-iteration figures of a rank, its
 * end (done or failed), and heartbeats. See worker.h. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "worker.h"
#include "zb_alloc.h"
#include "zb_log.h"
#include "zb_methods.h"
#include "zb_timeline_pb.h"

/* A round trip of a report whose answer carries the coordinator's times:
 * one sample of its clock against ours (docs/wire.md, Timelines). */
static void clock_sample(worker *w, double t1, const Zb__V1__ReportResponse *resp) {
  if (resp->received_seconds <= 0)
    return; /* an older coordinator */
  double t4 = worker_clock(w);
  pthread_mutex_lock(&w->mu);
  zb_clock_offset_add(&w->clock, t1, resp->received_seconds, resp->replied_seconds, t4);
  pthread_mutex_unlock(&w->mu);
}

/* One Report call; *status: its gRPC status. */
static report_result report_once(worker *w, Zb__V1__ReportRequest *req, char *why, size_t why_len,
                                 grpc_status_code *status) {
  ProtobufCMessage *resp = NULL;
  char details[256];
  double t1 = worker_clock(w);
  req->sent_seconds = t1;
  grpc_status_code st =
      zb_rpc_unary(w->rpc, ZB_METHOD_REPORT, &req->base, &zb__v1__report_response__descriptor, &resp, 5000,
                   false, details, sizeof details);
  *status = st;
  if (st != GRPC_STATUS_OK) {
    if (req->job_id && req->job_id[0])
      ZB_WARN("report for job %s rank %d: %s: %s", req->job_id, req->rank, zb_rpc_status_name(st), details);
    if (why)
      snprintf(why, why_len, "%s: %s", zb_rpc_status_name(st), details);
    return REPORT_FAILED;
  }
  clock_sample(w, t1, (const Zb__V1__ReportResponse *)resp);
  bool stop = ((Zb__V1__ReportResponse *)resp)->stop;
  protobuf_c_message_free_unpacked(resp, NULL);
  return stop ? REPORT_STOP : REPORT_OK;
}

report_result worker_report(worker *w, Zb__V1__ReportRequest *req, char *why, size_t why_len) {
  grpc_status_code st;
  return report_once(w, req, why, why_len, &st);
}

/* Keeps req (packed) among the running job's last reports. */
static void keep_sent(worker *w, const Zb__V1__ReportRequest *req) {
  size_t len = protobuf_c_message_get_packed_size(&req->base);
  uint8_t *buf = zb_malloc(len ? len : 1);
  protobuf_c_message_pack(&req->base, buf);
  pthread_mutex_lock(&w->mu);
  if (w->n_sent == WORKER_SENT_REPORTS) {
    free(w->sent[0]);
    memmove(w->sent, w->sent + 1, sizeof w->sent[0] * (WORKER_SENT_REPORTS - 1));
    memmove(w->sent_len, w->sent_len + 1, sizeof w->sent_len[0] * (WORKER_SENT_REPORTS - 1));
    w->n_sent--;
  }
  w->sent[w->n_sent] = buf;
  w->sent_len[w->n_sent++] = len;
  pthread_mutex_unlock(&w->mu);
}

void worker_report_forget(worker *w) {
  pthread_mutex_lock(&w->mu);
  for (int k = 0; k < w->n_sent; k++)
    free(w->sent[k]);
  w->n_sent = 0;
  pthread_mutex_unlock(&w->mu);
}

void worker_report_resend(worker *w) {
  pthread_mutex_lock(&w->mu);
  int n = w->n_sent;
  uint8_t *copies[WORKER_SENT_REPORTS];
  size_t lens[WORKER_SENT_REPORTS];
  for (int k = 0; k < n; k++) {
    copies[k] = zb_malloc(w->sent_len[k] ? w->sent_len[k] : 1);
    memcpy(copies[k], w->sent[k], w->sent_len[k]);
    lens[k] = w->sent_len[k];
  }
  pthread_mutex_unlock(&w->mu);
  for (int k = 0; k < n; k++) {
    Zb__V1__ReportRequest *req = zb__v1__report_request__unpack(NULL, lens[k], copies[k]);
    if (req)
      worker_report(w, req, NULL, 0);
    if (req)
      zb__v1__report_request__free_unpacked(req, NULL);
    free(copies[k]);
  }
  if (n)
    ZB_INFO("sent the running job's last %d report(s) again to the coordinator", n);
}

report_result worker_report_retry(worker *w, Zb__V1__ReportRequest *req, const atomic_bool *stop, char *why,
                                  size_t why_len) {
  double t0 = zb_clock_s();
  int backoff_ms = 100;
  for (;;) {
    grpc_status_code st;
    report_result rr = report_once(w, req, why, why_len, &st);
    /* CANCELLED too: the worker never cancels a report itself, so it is a
     * draining coordinator cancelling the calls it holds. */
    bool transient =
        st == GRPC_STATUS_UNAVAILABLE || st == GRPC_STATUS_DEADLINE_EXCEEDED || st == GRPC_STATUS_CANCELLED;
    if (rr != REPORT_FAILED || !transient || (stop && atomic_load(stop)) ||
        zb_clock_s() - t0 > WORKER_REPORT_RIDE_OUT_S)
      return rr;
    struct timespec ts = {0, (long)backoff_ms * 1000000L};
    nanosleep(&ts, NULL);
    backoff_ms = backoff_ms < 1000 ? 2 * backoff_ms : 1000;
  }
}

bool report_iteration(job_run *jr, const zb_rank_iteration *it, bool has_loss, double loss,
                      const zb_step_result *step) {
  worker *w = jr->w;
  Zb__V1__RankIteration ri = ZB__V1__RANK_ITERATION__INIT;
  ri.rank = zb_assignment_global(jr->a); /* the coordinator's ranks are global */
  ri.wall_seconds = it->wall_seconds;
  ri.busy_f_seconds = it->busy_f_seconds;
  ri.busy_b_seconds = it->busy_b_seconds;
  ri.busy_w_seconds = it->busy_w_seconds;
  ri.idle_seconds = it->idle_seconds;
  ri.bytes_sent = it->bytes_sent;
  ri.peak_memory = it->peak_memory;
  ri.peak_memory_bytes = it->peak_memory_bytes;
  ri.bubble_ratio = it->bubble_ratio;
  ri.start_monotonic_seconds = it->start_seconds + w->clock_skew;
  ri.comm_wait_seconds = it->comm_seconds;
  pthread_mutex_lock(&w->mu);
  zb_clock_offset_get(&w->clock, &ri.clock_offset_seconds, &ri.clock_rtt_seconds);
  pthread_mutex_unlock(&w->mu);
  if (it->timeline)
    ri.timeline = zb_timeline_encode(it->timeline, it->n_timeline);
  ri.cpu_wait_seconds = it->cpu_wait_seconds;
  ri.comm_groups = it->comm_groups;
  ri.comm_actions = it->comm_actions;
  ri.device_peak_bytes = it->device_peak > 0 ? it->device_peak : 0; /* 0: no GPU */
  ri.device_used_bytes = it->device_used > 0 ? it->device_used : 0;
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
  req.job_id = (char *)jr->a->job_id;
  req.rank = zb_assignment_global(jr->a);
  req.iteration = it->iteration;
  req.plan_version = jr->plan_version;
  req.metrics = &ri;
  char why[300];
  report_result rr = worker_report_retry(w, &req, w->job_stop, why, sizeof why);
  if (rr == REPORT_OK)
    keep_sent(w, &req);
  zb_timeline_pb_free(ri.timeline);
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
  zb_assignment *u = w->update;
  bool switch_now = u && u->first_iteration == it->iteration + 1;
  if (u && !switch_now && u->first_iteration <= it->iteration)
    ZB_ERROR("job %s: plan update for iteration %d arrived after it started", jr->a->job_id,
             u->first_iteration);
  pthread_mutex_unlock(&w->mu);
  return !switch_now;
}

void worker_report_end(worker *w, const char *job_id, int rank, const char *error, bool from_peer) {
  Zb__V1__ReportRequest req = ZB__V1__REPORT_REQUEST__INIT;
  req.worker_id = w->id;
  req.job_id = (char *)job_id;
  req.rank = rank;
  req.error_from_peer = error && from_peer;
  if (error)
    req.error = (char *)error;
  else
    req.done = true;
  keep_sent(w, &req); /* before sending: a coordinator that dies meanwhile gets it again */
  worker_report_retry(w, &req, &w->shutdown, NULL, 0); /* a stopping worker does not wait */
}
