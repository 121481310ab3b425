/* test_group_comm.c — the stage groups' NCCL collectives
 * (worker/group_comm_nccl.c, the source zb-worker builds) and the NCCL
 * stand-in's collectives they run on (nccl_standin_coll.c), between forked
 * ranks on the stand-in's device memory:
 *   - all-reduce, reduce-scatter then all-gather (ZeRO-1's pair) for d = 2
 *     and 3, n even, odd and below d: within rounding of the tcp ring's
 *     sum (zb_collective.h's order; the stand-in sums in another), the
 *     same bits on every member, the ring's shards;
 *   - ordering: a producer the compute stream runs late is what is
 *     reduced, and a consumer on the compute stream reads the result;
 *   - two groups (stages) side by side, p = 2, d = 2;
 *   - a lost member, killed with NCCL silent (the transfer timeout) or
 *     hung while the stop flag rises: the others fail naming the group;
 *   - bad arguments named; the stand-in's own rules: an out-of-place
 *     all-gather deferred by a group until ncclGroupEnd, mismatched calls
 *     named on both sides, a failed collective blocking the stream until
 *     the rank's own ncclCommAbort.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#include "nccl_fork.h"
#include "standin.h"
#include "zb_collective.h"
#include "zb_group_comm.h"

#define NMAX 1300
#define NSIZES 3
#define NSLOT (2 * NSIZES)

static atomic_bool g_stop;
static int g_p = 1;                /* stages: groups side by side */
static ncclUniqueId g_ids[2];      /* each group's id, from nf_ids_root before the ranks fork */
static float (*g_out)[NMAX];       /* shared: each rank's results (NSLOT rows), for the cross-rank check */
static enum { KILL, HANG } g_lost; /* how the lost member goes */

static float x_of(int g, size_t i) {
  return (float)((i * 37u + (unsigned)g * 101u) % 1000u) / 7.0f - 60.0f;
}

/* The ring's sum of element e (zb_collective.h: shard j is summed as
 * ((x[j+1] + x[j+2]) + ...) + x[j]) over stage r's d members, and the
 * sum of magnitudes for the tolerance. */
static float ring_sum(int r, int d, size_t n, size_t e, float *mag) {
  int j = 0;
  for (int m = 0; m < d; m++) {
    size_t off, len;
    zb_ring_shard(n, d, m, &off, &len);
    if (e >= off && e < off + len)
      j = m;
  }
  float acc = x_of(((j + 1) % d) * g_p + r, e);
  *mag = 0;
  for (int k = 2; k <= d; k++)
    acc = acc + x_of(((j + k) % d) * g_p + r, e);
  for (int m = 0; m < d; m++)
    *mag += x_of(m * g_p + r, e) < 0 ? -x_of(m * g_p + r, e) : x_of(m * g_p + r, e);
  return d == 1 ? x_of(r, e) : acc;
}

static zb_group_comm *make(int g, int d, double timeout_s, cudaStream_t cs) {
  int ranks[8];
  for (int m = 0; m < d; m++)
    ranks[m] = m * g_p + g % g_p;
  zb_group_comm_config cfg = {.stage = g % g_p,
                              .size = d,
                              .index = g / g_p,
                              .ranks = ranks,
                              .compute_stream = cs,
                              .stop = &g_stop,
                              .timeout_s = timeout_s};
  memcpy(cfg.unique_id, &g_ids[g % g_p], sizeof cfg.unique_id);
  zb_group_comm *gc = NULL;
  zb_diag d0;
  if (zb_group_comm_new(&cfg, &gc, &d0) != ZB_OK || zb_group_comm_connect(gc, &d0) != ZB_OK) {
    fprintf(stderr, "rank %d: %s\n", g, d0.msg);
    zb_group_comm_free(gc);
    return NULL;
  }
  return gc;
}

/* A compute-stream op that fills the buffer late (50 ms): a collective
 * not ordered after it would reduce zeros. */
