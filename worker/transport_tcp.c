/* transport_tcp.c — the tcp transport (zb_transport.h): construction,
 * the listening socket, failure, and the life cycle; sends and receives
 * are in transport_tcp_data.c, connecting in transport_tcp_connect.c, the
 * wire format in transport_tcp.h. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport_tcp.h"
#include "zb_alloc.h"

/* ---- small helpers ---- */

const char *zbtcp_errstr(int e, char *buf, size_t len) {
  if (strerror_r(e, buf, len) != 0)
    snprintf(buf, len, "errno %d", e);
  return buf;
}

void zbtcp_set_buffers(int fd) {
  int n = TCP_SOCKET_BUFFER;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &n, sizeof n);
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &n, sizeof n);
}

int zbtcp_set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Splits "host:port" (host may be "[v6]", empty or "*"). */
static bool split_address(const char *addr, char *host, size_t host_len, char *port, size_t port_len) {
  const char *colon = strrchr(addr, ':');
  if (!colon || colon[1] == '\0' || strlen(colon + 1) >= port_len)
    return false;
  const char *h = addr;
  size_t hl = (size_t)(colon - addr);
  if (hl >= 2 && h[0] == '[' && h[hl - 1] == ']') {
    h++;
    hl -= 2;
  }
  if (hl >= host_len)
    return false;
  memcpy(host, h, hl);
  host[hl] = '\0';
  for (const char *p = colon + 1; *p; p++)
    if (*p < '0' || *p > '9')
      return false;
  long pn = strtol(colon + 1, NULL, 10);
  if (pn < 0 || pn > 65535)
    return false;
  snprintf(port, port_len, "%s", colon + 1);
  return true;
}

int zbtcp_resolve(const char *addr, bool passive, struct addrinfo **out) {
  char host[256], port[16];
  if (!split_address(addr, host, sizeof host, port, sizeof port))
    return EAI_NONAME;
  struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_family = AF_UNSPEC};
  const char *node = host;
  if (passive) {
    hints.ai_flags = AI_PASSIVE;
    if (host[0] == '\0' || strcmp(host, "*") == 0)
      node = NULL;
  } else if (host[0] == '\0') {
    return EAI_NONAME;
  }
  return getaddrinfo(node, port, &hints, out);
}

void zbtcp_format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t len) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (ss->ss_family == AF_INET6) {
    const struct sockaddr_in6 *a = (const struct sockaddr_in6 *)ss;
    inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof host);
    snprintf(buf, len, "[%s]:%u", host, (unsigned)ntohs(a->sin6_port));
  } else {
    const struct sockaddr_in *a = (const struct sockaddr_in *)ss;
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof host);
    snprintf(buf, len, "%s:%u", host, (unsigned)ntohs(a->sin_port));
  }
}

/* ---- failure: poison the transport (like ncclCommAbort) ---- */

zb_err zbtcp_fail(tcp_transport *t, zb_err err, zb_diag *diag, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(t->failure, sizeof t->failure, fmt, ap);
  va_end(ap);
  t->failed = err;
  for (int q = 0; q < t->nranks; q++)
    if (t->fds[q] >= 0)
      shutdown(t->fds[q], SHUT_RDWR); /* peers see EOF now, not when we are freed */
  t->n_ops = 0;
  t->depth = 0;
  return zb_diag_set(diag, err, "%s", t->failure);
}

zb_err zbtcp_failed_before(const tcp_transport *t, zb_diag *diag) {
  return zb_diag_set(diag, t->failed, "transport failed before: %s", t->failure);
}

/* ---- life cycle ---- */

static const char *tcp_address(void *self) {
  return ((tcp_transport *)self)->address;
}

static void tcp_stats(void *self, zb_transport_stats *out) {
  *out = ((tcp_transport *)self)->stats;
}

static bool tcp_failed_by_peer(void *self) {
  return ((tcp_transport *)self)->failed_by_peer;
}

static void tcp_abort(void *self, const char *why) {
  tcp_transport *t = self;
  if (!t->failed)
    zbtcp_fail(t, ZB_ERR_IO, NULL, "rank %d aborted: %s", t->rank, why ? why : "no reason given");
}

static void tcp_free(void *self) {
  tcp_transport *t = self;
  for (int q = 0; q < t->nranks; q++) {
    if (t->fds[q] >= 0)
      close(t->fds[q]);
    zbtcp_frame_mac_free(t->links[q].tx);
    zbtcp_frame_mac_free(t->links[q].rx);
  }
  if (t->listen_fd >= 0 && t->owns_listener)
    close(t->listen_fd);
  free(t->fds);
  free(t->links);
  free(t->ops);
  free(t->pfds);
  free(t->pfd_peer);
  free(t->send_head);
  free(t->recv_head);
  free(t);
}

