/* The model's math (model/zb_model.h, docs/model.md), on the CPU:
 *   - gradients of every parameter tensor and of the stage input against
 *     central finite differences (fp32: step 1e-2, see GC_* below);
 *   - the split backward (B then W) equals the fused one (BW), bit for bit;
 *   - a model partitioned into S = 1..6 stages, run in many op orders (by
 *     hand, random topological orders, and the lists of libzb's schedule
 *     families), gives the loss and every parameter gradient of the
 *     one-stage model: per tensor ||g - g_ref|| / ||g_ref|| <= 1e-5;
 *   - microbatch states are independent and memory accounting adds up.
 * Every comparison names the tensor that failed. */
#include <stdint.h>

#include "zb_alloc.h"
#include "zb_arch.h"
#include "zb_jobspec.h"
#include "zb_model.h"
#include "zb_plan.h"
#include "zbtest.h"

/* Finite differences in fp32. The step balances truncation (O(eps^2) with
 * third derivatives of order 1) against rounding (the loss has ~7 digits,
 * so (L+ - L-) / 2eps carries ~1e-6 / eps = 1e-4 of noise). A tensor passes
 * when ||g_fd - g|| <= GC_REL * ||g|| + GC_ABS * sqrt(numel), which for the
 * gradients here (||g|| ~ 1e-2..1) is a relative error of about 1e-2. */
#define GC_EPS 1e-2f
#define GC_REL 1e-2
#define GC_ABS 2e-4

/* Pipelined against unpipelined, per tensor (the bound). */
#define PIPE_TOL 1e-5

#define MAX_STAGES 8
#define MAX_MB 8
#define LIST_CAP (2 * 3 * MAX_MB) /* ops of one rank: up to two stages */

/* ---- deterministic test data ----------------------------------------- */

static uint64_t name_key(const char *s, uint64_t seed) {
  uint64_t h = 0xcbf29ce484222325ULL ^ zbt_mix64(seed);
  for (; *s; s++)
    h = (h ^ (uint8_t)*s) * 0x100000001b3ULL;
  return h;
}

/* Uniform in [-1, 1) from (key, i). */
/* Sets every parameter of st to a value that depends on (seed, tensor name,
 * index) only: weights ~ U(-0.5, 0.5), biases ~ U(-0.1, 0.1), LayerNorm
 * gains ~ 1 + U(-0.2, 0.2), so no bug hides behind a zero bias or a unit
 * gain, and every partition gets the same model. */
static void randomize(zb_model_stage *st, uint64_t seed) {
  for (int i = 0; i < zb_model_n_tensors(st); i++) {
    const zb_model_tensor *t = zb_model_tensor_at(st, i);
    uint64_t key = name_key(t->name, seed);
    int is_ln = strstr(t->name, "ln") != NULL, is_bias = strstr(t->name, ".bias") != NULL;
    for (size_t k = 0; k < t->numel; k++) {
      float r = zbt_urand(key, k);
      t->param[k] = is_bias ? 0.1f * r : is_ln ? 1.0f + 0.2f * r : 0.5f * r;
    }
  }
}

static void fill_tokens(int32_t *dst, size_t n, int vocab, uint64_t key) {
  for (size_t i = 0; i < n; i++)
    dst[i] = (int32_t)(zbt_mix64(key * 1000003ULL + i) % (uint64_t)vocab);
}

static zb_model_config tiny_cfg(int layers) {
  zb_model_config c = {
      .vocab = 256, .hidden = 8, .heads = 2, .layers = layers, .seq_len = 5, .batch = 2, .seed = 7};
  return c;
}

static zb_model_stage *new_stage(const zb_model_config *c, int s, int n) {
  zb_model_stage *st = NULL;
  zb_diag d = {{0}};
  if (zb_model_stage_new(c, s, n, &st, &d) != ZB_OK) {
    fprintf(stderr, "  zb_model_stage_new(%d of %d): %s\n", s, n, d.msg);
    return NULL;
  }
  return st;
}

/* ---- layer ranges and the partition of parameters --------------------- */

static void test_layer_range(void) {
  int first, count, expect_first[3] = {0, 1, 2}, expect_count[3] = {1, 1, 2};
  for (int s = 0; s < 3; s++) {
    CHECK(zb_model_layer_range(4, 3, s, &first, &count) == ZB_OK);
    CHECK_EQ(first, expect_first[s]);
    CHECK_EQ(count, expect_count[s]);
  }
  for (int layers = 0; layers <= 13; layers++)
    for (int n = 1; n <= 9; n++) {
      int next = 0, lo = layers, hi = 0;
      for (int s = 0; s < n; s++) {
        CHECK(zb_model_layer_range(layers, n, s, &first, &count) == ZB_OK);
        CHECK_EQ(first, next); /* contiguous, in order */
        next = first + count;
        lo = count < lo ? count : lo;
        hi = count > hi ? count : hi;
      }
      CHECK_EQ(next, layers); /* covers every layer */
      CHECK(hi - lo <= 1);    /* balanced */
    }
  CHECK(zb_model_layer_range(4, 3, 3, &first, &count) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_layer_range(4, 0, 0, &first, &count) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_layer_range(-1, 2, 0, &first, &count) == ZB_ERR_INVALID_ARG);
  int s = -1;
  CHECK(zb_model_tensor_stage(4, 3, "layer4.attn.qkv.weight", &s) == ZB_ERR_INVALID_ARG); /* no layer 4 */
  CHECK(zb_model_tensor_stage(4, 3, "layer1.nonesuch", &s) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_tensor_stage(4, 3, "layer", &s) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_tensor_stage(4, 3, "head.weight", &s) == ZB_OK && s == 2);
  CHECK(zb_model_tensor_stage(2, 4, "layer0.ln1.weight", &s) == ZB_OK && s == 1); /* stage 0 has no layer */
}

/* Any partition holds each tensor of the one-stage model exactly once, with
 * the same initial values (initialisation is per global tensor). */
