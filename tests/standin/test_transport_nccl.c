/* test_transport_nccl.c — the nccl transport (worker/transport_nccl.c,
 * the same source zb-worker builds) over the NCCL stand-in between forked
 * ranks: tagged messages through zb_transport_* calls in groups and alone,
 * ordering against the compute stream, host messages through bounce
 * buffers, the local checks, init and group timeouts naming the peer,
 * abort and the stop flag.
 */
#include <pthread.h>
#include <stdint.h>

#include "nccl_fork.h"
#include "standin.h"
#include "zb_transport.h"

enum { N = 2048 };
static atomic_bool g_stop;

static zb_transport *make(int rank, int n, const ncclUniqueId *id, cudaStream_t compute, double timeout_s) {
  zb_nccl_config cfg = {
      .rank = rank, .nranks = n, .compute_stream = compute, .stop = &g_stop, .timeout_s = timeout_s};
  memcpy(cfg.unique_id, id, sizeof cfg.unique_id);
  zb_transport *t = NULL;
  zb_diag d;
  if (zb_transport_nccl_new(&cfg, &t, &d) != ZB_OK)
    fprintf(stderr, "rank %d: %s\n", rank, d.msg);
  return t;
}

/* A compute-stream op: fills a device buffer late (after 50 ms), so a
 * send not ordered after it would carry zeros. */
typedef struct fill {
  float *dev;
  float base;
} fill;

static cudaError_t fill_late(void *arg) {
  fill *f = arg;
  nf_sleep_ms(50);
  float *v = standin_view(f->dev, sizeof(float) * N, "fill_late"); /* device memory: through the view */
  for (int i = 0; i < N; i++)
    v[i] = f->base + (float)i;
  return cudaSuccess;
}

/* A compute-stream op: copies a received buffer out, so it reads what the
 * transport ordered before it. */
typedef struct grab {
  const float *dev;
  float *host;
} grab;

static cudaError_t grab_now(void *arg) {
  grab *g = arg;
  memcpy(g->host, standin_view(g->dev, sizeof(float) * N, "grab_now"), sizeof(float) * N);
  return cudaSuccess;
}

static int rank_exchange(int rank, int n, const ncclUniqueId *id) {
  cudaStream_t cs;
  cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
  zb_transport *t = make(rank, n, id, cs, 10);
  RCHECK(t, "new");
  zb_diag d;
  RCHECK(strcmp(zb_transport_address(t), "") == 0 && strcmp(zb_transport_name(t), "nccl") == 0,
         "address/name");
  RCHECK(zb_transport_connect(t, NULL, NULL, 10, &d) == ZB_OK, "%s", d.msg);
  RCHECK(zb_transport_connect(t, NULL, NULL, 10, &d) == ZB_OK, "second connect: %s", d.msg);
  float *sbuf, *rbuf, host[N];
  cudaMalloc((void **)&sbuf, sizeof host);
  cudaMalloc((void **)&rbuf, sizeof host);
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  fill f = {sbuf, (float)(rank * 100000)};
  grab g = {rbuf, host};
  standin_enqueue(cs, fill_late, &f, NULL);
  zb_transport_group_start(t);
  RCHECK(zb_transport_send(t, right, (zb_tag){ZB_OP_F, rank, 1}, sbuf, sizeof host, &d) == ZB_OK, "%s",
         d.msg);
  RCHECK(zb_transport_recv(t, left, (zb_tag){ZB_OP_F, left, 1}, rbuf, sizeof host, &d) == ZB_OK, "%s", d.msg);
  RCHECK(zb_transport_group_end(t, &d) == ZB_OK, "%s", d.msg);
  standin_enqueue(cs, grab_now, &g, NULL);
  cudaStreamSynchronize(cs);
  for (int i = 0; i < N; i++)
    RCHECK(host[i] == (float)(left * 100000 + i), "ring element %d: %g", i, (double)host[i]);
  /* outside a group each call is its own group: the even rank sends first */
  int partner = rank ^ 1;
  zb_tag to = {ZB_OP_B, rank, 2}, from = {ZB_OP_B, partner, 2};
  for (int k = 0; k < 2; k++) {
    bool send_now = (rank % 2 == 0) == (k == 0);
    zb_err err = send_now ? zb_transport_send(t, partner, to, sbuf, 6, &d) /* 6 bytes: ncclUint8 */
                          : zb_transport_recv(t, partner, from, rbuf, 6, &d);
    RCHECK(err == ZB_OK, "%s", d.msg);
  }
  cudaMemcpy(host, rbuf, 8, cudaMemcpyDeviceToHost);
  RCHECK(host[0] == (float)(partner * 100000), "pair: %g", (double)host[0]);
  zb_transport_stats st;
  zb_transport_stats_get(t, &st);
  RCHECK(st.bytes_sent == (int64_t)sizeof host + 6 && st.messages_sent == 2 && st.messages_received == 2,
         "stats %lld %lld", (long long)st.bytes_sent, (long long)st.messages_sent);
  /* local checks poison the transport */
  RCHECK(zb_transport_send(t, rank, to, sbuf, 4, &d) == ZB_ERR_INVALID_ARG && strstr(d.msg, "peer rank"),
         "%s", d.msg);
  RCHECK(zb_transport_send(t, right, to, sbuf, 4, &d) == ZB_ERR_INVALID_ARG && strstr(d.msg, "failed before"),
         "%s", d.msg);
  zb_transport_free(t);
  return 0;
}

