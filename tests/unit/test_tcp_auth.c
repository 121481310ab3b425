/* The tcp transport's authenticated handshake and frames
 * (worker/transport_tcp.h): two ranks holding different data secrets never
 * connect (the dialer names the failed authentication, the acceptor counts
 * nothing); a stranger who knows the job's session and rank layout but not
 * the secret is dropped after its forged proof, and the real rank then
 * connects and exchanges data; a frame the stranger sends in place of the
 * proof never reaches a receive. After the handshake every frame carries
 * MACs: through a relay on the path (a thread here, forwarding real
 * sockets on 127.0.0.1) frames pass both ways untouched, and a flipped
 * payload bit, a flipped header bit, a replayed frame and a dropped frame
 * (all frames tagged alike, so only the MACs can tell) each fail the
 * receive naming the frame, the peer's rank and its address; the peer,
 * which then sees the connection close, reports that as a peer's failure
 * (zb_transport_failed_by_peer), the receiver does not. The header
 * decoder the handshake and the receives share (zbtcp_frame_parse, which
 * fuzz/fuzz_tcp_frame.c fuzzes) takes well-formed frames and refuses each
 * kind of malformed one, saying why. The frame MAC (ChaCha20-Poly1305)
 * gives one tag however the payload was split and a new one for every
 * change of frame number, direction, part, key or payload bit. A peer of
 * the older protocol (version 3, HMAC frames) is refused naming both
 * versions, whichever end it is. */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "transport_tcp.h"
#include "zb_transport.h"
#include "zbtest.h"

enum { SESSION = 7 };

typedef struct end {
  zb_transport *t;
  const char *addrs[2];
  double timeout_s;
  zb_err err;
  zb_diag diag;
} end;

static zb_transport *tcp_rank(int rank, const char *secret) {
  zb_tcp_config tc = {.rank = rank,
                      .nranks = 2,
                      .listen = "127.0.0.1:0",
                      .session = SESSION,
                      .secret = (const unsigned char *)secret,
                      .secret_len = strlen(secret),
                      .idle_timeout_s = 10}; /* a frame that never comes fails, never hangs */
  zb_transport *t = NULL;
  zb_diag d = {{0}};
  if (zb_transport_tcp_new(&tc, &t, &d) != ZB_OK)
    fprintf(stderr, "  rank %d: %s\n", rank, d.msg);
  return t;
}

static void *connect_main(void *arg) {
  end *e = arg;
  e->err = zb_transport_connect(e->t, e->addrs, NULL, e->timeout_s, &e->diag);
  return NULL;
}

static void test_different_secrets_never_connect(void) {
  zb_transport *t0 = tcp_rank(0, "secret-of-job-1"), *t1 = tcp_rank(1, "secret-of-job-2");
  CHECK(t0 && t1);
  const char *addrs[2] = {zb_transport_address(t0), zb_transport_address(t1)};
  end e0 = {.t = t0, .addrs = {addrs[0], addrs[1]}, .timeout_s = 2};
  end e1 = {.t = t1, .addrs = {addrs[0], addrs[1]}, .timeout_s = 2};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &e1);
  connect_main(&e0);
  pthread_join(th, NULL);
  printf("  rank 0: %s\n  rank 1: %s\n", e0.diag.msg, e1.diag.msg);
  CHECK(e0.err != ZB_OK && strstr(e0.diag.msg, "failed the data-plane authentication"));
  CHECK(e1.err == ZB_ERR_IO && strstr(e1.diag.msg, "peer rank 0")); /* never counted */
  zb_transport_free(t0);
  zb_transport_free(t1);
}

/* A raw socket to addr ("127.0.0.1:PORT"); -1 on failure. */
static int dial(const char *addr) {
  const char *colon = strrchr(addr, ':');
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
    close(fd);
    fd = -1;
  }
  return fd;
}

static void put32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++)
    p[i] = (unsigned char)(v >> (8 * i));
}

/* The stranger: a well-formed hello as rank 0 (it knows the session), then
 * `second` in place of the proof. Returns whether rank 1 closed on it. */
