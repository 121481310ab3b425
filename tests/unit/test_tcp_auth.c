/* The tcp transport's authenticated handshake (worker/transport_tcp.h):
 * two ranks holding different data secrets never connect (the dialer
 * names the failed authentication, the acceptor counts nothing); a
 * stranger who knows the job's session and rank layout but not the secret
 * is dropped after its forged proof, and the real rank then connects and
 * exchanges data; a frame the stranger sends in place of the proof never
 * reaches a receive. Real sockets on 127.0.0.1. The header decoder the
 * handshake and the receives share (zbtcp_frame_parse, which
 * fuzz/fuzz_tcp_frame.c fuzzes) takes well-formed frames and refuses
 * each kind of malformed one, saying why. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
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
                      .secret_len = strlen(secret)};
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
  put32(b + 4, 2);
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
  put32(forged + 4, 2);
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

/* Header b of n bytes must be refused with a message naming why. */
static void check_refused(const unsigned char *b, size_t n, const char *why) {
  zbtcp_frame f;
  zb_diag d = {{0}};
  zb_err err = zbtcp_frame_parse(b, n, &f, &d);
  CHECK_MSG(err == ZB_ERR_PARSE && strstr(d.msg, why), "err %d, '%s' (expected '%s')", (int)err, d.msg, why);
}

static void test_frame_parse(void) {
  unsigned char m[TCP_FRAME], h[TCP_HELLO_FRAME] = {0};
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
  CHECK(zbtcp_frame_parse(h, sizeof h, &f, NULL) == ZB_OK);
  CHECK(f.magic == TCP_HELLO_MAGIC && f.rank == 3 && f.nranks == 4 && f.session == SESSION &&
        f.nonce[0] == 0xab);
  check_refused(m, sizeof m - 1, "a message header is 24 bytes, not 23");
  check_refused(h, TCP_FRAME, "a handshake header is 72 bytes, not 24");
  put_u32(m + 4, 'X');
  check_refused(m, sizeof m, "message kind 0x00000058 is neither 'F' nor 'B'");
  put_u32(m, 0x50545448); /* "HTTP" */
  check_refused(m, sizeof m, "magic 0x50545448 is not a zb frame's");
  check_refused(m, 2, "magic 0x00000000");
  put_u32(h + 8, 4);
  check_refused(h, sizeof h, "handshake from rank 4 of 4 ranks");
  put_u32(h + 4, TCP_VERSION + 1);
  check_refused(h, sizeof h, "handshake version 3, this worker speaks 2");
}

ZBT_MAIN(ZBT(test_different_secrets_never_connect), ZBT(test_stranger_is_dropped_and_the_rank_connects),
         ZBT(test_frame_parse))
