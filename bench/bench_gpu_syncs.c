/* bench_gpu_syncs.c — zb_bench_gpu's section 6 (bench_gpu.h): host syncs
 * per iteration (docs/model.md, Host syncs), the points where the host
 * waits for the device and the GPU's queue runs dry behind it. The budget
 * is a constant number per iteration, whatever the number of microbatches
 * m; this counts them for m = 4, 8 and 16.
 *
 * The job: one rank holding every stage of a 4-stage builtin model (one
 * block per stage, the bench's hidden, heads, seq and batch, vocab 256
 * over a synthetic text) on the cuda backend (zb_backend_cpu over this
 * device; no transport: every hand-off is local). An iteration is what a
 * cuda job's rank does: begin_iteration, then per microbatch F of stages
 * 0..3, B of 3..0 and W of 0..3 (submitted: the backend enqueues), the
 * backend's end-of-iteration sync, the loss read (zb_backend_cpu_loss)
 * and the device optimizer step (train/zb_step_device.h under the
 * post-validated stepper a job uses by default, clip norm 1, its global
 * reduction local). Counted per part:
 *
 *   ops    the backend's host_syncs over the ops and its end sync
 *          (zb_backend_stats.host_syncs, what the executor reports as
 *          zb_rank_iteration.host_syncs)
 *   loss   the device's sync count (zb_device_ops.host_syncs) across the
 *          loss read
 *   step   the same across the optimizer step
 *
 * One warm-up iteration (m = 4, not printed) fills the allocator's cache.
 *
 * Ownership: everything is allocated and freed here; the device is the
 * caller's. Threads: the caller's. Errors: exit 1 through gpu_die.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "bench_gpu.h"
#include "zb_alloc.h"
#include "zb_backend_cpu.h"
#include "zb_step_device.h"

#define S 4 /* stages, all on this rank */

typedef struct sync_job {
  zb_device *dev;
  zb_backend *b;
  zb_adamw *opt[S];
  zb_step_device *dstep;
  zb_stepper *stepper;
  uint8_t *text;
  zb_cpu_text src;
} sync_job;

/* Host syncs of one iteration, by part. */
typedef struct sync_counts {
  int64_t ops, loss, step;
  double ms;
} sync_counts;

static void must(zb_err err, const char *what, const zb_diag *d) {
  if (err)
    gpu_die(what, d);
}

static zb_err reduce_local(void *arg, zb_step_partial *p, zb_diag *diag) {
  (void)arg, (void)p, (void)diag; /* one rank: its partial is the job's */
  return ZB_OK;
}

static void job_steppers(sync_job *j) {
  zb_diag d = {{0}};
  float *dp[S];
  const float *dg[S];
  zb_adamw_config ac = {.lr = 1e-4, .weight_decay = 0.1, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8};
  for (int i = 0; i < S; i++) {
    zb_model_stage *st = zb_backend_cpu_stage(j->b, i, NULL);
    must(zb_adamw_new(&ac, zb_model_n_params(st), &j->opt[i], &d), "zb_adamw_new", &d);
    dp[i] = zb_model_device_params(st);
    dg[i] = zb_model_device_grads(st);
  }
  must(zb_step_device_new(j->dev, S, j->opt, dp, dg, true, &j->dstep, &d), "zb_step_device_new", &d);
  zb_step_target t = zb_step_device_target(j->dstep);
  must(zb_stepper_new_target(&t, 1.0, ZB_STEP_POST_VALIDATED, &j->stepper, &d), "zb_stepper_new_target", &d);
}

static void job_open(zb_device *dev, const gpu_opts *o, sync_job *j) {
  *j = (sync_job){.dev = dev};
  size_t len = 65536 + (size_t)o->seq;
  j->text = zb_malloc(len);
  for (size_t i = 0; i < len; i++) /* lower-case words and spaces */
    j->text[i] = (uint8_t)((i * 2654435761u >> 7) % 9 == 0 ? ' ' : 'a' + (i * 40503u >> 5) % 26);
  j->src = (zb_cpu_text){.text = j->text, .len = len, .seed = 1};
  int stages[S] = {0, 1, 2, 3};
  zb_cpu_backend_config bc = {.stages = stages,
                              .n_stages = S,
                              .total_stages = S,
                              .model = {.vocab = 256,
                                        .hidden = o->hidden,
                                        .heads = o->heads,
                                        .layers = S,
                                        .seq_len = o->seq,
                                        .batch = o->batch,
                                        .seed = 1,
                                        .loss_scale = 1.0f / 16,
                                        .attn_block = o->attn_block},
                              .data = {zb_backend_cpu_text_fill, &j->src, NULL},
                              .device = dev};
  zb_diag d = {{0}};
  must(zb_backend_cpu_new(&bc, &j->b, &d), "zb_backend_cpu_new", &d);
  job_steppers(j);
}

