/* transport_tcp.c — the tcp transport (zb_transport.h): one TCP connection
 * per pair of ranks, non-blocking sockets, and a poll() loop that moves
 * every posted send and receive of a group at once.
 *
 * Wire format, little-endian, all frames 24 bytes:
 *   hello:   magic "ZBHL" | version u32 | rank u32 | nranks u32 | session u64
 *   message: magic "ZBMS" | kind u32 ('F'/'B') | stage i32 | mb i32 | len u64,
 *            then len payload bytes.
 * The dialer (lower rank) sends its hello, the acceptor answers with its
 * own. A receive reads exactly one header and then exactly its payload, so
 * nothing beyond the message it was posted for is ever consumed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_transport.h"

#define TCP_HELLO_MAGIC 0x4c48425au /* "ZBHL" as bytes on the wire */
#define TCP_MSG_MAGIC 0x534d425au   /* "ZBMS" */
#define TCP_VERSION 1u
#define TCP_FRAME 24
#define TCP_POLL_MS 100 /* the longest a wait goes without looking at the stop flag */
#define TCP_BACKOFF_MIN_NS 10000000LL
#define TCP_BACKOFF_MAX_NS 500000000LL

typedef struct tcp_op {
  bool is_send;
  int peer;
  zb_tag tag;
  unsigned char *buf; /* a send's buffer is never written */
  size_t len;
  unsigned char hdr[TCP_FRAME];
  size_t done; /* bytes of header + payload moved */
} tcp_op;

typedef struct tcp_transport {
  int rank, nranks;
  uint64_t session;
  const atomic_bool *stop;
  double idle_timeout_s;
  int listen_fd;
  char address[96];
  int *fds; /* by rank; -1 when not connected */
  int depth;
  tcp_op *ops;
  int n_ops, cap_ops;
  struct pollfd *pfds; /* nranks + 1 scratch entries */
  int *pfd_peer;
  int *send_head, *recv_head; /* scratch, by rank */
  zb_err failed;              /* ZB_OK while healthy */
  char failure[sizeof(((zb_diag *)0)->msg)];
  zb_transport_stats stats;
} tcp_transport;

/* ---- small helpers ---- */

static void put_u32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

static uint32_t get_u32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t)p[i] << (8 * i);
  return v;
}

static uint64_t get_u64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t)p[i] << (8 * i);
  return v;
}

static const char *errstr(int e, char *buf, size_t len) {
  if (strerror_r(e, buf, len) != 0)
    snprintf(buf, len, "errno %d", e);
  return buf;
}

static bool stopped(const tcp_transport *t) {
  return t->stop && atomic_load(t->stop);
}

static int set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL, 0);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
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