static bool stranger(const char *addr, const unsigned char *second, size_t len) {
  int fd = dial(addr);
  if (fd < 0)
    return false;
  unsigned char b[72] = {0};
  memcpy(b, "ZBHL", 4);
  put32(b + 4, TCP_VERSION);
  put32(b + 8, 0);
  put32(b + 12, 2);
  put32(b + 16, SESSION);
  bool closed = false;
  if (send(fd, b, sizeof b, MSG_NOSIGNAL) == (ssize_t)sizeof b) {
    unsigned char answer[72];
    size_t got = 0;
    while (got < sizeof answer) {
      ssize_t n = recv(fd, answer + got, sizeof answer - got, 0);
      if (n <= 0)
        break;
      got += (size_t)n;
    }
    if (got != sizeof answer || memcmp(answer, "ZBHL", 4) != 0) {
      fprintf(stderr, "  rank 1 answered %zu bytes, not a hello\n", got);
      close(fd);
      return false;
    }
    (void)!send(fd, second, len, MSG_NOSIGNAL);
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char c;
    closed = recv(fd, &c, 1, 0) == 0; /* EOF: dropped */
  }
  close(fd);
  return closed;
}

static void test_stranger_is_dropped_and_the_rank_connects(void) {
  zb_transport *t0 = tcp_rank(0, "the-job-secret"), *t1 = tcp_rank(1, "the-job-secret");
  CHECK(t0 && t1);
  const char *addrs[2] = {zb_transport_address(t0), zb_transport_address(t1)};
  end e1 = {.t = t1, .addrs = {addrs[0], addrs[1]}, .timeout_s = 10};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &e1); /* rank 1 accepts */
  unsigned char forged[72] = {0}, message[72] = {0};
  memcpy(forged, "ZBPF", 4);
  put32(forged + 4, TCP_VERSION);
  memset(forged + 40, 0xab, 32); /* a MAC it cannot compute */
  memcpy(message, "ZBMS", 4);    /* a data frame in place of the proof */
  put32(message + 4, 'F');
  CHECK_MSG(stranger(addrs[1], forged, sizeof forged), "a forged proof was not dropped");
  CHECK_MSG(stranger(addrs[1], message, sizeof message), "an injected frame was not dropped");
  end e0 = {.t = t0, .addrs = {addrs[0], addrs[1]}, .timeout_s = 10};
  connect_main(&e0);
  pthread_join(th, NULL);
  CHECK_MSG(e0.err == ZB_OK && e1.err == ZB_OK, "%s / %s", e0.diag.msg, e1.diag.msg);
  unsigned char x = 0x5a, y = 0;
  zb_tag tag = {.kind = ZB_OP_F, .stage = 0, .mb = 0};
  zb_diag d = {{0}};
  CHECK(zb_transport_send(t0, 1, tag, &x, 1, &d) == ZB_OK &&
        zb_transport_recv(t1, 0, tag, &y, 1, &d) == ZB_OK);
  CHECK_EQ(y, 0x5a);
  zb_transport_free(t0);
  zb_transport_free(t1);
}

/* ---- frames through a relay on the path ---- */

enum { FRAMES = 3, PAYLOAD = 64, HANDSHAKE = 2 * TCP_HELLO_FRAME };

/* Where frame k begins in the dialer's byte stream (after its hello and
 * proof). */
static size_t frame_at(int k) {
  return HANDSHAKE + (size_t)k * (TCP_FRAME + PAYLOAD + TCP_TAG);
}

/* A relay: accepts one connection, dials upstream, and forwards both ways;
 * the dialer's stream (offsets from its first byte) can be changed. */
typedef struct relay {
  int listen_fd;
  char address[64];
  const char *upstream;
  size_t flip_at;                /* this byte is XORed with 0x01 (SIZE_MAX: none) */
  size_t drop_from, drop_to;     /* these bytes are not passed on */
  size_t replay_from, replay_to; /* these bytes are passed on twice */
  unsigned char seen[4096];      /* the dialer's stream so far, for the replay */
  size_t n_seen;
  atomic_bool stop;
  pthread_t th;
} relay;