static void job_close(sync_job *j) {
  zb_stepper_free(j->stepper);
  zb_step_device_free(j->dstep); /* before the backend, whose stages it borrows */
  for (int i = 0; i < S; i++)
    zb_adamw_free(j->opt[i]);
  zb_backend_free(j->b);
  free(j->text);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int64_t dev_syncs(const sync_job *j) {
  return j->dev->ops->host_syncs(j->dev->self);
}

/* Submits every op of m microbatches in dependency order. */
static void submit_ops(sync_job *j, int m) {
  zb_diag d = {{0}};
  for (int mb = 0; mb < m; mb++) {
    for (int s = 0; s < S; s++)
      must(zb_backend_submit(j->b, ZB_OP_F, s, mb, &d), "F", &d);
    for (int s = S - 1; s >= 0; s--)
      must(zb_backend_submit(j->b, ZB_OP_B, s, mb, &d), "B", &d);
    for (int s = 0; s < S; s++)
      must(zb_backend_submit(j->b, ZB_OP_W, s, mb, &d), "W", &d);
  }
}

static sync_counts iteration(sync_job *j, int k, int m) {
  zb_diag d = {{0}};
  zb_backend_stats bs;
  sync_counts c;
  zb_backend_take_stats(j->b, &bs); /* a fresh interval */
  double t0 = now_s();
  must(zb_backend_cpu_begin_iteration(j->b, k, &d), "begin_iteration", &d);
  submit_ops(j, m);
  must(zb_backend_sync(j->b, &d), "backend sync", &d);
  zb_backend_take_stats(j->b, &bs);
  c.ops = bs.host_syncs;
  int64_t s0 = dev_syncs(j);
  double loss;
  int count = 0;
  must(zb_backend_cpu_loss(j->b, &loss, &count, &d), "zb_backend_cpu_loss", &d);
  if (count != m) {
    snprintf(d.msg, sizeof d.msg, "%d losses after %d microbatches", count, m);
    gpu_die("loss", &d);
  }
  int64_t s1 = dev_syncs(j);
  zb_step_result r;
  must(zb_stepper_run(j->stepper, reduce_local, NULL, &r, &d), "zb_stepper_run", &d);
  c.loss = s1 - s0;
  c.step = dev_syncs(j) - s1;
  c.ms = (now_s() - t0) * 1e3;
  return c;
}

void gpu_bench_syncs(zb_device *dev, const gpu_opts *o) {
  printf("6. host syncs per iteration: one rank holding all %d stages (1 block each), hidden %d, %d heads, "
         "seq %d, batch %d; F, B, W of every microbatch, the loss read and the device optimizer step\n",
         S, o->hidden, o->heads, o->seq, o->batch);
  sync_job j;
  job_open(dev, o, &j);
  iteration(&j, 0, 4); /* warm-up */
  static const int ms[3] = {4, 8, 16};
  sync_counts c[3];
  printf("%-6s %3s %6s %6s %6s %6s %12s\n", "syncs", "m", "ops", "loss", "step", "total", "iteration ms");
  bool constant = true;
  for (int i = 0; i < 3; i++) {
    c[i] = iteration(&j, 1 + i, ms[i]);
    int64_t total = c[i].ops + c[i].loss + c[i].step;
    printf("%-6s %3d %6lld %6lld %6lld %6lld %12.3f\n", "syncs", ms[i], (long long)c[i].ops,
           (long long)c[i].loss, (long long)c[i].step, (long long)total, c[i].ms);
    constant = constant && total == c[0].ops + c[0].loss + c[0].step;
  }
  printf("   host syncs constant in m: %s\n\n", constant ? "yes" : "no");
  job_close(&j);
}