/* Rank 1 never posts: rank 0's receive fails after the transport's 1 s
 * timeout, naming rank 1 and the tag. */
static int rank_idle(int rank, int n, const ncclUniqueId *id) {
  zb_transport *t = make(rank, n, id, NULL, 1.0);
  zb_diag d;
  RCHECK(t && zb_transport_connect(t, NULL, NULL, 10, &d) == ZB_OK, "connect: %s", d.msg);
  float *buf;
  cudaMalloc((void **)&buf, 64);
  if (rank == 1) {
    nf_sleep_ms(2500);
    zb_transport_free(t);
    return 0;
  }
  double t0 = nf_now();
  zb_err err = zb_transport_recv(t, 1, (zb_tag){ZB_OP_F, 0, 3}, buf, 64, &d);
  double took = nf_now() - t0;
  RCHECK(err == ZB_ERR_IO, "err %d", err);
  RCHECK(strstr(d.msg, "group from rank 1 (recv F s0 mb3) did not complete within 1 s"), "%s", d.msg);
  RCHECK(took > 0.9 && took < 6.0, "took %.2f s (timeout 1 s; slack for a loaded machine)", took);
  RCHECK(zb_transport_send(t, 1, (zb_tag){ZB_OP_F, 0, 4}, buf, 64, &d) == ZB_ERR_IO &&
             strstr(d.msg, "failed before"),
         "%s", d.msg);
  zb_transport_free(t);
  return 0;
}

/* Host messages (the optimizer's reductions) go through bounce buffers:
 * both ranks swap host doubles in one group; then rank 0 receives a host
 * message rank 1 never sends, which must fail by the transport's 1 s
 * timeout, not block in the copy out of the bounce buffer (into pageable
 * memory cudaMemcpyAsync waits for the receive ahead of it). */