static const zb_transport_ops tcp_ops = {
    .name = "tcp",
    .address = tcp_address,
    .connect = zbtcp_connect,
    .group_start = zbtcp_group_start,
    .send = zbtcp_send,
    .recv = zbtcp_recv,
    .group_end = zbtcp_group_end,
    .stats = tcp_stats,
    .failed_by_peer = tcp_failed_by_peer,
    .abort = tcp_abort,
    .free = tcp_free,
};

static int sockaddr_port(const struct sockaddr_storage *ss) {
  if (ss->ss_family == AF_INET6)
    return ntohs(((const struct sockaddr_in6 *)ss)->sin6_port);
  return ntohs(((const struct sockaddr_in *)ss)->sin_port);
}

zb_err zb_tcp_listen(const char *addr, int *fd_out, int *port, zb_diag *diag) {
  struct addrinfo *ai = NULL;
  int rc = zbtcp_resolve(addr, true, &ai);
  if (rc != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "listen address \"%s\": %s", addr,
                       rc == EAI_NONAME ? "expected host:port" : gai_strerror(rc));
  int e = 0, lfd = -1;
  for (struct addrinfo *a = ai; a && lfd < 0; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      e = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    zbtcp_set_buffers(fd); /* accepted connections inherit them */
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0 && zbtcp_set_nonblocking(fd) == 0) {
      lfd = fd;
      break;
    }
    e = errno;
    close(fd);
  }
  freeaddrinfo(ai);
  char eb[96];
  if (lfd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "cannot listen on %s: %s", addr, zbtcp_errstr(e, eb, sizeof eb));
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0) {
    e = errno;
    close(lfd);
    return zb_diag_set(diag, ZB_ERR_IO, "getsockname on %s: %s", addr, zbtcp_errstr(e, eb, sizeof eb));
  }
  *fd_out = lfd;
  *port = sockaddr_port(&ss);
  return ZB_OK;
}

/* The transport's listening socket: the caller's (borrowed), or its own
 * bound on cfg->listen. */
static zb_err tcp_listen(tcp_transport *t, const zb_tcp_config *cfg, zb_diag *diag) {
  if (cfg->has_listener) {
    t->listen_fd = cfg->listener_fd;
  } else {
    int port;
    zb_diag d = {{0}};
    zb_err err = zb_tcp_listen(cfg->listen, &t->listen_fd, &port, &d);
    if (err)
      return zb_diag_set(diag, err, "rank %d: %s", t->rank, d.msg);
    t->owns_listener = true;
  }
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  char eb[96];
  if (getsockname(t->listen_fd, (struct sockaddr *)&ss, &sl) < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "rank %d: getsockname: %s", t->rank,
                       zbtcp_errstr(errno, eb, sizeof eb));
  zbtcp_format_sockaddr(&ss, t->address, sizeof t->address);
  return ZB_OK;
}

zb_err zb_transport_tcp_new(const zb_tcp_config *cfg, zb_transport **out, zb_diag *diag) {
  if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tcp transport: rank %d is not in 0..%d", cfg->rank,
                       cfg->nranks - 1);
  if (!cfg->listen && !cfg->has_listener)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tcp transport: no listen address");
  tcp_transport *t = zb_calloc(1, sizeof *t);
  t->rank = cfg->rank;
  t->nranks = cfg->nranks;
  t->session = cfg->session;
  if (cfg->secret && cfg->secret_len > 0) {
    t->key_len = cfg->secret_len < TCP_KEY_MAX ? cfg->secret_len : TCP_KEY_MAX;
    memcpy(t->key, cfg->secret, t->key_len);
  } else {
    put_u64(t->key, cfg->session);
    t->key_len = 8;
  }
  t->stop = cfg->stop;
  t->idle_timeout_s = cfg->idle_timeout_s;
  t->listen_fd = -1;
  size_t p = (size_t)cfg->nranks;
  t->fds = zb_malloc(sizeof(int) * p);
  for (size_t q = 0; q < p; q++)
    t->fds[q] = -1;
  t->links = zb_calloc(p, sizeof *t->links);
  t->pfds = zb_calloc(p + 1, sizeof *t->pfds);
  t->pfd_peer = zb_calloc(p + 1, sizeof(int));
  t->send_head = zb_calloc(p, sizeof(int));
  t->recv_head = zb_calloc(p, sizeof(int));
  zb_err err = tcp_listen(t, cfg, diag);
  if (err) {
    tcp_free(t);
    return err;
  }
  zb_transport *h = zb_calloc(1, sizeof *h);
  h->ops = &tcp_ops;
  h->self = t;
  *out = h;
  return ZB_OK;
}
