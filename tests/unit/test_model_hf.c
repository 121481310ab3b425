/* test_model_hf.c — zb's model against Hugging Face transformers itself
 * (tests/data/hf, made by tools/hf_fixtures.py with torch on the CPU in
 * fp32): GPT-2 (tied head) and LLaMA (grouped-query attention, rotary
 * positions, SwiGLU, RMSNorm, untied head) loaded from the checkpoints
 * transformers saved, then the loss of the fixed batch, the loss of the
 * held-out batch and every parameter's gradient compared with what
 * transformers computed, within 1e-5 relative: on one stage, and over
 * partitions of 2 and 4 stages run in this process (activations and
 * their gradients handed from stage to stage, a tied head's two
 * gradients added, as a pipeline job does). Built with the CUDA device
 * (ZB_WITH_CUDA: test_model_hf_standin, and test_model_hf_cuda on a GPU)
 * the model runs on it instead of the host; without a GPU the latter
 * exits 77 (skipped). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_arch_hf.h"
#include "zb_arch_weights.h"
#include "zb_device.h"
#include "zb_file.h"
#include "zb_model.h"
#include "zbtest.h"

#ifndef ZB_TEST_DATA_DIR
#error "ZB_TEST_DATA_DIR must name tests/data"
#endif

enum { B = 8, T = 16, MAX_STAGES = 4 };
#define TOL 1e-5

static zb_device *g_dev; /* NULL: each stage makes a host device */

/* tests/data: the build's, or $ZB_TEST_DATA_DIR (a GPU machine's copy of
 * the checkout, tests/gpu/run_gpu_checks.sh) */
static const char *data_dir(void) {
  const char *env = getenv("ZB_TEST_DATA_DIR");
  return env && env[0] ? env : ZB_TEST_DATA_DIR;
}

/* The fixture's expected.safetensors, whole. */
typedef struct expected {
  uint8_t *bytes;
  size_t len;
  zb_st_table *table;
} expected;

static int load_expected(const char *model, expected *e) {
  char path[512];
  snprintf(path, sizeof path, "%s/hf/%s/expected.safetensors", data_dir(), model);
  zb_diag d = {{0}};
  if (zb_file_slurp("expected", path, &e->bytes, &e->len, &d) != ZB_OK ||
      zb_st_parse(e->bytes, e->len, &e->table, &d) != ZB_OK) {
    fprintf(stderr, "  %s: %s\n", path, d.msg);
    return 0;
  }
  return 1;
}

static void free_expected(expected *e) {
  zb_st_table_free(e->table);
  free(e->bytes);
}

/* A float tensor of the fixture, as fp32 (caller frees); NULL if absent. */
static float *expected_f32(const expected *e, const char *name, size_t *n) {
  const zb_st_tensor *x = zb_st_find(e->table, name);
  if (!x)
    return NULL;
  float *v = zb_malloc((size_t)x->numel * sizeof *v);
  if (zb_st_to_f32(e->bytes, e->len, x, v, (size_t)x->numel, NULL) != ZB_OK) {
    free(v);
    return NULL;
  }
  *n = (size_t)x->numel;
  return v;
}

/* The int32 token batch `name` [B, T + 1] split into inputs and targets. */
static int expected_batch(const expected *e, const char *name, int32_t *in, int32_t *tgt) {
  const zb_st_tensor *x = zb_st_find(e->table, name);
  if (!x || x->dtype != ZB_ST_I32 || x->numel != (uint64_t)B * (T + 1))
    return 0;
  for (int b = 0; b < B; b++)
    for (int t = 0; t <= T; t++) {
      int32_t v;
      memcpy(&v, e->bytes + x->offset + 4 * ((size_t)b * (T + 1) + (size_t)t), 4);
      if (t < T)
        in[b * T + t] = v;
      if (t > 0)
        tgt[b * T + t - 1] = v;
    }
  return 1;
}

typedef struct pipeline {
  zb_arch arch;
  zb_model_stage *st[MAX_STAGES];
  int p;
} pipeline;

