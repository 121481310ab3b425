/* test_jobspec_arch.c — job specs with a model architecture (docs/model.md,
 * Jobs with an architecture): model.architecture, model.config read
 * through the caller's reader and checked at parse time, model.weights;
 * each refusal names its key (and the config key at fault), the sizes
 * come from the config, and the memory admission counts the
 * architecture's parameters. The configs are the fixtures of
 * tests/data/hf, read from disk, and variants made from them in memory. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "zb_arch.h"
#include "zb_jobspec_dp.h"
#include "zb_jobspec_yaml.h"
#include "zb_wire.h"
#include "zbtest.h"

#ifndef ZB_TEST_DATA_DIR
#error "ZB_TEST_DATA_DIR must name tests/data"
#endif

/* The reader's files: "llama.json" and "gpt2.json" are the fixtures'
 * configs; "edited.json" is g_edited; anything else does not exist. */
static char g_edited[ZB_MODEL_CONFIG_MAX];

static bool slurp(const char *path, char *buf, size_t cap) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return false;
  size_t n = fread(buf, 1, cap - 1, f);
  buf[n] = '\0';
  fclose(f);
  return n > 0 && n < cap - 1;
}

static zb_err read_file(void *ud, const char *path, char *buf, size_t cap, zb_diag *diag) {
  (void)ud;
  char full[600];
  if (strcmp(path, "edited.json") == 0) {
    snprintf(buf, cap, "%s", g_edited);
    return ZB_OK;
  }
  if (strcmp(path, "llama.json") == 0 || strcmp(path, "gpt2.json") == 0) {
    snprintf(full, sizeof full, "%s/hf/%.*s/config.json", ZB_TEST_DATA_DIR, (int)strcspn(path, "."), path);
    if (slurp(full, buf, cap))
      return ZB_OK;
  }
  return zb_diag_set(diag, ZB_ERR_IO, "cannot open '%s'", path);
}

static const zb_jobspec_files g_files = {read_file, NULL};

/* A llama job on 2 ranks; extra lines go under model: (indented). */
#define LLAMA_JOB(ranks, schedule, model_lines)                                                              \
  "name: l\nranks: " ranks "\nmicrobatches: 4\nschedule: " schedule "\nbackend: cpu\nmodel:\n"               \
  "  architecture: llama\n  config: llama.json\n  data: /tmp/shards_*.bin\n  seq_len: 16\n" model_lines

static zb_err parse(const char *yaml, zb_job_spec *s, zb_diag *d) {
  return zb_job_spec_parse_files(yaml, strlen(yaml), &g_files, s, d);
}

/* Fails with err and a message holding want and also (NULL: skip). */
static bool refused(const char *yaml, zb_err err, const char *want, const char *also) {
  zb_job_spec s;
  zb_diag d = {{0}};
  zb_err got = parse(yaml, &s, &d);
  bool ok = got == err && strstr(d.msg, want) && (!also || strstr(d.msg, also));
  if (!ok)
    fprintf(stderr, "    got %s: %s\n    want '%s' / '%s'\n", zb_strerror(got), d.msg, want,
            also ? also : "");
  zb_job_spec_free(&s);
  return ok;
}

static void test_llama_sizes_from_config(void) {
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(parse(LLAMA_JOB("2", "1f1b", "  weights: /w\n"), &s, &d), ZB_OK);
  CHECK_STREQ(s.model.architecture, "llama");
  CHECK_EQ(s.model.hidden, 32);
  CHECK_EQ(s.model.heads, 4);
  CHECK_EQ(s.model.layers, 8);
  CHECK_EQ(s.bytes_per_activation, 4LL * 16 * 32 * 4); /* batch 4 x seq_len 16 x hidden 32 x 4 */
  CHECK_STREQ(s.model.weights, "/w");
  CHECK(strstr(s.model.config_json, "\"model_type\": \"llama\"") != NULL);
  /* admission counts the architecture's parameters, not the builtin's */
  zb_arch a;
  CHECK_EQ(zb_model_spec_arch(&s.model, &a, &d), ZB_OK);
  CHECK_EQ(zb_job_spec_rank_state_bytes(&s), 16.0 * (double)zb_arch_param_count(&a) / 2);
  /* zb-v (4 stages of 2 layers) is fine: the head is untied */
  zb_job_spec v;
  CHECK_EQ(parse(LLAMA_JOB("2", "zb-v", ""), &v, &d), ZB_OK);
  /* sizes equal to the config's may be written out */
  CHECK_EQ(parse(LLAMA_JOB("2", "1f1b", "  hidden: 32\n  layers: 8\n"), &v, &d), ZB_OK);
  zb_job_spec_free(&s);
  zb_job_spec_free(&v);
}

/* The spec survives the wire (zbctl -> coordinator -> workers) with the
 * config's text and the sizes it gives. */
