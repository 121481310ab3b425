/* zb-gradcheck (tools/gradcheck.c), run as a subprocess on gradient dumps
 * this test writes as the workers do: a tiny model (h 16, 2 heads, 4
 * layers, seq_len 8, batch 2) split into S = 3 stages in this process, m = 3
 * microbatches of a text file the test writes, sampled with the workers'
 * zb_backend_cpu_text_fill; F on stages 0..2 per microbatch, then B in
 * reverse microbatch order and W in forward order (so the gradients
 * accumulate in another order than the tool's reference), activations and
 * gradients passed by hand; two iterations, with an SGD step between them
 * (iteration 1's weights are not the seeded ones, so the tool must load
 * them from the dumps).
 *   - honest dumps: exit 0, per-tensor error <= 1e-5, iteration 0's
 *     weights identical to the seeded model's;
 *   - one gradient element moved by 1% of its tensor's norm, one tensor's
 *     gradient doubled, a loss off by 1e-3 relative: exit 1 naming the
 *     tensor / the loss (and a change of a tenth of the tolerance passes);
 *   - a stage's file removed, a tensor on no stage, changed initial
 *     weights: exit 1 naming the stage / tensor;
 *   - a truncated dump: exit 2 naming the file; usage errors: exit 2.
 * Each test runs in a fresh directory under /tmp, removed after it. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "zb_alloc.h"
#include "zb_backend_cpu.h"
#include "zb_dump.h"
#include "zb_model.h"
#include "zbtest.h"

#ifndef ZB_GRADCHECK
#error "ZB_GRADCHECK (the path of zb-gradcheck) must be defined"
#endif

#define STAGES 3
#define MBS 3
#define ITERS 2
#define JOB "job-gc"
#define TOL 1e-5

static zb_model_config tiny_cfg(void) {
  return (zb_model_config){.vocab = 256,
                           .hidden = 16,
                           .heads = 2,
                           .layers = 4,
                           .seq_len = 8,
                           .batch = 2,
                           .seed = 11,
                           .loss_scale = 1.0f / MBS};
}

/* ---- fixture ------------------------------------------------------------- */

typedef struct fixture {
  char root[64];   /* /tmp/zbgradcheck-XXXXXX */
  char text[96];   /* root/corpus.txt */
  char dir[96];    /* root/JOB: the dumps */
  char out[65536]; /* the last run's stdout and stderr */
} fixture;

static int write_text(const char *path) {
  static const char *const words[] = {"the",    "model", "stage", "pipeline",  "bubble", "zero",
                                      "weight", "grad",  "of",    "and",       "a",      "schedule",
                                      "memory", "rank",  "to",    "microbatch"};
  FILE *f = fopen(path, "w");
  if (!f)
    return 0;
  uint64_t x = 12345;
  for (int i = 0; i < 800; i++) { /* about 4 KB */
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    fprintf(f, "%s%s", words[(x >> 33) % 16], (x >> 40) % 11 == 0 ? ".\n" : " ");
  }
  return fclose(f) == 0;
}

static int read_all(const char *path, uint8_t **out, size_t *len) {
  FILE *f = fopen(path, "rb");
  if (!f)
    return 0;
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  *out = zb_malloc((size_t)n + 1);
  *len = fread(*out, 1, (size_t)n, f);
  fclose(f);
  return *len == (size_t)n;
}

static void dump_path(const fixture *fx, int it, int stage, char *buf, size_t cap) {
  snprintf(buf, cap, "%s/it%d-stage%d.dump", fx->dir, it, stage);
}

/* Runs one pipelined iteration over st[] and writes its dumps (before: the
 * weights now; after: one SGD step, which the stages then hold). */