static int resolve(const char *addr, bool passive, struct addrinfo **out) {
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

static void format_sockaddr(const struct sockaddr_storage *ss, char *buf, size_t len) {
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

static zb_err tcp_fail(tcp_transport *t, zb_err err, zb_diag *diag, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static zb_err tcp_fail(tcp_transport *t, zb_err err, zb_diag *diag, const char *fmt, ...) {
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

static zb_err tcp_failed_before(const tcp_transport *t, zb_diag *diag) {
  return zb_diag_set(diag, t->failed, "transport failed before: %s", t->failure);
}

/* ---- data: posting and progressing sends and receives ---- */

static void tcp_encode_header(unsigned char *h, zb_tag tag, size_t len) {
  put_u32(h, TCP_MSG_MAGIC);
  put_u32(h + 4, tag.kind == ZB_OP_B ? 'B' : 'F');
  put_u32(h + 8, (uint32_t)tag.stage);
  put_u32(h + 12, (uint32_t)tag.mb);
  put_u64(h + 16, (uint64_t)len);
}

static zb_err tcp_progress(tcp_transport *t, zb_diag *diag);

static zb_err tcp_post(tcp_transport *t, bool is_send, int peer, zb_tag tag, void *buf, size_t len,
                       zb_diag *diag) {
  char tb[48];
  if (t->failed)
    return tcp_failed_before(t, diag);
  if (peer < 0 || peer >= t->nranks || peer == t->rank)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag, "%s %s: peer rank %d is not another rank of 0..%d",
                    is_send ? "send" : "recv", zb_tag_format(tag, tb, sizeof tb), peer, t->nranks - 1);
  if (t->fds[peer] < 0)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag, "%s %s: rank %d is not connected to peer rank %d",
                    is_send ? "send" : "recv", zb_tag_format(tag, tb, sizeof tb), t->rank, peer);
  if (tag.kind != ZB_OP_F && tag.kind != ZB_OP_B)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag, "tag kind must be F or B, not %s", zb_op_name(tag.kind));
  if (len > 0 && !buf)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag, "no buffer for %zu bytes", len);
  if (t->n_ops == t->cap_ops) {
    t->cap_ops = t->cap_ops ? 2 * t->cap_ops : 8;
    t->ops = zb_realloc(t->ops, sizeof *t->ops * (size_t)t->cap_ops);
  }
  tcp_op *op = &t->ops[t->n_ops++];
  *op = (tcp_op){.is_send = is_send, .peer = peer, .tag = tag, .buf = buf, .len = len};
  if (is_send)
    tcp_encode_header(op->hdr, tag, len);
  return t->depth > 0 ? ZB_OK : tcp_progress(t, diag);
}

/* Checks a received header against what op expects. */
static zb_err tcp_check_header(tcp_transport *t, const tcp_op *op, zb_diag *diag) {
  const unsigned char *h = op->hdr;
  char want[48], got[48];
  if (get_u32(h) != TCP_MSG_MAGIC)
    return tcp_fail(t, ZB_ERR_PARSE, diag,
                    "peer rank %d sent a frame that is not a zb message (magic 0x%08x)", op->peer,
                    get_u32(h));
  uint32_t kind = get_u32(h + 4);
  zb_tag tag = {.kind = kind == 'B'   ? ZB_OP_B
                        : kind == 'F' ? ZB_OP_F
                                      : ZB_OP_NONE,
                .stage = (int32_t)get_u32(h + 8),
                .mb = (int32_t)get_u32(h + 12)};
  uint64_t len = get_u64(h + 16);
  if (tag.kind != op->tag.kind || tag.stage != op->tag.stage || tag.mb != op->tag.mb || len != op->len)
    return tcp_fail(t, ZB_ERR_INVALID_SCHEDULE, diag,
                    "rank %d got message %s (%llu bytes) from peer rank %d, expected %s (%zu bytes)", t->rank,
                    zb_tag_format(tag, got, sizeof got), (unsigned long long)len, op->peer,
                    zb_tag_format(op->tag, want, sizeof want), op->len);
  return ZB_OK;
}

/* Moves bytes of op until it completes or the socket would block. */
static zb_err tcp_step_recv(tcp_transport *t, tcp_op *op, bool *moved, zb_diag *diag) {
  int fd = t->fds[op->peer];
  size_t total = TCP_FRAME + op->len;
  char tb[48], eb[96];
  while (op->done < total) {
    ssize_t n;
    if (op->done < TCP_FRAME)
      n = recv(fd, op->hdr + op->done, TCP_FRAME - op->done, 0);
    else
      n = recv(fd, op->buf + (op->done - TCP_FRAME), total - op->done, 0);
    if (n == 0)
      return tcp_fail(t, ZB_ERR_IO, diag,
                      "peer rank %d closed the connection while rank %d was receiving %s (%zu of %zu bytes)",
                      op->peer, t->rank, zb_tag_format(op->tag, tb, sizeof tb),
                      op->done > TCP_FRAME ? op->done - TCP_FRAME : 0, op->len);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return ZB_OK;
      return tcp_fail(t, ZB_ERR_IO, diag,
                      "connection to peer rank %d failed while rank %d was receiving %s: %s", op->peer,
                      t->rank, zb_tag_format(op->tag, tb, sizeof tb), errstr(errno, eb, sizeof eb));
    }
    *moved = true;
    size_t before = op->done;
    op->done += (size_t)n;
    if (before < TCP_FRAME && op->done >= TCP_FRAME) {
      zb_err err = tcp_check_header(t, op, diag);
      if (err)
        return err;
    }
    if (op->done > TCP_FRAME)
      t->stats.bytes_received += (int64_t)(op->done - (before > TCP_FRAME ? before : TCP_FRAME));
  }
  t->stats.messages_received++;
  return ZB_OK;
}

