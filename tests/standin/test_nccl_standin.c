/* test_nccl_standin.c — the NCCL stand-in across real processes
 * (tests/standin/nccl_standin.h): init through an id from rank 0 (a real
 * libnccl id when the library loads), grouped rings and pairwise exchanges
 * with device buffers and checked data, and the failures it must report:
 * an unmatched send named after the timeout, a count mismatch naming both
 * sides, a killed peer seen by its neighbour promptly (or, as NCCL over
 * shared memory, not at all), a failed op blocking its stream until the
 * rank's own ncclCommAbort unblocks it, a host pointer refused.
 */
#include <dlfcn.h>
#include <stdint.h>

#include "nccl_fork.h"
#include "standin.h"

/* Non-blocking init polled to completion (ranks >= 2 of 4 use the blocking
 * call, so both paths run). */
static ncclComm_t join(int rank, int n, const ncclUniqueId *id) {
  ncclComm_t c = NULL;
  if (rank >= 2) {
    ncclResult_t r = ncclCommInitRank(&c, n, *id, rank);
    return r == ncclSuccess ? c : NULL;
  }
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclResult_t r = ncclCommInitRankConfig(&c, n, *id, rank, &cfg);
  if (r != ncclInProgress && r != ncclSuccess)
    return NULL;
  double end = nf_now() + 20;
  ncclResult_t a = ncclInProgress;
  while (nf_now() < end && ncclCommGetAsyncError(c, &a) == ncclSuccess && a == ncclInProgress)
    nf_sleep_ms(1);
  if (a != ncclSuccess) {
    fprintf(stderr, "rank %d: init: %s: %s\n", rank, ncclGetErrorString(a), ncclGetLastError(c));
    ncclCommAbort(c);
    return NULL;
  }
  return c;
}

/* Waits until stream s is idle or comm has an async error; returns it. */
static ncclResult_t settle(ncclComm_t c, cudaStream_t s, double limit_s) {
  double end = nf_now() + limit_s;
  ncclResult_t a = ncclSuccess;
  while (nf_now() < end) {
    ncclCommGetAsyncError(c, &a);
    if (a != ncclSuccess)
      return a;
    if (cudaStreamQuery(s) == cudaSuccess)
      return ncclSuccess;
    nf_sleep_ms(1);
  }
  return ncclInProgress;
}

static float value(int from, int to, int k, int i) {
  return (float)(from * 1000000 + to * 10000 + k * 1000 + i);
}

/* A grouped ring (send right, receive left) and, with the partner rank ^ 1,
 * a pairwise exchange of two messages each way in one group. */
static int rank_exchange(int rank, int n, const ncclUniqueId *id) {
  enum { N = 3000 };
  ncclComm_t c = join(rank, n, id);
  RCHECK(c, "init failed: %s", ncclGetLastError(NULL));
  cudaStream_t s;
  RCHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess, "stream");
  float *dev[4], host[N];
  for (int k = 0; k < 4; k++)
    RCHECK(cudaMalloc((void **)&dev[k], sizeof host) == cudaSuccess, "cudaMalloc");
  int right = (rank + 1) % n, left = (rank + n - 1) % n, partner = rank ^ 1;
  for (int i = 0; i < N; i++)
    host[i] = value(rank, right, 0, i);
  cudaMemcpy(dev[0], host, sizeof host, cudaMemcpyHostToDevice);
  RCHECK(ncclGroupStart() == ncclSuccess, "group start");
  RCHECK(ncclRecv(dev[1], N, ncclFloat, left, c, s) == ncclSuccess, "recv: %s", ncclGetLastError(c));
  RCHECK(ncclSend(dev[0], N, ncclFloat, right, c, s) == ncclSuccess, "send: %s", ncclGetLastError(c));
  RCHECK(ncclGroupEnd() == ncclSuccess, "group end");
  RCHECK(settle(c, s, 10) == ncclSuccess, "ring: %s", ncclGetLastError(c));
  cudaMemcpy(host, dev[1], sizeof host, cudaMemcpyDeviceToHost);
  for (int i = 0; i < N; i++)
    RCHECK(host[i] == value(left, rank, 0, i), "ring element %d: %g", i, (double)host[i]);
  /* two messages each way with the partner, in one group: order per direction */
  for (int k = 0; k < 2; k++) {
    for (int i = 0; i < N; i++)
      host[i] = value(rank, partner, k + 1, i);
    cudaMemcpy(dev[k], host, sizeof host, cudaMemcpyHostToDevice);
  }
  ncclGroupStart();
  for (int k = 0; k < 2; k++) {
    RCHECK(ncclSend(dev[k], N, ncclFloat, partner, c, s) == ncclSuccess, "send");
    RCHECK(ncclRecv(dev[2 + k], N, ncclFloat, partner, c, s) == ncclSuccess, "recv");
  }
  ncclGroupEnd();
  RCHECK(settle(c, s, 10) == ncclSuccess, "pairs: %s", ncclGetLastError(c));
  for (int k = 0; k < 2; k++) {
    cudaMemcpy(host, dev[2 + k], sizeof host, cudaMemcpyDeviceToHost);
    for (int i = 0; i < N; i++)
      RCHECK(host[i] == value(partner, rank, k + 1, i), "pair message %d element %d: %g", k, i,
             (double)host[i]);
  }
  /* a host buffer is refused by the device-pointer check */
  RCHECK(ncclSend(host, N, ncclFloat, right, c, s) == ncclInvalidArgument, "host pointer accepted");
  RCHECK(ncclCommDestroy(c) == ncclSuccess, "destroy");
  for (int k = 0; k < 4; k++)
    cudaFree(dev[k]);
  cudaStreamDestroy(s);
  return 0;
}

