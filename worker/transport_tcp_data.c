/* transport_tcp_data.c — the tcp transport's progress engine
 * (transport_tcp.h): posted sends and receives, moved by one poll() loop
 * per group, each stream in posting order, every frame MAC'd as its bytes
 * move (transport_tcp.h, Frame MACs). */
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
  put_u32(h + 4, zbtcp_kind_byte(tag.kind));
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
  if (!zbtcp_kind_byte(tag.kind))
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "tag kind must be F, B or REDUCE_GRAD, not %s",
                      zb_op_name(tag.kind));
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

static zb_err tcp_fail_crypto(tcp_transport *t, zb_diag *diag) {
  return zbtcp_fail(t, ZB_ERR_IO, diag, "rank %d: libcrypto could not compute a frame MAC", t->rank);
}

/* Fails t: frame seq from op's peer failed its MAC (the header's or the
 * whole frame's). */
static zb_err tcp_fail_mac(tcp_transport *t, const tcp_op *op, uint64_t seq, const char *which,
                           zb_diag *diag) {
  return zbtcp_fail(t, ZB_ERR_IO, diag,
                    "frame %llu from rank %d (%s) failed its %s: the data plane was changed in transit "
                    "(or frames were dropped, replayed or reordered)",
                    (unsigned long long)seq, op->peer, t->links[op->peer].address, which);
}

/* Checks a received header: its tag first (so a frame changed on the way
 * is named as that), then against what op expects. Then starts the
 * frame's MAC. */
static zb_err tcp_header_arrived(tcp_transport *t, tcp_op *op, zb_diag *diag) {
  char want[48], got[48];
  tcp_link *l = &t->links[op->peer];
  unsigned char tag[TCP_TAG];
  if (!zbtcp_header_tag(l->rx, l->rx_seq, op->hdr, tag))
    return tcp_fail_crypto(t, diag);
  if (!zbtcp_tag_equal(tag, op->hdr + TCP_FIELDS))
    return tcp_fail_mac(t, op, l->rx_seq, "header MAC", diag);
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
  zbtcp_frame_begin(l->rx, l->rx_seq, op->hdr);
  return ZB_OK;
}

/* The frame tag of op has arrived: the receive completes only if it is
 * the MAC of the frame. */
static zb_err tcp_trailer_arrived(tcp_transport *t, tcp_op *op, zb_diag *diag) {
  tcp_link *l = &t->links[op->peer];
  unsigned char tag[TCP_TAG];
  if (!zbtcp_frame_end(l->rx, tag))
    return tcp_fail_crypto(t, diag);
  if (!zbtcp_tag_equal(tag, op->trailer))
    return tcp_fail_mac(t, op, l->rx_seq, "MAC", diag);
  l->rx_seq++;
  return ZB_OK;
}

/* After a send or receive failed (errno): *retry for EINTR; ZB_OK without
 * it when the socket would block (go on later); else op's connection has
 * failed, named with what rank was doing. */
static zb_err tcp_io_error(tcp_transport *t, const tcp_op *op, const char *doing, bool *retry,
                           zb_diag *diag) {
  int e = errno;
  *retry = e == EINTR;
  if (*retry || e == EAGAIN || e == EWOULDBLOCK)
    return ZB_OK;
  char tb[48], eb[96];
  t->failed_by_peer = e == ECONNRESET || e == EPIPE; /* the first failure, as in tcp_step_recv */
  return zbtcp_fail(t, ZB_ERR_IO, diag, "connection to peer rank %d failed while rank %d was %s %s: %s",
                    op->peer, t->rank, doing, zb_tag_format(op->tag, tb, sizeof tb),
                    zbtcp_errstr(e, eb, sizeof eb));
}

/* The payload bytes among op's bytes [from, from + n) on the wire: *off
 * into the payload, and how many. */
static size_t tcp_payload_span(const tcp_op *op, size_t from, size_t n, size_t *off) {
  size_t lo = from > TCP_FRAME ? from : TCP_FRAME,
         hi = from + n < TCP_FRAME + op->len ? from + n : TCP_FRAME + op->len;
  *off = lo - TCP_FRAME;
  return hi > lo ? hi - lo : 0;
}

/* Reads into the part of op the next bytes belong to: the header, the
 * payload or the frame tag, never past it. */
static ssize_t tcp_recv_part(int fd, tcp_op *op) {
  size_t body = TCP_FRAME + op->len;
  if (op->done < TCP_FRAME)
    return recv(fd, op->hdr + op->done, TCP_FRAME - op->done, 0);
  if (op->done < body)
    return recv(fd, op->buf + (op->done - TCP_FRAME), body - op->done, 0);
  return recv(fd, op->trailer + (op->done - body), tcp_op_total(op) - op->done, 0);
}

/* op received n more bytes: MACs the payload among them, checks the
 * header and the frame tag when they are complete. */
static zb_err tcp_received(tcp_transport *t, tcp_op *op, size_t n, zb_diag *diag) {
  size_t before = op->done, off;
  op->done += n;
  size_t payload = tcp_payload_span(op, before, n, &off);
  if (payload > 0) {
    zbtcp_frame_add(t->links[op->peer].rx, op->buf + off, payload);
    t->stats.bytes_received += (int64_t)payload;
  }
  if (before < TCP_FRAME && op->done == TCP_FRAME)
    return tcp_header_arrived(t, op, diag);
  if (op->done == tcp_op_total(op))
    return tcp_trailer_arrived(t, op, diag);
  return ZB_OK;
}