static void test_partition_params(void) {
  zb_model_config c = tiny_cfg(4);
  zb_model_stage *ref = new_stage(&c, 0, 1);
  CHECK(ref);
  CHECK_EQ(zb_model_n_tensors(ref), 2 + 4 * 12 + 3);
  CHECK(zb_model_find_tensor(ref, "layer3.attn.qkv.weight") != NULL);
  CHECK(zb_model_find_tensor(ref, "layer4.attn.qkv.weight") == NULL);
  for (int n = 1; n <= 6; n++) {
    int *seen = zb_calloc((size_t)zb_model_n_tensors(ref), sizeof *seen);
    size_t total = 0;
    for (int s = 0; s < n; s++) {
      zb_model_stage *st = new_stage(&c, s, n);
      CHECK(st);
      total += zb_model_n_params(st);
      for (int i = 0; i < zb_model_n_tensors(st); i++) {
        const zb_model_tensor *t = zb_model_tensor_at(st, i), *r = zb_model_find_tensor(ref, t->name);
        CHECK_MSG(r, "stage %d of %d holds %s, which the model has not", s, n, t->name);
        CHECK_EQ(t->numel, r->numel);
        CHECK_MSG(memcmp(t->param, r->param, t->numel * sizeof(float)) == 0, "%s differs on stage %d of %d",
                  t->name, s, n);
        seen[r - zb_model_tensor_at(ref, 0)]++;
        int home = -1; /* what a change of partition finds by name */
        CHECK(zb_model_tensor_stage(c.layers, n, t->name, &home) == ZB_OK);
        CHECK_MSG(home == s, "%s: tensor_stage says stage %d of %d, it is on %d", t->name, home, n, s);
      }
      zb_model_stage_free(st);
    }
    CHECK_EQ(total, zb_model_n_params(ref));
    /* the coordinator's count, which judges whether a model fits a worker */
    zb_model_spec ms = {.hidden = c.hidden, .heads = c.heads, .layers = c.layers, .seq_len = c.seq_len};
    CHECK_EQ((size_t)zb_model_spec_params(&ms), total);
    for (int i = 0; i < zb_model_n_tensors(ref); i++)
      CHECK_MSG(seen[i] == 1, "%s is held %d times over %d stages", zb_model_tensor_at(ref, i)->name, seen[i],
                n);
    free(seen);
  }
  /* The default init is GPT-2's: the initial loss is near ln(256). */
  c = (zb_model_config){.hidden = 32, .heads = 4, .layers = 2, .seq_len = 16, .batch = 2, .seed = 1};
  zb_model_stage *st = new_stage(&c, 0, 1);
  int32_t tok[32], tgt[32];
  fill_tokens(tok, 32, 256, 1);
  fill_tokens(tgt, 32, 256, 2);
  float loss = 0;
  CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK);
  CHECK_NEAR(loss, log(256.0), 0.1);
  zb_model_stage_free(st);
  zb_model_stage_free(ref);
}

/* ---- gradient check --------------------------------------------------- */

/* The scalar the check differentiates: the loss on the last stage, sum(r*y)
 * on the others (so dy = r). Runs F on microbatch 0 and drops the state. */
static double objective(zb_model_stage *st, const int32_t *tok, const float *x, const int32_t *tgt,
                        const float *r, float *y) {
  int last = zb_model_stage_is_last(st);
  float loss = 0;
  if (zb_model_forward(st, 0, tok, x, last ? tgt : NULL, last ? NULL : y, last ? &loss : NULL, NULL) != ZB_OK)
    return NAN;
  zb_model_drop_states(st);
  if (last)
    return loss;
  double s = 0;
  for (size_t i = 0; i < zb_model_act_numel(st); i++)
    s += (double)r[i] * (double)y[i];
  return s;
}

static double fd_at(zb_model_stage *st, float *v, const int32_t *tok, const float *x, const int32_t *tgt,
                    const float *r, float *y) {
  float saved = *v;
  *v = saved + GC_EPS;
  double lp = objective(st, tok, x, tgt, r, y);
  *v = saved - GC_EPS;
  double lm = objective(st, tok, x, tgt, r, y);
  *v = saved;
  return (lp - lm) / (2.0 * (double)GC_EPS);
}

static int gc_compare(const char *what, const float *g, const float *fd, size_t n) {
  double err = zbt_norm2(fd, g, n), ref = zbt_norm2(g, NULL, n),
         bound = GC_REL * ref + GC_ABS * sqrt((double)n);
  if (getenv("ZB_TEST_VERBOSE"))
    printf("    %-28s |g| %.3e  |fd-g| %.3e  rel %.2e\n", what, ref, err, ref > 0 ? err / ref : 0.0);
  if (!(err <= bound)) {
    fprintf(stderr, "  gradient check %s: |fd - g| = %.3e > %.3e (|g| = %.3e)\n", what, err, bound, ref);
    return 0;
  }
  return 1;
}

/* Checks every parameter gradient of st, and dx when the stage takes
 * activations, against finite differences. Returns the number of failures. */
static int gradcheck_stage(zb_model_stage *st, uint64_t seed) {
  const zb_model_config *c = zb_model_stage_config(st);
  size_t nt = (size_t)c->batch * c->seq_len, na = zb_model_act_numel(st);
  int first = zb_model_stage_is_first(st), last = zb_model_stage_is_last(st), failures = 0;
  int32_t *tok = zb_malloc(nt * sizeof *tok), *tgt = zb_malloc(nt * sizeof *tgt);
  float *x = zb_malloc(na * sizeof(float)), *r = zb_malloc(na * sizeof(float)),
        *y = zb_malloc(na * sizeof(float));
  float *dx = zb_malloc(na * sizeof(float)), *fdx = zb_malloc(na * sizeof(float));
  fill_tokens(tok, nt, c->vocab, seed);
  fill_tokens(tgt, nt, c->vocab, seed + 1);
  for (size_t i = 0; i < na; i++) {
    x[i] = zbt_urand(seed + 2, i);
    r[i] = zbt_urand(seed + 3, i);
  }
  const int32_t *tk = first ? tok : NULL;
  const float *xx = first ? NULL : x;

  zb_model_zero_grads(st);
  float loss = 0;
  zb_err e = zb_model_forward(st, 0, tk, xx, last ? tgt : NULL, last ? NULL : y, last ? &loss : NULL, NULL);
  if (e == ZB_OK)
    e = zb_model_backward_bw(st, 0, last ? NULL : r, first ? NULL : dx, NULL);
  if (e != ZB_OK) {
    fprintf(stderr, "  gradcheck: F/BW failed: %s\n", zb_strerror(e));
    failures++;
    goto done;
  }
  for (int i = 0; i < zb_model_n_tensors(st); i++) {
    const zb_model_tensor *t = zb_model_tensor_at(st, i);
    float *fd = zb_malloc(t->numel * sizeof(float));
    for (size_t k = 0; k < t->numel; k++)
      fd[k] = (float)fd_at(st, &t->param[k], tk, xx, tgt, r, y);
    failures += !gc_compare(t->name, t->grad, fd, t->numel);
    free(fd);
  }
  if (!first) {
    for (size_t k = 0; k < na; k++)
      fdx[k] = (float)fd_at(st, &x[k], NULL, x, tgt, r, y);
    failures += !gc_compare("input x", dx, fdx, na);
  }
done:
  free(tok);
  free(tgt);
  free(x);
  free(r);
  free(y);
  free(dx);
  free(fdx);
  return failures;
}

