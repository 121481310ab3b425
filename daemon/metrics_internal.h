/* metrics_internal.h — what the two files of the Prometheus endpoint share:
 * metrics.c (the HTTP side, rendering on demand, the counters the loop
 * keeps) and metrics_text.c (the text). */
#ifndef ZB_METRICS_INTERNAL_H
#define ZB_METRICS_INTERNAL_H

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "coordinator.h"

enum { METRICS_N_PLAN_BUCKETS = 7, METRICS_N_OP_BUCKETS = 13 };
extern const double metrics_plan_buckets[METRICS_N_PLAN_BUCKETS];
extern const double metrics_op_buckets[METRICS_N_OP_BUCKETS];

/* Compute op kinds of the op-duration histogram. */
enum { METRICS_OP_F, METRICS_OP_B, METRICS_OP_W, METRICS_OP_BW, METRICS_N_OPS };

/* One (job, rank, op) series of zb_op_duration_seconds: a job holds its
 * ranks x METRICS_N_OPS of them (coord_job.op_hists), so a sampled op
 * finds its own by index. */
typedef struct op_hist {
  long long counts[METRICS_N_OP_BUCKETS];
  long long count;
  double sum;
} op_hist;

typedef struct coord_metrics {
  struct MHD_Daemon *mhd;
  /* open connections and when their requests began (metrics_deadline.c):
   * guarded by conn_mu */
  pthread_mutex_t conn_mu;
  struct metrics_conn *conns;
  /* the text, rendered on the loop when a scrape asks (async): guarded by mu */
  pthread_mutex_t mu;
  pthread_cond_t rendered_cv;
  char *text;
  size_t len;
  uint64_t wanted, rendered; /* scrapes that asked, the last one served */
  bool loop_gone;            /* the loop no longer renders: serve the last text */
  uv_async_t async;
  bool async_open;
  /* loop thread only */
  long long reports_total, workers_lost_total;
  long long finished_total[3]; /* succeeded, failed, cancelled */
  long long plan_counts[METRICS_N_PLAN_BUCKETS], plan_count;
  double plan_sum;
} coord_metrics;

/* metrics_deadline.c: libmicrohttpd's connection and request callbacks
 * (cls: the coord_metrics), and the handler's note that a request is in. */
enum { METRICS_REQUEST_MS = 10000 };
void metrics_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode toe);
void metrics_request_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                               enum MHD_RequestTerminationCode toe);
void metrics_request_answering(coord_metrics *mx, struct MHD_Connection *conn);

/* metrics_text.c: the whole text, from the loop's state. */
void metrics_render_text(coord *co, zb_buf *out);

#endif
