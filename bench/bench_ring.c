/* bench_ring.c — zb_bench_ring: the ring all-reduce (worker/zb_collective.h)
 * over zb's tcp transport on loopback, against the baseline of the same
 * run: a plain copy of the same bytes between two threads through one TCP
 * connection (blocking send and recv, no framing, no MAC, the transport's
 * socket buffer sizes). Members are threads of this process, each with
 * its own tcp transport and a 32-byte data secret, as a worker sets them
 * up. Prints the median over --reps runs of each: seconds, GB/s (10^9
 * bytes a second) and, for the ring, NCCL's bus bandwidth
 * busbw = 2(d-1)/d * bytes / time (the rate each member's link carries)
 * and its ratio to the plain copy. It prints; it never fails on a slow
 * figure.
 * Usage: zb_bench_ring [--mib N] [--reps N] [--slice-kib N] [--help]
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_clock.h"
#include "zb_collective.h"
#include "zb_transport.h"

enum { MAX_D = 4, MAX_REPS = 50, TIMEOUT_S = 60 };

typedef struct opts {
  size_t bytes;
  int reps;
  size_t slice_bytes;
} opts;

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* ---- (a) the baseline: a plain copy through one loopback connection ---- */

typedef struct plain {
  int fd[2]; /* fd[0] sends, fd[1] receives */
  unsigned char *buf[2];
  size_t bytes;
  int reps;
  pthread_barrier_t start;
  double seconds[MAX_REPS];
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

typedef struct plain_end {
  plain *pl;
  int side;
} plain_end;

static void *plain_end_main(void *arg) {
  plain_end *e = arg;
  plain *pl = e->pl;
  bool ok = true;
  for (int k = 0; k < pl->reps && ok; k++) {
    pthread_barrier_wait(&pl->start);
    double t0 = zb_clock_s();
    ok = move_all(pl->fd[e->side], pl->buf[e->side], pl->bytes, e->side == 0);
    if (e->side == 1)
      pl->seconds[k] = zb_clock_s() - t0;
  }
  pl->ok[e->side] = ok;
  if (!ok) /* the other end must not block on this one */
    shutdown(pl->fd[e->side], SHUT_RDWR);
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
  close(lfd);
  return ok;
}

/* Median seconds of a plain copy of o->bytes; < 0 on failure. */
static double plain_copy(const opts *o) {
  plain pl = {.bytes = o->bytes, .reps = o->reps, .fd = {-1, -1}};
  if (!plain_connect(pl.fd)) {
    perror("zb_bench_ring: loopback connection");
    return -1;
  }
  for (int k = 0; k < 2; k++) {
    pl.buf[k] = zb_malloc(o->bytes);
    memset(pl.buf[k], 0x5a, o->bytes);
  }
  pthread_barrier_init(&pl.start, NULL, 2);
  plain_end ends[2] = {{&pl, 0}, {&pl, 1}};
  pthread_t th;
  pthread_create(&th, NULL, plain_end_main, &ends[1]);
  plain_end_main(&ends[0]);
  pthread_join(th, NULL);
  pthread_barrier_destroy(&pl.start);
  for (int k = 0; k < 2; k++) {
    close(pl.fd[k]);
    free(pl.buf[k]);
  }
  return pl.ok[0] && pl.ok[1] ? median(pl.seconds, o->reps) : -1;
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

/* ---- the table ---- */

static int usage(FILE *f, int rc) {
  fprintf(f, "usage: zb_bench_ring [--mib N] [--reps N] [--slice-kib N] [--help]\n"
             "  --mib N        buffer size in MiB (default 64)\n"
             "  --reps N       timed runs, the median is printed (default 5, at most 50)\n"
             "  --slice-kib N  the ring's slice in KiB (default: ZB_RING_SLICE_BYTES, 1024)\n");
  return rc;
}

static bool parse_args(int argc, char **argv, opts *o, int *rc) {
  *o = (opts){.bytes = (size_t)64 << 20, .reps = 5};
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
    else if (strcmp(argv[k], "--slice-kib") == 0 && v >= 1 && v <= (1 << 20))
      o->slice_bytes = (size_t)v << 10;
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

int main(int argc, char **argv) {
  opts o;
  int rc = 0;
  if (!parse_args(argc, argv, &o, &rc))
    return rc;
  double base = plain_copy(&o);
  if (base < 0)
    return 1;
  double mib = (double)o.bytes / (1 << 20), gb = (double)o.bytes / 1e9;
  printf("loopback, %.0f MiB, median of %d runs, slice %zu KiB\n", mib, o.reps,
         (o.slice_bytes ? o.slice_bytes : ZB_RING_SLICE_BYTES) >> 10);
  printf("%-34s %3s %9s %10s %8s\n", "what", "d", "seconds", "GB/s", "ratio");
  printf("%-34s %3s %9.4f %10.2f %8.2f\n", "plain socket copy (baseline)", "-", base, gb / base, 1.0);
  static const int ds[] = {2, 4};
  for (size_t k = 0; k < sizeof ds / sizeof ds[0]; k++) {
    int d = ds[k];
    double s = ring_all_reduce(&o, d);
    if (s < 0)
      return 1;
    double busbw = 2.0 * (d - 1) / d * gb / s;
    printf("%-34s %3d %9.4f %10.2f %8.2f\n", "ring all-reduce, tcp (busbw)", d, s, busbw,
           busbw / (gb / base));
  }
  return 0;
}