static int run(int n, nf_rank_fn fn, int expect_bad, const char *name) {
  int status[NF_MAX];
  double t0 = nf_now();
  int bad = nf_run(n, fn, 60, status);
  fprintf(stderr, "%s with %d ranks: %d rank(s) failed, %.2f s\n", name, n, bad, nf_now() - t0);
  return bad == expect_bad ? 0 : 1;
}

/* ---- failures ---- */

/* Rank 0 sends 64 floats that rank 1 never receives: rank 0's async error
 * names the send after the stand-in's timeout (0.8 s here). */
static int rank_unmatched(int rank, int n, const ncclUniqueId *id) {
  ncclComm_t c = join(rank, n, id);
  RCHECK(c, "init");
  float *d;
  cudaMalloc((void **)&d, 256);
  if (rank == 1) {
    nf_sleep_ms(3000); /* alive and connected, but posts nothing */
    ncclCommAbort(c);
    return 0;
  }
  double t0 = nf_now();
  RCHECK(ncclSend(d, 64, ncclFloat, 1, c, NULL) == ncclSuccess, "send");
  ncclResult_t a = settle(c, NULL, 2.5);
  double took = nf_now() - t0;
  RCHECK(a == ncclSystemError, "async %d (%s), want ncclSystemError", a, ncclGetErrorString(a));
  RCHECK(took >= 0.7 && took < 6.0, "reported after %.2f s (timeout 0.8 s; slack for a loaded machine)",
         took);
  const char *msg = ncclGetLastError(c);
  RCHECK(strstr(msg, "ncclSend of 64 x ncclFloat32 to peer 1") && strstr(msg, "unmatched"), "message: %s",
         msg);
  ncclCommAbort(c);
  return 0;
}

/* Rank 0 sends 64 floats, rank 1 receives 32: the sender finds it when the
 * receiver's credit arrives (before any data moves) and names both; the
 * receiver sees its peer fail. */
static int rank_mismatch(int rank, int n, const ncclUniqueId *id) {
  ncclComm_t c = join(rank, n, id);
  RCHECK(c, "init");
  float *d;
  cudaMalloc((void **)&d, 256);
  ncclResult_t r =
      rank == 0 ? ncclSend(d, 64, ncclFloat, 1, c, NULL) : ncclRecv(d, 32, ncclFloat, 0, c, NULL);
  RCHECK(r == ncclSuccess, "post");
  ncclResult_t a = settle(c, NULL, 5);
  RCHECK(a != ncclSuccess && a != ncclInProgress, "no error: %d", a);
  const char *msg = ncclGetLastError(c);
  if (rank == 0) {
    RCHECK(a == ncclInvalidUsage, "async %d: %s", a, msg);
    RCHECK(strstr(msg, "ncclSend of 64 x ncclFloat32 to peer 1") &&
               strstr(msg, "ncclRecv of 32 x ncclFloat32"),
           "message: %s", msg);
  } else {
    RCHECK(a == ncclRemoteError, "receiver's async %d: %s", a, msg);
  }
  ncclCommAbort(c);
  return 0;
}

/* The stream stays blocked (NCCL's kernels do not give up) until the own
 * ncclCommAbort, which drains it promptly. 0, or the RCHECK's 1. */
static int stuck_until_abort(int rank, ncclComm_t c, cudaStream_t s) {
  nf_sleep_ms(300);
  RCHECK(cudaStreamQuery(s) == cudaErrorNotReady, "the stream moved on before this rank's abort");
  double t0 = nf_now();
  RCHECK(ncclCommAbort(c) == ncclSuccess, "abort");
  RCHECK(cudaStreamSynchronize(s) == cudaSuccess, "stream");
  RCHECK(nf_now() - t0 < 5, "abort took %.2f s", nf_now() - t0);
  return 0;
}

/* Rank 1 is killed while rank 0 waits to send to it: rank 0's async error
 * is ncclRemoteError long before the (20 s) timeout (NCCL over sockets),
 * or, with ZB_STANDIN_NCCL_PEER_LOSS=hang (shared memory, NVLink), nothing
 * at all; either way its send stays blocked until its own abort. */