static bool write_all(int fd, const unsigned char *p, size_t n) {
  while (n > 0) {
    ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w <= 0)
      return false;
    p += w;
    n -= (size_t)w;
  }
  return true;
}

/* Passes n bytes of the dialer's stream on to fd, changed as r says. */
static bool relay_dialer_bytes(relay *r, int fd, const unsigned char *in, size_t n) {
  unsigned char out[2 * sizeof r->seen];
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    size_t at = r->n_seen;
    unsigned char c = in[i];
    if (r->n_seen < sizeof r->seen)
      r->seen[r->n_seen] = c;
    r->n_seen++;
    if (at >= r->drop_from && at < r->drop_to)
      continue;
    out[o++] = at == r->flip_at ? c ^ 0x01 : c;
    if (at + 1 == r->replay_to)
      for (size_t k = r->replay_from; k < r->replay_to; k++)
        out[o++] = r->seen[k];
    if (o > sizeof out - sizeof r->seen) { /* keep room for one byte and a replay */
      if (!write_all(fd, out, o))
        return false;
      o = 0;
    }
  }
  return write_all(fd, out, o);
}

/* Moves what one side has to the other; false at its end. */
static bool relay_pump(relay *r, int from, int to, bool from_dialer) {
  unsigned char buf[1024];
  ssize_t n = recv(from, buf, sizeof buf, 0);
  if (n <= 0)
    return false;
  return from_dialer ? relay_dialer_bytes(r, to, buf, (size_t)n) : write_all(to, buf, (size_t)n);
}

static void *relay_main(void *arg) {
  relay *r = arg;
  struct pollfd lp = {.fd = r->listen_fd, .events = POLLIN};
  while (!atomic_load(&r->stop) && poll(&lp, 1, 100) == 0)
    continue;
  int d = atomic_load(&r->stop) ? -1 : accept(r->listen_fd, NULL, NULL);
  int a = d >= 0 ? dial(r->upstream) : -1;
  struct pollfd p[2] = {{.fd = d, .events = POLLIN}, {.fd = a, .events = POLLIN}};
  bool open = d >= 0 && a >= 0;
  while (open && !atomic_load(&r->stop)) {
    if (poll(p, 2, 100) <= 0)
      continue;
    if (p[0].revents)
      open = relay_pump(r, d, a, true);
    if (open && p[1].revents)
      open = relay_pump(r, a, d, false);
  }
  if (d >= 0)
    close(d);
  if (a >= 0)
    close(a);
  return NULL;
}

/* Starts r (its changes set) in front of upstream. */
static bool relay_start(relay *r, const char *upstream) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof sa;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  r->listen_fd = socket(AF_INET, SOCK_STREAM, 0);
  if (r->listen_fd < 0 || bind(r->listen_fd, (struct sockaddr *)&sa, sizeof sa) != 0 ||
      listen(r->listen_fd, 4) != 0 || getsockname(r->listen_fd, (struct sockaddr *)&sa, &sl) != 0)
    return false;
  snprintf(r->address, sizeof r->address, "127.0.0.1:%u", (unsigned)ntohs(sa.sin_port));
  r->upstream = upstream;
  atomic_init(&r->stop, false);
  return pthread_create(&r->th, NULL, relay_main, r) == 0;
}

static void relay_stop(relay *r) {
  atomic_store(&r->stop, true);
  pthread_join(r->th, NULL);
  close(r->listen_fd);
}

/* What rank 1 saw of FRAMES frames rank 0 sent it through r. */
typedef struct outcome {
  int intact; /* frames received whole and right before the first failure */
  zb_err err;
  zb_diag diag;
  char rank0[64];   /* rank 0's data address */
  bool back_intact; /* after FRAMES intact: a frame rank 1 sent back arrived */
  /* after a failure: whether each rank's transport blames a peer (rank 0
   * then waits for a frame from rank 1, which has closed) */
  bool rank0_by_peer, rank1_by_peer;
  zb_diag rank0_diag;
} outcome;

/* Rank 0 sends FRAMES messages of PAYLOAD bytes (byte k + 1 throughout
 * frame k), all with one tag, to rank 1 through r; rank 1 receives them in
 * order and, when all are intact, sends one back. */