/* The whole model on one stage: every tensor, embeddings to head. */
static void test_gradcheck_full_model(void) {
  zb_model_config c = tiny_cfg(2);
  zb_model_stage *st = new_stage(&c, 0, 1);
  CHECK(st);
  randomize(st, 11);
  int failures = gradcheck_stage(st, 100);
  zb_model_stage_free(st);
  CHECK_EQ(failures, 0);
}

/* Three stages of a 3-layer model: the first (tokens in, activations out),
 * a middle one and the last (activations in, loss out), input gradients
 * included; plus a middle stage that holds no layer (an identity). */
static void test_gradcheck_stages(void) {
  zb_model_config c = tiny_cfg(3);
  int failures = 0;
  for (int s = 0; s < 3; s++) {
    zb_model_stage *st = new_stage(&c, s, 3);
    CHECK(st);
    randomize(st, 12);
    failures += gradcheck_stage(st, 200 + (uint64_t)s * 10);
    zb_model_stage_free(st);
  }
  c = tiny_cfg(1);
  zb_model_stage *st = new_stage(&c, 1, 3); /* layer range empty */
  CHECK(st);
  CHECK_EQ(zb_model_n_tensors(st), 0);
  failures += gradcheck_stage(st, 300);
  zb_model_stage_free(st);
  CHECK_EQ(failures, 0);
}

/* ---- a pipeline of stages ------------------------------------------- */

enum { DONE_F = 1, DONE_B = 2, DONE_W = 4 };

typedef struct pipe {
  int n, m;
  zb_model_stage *st[MAX_STAGES];
  float *act[MAX_STAGES][MAX_MB];  /* F's output of (stage, mb) */
  float *grad[MAX_STAGES][MAX_MB]; /* B's dx of (stage, mb) */
  float loss[MAX_MB];
  int done[MAX_STAGES][MAX_MB];
  const int32_t *tok, *tgt; /* [m][batch*seq_len] */
} pipe;

static int pipe_init(pipe *p, const zb_model_config *c, int n, int m, const int32_t *tok,
                     const int32_t *tgt) {
  memset(p, 0, sizeof *p);
  p->n = n;
  p->m = m;
  p->tok = tok;
  p->tgt = tgt;
  for (int s = 0; s < n; s++) {
    if (!(p->st[s] = new_stage(c, s, n)))
      return 0;
    randomize(p->st[s], 21);
    size_t na = zb_model_act_numel(p->st[s]);
    for (int i = 0; i < m; i++) {
      p->act[s][i] = zb_calloc(na, sizeof(float));
      p->grad[s][i] = zb_calloc(na, sizeof(float));
    }
  }
  return 1;
}

static void pipe_free(pipe *p) {
  for (int s = 0; s < p->n; s++) {
    zb_model_stage_free(p->st[s]);
    for (int i = 0; i < p->m; i++) {
      free(p->act[s][i]);
      free(p->grad[s][i]);
    }
  }
}

/* Whether op (F, B, W or BW) of (s, i) may run now (docs/schedules.md, Vocabulary:
 * dependencies) and has not run. */
static int pipe_ready(const pipe *p, zb_op op, int s, int i) {
  int d = p->done[s][i];
  switch (op) {
  case ZB_OP_F: return !(d & DONE_F) && (s == 0 || (p->done[s - 1][i] & DONE_F));
  case ZB_OP_B:
  case ZB_OP_BW: return (d & DONE_F) && !(d & DONE_B) && (s == p->n - 1 || (p->done[s + 1][i] & DONE_B));
  case ZB_OP_W: return (d & DONE_B) && !(d & DONE_W);
  default: return 0;
  }
}

static zb_err pipe_run(pipe *p, zb_op op, int s, int i) {
  zb_model_stage *st = p->st[s];
  size_t nt = (size_t)zb_model_stage_config(st)->batch * zb_model_stage_config(st)->seq_len;
  int first = s == 0, last = s == p->n - 1;
  const float *dy = last ? NULL : p->grad[s + 1][i];
  float *dx = first ? NULL : p->grad[s][i];
  zb_diag d = {{0}};
  zb_err e = ZB_ERR_INVALID_ARG;
  switch (op) {
  case ZB_OP_F:
    e = zb_model_forward(st, i, first ? p->tok + nt * i : NULL, first ? NULL : p->act[s - 1][i],
                         last ? p->tgt + nt * i : NULL, last ? NULL : p->act[s][i], last ? &p->loss[i] : NULL,
                         &d);
    p->done[s][i] |= DONE_F;
    break;
  case ZB_OP_B:
    e = zb_model_backward_b(st, i, dy, dx, &d);
    p->done[s][i] |= DONE_B;
    break;
  case ZB_OP_W:
    e = zb_model_backward_w(st, i, &d);
    p->done[s][i] |= DONE_W;
    break;
  case ZB_OP_BW:
    e = zb_model_backward_bw(st, i, dy, dx, &d);
    p->done[s][i] |= DONE_B | DONE_W;
    break;
  default: break;
  }
  if (e != ZB_OK)
    fprintf(stderr, "  %s of stage %d mb %d: %s\n", zb_op_name(op), s, i, d.msg);
  return e;
}

static int pipe_all_done(const pipe *p) {
  for (int s = 0; s < p->n; s++)
    for (int i = 0; i < p->m; i++)
      if (p->done[s][i] != (DONE_F | DONE_B | DONE_W))
        return 0;
  return 1;
}

/* The largest per-tensor relative difference seen (ZB_TEST_VERBOSE prints it). */
static double pipe_max_rel;

/* Compares every tensor of p's stages and every microbatch loss with ref
 * (same model and batch, any partition). Returns the number of mismatches. */
