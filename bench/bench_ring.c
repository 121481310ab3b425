/* bench_ring.c — zb_bench_ring: the ring all-reduce (worker/zb_collective.h)
 * over zb's tcp transport on loopback, against two baselines measured in
 * the same run through one loopback TCP connection with the transport's
 * socket buffer sizes (no framing, no MAC):
 *   one way:   one thread sends the buffer, another receives it;
 *   both ways: each end sends the buffer and receives the other's at
 *              once, one thread per end driving a non-blocking socket with
 *              poll() as a transport member does. This is the traffic of
 *              a d = 2 ring member, which sends and receives the bus
 *              rate, so it is the fair baseline for the ring; its rate is
 *              the bytes each way over the time.
 * Members are threads of this process, each with its own tcp transport
 * and a 32-byte data secret, as a worker sets them up. The rows are
 * measured in --rounds rounds, each round every row back to back, so a
 * ratio is taken within a round (where a neighbour's load hits both
 * sides alike) and the median round's ratio is printed; a row's own
 * figure is the median over rounds of its median over --reps runs:
 * seconds, GB/s (10^9 bytes a second; for the
 * ring NCCL's bus bandwidth busbw = 2(d-1)/d * bytes / time, the rate
 * each member's link carries each way) and the ratio to each baseline;
 * then the frame MAC's own rate on one thread over 1 MiB frames, the
 * data plane's ChaCha20-Poly1305 beside the HMAC-SHA256 of version 3
 * (worker/transport_tcp.h, Frame MACs). It prints; it never fails on a
 * slow figure.
 * Usage: zb_bench_ring [--mib N] [--reps N] [--rounds N] [--slice-kib N] [--d N] [--help]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/core_names.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "transport_tcp.h" /* the frame MAC, for its own rate */
#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_collective.h"
#include "zb_transport.h"

enum { MAX_D = 4, MAX_REPS = 50, MAX_ROUNDS = 21, MAX_ROWS = 4, TIMEOUT_S = 60 };

typedef struct opts {
  size_t bytes;
  int reps;
  size_t slice_bytes;
  int only_d; /* 0: the ring of d = 2 and of d = 4 */
  int rounds; /* each round measures every row once, back to back */
} opts;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* ---- (a) the baselines: plain copies through one loopback connection ---- */

typedef struct plain {
  bool duplex; /* false: end 0 sends, end 1 receives; true: both do both at once */
  int fd[2];
  unsigned char *out[2], *in[2]; /* by end: what it sends, where it receives */
  size_t bytes;
  int reps;
  pthread_barrier_t start;
  double seconds[2][MAX_REPS]; /* by end: from the common start to its last byte */
  bool ok[2];
} plain;

static bool move_all(int fd, unsigned char *p, size_t n, bool send_it) {
  while (n > 0) {
    ssize_t k = send_it ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
    if (k <= 0)
      return false;
    p += k;
    n -= (size_t)k;
  }
  return true;
}