static int run_iteration(const fixture *fx, zb_model_stage **st, const zb_cpu_text *text, int it) {
  const zb_model_config c = tiny_cfg();
  size_t ntok = (size_t)c.batch * (size_t)c.seq_len, na = zb_model_act_numel(st[0]);
  uint8_t *tok = zb_malloc(ntok), *tgt = zb_malloc(ntok);
  int32_t *ids = zb_malloc(2 * ntok * sizeof *ids); /* tokens, then targets, widened */
  float *act[STAGES][MBS], *grad[STAGES][MBS], *before[STAGES], loss[MBS];
  for (int s = 0; s < STAGES; s++) {
    size_t n = zb_model_n_params(st[s]);
    before[s] = zb_malloc(sizeof(float) * n);
    memcpy(before[s], zb_model_params(st[s]), sizeof(float) * n);
    zb_model_zero_grads(st[s]);
    for (int mb = 0; mb < MBS; mb++) {
      act[s][mb] = zb_calloc(na, sizeof(float));
      grad[s][mb] = zb_calloc(na, sizeof(float));
    }
  }
  zb_diag d = {{0}};
  int ok = 1;
  for (int mb = 0; mb < MBS && ok; mb++) {
    ok = zb_backend_cpu_text_fill((void *)text, it, mb, c.batch, c.seq_len, tok, tgt, &d) == ZB_OK;
    for (size_t k = 0; ok && k < ntok; k++)
      ids[k] = tok[k], ids[ntok + k] = tgt[k];
    for (int s = 0; s < STAGES && ok; s++) {
      int first = s == 0, last = s == STAGES - 1;
      ok = zb_model_forward(st[s], mb, first ? ids : NULL, first ? NULL : act[s - 1][mb],
                            last ? ids + ntok : NULL, last ? NULL : act[s][mb], last ? &loss[mb] : NULL,
                            &d) == ZB_OK;
    }
  }
  for (int mb = MBS - 1; mb >= 0 && ok; mb--)
    for (int s = STAGES - 1; s >= 0 && ok; s--)
      ok = zb_model_backward_b(st[s], mb, s == STAGES - 1 ? NULL : grad[s + 1][mb],
                               s == 0 ? NULL : grad[s][mb], &d) == ZB_OK;
  for (int mb = 0; mb < MBS && ok; mb++)
    for (int s = 0; s < STAGES && ok; s++)
      ok = zb_model_backward_w(st[s], mb, &d) == ZB_OK;
  if (!ok)
    fprintf(stderr, "  iteration %d: %s\n", it, d.msg);
  double sum = 0;
  for (int mb = 0; mb < MBS; mb++)
    sum += (double)loss[mb];
  for (int s = 0; s < STAGES && ok; s++) {
    int nt = zb_model_n_tensors(st[s]);
    size_t n = zb_model_n_params(st[s]);
    zb_dump_tensor *tensors = zb_calloc((size_t)nt, sizeof *tensors);
    for (int t = 0; t < nt; t++) {
      const zb_model_tensor *tt = zb_model_tensor_at(st[s], t);
      if (snprintf(tensors[t].name, sizeof tensors[t].name, "%s", tt->name) >= (int)sizeof tensors[t].name)
        abort(); /* the builtin model's names fit the dump format */
      tensors[t].rows = tt->rows;
      tensors[t].cols = tt->cols;
    }
    float *p = zb_model_params(st[s]), *g = zb_model_grads(st[s]);
    for (size_t i = 0; i < n; i++)
      p[i] -= 0.05f * g[i];
    int last = s == STAGES - 1;
    zb_dump dd = {.iteration = it,
                  .stage = s,
                  .n_stages = STAGES,
                  .rank = s,
                  .microbatches = MBS,
                  .vocab = c.vocab,
                  .hidden = c.hidden,
                  .heads = c.heads,
                  .layers = c.layers,
                  .seq_len = c.seq_len,
                  .batch = c.batch,
                  .seed = c.seed,
                  .flags = last ? ZB_DUMP_HAS_LOSS : 0,
                  .loss = last ? sum / MBS : 0,
                  .n_tensors = nt,
                  .tensors = tensors,
                  .n = n,
                  .before = before[s],
                  .grads = g,
                  .after = p};
    snprintf(dd.job_id, sizeof dd.job_id, "%s", JOB);
    snprintf(dd.data, sizeof dd.data, "%s", fx->text);
    char path[160];
    dump_path(fx, it, s, path, sizeof path);
    if (zb_dump_save(NULL, path, &dd, &d) != ZB_OK) {
      fprintf(stderr, "  %s\n", d.msg);
      ok = 0;
    }
    free(tensors);
  }
  for (int s = 0; s < STAGES; s++) {
    free(before[s]);
    for (int mb = 0; mb < MBS; mb++) {
      free(act[s][mb]);
      free(grad[s][mb]);
    }
  }
  free(tok);
  free(tgt);
  free(ids);
  return ok;
}