static int pipe_compare(const pipe *p, const pipe *ref, const char *label) {
  int bad = 0;
  for (int i = 0; i < p->m; i++)
    if (!(fabs(p->loss[i] - ref->loss[i]) <= PIPE_TOL * fabs(ref->loss[i]))) {
      fprintf(stderr, "  %s: loss of mb %d %.9g != %.9g\n", label, i, p->loss[i], ref->loss[i]);
      bad++;
    }
  for (int s = 0; s < p->n; s++)
    for (int k = 0; k < zb_model_n_tensors(p->st[s]); k++) {
      const zb_model_tensor *t = zb_model_tensor_at(p->st[s], k), *r = NULL;
      for (int rs = 0; rs < ref->n && !r; rs++)
        r = zb_model_find_tensor(ref->st[rs], t->name);
      double rel = r ? zbt_norm2(t->grad, r->grad, t->numel) / zbt_norm2(r->grad, NULL, t->numel) : INFINITY;
      pipe_max_rel = rel > pipe_max_rel ? rel : pipe_max_rel;
      if (!(rel <= PIPE_TOL)) {
        fprintf(stderr, "  %s: %s on stage %d: |g - g_ref| / |g_ref| = %.3e\n", label, t->name, s, rel);
        bad++;
      }
    }
  return bad;
}

/* The data of the pipeline tests: m microbatches, each different. */
typedef struct batch {
  zb_model_config cfg;
  int m;
  int32_t tok[MAX_MB * 64], tgt[MAX_MB * 64];
} batch;

static void batch_make(batch *b, int layers, int m) {
  b->cfg = tiny_cfg(layers);
  b->cfg.loss_scale = 1.0f / (float)m; /* the gradient of the mean loss over the m microbatches */
  b->m = m;
  size_t nt = (size_t)b->cfg.batch * b->cfg.seq_len;
  fill_tokens(b->tok, nt * (size_t)m, 256, 31);
  fill_tokens(b->tgt, nt * (size_t)m, 256, 32);
}

/* The reference: one stage; each microbatch's gradient on its own (F, BW
 * from zeroed gradients), summed in double, so the reference does not
 * depend on how the model accumulates over microbatches. */
static int reference(pipe *ref, const batch *b) {
  if (!pipe_init(ref, &b->cfg, 1, b->m, b->tok, b->tgt))
    return 0;
  size_t n = zb_model_n_params(ref->st[0]);
  double *sum = zb_calloc(n, sizeof *sum);
  int ok = 1;
  for (int i = 0; i < b->m && ok; i++) {
    zb_model_zero_grads(ref->st[0]);
    ok = pipe_run(ref, ZB_OP_F, 0, i) == ZB_OK && pipe_run(ref, ZB_OP_BW, 0, i) == ZB_OK;
    for (size_t k = 0; k < n; k++)
      sum[k] += zb_model_grads(ref->st[0])[k];
  }
  for (size_t k = 0; k < n; k++)
    zb_model_grads(ref->st[0])[k] = (float)sum[k];
  free(sum);
  return ok;
}

/* Runs per-stage op lists (ops[s][k] for k < len[s]) to completion: each
 * stage runs its list in order, a stage waits while its next op is not
 * ready, and stages take turns. Returns 0 on a deadlock or a failed op. */
typedef struct stage_list {
  zb_op op[LIST_CAP];
  int mb[LIST_CAP];
  int len, next;
} stage_list;

static int run_lists(pipe *p, stage_list *lists, int n_lists, const int *stage_of_list) {
  for (;;) {
    int progressed = 0, pending = 0;
    for (int l = 0; l < n_lists; l++) {
      stage_list *sl = &lists[l];
      while (sl->next < sl->len) {
        int s = stage_of_list ? stage_of_list[l * LIST_CAP + sl->next] : l;
        if (!pipe_ready(p, sl->op[sl->next], s, sl->mb[sl->next]))
          break;
        if (pipe_run(p, sl->op[sl->next], s, sl->mb[sl->next]) != ZB_OK)
          return 0;
        sl->next++;
        progressed = 1;
      }
      pending |= sl->next < sl->len;
    }
    if (!pending)
      return pipe_all_done(p);
    if (!progressed) {
      fprintf(stderr, "  op lists deadlock\n");
      return 0;
    }
  }
}

/* Hand-written orders, the same list on every stage:
 *   0 sequential: F B W of mb 0, then mb 1, ...
 *   1 GPipe-like: all F, then all B in reverse mb order, then all W (delayed to the end)
 *   2 B out of order and W delayed past later Fs, as ZB-H1/ZB-V do:
 *     F0 F1 F2 B1 F3 B0 W1 B3 W0 B2 W3 W2
 *   3 fused: all F, then BW in a shuffled order */
static void hand_order(int which, int m, stage_list *sl) {
  memset(sl, 0, sizeof *sl);
#define ADD(o, i) (sl->op[sl->len] = (o), sl->mb[sl->len++] = (i))
  if (which == 0) {
    for (int i = 0; i < m; i++) {
      ADD(ZB_OP_F, i);
      ADD(ZB_OP_B, i);
      ADD(ZB_OP_W, i);
    }
  } else if (which == 1) {
    for (int i = 0; i < m; i++)
      ADD(ZB_OP_F, i);
    for (int i = m - 1; i >= 0; i--)
      ADD(ZB_OP_B, i);
    for (int i = 0; i < m; i++)
      ADD(ZB_OP_W, i);
  } else if (which == 2) {
    static const zb_op ops[12] = {ZB_OP_F, ZB_OP_F, ZB_OP_F, ZB_OP_B, ZB_OP_F, ZB_OP_B,
                                  ZB_OP_W, ZB_OP_B, ZB_OP_W, ZB_OP_B, ZB_OP_W, ZB_OP_W};
    static const int mbs[12] = {0, 1, 2, 1, 3, 0, 1, 3, 0, 2, 3, 2};
    for (int k = 0; k < 12; k++)
      ADD(ops[k], mbs[k]);
  } else {
    for (int i = 0; i < m; i++)
      ADD(ZB_OP_F, i);
    static const int perm[4] = {2, 0, 3, 1};
    for (int k = 0; k < m; k++)
      ADD(ZB_OP_BW, perm[k]);
  }
#undef ADD
}

/* S = 1, 2, 3, 4 and 6 stages of a 4-layer model (6 leaves two stages
 * without layers), each hand order, against the one-stage reference. */
