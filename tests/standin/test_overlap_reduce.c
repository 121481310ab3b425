/* test_overlap_reduce.c — a cuda job's gradient reduction overlaps the
 * compute after it (issue 31; docs/schedules.md, Gradient reduction):
 * d = 2 forked replicas of one pipeline rank hosting stages 0 and 1 run
 * the executor over the cuda backend (the built-in model on the
 * stand-in's device) with the cuda job's reduce hooks
 * (cpu_job_reduce_stage / cpu_job_reduce_wait on the stage group's
 * zb_group_comm). The list puts REDUCE_GRAD(1) after stage 1's last W and
 * stage 0's B and W ops after it, then WAIT_REDUCE_GRAD; stage 0 is
 * reduced before the step (cpu_job_reduce_rest), outside the measured
 * iteration. The stand-in's delay knobs make compute (every stream item)
 * and the all-reduce (the link) each take substantial time.
 *
 * Four runs, each two fresh replicas: compute delayed only, link delayed
 * only, both with the device-ordered executor, both with blocking_comm
 * (the host-blocking reduction before overlap). With L the link delay
 * (what the all-reduce takes on the stand-in) and C the compute-only
 * iteration, the overlapped iteration must hide at least half of L behind
 * the compute after REDUCE_GRAD: it must stay within C + L/2 while L is
 * below that compute; the blocking run, which waits for the all-reduce
 * before submitting stage 0's work, must not. (Not the link-only run R:
 * it still does the ops' real arithmetic, which under ASan is a good part
 * of R and overlaps nothing.) The reduced gradients must
 * be bit-identical across the replicas (which read different text) and
 * equal the blocking run's bits: an all-reduce that read gradients before
 * their last W, or a scale or zeroing not ordered after it, changes them.
 * Prints the figures.
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <stdint.h>
#include <sys/mman.h>

#include "cpu_job.h"
#include "nccl_fork.h"
#include "standin.h"
#include "zb_device.h"
#include "zb_executor.h"
#include "zb_group_comm.h"

enum { D = 2, M = 4, ITERS = 2, NSTAGES = 2, NACT = 3 * NSTAGES * M + 2, NMAX = 1 << 17 };

typedef struct run_cfg {
  unsigned compute_us, link_us;
  bool blocking;
  bool record; /* keep the gradients before their reduction, last iteration */
} run_cfg;

typedef struct run_out {
  double wall[D];              /* mean over the timed iterations */
  size_t n[NSTAGES];           /* each stage's parameters */
  float raw[D][NSTAGES][NMAX]; /* before the reduction (record), last iteration */
  float fin[D][NSTAGES][NMAX]; /* after it */
  int64_t host_syncs[D];       /* the backend's, last iteration */
} run_out;

static run_cfg g_cfg;
static run_out *g_out;     /* shared with the replicas (MAP_SHARED) */
static ncclUniqueId g_gid; /* the stage group's id, from nf_ids_root before each run */
static zb_action g_acts[NACT];
static zb_costs *g_costs;
static const char g_text[] = "Replicas read different text; their reduced gradients agree bit for bit. "
                             "The reduction runs on its own stream while stage zero computes.";

static zb_action act(int op, int stage, int mb) {
  return (zb_action){.op = (uint64_t)op, .stage = stage, .mb = mb, .peer = -1};
}

/* F of both stages per microbatch; stage 1's B and W; REDUCE_GRAD(1);
 * stage 0's B and W; WAIT_REDUCE_GRAD. */
static void build_list(void) {
  int n = 0;
  for (int mb = 0; mb < M; mb++) {
    g_acts[n++] = act(ZB_OP_F, 0, mb);
    g_acts[n++] = act(ZB_OP_F, 1, mb);
  }
  for (int s = 1; s >= 0; s--) {
    for (int mb = 0; mb < M; mb++) {
      g_acts[n++] = act(ZB_OP_B, s, mb);
      g_acts[n++] = act(ZB_OP_W, s, mb);
    }
    if (s == 1)
      g_acts[n++] = act(ZB_OP_REDUCE_GRAD, 1, -1);
  }
  g_acts[n++] = act(ZB_OP_WAIT_REDUCE_GRAD, -1, -1);
}