/* Writes the text and the honest dumps of ITERS iterations. */
static int make_job(fixture *fx) {
  snprintf(fx->text, sizeof fx->text, "%s/corpus.txt", fx->root);
  snprintf(fx->dir, sizeof fx->dir, "%s/%s", fx->root, JOB);
  if (!write_text(fx->text) || mkdir(fx->dir, 0755) != 0)
    return 0;
  zb_cpu_text text = {.seed = tiny_cfg().seed};
  uint8_t *bytes = NULL;
  if (!read_all(fx->text, &bytes, &text.len)) {
    free(bytes);
    return 0;
  }
  text.text = bytes;
  zb_model_config c = tiny_cfg();
  zb_model_stage *st[STAGES] = {NULL};
  int ok = 1;
  for (int s = 0; s < STAGES && ok; s++) {
    zb_diag d = {{0}};
    if (zb_model_stage_new(&c, s, STAGES, &st[s], &d) != ZB_OK) {
      fprintf(stderr, "  stage %d: %s\n", s, d.msg);
      ok = 0;
    }
  }
  for (int it = 0; it < ITERS && ok; it++)
    ok = run_iteration(fx, st, &text, it);
  for (int s = 0; s < STAGES; s++)
    zb_model_stage_free(st[s]);
  free(bytes);
  return ok;
}

/* Runs body with a fresh directory holding the honest dumps. */
static void with_job(void (*body)(fixture *)) {
  fixture *fx = zb_calloc(1, sizeof *fx);
  snprintf(fx->root, sizeof fx->root, "/tmp/zbgradcheck-XXXXXX");
  if (!mkdtemp(fx->root)) {
    perror("  mkdtemp");
    zbt_failed_checks++;
    free(fx);
    return;
  }
  if (make_job(fx))
    body(fx);
  else {
    fprintf(stderr, "  cannot write the dumps in %s\n", fx->root);
    zbt_failed_checks++;
  }
  zbt_remove_dir(fx->dir);
  unlink(fx->text);
  zbt_remove_dir(fx->root);
  free(fx);
}

/* Runs zb-gradcheck ARGS (shell words) on dir; fx->out gets stdout and
 * stderr. Returns the exit status, -1 when it did not exit. */
static int run_tool_on(fixture *fx, const char *args, const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "'%s' %s '%s' 2>&1", ZB_GRADCHECK, args, dir);
  FILE *p = popen(cmd, "r");
  if (!p)
    return -1;
  size_t n = fread(fx->out, 1, sizeof fx->out - 1, p);
  fx->out[n] = 0;
  int st = pclose(p);
  if (getenv("ZB_TEST_VERBOSE"))
    printf("    $ zb-gradcheck %s DIR -> %d\n%s", args, WIFEXITED(st) ? WEXITSTATUS(st) : -1, fx->out);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int run_tool(fixture *fx, const char *args) {
  return run_tool_on(fx, args, fx->dir);
}

static int count_substr(const char *hay, const char *needle) {
  int n = 0;
  for (const char *p = strstr(hay, needle); p; p = strstr(p + 1, needle))
    n++;
  return n;
}

/* The number after "key": in the JSON line of `iteration` in out; NAN when
 * absent or null. */
static double json_field(const char *out, int iteration, const char *key) {
  char head[48], k[64];
  snprintf(head, sizeof head, "{\"iteration\":%d,", iteration);
  snprintf(k, sizeof k, "\"%s\":", key);
  const char *line = strstr(out, head);
  if (!line)
    return NAN;
  const char *end = strchr(line, '\n');
  const char *p = strstr(line, k);
  if (!p || (end && p > end))
    return NAN;
  char *stop;
  double v = strtod(p + strlen(k), &stop);
  return stop == p + strlen(k) ? NAN : v;
}

/* Whether the JSON line of `iteration` holds `text`. */
static int json_has(const char *out, int iteration, const char *text) {
  char head[48];
  snprintf(head, sizeof head, "{\"iteration\":%d,", iteration);
  const char *line = strstr(out, head);
  if (!line)
    return 0;
  const char *end = strchr(line, '\n'), *p = strstr(line, text);
  return p && (!end || p < end);
}

/* Loads dump (it, stage), lets edit change it, saves it back. */
static int edit_dump(const fixture *fx, int it, int stage, void (*edit)(zb_dump *, void *), void *ud) {
  char path[160];
  dump_path(fx, it, stage, path, sizeof path);
  zb_dump d;
  zb_diag diag = {{0}};
  if (zb_dump_load(NULL, path, &d, &diag) != ZB_OK) {
    fprintf(stderr, "  %s\n", diag.msg);
    return 0;
  }
  edit(&d, ud);
  zb_err err = zb_dump_save(NULL, path, &d, &diag);
  if (err)
    fprintf(stderr, "  %s\n", diag.msg);
  zb_dump_free(&d);
  return err == ZB_OK;
}

