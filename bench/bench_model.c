/* bench_model.c — zb_bench_model: throughput of the model's F, B and W on
 * one stage (model/zb_model.h), each next to cblas_sgemm replaying exactly
 * the matrix products that op issued (same shapes, transposes, leading
 * dimensions and counts), in the same run. The target: each op at
 * least 70% of its sgemm replay. The first lines name the model and the
 * CBLAS it was built with (ZB_BLAS; docs/model.md, BLAS), as the library
 * reports itself, and OPENBLAS_CORETYPE as the environment has it.
 *
 * FLOPs count the matrix products only, 2*m*n*k each (the attention score
 * products are counted in full, masked half included, as they are
 * computed); element-wise work (LayerNorm, GeLU, softmax, copies) counts
 * nothing but takes time, which is what the ratio shows. Times are the best
 * of --reps runs. The replay reuses one set of buffers, so its small
 * per-head products run from warm caches: a slightly flattering baseline.
 *
 *   zb_bench_model [--arch builtin|llama] [--hidden 512] [--heads 8]
 *                  [--kv-heads H] [--intermediate 4h] [--vocab 256]
 *                  [--seq 256] [--batch 4] [--layers 2] [--model-layers 3L]
 *                  [--reps 5] [--threads 1] [--rounds 1]
 *                  [--sections stages,attention,memory,torch]
 *                  [--torch-python PATH] [--torch-script PATH]
 *
 * --arch llama: RMSNorm, rotary positions (theta 10000), SwiGLU MLP of
 * --intermediate units, --kv-heads key/value heads, no biases, untied
 * head (model/zb_arch.h). --layers: blocks of the timed stage;
 * --model-layers: blocks of the whole model the PyTorch section trains;
 * --rounds: how many times it alternates zb and PyTorch (best kept).
 *
 * A second section runs whole schedules through real model stages in one
 * process (each rank's stages, ops in the simulator's time order) and
 * prints each rank's measured peak activation bytes beside the plan's
 * predicted peak memory (libzb's simulator, in units of a rank's M_F):
 * the ratios between ranks and between schedules should agree within 10%.
 *
 * A third section compares causal attention computed in full (attn_full:
 * both T x T products per head), with the causal skip (attn_unfused: only
 * the row blocks on and below the diagonal) and fused (flash attention,
 * the host device's attn_fwd / attn_bwd; docs/model.md, Flash attention
 * (host)): F and B of a middle stage in each mode, the attention part of
 * each timed alone (model_attention_fwd/bwd on the same shapes, internal
 * to zbmodel), its share of the op, the speed-ups, and the state one
 * microbatch holds after F. In the stages section flash attention issues
 * no gemm of the device, so its products are not in the replay.
 *
 * A fourth section (bench_model_torch.c) trains the whole model one step
 * in zb and in PyTorch (bench/torch_model.py, under --torch-python,
 * ZB_TORCH_PYTHON or the venv of scripts/install-hf-venv.sh) and prints
 * zb / PyTorch tokens/s; without such a python it says so and skips.
 *
 * It prints; it never fails on a slow result.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_model.h"
#include "model_internal.h" /* model_attention_fwd/bwd, for the attention section */
#include "zb_alloc.h"
#include "zb_blas.h"
#include "zb_clock.h"
#include "zb_model.h"
#include "zb_names.h"
#include "zb_plan.h"
#include "zb_planner.h"
#include "zb_sim.h"

#define TRACE_CAP 4096

static double trace_flops(const zb_model_gemm *g, int n) {
  double f = 0;
  for (int i = 0; i < n; i++)
    f += 2.0 * g[i].m * g[i].n * g[i].k * g[i].count;
  return f;
}