typedef struct fill {
  float *dev;
  size_t n;
  int g;
} fill;

static cudaError_t fill_late(void *arg) {
  fill *f = arg;
  nf_sleep_ms(50);
  float *v = standin_view(f->dev, sizeof(float) * f->n, "fill_late");
  for (size_t i = 0; i < f->n; i++)
    v[i] = x_of(f->g, i);
  return cudaSuccess;
}

/* A compute-stream op that copies the buffer out: it reads the result
 * only if the collective ordered the compute stream after itself. */
typedef struct grab {
  const float *dev;
  float *host;
  size_t n;
} grab;

static cudaError_t grab_now(void *arg) {
  grab *g = arg;
  memcpy(g->host, standin_view(g->dev, sizeof(float) * g->n, "grab_now"), sizeof(float) * g->n);
  return cudaSuccess;
}

/* Checks host[0..n) against the ring's sum within rounding (shard i
 * only when own >= 0) and publishes it for the cross-rank check. */
static int check_sum(int rank, int d, size_t n, const float *host, int own, const char *what) {
  size_t off = 0, len = n;
  if (own >= 0)
    zb_ring_shard(n, d, own, &off, &len);
  for (size_t e = off; e < off + len; e++) {
    float mag, want = ring_sum(rank % g_p, d, n, e, &mag);
    float diff = host[e] > want ? host[e] - want : want - host[e];
    RCHECK(diff <= 2e-7f * (float)d * mag, "%s n=%zu element %zu: %.9g, ring %.9g", what, n, e,
           (double)host[e], (double)want);
  }
  return 0;
}

/* One n: all-reduce (filled late, read by a compute-stream op), then
 * reduce-scatter and all-gather of the same input. */
static int one_size(int rank, int d, zb_group_comm *gc, cudaStream_t cs, float *dev, size_t n, int slot) {
  zb_diag e;
  float host[NMAX];
  fill f = {dev, n, rank};
  grab gb = {dev, host, n};
  standin_enqueue(cs, fill_late, &f, NULL);
  RCHECK(zb_group_comm_all_reduce(gc, dev, n, &e) == ZB_OK, "%s", e.msg);
  standin_enqueue(cs, grab_now, &gb, NULL);
  RCHECK(zb_group_comm_wait(gc, &e) == ZB_OK, "%s", e.msg);
  cudaStreamSynchronize(cs);
  if (check_sum(rank, d, n, host, -1, "all-reduce"))
    return 1;
  memcpy(g_out[rank * NSLOT + slot], host, sizeof(float) * n);
  standin_enqueue(cs, fill_late, &f, NULL);
  RCHECK(zb_group_comm_reduce_scatter(gc, dev, n, &e) == ZB_OK, "%s", e.msg);
  standin_enqueue(cs, grab_now, &gb, NULL);
  cudaStreamSynchronize(cs);
  if (check_sum(rank, d, n, host, rank / g_p, "reduce-scatter"))
    return 1;
  RCHECK(zb_group_comm_all_gather(gc, dev, n, &e) == ZB_OK, "%s", e.msg);
  standin_enqueue(cs, grab_now, &gb, NULL);
  RCHECK(zb_group_comm_wait(gc, &e) == ZB_OK, "%s", e.msg);
  cudaStreamSynchronize(cs);
  if (check_sum(rank, d, n, host, -1, "reduce-scatter + all-gather"))
    return 1;
  memcpy(g_out[rank * NSLOT + slot + NSIZES], host, sizeof(float) * n);
  return 0;
}

/* 1200: d = 2 and 3 divide it (in place); 1001: neither (staged, one
 * short shard); 1000 with d = 3: two short shards (a 2D copy of two rows) */
static const size_t g_sizes[NSIZES] = {1200, 1001, 1000};