/* Whether a failed call (k < 0, errno) only means: not now. */
static bool io_later(ssize_t k) {
  return k > 0 || (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
}

/* Sends n bytes of out while receiving n bytes into in, on one
 * non-blocking socket driven by poll(), as one transport member does. */
static bool duplex_move(int fd, const unsigned char *out, unsigned char *in, size_t n) {
  size_t sent = 0, got = 0;
  while (sent < n || got < n) {
    struct pollfd p = {.fd = fd, .events = (short)((sent < n ? POLLOUT : 0) | (got < n ? POLLIN : 0))};
    if (poll(&p, 1, TIMEOUT_S * 1000) <= 0 || (p.revents & POLLNVAL))
      return false;
    if (got < n && (p.revents & (POLLIN | POLLHUP | POLLERR))) {
      ssize_t k = recv(fd, in + got, n - got, 0);
      if (!io_later(k))
        return false;
      got += k > 0 ? (size_t)k : 0;
    }
    if (sent < n && (p.revents & (POLLOUT | POLLHUP | POLLERR))) {
      ssize_t k = send(fd, out + sent, n - sent, MSG_NOSIGNAL);
      if (!io_later(k))
        return false;
      sent += k > 0 ? (size_t)k : 0;
    }
  }
  return true;
}

typedef struct plain_end {
  plain *pl;
  int side;
} plain_end;

static void *plain_end_main(void *arg) {
  plain_end *e = arg;
  plain *pl = e->pl;
  int s = e->side, fd = pl->fd[s];
  bool ok = !pl->duplex || fcntl(fd, F_SETFL, fcntl(fd, F_GETFL, 0) | O_NONBLOCK) == 0;
  for (int k = 0; k < pl->reps; k++) {
    pthread_barrier_wait(&pl->start); /* every end, every rep, even after a failure */
    double t0 = zb_clock_s();
    if (ok)
      ok = pl->duplex ? duplex_move(fd, pl->out[s], pl->in[s], pl->bytes)
                      : move_all(fd, s == 0 ? pl->out[s] : pl->in[s], pl->bytes, s == 0);
    pl->seconds[s][k] = zb_clock_s() - t0;
    if (!ok) /* the other end must not block on this one */
      shutdown(fd, SHUT_RDWR);
  }
  pl->ok[s] = ok;
  return NULL;
}

/* A connected pair of loopback sockets with the transport's buffer sizes. */
static bool plain_connect(int fd[2]) {
  struct sockaddr_in sa = {.sin_family = AF_INET};
  socklen_t sl = sizeof sa;
  inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
  int lfd = socket(AF_INET, SOCK_STREAM, 0), one = 1, buf = 4 << 20;
  fd[0] = socket(AF_INET, SOCK_STREAM, 0);
  for (int k = 0; k < 2; k++) {
    int s = k == 0 ? lfd : fd[0];
    setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buf, sizeof buf);
    setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buf, sizeof buf);
  }
  bool ok = bind(lfd, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(lfd, 1) == 0 &&
            getsockname(lfd, (struct sockaddr *)&sa, &sl) == 0 &&
            connect(fd[0], (struct sockaddr *)&sa, sizeof sa) == 0 && (fd[1] = accept(lfd, NULL, NULL)) >= 0;
  setsockopt(fd[0], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  setsockopt(fd[1], IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  close(lfd);
  return ok;
}

/* Median seconds of a plain copy of o->bytes, one way or both ways at
 * once (a rep lasts until both ends are done); < 0 on failure. */
static double plain_copy(const opts *o, bool duplex) {
  plain pl = {.duplex = duplex, .bytes = o->bytes, .reps = o->reps, .fd = {-1, -1}};
  if (!plain_connect(pl.fd)) {
    perror("zb_bench_ring: loopback connection");
    return -1;
  }
  for (int k = 0; k < 2; k++) {
    pl.out[k] = zb_malloc(o->bytes);
    pl.in[k] = zb_malloc(o->bytes);
    memset(pl.out[k], 0x5a, o->bytes);
    memset(pl.in[k], 0, o->bytes);
  }
  pthread_barrier_init(&pl.start, NULL, 2);
  plain_end ends[2] = {{&pl, 0}, {&pl, 1}};
  pthread_t th;
  pthread_create(&th, NULL, plain_end_main, &ends[1]);
  plain_end_main(&ends[0]);
  pthread_join(th, NULL);
  pthread_barrier_destroy(&pl.start);
  double rep[MAX_REPS];
  for (int k = 0; k < o->reps; k++)
    rep[k] = pl.seconds[0][k] > pl.seconds[1][k] ? pl.seconds[0][k] : pl.seconds[1][k];
  for (int k = 0; k < 2; k++) {
    close(pl.fd[k]);
    free(pl.out[k]);
    free(pl.in[k]);
  }
  if (!pl.ok[0] || !pl.ok[1])
    fprintf(stderr, "zb_bench_ring: the plain copy (%s) failed\n", duplex ? "both ways" : "one way");
  return pl.ok[0] && pl.ok[1] ? median(rep, o->reps) : -1;
}

/* ---- (b) the ring all-reduce through zb's tcp transport ---- */

typedef struct ring_run {
  int d;
  const opts *o;
  zb_transport *t[MAX_D];
  const char *addrs[MAX_D];
  int ranks[MAX_D];
  pthread_barrier_t start;
  double seconds[MAX_REPS]; /* member 0's, from a common start to the last member's end */
  zb_err err[MAX_D];
  zb_diag diag[MAX_D];
} ring_run;

typedef struct ring_member {
  ring_run *run;
  int index;
} ring_member;

static void *ring_member_main(void *arg) {
  ring_member *m = arg;
  ring_run *run = m->run;
  int i = m->index;
  size_t n = run->o->bytes / sizeof(float);
  zb_diag *d = &run->diag[i];
  run->err[i] = zb_transport_connect(run->t[i], run->addrs, NULL, TIMEOUT_S, d);
  zb_ring g = {
      .tr = run->t[i], .size = run->d, .index = i, .ranks = run->ranks, .slice_bytes = run->o->slice_bytes};
  float *buf = zb_malloc(sizeof(float) * n);
  for (size_t j = 0; j < n; j++)
    buf[j] = (float)(j % 1000) * 0.001f + (float)i;
  pthread_barrier_wait(&run->start);
  if (!run->err[i])
    run->err[i] = zb_ring_all_reduce(&g, buf, n, d); /* warm-up: the connections' windows */
  for (int k = 0; k < run->o->reps && !run->err[i]; k++) {
    pthread_barrier_wait(&run->start);
    double t0 = zb_clock_s();
    run->err[i] = zb_ring_all_reduce(&g, buf, n, d);
    pthread_barrier_wait(&run->start); /* every member done */
    if (i == 0)
      run->seconds[k] = zb_clock_s() - t0;
  }
  if (run->err[i]) /* the others fail at once instead of waiting at a barrier: abort and leave */
    zb_transport_abort(run->t[i], "another member failed");
  free(buf);
  return NULL;
}

/* Median seconds of a d-member all-reduce of o->bytes; < 0 on failure. */
static double ring_all_reduce(const opts *o, int d) {
  static const unsigned char secret[32] = "zb_bench_ring's data secret....";
  ring_run run = {.d = d, .o = o};
  bool ok = true;
  for (int i = 0; i < d && ok; i++) {
    zb_tcp_config tc = {.rank = i,
                        .nranks = d,
                        .listen = "127.0.0.1:0",
                        .session = 1,
                        .secret = secret,
                        .secret_len = sizeof secret,
                        .idle_timeout_s = TIMEOUT_S};
    ok = zb_transport_tcp_new(&tc, &run.t[i], &run.diag[i]) == ZB_OK;
    if (ok)
      run.addrs[i] = zb_transport_address(run.t[i]);
    run.ranks[i] = i;
  }
  if (ok) {
    pthread_barrier_init(&run.start, NULL, (unsigned)d);
    ring_member m[MAX_D];
    pthread_t th[MAX_D];
    for (int i = 0; i < d; i++) {
      m[i] = (ring_member){&run, i};
      pthread_create(&th[i], NULL, ring_member_main, &m[i]);
    }
    for (int i = 0; i < d; i++)
      pthread_join(th[i], NULL);
    pthread_barrier_destroy(&run.start);
  }
  for (int i = 0; i < d; i++) {
    if (run.err[i] || (!ok && run.diag[i].msg[0])) {
      fprintf(stderr, "zb_bench_ring: d=%d member %d: %s\n", d, i, run.diag[i].msg);
      ok = false;
    }
    zb_transport_free(run.t[i]);
  }
  return ok ? median(run.seconds, o->reps) : -1;
}

/* ---- (c) the frame MAC alone: one thread, 1 MiB frames ---- */

enum { MAC_FRAME = 1 << 20, MAC_FRAMES = 128 };

/* Seconds for MAC_FRAMES tags of a MAC_FRAME-byte frame: HMAC-SHA256 as
 * data-plane version 3 made them (one keyed context, restarted per
 * frame), or the version-4 frame MAC (worker/transport_tcp_mac.c); < 0
 * when libcrypto failed. */
static double mac_seconds(bool hmac, const unsigned char *frame) {
  static const unsigned char key[TCP_MAC] = "zb_bench_ring's frame key......";
  unsigned char hdr[TCP_FRAME] = {0}, tag[EVP_MAX_MD_SIZE];
  EVP_MAC *mac = hmac ? EVP_MAC_fetch(NULL, "HMAC", NULL) : NULL;
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                         OSSL_PARAM_construct_end()};
  zbtcp_frame_mac *m = hmac ? NULL : zbtcp_frame_mac_new(key, TCP_DIR_TO_ACCEPTOR);
  bool ok = hmac ? ctx && EVP_MAC_init(ctx, key, sizeof key, params) : m != NULL;
  double t0 = zb_clock_s();
  for (uint64_t k = 0; k < MAC_FRAMES && ok; k++) {
    size_t len = 0;
    if (hmac) {
      ok = EVP_MAC_init(ctx, NULL, 0, NULL) && EVP_MAC_update(ctx, hdr, TCP_FIELDS) &&
           EVP_MAC_update(ctx, frame, MAC_FRAME) && EVP_MAC_final(ctx, tag, &len, sizeof tag);
    } else {
      zbtcp_frame_begin(m, k, hdr);
      zbtcp_frame_add(m, frame, MAC_FRAME);
      ok = zbtcp_frame_end(m, tag);
    }
  }
  double s = zb_clock_s() - t0;
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
  zbtcp_frame_mac_free(m);
  return ok ? s : -1;
}

/* Median GB/s of mac_seconds over reps; < 0 on failure. */
static double mac_rate(bool hmac, int reps) {
  unsigned char *frame = zb_malloc(MAC_FRAME);
  for (size_t i = 0; i < MAC_FRAME; i++)
    frame[i] = (unsigned char)(i * 131);
  double s[MAX_REPS];
  bool ok = true;
  for (int k = 0; k < reps && ok; k++)
    ok = (s[k] = mac_seconds(hmac, frame)) > 0;
  free(frame);
  return ok ? (double)MAC_FRAMES * MAC_FRAME / 1e9 / median(s, reps) : -1;
}

/* ---- the table ---- */

/* ---- the table ---- */

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: zb_bench_ring [--mib N] [--reps N] [--rounds N] [--slice-kib N] [--d N] [--help]\n"
             "  --mib N        buffer size in MiB (default 64)\n"
             "  --reps N       timed runs of a row in a round, their median counts (default 5,\n"
             "                 at most 50)\n"
             "  --rounds N     rounds, each measuring every row once; figures and ratios are\n"
             "                 the median round's, ratios taken within a round (default 5, odd,\n"
             "                 at most 21)\n"
             "  --slice-kib N  the ring's slice in KiB (default: ZB_RING_SLICE_BYTES, 1024)\n"
             "  --d N          only the ring of N members, 2 to 4 (default: 2, then 4)\n"
             "Rows (rates in GB/s, 10^9 bytes a second; ratios to each baseline's rate):\n"
             "  plain copy, one way     baseline 1: one thread sends the buffer through one\n"
             "                          loopback connection, another receives it (no framing,\n"
             "                          no MAC); GB/s = bytes / time.\n"
             "  plain copy, both ways   baseline 2: the two ends of one connection each send\n"
             "                          the buffer and receive the other's at once (one thread\n"
             "                          each, poll()): the traffic of a d = 2 ring member,\n"
             "                          which sends and receives the bus rate; GB/s = bytes\n"
             "                          each way / time. The fair baseline for the ring.\n"
             "  ring all-reduce         busbw = 2(d-1)/d * bytes / time (NCCL's bus bandwidth:\n"
             "                          what each member's link carries each way).\n"
             "  frame MAC               one thread tagging 1 MiB frames: the old HMAC-SHA256\n"
             "                          and the data plane's ChaCha20-Poly1305.\n");
  return rc;
}

