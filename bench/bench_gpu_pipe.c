/* bench_gpu_pipe.c — zb_bench_gpu's section 3 (bench_gpu.h): the bubble of
 * zb-v against 1f1b on the same job (docs/schedules.md, the bubble
 * definitions).
 *
 * The job: p ranks (the visible GPUs; 4 for the prediction when there are
 * fewer than two), m = 2p microbatches, a model of 2p blocks (zb-v: one
 * per stage, two stages per rank; 1f1b: two per stage), the benchmark's
 * hidden, heads, seq and batch, vocab 256 over a synthetic text. Both
 * families are planned by libzb's pipeline (zb_planner_run) with rank
 * costs from section 1: T_F, T_B, T_W = 2 x one block's measured time,
 * T_comm 0, the default memory model.
 *
 *   predicted  the planner's simulation of the lowered lists with those
 *              costs: makespan and bubble 1 - busy / (p x makespan).
 *   measured   (p >= 2 GPUs) every rank's lowered list run by the worker's
 *              executor (worker/zb_executor.h) over the cuda backend
 *              (worker/backend_cpu.c on its own GPU) and zb's nccl
 *              transport, ranks as threads of this process; one warm-up
 *              iteration, then --reps iterations. Per iteration: span =
 *              last rank's end - first rank's start, busy = the backends'
 *              F + B + W (device events), bubble = 1 - busy / (p x span);
 *              printed as means over the iterations.
 *
 * Threads: one per rank, joined before the section returns; each owns its
 * device, backend, transport and executor; they share the plan, the text
 * and a stop flag. A failing rank raises the flag (the executor aborts its
 * transport, so peers fail promptly) and the section exits 1 naming it.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_gpu.h"
#include "zb_alloc.h"
#include "zb_backend_cpu.h"
#include "zb_executor.h"
#include "zb_planner.h"
#include "zb_transport.h"

#define PIPE_TIMEOUT_S 120.0
#define PREDICT_P 4 /* ranks of the prediction on a machine with fewer than two GPUs */

static const zb_family fams[2] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_V};

/* What one family's run shares between its rank threads. */
typedef struct pipe_job {
  const gpu_opts *o;
  const zb_planner_result *plan;
  zb_model_config model;
  zb_cpu_text text;
  uint8_t nccl_id[128];
  int iterations;
  atomic_bool stop;
} pipe_job;

typedef struct pipe_rank {
  pipe_job *job;
  int rank;
  zb_rank_iteration *it; /* job->iterations entries */
  char err[sizeof(((zb_diag *)0)->msg)];
} pipe_rank;

static void plan(zb_family f, int p, const gpu_block_times *block, zb_planner_result *out) {
  zb_rank_costs rc = zb_rank_costs_default();
  rc.t_f = 2 * block->f; /* a rank's share: 2 of the 2p blocks */
  rc.t_b = 2 * block->b;
  rc.t_w = 2 * block->w;
  rc.t_comm = 0;
  zb_planner_request req = {.family = f, .p = p, .m = 2 * p, .rank = rc};
  zb_diag d = {{0}};
  if (zb_planner_run(&req, out, &d) != ZB_OK)
    gpu_die("zb_planner_run", &d);
}

/* One rank's iterations: its device, backend and transport, then the
 * executor over its lowered list. */
