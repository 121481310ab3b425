/* test_jobspec.c — job specs from real YAML text and filled by hand: every
 * key parsed, defaults, derived fields, 'Np' memory limits, and each class
 * of error with its zb_err, the key it names and the line it points at. */
#include <stdarg.h>
#include <stdbool.h>
#include <string.h>

#include "zb_jobspec_yaml.h"
#include "zbtest.h"

/* A minimal valid spec on lines 1..4; tests append from line 5. */
#define BASE "name: demo\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n"

/* true when msg holds every substring of the NULL-terminated list ap;
 * otherwise prints the first one missing. */
static bool has_all(const char *msg, va_list ap) {
  for (const char *want = va_arg(ap, const char *); want; want = va_arg(ap, const char *))
    if (!strstr(msg, want)) {
      fprintf(stderr, "    message lacks \"%s\": %s\n", want, msg);
      return false;
    }
  return true;
}

/* Parses yaml as a job spec expecting error `want` with every substring
 * that follows (NULL-terminated) in the message, and *out left defaulted
 * although it was filled before. */
static bool job_fails(const char *yaml, zb_err want, ...) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  s.ranks = 99; /* must be reset by the failed parse */
  zb_diag d = {{0}};
  zb_err got = zb_job_spec_parse(yaml, strlen(yaml), &s, &d);
  bool ok = got == want;
  if (!ok)
    fprintf(stderr, "    got %s (%d), want %s; message: %s\n", zb_strerror(got), got, zb_strerror(want),
            d.msg);
  va_list ap;
  va_start(ap, want);
  ok = has_all(d.msg, ap) && ok;
  va_end(ap);
  if (s.ranks != 0 || s.stage_costs || s.iterations != 10) {
    fprintf(stderr, "    spec not left defaulted after the failure\n");
    ok = false;
  }
  if (!ok)
    fprintf(stderr, "    input:\n%s\n", yaml);
  zb_job_spec_free(&s);
  return ok;
}

/* Parses a spec that must be valid; on failure prints why. */
static bool job_ok(const char *yaml, zb_job_spec *s) {
  zb_diag d = {{0}};
  zb_err err = zb_job_spec_parse(yaml, strlen(yaml), s, &d);
  if (err)
    fprintf(stderr, "    unexpected %s: %s\n    input:\n%s\n", zb_strerror(err), d.msg, yaml);
  return err == ZB_OK;
}

/* ---- job spec: valid input ---------------------------------------------- */

static void test_job_full_spec(void) {
  const char *yaml = "# a job with every key\n"
                     "name: demo-1.run_x\n"
                     "ranks: 4\n"
                     "microbatches: 16\n"
                     "schedule: zb-v\n"
                     "chunks: 2\n"
                     "mem_limit: 2p\n"
                     "costs:\n"
                     "  f: 0.02\n"
                     "  b: 0.03\n"
                     "  w: 1.5e-2\n"
                     "  comm: 0.001\n"
                     "  mem: [2, -1.5, -0.5]\n"
                     "stage_costs:\n"
                     "  - [0.01, 0.012, 0.008]\n"
                     "  - [0.02, 0.022, 0.018]\n"
                     "  - [0.03, 0.032, 0.028]\n"
                     "  - [0.04, 0.042, 0.038]\n"
                     "  - [0.05, 0.052, 0.048]\n"
                     "  - [0.06, 0.062, 0.058]\n"
                     "  - [0.07, 0.072, 0.068]\n"
                     "  - [0.08, 0.082, 0.078]\n"
                     "iterations: 25\n"
                     "backend: cuda\n"
                     "transport: nccl\n"
                     "precision: bf16\n"
                     "bytes_per_activation: 524288\n"
                     "model:\n"
                     "  hidden: 256\n"
                     "  heads: 8\n"
                     "  layers: 12\n"
                     "  seq_len: 256\n"
                     "  batch: 4\n"
                     "  seed: 42\n"
                     "  data: /tmp/some text.txt\n"
                     "  lr: 1e-4\n"
                     "  weight_decay: 0\n"
                     "  beta1: 0\n"
                     "  beta2: 0.999\n"
                     "  eps: 1e-6\n"
                     "  clip_norm: 0.5\n"
                     "  step: synchronous\n"
                     "  inject_nan: {iteration: 2, microbatch: 15}\n"
                     "  checkpoint_every: 3\n"
                     "  checkpoint_dir: /shared/ckpt\n"
                     "  dump_dir: /shared/dumps\n"
                     "  dump_every: 5\n";
  zb_job_spec s;
  zb_job_spec_default(&s);
  CHECK(job_ok(yaml, &s));
  CHECK_STREQ(s.name, "demo-1.run_x");
  CHECK_EQ(s.ranks, 4);
  CHECK_EQ(s.microbatches, 16);
  CHECK_STREQ(s.schedule, "zb-v");
  CHECK_EQ(s.chunks, 2);
  CHECK_NEAR(s.mem_limit, 8, 1e-12);
  CHECK_NEAR(s.costs.t_f, 0.02, 1e-15);
  CHECK_NEAR(s.costs.t_b, 0.03, 1e-15);
  CHECK_NEAR(s.costs.t_w, 0.015, 1e-15);
  CHECK_NEAR(s.costs.t_comm, 0.001, 1e-15);
  CHECK_NEAR(s.costs.m_f, 2, 1e-15);
  CHECK_NEAR(s.costs.m_b, -1.5, 1e-15);
  CHECK_NEAR(s.costs.m_w, -0.5, 1e-15);
  CHECK_EQ(s.n_stage_costs, 8);
  CHECK(s.stage_costs != NULL);
  CHECK_NEAR(s.stage_costs[0][0], 0.01, 1e-15);
  CHECK_NEAR(s.stage_costs[3][1], 0.042, 1e-15);
  CHECK_NEAR(s.stage_costs[7][2], 0.078, 1e-15);
  CHECK_EQ(s.iterations, 25);
  CHECK_STREQ(s.backend, "cuda");
  CHECK_STREQ(s.transport, "nccl");
  CHECK_STREQ(s.precision, "bf16");
  CHECK_EQ(s.bytes_per_activation, 524288); /* given, and equal to 4 x 256 x 256 x 2 (bf16) */
  CHECK(s.has_model);
  CHECK_EQ(s.model.hidden, 256);
  CHECK_EQ(s.model.heads, 8);
  CHECK_EQ(s.model.layers, 12);
  CHECK_EQ(s.model.seq_len, 256);
  CHECK_EQ(s.model.batch, 4);
  CHECK_EQ(s.model.seed, 42);
  CHECK_STREQ(s.model.data, "/tmp/some text.txt");
  CHECK_NEAR(s.model.lr, 1e-4, 1e-18);
  CHECK_NEAR(s.model.weight_decay, 0, 0);
  CHECK_NEAR(s.model.beta1, 0, 0);
  CHECK_NEAR(s.model.beta2, 0.999, 1e-15);
  CHECK_NEAR(s.model.eps, 1e-6, 1e-20);
  CHECK_NEAR(s.model.clip_norm, 0.5, 0);
  CHECK_STREQ(s.model.step, "synchronous");
  CHECK(s.model.inject_nan);
  CHECK_EQ(s.model.nan_iteration, 2);
  CHECK_EQ(s.model.nan_microbatch, 15);
  CHECK_EQ(s.model.checkpoint_every, 3);
  CHECK_STREQ(s.model.checkpoint_dir, "/shared/ckpt");
  CHECK_STREQ(s.model.dump_dir, "/shared/dumps");
  CHECK_EQ(s.model.dump_every, 5);
  CHECK_EQ(zb_job_spec_check(&s, NULL), ZB_OK);
  zb_job_spec_free(&s);
  CHECK(s.stage_costs == NULL);
  CHECK_EQ(s.n_stage_costs, 0);
}

