/* Prometheus text at /metrics (docs/operations.md, Metrics), served by libmicrohttpd's own
 * thread. The loop renders the text from its state (every tick) into a
 * buffer under a lock; the HTTP thread only copies that buffer, so it
 * never touches coordinator state. */
#include <arpa/inet.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coordinator.h"
#include "zb_alloc.h"
#include "zb_log.h"

#ifndef ZB_VERSION
#define ZB_VERSION "unknown"
#endif

static const double plan_buckets[] = {1e-5, 1e-4, 1e-3, 1e-2, 0.1, 1, 10};
static const double op_buckets[] = {1e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2,
                                    5e-2, 0.1,  0.25, 0.5,    1,    2.5};
enum { N_PLAN_BUCKETS = sizeof plan_buckets / sizeof plan_buckets[0] };
enum { N_OP_BUCKETS = sizeof op_buckets / sizeof op_buckets[0] };

typedef struct op_hist {
  char job[64];
  int rank;
  int op; /* 0 F, 1 B, 2 W */
  long long counts[N_OP_BUCKETS];
  long long count;
  double sum;
} op_hist;

typedef struct coord_metrics {
  struct MHD_Daemon *mhd;
  pthread_mutex_t mu;
  char *text; /* guarded by mu */
  size_t len;
  long long reports_total;
  long long plan_counts[N_PLAN_BUCKETS], plan_count;
  double plan_sum;
  op_hist *ops;
  int n_ops, cap_ops;
} coord_metrics;

static enum MHD_Result metrics_handler(void *cls, struct MHD_Connection *conn, const char *url,
                                       const char *method, const char *version, const char *upload_data,
                                       size_t *upload_data_size, void **con_cls) {
  (void)version, (void)upload_data, (void)upload_data_size, (void)con_cls;
  coord_metrics *mx = cls;
  struct MHD_Response *resp;
  unsigned int code = MHD_HTTP_OK;
  if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
    static const char msg[] = "only GET /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    code = MHD_HTTP_METHOD_NOT_ALLOWED;
  } else if (strcmp(url, "/metrics") != 0) {
    static const char msg[] = "not found: zb-coordinator serves /metrics\n";
    resp = MHD_create_response_from_buffer(sizeof msg - 1, (void *)msg, MHD_RESPMEM_PERSISTENT);
    code = MHD_HTTP_NOT_FOUND;
  } else {
    pthread_mutex_lock(&mx->mu);
    size_t len = mx->len;
    char *copy = zb_malloc(len ? len : 1);
    memcpy(copy, mx->text, len);
    pthread_mutex_unlock(&mx->mu);
    resp = MHD_create_response_from_buffer(len, copy, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(resp, "Content-Type", "text/plain; version=0.0.4; charset=utf-8");
  }
  enum MHD_Result ret = MHD_queue_response(conn, code, resp);
  MHD_destroy_response(resp);
  return ret;
}

/* "host:port" → IPv4 sockaddr ("localhost" is 127.0.0.1). */
static bool metrics_addr(const char *addr, struct sockaddr_in *sa) {
  const char *colon = strrchr(addr, ':');
  if (!colon)
    return false;
  char host[64];
  size_t hl = (size_t)(colon - addr);
  if (hl == 0 || hl >= sizeof host)
    return false;
  memcpy(host, addr, hl);
  host[hl] = 0;
  char *end;
  long port = strtol(colon + 1, &end, 10);
  if (*end || port < 0 || port > 65535)
    return false;
  memset(sa, 0, sizeof *sa);
  sa->sin_family = AF_INET;
  sa->sin_port = htons((uint16_t)port);
  if (strcmp(host, "localhost") == 0)
    snprintf(host, sizeof host, "127.0.0.1");
  return inet_pton(AF_INET, host, &sa->sin_addr) == 1;
}

/* Bounds against slow or idle clients (slowloris): a client that sends
 * nothing for METRICS_IDLE_S is dropped; one address may hold at most
 * METRICS_MAX_PER_IP connections, so one misbehaving host cannot take the
 * scraper's place; a request (line and headers) larger than
 * METRICS_REQUEST_BYTES is refused. MHD_USE_AUTO picks epoll, which, unlike
 * select, is not limited to descriptors below 1024. */