static int rank_host(int rank, int n, const ncclUniqueId *id) {
  zb_transport *t = make(rank, n, id, NULL, 1.0);
  zb_diag d;
  RCHECK(t && zb_transport_connect(t, NULL, NULL, 10, &d) == ZB_OK, "connect: %s", d.msg);
  int peer = 1 - rank;
  double mine[4], theirs[4] = {0};
  for (int i = 0; i < 4; i++)
    mine[i] = 10.0 * rank + i + 0.5;
  zb_transport_group_start(t);
  RCHECK(zb_transport_send(t, peer, (zb_tag){ZB_OP_F, rank, 0}, mine, sizeof mine, &d) == ZB_OK, "%s", d.msg);
  RCHECK(zb_transport_recv(t, peer, (zb_tag){ZB_OP_F, peer, 0}, theirs, sizeof theirs, &d) == ZB_OK, "%s",
         d.msg);
  RCHECK(zb_transport_group_end(t, &d) == ZB_OK, "%s", d.msg);
  for (int i = 0; i < 4; i++)
    RCHECK(theirs[i] == 10.0 * peer + i + 0.5, "host element %d: %g", i, theirs[i]);
  RCHECK(cudaGetLastError() == cudaSuccess, "a completed group left an error behind");
  if (rank == 1) {
    nf_sleep_ms(2500);
    zb_transport_free(t);
    return 0;
  }
  double t0 = nf_now();
  zb_err err = zb_transport_recv(t, 1, (zb_tag){ZB_OP_F, 1, 1}, theirs, sizeof theirs, &d);
  double took = nf_now() - t0;
  RCHECK(err == ZB_ERR_IO && strstr(d.msg, "did not complete within 1 s"), "err %d: %s", err, d.msg);
  RCHECK(took > 0.9 && took < 6.0, "took %.2f s (timeout 1 s; slack for a loaded machine)", took);
  zb_transport_free(t);
  return 0;
}

/* Rank 1 aborts while rank 0 waits on it: rank 0 fails promptly (not by
 * its 20 s timeout) naming rank 1; rank 1's later calls fail with why. */
static int rank_abort(int rank, int n, const ncclUniqueId *id) {
  zb_transport *t = make(rank, n, id, NULL, 20);
  zb_diag d;
  RCHECK(t && zb_transport_connect(t, NULL, NULL, 10, &d) == ZB_OK, "connect: %s", d.msg);
  float *buf;
  cudaMalloc((void **)&buf, 64);
  if (rank == 1) {
    nf_sleep_ms(300);
    zb_transport_abort(t, "test abort");
    RCHECK(zb_transport_send(t, 0, (zb_tag){ZB_OP_F, 1, 0}, buf, 64, &d) == ZB_ERR_IO &&
               strstr(d.msg, "test abort"),
           "%s", d.msg);
    zb_transport_free(t);
    return 0;
  }
  double t0 = nf_now();
  zb_err err = zb_transport_recv(t, 1, (zb_tag){ZB_OP_F, 0, 0}, buf, 64, &d);
  RCHECK(err == ZB_ERR_IO && strstr(d.msg, "rank 1"), "err %d: %s", err, d.msg);
  RCHECK(nf_now() - t0 < 8, "took %.2f s (the timeout is 20 s)", nf_now() - t0);
  zb_transport_free(t);
  return 0;
}

/* Raises the stop flag after 300 ms, as the worker does when the
 * coordinator releases the job (docs/wire.md, Reports). */
static void *stop_later(void *arg) {
  (void)arg;
  nf_sleep_ms(300);
  atomic_store(&g_stop, true);
  return NULL;
}

/* Rank 1 dies (SIGKILL) while rank 0 waits to receive from it, and NCCL
 * says nothing (ZB_STANDIN_NCCL_PEER_LOSS=hang, as over shared memory):
 * the watchdog fails rank 0 by the transfer timeout (1.5 s), naming rank
 * 1; or (released) at once when the stop flag rises, long before a 20 s
 * timeout. */
