/* transport_tcp_connect.c — connecting the tcp transport (transport_tcp.h):
 * each rank dials the higher ranks it needs (retrying with backoff until
 * the deadline) and accepts the lower ones; the dialer sends its hello,
 * the acceptor checks it and answers with its own and a MAC, the dialer
 * checks that and sends its proof, the acceptor checks the proof. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport_tcp.h"
#include "zb_alloc.h"
#include "zb_clock.h"

typedef enum hs_state { HS_WAIT, HS_DIAL, HS_WRITE, HS_READ, HS_DONE, HS_DROP } hs_state;

typedef struct tcp_hs {
  int fd;
  int peer; /* -1: accepted, not yet known */
  bool outbound;
  hs_state st;
  bool proving; /* past the hellos: the dialer writes, the acceptor reads the proof */
  unsigned char buf[TCP_HELLO_FRAME];
  size_t done;
  unsigned char mine[TCP_NONCE], theirs[TCP_NONCE];
  struct addrinfo *ai, *ai_cur; /* outbound: resolved peer address (owned) */
  int64_t next_try, backoff;
  char why[128]; /* outbound: why the last attempt failed */
} tcp_hs;

typedef struct tcp_conn_state {
  tcp_hs *hs;
  int n, cap;
  struct pollfd *pfds; /* one round's scratch: the listener, then one per handshake */
  char refused[128];   /* why the last inbound hello of another protocol version was dropped */
} tcp_conn_state;

static void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

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

/* Our next handshake frame into h->buf: the dialer's hello (no MAC), the
 * acceptor's hello (its MAC), or the dialer's proof. */
static void tcp_encode_hello(const tcp_transport *t, tcp_hs *h) {
  unsigned char *b = h->buf;
  memset(b, 0, TCP_HELLO_FRAME);
  put_u32(b, h->proving ? TCP_PROOF_MAGIC : TCP_HELLO_MAGIC);
  put_u32(b + 4, TCP_VERSION);
  put_u32(b + 8, (uint32_t)t->rank);
  put_u32(b + 12, (uint32_t)t->nranks);
  put_u64(b + 16, t->session);
  if (h->proving) {
    zbtcp_mac(t, "zb-tcp-dial", h->mine, h->theirs, t->rank, h->peer, b + 40);
    return;
  }
  zbtcp_nonce(h->mine);
  memcpy(b + 24, h->mine, TCP_NONCE);
  if (!h->outbound)
    zbtcp_mac(t, "zb-tcp-accept", h->theirs, h->mine, h->peer, t->rank, b + 40);
}

/* An outbound attempt failed: close and retry after the backoff. */
static void hs_retry(tcp_hs *h, const char *why) {
  if (h->fd >= 0)
    close(h->fd);
  h->fd = -1;
  h->st = HS_WAIT;
  h->proving = false;
  snprintf(h->why, sizeof h->why, "%s", why);
  h->next_try = zb_clock_ns() + h->backoff;
  h->backoff = h->backoff * 2 > TCP_BACKOFF_MAX_NS ? TCP_BACKOFF_MAX_NS : h->backoff * 2;
  h->ai_cur = h->ai_cur && h->ai_cur->ai_next ? h->ai_cur->ai_next : h->ai;
}

static void hs_dial(tcp_hs *h) {
  char eb[96];
  const struct addrinfo *ai = h->ai_cur;
  h->fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
  if (h->fd < 0 || zbtcp_set_nonblocking(h->fd) < 0) {
    hs_retry(h, zbtcp_errstr(errno, eb, sizeof eb));
    return;
  }
  zbtcp_set_buffers(h->fd);
  h->done = 0;
  if (connect(h->fd, ai->ai_addr, ai->ai_addrlen) == 0)
    h->st = HS_WRITE;
  else if (errno == EINPROGRESS || errno == EINTR)
    h->st = HS_DIAL;
  else
    hs_retry(h, zbtcp_errstr(errno, eb, sizeof eb));
}

/* An inbound hello of another protocol version: noted for the connect
 * deadline's message, and answered (best effort, before the drop) with
 * our own hello, which carries our version and no MAC, so an older dialer
 * fails at once naming the version instead of retrying until its
 * deadline. */
