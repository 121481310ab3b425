/* transport_tcp_data.c — the tcp transport's progress engine
 * (transport_tcp.h): posted sends and receives, moved by one poll() loop
 * per group, each stream in posting order. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "transport_tcp.h"
#include "zb_alloc.h"
#include "zb_clock.h"

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
    return zbtcp_failed_before(t, diag);
  if (peer < 0 || peer >= t->nranks || peer == t->rank)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "%s %s: peer rank %d is not another rank of 0..%d",
                      is_send ? "send" : "recv", zb_tag_format(tag, tb, sizeof tb), peer, t->nranks - 1);
  if (t->fds[peer] < 0)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "%s %s: rank %d is not connected to peer rank %d",
                      is_send ? "send" : "recv", zb_tag_format(tag, tb, sizeof tb), t->rank, peer);
  if (tag.kind != ZB_OP_F && tag.kind != ZB_OP_B)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "tag kind must be F or B, not %s", zb_op_name(tag.kind));
  if (len > 0 && !buf)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "no buffer for %zu bytes", len);
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
  char want[48], got[48];
  zbtcp_frame f;
  zb_diag why;
  if (zbtcp_frame_parse(op->hdr, TCP_FRAME, &f, &why) != ZB_OK)
    return zbtcp_fail(t, ZB_ERR_PARSE, diag, "peer rank %d sent a frame that is not a zb message (%s)",
                      op->peer, why.msg);
  if (f.tag.kind != op->tag.kind || f.tag.stage != op->tag.stage || f.tag.mb != op->tag.mb ||
      f.len != op->len)
    return zbtcp_fail(t, ZB_ERR_INVALID_SCHEDULE, diag,
                      "rank %d got message %s (%llu bytes) from peer rank %d, expected %s (%zu bytes)",
                      t->rank, zb_tag_format(f.tag, got, sizeof got), (unsigned long long)f.len, op->peer,
                      zb_tag_format(op->tag, want, sizeof want), op->len);
  return ZB_OK;
}

/* After a send or receive failed (errno): *retry for EINTR; ZB_OK without
 * it when the socket would block (go on later); else op's connection has
 * failed, named with what rank was doing. */
static zb_err tcp_io_error(tcp_transport *t, const tcp_op *op, const char *doing, bool *retry,
                           zb_diag *diag) {
  *retry = errno == EINTR;
  if (*retry || errno == EAGAIN || errno == EWOULDBLOCK)
    return ZB_OK;
  char tb[48], eb[96];
  return zbtcp_fail(t, ZB_ERR_IO, diag, "connection to peer rank %d failed while rank %d was %s %s: %s",
                    op->peer, t->rank, doing, zb_tag_format(op->tag, tb, sizeof tb),
                    zbtcp_errstr(errno, eb, sizeof eb));
}

/* Advances op by n bytes moved; returns how many of them were payload
 * (past the frame header). */
static int64_t tcp_advance(tcp_op *op, size_t n, bool *moved) {
  size_t before = op->done;
  op->done += n;
  *moved = true;
  return op->done > TCP_FRAME ? (int64_t)(op->done - (before > TCP_FRAME ? before : TCP_FRAME)) : 0;
}

/* Moves bytes of op until it completes or the socket would block. */
static zb_err tcp_step_recv(tcp_transport *t, tcp_op *op, bool *moved, zb_diag *diag) {
  int fd = t->fds[op->peer];
  size_t total = TCP_FRAME + op->len;
  char tb[48];
  while (op->done < total) {
    ssize_t n;
    if (op->done < TCP_FRAME)
      n = recv(fd, op->hdr + op->done, TCP_FRAME - op->done, 0);
    else
      n = recv(fd, op->buf + (op->done - TCP_FRAME), total - op->done, 0);
    if (n == 0)
      return zbtcp_fail(
          t, ZB_ERR_IO, diag,
          "peer rank %d closed the connection while rank %d was receiving %s (%zu of %zu bytes)", op->peer,
          t->rank, zb_tag_format(op->tag, tb, sizeof tb), op->done > TCP_FRAME ? op->done - TCP_FRAME : 0,
          op->len);
    if (n < 0) {
      bool retry;
      zb_err err = tcp_io_error(t, op, "receiving", &retry, diag);
      if (err || !retry)
        return err;
      continue;
    }
    size_t before = op->done;
    t->stats.bytes_received += tcp_advance(op, (size_t)n, moved);
    if (before < TCP_FRAME && op->done >= TCP_FRAME) {
      zb_err err = tcp_check_header(t, op, diag);
      if (err)
        return err;
    }
  }
  t->stats.messages_received++;
  return ZB_OK;
}

static zb_err tcp_step_send(tcp_transport *t, tcp_op *op, bool *moved, zb_diag *diag) {
  int fd = t->fds[op->peer];
  size_t total = TCP_FRAME + op->len;
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
      bool retry;
      zb_err err = tcp_io_error(t, op, "sending", &retry, diag);
      if (err || !retry)
        return err;
      continue;
    }
    t->stats.bytes_sent += tcp_advance(op, (size_t)n, moved);
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
  return zbtcp_fail(t, ZB_ERR_IO, diag,
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
    if (tcp_stopped(t))
      return tcp_fail_stopped(t, diag);
    int rc = poll(t->pfds, (nfds_t)n, TCP_POLL_MS);
    if (tcp_stopped(t)) /* before the events: a peer that stopped too may have closed already */
      return tcp_fail_stopped(t, diag);
    if (rc < 0 && errno != EINTR)
      return zbtcp_fail(t, ZB_ERR_IO, diag, "poll: %s", zbtcp_errstr(errno, eb, sizeof eb));
    bool moved = false;
    for (int k = 0; k < n && rc > 0; k++) {
      short re = t->pfds[k].revents;
      int q = t->pfd_peer[k];
      if (!re)
        continue;
      if (re & POLLNVAL)
        return zbtcp_fail(t, ZB_ERR_IO, diag, "socket of peer rank %d is not open", q);
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
      return zbtcp_fail(t, ZB_ERR_IO, diag, "rank %d: no progress with peer rank %d for %.1f s", t->rank, q,
                        t->idle_timeout_s);
    }
  }
}

void zbtcp_group_start(void *self) {
  tcp_transport *t = self;
  t->depth++;
}

zb_err zbtcp_group_end(void *self, zb_diag *diag) {
  tcp_transport *t = self;
  if (t->failed)
    return zbtcp_failed_before(t, diag);
  if (t->depth == 0)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "group_end without group_start");
  if (--t->depth > 0)
    return ZB_OK;
  return tcp_progress(t, diag);
}

zb_err zbtcp_send(void *self, int peer, zb_tag tag, const void *buf, size_t len, zb_diag *diag) {
  return tcp_post(self, true, peer, tag, (void *)(uintptr_t)buf, len, diag);
}

zb_err zbtcp_recv(void *self, int peer, zb_tag tag, void *buf, size_t len, zb_diag *diag) {
  return tcp_post(self, false, peer, tag, buf, len, diag);
}