static int rank_killed(int rank, int n, const ncclUniqueId *id) {
  ncclComm_t c = join(rank, n, id);
  RCHECK(c, "init");
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *d;
  cudaMalloc((void **)&d, 1 << 22);
  if (rank == 1) {
    nf_sleep_ms(300);
    raise(SIGKILL);
  }
  double t0 = nf_now();
  RCHECK(ncclSend(d, 1 << 20, ncclFloat, 1, c, s) == ncclSuccess, "send");
  bool hang = getenv("ZB_STANDIN_NCCL_PEER_LOSS") != NULL;
  ncclResult_t a = settle(c, s, hang ? 1.5 : 5);
  if (hang) {
    RCHECK(a == ncclInProgress, "async %d (%s): want nothing seen", a, ncclGetLastError(c));
  } else {
    RCHECK(a == ncclRemoteError, "async %d: %s", a, ncclGetLastError(c));
    RCHECK(nf_now() - t0 < 8, "took %.2f s (the timeout is 20 s)", nf_now() - t0);
  }
  return stuck_until_abort(rank, c, s);
}

/* Rank 0 aborts a receive nobody answers: ncclCommAbort returns promptly
 * and its stream drains; rank 1, waiting on rank 0, sees ncclRemoteError
 * but stays blocked until it aborts too (another rank's abort wakes no
 * one, as in NCCL). */
static int rank_abort(int rank, int n, const ncclUniqueId *id) {
  ncclComm_t c = join(rank, n, id);
  RCHECK(c, "init");
  cudaStream_t s;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  float *d;
  cudaMalloc((void **)&d, 256);
  int peer = 1 - rank;
  RCHECK(ncclRecv(d, 64, ncclFloat, peer, c, s) == ncclSuccess, "recv");
  if (rank == 1) {
    double t0 = nf_now();
    ncclResult_t a = settle(c, s, 5);
    RCHECK(a == ncclRemoteError, "async %d: %s", a, ncclGetLastError(c));
    RCHECK(nf_now() - t0 < 8, "took %.2f s (the timeout is 20 s)", nf_now() - t0);
    return stuck_until_abort(rank, c, s);
  }
  nf_sleep_ms(300);
  double t0 = nf_now();
  RCHECK(ncclCommAbort(c) == ncclSuccess, "abort");
  RCHECK(cudaStreamSynchronize(s) == cudaSuccess, "stream");
  RCHECK(nf_now() - t0 < 5, "abort took %.2f s", nf_now() - t0);
  return 0;
}

/* The id: made by the real libnccl when it loads (bytes 0..35 used, the
 * stand-in's rendezvous at 112), and a bad id is refused. */
static int check_id(void) {
  int rank = -1;
  ncclUniqueId id;
  RCHECK(ncclGetUniqueId(&id) == ncclSuccess, "%s", ncclGetLastError(NULL));
  RCHECK(memcmp(id.internal + 112, "ZBSTNDIN", 8) == 0, "no stand-in rendezvous in the id");
  if (dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL)) {
    unsigned fam = (unsigned char)id.internal[8] | (unsigned)(unsigned char)id.internal[9] << 8;
    RCHECK(fam == 2 || fam == 10, "address family %u: not a real NCCL id", fam);
    for (int i = 36; i < 112; i++)
      RCHECK(id.internal[i] == 0, "byte %d of a real id is used", i);
    fprintf(stderr, "id made by the real libnccl (family %u)\n", fam);
  } else {
    fprintf(stderr, "libnccl.so.2 not loadable: stand-in-only id\n");
  }
  ncclUniqueId bad;
  memset(&bad, 0, sizeof bad);
  ncclComm_t c;
  RCHECK(ncclCommInitRank(&c, 2, bad, 0) == ncclInvalidArgument, "an id without rendezvous accepted");
  int v = 0;
  RCHECK(ncclGetVersion(&v) == ncclSuccess && v == NCCL_VERSION_CODE, "version %d", v);
  return 0;
}

int main(void) {
  int fails = run(2, rank_exchange, 0, "ring and pairs");
  fails += run(4, rank_exchange, 0, "ring and pairs");
  setenv("ZB_STANDIN_NCCL_TIMEOUT_MS", "800", 1);
  fails += run(2, rank_unmatched, 0, "unmatched send");
  fails += run(2, rank_mismatch, 0, "count mismatch");
  setenv("ZB_STANDIN_NCCL_TIMEOUT_MS", "20000", 1);
  fails += run(2, rank_killed, 1, "killed peer"); /* the killed rank is the one failure */
  setenv("ZB_STANDIN_NCCL_PEER_LOSS", "hang", 1);
  fails += run(2, rank_killed, 1, "killed peer, NCCL over shared memory");
  unsetenv("ZB_STANDIN_NCCL_PEER_LOSS");
  fails += run(2, rank_abort, 0, "abort");
  fails += check_id(); /* last: it leaves NCCL's and the stand-in's root threads in this process */
  fprintf(stderr, "%s\n", fails ? "FAILED" : "all passed");
  return fails ? 1 : 0;
}