/* The model of fixture `model` on p stages, weights from its checkpoint. */
static int pipeline_open(pipeline *pl, const char *model, int p) {
  memset(pl, 0, sizeof *pl);
  pl->p = p;
  char path[600], dir[512];
  snprintf(dir, sizeof dir, "%s/hf/%s", data_dir(), model);
  snprintf(path, sizeof path, "%s/config.json", dir);
  uint8_t *text = NULL;
  size_t len = 0;
  zb_diag d = {{0}};
  zb_st_checkpoint *ck = NULL;
  int ok = zb_file_slurp("config", path, &text, &len, &d) == ZB_OK &&
           zb_arch_from_hf_text((const char *)text, len, &pl->arch, NULL, 0, &d) == ZB_OK &&
           zb_st_checkpoint_open(dir, &ck, &d) == ZB_OK;
  free(text);
  zb_model_config c = {
      .seq_len = T, .batch = B, .seed = 1, .loss_scale = 1.0f, .arch = &pl->arch, .device = g_dev};
  for (int s = 0; ok && s < p; s++) {
    ok = zb_model_stage_new(&c, s, p, &pl->st[s], &d) == ZB_OK;
    zb_arch_tensor ts[256];
    float *dst[256];
    int n = 0;
    ok = ok && zb_arch_stage_tensors(&pl->arch, s, p, ts, 256, &n, &d) == ZB_OK && n <= 256 &&
         n == zb_model_n_tensors(pl->st[s]);
    for (int i = 0; ok && i < n; i++)
      dst[i] = zb_model_tensor_at(pl->st[s], i)->param;
    ok = ok && zb_arch_read_tensors(ts, n, ck, dst, &d) == ZB_OK &&
         zb_model_push_params(pl->st[s], &d) == ZB_OK;
  }
  zb_st_checkpoint_close(ck);
  if (!ok)
    fprintf(stderr, "  %s on %d stages: %s\n", model, p, d.msg);
  return ok;
}

static void pipeline_close(pipeline *pl) {
  for (int s = 0; s < pl->p; s++)
    zb_model_stage_free(pl->st[s]);
}

/* F through every stage then B and W back (one microbatch); the loss. */
static int pipeline_step(pipeline *pl, const int32_t *in, const int32_t *tgt, float *loss) {
  size_t na = zb_model_act_numel(pl->st[0]);
  float *act[MAX_STAGES + 1] = {0}, *grad[MAX_STAGES + 1] = {0};
  for (int s = 0; s <= pl->p; s++) {
    act[s] = zb_malloc(na * sizeof(float));
    grad[s] = zb_malloc(na * sizeof(float));
  }
  zb_diag d = {{0}};
  int ok = 1, last = pl->p - 1;
  for (int s = 0; ok && s < pl->p; s++) {
    zb_model_zero_grads(pl->st[s]);
    ok = zb_model_forward(pl->st[s], 0, s == 0 ? in : NULL, s == 0 ? NULL : act[s], s == last ? tgt : NULL,
                          s == last ? NULL : act[s + 1], s == last ? loss : NULL, &d) == ZB_OK;
  }
  for (int s = last; ok && s >= 0; s--)
    ok = zb_model_backward_bw(pl->st[s], 0, s == last ? NULL : grad[s + 1], s == 0 ? NULL : grad[s], &d) ==
             ZB_OK &&
         zb_model_pull(pl->st[s], &d) == ZB_OK;
  if (!ok)
    fprintf(stderr, "  step: %s\n", d.msg);
  for (int s = 0; s <= pl->p; s++) {
    free(act[s]);
    free(grad[s]);
  }
  return ok;
}

/* ||a - b|| / ||b||, in double. */
static double rel_err(const float *a, const float *b, size_t n) {
  double ref = zbt_norm2(b, NULL, n);
  return zbt_norm2(a, b, n) / (ref > 0 ? ref : 1);
}

/* Every gradient of the pipeline against transformers': the rows
 * transformers has (a padded embedding's extra rows are not compared, and
 * must stay zero), a tied head's copy added to the embedding's. */