static zb_err rank_run(pipe_rank *r, zb_device *dev, zb_backend **b, zb_transport **t, zb_diag *d) {
  pipe_job *j = r->job;
  const zb_planner_result *pl = j->plan;
  int S = pl->p * pl->v, stages[8], n = 0;
  for (int s = 0; s < S && n < 8; s++)
    if (zb_placement_rank(pl->placement, pl->p, pl->v, s) == r->rank)
      stages[n++] = s;
  zb_cpu_backend_config bc = {.rank = r->rank,
                              .stages = stages,
                              .n_stages = n,
                              .total_stages = S,
                              .model = j->model,
                              .data = {zb_backend_cpu_text_fill, &j->text},
                              .device = dev,
                              .stop = &j->stop};
  zb_nccl_config nc = {.rank = r->rank,
                       .nranks = pl->p,
                       .compute_stream = dev->ops->stream(dev->self),
                       .stop = &j->stop,
                       .timeout_s = PIPE_TIMEOUT_S};
  memcpy(nc.unique_id, j->nccl_id, sizeof nc.unique_id);
  zb_err err = zb_backend_cpu_new(&bc, b, d);
  err = err ? err : zb_transport_nccl_new(&nc, t, d);
  err = err ? err : zb_transport_connect(*t, NULL, NULL, PIPE_TIMEOUT_S, d);
  const zb_rank_list *l = &pl->lowered->ranks[r->rank];
  zb_executor_config ec = {.rank = r->rank,
                           .nranks = pl->p,
                           .actions = l->actions,
                           .n_actions = l->n,
                           .costs = pl->costs,
                           .bytes_per_activation = zb_backend_cpu_bytes_per_activation(&j->model),
                           .stop = &j->stop};
  zb_executor *e = NULL;
  err = err ? err : zb_executor_new(&ec, *b, *t, &e, d);
  for (int k = 0; k < j->iterations && !err; k++) {
    err = zb_backend_cpu_begin_iteration(*b, k, d);
    err = err ? err : zb_executor_run_iteration(e, k, &r->it[k], d);
  }
  zb_executor_free(e);
  return err;
}

static void *rank_main(void *arg) {
  pipe_rank *r = arg;
  pipe_job *j = r->job;
  zb_cuda_device_config dc = {.ordinal = r->rank, .precision = j->o->precision};
  zb_device *dev = NULL;
  zb_backend *b = NULL;
  zb_transport *t = NULL;
  zb_diag d = {{0}};
  zb_err err = zb_device_cuda_new(&dc, &dev, &d);
  err = err ? err : rank_run(r, dev, &b, &t, &d);
  if (err) {
    bool first = !atomic_exchange(&j->stop, true); /* the others' failures echo this one */
    snprintf(r->err, sizeof r->err, "%s%s", first ? "" : "(after another rank failed) ", d.msg);
  }
  zb_backend_free(b); /* before its device */
  zb_transport_free(t);
  zb_device_free(dev);
  return NULL;
}

/* Mean span, busy per rank and bubble over iterations 1.. (0 warms up). */
typedef struct pipe_figures {
  double span, busy, bubble;
} pipe_figures;

static pipe_figures summarise(pipe_rank *r, int p, int iterations) {
  pipe_figures f = {0, 0, 0};
  for (int k = 1; k < iterations; k++) {
    double start = r[0].it[k].start_seconds, end = r[0].it[k].end_seconds, busy = 0;
    for (int q = 0; q < p; q++) {
      const zb_rank_iteration *it = &r[q].it[k];
      start = it->start_seconds < start ? it->start_seconds : start;
      end = it->end_seconds > end ? it->end_seconds : end;
      busy += it->busy_f_seconds + it->busy_b_seconds + it->busy_w_seconds;
    }
    f.span += end - start;
    f.busy += busy / p;
    f.bubble += 1.0 - busy / (p * (end - start));
  }
  int n = iterations - 1;
  f.span /= n;
  f.busy /= n;
  f.bubble /= n;
  return f;
}

/* Runs one planned family on p GPUs; exits 1 when a rank fails. */
static pipe_figures measure(const gpu_opts *o, const zb_planner_result *pl, const zb_cpu_text *text) {
  int p = pl->p;
  pipe_job j = {.o = o,
                .plan = pl,
                .model = {.vocab = 256,
                          .hidden = o->hidden,
                          .heads = o->heads,
                          .layers = 2 * p,
                          .seq_len = o->seq,
                          .batch = o->batch,
                          .seed = 1,
                          .loss_scale = 1.0f / (float)pl->m,
                          .attn_block = o->attn_block},
                .text = *text,
                .iterations = 1 + o->reps};
  atomic_init(&j.stop, false);
  zb_diag d = {{0}};
  if (zb_transport_nccl_unique_id(j.nccl_id, &d))
    gpu_die("zb_transport_nccl_unique_id", &d);
  pipe_rank *r = zb_calloc((size_t)p, sizeof *r);
  pthread_t *th = zb_calloc((size_t)p, sizeof *th);
  for (int q = 0; q < p; q++) {
    r[q] =
        (pipe_rank){.job = &j, .rank = q, .it = zb_calloc((size_t)j.iterations, sizeof(zb_rank_iteration))};
    pthread_create(&th[q], NULL, rank_main, &r[q]);
  }
  for (int q = 0; q < p; q++)
    pthread_join(th[q], NULL);
  for (int q = 0; q < p; q++)
    if (r[q].err[0] && strncmp(r[q].err, "(after", 6) != 0) {
      fprintf(stderr, "zb_bench_gpu: pipeline %s: rank %d: %s\n", zb_family_name(pl->family), q, r[q].err);
      exit(1);
    }
  pipe_figures f = summarise(r, p, j.iterations);
  for (int q = 0; q < p; q++)
    free(r[q].it);
  free(r);
  free(th);
  return f;
}