static outcome through_relay(relay *r) {
  outcome out = {.err = ZB_ERR_IO};
  zb_transport *t0 = tcp_rank(0, "the-job-secret"), *t1 = tcp_rank(1, "the-job-secret");
  if (!t0 || !t1 || !relay_start(r, zb_transport_address(t1)))
    return out;
  snprintf(out.rank0, sizeof out.rank0, "%s", zb_transport_address(t0));
  end e1 = {.t = t1, .addrs = {zb_transport_address(t0), r->address}, .timeout_s = 10};
  end e0 = {.t = t0, .addrs = {zb_transport_address(t0), r->address}, .timeout_s = 10};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &e1);
  connect_main(&e0);
  pthread_join(th, NULL);
  zb_tag tag = {.kind = ZB_OP_F, .stage = 0, .mb = 0};
  unsigned char buf[PAYLOAD];
  zb_diag d = {{0}};
  out.err = e0.err ? e0.err : e1.err;
  out.diag = e0.err ? e0.diag : e1.diag;
  for (int k = 0; k < FRAMES && !out.err; k++) {
    memset(buf, k + 1, sizeof buf);
    out.err = zb_transport_send(t0, 1, tag, buf, sizeof buf, &out.diag);
  }
  for (int k = 0; k < FRAMES && !out.err; k++) {
    memset(buf, 0, sizeof buf);
    out.err = zb_transport_recv(t1, 0, tag, buf, sizeof buf, &out.diag);
    out.intact += !out.err && buf[0] == k + 1 && buf[PAYLOAD - 1] == k + 1;
  }
  zb_tag back = {.kind = ZB_OP_B, .stage = 1, .mb = 0};
  out.back_intact = !out.err && zb_transport_send(t1, 0, back, "gradient", 8, &d) == ZB_OK &&
                    zb_transport_recv(t0, 1, back, buf, 8, &d) == ZB_OK && memcmp(buf, "gradient", 8) == 0;
  if (out.err && zb_transport_recv(t0, 1, back, buf, 8, &out.rank0_diag) != ZB_OK) {
    out.rank0_by_peer = zb_transport_failed_by_peer(t0);
    out.rank1_by_peer = zb_transport_failed_by_peer(t1);
  }
  zb_transport_free(t0);
  zb_transport_free(t1);
  relay_stop(r);
  return out;
}

static relay plain_relay(void) {
  return (relay){.flip_at = SIZE_MAX};
}

static void test_frames_pass_an_unchanging_relay(void) {
  relay r = plain_relay();
  outcome o = through_relay(&r);
  CHECK_MSG(o.err == ZB_OK, "%s", o.diag.msg);
  CHECK_EQ(o.intact, FRAMES);
  CHECK_MSG(o.back_intact, "the frame sent back did not arrive whole");
}

/* Frame 1 must fail its `which` (and frames 0 pass), naming rank 0 and
 * its address. */
static void check_frame_1_refused(relay *r, const char *which) {
  outcome o = through_relay(r);
  printf("  %s\n", o.diag.msg);
  char want[160];
  snprintf(want, sizeof want, "frame 1 from rank 0 (%s) failed its %s: the data plane was changed in transit",
           o.rank0, which);
  CHECK_MSG(o.err == ZB_ERR_IO && strstr(o.diag.msg, want), "err %d, '%s' (expected '%s')", (int)o.err,
            o.diag.msg, want);
  CHECK_EQ(o.intact, 1);
  /* rank 1 found the fault; rank 0 only saw rank 1 close or reset (the
   * coordinator prefers rank 1's reason: docs/wire.md, Reports) */
  CHECK_MSG(o.rank0_by_peer && strstr(o.rank0_diag.msg, "peer rank 1"), "rank 0: %s", o.rank0_diag.msg);
  CHECK(!o.rank1_by_peer);
}

static void test_a_changed_payload_is_refused(void) {
  relay r = plain_relay();
  r.flip_at = frame_at(1) + TCP_FRAME + PAYLOAD / 2;
  check_frame_1_refused(&r, "MAC");
}