static void hs_refuse_version(const tcp_transport *t, tcp_hs *h, tcp_conn_state *cs, const char *why) {
  snprintf(cs->refused, sizeof cs->refused, "a dialer was refused: %s", why);
  unsigned char b[TCP_HELLO_FRAME] = {0};
  put_u32(b, TCP_HELLO_MAGIC);
  put_u32(b + 4, TCP_VERSION);
  put_u32(b + 8, (uint32_t)t->rank);
  put_u32(b + 12, (uint32_t)t->nranks);
  put_u64(b + 16, t->session);
  (void)!send(h->fd, b, sizeof b, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Validates a hello from the other end. For accepted connections the peer
 * must be a lower rank we wait for; for dialed ones, the rank we dialed. */
static zb_err hs_check_hello(tcp_transport *t, tcp_hs *h, tcp_conn_state *cs, const bool *need, zb_diag *diag,
                             bool *drop) {
  zbtcp_frame f;
  zb_diag why = {{0}};
  bool parsed = zbtcp_frame_parse(h->buf, TCP_HELLO_FRAME, &f, &why) == ZB_OK;
  bool other_version = !parsed && f.magic == TCP_HELLO_MAGIC && get_u32(h->buf + 4) != TCP_VERSION;
  *drop = false;
  if (other_version && !h->outbound)
    hs_refuse_version(t, h, cs, why.msg);
  int r = parsed ? f.rank : -1;
  bool ok = parsed && f.magic == TCP_HELLO_MAGIC && f.nranks == t->nranks && f.session == t->session;
  if (parsed)
    memcpy(h->theirs, f.nonce, TCP_NONCE);
  if (!h->outbound) { /* strays and leftovers from another job are dropped, not fatal */
    *drop = !ok || r >= t->rank || !need[r] || t->fds[r] >= 0;
    h->peer = r;
    return ZB_OK;
  }
  if (ok && r == t->rank) { /* a dial to our own port's number that met itself: nobody listens there */
    *drop = true;
    return ZB_OK;
  }
  if (other_version)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag,
                      "rank %d: peer rank %d speaks another data-plane protocol (%s): run the same zb "
                      "release on every worker",
                      t->rank, h->peer, why.msg);
  if (f.magic != TCP_HELLO_MAGIC)
    return zbtcp_fail(t, ZB_ERR_PARSE, diag,
                      "rank %d: the address of peer rank %d answered with a non-zb handshake", t->rank,
                      h->peer);
  if (ok && r != h->peer)
    return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag,
                      "rank %d: the address given for peer rank %d belongs to rank %d", t->rank, h->peer, r);
  if (!ok)
    return zbtcp_fail(
        t, ZB_ERR_INVALID_ARG, diag,
        "rank %d: peer rank %d answered for another job (version, rank count or session differ)", t->rank,
        h->peer);
  if (!zbtcp_mac_ok(t, "zb-tcp-accept", h->mine, h->theirs, t->rank, h->peer, f.mac))
    return zbtcp_fail(
        t, ZB_ERR_INVALID_ARG, diag,
        "rank %d: the address of peer rank %d failed the data-plane authentication (it does not "
        "hold this job's data secret)",
        t->rank, h->peer);
  return ZB_OK;
}

/* The acceptor's last step: the dialer's proof. A connection that does
 * not prove the secret is dropped, never counted: a stranger cannot take
 * the rank's place. */
static bool hs_proof_ok(const tcp_transport *t, const tcp_hs *h) {
  zbtcp_frame f;
  return zbtcp_frame_parse(h->buf, TCP_HELLO_FRAME, &f, NULL) == ZB_OK && f.magic == TCP_PROOF_MAGIC &&
         f.rank == h->peer && zbtcp_mac_ok(t, "zb-tcp-dial", h->theirs, h->mine, h->peer, t->rank, f.mac);
}

/* The connection of h is established: it becomes the transport's
 * connection to h->peer, with frame MACs keyed from this handshake
 * (transport_tcp.h, Frame MACs). */
