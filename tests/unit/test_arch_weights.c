/* test_arch_weights.c — a stage's tensors through Hugging Face files
 * (zb_arch_weights.h): written in transformers' names and layout and read
 * back into zb's, bit for bit, over a partition (Conv1D transposes, the
 * padded vocabulary, the tied head's second holder); a wrong shape and a
 * missing tensor refused by name; config.json read back to the same
 * architecture. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zb_arch_hf.h"
#include "zb_arch_weights.h"
#include "zbtest.h"

static zb_arch tiny_gpt2(void) {
  const char cfg[] = "{\"model_type\": \"gpt2\", \"vocab_size\": 300, \"n_positions\": 16, \"n_embd\": 32,"
                     " \"n_layer\": 3, \"n_head\": 4}";
  zb_arch a;
  zb_arch_from_hf_text(cfg, sizeof cfg - 1, &a, NULL, 0, NULL);
  return a;
}

/* Every tensor of every stage of p, filled with distinct values (padding
 * rows zero, as the device keeps them). */
typedef struct model_data {
  zb_arch_tensor ts[64];
  float *data[64];
  int n;
} model_data;

static void fill_stage(const zb_arch *a, int stage, int p, model_data *m) {
  zb_arch_stage_tensors(a, stage, p, m->ts, 64, &m->n, NULL);
  for (int i = 0; i < m->n; i++) {
    size_t len = (size_t)m->ts[i].rows * m->ts[i].cols, live = (size_t)m->ts[i].hf_rows * m->ts[i].hf_cols;
    m->data[i] = calloc(len, sizeof(float));
    for (size_t k = 0; k < live; k++)
      m->data[i][k] = (float)(i + 1) + (float)k * 1e-3f;
  }
}

static void free_stage(model_data *m) {
  for (int i = 0; i < m->n; i++)
    free(m->data[i]);
}

static void write_stage(const model_data *m, const char *path) {
  zb_st_entry en[64];
  size_t k = 0;
  float **owned = NULL;
  CHECK_EQ(zb_arch_hf_entries(m->ts, m->n, (const float *const *)m->data, en, &k, &owned, NULL), ZB_OK);
  zb_diag d = {{0}};
  CHECK_MSG(zb_st_write_file(path, en, k, &d) == ZB_OK, "%s", d.msg);
  zb_arch_entries_free(owned, m->n);
}