static zb_err tcp_step_send(tcp_transport *t, tcp_op *op, bool *moved, zb_diag *diag) {
  int fd = t->fds[op->peer];
  size_t total = TCP_FRAME + op->len;
  char tb[48], eb[96];
  while (op->done < total) {
    struct iovec iov[2];
    int niov = 0;
    if (op->done < TCP_FRAME)
      iov[niov++] = (struct iovec){.iov_base = op->hdr + op->done, .iov_len = TCP_FRAME - op->done};
    size_t off = op->done > TCP_FRAME ? op->done - TCP_FRAME : 0;
    if (op->len > off)
      iov[niov++] = (struct iovec){.iov_base = op->buf + off, .iov_len = op->len - off};
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)niov};
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return ZB_OK;
      return tcp_fail(t, ZB_ERR_IO, diag,
                      "connection to peer rank %d failed while rank %d was sending %s: %s", op->peer, t->rank,
                      zb_tag_format(op->tag, tb, sizeof tb), errstr(errno, eb, sizeof eb));
    }
    *moved = true;
    size_t before = op->done;
    op->done += (size_t)n;
    if (op->done > TCP_FRAME)
      t->stats.bytes_sent += (int64_t)(op->done - (before > TCP_FRAME ? before : TCP_FRAME));
  }
  t->stats.messages_sent++;
  return ZB_OK;
}

/* Index of the first unfinished op of peer q in direction is_send after
 * index from, or -1. */
static int tcp_next_op(const tcp_transport *t, int q, bool is_send, int from) {
  for (int i = from; i < t->n_ops; i++) {
    const tcp_op *op = &t->ops[i];
    if (op->peer == q && op->is_send == is_send && op->done < TCP_FRAME + op->len)
      return i;
  }
  return -1;
}

/* Fails a group because the stop flag is up, naming what it waited for. */
static zb_err tcp_fail_stopped(tcp_transport *t, zb_diag *diag) {
  char tb[48];
  const tcp_op *op = &t->ops[0];
  for (int i = 0; i < t->n_ops; i++)
    if (t->ops[i].done < TCP_FRAME + t->ops[i].len) {
      op = &t->ops[i];
      break;
    }
  return tcp_fail(t, ZB_ERR_IO, diag,
                  "stopped (stop flag raised) while rank %d waited to %s %s %s peer rank %d", t->rank,
                  op->is_send ? "send" : "receive", zb_tag_format(op->tag, tb, sizeof tb),
                  op->is_send ? "to" : "from", op->peer);
}

/* Runs every posted op to completion. Per peer and direction only the
 * oldest unfinished op moves, which keeps each stream in posting order. */