static zb_err hs_connected(tcp_transport *t, tcp_hs *h, zb_diag *diag) {
  bool dialer = h->outbound;
  unsigned char to_acceptor[TCP_MAC], to_dialer[TCP_MAC];
  zbtcp_frame_keys(t, dialer ? h->mine : h->theirs, dialer ? h->theirs : h->mine, dialer ? t->rank : h->peer,
                   dialer ? h->peer : t->rank, to_acceptor, to_dialer);
  tcp_link *l = &t->links[h->peer];
  l->tx = dialer ? zbtcp_frame_mac_new(to_acceptor, TCP_DIR_TO_ACCEPTOR)
                 : zbtcp_frame_mac_new(to_dialer, TCP_DIR_TO_DIALER);
  l->rx = dialer ? zbtcp_frame_mac_new(to_dialer, TCP_DIR_TO_DIALER)
                 : zbtcp_frame_mac_new(to_acceptor, TCP_DIR_TO_ACCEPTOR);
  OPENSSL_cleanse(to_acceptor, sizeof to_acceptor);
  OPENSSL_cleanse(to_dialer, sizeof to_dialer);
  if (!l->tx || !l->rx)
    return zbtcp_fail(t, ZB_ERR_IO, diag, "rank %d: libcrypto could not make the frame MACs of peer rank %d",
                      t->rank, h->peer);
  h->st = HS_DONE;
  set_nodelay(h->fd);
  t->fds[h->peer] = h->fd;
  h->fd = -1;
  return ZB_OK;
}

/* HS_DIAL: the non-blocking connect finished (HS_WRITE), failed (retry),
 * or is still under way (unchanged). */
static void hs_step_dial(tcp_hs *h, short re) {
  char eb[96];
  int e = 0;
  socklen_t el = sizeof e;
  if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &el) < 0)
    e = errno;
  if (e == 0 && !(re & (POLLOUT | POLLERR | POLLHUP)))
    return;
  if (e != 0 || (re & POLLERR)) {
    hs_retry(h, zbtcp_errstr(e ? e : ECONNREFUSED, eb, sizeof eb));
    return;
  }
  h->st = HS_WRITE;
  h->done = 0;
}

/* HS_WRITE: sends our hello or proof. Then a dialer reads the answer (or,
 * after its proof, is connected); an acceptor reads the proof. */