static void test_round_trip_over_a_partition(void) {
  char dir[] = "/tmp/zb-archw-XXXXXX";
  CHECK(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  zb_arch a = tiny_gpt2();
  CHECK_EQ(a.vocab_padded, 384);
  model_data whole;
  fill_stage(&a, 0, 1, &whole); /* the one-stage model writes the file */
  write_stage(&whole, path);
  zb_st_checkpoint *ck = NULL;
  zb_diag d = {{0}};
  CHECK_MSG(zb_st_checkpoint_open(dir, &ck, &d) == ZB_OK, "%s", d.msg);
  for (int s = 0; s < 2; s++) { /* each stage of two reads its part */
    model_data part;
    fill_stage(&a, s, 2, &part);
    float *got[64];
    for (int i = 0; i < part.n; i++)
      got[i] = malloc((size_t)part.ts[i].rows * part.ts[i].cols * sizeof(float));
    CHECK_MSG(zb_arch_read_tensors(part.ts, part.n, ck, got, &d) == ZB_OK, "%s", d.msg);
    for (int i = 0; i < part.n; i++) {
      int w = -1; /* the same tensor in the one-stage model */
      for (int j = 0; j < whole.n; j++)
        if (strcmp(whole.ts[j].hf_name, part.ts[i].hf_name) == 0)
          w = j;
      CHECK(w >= 0);
      size_t len = (size_t)part.ts[i].rows * part.ts[i].cols;
      CHECK_MSG(memcmp(got[i], whole.data[w], len * sizeof(float)) == 0, "%s differs", part.ts[i].hf_name);
    }
    CHECK(part.ts[part.n - 1].tied_copy || s == 0); /* the last stage's head is wte again */
    for (int i = 0; i < part.n; i++)
      free(got[i]);
    free_stage(&part);
  }
  zb_st_checkpoint_close(ck);
  free_stage(&whole);
  unlink(path);
  rmdir(dir);
}

static void test_refusals_name_the_tensor(void) {
  char dir[] = "/tmp/zb-archw-XXXXXX";
  CHECK(mkdtemp(dir));
  char path[256];
  snprintf(path, sizeof path, "%s/model.safetensors", dir);
  zb_arch a = tiny_gpt2();
  model_data m;
  fill_stage(&a, 0, 1, &m);
  write_stage(&m, path);
  zb_st_checkpoint *ck = NULL;
  CHECK_EQ(zb_st_checkpoint_open(dir, &ck, NULL), ZB_OK);
  zb_arch wide = a; /* a model whose MLP is wider than the file's */
  wide.intermediate = 2 * a.intermediate;
  model_data w;
  fill_stage(&wide, 0, 1, &w);
  zb_diag d = {{0}};
  CHECK_EQ(zb_arch_read_tensors(w.ts, w.n, ck, w.data, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "transformer.h.0.mlp.c_fc.weight has shape [32, 128]; the model needs [32, 256]"),
            "%s", d.msg);
  zb_arch_tensor ghost = m.ts[2];
  snprintf(ghost.hf_name, sizeof ghost.hf_name, "transformer.h.9.ln_1.weight");
  d.msg[0] = 0;
  CHECK(zb_arch_read_tensors(&ghost, 1, ck, w.data, &d) != ZB_OK);
  CHECK_MSG(strstr(d.msg, "transformer.h.9.ln_1.weight"), "%s", d.msg);
  zb_st_checkpoint_close(ck);
  free_stage(&m);
  free_stage(&w);
  unlink(path);
  rmdir(dir);
}

static int same_arch(const zb_arch *x, const zb_arch *y) {
  return x->kind == y->kind && x->vocab == y->vocab && x->vocab_padded == y->vocab_padded &&
         x->hidden == y->hidden && x->heads == y->heads && x->kv_heads == y->kv_heads &&
         x->head_dim == y->head_dim && x->layers == y->layers && x->intermediate == y->intermediate &&
         x->max_positions == y->max_positions && x->norm_eps == y->norm_eps && x->tied == y->tied &&
         x->rope.theta == y->rope.theta && x->rope.scaling == y->rope.scaling &&
         x->rope.factor == y->rope.factor && x->rope.original_max_positions == y->rope.original_max_positions;
}

static void test_config_json_round_trip(void) {
  const char llama[] =
      "{\"model_type\": \"llama\", \"vocab_size\": 512, \"hidden_size\": 64,"
      " \"intermediate_size\": 160, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
      " \"num_key_value_heads\": 2, \"max_position_embeddings\": 64, \"rope_theta\": 500000.0,"
      " \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0,"
      " \"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 32}}";
  zb_arch in[2], out;
  zb_diag d = {{0}};
  CHECK_EQ(zb_arch_from_hf_text(llama, sizeof llama - 1, &in[0], NULL, 0, &d), ZB_OK);
  in[1] = tiny_gpt2();
  for (int k = 0; k < 2; k++) {
    zb_buf b = ZB_BUF_INIT;
    CHECK_EQ(zb_arch_to_hf_json(&in[k], &b, &d), ZB_OK);
    CHECK_MSG(zb_arch_from_hf_text(b.data, b.len, &out, NULL, 0, &d) == ZB_OK, "%s: %s", b.data, d.msg);
    CHECK_MSG(same_arch(&in[k], &out), "%s read back differently", b.data);
    zb_buf_free(&b);
  }
  zb_arch builtin = zb_arch_builtin(0, 32, 4, 1, 16);
  zb_buf b = ZB_BUF_INIT;
  CHECK_EQ(zb_arch_to_hf_json(&builtin, &b, NULL), ZB_ERR_UNSUPPORTED);
  zb_buf_free(&b);
}

ZBT_MAIN(ZBT(test_round_trip_over_a_partition), ZBT(test_refusals_name_the_tensor),
         ZBT(test_config_json_round_trip))