static void test_job_defaults(void) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  CHECK_STREQ(s.name, "");
  CHECK_EQ(s.ranks, 0);
  CHECK_EQ(s.microbatches, 0);
  /* A defaulted spec lacks the required fields, so the checker refuses it. */
  zb_diag d = {{0}};
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'name'"), "message: %s", d.msg);

  /* Quoted strings and flow style are YAML too. */
  CHECK(job_ok("{name: \"demo\", ranks: 2, microbatches: 4, schedule: '1f1b'}", &s));
  CHECK_STREQ(s.name, "demo");
  CHECK_STREQ(s.schedule, "1f1b");
  CHECK_EQ(s.chunks, 0);
  CHECK_NEAR(s.mem_limit, 0, 0);
  CHECK_NEAR(s.costs.t_f, 0.01, 1e-15);
  CHECK_NEAR(s.costs.t_b, 0.01, 1e-15);
  CHECK_NEAR(s.costs.t_w, 0.01, 1e-15);
  CHECK_NEAR(s.costs.t_comm, 0, 0);
  CHECK_NEAR(s.costs.m_f, 1, 0);
  CHECK_NEAR(s.costs.m_b, -0.5, 0);
  CHECK_NEAR(s.costs.m_w, -0.5, 0);
  CHECK_EQ(s.n_stage_costs, 0);
  CHECK(s.stage_costs == NULL);
  CHECK_EQ(s.iterations, 10);
  CHECK_STREQ(s.backend, "sim");
  CHECK_STREQ(s.transport, "tcp");
  CHECK_STREQ(s.precision, "fp32");
  CHECK_EQ(s.bytes_per_activation, 65536);
  CHECK_EQ(s.wait_for_workers_s, 600);
  CHECK(job_ok(BASE "wait_for_workers_s: 0\n", &s)); /* refused at once when too few workers */
  CHECK_EQ(s.wait_for_workers_s, 0);
  CHECK_EQ(s.transfer_timeout_s, 300);
  CHECK(job_ok(BASE "transfer_timeout_s: 5\n", &s));
  CHECK_EQ(s.transfer_timeout_s, 5);

  /* A partial costs map keeps the defaults of the keys it leaves out. */
  CHECK(job_ok(BASE "costs:\n  b: 0.5\n", &s));
  CHECK_NEAR(s.costs.t_b, 0.5, 1e-15);
  CHECK_NEAR(s.costs.t_f, 0.01, 1e-15);
  CHECK_NEAR(s.costs.m_f, 1, 0);
  zb_job_spec_free(&s);
}

/* 'Np' is N times ranks wherever ranks appears in the file. */
static void test_job_mem_limit_np(void) {
  zb_job_spec s;
  CHECK(job_ok("mem_limit: 1.5p\nname: a\nranks: 6\nmicrobatches: 6\nschedule: zb-auto\n", &s));
  CHECK_NEAR(s.mem_limit, 9, 1e-12);
  CHECK(job_ok("name: a\nranks: 6\nmicrobatches: 6\nschedule: zb-auto\nmem_limit: 2p\n", &s));
  CHECK_NEAR(s.mem_limit, 12, 1e-12);
  CHECK(job_ok(BASE "mem_limit: 3.25\n", &s));
  CHECK_NEAR(s.mem_limit, 3.25, 1e-12);
  CHECK(job_fails(BASE "mem_limit: 0\n", ZB_ERR_PARSE, "line 5", "'mem_limit'", "'Np'", NULL));
  CHECK(job_fails(BASE "mem_limit: -1p\n", ZB_ERR_PARSE, "line 5", "'mem_limit'", "'-1p'", NULL));
  CHECK(job_fails(BASE "mem_limit: 2q\n", ZB_ERR_PARSE, "line 5", "'mem_limit'", NULL));
  CHECK(job_fails(BASE "mem_limit: p\n", ZB_ERR_PARSE, "line 5", "'mem_limit'", NULL));
  CHECK(job_fails(BASE "mem_limit: infp\n", ZB_ERR_PARSE, "line 5", "'mem_limit'", NULL));
  CHECK(job_fails(BASE "mem_limit: '2p'\n", ZB_ERR_PARSE, "line 5", "'mem_limit'", "quoted", NULL));
}

/* ---- job spec: errors of type, key and document shape -------------------- */