static double worst_grad(const pipeline *pl, const expected *e, char *worst, size_t worst_len) {
  double max = 0;
  const zb_model_tensor *emb = zb_model_find_tensor(pl->st[0], "transformer.wte.weight");
  for (int s = 0; s < pl->p; s++) {
    zb_arch_tensor ts[256];
    int n = 0;
    zb_arch_stage_tensors(&pl->arch, s, pl->p, ts, 256, &n, NULL);
    for (int i = 0; i < n; i++) {
      if (ts[i].tied_copy)
        continue;
      const zb_model_tensor *t = zb_model_tensor_at(pl->st[s], i);
      char name[96];
      if (snprintf(name, sizeof name, "grad.%s", ts[i].hf_name) >= (int)sizeof name)
        return INFINITY;
      size_t ne = 0, live = (size_t)ts[i].hf_rows * ts[i].hf_cols;
      float *want = expected_f32(e, name, &ne);
      float *got = zb_malloc(t->numel * sizeof *got);
      memcpy(got, t->grad, t->numel * sizeof *got);
      const zb_model_tensor *copy =
          emb == t && pl->p > 1
              ? zb_model_tensor_at(pl->st[pl->p - 1], zb_model_n_tensors(pl->st[pl->p - 1]) - 1)
              : NULL;
      for (size_t k = 0; copy && k < t->numel; k++)
        got[k] += copy->grad[k];
      if (ts[i].hf_transposed) /* transformers' gradient is [in, out] */
        for (int r = 0; r < ts[i].rows; r++)
          for (int c = 0; c < ts[i].cols; c++)
            got[(size_t)c * ts[i].rows + r] = t->grad[(size_t)r * ts[i].cols + c];
      double err = want && ne == live ? rel_err(got, want, live) : INFINITY;
      if (!(err <= max)) {
        max = err;
        if (snprintf(worst, worst_len, "%s", ts[i].hf_name) < 0)
          worst[0] = 0;
      }
      free(want);
      free(got);
    }
  }
  return max;
}

static void check_model(const char *model, int p) {
  expected e;
  CHECK(load_expected(model, &e));
  pipeline pl;
  CHECK(pipeline_open(&pl, model, p));
  int32_t in[B * T], tgt[B * T];
  CHECK(expected_batch(&e, "tokens", in, tgt));
  size_t n1 = 0;
  float loss = NAN, *want = expected_f32(&e, "loss", &n1);
  CHECK(want && n1 == 1);
  CHECK(pipeline_step(&pl, in, tgt, &loss));
  CHECK_MSG(fabs(loss - want[0]) <= TOL * fabs(want[0]), "%s p=%d: loss %.9g, transformers %.9g", model, p,
            (double)loss, (double)want[0]);
  char worst[96] = "";
  double g = worst_grad(&pl, &e, worst, sizeof worst);
  printf("  %s p=%d: loss %.8f (transformers %.8f), worst gradient %s at %.2e relative\n", model, p,
         (double)loss, (double)want[0], worst, g);
  CHECK_MSG(g <= TOL, "%s p=%d: gradient of %s off by %.2e relative", model, p, worst, g);
  free(want);
  CHECK(expected_batch(&e, "heldout.tokens", in, tgt));
  want = expected_f32(&e, "heldout.loss", &n1);
  CHECK(want && pipeline_step(&pl, in, tgt, &loss));
  CHECK_MSG(fabs(loss - want[0]) <= TOL * fabs(want[0]), "%s p=%d: held-out loss %.9g, transformers %.9g",
            model, p, (double)loss, (double)want[0]);
  free(want);
  pipeline_close(&pl);
  free_expected(&e);
}

static void test_gpt2_matches_transformers(void) {
  check_model("gpt2", 1);
  check_model("gpt2", 2);
  check_model("gpt2", 4);
}

static void test_llama_matches_transformers(void) {
  check_model("llama", 1);
  check_model("llama", 2);
  check_model("llama", 4);
}

#ifdef ZB_WITH_CUDA
int zbt_failed_checks;
int main(int argc, char **argv) {
  zb_cuda_device_config cfg = {.ordinal = 0, .precision = ZB_PRECISION_FP32};
  zb_diag d = {{0}};
  zb_err e = zb_device_cuda_new(&cfg, &g_dev, &d);
  if (e == ZB_ERR_UNSUPPORTED) {
    printf("test_model_hf: no CUDA device (%s); skipping\n", d.msg);
    return 77;
  }
  if (e != ZB_OK) {
    fprintf(stderr, "test_model_hf: %s\n", d.msg);
    return 1;
  }
  zb_device_info info;
  g_dev->ops->info(g_dev->self, &info);
  printf("device: %s%s\n", info.name, info.standin ? " [stand-in]" : "");
  static const zbt_case cases[] = {ZBT(test_gpt2_matches_transformers), ZBT(test_llama_matches_transformers)};
  int rc = zbt_run(cases, 2, argc, argv);
  zb_device_free(g_dev);
  return rc;
}
#else
ZBT_MAIN(ZBT(test_gpt2_matches_transformers), ZBT(test_llama_matches_transformers))
#endif