/* Times one replay of the traced products with cblas_sgemm. */
static double replay(const zb_model_gemm *g, int n, float *a, float *b, float *c) {
  double t0 = zb_clock_s();
  for (int i = 0; i < n; i++)
    for (int r = 0; r < g[i].count; r++)
      cblas_sgemm(CblasRowMajor, g[i].trans_a ? CblasTrans : CblasNoTrans,
                  g[i].trans_b ? CblasTrans : CblasNoTrans, g[i].m, g[i].n, g[i].k, g[i].alpha, a, g[i].lda,
                  b, g[i].ldb, g[i].beta, c, g[i].ldc);
  return zb_clock_s() - t0;
}

/* Largest buffer sizes (floats) any traced product reads or writes. */
static void replay_sizes(const zb_model_gemm *g, int n, size_t *na, size_t *nb, size_t *nc) {
  for (int i = 0; i < n; i++) {
    size_t ra = (size_t)(g[i].trans_a ? g[i].k : g[i].m), rb = (size_t)(g[i].trans_b ? g[i].n : g[i].k);
    size_t sa = ra * (size_t)g[i].lda, sb = rb * (size_t)g[i].ldb, sc = (size_t)g[i].m * (size_t)g[i].ldc;
    *na = sa > *na ? sa : *na;
    *nb = sb > *nb ? sb : *nb;
    *nc = sc > *nc ? sc : *nc;
  }
}

static const char *arg_str(int argc, char **argv, const char *name, const char *def) {
  for (int i = 1; i + 1 < argc; i++)
    if (strcmp(argv[i], name) == 0)
      return argv[i + 1];
  return def;
}

static int arg_int(int argc, char **argv, const char *name, int def) {
  const char *v = arg_str(argc, argv, name, NULL);
  return v ? atoi(v) : def;
}

/* ---- measured peak activation memory against the plan ---- */

typedef struct timed_op {
  double start;
  int rank, index;
} timed_op;

static int timed_cmp(const void *a, const void *b) {
  const timed_op *x = a, *y = b;
  if (x->start != y->start)
    return x->start < y->start ? -1 : 1;
  return x->rank != y->rank ? x->rank - y->rank : x->index - y->index;
}

/* Runs family f (p ranks, m microbatches) through real stages; fills
 * peak[r] (bytes) and units[r] (the plan's peak, rank M_F units). */