static void test_job_wrong_types(void) {
  CHECK(job_fails("name: demo\nranks: four\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE,
                  "line 2: key 'ranks': expected an integer >= 1, got 'four'", NULL));
  CHECK(job_fails("name: demo\nranks:\n  a: 1\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 3",
                  "'ranks'", "got a mapping", NULL));
  CHECK(job_fails("name: demo\nranks: [4]\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 2",
                  "'ranks'", "got a list", NULL));
  CHECK(job_fails("name: demo\nranks: 4\nmicrobatches: 16.0\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 3",
                  "'microbatches'", "'16.0'", NULL));
  CHECK(job_fails("name: demo\nranks: -2\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 2",
                  "'ranks'", ">= 1", NULL));
  CHECK(job_fails("name: demo\nranks: \"4\"\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 2",
                  "'ranks'", "quoted", NULL));
  CHECK(job_fails("name: demo\nranks: 0x10\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 2",
                  NULL));
  CHECK(job_fails("name: demo\nranks: 4 # fine\nmicrobatches: 16 x\nschedule: zb-h1\n", ZB_ERR_PARSE,
                  "line 3", "'microbatches'", "'16 x'", NULL));
  CHECK(job_fails("name: demo\nranks:\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 2",
                  "'ranks'", "empty value", NULL));
  CHECK(job_fails(BASE "bytes_per_activation: -1\n", ZB_ERR_PARSE, "line 5", "'bytes_per_activation'", ">= 0",
                  NULL));
  CHECK(job_fails(BASE "chunks: -1\n", ZB_ERR_PARSE, "line 5", "'chunks'", NULL));
  CHECK(job_fails(BASE "iterations: 0\n", ZB_ERR_PARSE, "line 5", "'iterations'", NULL));
  CHECK(
      job_fails(BASE "costs:\n  f: .inf\n", ZB_ERR_PARSE, "line 6", "'costs.f'", "expected a number", NULL));
  CHECK(job_fails(BASE "costs:\n  b: nan\n", ZB_ERR_PARSE, "line 6", "'costs.b'", NULL));
  CHECK(job_fails(BASE "costs:\n  w: inf\n", ZB_ERR_PARSE, "line 6", "'costs.w'", NULL));
  CHECK(job_fails(BASE "costs:\n  f: 1e999\n", ZB_ERR_PARSE, "line 6", "'costs.f'", NULL));
  /* strtod reads hex floats; YAML does not mean them as numbers. */
  CHECK(job_fails(BASE "costs:\n  f: 0x1p-3\n", ZB_ERR_PARSE, "line 6", "'costs.f'", "'0x1p-3'", NULL));
  CHECK(job_fails(BASE "costs:\n  f: 0.01\n  comm: 1.5ms\n", ZB_ERR_PARSE, "line 7", "'costs.comm'",
                  "'1.5ms'", NULL));
  CHECK(job_fails(BASE "costs: 5\n", ZB_ERR_PARSE, "line 5", "'costs'", "expected a mapping", NULL));
  CHECK(job_fails(BASE "costs:\n  mem: [1, -1]\n", ZB_ERR_PARSE, "line 6", "'costs.mem'", "3 numbers",
                  "2 items", NULL));
  CHECK(job_fails(BASE "costs:\n  mem: [1,\n    x, 0]\n", ZB_ERR_PARSE, "line 7", "'costs.mem[1]'", "'x'",
                  NULL));
  CHECK(job_fails("name: [a, b]\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 1",
                  "'name'", "expected a string", NULL));
  CHECK(job_fails("name: ~\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 1", "'name'",
                  "empty value", NULL));
  CHECK(job_fails("name: \"a\\0b\"\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 1",
                  "'name'", "NUL", NULL));
  CHECK(job_fails(BASE "backend: {x: 1}\n", ZB_ERR_PARSE, "line 5", "'backend'", "expected a string", NULL));
}

static void test_job_unknown_keys(void) {
  CHECK(job_fails(
      BASE "iterations: 3\nbackend: sim\nrnaks: 4\n", ZB_ERR_PARSE, "line 7", "unknown key 'rnaks'",
      "known: name, ranks, microbatches, schedule, chunks, mem_limit, costs, stage_costs, iterations, "
      "backend, transport, bytes_per_activation, model",
      NULL));
  CHECK(job_fails(BASE "costs:\n  f: 1\n  x: 2\n", ZB_ERR_PARSE, "line 7", "unknown key 'costs.x'",
                  "known: f, b, w, comm, mem", NULL));
  CHECK(job_fails(BASE "? [a, b]\n: 1\n", ZB_ERR_PARSE, "line 5", "expected a key name", NULL));
}

static void test_job_duplicate_keys(void) {
  CHECK(job_fails(BASE "ranks: 8\n", ZB_ERR_PARSE, "line 5", "'ranks' given twice", "first on line 2", NULL));
  CHECK(job_fails(BASE "costs:\n  f: 1\n  b: 1\n  f: 2\n", ZB_ERR_PARSE, "line 8", "'costs.f' given twice",
                  "first on line 6", NULL));
  /* A repeated stage_costs must not leak the first list (ASan checks). */
  CHECK(job_fails(BASE "stage_costs: [[1, 1, 1]]\nstage_costs: [[1, 1, 1]]\n", ZB_ERR_PARSE, "line 6",
                  "'stage_costs' given twice", NULL));
}

static void test_job_missing_required(void) {
  CHECK(job_fails("name: demo\nranks: 4\nmicrobatches: 16\n", ZB_ERR_PARSE, "line 1",
                  "missing required key 'schedule'", NULL));
  /* The line is where the mapping starts, after leading comments. */
  CHECK(job_fails("# spec\n\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_PARSE, "line 3",
                  "missing required key 'name'", NULL));
  CHECK(job_fails("{}", ZB_ERR_PARSE, "missing required key 'name'", NULL));
}

