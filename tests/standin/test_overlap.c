/* test_overlap.c — transfers overlap compute (issue 30; docs/schedules.md,
 * Execution model): two forked ranks run a lowered gpipe plan through the
 * executor over the cuda backend (the built-in model on the stand-in's
 * device) and the nccl transport, with the stand-in's delay knobs making
 * compute (ZB_STANDIN_DELAY_US, every stream item) and transfers
 * (ZB_STANDIN_NCCL_DELAY_US, the link) each take substantial time.
 *
 * Four runs, each two fresh ranks: compute delayed only, link delayed only,
 * both with the device-ordered executor, both with blocking_comm (the
 * executor before overlap). The overlapped iteration must take about
 * max(compute, transfer): it must hide at least half of the smaller of
 * the two (a generous margin for a shared machine; a perfect overlap
 * hides all of it), which the blocking run must fail, since it waits for
 * every group and drains the device before every send. Both runs must
 * also compute the same loss and gradients, bit for bit: a consumer
 * ordered too early would read a receive's buffer before it landed.
 * Prints the figures (wall per iteration of each run).
 */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS */
#include <math.h>
#include <stdint.h>
#include <sys/mman.h>

#include "nccl_fork.h"
#include "standin.h"
#include "zb_backend_cpu.h"
#include "zb_device.h"
#include "zb_executor.h"
#include "zb_lower.h"
#include "zb_plan.h"

enum { P = 2, M = 8, ITERS = 2 };

/* What the parent sets before forking a run, and what ranks hand back. */
typedef struct run_cfg {
  unsigned compute_us, link_us;
  bool blocking;
} run_cfg;

typedef struct run_out {
  double wall[P];      /* mean over the timed iterations */
  double loss;         /* rank 1's last loss */
  double grad_sum[P];  /* a checksum of each rank's gradients after the last iteration */
  double comm_wait[P]; /* the host's seconds in transport calls, last iteration */
} run_out;

static run_cfg g_cfg;
static run_out *g_out; /* shared with the ranks (MAP_SHARED) */
static zb_schedule *g_plan;
static zb_costs *g_costs;
static const char g_text[] = "Pipelines overlap transfers with compute when streams order them. "
                             "A receive's consumer waits on the device, not on the host.";

/* A weighted sum of b's gradients, pulled to the host mirror first. */
static double grad_sum(zb_backend *b) {
  double s = 0;
  for (int i = 0; i < zb_backend_cpu_n_stages(b); i++) {
    zb_model_stage *st = zb_backend_cpu_stage(b, i, NULL);
    if (zb_model_pull(st, NULL) != ZB_OK)
      return NAN;
    const float *g = zb_model_grads(st);
    for (size_t k = 0; k < zb_model_n_params(st); k++)
      s += (double)g[k] * (double)((k % 7) + 1);
  }
  return s;
}

static zb_model_config model_cfg(zb_device *dev) {
  return (zb_model_config){.hidden = 32,
                           .heads = 2,
                           .layers = 2,
                           .seq_len = 16,
                           .batch = 2,
                           .seed = 7,
                           .loss_scale = 1.0f / M,
                           .device = dev};
}

/* One rank: device, backend, transport, executor; a warm-up iteration,
 * then ITERS timed ones. */
static int rank_main(int rank, int n, const ncclUniqueId *id) {
  standin_set_delay_us(g_cfg.compute_us);
  standin_set_nccl_delay_us(g_cfg.link_us);
  zb_diag d = {{0}};
  zb_device *dev = NULL;
  zb_cuda_device_config dc = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  RCHECK(zb_device_cuda_new(&dc, &dev, &d) == ZB_OK, "%s", d.msg);
  static zb_cpu_text text = {.text = (const uint8_t *)g_text, .len = sizeof g_text - 1, .seed = 11};
  int stage = rank;
  zb_cpu_backend_config bc = {.rank = rank,
                              .stages = &stage,
                              .n_stages = 1,
                              .total_stages = P,
                              .model = model_cfg(dev),
                              .data = {zb_backend_cpu_text_fill, &text, NULL},
                              .device = dev};
  zb_backend *b = NULL;
  RCHECK(zb_backend_cpu_new(&bc, &b, &d) == ZB_OK, "%s", d.msg);
  zb_nccl_config nc = {
      .rank = rank, .nranks = n, .compute_stream = dev->ops->stream(dev->self), .timeout_s = 60};
  memcpy(nc.unique_id, id, sizeof nc.unique_id);
  zb_transport *t = NULL;
  RCHECK(zb_transport_nccl_new(&nc, &t, &d) == ZB_OK, "%s", d.msg);
  RCHECK(zb_transport_connect(t, NULL, NULL, 60, &d) == ZB_OK, "%s", d.msg);
  const zb_rank_list *l = &g_plan->ranks[rank];
  zb_executor_config ec = {.rank = rank,
                           .nranks = n,
                           .actions = l->actions,
                           .n_actions = l->n,
                           .costs = g_costs,
                           .bytes_per_activation = zb_backend_cpu_bytes_per_activation(&bc.model),
                           .blocking_comm = g_cfg.blocking};
  zb_executor *e = NULL;
  RCHECK(zb_executor_new(&ec, b, t, &e, &d) == ZB_OK, "%s", d.msg);
  double wall = 0;
  for (int k = 0; k <= ITERS; k++) {
    zb_rank_iteration it;
    RCHECK(zb_backend_cpu_begin_iteration(b, k, &d) == ZB_OK, "%s", d.msg);
    RCHECK(zb_executor_run_iteration(e, k, &it, &d) == ZB_OK, "%s", d.msg);
    wall += k > 0 ? it.wall_seconds / ITERS : 0; /* iteration 0 warms up (slots, connections) */
    g_out->comm_wait[rank] = it.comm_seconds;
  }
  g_out->wall[rank] = wall;
  g_out->grad_sum[rank] = grad_sum(b);
  if (rank == P - 1)
    RCHECK(zb_backend_cpu_loss(b, &g_out->loss, NULL, &d) == ZB_OK, "%s", d.msg);
  zb_executor_free(e);
  zb_transport_free(t);
  zb_backend_free(b);
  zb_device_free(dev);
  return 0;
}