static void test_pipeline_hand_orders(void) {
  static batch b;
  batch_make(&b, 4, 4);
  pipe ref;
  CHECK(reference(&ref, &b));
  static const int stage_counts[] = {1, 2, 3, 4, 6};
  for (int si = 0; si < 5; si++)
    for (int which = 0; which < 4; which++) {
      int n = stage_counts[si];
      static pipe p;
      static stage_list lists[MAX_STAGES];
      CHECK(pipe_init(&p, &b.cfg, n, b.m, b.tok, b.tgt));
      for (int s = 0; s < n; s++)
        hand_order(which, b.m, &lists[s]);
      char label[64];
      snprintf(label, sizeof label, "S=%d order %d", n, which);
      int ok = run_lists(&p, lists, n, NULL);
      int bad = ok ? pipe_compare(&p, &ref, label) : 1;
      zb_model_mem mem;
      for (int s = 0; s < n; s++) {
        zb_model_mem_stats(p.st[s], &mem);
        CHECK_EQ(mem.state_bytes, 0);
      }
      pipe_free(&p);
      CHECK_MSG(ok && bad == 0, "%s: %s", label, ok ? "mismatch" : "did not run");
    }
  if (getenv("ZB_TEST_VERBOSE"))
    printf("    largest per-tensor |g - g_ref| / |g_ref| so far: %.3e\n", pipe_max_rel);
  pipe_free(&ref);
}

/* Random topological orders of F, B and W over all stages and microbatches
 * (any op whose inputs exist may go next), split and fused. */
static void test_pipeline_random_orders(void) {
  static batch b;
  batch_make(&b, 4, 5);
  pipe ref;
  CHECK(reference(&ref, &b));
  for (int n = 1; n <= 4; n++)
    for (uint64_t seed = 1; seed <= 6; seed++) {
      int fused = seed % 3 == 0;
      static pipe p;
      CHECK(pipe_init(&p, &b.cfg, n, b.m, b.tok, b.tgt));
      uint64_t rng = seed * 7919 + (uint64_t)n;
      int ok = 1;
      for (;;) {
        zb_op ops[3 * MAX_STAGES * MAX_MB];
        int ss[3 * MAX_STAGES * MAX_MB], is[3 * MAX_STAGES * MAX_MB], k = 0;
        for (int s = 0; s < n; s++)
          for (int i = 0; i < b.m; i++) {
            zb_op cand[3] = {ZB_OP_F, fused ? ZB_OP_BW : ZB_OP_B, ZB_OP_W};
            for (int c = 0; c < (fused ? 2 : 3); c++)
              if (pipe_ready(&p, cand[c], s, i)) {
                ops[k] = cand[c];
                ss[k] = s;
                is[k++] = i;
              }
          }
        if (k == 0)
          break;
        rng = zbt_mix64(rng);
        int pick = (int)(rng % (uint64_t)k);
        if (pipe_run(&p, ops[pick], ss[pick], is[pick]) != ZB_OK) {
          ok = 0;
          break;
        }
      }
      char label[64];
      snprintf(label, sizeof label, "S=%d random order %d%s", n, (int)seed, fused ? " (BW)" : "");
      ok = ok && pipe_all_done(&p);
      int bad = ok ? pipe_compare(&p, &ref, label) : 1;
      pipe_free(&p);
      CHECK_MSG(ok && bad == 0, "%s: %s", label, ok ? "mismatch" : "did not complete");
    }
  if (getenv("ZB_TEST_VERBOSE"))
    printf("    largest per-tensor |g - g_ref| / |g_ref| so far: %.3e\n", pipe_max_rel);
  pipe_free(&ref);
}

/* The compute lists of libzb's schedule families (loop and V placement,
 * interleaved chunks), executed rank by rank, against the reference. */
static void test_pipeline_schedules(void) {
  static batch b;
  batch_make(&b, 4, 6);
  pipe ref;
  CHECK(reference(&ref, &b));
  int ran[ZB_FAMILY_COUNT_] = {0};
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    for (int p_ranks = 2; p_ranks <= 3; p_ranks++) {
      int v = zb_family_default_chunks((zb_family)f), m = b.m;
      if (p_ranks * v > MAX_STAGES || zb_plan_check_shape((zb_family)f, p_ranks, v, m, NULL) != ZB_OK)
        continue;
      zb_plan_request req = {.family = (zb_family)f, .p = p_ranks, .v = v, .m = m};
      zb_schedule *sched = NULL;
      zb_diag d = {{0}};
      char label[64];
      snprintf(label, sizeof label, "%s p=%d v=%d m=%d", zb_family_name((zb_family)f), p_ranks, v, m);
      CHECK_MSG(zb_plan_generate(&req, &sched, &d) == ZB_OK, "%s: %s", label, d.msg);
      static stage_list lists[MAX_STAGES];
      static int stage_of[MAX_STAGES * LIST_CAP];
      int ok = 1;
      for (int r = 0; r < p_ranks; r++) {
        memset(&lists[r], 0, sizeof lists[r]);
        for (int a = 0; a < sched->ranks[r].n; a++) {
          const zb_action *act = &sched->ranks[r].actions[a];
          if (act->op != ZB_OP_F && act->op != ZB_OP_B && act->op != ZB_OP_W && act->op != ZB_OP_BW)
            continue;
          if (lists[r].len == LIST_CAP) {
            ok = 0;
            break;
          }
          stage_of[r * LIST_CAP + lists[r].len] = act->stage;
          lists[r].op[lists[r].len] = act->op;
          lists[r].mb[lists[r].len++] = act->mb;
        }
      }
      zb_schedule_free(sched);
      static pipe p;
      CHECK(pipe_init(&p, &b.cfg, p_ranks * v, m, b.tok, b.tgt));
      ok = ok && run_lists(&p, lists, p_ranks, stage_of);
      int bad = ok ? pipe_compare(&p, &ref, label) : 1;
      if (getenv("ZB_TEST_VERBOSE"))
        printf("    %s: %s\n", label, ok && !bad ? "equal" : "MISMATCH");
      pipe_free(&p);
      CHECK_MSG(ok && bad == 0, "%s: %s", label, ok ? "mismatch" : "did not run");
      ran[f]++;
    }
  if (getenv("ZB_TEST_VERBOSE"))
    printf("    largest per-tensor |g - g_ref| / |g_ref| so far: %.3e\n", pipe_max_rel);
  pipe_free(&ref);
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    CHECK_MSG(ran[f] > 0, "family %s was not exercised", zb_family_name((zb_family)f));
}