static void test_job_not_a_mapping_or_empty(void) {
  CHECK(job_fails("- name: demo\n- ranks: 4\n", ZB_ERR_PARSE, "line 1", "expected a mapping", "got a list",
                  NULL));
  CHECK(job_fails("# comment\nhello\n", ZB_ERR_PARSE, "line 2", "expected a mapping", "got 'hello'", NULL));
  CHECK(job_fails("", ZB_ERR_PARSE, "line 1", "empty document", NULL));
  CHECK(job_fails("# nothing but comments\n\n", ZB_ERR_PARSE, "empty document", NULL));
  CHECK(job_fails(BASE "---\nname: other\n", ZB_ERR_PARSE, "line 6", "second", NULL));
  zb_job_spec s;
  zb_diag d = {{0}};
  CHECK_EQ(zb_job_spec_parse(NULL, 0, &s, &d), ZB_ERR_PARSE);
  CHECK_MSG(strstr(d.msg, "empty document"), "message: %s", d.msg);
}

static void test_job_malformed_yaml(void) {
  CHECK(job_fails("name: demo\nranks: [1, 2\n", ZB_ERR_PARSE, "line 3", "YAML syntax error",
                  "while parsing a flow sequence on line 2", NULL));
  CHECK(job_fails("name: demo\n\tranks: 4\n", ZB_ERR_PARSE, "line 2", "YAML syntax error", NULL));
  CHECK(job_fails("name: demo\nranks: 4\n  microbatches: 16\n", ZB_ERR_PARSE, "line 3", "YAML syntax error",
                  NULL));
  CHECK(job_fails("name: \"demo\nranks: 4\n", ZB_ERR_PARSE, "line 3", "YAML syntax error", NULL));
  CHECK(
      job_fails("name: demo\nranks: 4\nschedule: \xff\xfe\n", ZB_ERR_PARSE, "line 3", "invalid input", NULL));
  CHECK(job_fails("name: *nowhere\n", ZB_ERR_PARSE, "line 1", "undefined alias", NULL));
}

/* ---- job spec: semantic checks ------------------------------------------- */

static void test_job_stage_costs(void) {
  zb_job_spec s;
  /* zb-v has 2 chunks per rank by default: 2 ranks need 4 rows. */
  CHECK(job_ok("name: v\nranks: 2\nmicrobatches: 8\nschedule: zb-v\n"
               "stage_costs: [[1, 2, 3], [1, 2, 3], [1, 2, 3], [0, 0, 0]]\n",
               &s));
  CHECK_EQ(s.n_stage_costs, 4);
  CHECK_NEAR(s.stage_costs[2][2], 3, 0);
  zb_job_spec_free(&s);
  CHECK(job_fails("name: v\nranks: 2\nmicrobatches: 8\nschedule: zb-v\n"
                  "stage_costs: [[1, 2, 3], [1, 2, 3], [1, 2, 3]]\n",
                  ZB_ERR_INVALID_ARG, "line 5", "'stage_costs'", "expected 4 rows", "2 x 2", "got 3", NULL));
  CHECK(job_fails(BASE "stage_costs:\n  - [1, 2, 3]\n  - [1, 2]\n", ZB_ERR_PARSE, "line 7",
                  "'stage_costs[1]'", "3 numbers", NULL));
  CHECK(job_fails(BASE "stage_costs:\n  - [1, 2, 3]\n  - [1, 2, 3]\n  - [1, -2, 3]\n  - [1, 2, 3]\n",
                  ZB_ERR_INVALID_ARG, "line 8", "'stage_costs[2]'", "T_B", NULL));
  CHECK(job_fails(BASE "stage_costs: []\n", ZB_ERR_PARSE, "line 5", "'stage_costs'", "non-empty", NULL));
  CHECK(job_fails(BASE "stage_costs: [1, 2, 3]\n", ZB_ERR_PARSE, "line 5", "'stage_costs[0]'", NULL));
}

static void test_job_unknown_schedule(void) {
  CHECK(job_fails("name: demo\nranks: 4\nmicrobatches: 16\nschedule: zb-x\n", ZB_ERR_INVALID_ARG, "line 4",
                  "'schedule'", "unknown schedule 'zb-x'", "gpipe", "1f1b", "interleaved-1f1b", "zb-h1",
                  "zb-h2", "zb-auto", "zb-v", "v-half", "v-min", "zb-interleaved", "dualpipe-v", NULL));
}

/* Deep nesting is refused at the first level too many, before libyaml's
 * loader (quadratic in the depth: 16 s at 100,000 levels) sees it; so is
 * text past 1 MiB. */
static void test_job_yaml_depth_and_size(void) {
  size_t n = 100000;
  char *deep = malloc(n + 16);
  memcpy(deep, "name: ", 6);
  memset(deep + 6, '[', n);
  deep[6 + n] = 0;
  CHECK(job_fails(deep, ZB_ERR_PARSE, "line 1", "nested deeper than 64 levels", NULL));
  free(deep);
  size_t big = (1 << 20) + 1;
  char *large = malloc(big + 1);
  memset(large, '#', big);
  large[big] = 0;
  CHECK(job_fails(large, ZB_ERR_PARSE, "1048577 bytes", NULL));
  free(large);
  /* 64 levels are fine for the reader (the spec then refuses the value) */
  char ok[256] = "name: ";
  for (int k = 0; k < 63; k++)
    strcat(ok, "[");
  for (int k = 0; k < 63; k++)
    strcat(ok, "]");
  strcat(ok, "\n");
  CHECK(job_fails(ok, ZB_ERR_PARSE, "'name'", "expected a string", NULL));
}

static void test_job_shape_refused(void) {
  CHECK(job_fails("name: demo\nranks: 4\nmicrobatches: 3\nschedule: interleaved-1f1b\n", ZB_ERR_INVALID_ARG,
                  "line 4", "'schedule'", "at least as many microbatches as ranks", "m=3, p=4", NULL));
  zb_job_spec s;
  CHECK(job_ok("name: demo\nranks: 4\nmicrobatches: 6\nschedule: interleaved-1f1b\n", &s));
  CHECK(job_ok("name: demo\nranks: 4\nmicrobatches: 3\nschedule: zb-interleaved\n", &s));
  CHECK(job_ok("name: demo\nranks: 4\nmicrobatches: 8\nschedule: interleaved-1f1b\n", &s));
  /* Chunks the family cannot use are blamed on 'chunks', not the schedule. */
  CHECK(job_fails(BASE "chunks: 2\n", ZB_ERR_INVALID_ARG, "line 5", "'chunks'", "one chunk per rank", NULL));
  CHECK(job_fails("name: demo\nranks: 4\nmicrobatches: 16\nschedule: v-half\nchunks: 3\n", ZB_ERR_INVALID_ARG,
                  "line 5", "'chunks'", "exactly 2 chunks", NULL));
}