/* Hosted stage i's gradients (pulled to the host) into out[i]; false
 * when the pull fails or they do not fit. */
static bool grads_to(zb_backend *b, int i, float (*out)[NMAX]) {
  zb_model_stage *st = zb_backend_cpu_stage(b, i, NULL);
  size_t n = zb_model_n_params(st);
  if (n > NMAX || zb_model_pull(st, NULL) != ZB_OK)
    return false;
  memcpy(out[i], zb_model_grads(st), n * sizeof(float));
  g_out->n[i] = n;
  return true;
}

static int g_rank; /* the replica this process runs */

/* The cuda job's hook, keeping the gradients it is about to reduce on a
 * recording run's last iteration (host-blocking: the backend is synced). */
static zb_err record_reduce(void *ud, int stage, int iteration, zb_diag *diag) {
  cpu_job *cj = ud;
  if (g_cfg.record && iteration == ITERS && !grads_to(cj->be, stage, g_out->raw[g_rank]))
    return zb_diag_set(diag, ZB_ERR_IO, "could not keep stage %d's gradients", stage);
  return cpu_job_reduce_stage(ud, stage, iteration, diag);
}

static zb_cpu_backend_config backend_cfg(zb_device *dev, zb_cpu_text *text, const int *stages) {
  return (zb_cpu_backend_config){.rank = 0,
                                 .stages = stages,
                                 .n_stages = NSTAGES,
                                 .total_stages = NSTAGES,
                                 .model = {.hidden = 32,
                                           .heads = 2,
                                           .layers = 2,
                                           .seq_len = 16,
                                           .batch = 2,
                                           .seed = 7,
                                           .loss_scale = 1.0f / M,
                                           .device = dev},
                                 .data = {zb_backend_cpu_text_fill, text, NULL},
                                 .device = dev};
}

/* The stage group of this replica, connected. */
static zb_err group_of(int replica, zb_device *dev, zb_group_comm **g, zb_diag *d) {
  int ranks[D] = {0, 1};
  zb_group_comm_config gc = {.stage = 0,
                             .size = D,
                             .index = replica,
                             .ranks = ranks,
                             .compute_stream = dev->ops->stream(dev->self),
                             .timeout_s = 60};
  memcpy(gc.unique_id, &g_gid, sizeof gc.unique_id);
  zb_err err = zb_group_comm_new(&gc, g, d);
  return err ? err : zb_group_comm_connect(*g, d);
}

/* One replica: a warm-up iteration, then ITERS timed ones, each followed
 * by the reduction of stage 0 before the (absent) step. */