static void test_a_changed_header_is_refused(void) {
  relay r = plain_relay();
  r.flip_at = frame_at(1) + 12; /* microbatch 0 becomes 1 */
  check_frame_1_refused(&r, "header MAC");
}

static void test_a_replayed_frame_is_refused(void) {
  relay r = plain_relay();
  r.replay_from = frame_at(0); /* frame 0 again in frame 1's place: same tag, same length */
  r.replay_to = frame_at(1);
  check_frame_1_refused(&r, "header MAC");
}

static void test_a_dropped_frame_is_refused(void) {
  relay r = plain_relay();
  r.drop_from = frame_at(1); /* frame 2 arrives in frame 1's place */
  r.drop_to = frame_at(2);
  check_frame_1_refused(&r, "header MAC");
}

/* Header b of n bytes must be refused with a message naming why. */
static void check_refused(const unsigned char *b, size_t n, const char *why) {
  zbtcp_frame f;
  zb_diag d = {{0}};
  zb_err err = zbtcp_frame_parse(b, n, &f, &d);
  CHECK_MSG(err == ZB_ERR_PARSE && strstr(d.msg, why), "err %d, '%s' (expected '%s')", (int)err, d.msg, why);
}

static void test_frame_parse(void) {
  unsigned char m[TCP_FRAME] = {0}, h[TCP_HELLO_FRAME] = {0};
  put_u32(m, TCP_MSG_MAGIC);
  put_u32(m + 4, 'B');
  put_u32(m + 8, (uint32_t)-3); /* the stage of a restage move: any int32 */
  put_u32(m + 12, 5);
  put_u64(m + 16, 4096);
  put_u32(h, TCP_HELLO_MAGIC);
  put_u32(h + 4, TCP_VERSION);
  put_u32(h + 8, 3);
  put_u32(h + 12, 4);
  put_u64(h + 16, SESSION);
  h[24] = 0xab;
  zbtcp_frame f;
  CHECK(zbtcp_frame_parse(m, sizeof m, &f, NULL) == ZB_OK);
  CHECK(f.tag.kind == ZB_OP_B && f.tag.stage == -3 && f.tag.mb == 5 && f.len == 4096);
  CHECK(f.mac == m + TCP_FIELDS); /* the header tag: carried, checked by the transport with its key */
  CHECK(zbtcp_frame_parse(h, sizeof h, &f, NULL) == ZB_OK);
  CHECK(f.magic == TCP_HELLO_MAGIC && f.rank == 3 && f.nranks == 4 && f.session == SESSION &&
        f.nonce[0] == 0xab);
  check_refused(m, sizeof m - 1, "a message header is 40 bytes, not 39");
  check_refused(h, TCP_FRAME, "a handshake header is 72 bytes, not 40");
  put_u32(m + 4, 'R'); /* the ring collectives' kind (zb_collective.h) */
  CHECK(zbtcp_frame_parse(m, sizeof m, &f, NULL) == ZB_OK);
  CHECK(f.tag.kind == ZB_OP_REDUCE_GRAD && f.tag.stage == -3 && f.tag.mb == 5);
  put_u32(m + 4, 'X');
  check_refused(m, sizeof m, "message kind 0x00000058 is not 'F', 'B' or 'R'");
  put_u32(m, 0x50545448); /* "HTTP" */
  check_refused(m, sizeof m, "magic 0x50545448 is not a zb frame's");
  check_refused(m, 2, "magic 0x00000000");
  put_u32(h + 8, 4);
  check_refused(h, sizeof h, "handshake from rank 4 of 4 ranks");
  put_u32(h + 4, TCP_VERSION + 1);
  check_refused(h, sizeof h, "handshake version 5, this worker speaks 4");
}

/* ---- the frame MAC itself (transport_tcp_mac.c) ---- */

/* The frame tag of payload p (n bytes) fed in pieces of `piece` bytes. */
static void frame_tag(zbtcp_frame_mac *m, uint64_t seq, const unsigned char *hdr, const unsigned char *p,
                      size_t n, size_t piece, unsigned char tag[TCP_TAG]) {
  zbtcp_frame_begin(m, seq, hdr);
  for (size_t at = 0; at < n; at += piece)
    zbtcp_frame_add(m, p + at, n - at < piece ? n - at : piece);
  CHECK(zbtcp_frame_end(m, tag));
}