static void test_job_range_errors(void) {
  CHECK(job_fails("name: demo\nranks: 2000\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_INVALID_ARG,
                  "line 2", "'ranks'", "between 1 and 1024", NULL));
  CHECK(job_fails("name: demo\nranks: 99999999999999999999\nmicrobatches: 16\nschedule: zb-h1\n",
                  ZB_ERR_INVALID_ARG, "line 2", "'ranks'", "between 1 and 1024", NULL));
  CHECK(job_fails("name: demo\nranks: 4\nmicrobatches: 1000001\nschedule: zb-h1\n", ZB_ERR_INVALID_ARG,
                  "line 3", "'microbatches'", NULL));
  CHECK(job_fails(BASE "chunks: 5000\n", ZB_ERR_INVALID_ARG, "line 5", "'chunks'", NULL));
  CHECK(job_fails(BASE "iterations: 1000001\n", ZB_ERR_INVALID_ARG, "line 5", "'iterations'", NULL));
  CHECK(job_fails(BASE "bytes_per_activation: 1073741825\n", ZB_ERR_INVALID_ARG, "line 5",
                  "'bytes_per_activation'", NULL));
  CHECK(job_fails(BASE "iterations: 2\nbackend: tpu\n", ZB_ERR_INVALID_ARG, "line 6", "'backend'",
                  "sim, cpu, cuda", NULL));
  CHECK(job_fails(BASE "transport: udp\n", ZB_ERR_INVALID_ARG, "line 5", "'transport'", "tcp, nccl", NULL));
  CHECK(job_fails(BASE "wait_for_workers_s: 604801\n", ZB_ERR_INVALID_ARG, "line 5", "'wait_for_workers_s'",
                  "between 0 and 604800", NULL));
  CHECK(job_fails(BASE "transfer_timeout_s: 0\n", ZB_ERR_PARSE, "line 5", "'transfer_timeout_s'",
                  "integer >= 1", NULL));
  CHECK(job_fails(BASE "transfer_timeout_s: 86401\n", ZB_ERR_INVALID_ARG, "line 5", "'transfer_timeout_s'",
                  "between 1 and 86400", NULL));
  CHECK(job_fails(BASE "transfer_timeout_s: 30s\n", ZB_ERR_PARSE, "line 5", "'transfer_timeout_s'", NULL));
  CHECK(job_fails("name: bad name!\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_INVALID_ARG,
                  "line 1", "'name'", "[A-Za-z0-9._-]", NULL));
  CHECK(job_fails("name: ''\nranks: 4\nmicrobatches: 16\nschedule: zb-h1\n", ZB_ERR_INVALID_ARG, "line 1",
                  "'name'", NULL));
  CHECK(job_fails("name: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\n"
                  "ranks: 4\nmicrobatches: 16\nschedule: zb-h1\n",
                  ZB_ERR_INVALID_ARG, "line 1", "'name'", "at most 63", NULL));
  CHECK(
      job_fails(BASE "costs:\n  f: 1\n  w: -0.5\n", ZB_ERR_INVALID_ARG, "line 7", "'costs.w'", ">= 0", NULL));
  CHECK(job_fails(BASE "costs:\n  mem: [1, -0.2, -0.2]\n", ZB_ERR_INVALID_ARG, "line 6", "'costs.mem'",
                  "sum to zero", NULL));
  CHECK(job_fails(BASE "costs:\n  mem: [-1, 0.5, 0.5]\n", ZB_ERR_INVALID_ARG, "line 6", "'costs.mem'", NULL));
}

/* The checker alone, on specs filled the way the wire fills them. */
static void test_job_check_direct(void) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  snprintf(s.name, sizeof s.name, "wire");
  s.ranks = 2;
  s.microbatches = 4;
  snprintf(s.schedule, sizeof s.schedule, "zb-v");
  zb_diag d = {{0}};
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_OK);

  zb_job_spec bad = s;
  bad.ranks = 0;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "field 'ranks'") && strstr(d.msg, "got 0"), "message: %s", d.msg);
  bad = s;
  bad.costs.t_w = NAN;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'costs.w'"), "message: %s", d.msg);
  bad = s;
  bad.costs.t_comm = -1;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'costs.comm'"), "message: %s", d.msg);
  bad = s;
  bad.mem_limit = INFINITY;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'mem_limit'"), "message: %s", d.msg);
  bad = s;
  memset(bad.name, 'a', sizeof bad.name); /* not terminated: must not be read past */
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'name'"), "message: %s", d.msg);
  bad = s;
  snprintf(bad.backend, sizeof bad.backend, "gpu");
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'backend'"), "message: %s", d.msg);

  double rows[4][3] = {{1, 1, 1}, {1, 1, 1}, {1, 1, 1}, {1, 1, 1}};
  bad = s;
  bad.stage_costs = rows;
  bad.n_stage_costs = 4;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_OK);
  bad.n_stage_costs = 3;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'stage_costs'") && strstr(d.msg, "expected 4 rows"), "message: %s", d.msg);
  bad.n_stage_costs = 4;
  rows[2][0] = -1;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'stage_costs[2]'") && strstr(d.msg, "T_F"), "message: %s", d.msg);
  bad.stage_costs = NULL;
  CHECK_EQ(zb_job_spec_check(&bad, &d), ZB_ERR_INVALID_ARG);

  /* free accepts a zeroed spec, and twice. */
  zb_job_spec zero;
  memset(&zero, 0, sizeof zero);
  zb_job_spec_free(&zero);
  zb_job_spec_free(&zero);
  zb_job_spec_free(NULL);
}

/* A failure after stage_costs was allocated frees it and defaults *out. */
/* ---- job spec: the model of a cpu job ------------------------------------ */

#define CPU BASE "backend: cpu\n"