static void test_llama_wire_round_trip(void) {
  zb_job_spec s, back;
  zb_diag d = {{0}};
  CHECK_EQ(parse(LLAMA_JOB("2", "1f1b", "  weights: /w\n"), &s, &d), ZB_OK);
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&s, &pb);
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &back, &d), ZB_OK);
  CHECK_EQ(zb_job_spec_check(&back, &d), ZB_OK);
  CHECK_STREQ(back.model.architecture, "llama");
  CHECK_STREQ(back.model.config_json, s.model.config_json);
  CHECK_STREQ(back.model.weights, "/w");
  CHECK_EQ(back.model.hidden, 32);
  CHECK_EQ(back.bytes_per_activation, s.bytes_per_activation);
  /* a spec off the wire that gives hidden other than the config's is refused naming it */
  pb.model->hidden = 64;
  zb_job_spec bad;
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &bad, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "model.hidden") && strstr(d.msg, "given by model.config (32)"));
  zb_wire_spec_pb_clear(&pb);
  zb_job_spec_free(&s);
  zb_job_spec_free(&back);
  zb_job_spec_free(&bad);
}

/* g_edited becomes the llama fixture with `insert` after its first '{'. */
static void edit_llama(const char *insert) {
  char base[ZB_MODEL_CONFIG_MAX];
  char full[600];
  snprintf(full, sizeof full, "%s/hf/llama/config.json", ZB_TEST_DATA_DIR);
  CHECK(slurp(full, base, sizeof base));
  const char *brace = strchr(base, '{');
  snprintf(g_edited, sizeof g_edited, "{%s%s", insert, brace ? brace + 1 : "");
}

#define EDITED_JOB                                                                                           \
  "name: l\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"                               \
  "  architecture: llama\n  config: edited.json\n  data: /tmp/shards_*.bin\n  seq_len: 16\n"

static void test_config_refusals(void) {
  /* an unsupported key, named, at the line of model.config */
  edit_llama("\"sliding_window\": 4096, ");
  CHECK(refused(EDITED_JOB, ZB_ERR_INVALID_ARG, "line 8: key 'model.config'", "sliding_window"));
  /* another architecture's config */
  CHECK(refused("name: l\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: llama\n  config: gpt2.json\n  data: /tmp/s_*.bin\n",
                ZB_ERR_INVALID_ARG, "model.config", "model_type is gpt2 but model.architecture is llama"));
  /* not JSON */
  snprintf(g_edited, sizeof g_edited, "{\"model_type\": ");
  CHECK(refused(EDITED_JOB, ZB_ERR_INVALID_ARG, "key 'model.config'", NULL));
  /* a file that does not exist, named by the reader */
  CHECK(refused("name: l\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: llama\n  config: nowhere.json\n",
                ZB_ERR_IO, "key 'model.config'", "nowhere.json"));
  /* without a reader (zb_job_spec_parse) the key is refused, not ignored */
  zb_job_spec s;
  zb_diag d = {{0}};
  const char *yaml = LLAMA_JOB("2", "1f1b", "");
  CHECK_EQ(zb_job_spec_parse(yaml, strlen(yaml), &s, &d), ZB_ERR_INVALID_ARG);
  CHECK(strstr(d.msg, "model.config") && strstr(d.msg, "does not read files"));
}

static void test_spec_refusals(void) {
  /* gpt2 and llama need a config; builtin takes none */
  CHECK(refused("name: l\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: gpt2\n  data: /tmp/s_*.bin\n",
                ZB_ERR_INVALID_ARG, "key 'model.config'", "needs a Hugging Face config.json"));
  CHECK(refused("name: l\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  config: llama.json\n",
                ZB_ERR_INVALID_ARG, "key 'model.config'", "needs model.architecture gpt2 or llama"));
  CHECK(refused("name: l\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  weights: /w\n",
                ZB_ERR_INVALID_ARG, "key 'model.weights'", "needs model.architecture"));
  CHECK(refused("name: l\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: mamba\n",
                ZB_ERR_INVALID_ARG, "key 'model.architecture'", "builtin, gpt2, llama"));
  /* sizes the config gives */
  CHECK(refused(LLAMA_JOB("2", "1f1b", "  hidden: 64\n"), ZB_ERR_INVALID_ARG, "key 'model.hidden'",
                "given by model.config (32)"));
  CHECK(refused(LLAMA_JOB("2", "1f1b", "  heads: 8\n"), ZB_ERR_INVALID_ARG, "key 'model.heads'", "(4)"));
  CHECK(refused(LLAMA_JOB("2", "1f1b", "  layers: 4\n"), ZB_ERR_INVALID_ARG, "key 'model.layers'", "(8)"));
  /* sequences no longer than the config's positions (64) */
  CHECK(refused("name: l\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: llama\n  config: llama.json\n  data: /tmp/s_*.bin\n  seq_len: 65\n",
                ZB_ERR_INVALID_ARG, "key 'model.seq_len'", "at most the config's 64 positions"));
  /* the data order: random or sequential, and sequential needs an architecture */
  CHECK(refused(LLAMA_JOB("2", "1f1b", "  order: shuffled\n"), ZB_ERR_INVALID_ARG, "key 'model.order'",
                "random, sequential, got 'shuffled'"));
  CHECK(refused(
      "name: b\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n  order: sequential\n",
      ZB_ERR_INVALID_ARG, "key 'model.order'", "architecture gpt2 or llama"));
}