static int rank_sums(int rank, int n, const ncclUniqueId *id) {
  (void)id;
  int d = n / g_p;
  cudaStream_t cs;
  cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking);
  zb_group_comm *gc = make(rank, d, 10, cs);
  RCHECK(gc, "make");
  float *dev;
  cudaMalloc((void **)&dev, sizeof(float) * NMAX);
  for (int k = 0; k < NSIZES; k++)
    if (one_size(rank, d, gc, cs, dev, g_sizes[k], k))
      return 1;
  float host[NMAX];
  fill f = {dev, 2, rank};
  grab gb = {dev, host, 2};
  zb_diag e; /* n = 2 below d = 3: the last shard is empty */
  standin_enqueue(cs, fill_late, &f, NULL);
  RCHECK(zb_group_comm_reduce_scatter(gc, dev, 2, &e) == ZB_OK &&
             zb_group_comm_all_gather(gc, dev, 2, &e) == ZB_OK,
         "%s", e.msg);
  standin_enqueue(cs, grab_now, &gb, NULL);
  RCHECK(zb_group_comm_wait(gc, &e) == ZB_OK, "%s", e.msg);
  cudaStreamSynchronize(cs);
  if (check_sum(rank, d, 2, host, -1, "n = 2"))
    return 1;
  zb_group_comm_free(gc);
  return 0;
}

/* Runs rank_sums on p * d ranks; then every group's members must hold
 * the same bits. */
static int sums(int p, int d) {
  g_p = p;
  pid_t root = nf_ids_root(p, g_ids);
  if (root < 0)
    return 1;
  memset(g_out, 0, sizeof(float) * NMAX * NSLOT * NF_MAX);
  int status[NF_MAX];
  double t0 = nf_now();
  int bad = nf_run(p * d, rank_sums, 60, status);
  nf_ids_root_end(root);
  for (int g = p; g < p * d && !bad; g++)
    if (memcmp(g_out[g * NSLOT], g_out[(g % p) * NSLOT], sizeof(float) * NMAX * NSLOT) != 0) {
      fprintf(stderr, "rank %d's results differ from rank %d's in their bits\n", g, g % p);
      bad++;
    }
  fprintf(stderr, "sums, p = %d, d = %d: %d rank(s) failed, %.2f s\n", p, d, bad, nf_now() - t0);
  return bad;
}

/* ---- a lost member ---- */

static void *stop_later(void *arg) {
  (void)arg;
  nf_sleep_ms(300);
  atomic_store(&g_stop, true);
  return NULL;
}

/* The last member is killed (NCCL silent: ZB_STANDIN_NCCL_PEER_LOSS=hang)
 * or hangs without calling; the others' wait fails by the 4 s transfer
 * timeout, or within 0.3 s of the stop flag (released), naming the group. */
static int rank_lost(int rank, int n, const ncclUniqueId *id) {
  (void)id;
  /* 4 s: the timeout bounds the group's init too, which under ASan with
   * three processes starting at once takes over a second */
  zb_group_comm *gc = make(rank, n, g_lost == KILL ? 4 : 20, NULL);
  RCHECK(gc, "make");
  float *dev;
  cudaMalloc((void **)&dev, sizeof(float) * 64);
  if (rank == n - 1 && g_lost == KILL)
    raise(SIGKILL);
  if (rank == n - 1) {
    nf_sleep_ms(2500);
    zb_group_comm_free(gc);
    return 0;
  }
  pthread_t th;
  if (g_lost == HANG)
    pthread_create(&th, NULL, stop_later, NULL);
  zb_diag e;
  double t0 = nf_now();
  zb_err err = zb_group_comm_all_reduce(gc, dev, 64, &e);
  if (!err)
    err = zb_group_comm_wait(gc, &e);
  double took = nf_now() - t0;
  if (g_lost == HANG)
    pthread_join(th, NULL);
  RCHECK(err == ZB_ERR_IO && strstr(e.msg, "stage 0's group (member") && strstr(e.msg, "all-reduce of 64"),
         "err %d: %s", err, e.msg);
  if (g_lost == KILL) {
    RCHECK(strstr(e.msg, "did not complete within 4 s (transfer_timeout_s)"), "%s", e.msg);
    RCHECK(took > 3.9 && took < 12.0, "took %.2f s (timeout 4 s; slack for a loaded machine)", took);
  } else {
    RCHECK(strstr(e.msg, "stopped"), "%s", e.msg);
    RCHECK(took > 0.25 && took < 4.0, "took %.2f s (stopped after 0.3 s; the timeout is 20 s)", took);
  }
  RCHECK(zb_group_comm_all_gather(gc, dev, 64, &e) == ZB_ERR_IO && strstr(e.msg, "failed before"), "%s",
         e.msg);
  zb_group_comm_free(gc);
  return 0;
}