/* Moves bytes of op until it completes or the socket would block. */
static zb_err tcp_step_recv(tcp_transport *t, tcp_op *op, bool *moved, zb_diag *diag) {
  int fd = t->fds[op->peer];
  char tb[48];
  while (op->done < tcp_op_total(op)) {
    ssize_t n = tcp_recv_part(fd, op);
    if (n == 0) {
      t->failed_by_peer = true; /* the first failure: a failed transport has no ops to step */
      return zbtcp_fail(
          t, ZB_ERR_IO, diag,
          "peer rank %d closed the connection while rank %d was receiving %s (%zu of %zu bytes)", op->peer,
          t->rank, zb_tag_format(op->tag, tb, sizeof tb), op->done > TCP_FRAME ? op->done - TCP_FRAME : 0,
          op->len);
    }
    if (n < 0) {
      bool retry;
      zb_err err = tcp_io_error(t, op, "receiving", &retry, diag);
      if (err || !retry)
        return err;
      continue;
    }
    *moved = true;
    zb_err err = tcp_received(t, op, (size_t)n, diag);
    if (err)
      return err;
  }
  t->stats.messages_received++;
  return ZB_OK;
}

/* The send op moves first: it takes the next frame number of its
 * connection, tags its header and starts its frame MAC. */
static zb_err tcp_begin_send(tcp_transport *t, tcp_op *op, zb_diag *diag) {
  tcp_link *l = &t->links[op->peer];
  uint64_t seq = l->tx_seq++;
  op->begun = true;
  if (!zbtcp_header_tag(l->tx, seq, op->hdr, op->hdr + TCP_FIELDS))
    return tcp_fail_crypto(t, diag);
  zbtcp_frame_begin(l->tx, seq, op->hdr);
  return ZB_OK;
}

/* The iovecs of what op sends next: the rest of its header and payload,
 * or (once they are out and the tag is made) the rest of its tag. */
static int tcp_send_parts(tcp_op *op, struct iovec iov[2]) {
  size_t body = TCP_FRAME + op->len;
  int niov = 0;
  if (op->done >= body) {
    iov[niov++] =
        (struct iovec){.iov_base = op->trailer + (op->done - body), .iov_len = tcp_op_total(op) - op->done};
    return niov;
  }
  if (op->done < TCP_FRAME)
    iov[niov++] = (struct iovec){.iov_base = op->hdr + op->done, .iov_len = TCP_FRAME - op->done};
  size_t off = op->done > TCP_FRAME ? op->done - TCP_FRAME : 0;
  if (op->len > off)
    iov[niov++] = (struct iovec){.iov_base = op->buf + off, .iov_len = op->len - off};
  return niov;
}

static zb_err tcp_step_send(tcp_transport *t, tcp_op *op, bool *moved, zb_diag *diag) {
  int fd = t->fds[op->peer];
  zbtcp_frame_mac *mac = t->links[op->peer].tx;
  size_t body = TCP_FRAME + op->len;
  if (!op->begun) {
    zb_err err = tcp_begin_send(t, op, diag);
    if (err)
      return err;
  }
  while (op->done < tcp_op_total(op)) {
    struct iovec iov[2];
    struct msghdr msg = {.msg_iov = iov, .msg_iovlen = (size_t)tcp_send_parts(op, iov)};
    ssize_t n = sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      bool retry;
      zb_err err = tcp_io_error(t, op, "sending", &retry, diag);
      if (err || !retry)
        return err;
      continue;
    }
    size_t before = op->done, off;
    op->done += (size_t)n;
    *moved = true;
    size_t payload = tcp_payload_span(op, before, (size_t)n, &off);
    if (payload > 0) {
      zbtcp_frame_add(mac, op->buf + off, payload);
      t->stats.bytes_sent += (int64_t)payload;
    }
    /* header and payload are out: the tag follows */
    if (before < body && op->done == body && !zbtcp_frame_end(mac, op->trailer))
      return tcp_fail_crypto(t, diag);
  }
  t->stats.messages_sent++;
  return ZB_OK;
}

/* Index of the first unfinished op of peer q in direction is_send after
 * index from, or -1. */
static int tcp_next_op(const tcp_transport *t, int q, bool is_send, int from) {
  for (int i = from; i < t->n_ops; i++) {
    const tcp_op *op = &t->ops[i];
    if (op->peer == q && op->is_send == is_send && op->done < tcp_op_total(op))
      return i;
  }
  return -1;
}

/* Fails a group because the stop flag is up, naming what it waited for. */
static zb_err tcp_fail_stopped(tcp_transport *t, zb_diag *diag) {
  char tb[48];
  const tcp_op *op = &t->ops[0];
  for (int i = 0; i < t->n_ops; i++)
    if (t->ops[i].done < tcp_op_total(&t->ops[i])) {
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
        if (t->ops[i].done < tcp_op_total(&t->ops[i]))
          break; /* would block */
      }
      for (int i = t->send_head[q]; i >= 0 && (re & (POLLOUT | POLLHUP | POLLERR));
           i = tcp_next_op(t, q, true, i)) {
        zb_err err = tcp_step_send(t, &t->ops[i], &moved, diag);
        if (err)
          return err;
        if (t->ops[i].done < tcp_op_total(&t->ops[i]))
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
