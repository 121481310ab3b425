/* Prometheus text at /metrics (docs/operations.md, Metrics), served by
 * libmicrohttpd's own thread. The text is rendered when a scrape asks for
 * it, on the loop (which owns the state; woken by a uv_async), and handed
 * to the HTTP thread under a lock: nothing is rendered between scrapes.
 * Should the loop not answer within 2 s, the scrape gets the last text.
 * The counters and histograms below are kept on the loop as things happen. */
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metrics_internal.h"
#include "zb_alloc.h"
#include "zb_jobspec_dp.h"
#include "zb_log.h"
#include "zb_timeline_pb.h"

const double metrics_plan_buckets[METRICS_N_PLAN_BUCKETS] = {1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10};
const double metrics_op_buckets[METRICS_N_OP_BUCKETS] = {1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
                                                         5e-2, 0.1,  0.25, 0.5,    1,    2.5};

/* On the loop: renders for the scrapes waiting. */
static void on_render(uv_async_t *h) {
  coord *co = h->data;
  coord_metrics *mx = co->metrics;
  pthread_mutex_lock(&mx->mu);
  uint64_t want = mx->wanted;
  pthread_mutex_unlock(&mx->mu);
  zb_buf b = ZB_BUF_INIT;
  metrics_render_text(co, &b);
  pthread_mutex_lock(&mx->mu);
  free(mx->text);
  mx->text = b.data;
  mx->len = b.len;
  mx->rendered = want;
  pthread_cond_broadcast(&mx->rendered_cv);
  pthread_mutex_unlock(&mx->mu);
}

/* On the HTTP thread: a fresh text from the loop, or the last one. */
static char *scrape_text(coord_metrics *mx, size_t *len) {
  pthread_mutex_lock(&mx->mu);
  if (!mx->loop_gone) {
    uint64_t want = ++mx->wanted;
    uv_async_send(&mx->async);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    while (mx->rendered < want && !mx->loop_gone)
      if (pthread_cond_timedwait(&mx->rendered_cv, &mx->mu, &until) == ETIMEDOUT)
        break;
  }
  *len = mx->len;
  char *copy = zb_malloc(*len ? *len : 1);
  memcpy(copy, mx->text, *len);
  pthread_mutex_unlock(&mx->mu);
  return copy;
}

static enum MHD_Result metrics_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version, const char *upload_data,
                                       size_t *upload_data_size, void **con_cls) {
  (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
  coord_metrics *mx = cls;
  struct MHD_Response *resp;
  unsigned int code = MHD_HTTP_OK;
  metrics_request_answering(mx, conn);
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char msg[] = "only GET /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") != 0) {
    static const char msg[] = "not found: zb-coordinator serves /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    code = MHD_HTTP_NOT_FOUND;
  } else {
    size_t len;
    char *text = scrape_text(mx, &len);
    resp = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  }
  enum MHD_Result ret = MHD_queue_response(conn, code, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* "host:port" (an IPv4 address, "[IPv6]", or a name, resolved) → the
 * address to listen on; false with why in diag. */
static bool metrics_addr(const char *addr, struct sockaddr_storage *sa, zb_diag *diag) {
  const char *colon = strrchr(addr, ':');
  char host[256];
  size_t hl = colon ? (size_t)(colon - addr) : 0;
  if (hl >= 2 && addr[0] == '[' && addr[hl - 1] == ']') { /* [v6] */
    addr++;
    hl -= 2;
  }
  if (!colon || hl == 0 || hl >= sizeof host) {
    zb_diag_set(diag, ZB_ERR_INVALID_ARG, "metrics_listen: '%s' is not host:port", addr);
    return false;
  }
  memcpy(host, addr, hl);
  host[hl] = 0;
  struct addrinfo hints = {.ai_family = AF_UNSPEC,
                           .ai_socktype = SOCK_STREAM,
                           .ai_flags = AI_PASSIVE | AI_NUMERICSERV},
                  *res = NULL;
  int rc = getaddrinfo(host, colon + 1, &hints, &res);
  if (rc != 0) {
    zb_diag_set(diag, ZB_ERR_INVALID_ARG, "metrics_listen: '%s': %s", host, gai_strerror(rc));
    return false;
  }
  memset(sa, 0, sizeof *sa);
  memcpy(sa, res->ai_addr, res->ai_addrlen);
  freeaddrinfo(res);
  return true;
}

/* Bounds against slow or idle clients (slowloris): a client that sends
 * nothing for METRICS_IDLE_S is dropped, and one whose request takes
 * longer than METRICS_REQUEST_MS to arrive (metrics_deadline.c); one
 * address may hold at most METRICS_MAX_PER_IP connections, so even 60
 * misbehaving hosts cannot take the scraper's place; a request (line and
 * headers) larger than METRICS_REQUEST_BYTES is refused. MHD_USE_AUTO picks epoll, which, unlike
 * select, is not limited to descriptors below 1024. */
enum {
  METRICS_IDLE_S = 5,
  METRICS_MAX_CONNECTIONS = 512,
  METRICS_MAX_PER_IP = 8,
  METRICS_REQUEST_BYTES = 16 * 1024,
};

/* libmicrohttpd's own messages, in the log's format (one line each). */
static void mhd_line(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  char msg[512];
  vsnprintf(msg, sizeof msg, fmt, ap);
  size_t n = strlen(msg);
  while (n && msg[n - 1] == '\n')
    msg[--n] = 0;
  zb_log_src(ZB_LOG_WARN, "microhttpd", "%s", msg);
}

zb_err coord_metrics_start(coord *co, zb_diag *diag) {
  coord_metrics *mx = zb_calloc(1, sizeof *mx);
  pthread_mutex_init(&mx->mu, NULL);
  pthread_mutex_init(&mx->conn_mu, NULL);
  pthread_cond_init(&mx->rendered_cv, NULL);
  co->metrics = mx;
  uv_async_init(co->loop, &mx->async, on_render);
  mx->async.data = co;
  mx->async_open = true;
  zb_buf b = ZB_BUF_INIT; /* the text a scrape gets should the loop never answer */
  metrics_render_text(co, &b);
  mx->text = b.data;
  mx->len = b.len;
  struct sockaddr_storage sa;
  if (!metrics_addr(co->cfg.metrics_listen, &sa, diag))
    return ZB_ERR_INVALID_ARG;
  unsigned int v6 = sa.ss_family == AF_INET6 ? MHD_USE_IPv6 : 0;
  mx->mhd = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG | v6, 0, NULL, NULL, metrics_handler,
      mx, MHD_OPTION_EXTERNAL_LOGGER, mhd_line, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)METRICS_IDLE_S, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned int)METRICS_MAX_CONNECTIONS, MHD_OPTION_PER_IP_CONNECTION_LIMIT,
      (unsigned int)METRICS_MAX_PER_IP, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)METRICS_REQUEST_BYTES,
      MHD_OPTION_NOTIFY_CONNECTION, metrics_notify_connection, mx, MHD_OPTION_NOTIFY_COMPLETED,
      metrics_request_completed, mx, MHD_OPTION_END);
  if (!mx->mhd)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "metrics_listen: cannot listen on %s (address in use?)",
                       co->cfg.metrics_listen);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(mx->mhd, MHD_DAEMON_INFO_BIND_PORT);
  co->metrics_port = info ? info->port : 0;
  return ZB_OK;
}