enum {
  METRICS_IDLE_S = 5,
  METRICS_MAX_CONNECTIONS = 512,
  METRICS_MAX_PER_IP = 32,
  METRICS_REQUEST_BYTES = 16 * 1024,
};

zb_err coord_metrics_start(coord *co, zb_diag *diag) {
  coord_metrics *mx = zb_calloc(1, sizeof *mx);
  pthread_mutex_init(&mx->mu, NULL);
  co->metrics = mx;
  coord_metrics_render(co);
  struct sockaddr_in sa;
  if (!metrics_addr(co->cfg.metrics_listen, &sa))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "metrics_listen: '%s' is not an IPv4 host:port",
                       co->cfg.metrics_listen);
  mx->mhd = MHD_start_daemon(
      MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ERROR_LOG, 0, NULL, NULL, metrics_handler, mx,
      MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned int)METRICS_IDLE_S, MHD_OPTION_CONNECTION_LIMIT, (unsigned int)METRICS_MAX_CONNECTIONS,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned int)METRICS_MAX_PER_IP,
      MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)METRICS_REQUEST_BYTES, MHD_OPTION_END);
  if (!mx->mhd)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "metrics_listen: cannot listen on %s (address in use?)",
                       co->cfg.metrics_listen);
  const union MHD_DaemonInfo *info = MHD_get_daemon_info(mx->mhd, MHD_DAEMON_INFO_BIND_PORT);
  co->metrics_port = info ? info->port : ntohs(sa.sin_port);
  return ZB_OK;
}

void coord_metrics_stop(coord *co) {
  coord_metrics *mx = co->metrics;
  if (!mx)
    return;
  if (mx->mhd)
    MHD_stop_daemon(mx->mhd);
  pthread_mutex_destroy(&mx->mu);
  free(mx->text);
  free(mx->ops);
  free(mx);
  co->metrics = NULL;
}

void coord_metrics_count_report(coord *co) {
  if (co->metrics)
    co->metrics->reports_total++;
}

void coord_metrics_observe_plan(coord *co, double seconds) {
  coord_metrics *mx = co->metrics;
  if (!mx)
    return;
  for (int k = 0; k < N_PLAN_BUCKETS; k++)
    if (seconds <= plan_buckets[k])
      mx->plan_counts[k]++;
  mx->plan_count++;
  mx->plan_sum += seconds;
}

static op_hist *metrics_op(coord_metrics *mx, const char *job, int rank, int op) {
  for (int k = 0; k < mx->n_ops; k++)
    if (mx->ops[k].rank == rank && mx->ops[k].op == op && strcmp(mx->ops[k].job, job) == 0)
      return &mx->ops[k];
  if (mx->n_ops == mx->cap_ops) {
    mx->cap_ops = mx->cap_ops ? 2 * mx->cap_ops : 64;
    mx->ops = zb_realloc(mx->ops, sizeof *mx->ops * (size_t)mx->cap_ops);
  }
  op_hist *h = &mx->ops[mx->n_ops++];
  memset(h, 0, sizeof *h);
  snprintf(h->job, sizeof h->job, "%s", job);
  h->rank = rank;
  h->op = op;
  return h;
}

void coord_metrics_forget_job(coord *co, const char *job_id) {
  coord_metrics *mx = co->metrics;
  if (!mx)
    return;
  int kept = 0;
  for (int k = 0; k < mx->n_ops; k++)
    if (strcmp(mx->ops[k].job, job_id) != 0)
      mx->ops[kept++] = mx->ops[k];
  mx->n_ops = kept;
}

/* One observation per op kind and iteration: the mean duration of that
 * kind's ops on the rank (the report carries busy time per kind; the plan
 * says how many ops of each kind the rank ran). */
void coord_metrics_observe_ops(coord *co, const coord_job *j, const Zb__V1__RankIteration *it) {
  coord_metrics *mx = co->metrics;
  if (!mx || !j->plan.lowered || it->rank < 0 || it->rank >= j->plan.p)
    return;
  int n[3] = {0, 0, 0};
  const zb_rank_list *l = &j->plan.lowered->ranks[it->rank];
  for (int i = 0; i < l->n; i++) {
    zb_op op = l->actions[i].op;
    n[0] += op == ZB_OP_F;
    n[1] += op == ZB_OP_B || op == ZB_OP_BW;
    n[2] += op == ZB_OP_W;
  }
  const double busy[3] = {it->busy_f_seconds, it->busy_b_seconds, it->busy_w_seconds};
  for (int k = 0; k < 3; k++) {
    if (n[k] == 0)
      continue;
    double mean = busy[k] / n[k];
    op_hist *h = metrics_op(mx, j->row.id, it->rank, k);
    for (int b = 0; b < N_OP_BUCKETS; b++)
      if (mean <= op_buckets[b])
        h->counts[b] += n[k];
    h->count += n[k];
    h->sum += busy[k];
  }
}