static int memory_run(zb_family f, int p, int m, const zb_model_config *base, const zb_rank_costs *mem_model,
                      int64_t *peak, double *units) {
  int v = zb_family_default_chunks(f), S = p * v;
  zb_planner_request req = {.family = f, .p = p, .v = v, .m = m, .rank = *mem_model, .compute_only = true};
  zb_planner_result pl;
  if (zb_planner_run(&req, &pl, NULL) != ZB_OK) {
    zb_planner_result_free(&pl);
    return -1;
  }
  const zb_schedule *s = pl.compute;
  const zb_sim_result *sim = pl.sim;
  zb_model_config cfg = *base;
  cfg.loss_scale = 1.0f / (float)m;
  zb_model_stage **st = zb_calloc((size_t)S, sizeof *st);
  for (int k = 0; k < S; k++)
    zb_model_stage_new(&cfg, k, S, &st[k], NULL);
  size_t na = zb_model_act_numel(st[0]), nt = (size_t)cfg.batch * cfg.seq_len;
  float **act = zb_calloc((size_t)S * m, sizeof(float *)), **grad = zb_calloc((size_t)S * m, sizeof(float *));
  int32_t *tok = zb_malloc((nt + 1) * sizeof *tok);
  for (size_t i = 0; i <= nt; i++)
    tok[i] = (int32_t)(32 + (i * 7919) % 90);
  int n_ops = 0;
  for (int r = 0; r < p; r++)
    n_ops += s->ranks[r].n;
  timed_op *order = zb_malloc(sizeof *order * (size_t)n_ops);
  n_ops = 0;
  for (int r = 0; r < p; r++)
    for (int i = 0; i < s->ranks[r].n; i++)
      order[n_ops++] = (timed_op){sim->start[r][i], r, i};
  qsort(order, (size_t)n_ops, sizeof *order, timed_cmp);
  for (int r = 0; r < p; r++) {
    peak[r] = 0;
    units[r] = sim->peak_memory_units[r];
  }
  for (int k = 0; k < n_ops; k++) {
    const zb_action *a = &s->ranks[order[k].rank].actions[order[k].index];
    int st_i = a->stage, mb = a->mb;
    zb_model_stage *x = st[st_i];
    zb_diag d = {{0}};
    float **y = &act[(size_t)st_i * m + mb], **dx = &grad[(size_t)st_i * m + mb];
    zb_model_reset_peak(x);
    if (a->op == ZB_OP_F) {
      if (st_i < S - 1 && !*y)
        *y = zb_malloc(na * sizeof(float));
      float loss;
      zb_model_forward(x, mb, st_i == 0 ? tok : NULL, st_i == 0 ? NULL : act[(size_t)(st_i - 1) * m + mb],
                       st_i == S - 1 ? tok + 1 : NULL, st_i < S - 1 ? *y : NULL, st_i == S - 1 ? &loss : NULL,
                       &d);
    } else if (a->op == ZB_OP_B || a->op == ZB_OP_BW) {
      if (st_i > 0 && !*dx)
        *dx = zb_malloc(na * sizeof(float));
      const float *dy = st_i == S - 1 ? NULL : grad[(size_t)(st_i + 1) * m + mb];
      if (a->op == ZB_OP_B)
        zb_model_backward_b(x, mb, dy, st_i > 0 ? *dx : NULL, &d);
      else
        zb_model_backward_bw(x, mb, dy, st_i > 0 ? *dx : NULL, &d);
    } else if (a->op == ZB_OP_W) {
      zb_model_backward_w(x, mb, &d);
    }
    if (d.msg[0]) {
      printf("%s: %s\n", zb_family_name(f), d.msg);
      break;
    }
    /* the rank's bytes at this op's high-water mark: its other stages now,
     * this stage at its peak during the op */
    int r = order[k].rank;
    int64_t bytes = 0;
    for (int q = 0; q < S; q++) {
      if (zb_placement_rank(s->placement, p, v, q) != r)
        continue;
      zb_model_mem mem;
      zb_model_mem_stats(st[q], &mem);
      bytes += q == st_i ? mem.peak_state_bytes : mem.state_bytes;
    }
    if (bytes > peak[r])
      peak[r] = bytes;
  }
  for (int k = 0; k < S * m; k++) {
    free(act[k]);
    free(grad[k]);
  }
  for (int k = 0; k < S; k++)
    zb_model_stage_free(st[k]);
  free(st);
  free(act);
  free(grad);
  free(tok);
  free(order);
  zb_planner_result_free(&pl);
  return 0;
}

/* The plan's memory deltas, profiled from the model: one microbatch's
 * state after F, after B, and after W (none) on a middle stage. */
static zb_rank_costs profile_deltas(const zb_model_config *cfg) {
  zb_rank_costs rc = zb_rank_costs_default();
  zb_model_stage *st = NULL;
  if (zb_model_stage_new(cfg, 1, 4, &st, NULL) != ZB_OK)
    return rc;
  size_t na = zb_model_act_numel(st);
  float *x = zb_calloc(na, sizeof(float)), *y = zb_calloc(na, sizeof(float)),
        *dy = zb_calloc(na, sizeof(float));
  for (size_t i = 0; i < na; i++)
    x[i] = dy[i] = (float)(i % 101) * 0.01f - 0.5f;
  zb_model_forward(st, 0, NULL, x, NULL, y, NULL, NULL);
  double after_f = (double)zb_model_mb_bytes(st, 0);
  zb_model_backward_b(st, 0, dy, y, NULL);
  double after_b = (double)zb_model_mb_bytes(st, 0);
  zb_model_backward_w(st, 0, NULL);
  rc.m_f = 1;
  rc.m_b = (after_b - after_f) / after_f;
  rc.m_w = -after_b / after_f;
  free(x);
  free(y);
  free(dy);
  zb_model_stage_free(st);
  return rc;
}