/* Gradient dumps and the sequential order are taken with an architecture,
 * and the order survives the wire. */
static void test_dumps_and_order(void) {
  zb_job_spec s, back;
  zb_diag d = {{0}};
  CHECK_EQ(parse(LLAMA_JOB("2", "1f1b", "  dump_dir: /tmp/d\n  order: sequential\n"), &s, &d), ZB_OK);
  CHECK_STREQ(s.model.order, "sequential");
  Zb__V1__JobSpec pb;
  zb_wire_spec_to_pb(&s, &pb);
  CHECK_EQ(zb_wire_spec_from_pb(&pb, &back, &d), ZB_OK);
  CHECK_STREQ(back.model.order, "sequential");
  CHECK_STREQ(back.model.dump_dir, "/tmp/d");
  zb_wire_spec_pb_clear(&pb);
  zb_job_spec_free(&s);
  zb_job_spec_free(&back);
  CHECK_EQ(parse(LLAMA_JOB("2", "1f1b", ""), &s, &d), ZB_OK);
  CHECK_STREQ(s.model.order, "random"); /* the default */
  zb_job_spec_free(&s);
}

/* model.data with an architecture: token shards when the file name ends
 * in .bin, else one text file of byte tokens, which needs a vocabulary
 * of at least 256 (docs/model.md, Jobs with an architecture). */
static void test_text_data(void) {
  CHECK(zb_model_data_is_shards("/d/train_*.bin"));
  CHECK(zb_model_data_is_shards("shard.bin"));
  CHECK(!zb_model_data_is_shards("/usr/share/common-licenses/GPL-3"));
  CHECK(!zb_model_data_is_shards("/d.bin/text.txt"));
  CHECK(!zb_model_data_is_shards(".bi"));
  /* the default text (no data: key) and a named one, with vocabulary 512 */
  const char *texts[2] = {"", "  data: /tmp/gpl3.txt\n"};
  for (int i = 0; i < 2; i++) {
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "name: l\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
             "  architecture: llama\n  config: llama.json\n  seq_len: 16\n%s",
             texts[i]);
    zb_job_spec s;
    zb_diag d = {{0}};
    CHECK_MSG(parse(yaml, &s, &d) == ZB_OK, "%s", d.msg);
    CHECK(!zb_model_data_is_shards(s.model.data));
    zb_job_spec_free(&s);
  }
  CHECK(refused("name: l\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: llama\n  config: llama.json\n  data: /tmp/texts_*.txt\n",
                ZB_ERR_INVALID_ARG, "key 'model.data'", "is a pattern but not of token shards"));
  /* a vocabulary below 256 takes shards only */
  char base[ZB_MODEL_CONFIG_MAX], full[600];
  snprintf(full, sizeof full, "%s/hf/llama/config.json", ZB_TEST_DATA_DIR);
  CHECK(slurp(full, base, sizeof base));
  char *at = strstr(base, "\"vocab_size\": 512");
  CHECK(at != NULL);
  if (!at)
    return;
  snprintf(g_edited, sizeof g_edited, "%.*s\"vocab_size\": 200%s", (int)(at - base), base,
           at + strlen("\"vocab_size\": 512"));
  CHECK(refused("name: l\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                "  architecture: llama\n  config: edited.json\n  data: /tmp/gpl3.txt\n  seq_len: 16\n",
                ZB_ERR_INVALID_ARG, "key 'model.data'", "vocab_size is 200; give at least 256"));
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_MSG(parse(EDITED_JOB, &s, &d) == ZB_OK, "%s", d.msg); /* shards: any vocabulary */
  zb_job_spec_free(&s);
}

/* A spec filled by hand with no architecture ("") is the builtin model. */
static void test_empty_architecture_is_builtin(void) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  snprintf(s.name, sizeof s.name, "h");
  snprintf(s.schedule, sizeof s.schedule, "1f1b");
  snprintf(s.backend, sizeof s.backend, "cpu");
  s.ranks = 2;
  s.microbatches = 4;
  s.model.architecture[0] = '\0';
  zb_job_spec_derive(&s, false);
  zb_diag d = {{0}};
  CHECK_MSG(zb_job_spec_check(&s, &d) == ZB_OK, "%s", d.msg);
  CHECK(!zb_model_spec_has_arch(&s.model));
}