static int dead_peer(int rank, int n, const ncclUniqueId *id, bool released) {
  zb_transport *t = make(rank, n, id, NULL, released ? 20 : 1.5);
  zb_diag d;
  RCHECK(t && zb_transport_connect(t, NULL, NULL, 10, &d) == ZB_OK, "connect: %s", d.msg);
  float *buf;
  cudaMalloc((void **)&buf, 64);
  if (rank == 1)
    raise(SIGKILL);
  pthread_t th;
  if (released)
    pthread_create(&th, NULL, stop_later, NULL);
  double t0 = nf_now();
  zb_err err = zb_transport_recv(t, 1, (zb_tag){ZB_OP_F, 0, 5}, buf, 64, &d);
  double took = nf_now() - t0;
  if (released)
    pthread_join(th, NULL);
  RCHECK(err == ZB_ERR_IO && strstr(d.msg, "from rank 1 (recv F s0 mb5)"), "err %d: %s", err, d.msg);
  if (released) {
    RCHECK(strstr(d.msg, "stopped") && strstr(d.msg, "released"), "%s", d.msg);
    RCHECK(took > 0.25 && took < 4.0, "took %.2f s (released after 0.3 s; the timeout is 20 s)", took);
  } else {
    RCHECK(strstr(d.msg, "did not complete within 1.5 s (transfer_timeout_s)"), "%s", d.msg);
    RCHECK(took > 1.4 && took < 6.0, "took %.2f s (timeout 1.5 s; slack for a loaded machine)", took);
  }
  zb_transport_free(t);
  return 0;
}

static int rank_dead_timeout(int rank, int n, const ncclUniqueId *id) {
  return dead_peer(rank, n, id, false);
}

static int rank_dead_released(int rank, int n, const ncclUniqueId *id) {
  return dead_peer(rank, n, id, true);
}

/* Rank 1 never joins: rank 0's connect times out after 1 s and says so;
 * then the stop flag ends a fresh transport's connect at once. */
static int rank_init_timeout(int rank, int n, const ncclUniqueId *id) {
  if (rank == 1)
    return 0;
  zb_transport *t = make(rank, n, id, NULL, 1.0);
  zb_diag d;
  double t0 = nf_now();
  RCHECK(t && zb_transport_connect(t, NULL, NULL, 0, &d) == ZB_ERR_IO, "connect succeeded alone");
  RCHECK(strstr(d.msg, "init") && strstr(d.msg, "timed out after 1.0 s"), "%s", d.msg);
  RCHECK(nf_now() - t0 < 6, "took %.2f s (timeout 1 s; slack for a loaded machine)", nf_now() - t0);
  zb_transport_free(t);
  t = make(rank, n, id, NULL, 30);
  atomic_store(&g_stop, true);
  RCHECK(zb_transport_connect(t, NULL, NULL, 0, &d) == ZB_ERR_IO && strstr(d.msg, "stopped"), "%s", d.msg);
  zb_transport_free(t);
  return 0;
}

static int run(int n, nf_rank_fn fn, const char *name) {
  int status[NF_MAX];
  double t0 = nf_now();
  int bad = nf_run(n, fn, 60, status);
  fprintf(stderr, "%s with %d ranks: %d rank(s) failed, %.2f s\n", name, n, bad, nf_now() - t0);
  return bad;
}

int main(void) {
  setenv("ZB_STANDIN_NCCL_TIMEOUT_MS", "20000", 1); /* the transport's own timeouts must fire first */
  int fails = run(2, rank_exchange, "exchange");
  fails += run(4, rank_exchange, "exchange");
  fails += run(2, rank_idle, "idle timeout");
  fails += run(2, rank_host, "host messages");
  fails += run(2, rank_abort, "abort");
  setenv("ZB_STANDIN_NCCL_PEER_LOSS", "hang", 1);
  fails += run(2, rank_dead_timeout, "dead silent peer, transfer timeout") != 1; /* the killed rank fails */
  fails += run(2, rank_dead_released, "dead silent peer, released") != 1;
  unsetenv("ZB_STANDIN_NCCL_PEER_LOSS");
  fails += run(2, rank_init_timeout, "init timeout");
  uint8_t id[128];
  zb_diag d;
  int rank = -1;
  RCHECK(zb_transport_nccl_unique_id(id, &d) == ZB_OK && memcmp(id + 112, "ZBSTNDIN", 8) == 0,
         "unique id: %s", d.msg);
  fprintf(stderr, "%s\n", fails ? "FAILED" : "all passed");
  return fails ? 1 : 0;
}