static void print_predicted(const zb_planner_result pl[2], int p) {
  printf("   predicted from measured op times (section 1's middle stage per block; comm, embedding and head "
         "not modelled), p = %d:\n",
         p);
  printf("   %-8s %14s %9s\n", "schedule", "iteration ms", "bubble");
  for (int i = 0; i < 2; i++)
    printf("   %-8s %14.3f %8.1f%%\n", zb_family_name(fams[i]), pl[i].sim->makespan * 1e3,
           100.0 * pl[i].sim->bubble_ratio);
  printf("   zb-v / 1f1b (predicted): iteration time %.3f, bubble %.3f\n",
         pl[1].sim->makespan / pl[0].sim->makespan, pl[1].sim->bubble_ratio / pl[0].sim->bubble_ratio);
}

static void print_measured(const pipe_figures f[2], int p, int iterations) {
  printf(
      "   measured: the executor over the cuda backend and the nccl transport, one rank per GPU (threads); "
      "mean of %d iterations after a warm-up, p = %d:\n",
      iterations, p);
  printf("   %-8s %14s %14s %9s\n", "schedule", "iteration ms", "busy ms/rank", "bubble");
  for (int i = 0; i < 2; i++)
    printf("   %-8s %14.3f %14.3f %8.1f%%\n", zb_family_name(fams[i]), f[i].span * 1e3, f[i].busy * 1e3,
           100.0 * f[i].bubble);
  printf("   zb-v / 1f1b (measured): iteration time %.3f, bubble %.3f\n", f[1].span / f[0].span,
         f[1].bubble / f[0].bubble);
}

void gpu_bench_pipeline(const gpu_opts *o, int n_gpus, const gpu_block_times *block) {
  int p = n_gpus >= 2 ? n_gpus : PREDICT_P;
  printf("3. zb-v against 1f1b on the same job: p = %d, m = %d, %d blocks (zb-v 1 per stage, 1f1b 2), "
         "hidden %d, %d heads, seq %d, batch %d, vocab 256\n",
         p, 2 * p, 2 * p, o->hidden, o->heads, o->seq, o->batch);
  zb_planner_result pl[2];
  memset(pl, 0, sizeof pl);
  for (int i = 0; i < 2; i++)
    plan(fams[i], p, block, &pl[i]);
  print_predicted(pl, p);
  if (n_gpus < 2) {
    printf("   measured: needs 2 GPUs or more (this machine has %d); not run\n", n_gpus);
  } else {
    size_t len = 65536 + (size_t)o->seq;
    uint8_t *bytes = zb_malloc(len);
    for (size_t i = 0; i < len; i++) /* lower-case words and spaces: a text of sorts */
      bytes[i] = (uint8_t)((i * 2654435761u >> 7) % 9 == 0 ? ' ' : 'a' + (i * 40503u >> 5) % 26);
    zb_cpu_text text = {.text = bytes, .len = len, .seed = 1};
    pipe_figures f[2];
    for (int i = 0; i < 2; i++)
      f[i] = measure(o, &pl[i], &text);
    print_measured(f, p, o->reps);
    free(bytes);
  }
  for (int i = 0; i < 2; i++)
    zb_planner_result_free(&pl[i]);
  printf("\n");
}