/* A tag does not depend on how the socket split the payload, and differs
 * with each input the nonce or the data carries: the frame number, the
 * direction, the part (header or frame), the key, one payload bit. */
static void test_frame_tags(void) {
  unsigned char key[TCP_MAC] = {1, 2, 3}, other[TCP_MAC] = {1, 2, 4}, hdr[TCP_FRAME] = {0};
  enum { N = 100003 };
  unsigned char *p = malloc(N), a[TCP_TAG], b[TCP_TAG], c[TCP_TAG];
  for (size_t i = 0; i < N; i++)
    p[i] = (unsigned char)(i * 131 + 7);
  put_u32(hdr, TCP_MSG_MAGIC);
  put_u64(hdr + 16, N);
  zbtcp_frame_mac *m = zbtcp_frame_mac_new(key, TCP_DIR_TO_ACCEPTOR),
                  *back = zbtcp_frame_mac_new(key, TCP_DIR_TO_DIALER), *k2 = zbtcp_frame_mac_new(other, 0);
  CHECK(m && back && k2);
  frame_tag(m, 5, hdr, p, N, N, a);
  frame_tag(m, 5, hdr, p, N, 4097, b);
  CHECK_MSG(memcmp(a, b, TCP_TAG) == 0, "the tag depends on the pieces the payload came in");
  frame_tag(m, 5, hdr, p, N, 1, b);
  CHECK(memcmp(a, b, TCP_TAG) == 0);
  frame_tag(m, 6, hdr, p, N, N, b);
  CHECK_MSG(memcmp(a, b, TCP_TAG) != 0, "frames 5 and 6 have one tag");
  frame_tag(back, 5, hdr, p, N, N, b);
  CHECK_MSG(memcmp(a, b, TCP_TAG) != 0, "the two directions have one tag");
  frame_tag(k2, 5, hdr, p, N, N, b);
  CHECK(memcmp(a, b, TCP_TAG) != 0);
  p[N - 1] ^= 0x80;
  frame_tag(m, 5, hdr, p, N, N, b);
  CHECK_MSG(memcmp(a, b, TCP_TAG) != 0, "a flipped payload bit kept the tag");
  CHECK(zbtcp_header_tag(m, 5, hdr, b));
  frame_tag(m, 5, hdr, p, 0, 1, c);
  CHECK_MSG(memcmp(b, c, TCP_TAG) != 0, "a header tag passes for an empty frame's tag");
  unsigned char nonce[TCP_MAC_NONCE];
  zbtcp_mac_nonce(TCP_DIR_TO_DIALER, 'f', 0x0102030405060708ull, nonce);
  static const unsigned char want[TCP_MAC_NONCE] = {1, 'f', 0, 0, 8, 7, 6, 5, 4, 3, 2, 1};
  CHECK(memcmp(nonce, want, sizeof want) == 0); /* the layout transport_tcp.h documents */
  zbtcp_frame_mac_free(m);
  zbtcp_frame_mac_free(back);
  zbtcp_frame_mac_free(k2);
  free(p);
}

/* ---- a peer of an older data-plane protocol ---- */

/* A hello as version `version` from rank of 2 ranks, session SESSION. */
static void old_hello(unsigned char b[TCP_HELLO_FRAME], uint32_t version, uint32_t rank) {
  memset(b, 0, TCP_HELLO_FRAME);
  memcpy(b, "ZBHL", 4);
  put32(b + 4, version);
  put32(b + 8, rank);
  put32(b + 12, 2);
  put32(b + 16, SESSION);
}

static bool read_all(int fd, unsigned char *p, size_t n) {
  struct timeval tv = {.tv_sec = 5};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  for (size_t got = 0; got < n;) {
    ssize_t k = recv(fd, p + got, n - got, 0);
    if (k <= 0)
      return false;
    got += (size_t)k;
  }
  return true;
}