/* ---- split against fused ------------------------------------------- */

/* Two pipelines of 2 stages, one running B then W, the other BW, on three
 * microbatches: the same dx and the same gradients, bit for bit. */
static void test_split_equals_fused(void) {
  static batch b;
  batch_make(&b, 2, 3);
  static pipe split, fused;
  CHECK(pipe_init(&split, &b.cfg, 2, b.m, b.tok, b.tgt));
  CHECK(pipe_init(&fused, &b.cfg, 2, b.m, b.tok, b.tgt));
  for (int i = 0; i < b.m; i++)
    for (int s = 0; s < 2; s++) {
      CHECK(pipe_run(&split, ZB_OP_F, s, i) == ZB_OK);
      CHECK(pipe_run(&fused, ZB_OP_F, s, i) == ZB_OK);
    }
  for (int i = 0; i < b.m; i++)
    for (int s = 1; s >= 0; s--) {
      CHECK(pipe_run(&split, ZB_OP_B, s, i) == ZB_OK);
      CHECK(pipe_run(&split, ZB_OP_W, s, i) == ZB_OK);
      CHECK(pipe_run(&fused, ZB_OP_BW, s, i) == ZB_OK);
    }
  size_t na = zb_model_act_numel(split.st[1]);
  for (int i = 0; i < b.m; i++)
    CHECK_MSG(memcmp(split.grad[1][i], fused.grad[1][i], na * sizeof(float)) == 0, "dx of mb %d differs", i);
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < zb_model_n_tensors(split.st[s]); k++) {
      const zb_model_tensor *a = zb_model_tensor_at(split.st[s], k), *f = zb_model_tensor_at(fused.st[s], k);
      CHECK_MSG(zbt_norm2(a->grad, NULL, a->numel) > 0, "%s: zero gradient", a->name);
      CHECK_MSG(memcmp(a->grad, f->grad, a->numel * sizeof(float)) == 0, "%s: split != fused", a->name);
    }
  pipe_free(&split);
  pipe_free(&fused);
}

/* ---- microbatch states and memory ----------------------------------- */

/* F of microbatches 0..3 before any B gives the gradients of F/B/W one
 * microbatch at a time; memory: four states in flight hold exactly the sum
 * of their sizes, B frees what only B needed, everything returns to zero. */
static void test_microbatch_states(void) {
  static batch b;
  batch_make(&b, 2, 4);
  for (int n = 1; n <= 2; n++) {
    static pipe one, many;
    CHECK(pipe_init(&one, &b.cfg, n, b.m, b.tok, b.tgt));
    CHECK(pipe_init(&many, &b.cfg, n, b.m, b.tok, b.tgt));
    for (int i = 0; i < b.m; i++) {
      for (int s = 0; s < n; s++)
        CHECK(pipe_run(&one, ZB_OP_F, s, i) == ZB_OK);
      for (int s = n - 1; s >= 0; s--) {
        CHECK(pipe_run(&one, ZB_OP_B, s, i) == ZB_OK);
        CHECK(pipe_run(&one, ZB_OP_W, s, i) == ZB_OK);
      }
    }
    int64_t f_bytes[MAX_STAGES];
    for (int s = 0; s < n; s++) {
      zb_model_mem mem;
      zb_model_mem_stats(one.st[s], &mem);
      f_bytes[s] = mem.peak_state_bytes; /* one microbatch at a time: F's state, or more during B */
      zb_model_reset_peak(many.st[s]);
    }
    for (int i = 0; i < b.m; i++)
      for (int s = 0; s < n; s++)
        CHECK(pipe_run(&many, ZB_OP_F, s, i) == ZB_OK);
    for (int s = 0; s < n; s++) {
      zb_model_mem mem;
      zb_model_mem_stats(many.st[s], &mem);
      int64_t sum = 0, one_mb = zb_model_mb_bytes(many.st[s], 0);
      CHECK(one_mb > 0);
      for (int i = 0; i < b.m; i++) {
        CHECK_EQ(zb_model_mb_bytes(many.st[s], i), one_mb); /* same shape, same state */
        sum += zb_model_mb_bytes(many.st[s], i);
      }
      CHECK_EQ(mem.state_bytes, sum);
      CHECK_EQ(mem.peak_state_bytes, sum);
      CHECK(one_mb <= f_bytes[s]);
    }
    /* B and W interleaved out of order; each B frees its F-only buffers. */
    static const int order[4] = {2, 0, 3, 1};
    for (int k = 0; k < b.m; k++) {
      int i = order[k];
      for (int s = n - 1; s >= 0; s--) {
        int64_t before = zb_model_mb_bytes(many.st[s], i);
        CHECK(pipe_run(&many, ZB_OP_B, s, i) == ZB_OK);
        CHECK(zb_model_mb_bytes(many.st[s], i) > 0);
        CHECK(zb_model_mb_bytes(many.st[s], i) != before);
      }
      if (k % 2 == 1)
        for (int kk = k - 1; kk <= k; kk++)
          for (int s = 0; s < n; s++)
            CHECK(pipe_run(&many, ZB_OP_W, s, order[kk]) == ZB_OK);
    }
    for (int s = 0; s < n; s++) {
      zb_model_mem mem;
      zb_model_mem_stats(many.st[s], &mem);
      CHECK_EQ(mem.state_bytes, 0);
      for (int i = 0; i < b.m; i++)
        CHECK_EQ(zb_model_mb_bytes(many.st[s], i), 0);
      CHECK(mem.workspace_bytes > 0);
      /* Given-back buffers wait for reuse; held + cached stays within the peak. */
      CHECK(mem.cached_bytes > 0 && mem.cached_bytes <= mem.peak_state_bytes);
      zb_model_release_cache(many.st[s]);
      zb_model_mem_stats(many.st[s], &mem);
      CHECK_EQ(mem.cached_bytes, 0);
    }
    /* Accumulation order differs (W of 0, 2, 1, 3 against 0, 1, 2, 3). */
    char label[32];
    snprintf(label, sizeof label, "S=%d in flight", n);
    CHECK_EQ(pipe_compare(&many, &one, label), 0);
    pipe_free(&one);
    pipe_free(&many);
  }
}