/* GPT-2's head is tied, on one stage or several (the job sums the two
 * holders' gradients, docs/model.md, Tied head). */
static void test_tied_head(void) {
  const char *two = "name: g\nranks: 2\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                    "  architecture: gpt2\n  config: gpt2.json\n  data: /tmp/s_*.bin\n  seq_len: 16\n";
  const char *v = "name: g\nranks: 1\nmicrobatches: 4\nschedule: zb-v\nbackend: cpu\nmodel:\n"
                  "  architecture: gpt2\n  config: gpt2.json\n  data: /tmp/s_*.bin\n  seq_len: 16\n";
  zb_job_spec t;
  zb_diag e = {{0}};
  CHECK_EQ(parse(two, &t, &e), ZB_OK);
  zb_job_spec_free(&t);
  CHECK_EQ(parse(v, &t, &e), ZB_OK);
  zb_job_spec_free(&t);
  const char *one = "name: g\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                    "  architecture: gpt2\n  config: gpt2.json\n  data: /tmp/s_*.bin\n  seq_len: 16\n";
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(parse(one, &s, &d), ZB_OK);
  CHECK_EQ(s.model.hidden, 32);
  CHECK_EQ(s.model.layers, 8);
  /* gpt2's positions (32) bound seq_len */
  const char *longer = "name: g\nranks: 1\nmicrobatches: 4\nschedule: 1f1b\nbackend: cpu\nmodel:\n"
                       "  architecture: gpt2\n  config: gpt2.json\n  data: /tmp/s_*.bin\n  seq_len: 33\n";
  CHECK(refused(longer, ZB_ERR_INVALID_ARG, "model.seq_len", "32 positions"));
  zb_job_spec_free(&s);
}

/* deploy/jobs' examples parse from the repository root (their paths are
 * relative to it) with zbctl's reader; the README's main job
 * (local-train.yaml) is the llama of deploy/models/llama-tiny on bytes. */
static void test_deploy_examples(void) {
  char root[600], yaml[4096];
  snprintf(root, sizeof root, "%s/../..", ZB_TEST_DATA_DIR);
  CHECK_EQ(chdir(root), 0);
  const char *files[3] = {"deploy/jobs/llama.yaml", "deploy/jobs/gpt2.yaml", "deploy/jobs/local-train.yaml"};
  const char *arch[3] = {"llama", "gpt2", "llama"};
  const int hidden[3] = {32, 32, 128}, vocab[3] = {512, 512, 256};
  zb_jobspec_files plain = zb_jobspec_files_plain();
  for (int i = 0; i < 3; i++) {
    CHECK(slurp(files[i], yaml, sizeof yaml));
    zb_job_spec s;
    zb_diag d = {{0}};
    zb_err err = zb_job_spec_parse_files(yaml, strlen(yaml), &plain, &s, &d);
    CHECK_MSG(err == ZB_OK, "%s: %s", files[i], d.msg);
    if (err == ZB_OK) {
      CHECK_STREQ(s.model.architecture, arch[i]);
      CHECK_EQ(s.model.hidden, hidden[i]);
      CHECK_EQ(s.model.layers, 8);
      zb_arch a;
      CHECK(zb_model_spec_arch(&s.model, &a, &d) == ZB_OK && a.vocab == vocab[i]);
      CHECK(zb_model_data_is_shards(s.model.data) == (vocab[i] != 256));
    }
    zb_job_spec_free(&s);
  }
  /* the data-parallel examples: two replicas, the sim one priced by hand,
   * the training one derives T_reduce from its model and link */
  const char *dp[2] = {"deploy/jobs/local-dp.yaml", "deploy/jobs/local-dp-train.yaml"};
  for (int i = 0; i < 2; i++) {
    CHECK(slurp(dp[i], yaml, sizeof yaml));
    zb_job_spec s;
    zb_diag d = {{0}};
    zb_err err = zb_job_spec_parse_files(yaml, strlen(yaml), &plain, &s, &d);
    CHECK_MSG(err == ZB_OK, "%s: %s", dp[i], d.msg);
    if (err == ZB_OK) {
      CHECK_EQ(s.data_parallel, 2);
      CHECK_EQ(zb_job_spec_world(&s), 4);
      CHECK(zb_job_spec_derives_reduce(&s) == (i == 1));
    }
    zb_job_spec_free(&s);
  }
}

ZBT_MAIN(ZBT(test_llama_sizes_from_config), ZBT(test_llama_wire_round_trip), ZBT(test_config_refusals),
         ZBT(test_spec_refusals), ZBT(test_text_data), ZBT(test_dumps_and_order), ZBT(test_tied_head),
         ZBT(test_deploy_examples), ZBT(test_empty_architecture_is_builtin))
