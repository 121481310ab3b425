/* bench_tcp.c — zb_bench_tcp: payload throughput of the tcp transport
 * (worker/transport_tcp.h) over loopback. Rank 0 sends COUNT messages of
 * SIZE bytes to rank 1, one blocking call per message as the executor's
 * SEND_F and RECV_F; the ranks are two threads of this process, each with
 * its own transport and a 32-byte data secret, as a worker sets them up.
 * Prints per size the payload rate in MB/s (10^6 bytes a second, from
 * the start line both ranks pass to the receiver's last byte; the median
 * of REPEATS runs) and, for scale, the rate of the frame MAC every
 * payload byte passes through on each side (ChaCha20-Poly1305, data-plane
 * version 4) and of one-shot HMAC-SHA256 (version 3's) over the same
 * buffer on this machine. It prints; it never fails on a slow figure.
 * Usage: zb_bench_tcp [--quick]   (--quick: a tenth of the bytes)
 */
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "transport_tcp.h" /* the frame MAC, for its own rate */
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_transport.h"

enum { REPEATS = 5, TOTAL_MB = 512, TIMEOUT_S = 60 };

static const size_t SIZES[] = {64 << 10, 1 << 20, 16 << 20};
#define N_SIZES (sizeof SIZES / sizeof SIZES[0])

typedef struct pair {
  pthread_barrier_t start; /* both connected; then before each run */
  zb_transport *t[2];
  const char *addrs[2];
  unsigned char *buf[2];
  int count[N_SIZES];
  double seconds[N_SIZES][REPEATS]; /* the receiver's */
  zb_err err[2];
  zb_diag diag[2];
} pair;

typedef struct rank_arg {
  pair *p;
  int rank;
} rank_arg;

/* One run of count messages of size bytes in the rank's direction. */
static zb_err messages(pair *p, int rank, size_t size, int count, zb_diag *d) {
  zb_err err = ZB_OK;
  for (int k = 0; k < count && !err; k++) {
    zb_tag tag = {.kind = ZB_OP_F, .stage = 0, .mb = k};
    err = rank == 0 ? zb_transport_send(p->t[0], 1, tag, p->buf[0], size, d)
                    : zb_transport_recv(p->t[1], 0, tag, p->buf[1], size, d);
  }
  return err;
}

static void *rank_main(void *arg) {
  rank_arg *a = arg;
  pair *p = a->p;
  int r = a->rank;
  zb_diag *d = &p->diag[r];
  p->err[r] = zb_transport_connect(p->t[r], p->addrs, NULL, TIMEOUT_S, d);
  pthread_barrier_wait(&p->start);
  for (size_t i = 0; i < N_SIZES && !p->err[r]; i++) {
    p->err[r] = messages(p, r, SIZES[i], 1, d); /* warm-up */
    for (int k = 0; k < REPEATS && !p->err[r]; k++) {
      pthread_barrier_wait(&p->start);
      double t0 = zb_clock_s();
      p->err[r] = messages(p, r, SIZES[i], p->count[i], d);
      p->seconds[i][k] = zb_clock_s() - t0;
    }
  }
  if (p->err[r]) /* the other rank must not wait at a barrier for this one */
    zb_transport_abort(p->t[r], "the other rank failed");
  return NULL;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* MB/s of the data plane's frame MAC (ChaCha20-Poly1305, version 4)
 * over frames of size bytes of buf; < 0 when libcrypto failed. */
static double frame_mac_rate(const unsigned char *buf, size_t size, int count) {
  static const unsigned char key[TCP_MAC] = {1};
  unsigned char hdr[TCP_FRAME] = {0}, tag[TCP_TAG];
  zbtcp_frame_mac *m = zbtcp_frame_mac_new(key, TCP_DIR_TO_ACCEPTOR);
  bool ok = m != NULL;
  double t0 = zb_clock_s();
  for (int k = 0; k < count && ok; k++) {
    zbtcp_frame_begin(m, (uint64_t)k, hdr);
    zbtcp_frame_add(m, buf, size);
    ok = zbtcp_frame_end(m, tag);
  }
  double s = zb_clock_s() - t0;
  zbtcp_frame_mac_free(m);
  return ok ? (double)size * count / s / 1e6 : -1;
}

/* MB/s of one-shot HMAC-SHA256 (the frame MAC of version 3) over size
 * bytes of buf. */
static double hmac_rate(const unsigned char *buf, size_t size, int count) {
  unsigned char key[32] = {1}, mac[32];
  unsigned int len = sizeof mac;
  double t0 = zb_clock_s();
  for (int k = 0; k < count; k++)
    HMAC(EVP_sha256(), key, sizeof key, buf, size, mac, &len);
  return (double)size * count / (zb_clock_s() - t0) / 1e6;
}

static bool make_ranks(pair *p) {
  static const unsigned char secret[32] = "zb_bench_tcp's data secret.....";
  for (int r = 0; r < 2; r++) {
    zb_tcp_config tc = {.rank = r,
                        .nranks = 2,
                        .listen = "127.0.0.1:0",
                        .session = 1,
                        .secret = secret,
                        .secret_len = sizeof secret,
                        .idle_timeout_s = TIMEOUT_S};
    if (zb_transport_tcp_new(&tc, &p->t[r], &p->diag[r]) != ZB_OK) {
      fprintf(stderr, "zb_bench_tcp: rank %d: %s\n", r, p->diag[r].msg);
      return false;
    }
    p->addrs[r] = zb_transport_address(p->t[r]);
    p->buf[r] = zb_malloc(SIZES[N_SIZES - 1]);
    memset(p->buf[r], 0x5a + r, SIZES[N_SIZES - 1]);
  }
  return true;
}

int main(int argc, char **argv) {
  bool quick = argc > 1 && strcmp(argv[1], "--quick") == 0;
  pair p = {0};
  for (size_t i = 0; i < N_SIZES; i++) {
    size_t total = (size_t)(quick ? TOTAL_MB / 10 : TOTAL_MB) << 20;
    p.count[i] = (int)(total / SIZES[i]);
  }
  pthread_barrier_init(&p.start, NULL, 2);
  bool ok = make_ranks(&p);
  if (ok) {
    rank_arg a[2] = {{&p, 0}, {&p, 1}};
    pthread_t th;
    pthread_create(&th, NULL, rank_main, &a[1]);
    rank_main(&a[0]);
    pthread_join(th, NULL);
    for (int r = 0; r < 2; r++)
      if (p.err[r]) {
        fprintf(stderr, "zb_bench_tcp: rank %d: %s\n", r, p.diag[r].msg);
        ok = false;
      }
  }
  if (ok) {
    printf("tcp transport over loopback, rank 0 -> rank 1, median of %d runs\n", REPEATS);
    printf("%10s %8s %12s %16s %14s\n", "size", "count", "MB/s", "frame MAC MB/s", "HMAC MB/s");
    for (size_t i = 0; i < N_SIZES; i++) {
      double s = median(p.seconds[i], REPEATS);
      printf("%8zu K %8d %12.0f %16.0f %14.0f\n", SIZES[i] >> 10, p.count[i],
             (double)SIZES[i] * p.count[i] / s / 1e6, frame_mac_rate(p.buf[0], SIZES[i], p.count[i] / 4 + 1),
             hmac_rate(p.buf[0], SIZES[i], p.count[i] / 4 + 1));
    }
  }
  for (int r = 0; r < 2; r++) {
    zb_transport_free(p.t[r]);
    free(p.buf[r]);
  }
  pthread_barrier_destroy(&p.start);
  return ok ? 0 : 1;
}