void coord_metrics_detach_loop(coord *co) {
  coord_metrics *mx = co->metrics;
  if (!mx || !mx->async_open)
    return;
  pthread_mutex_lock(&mx->mu);
  mx->loop_gone = true;
  pthread_cond_broadcast(&mx->rendered_cv);
  pthread_mutex_unlock(&mx->mu);
  uv_close((uv_handle_t *)&mx->async, NULL);
  mx->async_open = false;
}

void coord_metrics_stop(coord *co) {
  coord_metrics *mx = co->metrics;
  if (!mx)
    return;
  if (mx->async_open) { /* the loop never ran (a failed start): close it here */
    coord_metrics_detach_loop(co);
    uv_run(co->loop, UV_RUN_NOWAIT);
  }
  if (mx->mhd)
    MHD_stop_daemon(mx->mhd);
  pthread_cond_destroy(&mx->rendered_cv);
  pthread_mutex_destroy(&mx->mu);
  pthread_mutex_destroy(&mx->conn_mu);
  free(mx->text);
  free(mx);
  co->metrics = NULL;
}

/* ---- what the loop counts as it happens ---- */

void coord_metrics_count_report(coord *co) {
  if (co->metrics)
    co->metrics->reports_total++;
}

void coord_metrics_worker_lost(coord *co) {
  if (co->metrics)
    co->metrics->workers_lost_total++;
}

void coord_metrics_job_finished(coord *co, int state) {
  if (co->metrics && state >= ZB_JOB_SUCCEEDED && state <= ZB_JOB_CANCELLED)
    co->metrics->finished_total[state - ZB_JOB_SUCCEEDED]++;
}

void coord_metrics_observe_plan(coord *co, double seconds) {
  coord_metrics *mx = co->metrics;
  if (!mx)
    return;
  for (int k = 0; k < METRICS_N_PLAN_BUCKETS; k++)
    if (seconds <= metrics_plan_buckets[k])
      mx->plan_counts[k]++;
  mx->plan_count++;
  mx->plan_sum += seconds;
}

/* The histogram of (j, rank, op): an index into the job's own, made at
 * its first sampled iteration (a scan of every series of every job took
 * 70% of the coordinator's CPU during large jobs). */
static op_hist *metrics_op(coord_job *j, int rank, int op) {
  if (!j->op_hists)
    j->op_hists = zb_calloc((size_t)zb_job_spec_world(&j->spec) * METRICS_N_OPS, sizeof *j->op_hists);
  return &j->op_hists[rank * METRICS_N_OPS + op];
}

void coord_metrics_forget_job(coord_job *j) {
  free(j->op_hists);
  j->op_hists = NULL;
}

/* Every compute op of a sampled iteration, at its own duration, from the
 * rank's timeline (JobSpec.trace_every); unsampled iterations carry only
 * busy time per kind, which is no op's duration, and add nothing. */
void coord_metrics_observe_ops(coord *co, coord_job *j, const Zb__V1__RankIteration *it) {
  zb_tl_op *ops = NULL;
  int n = 0;
  zb_diag d;
  if (!co->metrics || it->rank < 0 || it->rank >= zb_job_spec_world(&j->spec) || !it->timeline ||
      zb_timeline_decode(it->timeline, 0, &ops, &n, &d) != ZB_OK)
    return;
  for (int i = 0; i < n; i++) {
    zb_op op = ops[i].op;
    int kind = op == ZB_OP_F    ? METRICS_OP_F
               : op == ZB_OP_B  ? METRICS_OP_B
               : op == ZB_OP_W  ? METRICS_OP_W
               : op == ZB_OP_BW ? METRICS_OP_BW
                                : -1;
    if (kind < 0)
      continue; /* a transport group */
    double seconds = ops[i].end - ops[i].start;
    op_hist *h = metrics_op(j, it->rank, kind);
    for (int b = 0; b < METRICS_N_OP_BUCKETS; b++)
      h->counts[b] += seconds <= metrics_op_buckets[b];
    h->count++;
    h->sum += seconds;
  }
  free(ops);
}