static zb_err tcp_progress(tcp_transport *t, zb_diag *diag) {
  int64_t last_move = zb_clock_ns();
  char eb[96];
  for (;;) {
    int n = 0;
    for (int q = 0; q < t->nranks; q++) {
      t->send_head[q] = tcp_next_op(t, q, true, 0);
      t->recv_head[q] = tcp_next_op(t, q, false, 0);
      if (t->send_head[q] < 0 && t->recv_head[q] < 0)
        continue;
      t->pfds[n] = (struct pollfd){
          .fd = t->fds[q],
          .events = (short)((t->send_head[q] >= 0 ? POLLOUT : 0) | (t->recv_head[q] >= 0 ? POLLIN : 0))};
      t->pfd_peer[n++] = q;
    }
    if (n == 0) {
      t->n_ops = 0;
      return ZB_OK;
    }
    if (stopped(t))
      return tcp_fail_stopped(t, diag);
    int rc = poll(t->pfds, (nfds_t)n, TCP_POLL_MS);
    if (stopped(t)) /* before the events: a peer that stopped too may have closed already */
      return tcp_fail_stopped(t, diag);
    if (rc < 0 && errno != EINTR)
      return tcp_fail(t, ZB_ERR_IO, diag, "poll: %s", errstr(errno, eb, sizeof eb));
    bool moved = false;
    for (int k = 0; k < n && rc > 0; k++) {
      short re = t->pfds[k].revents;
      int q = t->pfd_peer[k];
      if (!re)
        continue;
      if (re & POLLNVAL)
        return tcp_fail(t, ZB_ERR_IO, diag, "socket of peer rank %d is not open", q);
      for (int i = t->recv_head[q]; i >= 0 && (re & (POLLIN | POLLHUP | POLLERR));
           i = tcp_next_op(t, q, false, i)) {
        zb_err err = tcp_step_recv(t, &t->ops[i], &moved, diag);
        if (err)
          return err;
        if (t->ops[i].done < TCP_FRAME + t->ops[i].len)
          break; /* would block */
      }
      for (int i = t->send_head[q]; i >= 0 && (re & (POLLOUT | POLLHUP | POLLERR));
           i = tcp_next_op(t, q, true, i)) {
        zb_err err = tcp_step_send(t, &t->ops[i], &moved, diag);
        if (err)
          return err;
        if (t->ops[i].done < TCP_FRAME + t->ops[i].len)
          break;
      }
    }
    int64_t now = zb_clock_ns();
    if (moved)
      last_move = now;
    else if (t->idle_timeout_s > 0 && (double)(now - last_move) * 1e-9 > t->idle_timeout_s) {
      int q = t->pfd_peer[0];
      return tcp_fail(t, ZB_ERR_IO, diag, "rank %d: no progress with peer rank %d for %.1f s", t->rank, q,
                      t->idle_timeout_s);
    }
  }
}

static void tcp_group_start(void *self) {
  tcp_transport *t = self;
  t->depth++;
}

static zb_err tcp_group_end(void *self, zb_diag *diag) {
  tcp_transport *t = self;
  if (t->failed)
    return tcp_failed_before(t, diag);
  if (t->depth == 0)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag, "group_end without group_start");
  if (--t->depth > 0)
    return ZB_OK;
  return tcp_progress(t, diag);
}

static zb_err tcp_send(void *self, int peer, zb_tag tag, const void *buf, size_t len, zb_diag *diag) {
  return tcp_post(self, true, peer, tag, (void *)(uintptr_t)buf, len, diag);
}

static zb_err tcp_recv(void *self, int peer, zb_tag tag, void *buf, size_t len, zb_diag *diag) {
  return tcp_post(self, false, peer, tag, buf, len, diag);
}

/* ---- connect: dial higher ranks, accept lower ones, handshake ---- */

typedef enum hs_state { HS_WAIT, HS_DIAL, HS_WRITE, HS_READ, HS_DONE, HS_DROP } hs_state;

typedef struct tcp_hs {
  int fd;
  int peer; /* -1: accepted, not yet known */
  bool outbound;
  hs_state st;
  unsigned char buf[TCP_FRAME];
  size_t done;
  struct addrinfo *ai, *ai_cur; /* outbound: resolved peer address (owned) */
  int64_t next_try, backoff;
  char why[128]; /* outbound: why the last attempt failed */
} tcp_hs;

typedef struct tcp_conn_state {
  tcp_hs *hs;
  int n, cap;
} tcp_conn_state;

static tcp_hs *hs_add(tcp_conn_state *cs) {
  if (cs->n == cs->cap) {
    cs->cap = cs->cap ? 2 * cs->cap : 8;
    cs->hs = zb_realloc(cs->hs, sizeof *cs->hs * (size_t)cs->cap);
  }
  tcp_hs *h = &cs->hs[cs->n++];
  memset(h, 0, sizeof *h);
  h->fd = -1;
  h->peer = -1;
  return h;
}

