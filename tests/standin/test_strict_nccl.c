/* test_strict_nccl.c — the nccl transport's share of the error-injection
 * sweep (test-only; docs/model.md, The CPU stand-in, Error injection): two
 * forked ranks bring up the transport (worker/transport_nccl.c), exchange a
 * grouped ring of device buffers ordered after the compute stream, and a
 * message outside a group; then a stage group (worker/group_comm_nccl.c)
 * all-reduces, reduce-scatters and all-gathers (n = 257: the staged path)
 * and waits; then both tear down. A rank exits 1 at its first
 * error, printing zb's message; fail_sweep.py runs this failing each call
 * site of the transport in turn.
 */
#include <cuda_runtime.h>
#include <stdatomic.h>

#include "nccl_fork.h"
#include "zb_group_comm.h"
#include "zb_transport.h"

enum { N = 256 };
static atomic_bool g_stop;
static ncclUniqueId g_group_id; /* from nf_ids_root before the fork */

#define WANT(expr)                                                                                           \
  do {                                                                                                       \
    if ((err = (expr)) != ZB_OK)                                                                             \
      goto out;                                                                                              \
  } while (0)

static int rank_main(int rank, int n, const ncclUniqueId *id) {
  cudaStream_t cs = NULL;
  float *sbuf = NULL, *rbuf = NULL;
  zb_transport *t = NULL;
  zb_group_comm *g = NULL;
  zb_diag d = {{0}};
  zb_err err = ZB_ERR_IO;
  if (cudaStreamCreateWithFlags(&cs, cudaStreamNonBlocking) != cudaSuccess ||
      cudaMalloc((void **)&sbuf, (N + 1) * sizeof(float)) != cudaSuccess ||
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
  zb_group_comm_config gcfg = {
      .size = n, .index = rank, .compute_stream = cs, .stop = &g_stop, .timeout_s = 3};
  memcpy(gcfg.unique_id, &g_group_id, sizeof gcfg.unique_id);
  WANT(zb_group_comm_new(&gcfg, &g, &d));
  WANT(zb_group_comm_connect(g, &d));
  WANT(zb_group_comm_all_reduce(g, sbuf, N, &d));
  WANT(zb_group_comm_reduce_scatter(g, sbuf, N + 1, &d));
  WANT(zb_group_comm_all_gather(g, sbuf, N + 1, &d));
  WANT(zb_group_comm_wait(g, &d));
out:
  if (err)
    fprintf(stderr, "rank %d: error: %s\n", rank, d.msg);
  zb_transport_free(t);
  zb_group_comm_free(g);
  cudaFree(sbuf);
  cudaFree(rbuf);
  if (cs)
    cudaStreamDestroy(cs);
  return err ? 1 : 0;
}

int main(void) {
  setenv("ZB_STANDIN_NCCL_TIMEOUT_MS", "5000", 1); /* the transport's own timeouts fire first */
  pid_t root = nf_ids_root(1, &g_group_id);
  if (root < 0) {
    fprintf(stderr, "error: no stage group id\n");
    return 1;
  }
  int status[NF_MAX];
  int bad = nf_run(2, rank_main, 60, status);
  nf_ids_root_end(root);
  return bad ? 1 : 0;
}