/* Where tensor `name` lives in iteration it's dumps: its stage, its
 * offset and size in the stage's arrays. */
static int find_tensor(const fixture *fx, int it, const char *name, int *stage, size_t *off, size_t *numel) {
  for (int s = 0; s < STAGES; s++) {
    char path[160];
    dump_path(fx, it, s, path, sizeof path);
    zb_dump d;
    if (zb_dump_load(NULL, path, &d, NULL) != ZB_OK)
      return 0;
    size_t o = 0;
    for (int t = 0; t < d.n_tensors; t++) {
      size_t n = (size_t)d.tensors[t].rows * (size_t)d.tensors[t].cols;
      if (strcmp(d.tensors[t].name, name) == 0) {
        *stage = s;
        *off = o;
        *numel = n;
        zb_dump_free(&d);
        return 1;
      }
      o += n;
    }
    zb_dump_free(&d);
  }
  return 0;
}

/* ---- honest dumps ---------------------------------------------------------- */

static void honest_body(fixture *fx) {
  int rc = run_tool(fx, "--json");
  CHECK_MSG(rc == 0, "exit %d on honest dumps:\n%s", rc, fx->out);
  CHECK_EQ(count_substr(fx->out, "{\"iteration\":"), ITERS);
  /* 4 blocks of 12 tensors, embed, pos_embed, ln_f (2), head */
  int tensors = 12 * tiny_cfg().layers + 5;
  for (int it = 0; it < ITERS; it++) {
    double rel = json_field(fx->out, it, "max_rel_err"), loss_rel = json_field(fx->out, it, "loss_rel_err");
    CHECK_MSG(rel <= TOL, "iteration %d: max_rel_err %g:\n%s", it, rel, fx->out);
    CHECK_MSG(loss_rel <= TOL, "iteration %d: loss_rel_err %g:\n%s", it, loss_rel, fx->out);
    CHECK_EQ(json_field(fx->out, it, "tensors"), tensors);
    CHECK_EQ(json_field(fx->out, it, "stages"), STAGES);
    CHECK_EQ(json_field(fx->out, it, "microbatches"), MBS);
    CHECK(json_field(fx->out, it, "loss") > 1.0); /* a byte-level LM starts near ln 256 = 5.5 */
    CHECK(json_has(fx->out, it, "\"ok\":true"));
    CHECK(json_has(fx->out, it, "\"job_id\":\"" JOB "\""));
  }
  CHECK(json_has(fx->out, 0, "\"init_identical\":true"));
  CHECK(json_has(fx->out, 1, "\"init_identical\":null"));

  rc = run_tool(fx, "");
  CHECK_MSG(rc == 0, "exit %d:\n%s", rc, fx->out);
  CHECK(strstr(fx->out, "layer3.mlp.fc2.weight") != NULL); /* the table */
  CHECK(strstr(fx->out, "iteration 0: 3 stages") != NULL);
  CHECK_EQ(count_substr(fx->out, ": OK (tolerance 1e-05)"), ITERS);

  rc = run_tool(fx, "--quiet --iteration 1");
  CHECK_MSG(rc == 0, "exit %d:\n%s", rc, fx->out);
  CHECK_MSG(strncmp(fx->out, "iteration 1: ", 13) == 0 && count_substr(fx->out, "\n") == 1, "%s", fx->out);

  /* a stray writer's temporary file is not a dump */
  char tmp[200];
  snprintf(tmp, sizeof tmp, "%s/it0-stage0.dump.tmp.1234", fx->dir);
  FILE *f = fopen(tmp, "w");
  CHECK(f);
  fputs("partial", f);
  fclose(f);
  rc = run_tool(fx, "--quiet");
  unlink(tmp);
  CHECK_MSG(rc == 0, "exit %d with a .tmp file:\n%s", rc, fx->out);
}

static void test_honest(void) {
  with_job(honest_body);
}

/* ---- wrong gradients ------------------------------------------------------- */

typedef struct perturb {
  size_t off, numel;
  double frac;  /* of the tensor's norm, added to element off + 5 */
  double scale; /* every element times this */
} perturb;