static int lost(int d, int mode) {
  g_p = 1;
  g_lost = mode;
  pid_t root = nf_ids_root(1, g_ids);
  if (root < 0)
    return 1;
  int status[NF_MAX];
  int bad = nf_run(d, rank_lost, 60, status);
  nf_ids_root_end(root);
  fprintf(stderr, "lost member (%s), d = %d: %d rank(s) failed\n", mode == KILL ? "killed" : "hung", d, bad);
  return bad != (mode == KILL ? 1 : 0); /* the killed rank is the one failure */
}

/* Bad arguments, without peers: named, and they poison the group. */
static int bad_args(void) {
  int rank = -1;
  zb_group_comm_config cfg = {.stage = 3, .size = 2, .index = 2};
  zb_group_comm *gc = NULL;
  zb_diag e;
  RCHECK(zb_group_comm_new(&cfg, &gc, &e) == ZB_ERR_INVALID_ARG && strstr(e.msg, "stage 3's group: member 2"),
         "%s", e.msg);
  cfg.index = 1;
  RCHECK(zb_group_comm_new(&cfg, &gc, &e) == ZB_OK, "%s", e.msg);
  float *dev;
  cudaMalloc((void **)&dev, 64);
  RCHECK(zb_group_comm_all_reduce(gc, dev, 16, &e) == ZB_ERR_INVALID_ARG && strstr(e.msg, "not connected") &&
             strstr(e.msg, "stage 3's group (member 1 of 2)"),
         "%s", e.msg);
  RCHECK(zb_group_comm_connect(gc, &e) == ZB_ERR_INVALID_ARG && strstr(e.msg, "failed before"), "%s", e.msg);
  zb_group_comm_free(gc);
  cudaFree(dev);
  return 0;
}

/* ---- the stand-in's own rules, through raw NCCL calls ---- */

/* Waits until stream s is idle or comm has an async error; returns it. */
static ncclResult_t settle(ncclComm_t c, cudaStream_t s, double limit_s) {
  double end = nf_now() + limit_s;
  ncclResult_t a = ncclSuccess;
  while (nf_now() < end) {
    ncclCommGetAsyncError(c, &a);
    if (a != ncclSuccess || cudaStreamQuery(s) == cudaSuccess)
      return a;
    nf_sleep_ms(1);
  }
  return ncclInProgress;
}

/* An out-of-place all-gather inside a group (deferred to ncclGroupEnd),
 * checked exactly; then rank 0 calls ncclAllReduce of 64 floats and rank
 * 1 ncclReduceScatter of 32: the rank that sees it first fails as
 * ncclInvalidUsage naming both calls (raw() checks one did), the other
 * as ncclInvalidUsage too or ncclRemoteError, and each stream stays
 * blocked until the rank's own abort. */