static int rank_main(int rank, int n, const ncclUniqueId *id) {
  g_rank = rank;
  standin_set_delay_us(g_cfg.compute_us);
  standin_set_nccl_delay_us(g_cfg.link_us);
  zb_diag d = {{0}};
  zb_device *dev = NULL;
  zb_cuda_device_config dc = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  RCHECK(zb_device_cuda_new(&dc, &dev, &d) == ZB_OK, "%s", d.msg);
  zb_cpu_text text = {.text = (const uint8_t *)g_text, .len = sizeof g_text - 1, .seed = 11 + (uint64_t)rank};
  int stages[NSTAGES] = {0, 1};
  zb_cpu_backend_config bc = backend_cfg(dev, &text, stages);
  zb_backend *b = NULL;
  RCHECK(zb_backend_cpu_new(&bc, &b, &d) == ZB_OK, "%s", d.msg);
  zb_nccl_config nc = {
      .rank = rank, .nranks = n, .compute_stream = dev->ops->stream(dev->self), .timeout_s = 60};
  memcpy(nc.unique_id, id, sizeof nc.unique_id);
  zb_transport *t = NULL;
  RCHECK(zb_transport_nccl_new(&nc, &t, &d) == ZB_OK, "%s", d.msg);
  RCHECK(zb_transport_connect(t, NULL, NULL, 60, &d) == ZB_OK, "%s", d.msg);
  zb_group_comm *g = NULL;
  RCHECK(group_of(rank, dev, &g, &d) == ZB_OK, "%s", d.msg);
  bool reduced[NSTAGES] = {false}, unscaled[NSTAGES] = {false};
  cpu_job cj = {.device = dev,
                .be = b,
                .rank = 0,
                .nranks = 1,
                .peer_base = rank,
                .replica = rank,
                .data_parallel = D,
                .reduced = reduced,
                .unscaled = unscaled,
                .tr = t,
                .group_comm = g,
                .stages = stages,
                .n_stages = NSTAGES,
                .total_stages = NSTAGES,
                .microbatches = M};
  zb_executor_config ec = {.rank = 0,
                           .nranks = 1,
                           .peer_base = rank,
                           .actions = g_acts,
                           .n_actions = NACT,
                           .costs = g_costs,
                           .bytes_per_activation = zb_backend_cpu_bytes_per_activation(&bc.model),
                           .blocking_comm = g_cfg.blocking,
                           .reduce = record_reduce,
                           .reduce_wait = cpu_job_reduce_wait,
                           .reduce_abort = cpu_job_reduce_abort,
                           .reduce_ud = &cj};
  zb_executor *e = NULL;
  RCHECK(zb_executor_new(&ec, b, t, &e, &d) == ZB_OK, "%s", d.msg);
  double wall = 0;
  for (int k = 0; k <= ITERS; k++) {
    zb_rank_iteration it;
    RCHECK(zb_backend_cpu_begin_iteration(b, k, &d) == ZB_OK, "%s", d.msg);
    RCHECK(zb_executor_run_iteration(e, k, &it, &d) == ZB_OK, "%s", d.msg);
    if (g_cfg.record && k == ITERS) /* stage 0, which reduce_rest reduces */
      RCHECK(grads_to(b, 0, g_out->raw[rank]), "stage 0's gradients");
    RCHECK(cpu_job_reduce_rest(&cj, t, k, &d) == ZB_OK, "%s", d.msg);
    wall += k > 0 ? it.wall_seconds / ITERS : 0; /* iteration 0 warms up (slots, connections) */
    g_out->host_syncs[rank] = it.host_syncs;
  }
  g_out->wall[rank] = wall;
  for (int i = 0; i < NSTAGES; i++)
    RCHECK(grads_to(b, i, g_out->fin[rank]), "stage %d's gradients", i);
  zb_executor_free(e);
  zb_group_comm_free(g);
  zb_transport_free(t);
  zb_backend_free(b);
  zb_device_free(dev);
  return 0;
}

/* Runs both replicas under cfg; the slower one's wall per iteration. */
static bool run(const char *label, run_cfg cfg, run_out *out) {
  g_cfg = cfg;
  memset(g_out, 0, sizeof *g_out);
  pid_t root = nf_ids_root(1, &g_gid);
  if (root < 0) {
    fprintf(stderr, "%s: no stage group id\n", label);
    return false;
  }
  int status[NF_MAX];
  int bad = nf_run(D, rank_main, 300, status);
  nf_ids_root_end(root);
  *out = *g_out;
  printf("%-34s %8.3f s/iteration  (host syncs %lld, %lld)\n", label, fmax(out->wall[0], out->wall[1]),
         (long long)out->host_syncs[0], (long long)out->host_syncs[1]);
  if (bad)
    fprintf(stderr, "%s: %d replica(s) failed\n", label, bad);
  return bad == 0;
}