static void family(zb_buf *b, const char *name, const char *type, const char *help) {
  zb_buf_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* The coordinator's own gauges and counters: build, jobs by state,
 * workers, reports, and every job's iterations and throughput. */
static void render_totals(coord *co, zb_buf *b) {
  family(b, "zb_build_info", "gauge", "Build of this zb-coordinator; the value is always 1.");
  zb_buf_printf(b, "zb_build_info{version=\"%s\"} 1\n", ZB_VERSION);
  family(b, "zb_jobs", "gauge", "Jobs known to the coordinator, by state.");
  static const char *const states[] = {"pending", "running", "succeeded", "failed", "cancelled"};
  int counts[6] = {0};
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state >= 1 && j->row.state <= 5)
      counts[j->row.state]++;
  for (int s = 1; s <= 5; s++)
    zb_buf_printf(b, "zb_jobs{state=\"%s\"} %d\n", states[s - 1], counts[s]);
  family(b, "zb_workers_attached", "gauge", "Workers with a live Attach stream.");
  int attached = 0;
  for (coord_worker *w = co->workers; w; w = w->next)
    attached += w->attach != NULL;
  zb_buf_printf(b, "zb_workers_attached %d\n", attached);
  family(b, "zb_reports_total", "counter", "Report calls received from workers.");
  zb_buf_printf(b, "zb_reports_total %lld\n", co->metrics->reports_total);
  family(b, "zb_jobs_pruned_total", "counter",
         "Finished jobs removed with their events by retention (retain_finished_jobs, retain_finished_s).");
  zb_buf_printf(b, "zb_jobs_pruned_total %lld\n", co->jobs_pruned);
  family(b, "zb_job_iterations_total", "counter", "Iterations a job has completed on all ranks.");
  for (coord_job *j = co->jobs; j; j = j->next)
    zb_buf_printf(b, "zb_job_iterations_total{job=\"%s\"} %d\n", j->row.id, j->row.iterations_done);
  family(b, "zb_job_samples_per_second", "gauge",
         "Microbatches per second over the last iteration of a running job.");
  for (coord_job *j = co->jobs; j; j = j->next)
    if (j->row.state == ZB_JOB_RUNNING)
      zb_buf_printf(b, "zb_job_samples_per_second{job=\"%s\"} %.6g\n", j->row.id, j->samples_per_second);
}

/* Per-rank slowdown of running jobs, from their last sampled iteration
 * (learn.c): the ratio, and 1 for a straggler. */
static void render_slowdowns(coord *co, zb_buf *b) {
  zb_buf ratio = ZB_BUF_INIT, flag = ZB_BUF_INIT;
  for (coord_job *j = co->jobs; j; j = j->next) {
    if (j->row.state != ZB_JOB_RUNNING || !j->slowdown)
      continue;
    for (int r = 0; r < j->spec.ranks; r++) {
      zb_buf_printf(&ratio, "zb_rank_slowdown_ratio{job=\"%s\",rank=\"%d\"} %.6g\n", j->row.id, r,
                    j->slowdown[r]);
      zb_buf_printf(&flag, "zb_rank_straggler{job=\"%s\",rank=\"%d\"} %d\n", j->row.id, r,
                    j->slowdown[r] > COORD_STRAGGLER_RATIO);
    }
  }
  family(b, "zb_rank_slowdown_ratio", "gauge",
         "A rank's compute time over the plan's, against the median rank's, in its job's last sampled "
         "iteration.");
  if (ratio.len)
    zb_buf_append(b, ratio.data, ratio.len);
  family(b, "zb_rank_straggler", "gauge",
         "1 when a rank's slowdown ratio exceeds 1.2 (a straggler), else 0.");
  if (flag.len)
    zb_buf_append(b, flag.data, flag.len);
  zb_buf_free(&ratio);
  zb_buf_free(&flag);
}