static zb_err hs_step_write(tcp_transport *t, tcp_hs *h, zb_diag *diag) {
  char eb[96];
  if (h->done == 0)
    tcp_encode_hello(t, h);
  while (h->done < TCP_HELLO_FRAME) {
    ssize_t n = send(h->fd, h->buf + h->done, TCP_HELLO_FRAME - h->done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return ZB_OK;
    if (n < 0) {
      if (h->outbound)
        hs_retry(h, zbtcp_errstr(errno, eb, sizeof eb));
      else
        h->st = HS_DROP;
      return ZB_OK;
    }
    h->done += (size_t)n;
  }
  h->done = 0;
  if (h->outbound && h->proving)
    return hs_connected(t, h, diag);
  h->st = HS_READ;
  h->proving = !h->outbound; /* the acceptor reads the proof next */
  return ZB_OK;
}

/* HS_READ: reads and checks the other end's hello (a dialer then sends its
 * proof; an acceptor answers with its own hello), or, on the acceptor,
 * the dialer's proof (then connected). */
static zb_err hs_step_read(tcp_transport *t, tcp_hs *h, tcp_conn_state *cs, const bool *need, zb_diag *diag) {
  char eb[96];
  while (h->done < TCP_HELLO_FRAME) {
    ssize_t n = recv(h->fd, h->buf + h->done, TCP_HELLO_FRAME - h->done, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return ZB_OK;
    if (n <= 0) {
      if (h->outbound)
        hs_retry(h, n == 0 ? "closed during the handshake" : zbtcp_errstr(errno, eb, sizeof eb));
      else
        h->st = HS_DROP;
      return ZB_OK;
    }
    h->done += (size_t)n;
  }
  h->done = 0;
  if (h->proving) { /* the acceptor, with the dialer's proof */
    if (!hs_proof_ok(t, h) || t->fds[h->peer] >= 0) {
      h->st = HS_DROP; /* no proof, or a second connection claiming the same rank */
      return ZB_OK;
    }
    return hs_connected(t, h, diag);
  }
  bool drop;
  zb_err err = hs_check_hello(t, h, cs, need, diag, &drop);
  if (err)
    return err;
  if (drop && h->outbound) {
    hs_retry(h, "connected to itself (nobody listens there)");
  } else if (drop) {
    h->st = HS_DROP;
  } else {
    h->st = HS_WRITE; /* the dialer's proof, or the acceptor's hello */
    h->proving = h->outbound;
  }
  return ZB_OK;
}

/* Advances one handshake on poll events re. A finished dial goes on to
 * write in the same call. */
static zb_err hs_step(tcp_transport *t, tcp_hs *h, tcp_conn_state *cs, short re, const bool *need,
                      zb_diag *diag) {
  if (h->st == HS_DIAL)
    hs_step_dial(h, re);
  if (h->st == HS_WRITE)
    return hs_step_write(t, h, diag);
  if (h->st == HS_READ)
    return hs_step_read(t, h, cs, need, diag);
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
    if (zbtcp_set_nonblocking(fd) < 0) {
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
    const char *why = q < t->rank && cs->refused[0] ? cs->refused : "it did not connect";
    for (int i = 0; i < cs->n; i++)
      if (cs->hs[i].outbound && cs->hs[i].peer == q)
        why = cs->hs[i].why[0] ? cs->hs[i].why : "no answer";
    int w = snprintf(buf + o, len - o, "%speer rank %d (%s)", o ? ", " : "", q, why);
    if (w < 0)
      break;
    o += (size_t)w;
  }
}

/* One outbound handshake per needed higher rank not yet connected, with
 * its address resolved. */
static zb_err hs_start_dials(tcp_transport *t, tcp_conn_state *cs, const bool *need,
                             const char *const *addresses, zb_diag *diag) {
  for (int q = t->rank + 1; q < t->nranks; q++) {
    if (!need[q] || t->fds[q] >= 0)
      continue;
    const char *addr = addresses ? addresses[q] : NULL;
    tcp_hs *h = hs_add(cs);
    h->outbound = true;
    h->peer = q;
    h->backoff = TCP_BACKOFF_MIN_NS;
    int rc = addr ? zbtcp_resolve(addr, false, &h->ai) : EAI_NONAME;
    if (rc != 0)
      return zbtcp_fail(t, ZB_ERR_INVALID_ARG, diag, "rank %d: address of peer rank %d (%s): %s", t->rank, q,
                        addr ? addr : "none given", addr ? gai_strerror(rc) : "missing");
    h->ai_cur = h->ai;
  }
  return ZB_OK;
}

/* True when every needed peer is connected; *inbound_missing: a lower
 * rank (one that dials us) is not yet. */
static bool hs_all_connected(const tcp_transport *t, const bool *need, bool *inbound_missing) {
  bool all = true;
  *inbound_missing = false;
  for (int q = 0; q < t->nranks; q++)
    if (need[q] && t->fds[q] < 0) {
      all = false;
      *inbound_missing |= q < t->rank;
    }
  return all;
}

/* Dials the handshakes whose backoff has passed; returns when the next
 * round must wake at the latest (a poll interval, the deadline, or the
 * next retry). */
static int64_t hs_dial_due(tcp_conn_state *cs, int64_t now, int64_t deadline) {
  int64_t wake = now + TCP_POLL_MS * 1000000LL;
  if (deadline < wake)
    wake = deadline;
  for (int i = 0; i < cs->n; i++) {
    tcp_hs *h = &cs->hs[i];
    if (h->st == HS_WAIT && h->next_try <= now)
      hs_dial(h);
    if (h->st == HS_WAIT && h->next_try < wake)
      wake = h->next_try;
  }
  return wake;
}

/* Fills cs->pfds: the listening socket first when a lower rank is still
 * missing, then one entry per handshake. Returns how many. */
static int hs_fill_pollfds(const tcp_transport *t, tcp_conn_state *cs, bool inbound_missing) {
  cs->pfds = zb_realloc(cs->pfds, sizeof *cs->pfds * (size_t)(cs->n + 1));
  int n = 0;
  if (inbound_missing)
    cs->pfds[n++] = (struct pollfd){.fd = t->listen_fd, .events = POLLIN};
  for (int i = 0; i < cs->n; i++) {
    tcp_hs *h = &cs->hs[i];
    short ev = h->st == HS_DIAL || h->st == HS_WRITE ? POLLOUT : h->st == HS_READ ? POLLIN : 0;
    /* unused entries still take a slot, with fd -1, which poll() skips */
    cs->pfds[n++] = (struct pollfd){.fd = ev ? h->fd : -1, .events = ev};
  }
  return n;
}

/* Accepts new connections and steps the first `polled` handshakes on their
 * poll events (entries accepted here have no pollfd this round). */
static zb_err hs_handle_events(tcp_transport *t, tcp_conn_state *cs, int polled, bool inbound_missing,
                               const bool *need, zb_diag *diag) {
  int k = 0;
  if (inbound_missing && (cs->pfds[k++].revents & POLLIN))
    hs_accept_all(t, cs);
  for (int i = 0; i < polled; i++, k++) {
    tcp_hs *h = &cs->hs[i];
    if (cs->pfds[k].fd < 0 || !cs->pfds[k].revents)
      continue;
    zb_err err = hs_step(t, h, cs, cs->pfds[k].revents, need, diag);
    if (err)
      return err;
    if (h->st == HS_DROP) {
      close(h->fd);
      h->fd = -1;
    }
  }
  /* forget finished and dropped inbound entries, keep outbound ones for their reasons */
  int w = 0;
  for (int i = 0; i < cs->n; i++)
    if (cs->hs[i].outbound || (cs->hs[i].st != HS_DONE && cs->hs[i].st != HS_DROP))
      cs->hs[w++] = cs->hs[i];
  cs->n = w;
  return ZB_OK;
}

/* One round: dial what is due, poll until the next wake-up, handle what
 * happened. */
static zb_err hs_round(tcp_transport *t, tcp_conn_state *cs, const bool *need, bool inbound_missing,
                       int64_t now, int64_t deadline, zb_diag *diag) {
  char eb[96];
  int64_t wake = hs_dial_due(cs, now, deadline);
  int n = hs_fill_pollfds(t, cs, inbound_missing);
  int polled = cs->n;
  int64_t wait_ns = wake - zb_clock_ns();
  int rc = poll(cs->pfds, (nfds_t)n, wait_ns > 0 ? (int)((wait_ns + 999999) / 1000000) : 0);
  if (rc < 0 && errno != EINTR)
    return zbtcp_fail(t, ZB_ERR_IO, diag, "rank %d: poll: %s", t->rank, zbtcp_errstr(errno, eb, sizeof eb));
  if (rc <= 0)
    return ZB_OK;
  return hs_handle_events(t, cs, polled, inbound_missing, need, diag);
}

/* Names each connected peer for errors: the data address it was given
 * as, else the far end of its socket. */
static void name_links(tcp_transport *t, const char *const *addresses) {
  for (int q = 0; q < t->nranks; q++) {
    tcp_link *l = &t->links[q];
    if (t->fds[q] < 0 || l->address[0])
      continue;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (addresses && addresses[q])
      snprintf(l->address, sizeof l->address, "%s", addresses[q]);
    else if (getpeername(t->fds[q], (struct sockaddr *)&ss, &sl) == 0)
      zbtcp_format_sockaddr(&ss, l->address, sizeof l->address);
    else
      snprintf(l->address, sizeof l->address, "address unknown");
  }
}

static void hs_free(tcp_conn_state *cs) {
  for (int i = 0; i < cs->n; i++) {
    if (cs->hs[i].fd >= 0)
      close(cs->hs[i].fd);
    if (cs->hs[i].ai)
      freeaddrinfo(cs->hs[i].ai);
  }
  free(cs->hs);
  free(cs->pfds);
}

zb_err zbtcp_connect(void *self, const char *const *addresses, const bool *peers, double timeout_s,
                     zb_diag *diag) {
  tcp_transport *t = self;
  if (t->failed)
    return zbtcp_failed_before(t, diag);
  bool *need = zb_calloc((size_t)t->nranks, sizeof(bool));
  for (int q = 0; q < t->nranks; q++)
    need[q] = q != t->rank && (!peers || peers[q]);
  tcp_conn_state cs = {0};
  int64_t start = zb_clock_ns();
  int64_t deadline = timeout_s > 0 && timeout_s < 1e9 ? start + (int64_t)(timeout_s * 1e9) : INT64_MAX;
  zb_err err = hs_start_dials(t, &cs, need, addresses, diag);
  while (!err) {
    bool inbound_missing;
    if (hs_all_connected(t, need, &inbound_missing))
      break;
    int64_t now = zb_clock_ns();
    if (tcp_stopped(t) || now >= deadline) {
      char missing[200];
      hs_missing(t, &cs, need, missing, sizeof missing);
      err = zbtcp_fail(t, ZB_ERR_IO, diag, "rank %d: %s connecting to %s", t->rank,
                       tcp_stopped(t) ? "stopped (stop flag raised)" : "deadline passed", missing);
      break;
    }
    err = hs_round(t, &cs, need, inbound_missing, now, deadline, diag);
  }
  name_links(t, addresses);
  hs_free(&cs);
  free(need);
  return err;
}