static void tcp_encode_hello(const tcp_transport *t, unsigned char *b) {
  put_u32(b, TCP_HELLO_MAGIC);
  put_u32(b + 4, TCP_VERSION);
  put_u32(b + 8, (uint32_t)t->rank);
  put_u32(b + 12, (uint32_t)t->nranks);
  put_u64(b + 16, t->session);
}

/* An outbound attempt failed: close and retry after the backoff. */
static void hs_retry(tcp_hs *h, const char *why) {
  if (h->fd >= 0)
    close(h->fd);
  h->fd = -1;
  h->st = HS_WAIT;
  snprintf(h->why, sizeof h->why, "%s", why);
  h->next_try = zb_clock_ns() + h->backoff;
  h->backoff = h->backoff * 2 > TCP_BACKOFF_MAX_NS ? TCP_BACKOFF_MAX_NS : h->backoff * 2;
  h->ai_cur = h->ai_cur && h->ai_cur->ai_next ? h->ai_cur->ai_next : h->ai;
}

static void hs_dial(tcp_hs *h) {
  char eb[96];
  const struct addrinfo *ai = h->ai_cur;
  h->fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (h->fd < 0 || set_nonblocking(h->fd) < 0) {
    hs_retry(h, errstr(errno, eb, sizeof eb));
    return;
  }
  h->done = 0;
  if (connect(h->fd, ai->ai_addr, ai->ai_addrlen) == 0)
    h->st = HS_WRITE;
  else if (errno == EINPROGRESS || errno == EINTR)
    h->st = HS_DIAL;
  else
    hs_retry(h, errstr(errno, eb, sizeof eb));
}

/* Validates a hello from the other end. For accepted connections the peer
 * must be a lower rank we wait for; for dialed ones, the rank we dialed. */
static zb_err hs_check_hello(tcp_transport *t, tcp_hs *h, const bool *need, zb_diag *diag, bool *drop) {
  const unsigned char *b = h->buf;
  *drop = false;
  int r = (int)get_u32(b + 8);
  bool ok = get_u32(b) == TCP_HELLO_MAGIC && get_u32(b + 4) == TCP_VERSION &&
            (int)get_u32(b + 12) == t->nranks && get_u64(b + 16) == t->session;
  if (!h->outbound) { /* strays and leftovers from another job are dropped, not fatal */
    *drop = !ok || r < 0 || r >= t->rank || !need[r] || t->fds[r] >= 0;
    h->peer = r;
    return ZB_OK;
  }
  if (ok && r == t->rank) { /* a dial to our own port's number that met itself: nobody listens there */
    *drop = true;
    return ZB_OK;
  }
  if (get_u32(b) != TCP_HELLO_MAGIC)
    return tcp_fail(t, ZB_ERR_PARSE, diag,
                    "rank %d: the address of peer rank %d answered with a non-zb handshake", t->rank,
                    h->peer);
  if (ok && r != h->peer)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag,
                    "rank %d: the address given for peer rank %d belongs to rank %d", t->rank, h->peer, r);
  if (!ok)
    return tcp_fail(t, ZB_ERR_INVALID_ARG, diag,
                    "rank %d: peer rank %d answered for another job (version, rank count or session differ)",
                    t->rank, h->peer);
  return ZB_OK;
}