static bool parse_args(int argc, char **argv, opts *o, int *rc) {
  *o = (opts){.bytes = (size_t)64 << 20, .reps = 5, .rounds = 5};
  for (int k = 1; k < argc; k++) {
    if (strcmp(argv[k], "--help") == 0) {
      *rc = usage(stdout, 0);
      return false;
    }
    long v = k + 1 < argc ? strtol(argv[k + 1], NULL, 10) : -1;
    if (strcmp(argv[k], "--mib") == 0 && v >= 1 && v <= 4096)
      o->bytes = (size_t)v << 20;
    else if (strcmp(argv[k], "--reps") == 0 && v >= 1 && v <= MAX_REPS)
      o->reps = (int)v;
    else if (strcmp(argv[k], "--rounds") == 0 && v >= 1 && v <= MAX_ROUNDS && v % 2 == 1)
      o->rounds = (int)v;
    else if (strcmp(argv[k], "--slice-kib") == 0 && v >= 1 && v <= (1 << 20))
      o->slice_bytes = (size_t)v << 10;
    else if (strcmp(argv[k], "--d") == 0 && v >= 2 && v <= MAX_D)
      o->only_d = (int)v;
    else {
      fprintf(stderr, "zb_bench_ring: bad argument \"%s\"%s\n", argv[k],
              k + 1 < argc ? " (or its value)" : " (a value is missing)");
      *rc = usage(stderr, 2);
      return false;
    }
    k++;
  }
  return true;
}