static void memory_section(void) {
  enum { P = 4, M = 8 };
  /* A shape where B frees more than W keeps (heads x T > 4h), as the
   * default memory model assumes (M_B < 0; docs/schedules.md, Cost and
   * memory model): with the unfused attention, whose B frees the T x T
   * probabilities. Flash attention's B frees only a log-sum-exp per row,
   * so its M_B is positive, which the plan refuses (printed below). */
  zb_model_config cfg = {.vocab = 256,
                         .hidden = 32,
                         .heads = 4,
                         .layers = 16,
                         .seq_len = 128,
                         .batch = 1,
                         .seed = 1,
                         .attn_unfused = 1};
  printf("\nmeasured peak activation bytes per rank against the plan: p=%d, m=%d; h=%d, %d heads, %d layers, "
         "T=%d, batch %d\n",
         P, M, cfg.hidden, cfg.heads, cfg.layers, cfg.seq_len, cfg.batch);
  printf("(ops in the simulator's order through real stages in one process; plan: peak memory in rank M_F "
         "units)\n");
  zb_rank_costs rc = profile_deltas(&cfg);
  zb_model_config flash = cfg;
  flash.attn_unfused = 0;
  zb_rank_costs rf = profile_deltas(&flash);
  printf("memory model profiled from one microbatch of a middle stage: M_F=1, M_B=%.3f, M_W=%.3f (with flash "
         "attention M_B=%.3f, M_W=%.3f: a positive M_B the plan refuses)\n\n",
         rc.m_b, rc.m_w, rf.m_b, rf.m_w);
  printf("%-8s %4s %12s %14s %12s %12s\n", "schedule", "rank", "peak MiB", "vs rank 0", "plan units",
         "plan vs r0");
  static const zb_family fams[] = {ZB_FAMILY_1F1B, ZB_FAMILY_ZB_H1, ZB_FAMILY_ZB_V, ZB_FAMILY_V_HALF,
                                   ZB_FAMILY_V_MIN};
  int64_t ref_max = 0;
  double ref_units = 0;
  for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
    int64_t peak[P];
    double units[P];
    if (memory_run(fams[k], P, M, &cfg, &rc, peak, units) != 0) {
      printf("%-8s  (refused)\n", zb_family_name(fams[k]));
      continue;
    }
    int64_t mx = 0;
    double umx = 0;
    for (int r = 0; r < P; r++) {
      printf("%-8s %4d %12.2f %14.3f %12.3g %12.3f\n", zb_family_name(fams[k]), r,
             (double)peak[r] / 1048576.0, (double)peak[r] / (double)peak[0], units[r], units[r] / units[0]);
      mx = peak[r] > mx ? peak[r] : mx;
      umx = units[r] > umx ? units[r] : umx;
    }
    if (fams[k] == ZB_FAMILY_1F1B) {
      ref_max = mx;
      ref_units = umx;
    }
    printf("%-8s  max peak vs 1f1b's: measured %.3f, plan %.3f\n\n", zb_family_name(fams[k]),
           (double)mx / (double)ref_max, umx / ref_units);
  }
}

/* Best times of F, B and of the attention inside each, for one mode, and
 * the microbatch's state after F. */
typedef struct attn_times {
  double f, b, attn_f, attn_b;
  int64_t state_f;
} attn_times;

static double best_of(double a, double b) {
  return a < b ? a : b;
}