/* Ops out of order are refused without side effects; states left in flight
 * are freed with the stage (ASan's leak check sees the rest). */
static void test_op_order_errors(void) {
  zb_model_config c = tiny_cfg(1);
  c.vocab = 16;
  zb_model_stage *st = new_stage(&c, 0, 1), *mid = NULL;
  CHECK(st);
  int32_t tok[10], tgt[10];
  fill_tokens(tok, 10, 16, 1);
  fill_tokens(tgt, 10, 16, 2);
  float loss, y[80], dx[80];
  zb_diag d = {{0}};
  CHECK(zb_model_backward_b(st, 0, NULL, NULL, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "before its F") != NULL);
  CHECK(zb_model_backward_w(st, 0, NULL) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK);
  CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &loss, NULL) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_backward_w(st, 0, NULL) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_backward_b(st, 0, NULL, NULL, NULL) == ZB_OK);
  CHECK(zb_model_backward_b(st, 0, NULL, NULL, NULL) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_forward(st, -1, tok, NULL, tgt, NULL, &loss, NULL) == ZB_ERR_INVALID_ARG);
  CHECK(zb_model_forward(st, 1, tok, NULL, tgt, y, &loss, NULL) == ZB_ERR_INVALID_ARG);  /* y on the last */
  CHECK(zb_model_forward(st, 1, NULL, y, tgt, NULL, &loss, NULL) == ZB_ERR_INVALID_ARG); /* x on the first */
  tgt[3] = 16;
  CHECK(zb_model_forward(st, 1, tok, NULL, tgt, NULL, &loss, &d) == ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "vocab") != NULL);
  CHECK_EQ(zb_model_mb_bytes(st, 1), 0);
  tgt[3] = 1;
  int32_t saved = tok[7];
  tok[7] = -1; /* ids are int32: a negative one is refused too */
  CHECK(zb_model_forward(st, 1, tok, NULL, tgt, NULL, &loss, &d) == ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "tokens[7] = -1 is outside the vocab of 16") != NULL, "%s", d.msg);
  CHECK_EQ(zb_model_mb_bytes(st, 1), 0);
  tok[7] = saved;
  tgt[3] = 16;
  CHECK(zb_model_forward(st, 5, tok, NULL, tgt, NULL, &loss, NULL) == ZB_ERR_INVALID_ARG);
  tgt[3] = 1;
  CHECK(zb_model_forward(st, 1000, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK); /* sparse ids */
  zb_model_stage_free(st); /* with mb 0 after B and mb 1000 after F */

  CHECK(zb_model_stage_new(&c, 1, 3, &mid, NULL) == ZB_OK);
  CHECK(zb_model_forward(mid, 0, NULL, y, NULL, NULL, NULL, NULL) == ZB_ERR_INVALID_ARG); /* no y */
  memset(y, 0, sizeof y);
  CHECK(zb_model_forward(mid, 0, NULL, y, NULL, y, NULL, NULL) == ZB_OK);
  CHECK(zb_model_backward_b(mid, 0, NULL, dx, NULL) == ZB_ERR_INVALID_ARG); /* no dy */
  zb_model_drop_states(mid);
  CHECK_EQ(zb_model_mb_bytes(mid, 0), 0);
  zb_model_stage_free(mid);
  zb_model_stage_free(NULL);

  c.hidden = 9; /* not a multiple of heads */
  CHECK(zb_model_stage_new(&c, 0, 1, &st, &d) == ZB_ERR_INVALID_ARG);
  c = tiny_cfg(1);
  CHECK(zb_model_stage_new(&c, 2, 2, &st, NULL) == ZB_ERR_INVALID_ARG);
  c.vocab = 300;
  CHECK(zb_model_stage_new(&c, 0, 1, &st, NULL) == ZB_ERR_INVALID_ARG);
}

/* get/set round trip; zero_grads; loss_scale scales every gradient (by a
 * power of two, so exactly). */
static void test_params_and_scale(void) {
  zb_model_config c = tiny_cfg(1);
  zb_model_stage *a = new_stage(&c, 0, 1);
  c.loss_scale = 0.25f;
  zb_model_stage *q = new_stage(&c, 0, 1);
  CHECK(a && q);
  size_t n = zb_model_n_params(a);
  float *buf = zb_malloc(n * sizeof(float));
  randomize(a, 5);
  CHECK(zb_model_get_params(a, buf, n) == ZB_OK);
  CHECK(zb_model_set_params(q, buf, n) == ZB_OK);
  CHECK(memcmp(zb_model_params(a), zb_model_params(q), n * sizeof(float)) == 0);
  CHECK(zb_model_set_params(q, buf, n - 1) == ZB_ERR_INVALID_ARG);
  int32_t tok[10], tgt[10];
  fill_tokens(tok, 10, 256, 3);
  fill_tokens(tgt, 10, 256, 4);
  float la, lq;
  CHECK(zb_model_forward(a, 0, tok, NULL, tgt, NULL, &la, NULL) == ZB_OK);
  CHECK(zb_model_forward(q, 0, tok, NULL, tgt, NULL, &lq, NULL) == ZB_OK);
  CHECK(la == lq);
  CHECK(zb_model_backward_bw(a, 0, NULL, NULL, NULL) == ZB_OK);
  CHECK(zb_model_backward_bw(q, 0, NULL, NULL, NULL) == ZB_OK);
  const float *ga = zb_model_grads(a), *gq = zb_model_grads(q);
  size_t nonzero = 0;
  for (size_t i = 0; i < n; i++) {
    CHECK_MSG(gq[i] == 0.25f * ga[i], "grad %zu: %g != 0.25 * %g", i, gq[i], ga[i]);
    nonzero += ga[i] != 0.0f;
  }
  CHECK(nonzero > n / 4);
  zb_model_zero_grads(a);
  CHECK(zbt_norm2(zb_model_grads(a), NULL, n) == 0.0);
  free(buf);
  zb_model_stage_free(a);
  zb_model_stage_free(q);
}

/* The gemm trace counts F's matrix FLOPs as the closed form says:
 * per block 2N(3h^2 + h^2 + 4h^2 + 4h^2) + 2 * 2 B H T^2 d, plus 2N h V
 * (attn_full: the full T x T products; the causal skip's count is checked
 * in test_model_device.c). */