static void test_job_model_defaults_and_derived(void) {
  zb_job_spec s;
  zb_job_spec_default(&s);
  /* no model: every default; layers = ranks x chunks; bytes derived */
  CHECK(job_ok(CPU, &s));
  CHECK(!s.has_model);
  CHECK_EQ(s.model.hidden, 64);
  CHECK_EQ(s.model.heads, 4);
  CHECK_EQ(s.model.layers, 4); /* zb-h1: 4 ranks x 1 chunk */
  CHECK_EQ(s.model.seq_len, 64);
  CHECK_EQ(s.model.batch, 4);
  CHECK_EQ(s.model.seed, 1);
  CHECK_STREQ(s.model.data, ZB_MODEL_DEFAULT_DATA);
  CHECK_NEAR(s.model.lr, 3e-3, 1e-18);
  CHECK_NEAR(s.model.weight_decay, 0.01, 1e-18);
  CHECK_NEAR(s.model.beta1, 0.9, 1e-18);
  CHECK_NEAR(s.model.beta2, 0.95, 1e-18);
  CHECK_NEAR(s.model.eps, 1e-8, 1e-22);
  CHECK_NEAR(s.model.clip_norm, 1.0, 0);
  CHECK_STREQ(s.model.step, "post-validated");
  CHECK(!s.model.inject_nan);
  CHECK_EQ(s.bytes_per_activation, 4 * 64 * 64 * 4);
  CHECK_EQ(zb_model_spec_bytes_per_activation(&s.model), 65536);
  zb_job_spec_free(&s);

  /* zb-v's default is 2 chunks: 8 layers; explicit chunks count too */
  CHECK(job_ok("name: v\nranks: 4\nmicrobatches: 8\nschedule: zb-v\nbackend: cpu\n"
               "model:\n  hidden: 32\n  heads: 2\n  seq_len: 16\n  batch: 2\n",
               &s));
  CHECK(s.has_model);
  CHECK_EQ(s.model.layers, 8);
  CHECK_EQ(s.bytes_per_activation, 2 * 16 * 32 * 4);
  CHECK(job_ok("name: i\nranks: 2\nmicrobatches: 4\nschedule: interleaved-1f1b\nchunks: 3\nbackend: cpu\n",
               &s));
  CHECK_EQ(s.model.layers, 6);
  /* an explicit bytes_per_activation equal to the derived one is fine */
  CHECK(job_ok(CPU "bytes_per_activation: 65536\nmodel: {layers: 1}\n", &s));
  CHECK_EQ(s.model.layers, 1);

  /* a spec filled by hand: derive, then check */
  zb_job_spec_default(&s);
  snprintf(s.name, sizeof s.name, "hand");
  s.ranks = 2;
  s.microbatches = 4;
  snprintf(s.schedule, sizeof s.schedule, "1f1b");
  snprintf(s.backend, sizeof s.backend, "cpu");
  s.model.hidden = 16;
  zb_diag d = {{0}};
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_ERR_INVALID_ARG); /* layers not derived yet */
  CHECK_MSG(strstr(d.msg, "'model.layers'"), "message: %s", d.msg);
  zb_job_spec_derive(&s, false);
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_OK);
  CHECK_EQ(s.model.layers, 2);
  CHECK_EQ(s.bytes_per_activation, 4 * 64 * 16 * 4);
  s.bytes_per_activation = 1000;
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'bytes_per_activation'") && strstr(d.msg, "1000") && strstr(d.msg, "16384"),
            "message: %s", d.msg);
  /* sim jobs ignore the model's fields (nothing derived, nothing checked) */
  snprintf(s.backend, sizeof s.backend, "sim");
  s.model.hidden = -3;
  zb_job_spec_derive(&s, false);
  CHECK_EQ(s.bytes_per_activation, 1000);
  CHECK_EQ(zb_job_spec_check(&s, &d), ZB_OK);
  zb_job_spec_free(&s);
}

