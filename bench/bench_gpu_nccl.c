/* bench_gpu_nccl.c — zb_bench_gpu's section 2 (bench_gpu.h): NCCL
 * send/recv from GPU --gpu to GPU --gpu + 1 through zb's nccl transport
 * (worker/transport_nccl.c, the one zb-worker runs; docs/model.md,
 * Transports) beside a plain ncclSend/ncclRecv loop of the same sizes.
 *
 * Two ranks run as two threads of this process, each on its own GPU, with
 * its own device (zb_device_cuda_new) and its own communicator (one rank
 * per thread, so each thread's ncclCommInitRank needs no group around it).
 * Rank 0 sends, rank 1 receives, --reps messages per size after one
 * warm-up message; both start together (a barrier) and each size's time
 * is the slower rank's wall clock over the messages:
 *   zb     zb_transport_send / zb_transport_recv, one group per message,
 *          each returning when its message is through (as the executor
 *          waits for a step's group);
 *   plain  ncclSend / ncclRecv on the device's stream in a loop, one
 *          stream synchronisation after the last.
 * Sizes: one activation of the model (batch x seq x hidden fp32, what a
 * pipeline sends), then 1 MiB, 4 MiB, ... up to --nccl-max-mib.
 *
 * Threads: the caller's starts two rank threads and joins them; they share
 * only the pair below (a barrier, an abort flag, result slots of their
 * own). A failing rank raises the abort flag (its peer's barrier and
 * transport waits end) and the section reports the error and exits 1.
 */
#include <cuda_runtime.h>
#include <nccl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "zb_clock.h"
#include "zb_transport.h"

#define MAX_SIZES 24
#define NCCL_TIMEOUT_S 60.0

typedef struct nccl_pair {
  const gpu_opts *o;
  uint8_t zb_id[128];
  ncclUniqueId plain_id;
  size_t sizes[MAX_SIZES], max_bytes;
  int n_sizes;
  double zb_s[2][MAX_SIZES], plain_s[2][MAX_SIZES]; /* each rank's seconds for reps messages */
  char err[2][sizeof(((zb_diag *)0)->msg)];
  atomic_bool stop; /* a rank failed: the other stops waiting */
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int arrived, generation;
} nccl_pair;

typedef struct nccl_rank {
  nccl_pair *pair;
  int rank;
  zb_device *dev;
  void *buf;
} nccl_rank;

/* Both ranks reach this point; false when the other rank failed. */
static bool pair_wait(nccl_pair *p) {
  pthread_mutex_lock(&p->mu);
  int gen = p->generation;
  if (++p->arrived == 2) {
    p->arrived = 0;
    p->generation++;
    pthread_cond_broadcast(&p->cv);
  }
  while (gen == p->generation && !atomic_load(&p->stop))
    pthread_cond_wait(&p->cv, &p->mu);
  bool ok = !atomic_load(&p->stop);
  pthread_mutex_unlock(&p->mu);
  return ok;
}

static void pair_fail(nccl_rank *r, const char *fmt, const char *msg) {
  nccl_pair *p = r->pair;
  pthread_mutex_lock(&p->mu);
  if (!atomic_load(&p->stop)) /* the first failure is the reason; the other rank's is its echo */
    snprintf(p->err[r->rank], sizeof p->err[r->rank], fmt, msg);
  atomic_store(&p->stop, true);
  pthread_cond_broadcast(&p->cv);
  pthread_mutex_unlock(&p->mu);
}

/* count messages of bytes through the transport, in the rank's direction. */
static zb_err zb_messages(nccl_rank *r, zb_transport *t, size_t bytes, int count, zb_diag *d) {
  zb_err err = ZB_OK;
  for (int k = 0; k < count && !err; k++) {
    zb_tag tag = {.kind = ZB_OP_F, .stage = 0, .mb = k};
    err = r->rank == 0 ? zb_transport_send(t, 1, tag, r->buf, bytes, d)
                       : zb_transport_recv(t, 0, tag, r->buf, bytes, d);
  }
  return err;
}

static bool run_zb(nccl_rank *r) {
  nccl_pair *p = r->pair;
  zb_nccl_config cfg = {.rank = r->rank,
                        .nranks = 2,
                        .compute_stream = r->dev->ops->stream(r->dev->self),
                        .stop = &p->stop,
                        .timeout_s = NCCL_TIMEOUT_S};
  memcpy(cfg.unique_id, p->zb_id, sizeof cfg.unique_id);
  zb_transport *t = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_transport_nccl_new(&cfg, &t, &d);
  err = err ? err : zb_transport_connect(t, NULL, NULL, NCCL_TIMEOUT_S, &d);
  for (int i = 0; i < p->n_sizes && !err; i++) {
    err = pair_wait(p) ? zb_messages(r, t, p->sizes[i], 1, &d) : ZB_ERR_IO; /* warm-up */
    if (err || !pair_wait(p))
      break;
    double t0 = zb_clock_s();
    err = zb_messages(r, t, p->sizes[i], p->o->reps, &d);
    p->zb_s[r->rank][i] = zb_clock_s() - t0;
  }
  zb_transport_free(t);
  if (err)
    pair_fail(r, "zb's nccl transport: %s", d.msg);
  return !err && !atomic_load(&p->stop);
}

/* count plain messages on the device's stream, then one synchronisation. */
static ncclResult_t plain_messages(nccl_rank *r, ncclComm_t comm, size_t bytes, int count) {
  cudaStream_t s = (cudaStream_t)r->dev->ops->stream(r->dev->self);
  ncclResult_t res = ncclSuccess;
  for (int k = 0; k < count && res == ncclSuccess; k++)
    res = r->rank == 0 ? ncclSend(r->buf, bytes, ncclChar, 1, comm, s)
                       : ncclRecv(r->buf, bytes, ncclChar, 0, comm, s);
  if (res == ncclSuccess && cudaStreamSynchronize(s) != cudaSuccess)
    res = ncclUnhandledCudaError;
  return res;
}