/* Every row's median seconds in each round: rows 0 and 1 the baselines,
 * then the rings of ds[]. */
typedef struct rounds {
  int n_rows, ds[MAX_ROWS];
  double s[MAX_ROWS][MAX_ROUNDS];
} rounds;

static bool measure(const opts *o, rounds *r) {
  r->n_rows = o->only_d ? 3 : 4;
  r->ds[2] = o->only_d ? o->only_d : 2;
  r->ds[3] = 4;
  for (int k = 0; k < o->rounds; k++) {
    r->s[0][k] = plain_copy(o, false);
    r->s[1][k] = plain_copy(o, true);
    for (int row = 2; row < r->n_rows; row++)
      r->s[row][k] = ring_all_reduce(o, r->ds[row]);
    for (int row = 0; row < r->n_rows; row++)
      if (r->s[row][k] < 0)
        return false;
  }
  return true;
}

/* The median over rounds of row a's rate over row b's (each row's rate:
 * its bytes per second, the ring's scaled to busbw by busbw_of_a). */
static double round_ratio(const opts *o, const rounds *r, int a, int b, double busbw_of_a) {
  double q[MAX_ROUNDS];
  for (int k = 0; k < o->rounds; k++)
    q[k] = busbw_of_a * r->s[b][k] / r->s[a][k];
  return median(q, o->rounds);
}