static double wall_of(const run_out *o) {
  return fmax(o->wall[0], o->wall[1]);
}

/* Both replicas hold the same reduced bits, and they are the mean of
 * ref's recorded gradients, (g0 + g1) * (1/2): exact in float whatever
 * the order of the sum, so any reduction that read or scaled them
 * unordered shows. */
static int same_bits(const char *label, const run_out *o, const run_out *ref) {
  int fails = 0;
  for (int i = 0; i < NSTAGES; i++) {
    size_t bad = 0, n = ref->n[i];
    for (size_t k = 0; k < n; k++) {
      float want = (ref->raw[0][i][k] + ref->raw[1][i][k]) * (1.0f / D);
      bad += memcmp(&o->fin[0][i][k], &want, sizeof want) || memcmp(&o->fin[1][i][k], &want, sizeof want);
    }
    if (bad || n == 0 || o->n[i] != n || memcmp(ref->raw[0][i], ref->raw[1][i], n * sizeof(float)) == 0) {
      fprintf(stderr, "FAIL: %s: stage %d: %zu of %zu reduced gradients are not the replicas' mean\n", label,
              i, bad, n);
      fails++;
    }
  }
  return fails;
}

/* The overlap assertion: at most C plus half of L (see the top). */
static bool overlapped(double both, double compute, double link) {
  return both <= compute + 0.5 * link;
}

static int check(const run_out *c, const run_out *r, const run_out *o, const run_out *blk, double tl) {
  double tc = wall_of(c), tr = wall_of(r), to = wall_of(o), tb = wall_of(blk);
  printf("reduce overlap: compute %.3f s, link delay %.3f s (link-only run %.3f s); overlapped %.3f s, "
         "blocking %.3f s (%.2f of the link delay hidden vs %.2f)\n",
         tc, tl, tr, to, tb, (tc + tl - to) / tl, (tc + tl - tb) / tl);
  int fails = 0;
  if (!(tl < 0.6 * tc)) {
    fprintf(stderr,
            "the link delay %.3f s is not below the compute after REDUCE_GRAD (about a third of %.3f s): "
            "the test shows nothing\n",
            tl, tc);
    fails++;
  }
  if (!overlapped(to, tc, tl)) {
    fprintf(stderr,
            "FAIL: the overlapped iteration took %.3f s, over compute + half the link delay (%.3f s)\n", to,
            tc + 0.5 * tl);
    fails++;
  }
  if (overlapped(tb, tc, tl)) {
    fprintf(stderr, "FAIL: the blocking reduction passed the overlap assertion (%.3f s): it shows nothing\n",
            tb);
    fails++;
  }
  return fails + same_bits("overlapped", o, blk) + same_bits("blocking", blk, blk) +
         same_bits("compute only", c, blk) + same_bits("link only", r, blk);
}

int main(void) {
  g_out = mmap(NULL, sizeof *g_out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_out == MAP_FAILED)
    return 2;
  build_list();
  zb_rank_costs rc = zb_rank_costs_default();
  g_costs = zb_costs_from_rank_share(1, NSTAGES, &rc, 0);
  const unsigned compute_us = 1500, link_us = 250000;
  static run_out c, r, o, blk; /* large */
  bool ok = run("compute only (link delay 0)", (run_cfg){compute_us, 0, false, false}, &c) &&
            run("reduction only (item delay 0)", (run_cfg){0, link_us, false, false}, &r) &&
            run("both, overlapped", (run_cfg){compute_us, link_us, false, false}, &o) &&
            run("both, blocking (before overlap)", (run_cfg){compute_us, link_us, true, true}, &blk);
  int fails = ok ? check(&c, &r, &o, &blk, link_us * 1e-6) : 1;
  zb_costs_free(g_costs);
  munmap(g_out, sizeof *g_out);
  printf("%s\n", fails ? "FAILED" : "ok");
  return fails ? 1 : 0;
}
