/* test_hf_fixtures_load.c — the files transformers wrote (tests/data/hf,
 * made by tools/hf_fixtures.py) read by zb as a worker will read them:
 * each config.json to its architecture, and each checkpoint, one file or
 * sharded, into the stages of partitions of 1, 2, 3 and 8 stages. Every
 * parameter transformers computed a gradient for is read by exactly one
 * stage (the tied head's second holder aside) and zb reads no other, and
 * the sharded LLaMA reads bit for bit as the single file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_arch_hf.h"
#include "zb_arch_weights.h"
#include "zb_file.h"
#include "zbtest.h"

#ifndef ZB_TEST_DATA_DIR
#error "ZB_TEST_DATA_DIR must name tests/data"
#endif

enum { MAX_T = 200 };

static zb_err read_arch(const char *model, zb_arch *a, zb_diag *d) {
  char path[512];
  snprintf(path, sizeof path, "%s/hf/%s/config.json", ZB_TEST_DATA_DIR, model);
  uint8_t *text = NULL;
  size_t len = 0;
  zb_err e = zb_file_slurp("config", path, &text, &len, d);
  if (e == ZB_OK)
    e = zb_arch_from_hf_text((const char *)text, len, a, NULL, 0, d);
  free(text);
  return e;
}

/* The stage tensors of stage s of p, read from checkpoint dir into
 * dst[0..*n) (allocated; the caller frees them). */
static zb_err read_stage(const zb_arch *a, const char *model, int s, int p, zb_arch_tensor *ts, float **dst,
                         int *n, zb_diag *d) {
  char dir[512];
  snprintf(dir, sizeof dir, "%s/hf/%s", ZB_TEST_DATA_DIR, model);
  zb_st_checkpoint *ck = NULL;
  zb_err e = zb_arch_stage_tensors(a, s, p, ts, MAX_T, n, d);
  if (e == ZB_OK && *n > MAX_T)
    e = zb_diag_set(d, ZB_ERR_INVALID_ARG, "more than %d tensors", MAX_T);
  if (e == ZB_OK)
    e = zb_st_checkpoint_open(dir, &ck, d);
  for (int i = 0; e == ZB_OK && i < *n; i++)
    dst[i] = calloc((size_t)ts[i].rows * ts[i].cols, sizeof(float));
  if (e == ZB_OK)
    e = zb_arch_read_tensors(ts, *n, ck, dst, d);
  zb_st_checkpoint_close(ck);
  return e;
}

/* model's gradients (expected.safetensors "grad.NAME") against the tensors
 * the stages of p read: each NAME by one stage exactly, nothing else. */
static void check_partition(const char *model, const char *expected_of, int p) {
  zb_arch a;
  zb_diag d = {{0}};
  CHECK_MSG(read_arch(model, &a, &d) == ZB_OK, "%s: %s", model, d.msg);
  char path[512];
  snprintf(path, sizeof path, "%s/hf/%s/expected.safetensors", ZB_TEST_DATA_DIR, expected_of);
  zb_st_file *ex = NULL;
  CHECK_MSG(zb_st_file_open(path, &ex, &d) == ZB_OK, "%s", d.msg);
  int *seen = calloc(ex->table->n, sizeof *seen);
  for (int s = 0; s < p; s++) {
    zb_arch_tensor ts[MAX_T];
    float *dst[MAX_T] = {0};
    int n = 0;
    zb_err e = read_stage(&a, model, s, p, ts, dst, &n, &d);
    CHECK_MSG(e == ZB_OK, "%s stage %d of %d: %s", model, s, p, d.msg);
    for (int i = 0; i < n; i++) {
      char g[ZB_ARCH_NAME_MAX + 8];
      int len = snprintf(g, sizeof g, "grad.%s", ts[i].hf_name);
      CHECK(len > 0 && (size_t)len < sizeof g);
      const zb_st_tensor *x = zb_st_find(ex->table, g);
      CHECK_MSG(x, "%s: transformers has no gradient for %s", model, ts[i].hf_name);
      seen[x - ex->table->tensors] += !ts[i].tied_copy;
      free(dst[i]);
    }
  }
  for (size_t k = 0; k < ex->table->n; k++)
    if (strncmp(ex->table->tensors[k].name, "grad.", 5) == 0)
      CHECK_MSG(seen[k] == 1, "%s over %d stages: %s read %d times", model, p, ex->table->tensors[k].name + 5,
                seen[k]);
  free(seen);
  zb_st_file_close(ex);
}

static void test_every_parameter_on_one_stage(void) {
  static const int ps[] = {1, 2, 3, 8};
  for (int k = 0; k < 4; k++) {
    check_partition("gpt2", "gpt2", ps[k]);
    check_partition("llama", "llama", ps[k]);
    check_partition("llama-sharded", "llama", ps[k]);
  }
}

static void test_configs_read_as_written(void) {
  zb_arch g, l;
  zb_diag d = {{0}};
  CHECK_MSG(read_arch("gpt2", &g, &d) == ZB_OK, "%s", d.msg);
  CHECK(g.kind == ZB_ARCH_GPT2 && g.tied && g.layers == 8 && g.hidden == 32 && g.intermediate == 128);
  CHECK(g.vocab == 512 && g.vocab_padded == 512 && g.max_positions == 32);
  CHECK_MSG(read_arch("llama", &l, &d) == ZB_OK, "%s", d.msg);
  CHECK(l.kind == ZB_ARCH_LLAMA && !l.tied && l.kv_heads == 2 && l.head_dim == 8 && l.intermediate == 80);
  CHECK(l.rope.scaling == ZB_ROPE_NONE && l.rope.theta == 10000.0 && l.norm_eps == 1e-5);
}

static void test_sharded_reads_as_the_single_file(void) {
  zb_arch a;
  zb_diag d = {{0}};
  CHECK_MSG(read_arch("llama", &a, &d) == ZB_OK, "%s", d.msg);
  zb_arch_tensor ts[MAX_T], ts2[MAX_T];
  float *one[MAX_T] = {0}, *sharded[MAX_T] = {0};
  int n = 0, n2 = 0;
  CHECK_MSG(read_stage(&a, "llama", 0, 1, ts, one, &n, &d) == ZB_OK, "%s", d.msg);
  CHECK_MSG(read_stage(&a, "llama-sharded", 0, 1, ts2, sharded, &n2, &d) == ZB_OK, "%s", d.msg);
  CHECK_EQ(n, n2);
  for (int i = 0; i < n; i++) {
    CHECK_MSG(memcmp(one[i], sharded[i], (size_t)ts[i].rows * ts[i].cols * sizeof(float)) == 0, "%s differs",
              ts[i].hf_name);
    free(one[i]);
    free(sharded[i]);
  }
}

ZBT_MAIN(ZBT(test_configs_read_as_written), ZBT(test_every_parameter_on_one_stage),
         ZBT(test_sharded_reads_as_the_single_file))