/* Advances one handshake on poll events re. */
static zb_err hs_step(tcp_transport *t, tcp_hs *h, short re, const bool *need, zb_diag *diag) {
  char eb[96];
  if (h->st == HS_DIAL) {
    int e = 0;
    socklen_t el = sizeof e;
    if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
      e = errno;
    if (e == 0 && !(re & (POLLOUT | POLLERR | POLLHUP)))
      return ZB_OK;
    if (e != 0 || (re & POLLERR)) {
      hs_retry(h, errstr(e ? e : ECONNREFUSED, eb, sizeof eb));
      return ZB_OK;
    }
    h->st = HS_WRITE;
    h->done = 0;
  }
  if (h->st == HS_WRITE) {
    if (h->done == 0)
      tcp_encode_hello(t, h->buf);
    while (h->done < TCP_FRAME) {
      ssize_t n = send(h->fd, h->buf + h->done, TCP_FRAME - h->done, MSG_NOSIGNAL);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return ZB_OK;
      if (n < 0) {
        if (h->outbound)
          hs_retry(h, errstr(errno, eb, sizeof eb));
        else
          h->st = HS_DROP;
        return ZB_OK;
      }
      h->done += (size_t)n;
    }
    h->done = 0;
    if (h->outbound) {
      h->st = HS_READ;
      return ZB_OK;
    }
    if (t->fds[h->peer] >= 0) { /* a second connection claiming the same rank */
      h->st = HS_DROP;
      return ZB_OK;
    }
    h->st = HS_DONE;
    set_nodelay(h->fd);
    t->fds[h->peer] = h->fd;
    h->fd = -1;
    return ZB_OK;
  }
  if (h->st == HS_READ) {
    while (h->done < TCP_FRAME) {
      ssize_t n = recv(h->fd, h->buf + h->done, TCP_FRAME - h->done, 0);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return ZB_OK;
      if (n <= 0) {
        if (h->outbound)
          hs_retry(h, n == 0 ? "closed during the handshake" : errstr(errno, eb, sizeof eb));
        else
          h->st = HS_DROP;
        return ZB_OK;
      }
      h->done += (size_t)n;
    }
    bool drop;
    zb_err err = hs_check_hello(t, h, need, diag, &drop);
    if (err)
      return err;
    if (drop && h->outbound) {
      hs_retry(h, "connected to itself (nobody listens there)");
    } else if (drop) {
      h->st = HS_DROP;
    } else if (h->outbound) {
      h->st = HS_DONE;
      set_nodelay(h->fd);
      t->fds[h->peer] = h->fd;
      h->fd = -1;
    } else {
      h->st = HS_WRITE; /* answer with our hello */
      h->done = 0;
    }
  }
  return ZB_OK;
}

static void hs_accept_all(tcp_transport *t, tcp_conn_state *cs) {
  for (;;) {
    int fd = accept(t->listen_fd, NULL, NULL);
    if (fd < 0) {
      if (errno == EINTR)
        continue;
      return; /* EAGAIN, or a transient error: the next poll tells */
    }
    if (set_nonblocking(fd) < 0) {
      close(fd);
      continue;
    }
    tcp_hs *h = hs_add(cs);
    h->fd = fd;
    h->st = HS_READ;
  }
}

/* Lists the peers still missing (and why) into buf. */
static void hs_missing(const tcp_transport *t, const tcp_conn_state *cs, const bool *need, char *buf,
                       size_t len) {
  size_t o = 0;
  buf[0] = '\0';
  for (int q = 0; q < t->nranks && o + 1 < len; q++) {
    if (!need[q] || t->fds[q] >= 0)
      continue;
    const char *why = "it did not connect";
    for (int i = 0; i < cs->n; i++)
      if (cs->hs[i].outbound && cs->hs[i].peer == q)
        why = cs->hs[i].why[0] ? cs->hs[i].why : "no answer";
    int w = snprintf(buf + o, len - o, "%speer rank %d (%s)", o ? ", " : "", q, why);
    if (w < 0)
      break;
    o += (size_t)w;
  }
}