static void test_gemm_trace(void) {
  zb_model_config c = {
      .hidden = 16, .heads = 4, .layers = 2, .seq_len = 6, .batch = 3, .seed = 3, .attn_full = 1};
  zb_model_stage *st = new_stage(&c, 0, 1);
  int32_t tok[18], tgt[18];
  fill_tokens(tok, 18, 256, 1);
  fill_tokens(tgt, 18, 256, 2);
  zb_model_gemm g[64];
  float loss;
  zb_model_trace_gemms(st, g, 64);
  CHECK(zb_model_forward(st, 0, tok, NULL, tgt, NULL, &loss, NULL) == ZB_OK);
  int n = zb_model_trace_gemms(st, NULL, 0);
  CHECK(n > 0 && n <= 64);
  double flops = 0, N = 18, h = 16, d = 4;
  for (int i = 0; i < n; i++)
    flops += 2.0 * g[i].m * g[i].n * g[i].k * g[i].count;
  double expect = 2 * (2 * N * 12 * h * h + 2 * 2 * 3 * 4 * 6 * 6 * d) + 2 * N * h * 256;
  CHECK_NEAR(flops, expect, 0.5);
  zb_model_stage_free(st);
}

/* The gpt2 and llama architectures (zb_arch.h) through the same code:
 * every gradient of a one-stage model and of each stage of three against
 * finite differences. llama with grouped-query attention (4 heads on 2
 * key/value heads), rotary positions (llama3 scaling), SwiGLU, RMSNorm,
 * tied and untied; gpt2 with its padded vocabulary and tied head. */
static zb_arch tiny_arch(zb_arch_kind kind, int layers, int tied) {
  zb_arch a = zb_arch_builtin(100, 8, 4, layers, 16);
  a.kind = kind;
  a.tied = tied;
  if (kind == ZB_ARCH_GPT2) {
    a.heads = a.kv_heads = 2;
    a.head_dim = 4;
    a.vocab_padded = 128;
    return a;
  }
  a.kv_heads = 2;
  a.head_dim = 2;
  a.intermediate = 12;
  a.norm = ZB_NORM_RMS;
  a.pos = ZB_POS_ROPE;
  a.rope = (zb_rope){.theta = 10000,
                     .scaling = ZB_ROPE_LLAMA3,
                     .factor = 4,
                     .low_freq_factor = 1,
                     .high_freq_factor = 4,
                     .original_max_positions = 8};
  a.mlp = ZB_MLP_SWIGLU;
  a.biases = 0;
  a.fused_qkv = 0;
  return a;
}

static void test_gradcheck_architectures(void) {
  static const struct {
    zb_arch_kind kind;
    int tied;
  } cases[] = {{ZB_ARCH_LLAMA, 0}, {ZB_ARCH_LLAMA, 1}, {ZB_ARCH_GPT2, 1}};
  for (int k = 0; k < 3; k++) {
    zb_arch one = tiny_arch(cases[k].kind, 2, cases[k].tied),
            three = tiny_arch(cases[k].kind, 3, cases[k].tied);
    zb_model_config c = tiny_cfg(0);
    c.arch = &one;
    zb_model_stage *st = new_stage(&c, 0, 1);
    CHECK(st);
    CHECK_EQ(zb_model_stage_config(st)->vocab, 100);
    randomize(st, 21 + (uint64_t)k);
    int failures = gradcheck_stage(st, 400 + (uint64_t)k);
    zb_model_stage_free(st);
    c.arch = &three;
    for (int s = 0; s < 3; s++) {
      st = new_stage(&c, s, 3);
      CHECK(st);
      randomize(st, 31 + (uint64_t)s);
      failures += gradcheck_stage(st, 500 + (uint64_t)(10 * k + s));
      zb_model_stage_free(st);
    }
    CHECK_MSG(failures == 0, "%s (tied %d): %d gradient checks failed", zb_arch_kind_name(cases[k].kind),
              cases[k].tied, failures);
  }
}

/* A microbatch's state goes back whole after W for every architecture:
 * the sizes it is dropped with are those it was taken with (llama's
 * SwiGLU keeps a third pre-activation, its MLP is not 4h wide, its q|k|v
 * rows are narrower under grouped-query attention), so nothing stays
 * counted and the cache files each buffer under its own size (a wrong
 * one would hand a short buffer to a larger request). */
static void test_arch_states_given_back(void) {
  static const zb_arch_kind kinds[2] = {ZB_ARCH_LLAMA, ZB_ARCH_GPT2};
  for (int k = 0; k < 2; k++) {
    zb_arch a = tiny_arch(kinds[k], 2, kinds[k] == ZB_ARCH_GPT2);
    zb_model_config c = tiny_cfg(0);
    c.arch = &a;
    zb_model_stage *st = new_stage(&c, 0, 1);
    CHECK(st);
    if (!st)
      continue;
    int n = c.batch * c.seq_len;
    int32_t tok[64], tgt[64];
    for (int i = 0; i < n; i++) {
      tok[i] = (7 * i) % 100;
      tgt[i] = (11 * i + 3) % 100;
    }
    for (int mb = 0; mb < 3; mb++) {
      float loss = 0;
      zb_diag d = {{0}};
      CHECK(zb_model_forward(st, mb, tok, NULL, tgt, NULL, &loss, &d) == ZB_OK);
      CHECK(zb_model_backward_b(st, mb, NULL, NULL, &d) == ZB_OK);
      CHECK(zb_model_backward_w(st, mb, &d) == ZB_OK);
      zb_model_mem mem;
      zb_model_mem_stats(st, &mem);
      CHECK_MSG(mem.state_bytes == 0, "%s mb %d: %lld state bytes left after W", zb_arch_kind_name(kinds[k]),
                mb, (long long)mem.state_bytes);
      CHECK(mem.cached_bytes <= mem.peak_state_bytes);
    }
    zb_model_stage_free(st);
  }
}

ZBT_MAIN(ZBT(test_layer_range), ZBT(test_partition_params), ZBT(test_gradcheck_full_model),
         ZBT(test_gradcheck_stages), ZBT(test_split_equals_fused), ZBT(test_pipeline_hand_orders),
         ZBT(test_pipeline_random_orders), ZBT(test_pipeline_schedules), ZBT(test_microbatch_states),
         ZBT(test_op_order_errors), ZBT(test_params_and_scale), ZBT(test_gemm_trace),
         ZBT(test_gradcheck_architectures), ZBT(test_arch_states_given_back))