/* Runs both ranks under cfg; the slower rank's wall per iteration. */
static bool run(const char *label, run_cfg cfg, run_out *out) {
  g_cfg = cfg;
  memset(g_out, 0, sizeof *g_out);
  int status[NF_MAX];
  int bad = nf_run(P, rank_main, 300, status);
  *out = *g_out;
  double wall = fmax(out->wall[0], out->wall[1]);
  printf("%-34s %8.3f s/iteration  (host in transport calls: %.3f, %.3f s)\n", label, wall, out->comm_wait[0],
         out->comm_wait[1]);
  if (bad)
    fprintf(stderr, "%s: %d rank(s) failed\n", label, bad);
  return bad == 0;
}

static double wall_of(const run_out *o) {
  return fmax(o->wall[0], o->wall[1]);
}

/* The overlap assertion: both more than max(compute, transfer) would not
 * be surprising, but at most that plus half of the smaller. */
static bool overlapped(double both, double compute, double transfer) {
  return both <= fmax(compute, transfer) + 0.5 * fmin(compute, transfer);
}

int main(void) {
  g_out = mmap(NULL, sizeof *g_out, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (g_out == MAP_FAILED)
    return 2;
  zb_plan_request req = {.family = ZB_FAMILY_GPIPE, .p = P, .v = 1, .m = M};
  zb_schedule *plan = NULL;
  zb_diag d = {{0}};
  if (zb_plan_generate(&req, &plan, &d) || zb_lower(plan, NULL, &g_plan, &d)) {
    fprintf(stderr, "plan: %s\n", d.msg);
    return 2;
  }
  zb_schedule_free(plan);
  zb_rank_costs rc = zb_rank_costs_default();
  g_costs = zb_costs_from_rank_share(P, 1, &rc, 0);

  /* compute: about 1.5 ms per stream item; link: 40 ms per group */
  const unsigned compute_us = 1500, link_us = 40000;
  run_out c, t, o, blk;
  bool ok = run("compute only (link delay 0)", (run_cfg){compute_us, 0, false}, &c) &&
            run("transfer only (item delay 0)", (run_cfg){0, link_us, false}, &t) &&
            run("both, overlapped", (run_cfg){compute_us, link_us, false}, &o) &&
            run("both, blocking (before overlap)", (run_cfg){compute_us, link_us, true}, &blk);
  int fails = !ok;
  if (ok) {
    double tc = wall_of(&c), tt = wall_of(&t), to = wall_of(&o), tb = wall_of(&blk);
    printf("overlap: max(compute, transfer) %.3f s, sum %.3f s; overlapped %.3f s (%.2f of max), blocking "
           "%.3f s (%.2f of sum)\n",
           fmax(tc, tt), tc + tt, to, to / fmax(tc, tt), tb, tb / (tc + tt));
    if (!(tc > 0.3 * tt && tt > 0.3 * tc)) {
      fprintf(stderr, "compute %.3f s and transfer %.3f s are not of one size: the test shows nothing\n", tc,
              tt);
      fails++;
    }
    if (!overlapped(to, tc, tt)) {
      fprintf(stderr, "FAIL: the overlapped iteration took %.3f s, over max + half the smaller (%.3f s)\n",
              to, fmax(tc, tt) + 0.5 * fmin(tc, tt));
      fails++;
    }
    if (overlapped(tb, tc, tt)) {
      fprintf(stderr, "FAIL: the blocking executor passed the overlap assertion (%.3f s): it shows nothing\n",
              tb);
      fails++;
    }
    if (o.loss != blk.loss || o.grad_sum[0] != blk.grad_sum[0] || o.grad_sum[1] != blk.grad_sum[1] ||
        !isfinite(o.loss) || o.grad_sum[0] == 0 || o.grad_sum[1] == 0) {
      fprintf(stderr,
              "FAIL: overlapped and blocking runs differ: loss %.9g vs %.9g, grads %.9g/%.9g vs %.9g/%.9g\n",
              o.loss, blk.loss, o.grad_sum[0], o.grad_sum[1], blk.grad_sum[0], blk.grad_sum[1]);
      fails++;
    }
  }
  zb_schedule_free(g_plan);
  zb_costs_free(g_costs);
  munmap(g_out, sizeof *g_out);
  printf("%s\n", fails ? "FAILED" : "ok");
  return fails ? 1 : 0;
}