static bool run_plain(nccl_rank *r) {
  nccl_pair *p = r->pair;
  ncclComm_t comm = NULL;
  zb_diag d = {{0}};
  if (r->dev->ops->sync(r->dev->self, &d)) { /* also makes the rank's GPU current on this thread */
    pair_fail(r, "sync: %s", d.msg);
    return false;
  }
  ncclResult_t res = ncclCommInitRank(&comm, 2, p->plain_id, r->rank);
  for (int i = 0; i < p->n_sizes && res == ncclSuccess; i++) {
    if (!pair_wait(p))
      break;
    res = plain_messages(r, comm, p->sizes[i], 1); /* warm-up */
    if (res != ncclSuccess || !pair_wait(p))
      break;
    double t0 = zb_clock_s();
    res = plain_messages(r, comm, p->sizes[i], p->o->reps);
    p->plain_s[r->rank][i] = zb_clock_s() - t0;
  }
  if (res != ncclSuccess) {
    pair_fail(r, "plain ncclSend/ncclRecv: %s", ncclGetErrorString(res));
    if (comm)
      ncclCommAbort(comm);
    return false;
  }
  ncclCommDestroy(comm);
  return !atomic_load(&p->stop);
}

static void *rank_main(void *arg) {
  nccl_rank *r = arg;
  zb_cuda_device_config dc = {.ordinal = r->pair->o->gpu + r->rank, .precision = ZB_PRECISION_FP32};
  zb_diag d = {{0}};
  if (zb_device_cuda_new(&dc, &r->dev, &d) ||
      r->dev->ops->alloc(r->dev->self, r->pair->max_bytes, &r->buf, &d)) {
    pair_fail(r, "device: %s", d.msg);
  } else if (pair_wait(r->pair) && run_zb(r)) {
    run_plain(r);
  }
  if (r->buf)
    r->dev->ops->free(r->dev->self, r->buf);
  zb_device_free(r->dev);
  return NULL;
}

static void pair_sizes(nccl_pair *p, const gpu_opts *o) {
  size_t act = (size_t)o->batch * o->seq * o->hidden * sizeof(float), max = (size_t)o->nccl_max_mib << 20;
  p->sizes[p->n_sizes++] = act;
  for (size_t b = (size_t)1 << 20; b <= max && p->n_sizes < MAX_SIZES; b *= 4)
    p->sizes[p->n_sizes++] = b;
  p->max_bytes = act > max ? act : max;
}

static void print_results(const nccl_pair *p, const gpu_opts *o) {
  printf("%12s %10s %9s %10s %9s %9s\n", "bytes", "zb ms", "GB/s", "plain ms", "GB/s", "zb/plain");
  for (int i = 0; i < p->n_sizes; i++) {
    double z = p->zb_s[0][i] > p->zb_s[1][i] ? p->zb_s[0][i] : p->zb_s[1][i];
    double q = p->plain_s[0][i] > p->plain_s[1][i] ? p->plain_s[0][i] : p->plain_s[1][i];
    z /= o->reps;
    q /= o->reps;
    printf("%12zu %10.3f %9.2f %10.3f %9.2f %8.0f%%%s\n", p->sizes[i], z * 1e3,
           (double)p->sizes[i] / z * 1e-9, q * 1e3, (double)p->sizes[i] / q * 1e-9, 100.0 * q / z,
           i == 0 ? "  (one activation)" : "");
  }
  printf("\n");
}

void gpu_bench_nccl(const gpu_opts *o, int n_gpus) {
  int version = 0;
  ncclGetVersion(&version);
  if (o->gpu + 1 >= n_gpus) {
    printf("2. NCCL %d send/recv: needs 2 GPUs (GPU %d and %d; this machine has %d); not measured\n\n",
           version, o->gpu, o->gpu + 1, n_gpus);
    return;
  }
  static nccl_pair p; /* large; one at a time */
  memset(&p, 0, sizeof p);
  p.o = o;
  pthread_mutex_init(&p.mu, NULL);
  pthread_cond_init(&p.cv, NULL);
  atomic_init(&p.stop, false);
  pair_sizes(&p, o);
  zb_diag d = {{0}};
  if (zb_transport_nccl_unique_id(p.zb_id, &d))
    gpu_die("zb_transport_nccl_unique_id", &d);
  ncclResult_t res = ncclGetUniqueId(&p.plain_id);
  if (res != ncclSuccess) {
    snprintf(d.msg, sizeof d.msg, "%s", ncclGetErrorString(res));
    gpu_die("ncclGetUniqueId", &d);
  }
  printf("2. NCCL %d send/recv, GPU %d -> GPU %d, two ranks as two threads; mean of %d messages per size\n",
         version, o->gpu, o->gpu + 1, o->reps);
  printf("   zb: zb's nccl transport, one group per message; plain: ncclSend/ncclRecv in a loop, one sync\n");
  pthread_t th[2];
  nccl_rank r[2] = {{.pair = &p, .rank = 0}, {.pair = &p, .rank = 1}};
  for (int i = 0; i < 2; i++)
    pthread_create(&th[i], NULL, rank_main, &r[i]);
  for (int i = 0; i < 2; i++)
    pthread_join(th[i], NULL);
  for (int i = 0; i < 2; i++)
    if (p.err[i][0]) {
      fprintf(stderr, "zb_bench_gpu: NCCL: rank %d: %s\n", i, p.err[i]);
      exit(1);
    }
  print_results(&p, o);
  pthread_mutex_destroy(&p.mu);
  pthread_cond_destroy(&p.cv);
}