/* Times the attention of one block alone on the stage's device buffers. */
static void time_attention(zb_model_stage *st, int reps, attn_times *t) {
  const zb_model_config *c = zb_model_stage_config(st);
  size_t n = (size_t)c->batch * c->seq_len, h = (size_t)c->hidden;
  size_t att = (size_t)c->batch * c->heads * c->seq_len * c->seq_len;
  float *qkv0 = zb_malloc(n * 3 * h * sizeof(float)), *qkv = zb_malloc(n * 3 * h * sizeof(float));
  float *p = zb_malloc(att * sizeof(float)), *o = zb_malloc(n * h * sizeof(float));
  float *dout = zb_malloc(n * h * sizeof(float));
  for (size_t i = 0; i < n * 3 * h; i++)
    qkv0[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
  for (size_t i = 0; i < n * h; i++)
    dout[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
  for (int r = 0; r < reps + 1; r++) { /* the first round warms up */
    memcpy(qkv, qkv0, n * 3 * h * sizeof(float));
    model_begin(st);
    double t0 = zb_clock_s();
    model_attention_fwd(st, qkv, p, o);
    double t1 = zb_clock_s();
    model_attention_bwd(st, qkv, p, o, dout);
    double t2 = zb_clock_s();
    if (r > 0) {
      t->attn_f = best_of(t->attn_f, t1 - t0);
      t->attn_b = best_of(t->attn_b, t2 - t1);
    }
  }
  free(qkv0);
  free(qkv);
  free(p);
  free(o);
  free(dout);
}

/* F and B of a middle stage (2 of its blocks' attention included) in
 * mode 0 (full), 1 (the skip) or 2 (flash, where the device has it). */
static void attention_mode(zb_model_config cfg, int mode, int reps, attn_times *t) {
  cfg.attn_full = mode == 0;
  cfg.attn_unfused = mode == 1;
  *t = (attn_times){1e30, 1e30, 1e30, 1e30, 0};
  zb_model_stage *st = NULL;
  if (zb_model_stage_new(&cfg, 1, 3, &st, NULL) != ZB_OK)
    return;
  if (strcmp(zb_model_device(st)->ops->name, ZB_DEVICE_HOST) != 0) { /* attention is timed on host buffers */
    zb_model_stage_free(st);
    return;
  }
  size_t na = zb_model_act_numel(st);
  float *x = zb_malloc(na * sizeof(float)), *y = zb_malloc(na * sizeof(float));
  float *dy = zb_malloc(na * sizeof(float)), *dx = zb_malloc(na * sizeof(float));
  for (size_t i = 0; i < na; i++) {
    x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    dy[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
  }
  for (int r = 0; r < reps + 1; r++) {
    double t0 = zb_clock_s();
    zb_model_forward(st, 0, NULL, x, NULL, y, NULL, NULL);
    double t1 = zb_clock_s();
    t->state_f = zb_model_mb_bytes(st, 0);
    zb_model_backward_b(st, 0, dy, dx, NULL);
    double t2 = zb_clock_s();
    zb_model_backward_w(st, 0, NULL);
    if (r > 0) {
      t->f = best_of(t->f, t1 - t0);
      t->b = best_of(t->b, t2 - t1);
    }
  }
  time_attention(st, reps, t);
  int blocks = st->n_layers; /* a middle stage holds blocks only */
  t->attn_f *= blocks;
  t->attn_b *= blocks;
  free(x);
  free(y);
  free(dy);
  free(dx);
  zb_model_stage_free(st);
}

static void attention_section(const zb_model_config *cfg, int reps) {
  attn_times m[3];
  for (int i = 0; i < 3; i++)
    attention_mode(*cfg, i, reps, &m[i]);
  printf("\ncausal attention, middle stage: full T x T products (attn_full), the causal skip "
         "(row blocks of %d) and flash attention (64 x 64 tiles)\n",
         cfg->seq_len < 32 ? cfg->seq_len : 32);
  printf("%-6s %9s %9s %7s %9s %9s %7s %12s\n", "mode", "F ms", "attn ms", "share", "B ms", "attn ms",
         "share", "state MiB");
  static const char *const names[3] = {"full", "skip", "flash"};
  for (int i = 0; i < 3; i++)
    printf("%-6s %9.2f %9.2f %6.1f%% %9.2f %9.2f %6.1f%% %12.2f\n", names[i], m[i].f * 1e3, m[i].attn_f * 1e3,
           100.0 * m[i].attn_f / m[i].f, m[i].b * 1e3, m[i].attn_b * 1e3, 100.0 * m[i].attn_b / m[i].b,
           (double)m[i].state_f / 1048576.0);
  printf("speed-up of the skip over full: attention F %.2fx, B %.2fx; whole F %.2fx, B %.2fx\n",
         m[0].attn_f / m[1].attn_f, m[0].attn_b / m[1].attn_b, m[0].f / m[1].f, m[0].b / m[1].b);
  printf("flash over the skip: attention F %.2fx, B %.2fx; whole F %.2fx, B %.2fx; state after F %.2fx "
         "smaller\n",
         m[1].attn_f / m[2].attn_f, m[1].attn_b / m[2].attn_b, m[1].f / m[2].f, m[1].b / m[2].b,
         (double)m[1].state_f / (double)m[2].state_f);
}

/* One stage (kind 0: the middle one of three, 1: the last) of cfg: its
 * F, B and W against the sgemm replay of their products. */
static void stage_row(const zb_model_config *cfg, int kind, int reps) {
  static const char *const kinds[2] = {"middle", "last"};
  zb_model_stage *st = NULL;
  zb_diag d = {{0}};
  if (zb_model_stage_new(cfg, kind == 0 ? 1 : 2, 3, &st, &d) != ZB_OK) {
    printf("cannot create the stage: %s\n", d.msg);
    return;
  }
  size_t na = zb_model_act_numel(st), nt = (size_t)cfg->batch * cfg->seq_len;
  int last = zb_model_stage_is_last(st);
  float *x = zb_malloc(na * sizeof(float)), *y = zb_malloc(na * sizeof(float));
  float *dy = zb_malloc(na * sizeof(float)), *dx = zb_malloc(na * sizeof(float));
  int32_t *tgt = zb_malloc(nt * sizeof *tgt);
  for (size_t i = 0; i < na; i++) {
    x[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    dy[i] = (float)((i * 40503u) % 1000) / 1000.0f - 0.5f;
  }
  for (size_t i = 0; i < nt; i++)
    tgt[i] = (int32_t)((i * 7) % (size_t)zb_model_stage_config(st)->vocab);

  /* One traced round gives each op's products; it also warms up. */
  zb_model_gemm *trace[3];
  int ntrace[3];
  double best[3] = {1e30, 1e30, 1e30}, best_replay[3] = {1e30, 1e30, 1e30};
  for (int op = 0; op < 3; op++)
    trace[op] = zb_malloc(TRACE_CAP * sizeof(zb_model_gemm));
  float loss;
  zb_model_trace_gemms(st, trace[0], TRACE_CAP);
  zb_model_forward(st, 0, NULL, x, last ? tgt : NULL, last ? NULL : y, last ? &loss : NULL, NULL);
  ntrace[0] = zb_model_trace_gemms(st, trace[1], TRACE_CAP);
  zb_model_backward_b(st, 0, last ? NULL : dy, dx, NULL);
  ntrace[1] = zb_model_trace_gemms(st, trace[2], TRACE_CAP);
  zb_model_backward_w(st, 0, NULL);
  ntrace[2] = zb_model_trace_gemms(st, NULL, 0);

  int64_t mb_after_f = 0, mb_after_b = 0;
  for (int r = 0; r < reps; r++) {
    double t0 = zb_clock_s();
    zb_model_forward(st, 0, NULL, x, last ? tgt : NULL, last ? NULL : y, last ? &loss : NULL, NULL);
    double t1 = zb_clock_s();
    mb_after_f = zb_model_mb_bytes(st, 0);
    zb_model_backward_b(st, 0, last ? NULL : dy, dx, NULL);
    double t2 = zb_clock_s();
    mb_after_b = zb_model_mb_bytes(st, 0);
    zb_model_backward_w(st, 0, NULL);
    double t3 = zb_clock_s(), t[3] = {t1 - t0, t2 - t1, t3 - t2};
    for (int op = 0; op < 3; op++)
      best[op] = t[op] < best[op] ? t[op] : best[op];
  }
  zb_model_mem mem;
  zb_model_mem_stats(st, &mem);

  size_t sa = 0, sb = 0, sc = 0;
  for (int op = 0; op < 3; op++)
    replay_sizes(trace[op], ntrace[op], &sa, &sb, &sc);
  float *a = zb_calloc(sa, sizeof(float)), *b = zb_calloc(sb, sizeof(float)),
        *c = zb_calloc(sc, sizeof(float));
  for (size_t i = 0; i < sa; i++)
    a[i] = (float)(i % 17) * 0.01f;
  for (size_t i = 0; i < sb; i++)
    b[i] = (float)(i % 13) * 0.01f;
  for (int op = 0; op < 3; op++) {
    replay(trace[op], ntrace[op], a, b, c); /* warm-up */
    for (int r = 0; r < reps; r++) {
      double t = replay(trace[op], ntrace[op], a, b, c);
      best_replay[op] = t < best_replay[op] ? t : best_replay[op];
    }
  }

  static const char *const ops[3] = {"F", "B", "W"};
  for (int op = 0; op < 3; op++) {
    double fl = trace_flops(trace[op], ntrace[op]);
    printf("%-7s %-3s %10.3f %10.2f %9.1f %12.2f %9.1f %7.0f%%\n", kinds[kind], ops[op], fl * 1e-9,
           best[op] * 1e3, fl / best[op] * 1e-9, best_replay[op] * 1e3, fl / best_replay[op] * 1e-9,
           100.0 * best_replay[op] / best[op]);
  }
  printf("%-7s state of one microbatch: %.1f MiB after F, %.1f MiB after B (peak %.1f MiB); workspace %.1f "
         "MiB\n",
         kinds[kind], (double)mb_after_f / 1048576.0, (double)mb_after_b / 1048576.0,
         (double)mem.peak_state_bytes / 1048576.0, (double)mem.workspace_bytes / 1048576.0);

  for (int op = 0; op < 3; op++)
    free(trace[op]);
  free(a);
  free(b);
  free(c);
  free(x);
  free(y);
  free(dy);
  free(dx);
  free(tgt);
  zb_model_stage_free(st);
}

static void stage_section(const bench_model_opts *o) {
  zb_arch arch;
  zb_model_config cfg = bench_model_config(o, 3 * o->layers, &arch); /* the middle of 3 stages: o->layers */
  printf("\n%-7s %-3s %10s %10s %9s %12s %9s %7s\n", "stage", "op", "GFLOP", "op ms", "GFLOP/s", "sgemm ms",
         "GFLOP/s", "op/sgemm");
  for (int kind = 0; kind < 2; kind++)
    stage_row(&cfg, kind, o->reps);
}

zb_model_config bench_model_config(const bench_model_opts *o, int layers, zb_arch *arch) {
  *arch = o->arch;
  arch->layers = layers;
  return (zb_model_config){.vocab = arch->vocab,
                           .hidden = arch->hidden,
                           .heads = arch->heads,
                           .layers = layers,
                           .seq_len = o->seq,
                           .batch = o->batch,
                           .seed = 1,
                           .arch = arch->kind == ZB_ARCH_BUILTIN ? NULL : arch};
}

int bench_section_on(const bench_model_opts *o, const char *name) {
  size_t n = strlen(name);
  for (const char *p = o->sections; (p = strstr(p, name)) != NULL; p += n)
    if ((p == o->sections || p[-1] == ',') && (p[n] == 0 || p[n] == ','))
      return 1;
  return 0;
}

/* The options (see the header comment); 0, or 2 after printing why. */
static int parse_opts(int argc, char **argv, bench_model_opts *o) {
  zb_arch_kind kind;
  zb_diag d = {{0}};
  if (zb_arch_kind_parse(arg_str(argc, argv, "--arch", "builtin"), &kind, &d) != ZB_OK ||
      kind == ZB_ARCH_GPT2) {
    fprintf(stderr, "zb_bench_model: --arch: %s\n", d.msg[0] ? d.msg : "builtin or llama");
    return 2;
  }
  int hidden = arg_int(argc, argv, "--hidden", 512), heads = arg_int(argc, argv, "--heads", 8);
  *o = (bench_model_opts){.reps = arg_int(argc, argv, "--reps", 5),
                          .threads = arg_int(argc, argv, "--threads", 1),
                          .rounds = arg_int(argc, argv, "--rounds", 1),
                          .layers = arg_int(argc, argv, "--layers", 2),
                          .seq = arg_int(argc, argv, "--seq", 256),
                          .batch = arg_int(argc, argv, "--batch", 4),
                          .sections = arg_str(argc, argv, "--sections", "stages,attention,memory,torch"),
                          .torch_python = arg_str(argc, argv, "--torch-python", NULL),
                          .torch_script = arg_str(argc, argv, "--torch-script", ZB_TORCH_SCRIPT)};
  o->model_layers = arg_int(argc, argv, "--model-layers", 3 * o->layers);
  o->reps = o->reps < 1 ? 1 : o->reps;
  o->rounds = o->rounds < 1 ? 1 : o->rounds;
  o->arch = zb_arch_builtin(arg_int(argc, argv, "--vocab", 256), hidden, heads, o->model_layers, o->seq);
  if (kind == ZB_ARCH_LLAMA) { /* RMSNorm, rotary (theta 10000), SwiGLU, GQA, no biases, untied head */
    o->arch.kind = kind;
    o->arch.kv_heads = arg_int(argc, argv, "--kv-heads", heads);
    o->arch.intermediate = arg_int(argc, argv, "--intermediate", 4 * hidden);
    o->arch.norm = ZB_NORM_RMS;
    o->arch.pos = ZB_POS_ROPE;
    o->arch.rope = (zb_rope){.theta = 10000, .scaling = ZB_ROPE_NONE};
    o->arch.mlp = ZB_MLP_SWIGLU;
    o->arch.biases = 0;
    o->arch.fused_qkv = 0;
  }
  if (zb_arch_check(&o->arch, &d) != ZB_OK) {
    fprintf(stderr, "zb_bench_model: %s\n", d.msg);
    return 2;
  }
  return 0;
}

int main(int argc, char **argv) {
  bench_model_opts o;
  int rc = parse_opts(argc, argv, &o);
  if (rc)
    return rc;
  zb_model_set_threads(o.threads);
  const zb_arch *a = &o.arch;
  printf("zb_bench_model: %s, h=%d, %d heads (%d key/value), MLP %d, vocab %d, T=%d, batch %d (%d tokens), "
         "fp32, %d CBLAS thread(s), best of %d\n",
         zb_arch_kind_name(a->kind), a->hidden, a->heads, a->kv_heads, a->intermediate, a->vocab, o.seq,
         o.batch, o.batch * o.seq, o.threads, o.reps);
  char blas[128];
  const char *coretype = getenv("OPENBLAS_CORETYPE");
  printf("BLAS: %s (built with ZB_BLAS=%s; OPENBLAS_CORETYPE=%s)\n", zb_blas_describe(blas, sizeof blas),
         zb_blas_name(), coretype ? coretype : "(unset)");
  if (bench_section_on(&o, "stages")) {
    printf("\nstages: one stage of %d blocks\n", o.layers);
    stage_section(&o);
  }
  if (bench_section_on(&o, "attention")) {
    zb_arch arch;
    zb_model_config cfg = bench_model_config(&o, 3 * o.layers, &arch);
    if (a->kind == ZB_ARCH_BUILTIN)
      attention_section(&cfg, o.reps);
    else
      printf("\ncausal attention section: builtin model only\n");
  }
  if (bench_section_on(&o, "memory"))
    memory_section();
  if (bench_section_on(&o, "torch"))
    bench_torch_section(&o);
  return 0;
}