static void apply_perturb(zb_dump *d, void *ud) {
  const perturb *p = ud;
  double s2 = 0;
  for (size_t i = 0; i < p->numel; i++)
    s2 += (double)d->grads[p->off + i] * d->grads[p->off + i];
  d->grads[p->off + 5] += (float)(p->frac * sqrt(s2));
  for (size_t i = 0; i < p->numel; i++)
    d->grads[p->off + i] *= (float)p->scale;
}

static void perturbed_body(fixture *fx) {
  const char *name = "layer2.attn.qkv.weight";
  int stage;
  perturb p = {.scale = 1};
  CHECK(find_tensor(fx, 0, name, &stage, &p.off, &p.numel));
  /* a tenth of the tolerance passes: the bound is relative to the norm */
  p.frac = 1e-6;
  CHECK(edit_dump(fx, 0, stage, apply_perturb, &p));
  int rc = run_tool(fx, "--quiet");
  CHECK_MSG(rc == 0, "exit %d after a 1e-6 change:\n%s", rc, fx->out);
  p.frac = 1e-2;
  CHECK(edit_dump(fx, 0, stage, apply_perturb, &p));
  rc = run_tool(fx, "--quiet");
  CHECK_MSG(rc == 1, "exit %d after a 1e-2 change:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "tensor 'layer2.attn.qkv.weight'") != NULL, "%s", fx->out);
  CHECK_MSG(count_substr(fx->out, "tensor '") == 1, "other tensors reported:\n%s", fx->out);
  CHECK_MSG(strstr(fx->out, "iteration 0: ") && strstr(fx->out, "FAILED"), "%s", fx->out);
  CHECK_MSG(strstr(fx->out, "iteration 1: ") && strstr(fx->out, ": OK"), "%s", fx->out);
  rc = run_tool(fx, "--json");
  CHECK_EQ(rc, 1);
  CHECK(json_has(fx->out, 0, "\"worst_tensor\":\"layer2.attn.qkv.weight\""));
  CHECK(json_has(fx->out, 0, "\"ok\":false"));
  CHECK(json_has(fx->out, 1, "\"ok\":true"));
  double rel = json_field(fx->out, 0, "max_rel_err");
  CHECK_MSG(rel > 0.5e-2 && rel < 2e-2, "max_rel_err %g, expected about 1e-2", rel);
}

static void test_perturbed_element(void) {
  with_job(perturbed_body);
}

static void doubled_body(fixture *fx) {
  const char *name = "layer0.mlp.fc1.weight";
  int stage;
  perturb p = {.scale = 2};
  CHECK(find_tensor(fx, 1, name, &stage, &p.off, &p.numel));
  CHECK(edit_dump(fx, 1, stage, apply_perturb, &p));
  int rc = run_tool(fx, "--json");
  CHECK_MSG(rc == 1, "exit %d with a doubled gradient:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "tensor 'layer0.mlp.fc1.weight'") != NULL, "%s", fx->out);
  CHECK(json_has(fx->out, 1, "\"worst_tensor\":\"layer0.mlp.fc1.weight\""));
  CHECK(json_has(fx->out, 1, "\"ok\":false"));
  CHECK(json_has(fx->out, 0, "\"ok\":true"));
  CHECK_NEAR(json_field(fx->out, 1, "max_rel_err"), 1.0, 1e-4);
}

static void test_doubled_gradient(void) {
  with_job(doubled_body);
}

static void scale_loss(zb_dump *d, void *ud) {
  d->loss *= *(const double *)ud;
}

static void loss_body(fixture *fx) {
  double f = 1 + 1e-6;
  CHECK(edit_dump(fx, 0, STAGES - 1, scale_loss, &f));
  int rc = run_tool(fx, "--quiet");
  CHECK_MSG(rc == 0, "exit %d with the loss off by 1e-6:\n%s", rc, fx->out);
  f = 1 + 1e-3;
  CHECK(edit_dump(fx, 0, STAGES - 1, scale_loss, &f));
  rc = run_tool(fx, "--quiet");
  CHECK_MSG(rc == 1, "exit %d with the loss off by 1e-3:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "zb-gradcheck: iteration 0: loss ") && strstr(fx->out, "it0-stage2.dump"), "%s",
            fx->out);
  CHECK_MSG(count_substr(fx->out, "tensor '") == 0, "tensors reported:\n%s", fx->out);
  rc = run_tool(fx, "--json");
  CHECK_EQ(rc, 1);
  CHECK_NEAR(json_field(fx->out, 0, "loss_rel_err"), 1e-3, 1e-5);
}

static void test_loss_off(void) {
  with_job(loss_body);
}

/* ---- inconsistent and damaged files ---------------------------------------- */

static void missing_stage_body(fixture *fx) {
  char path[160];
  dump_path(fx, 0, 1, path, sizeof path);
  CHECK(unlink(path) == 0);
  int rc = run_tool(fx, "--quiet");
  CHECK_MSG(rc == 1, "exit %d without stage 1:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "iteration 0: stage 1 of 3 is missing") != NULL, "%s", fx->out);
  CHECK_MSG(strstr(fx->out, "iteration 1: ") && strstr(fx->out, ": OK"), "%s", fx->out);
}

static void test_missing_stage(void) {
  with_job(missing_stage_body);
}

/* Drops the stage's last tensor (the arrays are per-tensor concatenations,
 * so their prefixes stay right). */
static void drop_last_tensor(zb_dump *d, void *ud) {
  (void)ud;
  const zb_dump_tensor *t = &d->tensors[d->n_tensors - 1];
  d->n -= (size_t)t->rows * (size_t)t->cols;
  d->n_tensors--;
}

static void flip_before(zb_dump *d, void *ud) {
  (void)ud;
  d->before[3] = nextafterf(d->before[3], 1.0f); /* embed.weight, one ulp */
}

static void structure_body(fixture *fx) {
  CHECK(edit_dump(fx, 1, 1, drop_last_tensor, NULL));
  int rc = run_tool(fx, "--quiet --iteration 1");
  CHECK_MSG(rc == 1, "exit %d with a tensor dropped:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "tensor 'layer1.mlp.fc2.bias' (1 x 16) is on no stage") != NULL, "%s", fx->out);

  CHECK(edit_dump(fx, 0, 0, flip_before, NULL));
  rc = run_tool(fx, "--json --iteration 0");
  CHECK_MSG(rc == 1, "exit %d with changed initial weights:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "initial weights: tensor 'embed.weight' (stage 0)") != NULL, "%s", fx->out);
  CHECK(json_has(fx->out, 0, "\"init_identical\":false"));
}

static void test_structure(void) {
  with_job(structure_body);
}

static void truncated_body(fixture *fx) {
  char path[160];
  dump_path(fx, 0, 2, path, sizeof path);
  struct stat sb;
  CHECK(stat(path, &sb) == 0);
  CHECK(truncate(path, sb.st_size / 2) == 0);
  int rc = run_tool(fx, "");
  CHECK_MSG(rc == 2, "exit %d with a truncated dump:\n%s", rc, fx->out);
  CHECK_MSG(strstr(fx->out, "zb-gradcheck: dump '") && strstr(fx->out, "it0-stage2.dump"), "%s", fx->out);
}

static void test_truncated(void) {
  with_job(truncated_body);
}

static void usage_body(fixture *fx) {
  CHECK_EQ(run_tool(fx, "--help"), 0);
  CHECK(strncmp(fx->out, "usage: zb-gradcheck", 19) == 0);
  CHECK_EQ(run_tool(fx, "--tolerance abc"), 2);
  CHECK(strstr(fx->out, "zb-gradcheck: --tolerance") != NULL);
  CHECK_EQ(run_tool(fx, "--iteration 7"), 2);
  CHECK(strstr(fx->out, "no dumps of iteration 7") != NULL);
  CHECK_EQ(run_tool(fx, "--bogus"), 2);
  /* a dump directory with no dumps */
  char empty[120];
  snprintf(empty, sizeof empty, "%s/empty", fx->root);
  CHECK(mkdir(empty, 0755) == 0);
  int rc = run_tool_on(fx, "", empty);
  rmdir(empty);
  CHECK_MSG(rc == 2 && strstr(fx->out, "no dump files"), "%d: %s", rc, fx->out);
  CHECK_EQ(run_tool_on(fx, "", "/nonexistent/zb-gradcheck"), 2);
  CHECK(strstr(fx->out, "zb-gradcheck: cannot open '/nonexistent/zb-gradcheck'") != NULL);
}

static void test_usage(void) {
  with_job(usage_body);
}

ZBT_MAIN(ZBT(test_honest), ZBT(test_perturbed_element), ZBT(test_doubled_gradient), ZBT(test_loss_off),
         ZBT(test_missing_stage), ZBT(test_structure), ZBT(test_truncated), ZBT(test_usage))