static zb_err tcp_connect(void *self, const char *const *addresses, const bool *peers, double timeout_s,
                          zb_diag *diag) {
  tcp_transport *t = self;
  if (t->failed)
    return tcp_failed_before(t, diag);
  bool *need = zb_calloc((size_t)t->nranks, sizeof(bool));
  tcp_conn_state cs = {0};
  struct pollfd *pfds = NULL;
  zb_err err = ZB_OK;
  int64_t start = zb_clock_ns();
  int64_t deadline = timeout_s > 0 && timeout_s < 1e9 ? start + (int64_t)(timeout_s * 1e9) : INT64_MAX;
  char eb[96];

  for (int q = 0; q < t->nranks; q++)
    need[q] = q != t->rank && (!peers || peers[q]);
  for (int q = t->rank + 1; q < t->nranks; q++) {
    if (!need[q] || t->fds[q] >= 0)
      continue;
    const char *addr = addresses ? addresses[q] : NULL;
    tcp_hs *h = hs_add(&cs);
    h->outbound = true;
    h->peer = q;
    h->backoff = TCP_BACKOFF_MIN_NS;
    int rc = addr ? resolve(addr, false, &h->ai) : EAI_NONAME;
    if (rc != 0) {
      err = tcp_fail(t, ZB_ERR_INVALID_ARG, diag, "rank %d: address of peer rank %d (%s): %s", t->rank, q,
                     addr ? addr : "none given", addr ? gai_strerror(rc) : "missing");
      goto cleanup;
    }
    h->ai_cur = h->ai;
  }

  for (;;) {
    bool inbound_missing = false, all = true;
    for (int q = 0; q < t->nranks; q++)
      if (need[q] && t->fds[q] < 0) {
        all = false;
        inbound_missing |= q < t->rank;
      }
    if (all)
      break;
    int64_t now = zb_clock_ns();
    if (stopped(t) || now >= deadline) {
      char missing[200];
      hs_missing(t, &cs, need, missing, sizeof missing);
      err = tcp_fail(t, ZB_ERR_IO, diag, "rank %d: %s connecting to %s", t->rank,
                     stopped(t) ? "stopped (stop flag raised)" : "deadline passed", missing);
      goto cleanup;
    }
    int64_t wake = now + TCP_POLL_MS * 1000000LL;
    if (deadline < wake)
      wake = deadline;
    for (int i = 0; i < cs.n; i++) {
      tcp_hs *h = &cs.hs[i];
      if (h->st == HS_WAIT && h->next_try <= now)
        hs_dial(h);
      if (h->st == HS_WAIT && h->next_try < wake)
        wake = h->next_try;
    }
    pfds = zb_realloc(pfds, sizeof *pfds * (size_t)(cs.n + 1));
    int n = 0;
    if (inbound_missing)
      pfds[n++] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
    for (int i = 0; i < cs.n; i++) {
      tcp_hs *h = &cs.hs[i];
      short ev = h->st == HS_DIAL || h->st == HS_WRITE ? POLLOUT : h->st == HS_READ ? POLLIN : 0;
      /* unused entries still take a slot, with fd -1, which poll() skips */
      pfds[n++] = (struct pollfd){.fd = ev ? h->fd : -1, .events = ev};
    }
    int polled = cs.n; /* entries accepted below have no pollfd this round */
    int64_t wait_ns = wake - zb_clock_ns();
    int rc = poll(pfds, (nfds_t)n, wait_ns > 0 ? (int)((wait_ns + 999999) / 1000000) : 0);
    if (rc < 0 && errno != EINTR) {
      err = tcp_fail(t, ZB_ERR_IO, diag, "rank %d: poll: %s", t->rank, errstr(errno, eb, sizeof eb));
      goto cleanup;
    }
    if (rc <= 0)
      continue;
    int k = 0;
    if (inbound_missing && (pfds[k++].revents & POLLIN))
      hs_accept_all(t, &cs);
    for (int i = 0; i < polled; i++, k++) {
      tcp_hs *h = &cs.hs[i];
      if (pfds[k].fd < 0 || !pfds[k].revents)
        continue;
      err = hs_step(t, h, pfds[k].revents, need, diag);
      if (err)
        goto cleanup;
      if (h->st == HS_DROP) {
        close(h->fd);
        h->fd = -1;
      }
    }
    /* forget finished and dropped inbound entries, keep outbound ones for their reasons */
    int w = 0;
    for (int i = 0; i < cs.n; i++)
      if (cs.hs[i].outbound || (cs.hs[i].st != HS_DONE && cs.hs[i].st != HS_DROP))
        cs.hs[w++] = cs.hs[i];
    cs.n = w;
  }

cleanup:
  for (int i = 0; i < cs.n; i++) {
    if (cs.hs[i].fd >= 0)
      close(cs.hs[i].fd);
    if (cs.hs[i].ai)
      freeaddrinfo(cs.hs[i].ai);
  }
  free(cs.hs);
  free(pfds);
  free(need);
  return err;
}

