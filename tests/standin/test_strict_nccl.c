/* test_strict_nccl.c — the nccl transport's share of the error-injection
 * sweep (test-only; docs/model.md, The CPU stand-in, Error injection): two
 * forked ranks bring up the transport (worker/transport_nccl.c), exchange a
 * grouped ring of device buffers ordered after the compute stream, and a
 * message outside a group, then tear down. A rank exits 1 at its first
 * error, printing zb's message; fail_sweep.py runs this failing each call
 * site of the transport in turn.
 */
#include <cuda_runtime.h>
#include <stdatomic.h>

#include "nccl_fork.h"
#include "zb_transport.h"

enum { N = 256 };
static atomic_bool g_stop;

#define WANT(expr)                                                                                           \
  do {                                                                                                       \
    if ((err = (expr)) != ZB_OK)                                                                             \
      goto out;                                                                                              \
  } while (0)

static int rank_main(int rank, int n, const ncclUniqueId *id) {
  cudaStream_t cs = NULL;
  float *sbuf = NULL, *rbuf = NULL;
  zb_transport *t = NULL;
  zb_diag d = {{0}};
  zb_err err = ZB_ERR_IO;
  if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&sbuf, N * sizeof(float)) != cudaSuccess ||
      cudaMalloc((void **)&rbuf, N * sizeof(float)) != cudaSuccess) {
    snprintf(d.msg, sizeof d.msg, "test setup: %s", cudaGetErrorString(cudaGetLastError()));
    goto out;
  }
  zb_nccl_config cfg = {.rank = rank, .nranks = n, .compute_stream = cs, .stop = &g_stop, .timeout_s = 3};
  memcpy(cfg.unique_id, id, sizeof cfg.unique_id);
  WANT(zb_transport_nccl_new(&cfg, &t, &d));
  WANT(zb_transport_connect(t, NULL, NULL, 3, &d));
  int right = (rank + 1) % n, left = (rank + n - 1) % n;
  zb_transport_group_start(t);
  WANT(zb_transport_send(t, right, (zb_tag){ZB_OP_F, rank, 1}, sbuf, N * sizeof(float), &d));
  WANT(zb_transport_recv(t, left, (zb_tag){ZB_OP_F, left, 1}, rbuf, N * sizeof(float), &d));
  WANT(zb_transport_group_end(t, &d));
  zb_tag to = {ZB_OP_B, rank, 2}, from = {ZB_OP_B, rank ^ 1, 2};
  WANT(rank == 0 ? zb_transport_send(t, 1, to, sbuf, 16, &d) : zb_transport_recv(t, 0, from, rbuf, 16, &d));
  WANT(cudaStreamSynchronize(cs) == cudaSuccess ? ZB_OK : ZB_ERR_IO);
out:
  if (err)
    fprintf(stderr, "rank %d: error: %s\n", rank, d.msg);
  zb_transport_free(t);
  cudaFree(sbuf);
  cudaFree(rbuf);
  if (cs)
    cudaStreamDestroy(cs);
  return err ? 1 : 0;
}

int main(void) {
  setenv("ZB_STANDIN_NCCL_TIMEOUT_MS", "5000", 1); /* the transport's own timeouts fire first */
  int status[NF_MAX];
  return nf_run(2, rank_main, 60, status) ? 1 : 0;
}