/* A version-3 acceptor (a raw socket answering with a version-3 hello):
 * the dialer fails at once, naming both versions. */
static void *old_acceptor_main(void *arg) {
  int lfd = *(int *)arg, fd = accept(lfd, NULL, NULL);
  unsigned char b[TCP_HELLO_FRAME];
  if (fd >= 0 && read_all(fd, b, sizeof b)) {
    old_hello(b, 3, 1);
    (void)!write_all(fd, b, sizeof b);
    char c;
    (void)!recv(fd, &c, 1, 0); /* until the dialer closes */
  }
  if (fd >= 0)
    close(fd);
  return NULL;
}

static void test_an_older_acceptor_is_named(void) {
  int lfd = -1, port = 0;
  zb_diag d = {{0}};
  CHECK(zb_tcp_listen("127.0.0.1:0", &lfd, &port, &d) == ZB_OK);
  int fl = fcntl(lfd, F_GETFL, 0);
  fcntl(lfd, F_SETFL, fl & ~O_NONBLOCK);
  char addr1[32];
  snprintf(addr1, sizeof addr1, "127.0.0.1:%d", port);
  zb_transport *t0 = tcp_rank(0, "the-job-secret");
  CHECK(t0);
  pthread_t th;
  pthread_create(&th, NULL, old_acceptor_main, &lfd);
  end e0 = {.t = t0, .addrs = {zb_transport_address(t0), addr1}, .timeout_s = 10};
  connect_main(&e0);
  zb_transport_free(t0); /* closes the connection the old acceptor waits on */
  pthread_join(th, NULL);
  close(lfd);
  printf("  %s\n", e0.diag.msg);
  CHECK_MSG(e0.err == ZB_ERR_INVALID_ARG &&
                strstr(e0.diag.msg, "peer rank 1 speaks another data-plane protocol (handshake version 3, "
                                    "this worker speaks 4)"),
            "err %d: %s", (int)e0.err, e0.diag.msg);
}

/* A version-3 dialer: the acceptor answers with its own hello (version 4,
 * so the old dialer can say why) and drops it; its connect deadline then
 * names the refusal. */
static void test_an_older_dialer_is_refused(void) {
  zb_transport *t1 = tcp_rank(1, "the-job-secret");
  CHECK(t1);
  end e1 = {.t = t1, .addrs = {"127.0.0.1:1", zb_transport_address(t1)}, .timeout_s = 1.5};
  pthread_t th;
  pthread_create(&th, NULL, connect_main, &e1);
  int fd = dial(zb_transport_address(t1));
  unsigned char b[TCP_HELLO_FRAME], answer[TCP_HELLO_FRAME];
  old_hello(b, 3, 0);
  CHECK(fd >= 0 && write_all(fd, b, sizeof b));
  CHECK_MSG(read_all(fd, answer, sizeof answer), "no hello came back");
  CHECK(memcmp(answer, "ZBHL", 4) == 0 && answer[4] == TCP_VERSION);
  char c;
  CHECK_MSG(recv(fd, &c, 1, 0) == 0, "the old dialer was not dropped");
  close(fd);
  pthread_join(th, NULL);
  printf("  %s\n", e1.diag.msg);
  CHECK_MSG(e1.err == ZB_ERR_IO &&
                strstr(e1.diag.msg, "peer rank 0 (a dialer was refused: handshake version 3, "
                                    "this worker speaks 4)"),
            "err %d: %s", (int)e1.err, e1.diag.msg);
  zb_transport_free(t1);
}

ZBT_MAIN(ZBT(test_different_secrets_never_connect), ZBT(test_stranger_is_dropped_and_the_rank_connects),
         ZBT(test_frames_pass_an_unchanging_relay), ZBT(test_a_changed_payload_is_refused),
         ZBT(test_a_changed_header_is_refused), ZBT(test_a_replayed_frame_is_refused),
         ZBT(test_a_dropped_frame_is_refused), ZBT(test_frame_parse), ZBT(test_frame_tags),
         ZBT(test_an_older_acceptor_is_named), ZBT(test_an_older_dialer_is_refused))