/* ---- life cycle ---- */

static const char *tcp_address(void *self) {
  return ((tcp_transport *)self)->address;
}

static void tcp_stats(void *self, zb_transport_stats *out) {
  *out = ((tcp_transport *)self)->stats;
}

static void tcp_abort(void *self, const char *why) {
  tcp_transport *t = self;
  if (!t->failed)
    tcp_fail(t, ZB_ERR_IO, NULL, "rank %d aborted: %s", t->rank, why ? why : "no reason given");
}

static void tcp_free(void *self) {
  tcp_transport *t = self;
  for (int q = 0; q < t->nranks; q++)
    if (t->fds[q] >= 0)
      close(t->fds[q]);
  if (t->listen_fd >= 0)
    close(t->listen_fd);
  free(t->fds);
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
    .connect = tcp_connect,
    .group_start = tcp_group_start,
    .send = tcp_send,
    .recv = tcp_recv,
    .group_end = tcp_group_end,
    .stats = tcp_stats,
    .abort = tcp_abort,
    .free = tcp_free,
};

/* Binds and listens on the first of the resolved addresses that works. */
static zb_err tcp_listen(tcp_transport *t, const char *addr, zb_diag *diag) {
  struct addrinfo *ai = NULL;
  int rc = resolve(addr, true, &ai);
  if (rc != 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "rank %d: listen address \"%s\": %s", t->rank, addr,
                       rc == EAI_NONAME ? "expected host:port" : gai_strerror(rc));
  int e = 0;
  for (struct addrinfo *a = ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) {
      e = errno;
      continue;
    }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, 128) == 0 && set_nonblocking(fd) == 0) {
      t->listen_fd = fd;
      break;
    }
    e = errno;
    close(fd);
  }
  freeaddrinfo(ai);
  char eb[96];
  if (t->listen_fd < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "rank %d: cannot listen on %s: %s", t->rank, addr,
                       errstr(e, eb, sizeof eb));
  struct sockaddr_storage ss;
  socklen_t sl = sizeof ss;
  if (getsockname(t->listen_fd, (struct sockaddr *)&ss, &sl) < 0)
    return zb_diag_set(diag, ZB_ERR_IO, "rank %d: getsockname: %s", t->rank, errstr(errno, eb, sizeof eb));
  format_sockaddr(&ss, t->address, sizeof t->address);
  return ZB_OK;
}

zb_err zb_transport_tcp_new(const zb_tcp_config *cfg, zb_transport **out, zb_diag *diag) {
  if (cfg->nranks < 1 || cfg->rank < 0 || cfg->rank >= cfg->nranks)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tcp transport: rank %d is not in 0..%d", cfg->rank,
                       cfg->nranks - 1);
  if (!cfg->listen)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "tcp transport: no listen address");
  tcp_transport *t = zb_calloc(1, sizeof *t);
  t->rank = cfg->rank;
  t->nranks = cfg->nranks;
  t->session = cfg->session;
  t->stop = cfg->stop;
  t->idle_timeout_s = cfg->idle_timeout_s;
  t->listen_fd = -1;
  size_t p = (size_t)cfg->nranks;
  t->fds = zb_malloc(sizeof(int) * p);
  for (size_t q = 0; q < p; q++)
    t->fds[q] = -1;
  t->pfds = zb_calloc(p + 1, sizeof *t->pfds);
  t->pfd_peer = zb_calloc(p + 1, sizeof(int));
  t->send_head = zb_calloc(p, sizeof(int));
  t->recv_head = zb_calloc(p, sizeof(int));
  zb_err err = tcp_listen(t, cfg->listen, diag);
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