static void test_job_model_errors(void) {
  /* a conflicting bytes_per_activation names both numbers and its line */
  CHECK(job_fails(CPU "bytes_per_activation: 65537\n", ZB_ERR_INVALID_ARG, "line 6", "'bytes_per_activation'",
                  "65537", "65536", "batch 4 x seq_len 64 x hidden 64 x 4", NULL));
  CHECK(job_fails(CPU "model:\n  batch: 2\nbytes_per_activation: 65536\n", ZB_ERR_INVALID_ARG, "line 8",
                  "65536", "32768", NULL));
  /* only cpu jobs take a model */
  CHECK(job_fails(BASE "model:\n  hidden: 32\n", ZB_ERR_INVALID_ARG, "line 5", "'model'",
                  "only a cpu or cuda job", "'sim'", NULL));
  /* keys, types */
  CHECK(job_fails(
      CPU "model:\n  hiden: 32\n", ZB_ERR_PARSE, "line 7", "unknown key 'model.hiden'",
      "known: hidden, heads, layers, seq_len, batch, seed, data, lr, weight_decay, beta1, beta2, eps", NULL));
  CHECK(job_fails(CPU "model: 3\n", ZB_ERR_PARSE, "line 6", "'model'", "expected a mapping", NULL));
  CHECK(job_fails(CPU "model:\n  heads: two\n", ZB_ERR_PARSE, "line 7", "'model.heads'", "integer", NULL));
  CHECK(
      job_fails(CPU "model:\n  lr: fast\n", ZB_ERR_PARSE, "line 7", "'model.lr'", "expected a number", NULL));
  CHECK(job_fails(CPU "model:\n  data: [a]\n", ZB_ERR_PARSE, "line 7", "'model.data'", "string", NULL));
  CHECK(job_fails(CPU "model:\n  seed: 0\n", ZB_ERR_PARSE, "line 7", "'model.seed'", ">= 1", NULL));
  CHECK(job_fails(CPU "model:\n  layers: 0\n", ZB_ERR_PARSE, "line 7", "'model.layers'", ">= 1", NULL));
  CHECK(job_fails(CPU "model:\n  hidden: 32\n  hidden: 64\n", ZB_ERR_PARSE, "line 8",
                  "'model.hidden' given twice", NULL));
  /* ranges and the model's own rules, at the line of the key */
  CHECK(job_fails(CPU "model:\n  hidden: 30\n  heads: 4\n", ZB_ERR_INVALID_ARG, "line 8", "'model.heads'",
                  "must divide model.hidden (30), got 4", NULL));
  CHECK(job_fails(CPU "model:\n  hidden: 100000\n", ZB_ERR_INVALID_ARG, "line 7", "'model.hidden'",
                  "between 1 and 65536", NULL));
  CHECK(job_fails(CPU "model:\n  seq_len: 65536\n  batch: 1000\n", ZB_ERR_INVALID_ARG, "line 6", "'model'",
                  "too large", NULL));
  CHECK(job_fails(CPU "model:\n  lr: 0\n", ZB_ERR_INVALID_ARG, "line 7", "'model.lr'", "> 0", NULL));
  CHECK(job_fails(CPU "model:\n  weight_decay: -0.1\n", ZB_ERR_INVALID_ARG, "line 7", "'model.weight_decay'",
                  ">= 0", NULL));
  CHECK(job_fails(CPU "model:\n  beta1: 1\n", ZB_ERR_INVALID_ARG, "line 7", "'model.beta1'", "[0, 1)", NULL));
  CHECK(job_fails(CPU "model:\n  beta2: -0.5\n", ZB_ERR_INVALID_ARG, "line 7", "'model.beta2'", "[0, 1)",
                  NULL));
  CHECK(job_fails(CPU "model:\n  eps: 0\n", ZB_ERR_INVALID_ARG, "line 7", "'model.eps'", "> 0", NULL));
  CHECK(job_fails(CPU "model:\n  data: ''\n", ZB_ERR_INVALID_ARG, "line 7", "'model.data'", "path", NULL));
  /* the optimizer step's keys */
  CHECK(job_fails(CPU "model:\n  clip_norm: -1\n", ZB_ERR_INVALID_ARG, "line 7", "'model.clip_norm'", ">= 0",
                  NULL));
  CHECK(job_fails(CPU "model:\n  step: eager\n", ZB_ERR_INVALID_ARG, "line 7", "'model.step'",
                  "post-validated, synchronous", "'eager'", NULL));
  CHECK(job_fails(CPU "model:\n  inject_nan: 3\n", ZB_ERR_PARSE, "line 7", "'model.inject_nan'",
                  "iteration, microbatch", NULL));
  CHECK(job_fails(CPU "model:\n  inject_nan: {iter: 3}\n", ZB_ERR_PARSE, "line 7",
                  "unknown key 'model.inject_nan.iter'", NULL));
  CHECK(job_fails(CPU "model:\n  inject_nan: {iteration: 10}\n", ZB_ERR_INVALID_ARG, "line 7",
                  "'model.inject_nan.iteration'", "between 0 and iterations - 1 (9)", NULL));
  CHECK(job_fails(CPU "model:\n  inject_nan:\n    microbatch: 16\n", ZB_ERR_INVALID_ARG, "line 7",
                  "'model.inject_nan.microbatch'", "(15)", NULL));
  CHECK(job_fails(CPU "model:\n  inject_nan: {iteration: -1}\n", ZB_ERR_PARSE, "line 7",
                  "'model.inject_nan.iteration'", NULL));
  /* checkpoints: a directory every worker sees, so an absolute path */
  CHECK(job_fails(CPU "model:\n  checkpoint_every: 2\n", ZB_ERR_INVALID_ARG, "'model.checkpoint_dir'",
                  "absolute", NULL));
  CHECK(job_fails(CPU "model:\n  checkpoint_every: 2\n  checkpoint_dir: ckpt\n", ZB_ERR_INVALID_ARG,
                  "'model.checkpoint_dir'", "absolute", "'ckpt'", NULL));
  CHECK(job_fails(CPU "model:\n  checkpoint_every: -1\n", ZB_ERR_PARSE, "line 7", "'model.checkpoint_every'",
                  NULL));
  /* dumps: the same rule, and dump_every says nothing without a directory */
  CHECK(job_fails(CPU "model:\n  dump_dir: dumps\n", ZB_ERR_INVALID_ARG, "line 7", "'model.dump_dir'",
                  "absolute", "'dumps'", NULL));
  CHECK(job_fails(CPU "model:\n  dump_every: 2\n", ZB_ERR_INVALID_ARG, "line 7", "'model.dump_every'",
                  "model.dump_dir", NULL));
  CHECK(job_fails(CPU "model:\n  dump_dir: /d\n  dump_every: -3\n", ZB_ERR_PARSE, "line 8",
                  "'model.dump_every'", NULL));
  /* YAML text is UTF-8 already (libyaml's reader refuses other bytes); the
   * wire's strings are checked */
  zb_job_spec w;
  CHECK(job_ok(CPU, &w));
  memcpy(w.model.data, "/tmp/\xff.txt", sizeof "/tmp/\xff.txt");
  zb_diag d = {{0}};
  CHECK_EQ(zb_job_spec_check(&w, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'model.data'") && strstr(d.msg, "UTF-8"), "message: %s", d.msg);
  zb_job_spec_free(&w);
}

/* backend cuda: a model like cpu's (derived the same way), the nccl
 * transport and the precisions below fp32, which only cuda accepts. */
static void test_job_cuda_rules(void) {
  zb_job_spec s;
  /* a cuda job trains the model: layers and bytes_per_activation derived as for cpu */
  CHECK(job_ok(BASE "backend: cuda\ntransport: nccl\nmodel: {hidden: 32, batch: 2}\n", &s));
  CHECK(zb_job_spec_trains_model(&s));
  CHECK_EQ(s.model.layers, 4);
  CHECK_EQ(s.bytes_per_activation, 2 * 64 * 32 * 4);
  CHECK_STREQ(s.precision, "fp32");
  /* with no model section too (every default), and over tcp (host staging) */
  CHECK(job_ok(BASE "backend: cuda\nprecision: tf32\n", &s));
  CHECK_EQ(s.bytes_per_activation, 4 * 64 * 64 * 4);
  CHECK_STREQ(s.transport, "tcp");
  CHECK_STREQ(s.precision, "tf32");
  CHECK(job_ok(BASE "backend: cuda\nprecision: fp32\n", &s));
  CHECK_EQ(s.bytes_per_activation, 4 * 64 * 64 * 4);
  /* bf16 storage: the ranks send bf16 activations, half the bytes, and the
   * plan's byte figures (one bytes_per_activation per M_F unit) halve */
  CHECK(job_ok(BASE "backend: cuda\nprecision: bf16\n", &s));
  CHECK_EQ(s.bytes_per_activation, 4 * 64 * 64 * 2);
  CHECK_EQ(zb_job_spec_bytes_per_activation(&s), 2 * zb_model_spec_bytes_per_activation(&s.model) / 4);
  CHECK(job_fails(BASE "backend: cuda\nprecision: bf16\nbytes_per_activation: 65536\n", ZB_ERR_INVALID_ARG,
                  "'bytes_per_activation'", "65536", "32768", "bf16", NULL));
  CHECK(job_ok(BASE "backend: cpu\nprecision: fp32\n", &s));
  CHECK(!zb_job_spec_trains_model(&(zb_job_spec){.backend = "sim"}));
  zb_job_spec_free(&s);
  /* a given bytes_per_activation must match the cuda model's */
  CHECK(job_fails(BASE "backend: cuda\nbytes_per_activation: 4096\n", ZB_ERR_INVALID_ARG, "line 6",
                  "'bytes_per_activation'", "4096", "65536", NULL));
  /* nccl needs cuda: refused for sim and cpu, naming both keys' values */
  CHECK(job_fails(BASE "transport: nccl\n", ZB_ERR_INVALID_ARG, "line 5", "'transport'", "needs backend cuda",
                  "'sim'", NULL));
  CHECK(job_fails(BASE "backend: cpu\ntransport: nccl\n", ZB_ERR_INVALID_ARG, "line 6", "'transport'",
                  "needs backend cuda", "'cpu'", NULL));
  /* tf32 and bf16 need cuda; an unknown precision is named */
  CHECK(job_fails(BASE "backend: cpu\nprecision: bf16\n", ZB_ERR_INVALID_ARG, "line 6", "'precision'",
                  "bf16 needs backend cuda", "'cpu'", NULL));
  CHECK(job_fails(BASE "precision: tf32\n", ZB_ERR_INVALID_ARG, "line 5", "'precision'",
                  "tf32 needs backend cuda", "'sim'", NULL));
  CHECK(job_fails(BASE "backend: cuda\nprecision: fp16\n", ZB_ERR_INVALID_ARG, "line 6", "'precision'",
                  "fp32, tf32, bf16", "'fp16'", NULL));
  CHECK(job_fails(BASE "backend: cuda\nprecision: [bf16]\n", ZB_ERR_PARSE, "line 6", "'precision'", NULL));
  CHECK(job_fails(BASE "backend: cuda\nprecision: bfloat16-long\n", ZB_ERR_INVALID_ARG, "line 6",
                  "'precision'", "at most 7 characters", NULL));
  /* a spec filled by hand gets the same checks */
  zb_job_spec h;
  zb_job_spec_default(&h);
  snprintf(h.name, sizeof h.name, "hand");
  h.ranks = 2;
  h.microbatches = 4;
  snprintf(h.schedule, sizeof h.schedule, "1f1b");
  snprintf(h.backend, sizeof h.backend, "cuda");
  snprintf(h.transport, sizeof h.transport, "nccl");
  zb_job_spec_derive(&h, false);
  zb_diag d = {{0}};
  CHECK_EQ(zb_job_spec_check(&h, &d), ZB_OK);
  CHECK_EQ(h.model.layers, 2);
  memset(h.precision, 'x', sizeof h.precision); /* not terminated, as wire input may be */
  CHECK_EQ(zb_job_spec_check(&h, &d), ZB_ERR_INVALID_ARG);
  CHECK_MSG(strstr(d.msg, "'precision'"), "message: %s", d.msg);
  zb_job_spec_free(&h);
}

static void test_job_failure_resets_out(void) {
  zb_job_spec s;
  CHECK(job_ok(BASE "iterations: 7\n", &s));
  CHECK_EQ(s.iterations, 7);
  zb_diag d = {{0}};
  const char *yaml = BASE "stage_costs: [[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]\nbogus: 1\n";
  CHECK_EQ(zb_job_spec_parse(yaml, strlen(yaml), &s, &d), ZB_ERR_PARSE);
  CHECK(s.stage_costs == NULL);
  CHECK_EQ(s.n_stage_costs, 0);
  CHECK_EQ(s.ranks, 0);
  CHECK_EQ(s.iterations, 10);
  CHECK_STREQ(s.name, "");
  /* A check failure after a clean walk also frees the rows. */
  yaml = BASE "stage_costs: [[1, 1, 1], [1, 1, 1], [1, 1, 1], [1, 1, 1]]\ntransport: pigeon\n";
  CHECK_EQ(zb_job_spec_parse(yaml, strlen(yaml), &s, &d), ZB_ERR_INVALID_ARG);
  CHECK(s.stage_costs == NULL);
  /* Only len bytes are read: the rest of the buffer is not the document. */
  const char *longer = BASE "ranks: 8\n";
  CHECK_EQ(zb_job_spec_parse(longer, strlen(BASE), &s, &d), ZB_OK);
  CHECK_EQ(s.ranks, 4);
}

ZBT_MAIN(ZBT(test_job_yaml_depth_and_size), ZBT(test_job_full_spec), ZBT(test_job_defaults),
         ZBT(test_job_mem_limit_np), ZBT(test_job_wrong_types), ZBT(test_job_unknown_keys),
         ZBT(test_job_duplicate_keys), ZBT(test_job_missing_required), ZBT(test_job_not_a_mapping_or_empty),
         ZBT(test_job_malformed_yaml), ZBT(test_job_stage_costs), ZBT(test_job_unknown_schedule),
         ZBT(test_job_shape_refused), ZBT(test_job_range_errors), ZBT(test_job_check_direct),
         ZBT(test_job_model_defaults_and_derived), ZBT(test_job_model_errors), ZBT(test_job_cuda_rules),
         ZBT(test_job_failure_resets_out))