/* Prints one row: seconds, the rate (GB/s) and its ratios to the two
 * baselines' rates (each the median round's), and the range of the
 * ratio to the both-ways copy over rounds. */
static void row(const opts *o, const rounds *r, const char *what, int i) {
  double gb = (double)o->bytes / 1e9, scale = 1.0, s[MAX_ROUNDS];
  char d[8] = "-";
  if (i >= 2) {
    scale = 2.0 * (r->ds[i] - 1) / r->ds[i];
    snprintf(d, sizeof d, "%d", r->ds[i]);
  }
  double lo = 1e30, hi = 0;
  for (int k = 0; k < o->rounds; k++) {
    double q = scale * r->s[1][k] / r->s[i][k];
    lo = q < lo ? q : lo;
    hi = q > hi ? q : hi;
    s[k] = r->s[i][k];
  }
  double sec = median(s, o->rounds);
  printf("%-36s %3s %9.4f %8.2f %9.2f %10.2f  %.2f-%.2f\n", what, d, sec, scale * gb / sec,
         round_ratio(o, r, i, 0, scale), round_ratio(o, r, i, 1, scale), lo, hi);
}

static int print_mac_rates(const opts *o) {
  double hmac = mac_rate(true, o->reps), poly = mac_rate(false, o->reps);
  if (hmac < 0 || poly < 0) {
    fprintf(stderr, "zb_bench_ring: libcrypto could not compute a frame MAC\n");
    return 1;
  }
  printf("frame MAC, 1 MiB frames, one thread: HMAC-SHA256 (data plane v3) %.2f GB/s, "
         "ChaCha20-Poly1305 (v4) %.2f GB/s, %.1fx\n",
         hmac, poly, poly / hmac);
  return 0;
}

int main(int argc, char **argv) {
  opts o;
  int rc = 0;
  if (!parse_args(argc, argv, &o, &rc))
    return rc;
  static rounds r;
  if (!measure(&o, &r))
    return 1;
  printf("loopback, %.0f MiB, %d rounds of %d runs, slice %zu KiB, %ld CPUs online (shared with "
         "whatever else runs)\n",
         (double)o.bytes / (1 << 20), o.rounds, o.reps,
         (o.slice_bytes ? o.slice_bytes : ZB_RING_SLICE_BYTES) >> 10, sysconf(_SC_NPROCESSORS_ONLN));
  printf("%-36s %3s %9s %8s %9s %10s  %s\n", "what", "d", "seconds", "GB/s", "/one way", "/both ways",
         "/both ways, rounds");
  row(&o, &r, "plain copy, one way (baseline 1)", 0);
  row(&o, &r, "plain copy, both ways (baseline 2)", 1);
  for (int i = 2; i < r.n_rows; i++)
    row(&o, &r, "ring all-reduce, tcp (busbw)", i);
  return print_mac_rates(&o);
}