static int rank_raw(int rank, int n, const ncclUniqueId *id) {
  (void)id;
  ncclComm_t c = NULL;
  RCHECK(ncclCommInitRank(&c, n, g_ids[0], rank) == ncclSuccess, "init");
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *send, *recv, host[64 * NF_MAX];
  cudaMalloc((void **)&send, sizeof host);
  cudaMalloc((void **)&recv, sizeof host);
  for (int i = 0; i < 64; i++)
    host[i] = x_of(rank, (size_t)i);
  cudaMemcpy(send, host, sizeof(float) * 64, cudaMemcpyHostToDevice);
  cudaMemset(recv, 0, sizeof host);
  RCHECK(ncclGroupStart() == ncclSuccess, "group start");
  RCHECK(ncclAllGather(send, recv, 64, ncclFloat, c, s) == ncclSuccess, "%s", ncclGetLastError(c));
  nf_sleep_ms(100);
  const float *peek = standin_view(recv, sizeof(float) * 64 * (size_t)n, "peek");
  RCHECK(peek[64 * (1 - rank)] == 0.0f, "the peer's part arrived before ncclGroupEnd");
  RCHECK(ncclGroupEnd() == ncclSuccess, "group end");
  RCHECK(settle(c, s, 10) == ncclSuccess, "%s", ncclGetLastError(c));
  cudaMemcpy(host, recv, sizeof(float) * 64 * (size_t)n, cudaMemcpyDeviceToHost);
  for (int i = 0; i < 64 * n; i++)
    RCHECK(host[i] == x_of(i / 64, (size_t)(i % 64)), "all-gather element %d: %g", i, (double)host[i]);
  ncclResult_t r = rank == 0 ? ncclAllReduce(send, recv, 64, ncclFloat, ncclSum, c, s)
                             : ncclReduceScatter(send, recv, 32, ncclFloat, ncclSum, c, s);
  RCHECK(r == ncclSuccess, "post");
  ncclResult_t a = settle(c, s, 5);
  const char *msg = ncclGetLastError(c);
  bool named = a == ncclInvalidUsage &&
               strstr(msg, rank == 0 ? "ncclAllReduce of 64 x ncclFloat32 (ncclSum) does not match peer 1's "
                                       "ncclReduceScatter of 32 x ncclFloat32"
                                     : "ncclReduceScatter of 32 x ncclFloat32 (ncclSum) does not match peer "
                                       "0's ncclAllReduce of 64 x ncclFloat32");
  /* the first to see the mismatch fails and closes; the other may see that first */
  RCHECK(named || a == ncclRemoteError, "async %d: %s", a, msg);
  g_out[rank * NSLOT][0] = named ? 1.0f : 0.0f;
  nf_sleep_ms(300);
  RCHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the stream moved on before this rank's abort");
  RCHECK(ncclCommAbort(c) == ncclSuccess && cudaStreamSynchronize(s) == cudaSuccess, "abort");
  return 0;
}

static int raw(void) {
  pid_t root = nf_ids_root(1, g_ids);
  if (root < 0)
    return 1;
  int status[NF_MAX];
  g_out[0][0] = g_out[NSLOT][0] = 0;
  int bad = nf_run(2, rank_raw, 60, status);
  nf_ids_root_end(root);
  if (!bad && g_out[0][0] + g_out[NSLOT][0] < 1) {
    fprintf(stderr, "neither rank's error named both calls\n");
    bad++;
  }
  fprintf(stderr, "raw NCCL calls: %d rank(s) failed\n", bad);
  return bad;
}

int main(void) {
  g_out = mmap(NULL, sizeof(float) * NMAX * NSLOT * NF_MAX, PROT_READ | PROT_WRITE,
               MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  setenv("ZB_STANDIN_NCCL_TIMEOUT_MS", "20000", 1); /* the group's own timeouts must fire first */
  int fails = sums(1, 2);
  fails += sums(1, 3);
  fails += sums(2, 2);
  setenv("ZB_STANDIN_NCCL_PEER_LOSS", "hang", 1);
  fails += lost(3, KILL);
  unsetenv("ZB_STANDIN_NCCL_PEER_LOSS");
  fails += lost(2, HANG);
  fails += raw();
  fails += bad_args(); /* last: it makes a group (and the stand-in's threads) in this process */
  fprintf(stderr, "%s\n", fails ? "FAILED" : "all passed");
  return fails ? 1 : 0;
}
