/* metrics_deadline.c — a whole request to /metrics has METRICS_REQUEST_MS
 * to arrive, however it trickles (docs/operations.md, Metrics).
 * libmicrohttpd's own timeout is an idle one, which a slowloris client
 * resets with one byte every few seconds; from 17 addresses such clients
 * held every connection. Each connection is noted when it opens and when
 * a request on it is answered or completed; the loop's tick shuts down
 * the socket of one whose request has been arriving too long, and
 * libmicrohttpd then closes it. The list is shared by the HTTP thread and
 * the loop under its own lock, and a record leaves it (NOTIFY_CLOSED)
 * before its socket is closed, so the tick never touches a reused fd. */
#include <stdlib.h>
#include <sys/socket.h>

#include "metrics_internal.h"
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_log.h"

typedef struct metrics_conn {
  int fd;
  int64_t since_ms; /* when its current request began arriving */
  bool answering;   /* its request is in, an answer on its way */
  struct metrics_conn *next, *prev;
} metrics_conn;

void metrics_notify_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                               enum MHD_ConnectionNotificationCode toe) {
  coord_metrics *mx = cls;
  pthread_mutex_lock(&mx->conn_mu);
  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    metrics_conn *c = zb_calloc(1, sizeof *c);
    *c = (metrics_conn){
        .fd = info ? info->connect_fd : -1, .since_ms = zb_clock_ns() / 1000000, .next = mx->conns};
    if (mx->conns)
      mx->conns->prev = c;
    mx->conns = c;
    *socket_context = c;
  } else if (*socket_context) {
    metrics_conn *c = *socket_context;
    if (c->prev)
      c->prev->next = c->next;
    else
      mx->conns = c->next;
    if (c->next)
      c->next->prev = c->prev;
    free(c);
    *socket_context = NULL;
  }
  pthread_mutex_unlock(&mx->conn_mu);
}

/* Marks conn's request answered (from the handler) or done (the next
 * request's clock starts). */
static void conn_mark(coord_metrics *mx, struct MHD_Connection *conn, bool answering) {
  const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  pthread_mutex_lock(&mx->conn_mu);
  metrics_conn *c = info ? info->socket_context : NULL;
  if (c) {
    c->answering = answering;
    c->since_ms = zb_clock_ns() / 1000000;
  }
  pthread_mutex_unlock(&mx->conn_mu);
}

void metrics_request_answering(coord_metrics *mx, struct MHD_Connection *conn) {
  conn_mark(mx, conn, true);
}

void metrics_request_completed(void *cls, struct MHD_Connection *conn, void **req_cls,
                               enum MHD_RequestTerminationCode toe) {
  (void)req_cls, (void)toe;
  conn_mark(cls, conn, false);
}

void coord_metrics_sweep(coord *co) {
  coord_metrics *mx = co->metrics;
  if (!mx || !mx->mhd)
    return;
  int64_t now = zb_clock_ns() / 1000000;
  int cut = 0;
  pthread_mutex_lock(&mx->conn_mu);
  for (metrics_conn *c = mx->conns; c; c = c->next)
    if (!c->answering && c->fd >= 0 && now - c->since_ms > METRICS_REQUEST_MS) {
      shutdown(c->fd, SHUT_RDWR);
      c->fd = -1; /* once */
      cut++;
    }
  pthread_mutex_unlock(&mx->conn_mu);
  if (cut)
    ZB_DEBUG("metrics: closed %d connection(s) whose request took over %d ms to arrive", cut,
             METRICS_REQUEST_MS);
}