/* Per-rank figures of running jobs, from their last iteration. */
static void render_ranks(coord *co, zb_buf *b) {
  zb_buf bub = ZB_BUF_INIT, mem = ZB_BUF_INIT;
  for (coord_job *j = co->jobs; j; j = j->next) {
    if (j->row.state != ZB_JOB_RUNNING || !j->row.last)
      continue;
    Zb__V1__IterationMetrics *it = (Zb__V1__IterationMetrics *)protobuf_c_message_unpack(
        &zb__v1__iteration_metrics__descriptor, NULL, j->row.last_len, j->row.last);
    if (!it)
      continue;
    for (size_t r = 0; r < it->n_ranks; r++) {
      zb_buf_printf(&bub, "zb_rank_bubble_ratio{job=\"%s\",rank=\"%d\"} %.6g\n", j->row.id,
                    it->ranks[r]->rank, it->ranks[r]->bubble_ratio);
      zb_buf_printf(&mem, "zb_rank_peak_memory_bytes{job=\"%s\",rank=\"%d\"} %lld\n", j->row.id,
                    it->ranks[r]->rank, (long long)it->ranks[r]->peak_memory_bytes);
    }
    protobuf_c_message_free_unpacked(&it->base, NULL);
  }
  family(b, "zb_rank_bubble_ratio", "gauge", "Measured idle share of a rank's last iteration.");
  if (bub.len)
    zb_buf_append(b, bub.data, bub.len);
  family(b, "zb_rank_peak_memory_bytes", "gauge", "Peak activation memory of a rank in its last iteration.");
  if (mem.len)
    zb_buf_append(b, mem.data, mem.len);
  zb_buf_free(&bub);
  zb_buf_free(&mem);
  render_slowdowns(co, b);
}

/* The two histograms: op durations by job, rank and op; plan times. */
static void render_histograms(const coord_metrics *mx, zb_buf *b) {
  family(b, "zb_op_duration_seconds", "histogram", "Duration of compute ops (F, B, W) by job and rank.");
  static const char *const ops[] = {"F", "B", "W"};
  for (int k = 0; k < mx->n_ops; k++) {
    const op_hist *h = &mx->ops[k];
    for (int q = 0; q < N_OP_BUCKETS; q++)
      zb_buf_printf(b, "zb_op_duration_seconds_bucket{job=\"%s\",rank=\"%d\",op=\"%s\",le=\"%g\"} %lld\n",
                    h->job, h->rank, ops[h->op], op_buckets[q], h->counts[q]);
    zb_buf_printf(b, "zb_op_duration_seconds_bucket{job=\"%s\",rank=\"%d\",op=\"%s\",le=\"+Inf\"} %lld\n",
                  h->job, h->rank, ops[h->op], h->count);
    zb_buf_printf(b, "zb_op_duration_seconds_sum{job=\"%s\",rank=\"%d\",op=\"%s\"} %.9g\n", h->job, h->rank,
                  ops[h->op], h->sum);
    zb_buf_printf(b, "zb_op_duration_seconds_count{job=\"%s\",rank=\"%d\",op=\"%s\"} %lld\n", h->job, h->rank,
                  ops[h->op], h->count);
  }
  family(b, "zb_plan_seconds", "histogram", "Time libzb took to generate a schedule.");
  for (int q = 0; q < N_PLAN_BUCKETS; q++)
    zb_buf_printf(b, "zb_plan_seconds_bucket{le=\"%g\"} %lld\n", plan_buckets[q], mx->plan_counts[q]);
  zb_buf_printf(b, "zb_plan_seconds_bucket{le=\"+Inf\"} %lld\n", mx->plan_count);
  zb_buf_printf(b, "zb_plan_seconds_sum %.9g\n", mx->plan_sum);
  zb_buf_printf(b, "zb_plan_seconds_count %lld\n", mx->plan_count);
}

void coord_metrics_render(coord *co) {
  coord_metrics *mx = co->metrics;
  if (!mx)
    return;
  zb_buf b = ZB_BUF_INIT;
  render_totals(co, &b);
  render_ranks(co, &b);
  render_histograms(mx, &b);
  coord_metrics_process(&b);
  pthread_mutex_lock(&mx->mu);
  free(mx->text);
  mx->text = b.data;
  mx->len = b.len;
  pthread_mutex_unlock(&mx->mu);
}
