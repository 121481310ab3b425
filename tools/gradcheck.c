/* zb-gradcheck: the numerical oracle of pipelined training. A cpu job with
 * model.dump_dir leaves, for each dumped iteration, one file per pipeline
 * stage (zb_dump.h): the stage's weights before the step, the gradients
 * the iteration accumulated (loss_scale 1/m: the gradient of the mean loss,
 * before clipping) and the weights after. This tool recomputes the same
 * iteration in one process without pipelining: the whole model as one
 * stage, the dumped weights, the same microbatches of the same text
 * (zb_backend_cpu_text_fill, as the workers sample it). It then compares
 * every tensor's gradient and the mean loss.
 *
 * The model computes an op's bits the same on any partition, so an honest
 * pipelined gradient differs from the reference only by the fp32 rounding
 * of the order in which the W ops accumulated it (about 1e-7 relative). A
 * microbatch dropped or counted twice, an activation or gradient sent to
 * the wrong stage or microbatch, a tensor lost or duplicated by the
 * partition, or a loss averaged wrongly shows up as an error of order
 * 1e-3 to 1, far above the default tolerance of 1e-5.
 *
 * Exit status: 0 when every checked iteration matches; 1 when one does not
 * or its files are inconsistent (a stage missing or twice, a tensor on no
 * stage or on two); 2 for a usage error or input that cannot be read. */
#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_backend.h"
#include "zb_dump.h"
#include "zb_file.h"
#include "zb_model.h"

static const char usage_text[] =
    "usage: zb-gradcheck [--tolerance T] [--iteration N] [--data FILE] [--json] [--quiet]\n"
    "                    JOB_DUMP_DIR\n"
    "       zb-gradcheck --help\n"
    "\n"
    "Checks the gradient dumps of a cpu job (the job spec's model.dump_dir):\n"
    "JOB_DUMP_DIR is DIR/JOB_ID, holding it<N>-stage<S>.dump. For each dumped\n"
    "iteration it recomputes the iteration in one process without pipelining\n"
    "(the whole model as one stage, the weights the dumps hold from before the\n"
    "step, the same microbatches of the same text) and compares every tensor's\n"
    "gradient, ||g - g_ref|| / ||g_ref|| (the absolute ||g - g_ref|| where\n"
    "g_ref is zero), and the iteration's mean loss with the tolerance. The\n"
    "dumped weights of iteration 0 must equal the seeded initialisation bit\n"
    "for bit. An iteration whose step every stage skipped (non-finite\n"
    "gradients) is reported and not compared.\n"
    "\n"
    "  --tolerance T  largest relative error that passes (default 1e-05)\n"
    "  --iteration N  check iteration N only (default: every iteration present)\n"
    "  --data FILE    the text file to sample (default: the path the dumps\n"
    "                 record, as the workers saw it)\n"
    "  --json         one JSON object per iteration on stdout, nothing else\n"
    "  --quiet        print only the summary line of each iteration\n"
    "  --help         print this text\n"
    "\n"
    "Exit status: 0 every checked iteration matches; 1 one does not, or its\n"
    "files are inconsistent (a stage missing or twice, a tensor on no stage,\n"
    "on two or of another shape); 2 a usage error or input that cannot be\n"
    "read (no dumps, a damaged dump, the text file).\n";

#define PREFIX "zb-gradcheck: "

typedef struct gc_opts {
  double tol;
  int iteration; /* -1: every iteration present */
  const char *data;
  const char *dir;
  bool json, quiet;
} gc_opts;

/* One dump file: its header's iteration and stage (the first pass reads
 * and verifies every file, then keeps only these). */
typedef struct gc_file {
  char *path;
  int iteration, stage;
  bool named; /* the name has the writer's form it<N>-stage<S>.dump */
  int name_iteration, name_stage;
} gc_file;

/* The text file, read once for every iteration that names it. */
typedef struct gc_text {
  char *path;
  uint8_t *bytes;
  size_t len;
} gc_text;

/* One iteration's check and what it reports. */
typedef struct gc_iter {
  const gc_opts *o;
  int iteration;
  char job_id[64];
  int stages, microbatches, tensors;
  size_t params;
  bool mapped;   /* every tensor found once: tensors and params hold */
  bool compared; /* the reference ran: the errors and loss_ref hold */
  bool abs_used; /* some g_ref was zero: its error is absolute */
  double max_rel;
  char worst[48];
  double loss, loss_ref, loss_rel;
  int init;        /* iteration 0: 1 identical, 0 differs; -1 not checked */
  bool skipped;    /* every stage skipped its step: not compared */
  int status;      /* 0 pass, 1 mismatch or inconsistent, 2 could not check */
  char error[512]; /* the first error, for --json */
} gc_iter;

/* Records a failure of status (1 or 2) and prints it to stderr. */
__attribute__((format(printf, 3, 4))) static void gc_fail(gc_iter *it, int status, const char *fmt, ...) {
  char msg[sizeof it->error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, PREFIX "iteration %d: %s\n", it->iteration, msg);
  if (!it->error[0])
    snprintf(it->error, sizeof it->error, "%s", msg);
  if (status > it->status)
    it->status = status;
}

/* ---- reading ------------------------------------------------------------ */

static int file_cmp(const void *a, const void *b) {
  const gc_file *x = a, *y = b;
  if (x->iteration != y->iteration)
    return x->iteration < y->iteration ? -1 : 1;
  if (x->stage != y->stage)
    return x->stage < y->stage ? -1 : 1;
  return strcmp(x->path, y->path);
}

/* Lists the directory's *.dump files (not the writers' *.tmp.* files),
 * loads each once (a damaged one ends the run: exit 2) and keeps its
 * iteration and stage. With --iteration, files named for another
 * iteration are not read. Returns 0 or 2. */
static int scan_dir(const gc_opts *o, gc_file **out, int *n_out) {
  *out = NULL;
  *n_out = 0;
  DIR *dir = opendir(o->dir);
  if (!dir) {
    fprintf(stderr, PREFIX "cannot open '%s': %s\n", o->dir, strerror(errno));
    return 2;
  }
  gc_file *files = NULL;
  int n = 0, cap = 0, rc = 0;
  struct dirent *e;
  while (!rc && (e = readdir(dir))) {
    const char *name = e->d_name;
    size_t len = strlen(name);
    if (len < 5 || strcmp(name + len - 5, ".dump") != 0 || strstr(name, ".tmp."))
      continue;
    gc_file f = {0};
    int end = 0;
    f.named = sscanf(name, "it%d-stage%d.dump%n", &f.name_iteration, &f.name_stage, &end) == 2 &&
              (size_t)end == len;
    if (f.named && o->iteration >= 0 && f.name_iteration != o->iteration)
      continue;
    size_t plen = strlen(o->dir) + 1 + len + 1;
    f.path = zb_malloc(plen);
    snprintf(f.path, plen, "%s/%s", o->dir, name);
    zb_dump d;
    zb_diag diag = {{0}};
    if (zb_dump_load(f.path, &d, &diag) != ZB_OK) {
      fprintf(stderr, PREFIX "%s\n", diag.msg);
      free(f.path);
      rc = 2;
      break;
    }
    f.iteration = d.iteration;
    f.stage = d.stage;
    zb_dump_free(&d);
    if (o->iteration >= 0 && f.iteration != o->iteration) {
      free(f.path);
      continue;
    }
    if (n == cap)
      files = zb_realloc(files, sizeof *files * (size_t)(cap = cap ? 2 * cap : 16));
    files[n++] = f;
  }
  closedir(dir);
  if (!rc && n == 0) {
    if (o->iteration >= 0)
      fprintf(stderr, PREFIX "no dumps of iteration %d in '%s'\n", o->iteration, o->dir);
    else
      fprintf(stderr, PREFIX "no dump files (*.dump) in '%s'\n", o->dir);
    rc = 2;
  }
  if (rc) {
    for (int i = 0; i < n; i++)
      free(files[i].path);
    free(files);
    return rc;
  }
  qsort(files, (size_t)n, sizeof *files, file_cmp);
  *out = files;
  *n_out = n;
  return 0;
}

/* Reads path into t unless t already holds it. */
static zb_err text_load(gc_text *t, const char *path, zb_diag *diag) {
  if (t->path && strcmp(t->path, path) == 0)
    return ZB_OK;
  free(t->path);
  free(t->bytes);
  *t = (gc_text){0};
  uint8_t *buf;
  size_t n;
  zb_err err = zb_file_slurp("data", path, &buf, &n, diag);
  if (err)
    return err;
  t->path = zb_strdup(path);
  t->bytes = buf;
  t->len = n;
  return ZB_OK;
}

/* ---- one iteration ------------------------------------------------------ */

static void same_int(gc_iter *it, const char *field, const gc_file *f, long long v, const gc_file *f0,
                     long long v0) {
  if (v != v0)
    gc_fail(it, 1, "'%s' has %s %lld, '%s' has %lld", f->path, field, v, f0->path, v0);
}

/* The files of one iteration must describe one job and one model, each
 * stage once, the loss on the last stage only. */
static void check_files(gc_iter *it, const gc_file *f, const zb_dump *d, int nf) {
  for (int k = 1; k < nf; k++) {
    if (strcmp(d[k].job_id, d[0].job_id) != 0)
      gc_fail(it, 1, "'%s' is of job '%s', '%s' of job '%s'", f[k].path, d[k].job_id, f[0].path, d[0].job_id);
    same_int(it, "n_stages", &f[k], d[k].n_stages, &f[0], d[0].n_stages);
    same_int(it, "microbatches", &f[k], d[k].microbatches, &f[0], d[0].microbatches);
    same_int(it, "vocab", &f[k], d[k].vocab, &f[0], d[0].vocab);
    same_int(it, "hidden", &f[k], d[k].hidden, &f[0], d[0].hidden);
    same_int(it, "heads", &f[k], d[k].heads, &f[0], d[0].heads);
    same_int(it, "layers", &f[k], d[k].layers, &f[0], d[0].layers);
    same_int(it, "seq_len", &f[k], d[k].seq_len, &f[0], d[0].seq_len);
    same_int(it, "batch", &f[k], d[k].batch, &f[0], d[0].batch);
    if (d[k].seed != d[0].seed)
      gc_fail(it, 1, "'%s' has seed %llu, '%s' has %llu", f[k].path, (unsigned long long)d[k].seed, f[0].path,
              (unsigned long long)d[0].seed);
    if (strcmp(d[k].data, d[0].data) != 0)
      gc_fail(it, 1, "'%s' has data '%s', '%s' has '%s'", f[k].path, d[k].data, f[0].path, d[0].data);
  }
  for (int k = 0; k < nf; k++)
    if (f[k].named && (f[k].name_iteration != d[k].iteration || f[k].name_stage != d[k].stage))
      gc_fail(it, 1, "'%s' holds iteration %d stage %d, not what its name says", f[k].path, d[k].iteration,
              d[k].stage);
  int ns = d[0].n_stages;
  if (ns < 1 || ns > 1 << 20) {
    gc_fail(it, 1, "'%s' says the job has %d stages", f[0].path, ns);
    return;
  }
  if (d[0].microbatches < 1)
    gc_fail(it, 1, "'%s' says the iteration had %d microbatches", f[0].path, d[0].microbatches);
  /* files are sorted by stage: a duplicate is next to its twin */
  for (int k = 0; k < nf; k++) {
    if (d[k].stage < 0 || d[k].stage >= ns)
      gc_fail(it, 1, "'%s' is stage %d, outside 0..%d", f[k].path, d[k].stage, ns - 1);
    else if (k > 0 && d[k].stage == d[k - 1].stage)
      gc_fail(it, 1, "stage %d is dumped twice: '%s' and '%s'", d[k].stage, f[k - 1].path, f[k].path);
  }
  bool *present = zb_calloc((size_t)ns, sizeof *present);
  for (int k = 0; k < nf; k++)
    if (d[k].stage >= 0 && d[k].stage < ns)
      present[d[k].stage] = true;
  for (int s = 0; s < ns; s++)
    if (!present[s])
      gc_fail(it, 1, "stage %d of %d is missing (no it%d-stage%d.dump in '%s')", s, ns, it->iteration, s,
              it->o->dir);
  free(present);
  int skipped = 0;
  for (int k = 0; k < nf; k++) {
    bool has_loss = d[k].flags & ZB_DUMP_HAS_LOSS;
    if (has_loss && d[k].stage != ns - 1)
      gc_fail(it, 1, "'%s' (stage %d) carries the loss; only the last stage (%d) may", f[k].path, d[k].stage,
              ns - 1);
    if (!has_loss && d[k].stage == ns - 1)
      gc_fail(it, 1, "'%s' (the last stage, %d) carries no loss", f[k].path, d[k].stage);
    skipped += (d[k].flags & ZB_DUMP_SKIPPED) != 0;
  }
  /* the NaN/Inf check is global: every stage skips or none does */
  if (skipped && skipped != nf)
    gc_fail(it, 1, "%d of %d stages skipped the step", skipped, nf);
  it->skipped = skipped == nf;
}

static int model_index(const zb_model_stage *st, const char *name) {
  for (int t = 0; t < zb_model_n_tensors(st); t++)
    if (strcmp(zb_model_tensor_at(st, t)->name, name) == 0)
      return t;
  return -1;
}

/* Finds each tensor of the one-stage model in the dumps: src[t] the file,
 * off[t] the offset in its arrays. Every tensor must be on exactly one
 * stage with the model's shape, and every dumped tensor in the model. */
static void map_tensors(gc_iter *it, const zb_model_stage *st, const gc_file *f, const zb_dump *d, int nf,
                        int *src, size_t *off) {
  int nt = zb_model_n_tensors(st);
  for (int t = 0; t < nt; t++)
    src[t] = -1;
  for (int k = 0; k < nf; k++) {
    size_t o = 0;
    for (int j = 0; j < d[k].n_tensors; j++) {
      const zb_dump_tensor *dt = &d[k].tensors[j];
      int t = model_index(st, dt->name);
      const zb_model_tensor *mt = t >= 0 ? zb_model_tensor_at(st, t) : NULL;
      if (!mt)
        gc_fail(it, 1, "tensor '%s' on stage %d ('%s') is not in the model", dt->name, d[k].stage, f[k].path);
      else if (dt->rows != mt->rows || dt->cols != mt->cols)
        gc_fail(it, 1, "tensor '%s' on stage %d is %d x %d, the model's is %d x %d", dt->name, d[k].stage,
                dt->rows, dt->cols, mt->rows, mt->cols);
      else if (src[t] >= 0)
        gc_fail(it, 1, "tensor '%s' is on stage %d and again on stage %d", dt->name, d[src[t]].stage,
                d[k].stage);
      else {
        src[t] = k;
        off[t] = o;
      }
      o += (size_t)dt->rows * (size_t)dt->cols;
    }
  }
  for (int t = 0; t < nt; t++)
    if (src[t] < 0) {
      const zb_model_tensor *mt = zb_model_tensor_at(st, t);
      gc_fail(it, 1, "tensor '%s' (%d x %d) is on no stage", mt->name, mt->rows, mt->cols);
    }
}

/* Iteration 0's weights are the seeded initialisation, a function of
 * (seed, tensor name, index) alone, so every partition must have dumped
 * the one-stage model's bits. Reports the first tensor that differs. */
static void check_init(gc_iter *it, const zb_model_stage *st, const zb_dump *d, const int *src,
                       const size_t *off) {
  it->init = 1;
  for (int t = 0; t < zb_model_n_tensors(st) && it->init; t++) {
    const zb_model_tensor *mt = zb_model_tensor_at(st, t);
    const float *b = d[src[t]].before + off[t];
    for (size_t i = 0; i < mt->numel; i++)
      if (memcmp(&b[i], &mt->param[i], sizeof(float)) != 0) {
        gc_fail(it, 1,
                "initial weights: tensor '%s' (stage %d) differs from seed %llu's at element %zu: %.9g, "
                "expected %.9g",
                mt->name, d[src[t]].stage, (unsigned long long)d[0].seed, i, (double)b[i],
                (double)mt->param[i]);
        it->init = 0;
        break;
      }
  }
}

static size_t count_nonfinite(const float *a, size_t n) {
  size_t c = 0;
  for (size_t i = 0; i < n; i++)
    c += !isfinite(a[i]);
  return c;
}

/* The reference: the one-stage model with the dumped weights runs F and BW
 * on each microbatch from zeroed gradients; the per-microbatch gradients
 * are summed in double (as tests/unit/test_model.c's reference), so the
 * reference does not depend on an accumulation order. *loss_sum: the sum
 * of the microbatch losses in microbatch order, as the cpu backend adds
 * them. Returns 0 or 2 (an op failed). */
static int run_reference(gc_iter *it, zb_model_stage *st, const zb_dump *d0, const gc_text *text, double *sum,
                         double *loss_sum) {
  const zb_model_config *c = zb_model_stage_config(st);
  size_t ntok = (size_t)c->batch * (size_t)c->seq_len, n = zb_model_n_params(st);
  uint8_t *tokens = zb_malloc(ntok), *targets = zb_malloc(ntok);
  zb_cpu_text source = {.text = text->bytes, .len = text->len, .seed = d0->seed};
  const float *grads = zb_model_grads(st);
  *loss_sum = 0;
  int rc = 0;
  for (int mb = 0; mb < d0->microbatches && !rc; mb++) {
    zb_diag diag = {{0}};
    float loss = 0;
    zb_model_zero_grads(st);
    if (zb_backend_cpu_text_fill(&source, it->iteration, mb, c->batch, c->seq_len, tokens, targets, &diag) ||
        zb_model_forward(st, mb, tokens, NULL, targets, NULL, &loss, &diag) ||
        zb_model_backward_bw(st, mb, NULL, NULL, &diag)) {
      gc_fail(it, 2, "the reference, microbatch %d (data '%s'): %s", mb, text->path, diag.msg);
      rc = 2;
      break;
    }
    *loss_sum += (double)loss;
    for (size_t i = 0; i < n; i++)
      sum[i] += (double)grads[i];
  }
  free(tokens);
  free(targets);
  return rc;
}

/* Compares each tensor's dumped gradient with the reference sum; prints
 * the table unless --quiet or --json. */
static void compare(gc_iter *it, zb_model_stage *st, const zb_dump *d, const int *src, const size_t *off,
                    const double *sum) {
  const gc_opts *o = it->o;
  bool table = !o->quiet && !o->json;
  int nt = zb_model_n_tensors(st), width = 6;
  for (int t = 0; t < nt; t++) {
    int len = (int)strlen(zb_model_tensor_at(st, t)->name);
    width = len > width ? len : width;
  }
  if (table)
    printf("iteration %d of job %s:\n  %-*s %5s %10s %11s\n", it->iteration, it->job_id, width, "tensor",
           "stage", "elements", "rel. error");
  const float *base = zb_model_params(st);
  for (int t = 0; t < nt; t++) {
    const zb_model_tensor *mt = zb_model_tensor_at(st, t);
    const double *ref = sum + (mt->param - base);
    const float *g = d[src[t]].grads + off[t];
    double e2 = 0, r2 = 0;
    for (size_t i = 0; i < mt->numel; i++) {
      double diff = (double)g[i] - ref[i];
      e2 += diff * diff;
      r2 += ref[i] * ref[i];
    }
    bool abs = !(r2 > 0);
    double err = abs ? sqrt(e2) : sqrt(e2) / sqrt(r2);
    it->abs_used |= abs;
    bool bad = !(err <= o->tol);
    if (!it->worst[0] || (!isnan(it->max_rel) && !(err <= it->max_rel))) {
      it->max_rel = err;
      snprintf(it->worst, sizeof it->worst, "%s", mt->name);
    }
    if (table)
      printf("  %-*s %5d %10zu %11.2e%s%s\n", width, mt->name, d[src[t]].stage, mt->numel, err,
             abs ? " (absolute: g_ref = 0)" : "", bad ? "  FAIL" : "");
    if (bad) {
      size_t nonfinite = count_nonfinite(g, mt->numel);
      if (nonfinite)
        gc_fail(it, 1, "tensor '%s' (stage %d): %zu of %zu dumped gradient elements are not finite", mt->name,
                d[src[t]].stage, nonfinite, mt->numel);
      else
        gc_fail(it, 1, "tensor '%s' (stage %d, %zu elements): %s error %.3e > tolerance %g", mt->name,
                d[src[t]].stage, mt->numel, abs ? "absolute" : "relative", err, o->tol);
    }
  }
}

static void json_str(const char *s) {
  putchar('"');
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      printf("\\%c", ch);
    else if (ch < 0x20)
      printf("\\u%04x", ch);
    else
      putchar(ch);
  }
  putchar('"');
}

/* A number, or null where it is unknown or not finite (JSON has no NaN). */
static void json_num(const char *key, double v, bool have) {
  printf(",\"%s\":", key);
  if (have && isfinite(v))
    printf("%.9g", v);
  else
    fputs("null", stdout);
}

static void report(const gc_iter *it) {
  const gc_opts *o = it->o;
  bool ok = it->status == 0;
  if (o->json) {
    printf("{\"iteration\":%d,\"job_id\":", it->iteration);
    json_str(it->job_id);
    printf(",\"stages\":%d,\"microbatches\":%d", it->stages, it->microbatches);
    json_num("tensors", it->tensors, it->mapped);
    json_num("parameters", (double)it->params, it->mapped);
    json_num("max_rel_err", it->max_rel, it->compared);
    fputs(",\"worst_tensor\":", stdout);
    if (it->compared)
      json_str(it->worst);
    else
      fputs("null", stdout);
    json_num("loss", it->loss, it->compared);
    json_num("loss_ref", it->loss_ref, it->compared);
    json_num("loss_rel_err", it->loss_rel, it->compared);
    printf(",\"init_identical\":%s,\"skipped\":%s,\"ok\":%s,\"error\":",
           it->init < 0 ? "null"
           : it->init   ? "true"
                        : "false",
           it->skipped ? "true" : "false", ok ? "true" : "false");
    if (it->error[0])
      json_str(it->error);
    else
      fputs("null", stdout);
    fputs("}\n", stdout);
    return;
  }
  printf("iteration %d: ", it->iteration);
  if (!it->mapped) {
    printf("%s (%s)\n", it->status == 2 ? "NOT CHECKED" : "FAILED", it->error);
    return;
  }
  printf("%d stages, %d tensors, %zu parameters", it->stages, it->tensors, it->params);
  if (it->init >= 0)
    printf("; initial weights %s", it->init ? "identical" : "DIFFER");
  if (it->skipped && it->status == 0) {
    printf("; skipped (non-finite gradients, not compared)\n");
    return;
  }
  if (it->compared)
    printf("; max %s error %.1e (%s), loss %.6g vs %.6g (rel %.1e)",
           it->abs_used ? "relative (absolute where g_ref = 0)" : "relative", it->max_rel, it->worst,
           it->loss, it->loss_ref, it->loss_rel);
  printf(": %s (tolerance %g)\n", ok ? "OK" : it->status == 2 ? "NOT CHECKED" : "FAILED", o->tol);
}

/* Checks the nf files of one iteration (sorted by stage); returns 0, 1 or 2. */
static int check_iteration(const gc_opts *o, const gc_file *f, int nf, gc_text *text) {
  gc_iter it = {.o = o, .iteration = f[0].iteration, .init = -1};
  zb_dump *d = zb_calloc((size_t)nf, sizeof *d);
  zb_model_stage *st = NULL;
  int *src = NULL;
  size_t *off = NULL;
  double *sum = NULL;
  for (int k = 0; k < nf; k++) {
    zb_diag diag = {{0}};
    if (zb_dump_load(f[k].path, &d[k], &diag) != ZB_OK) {
      gc_fail(&it, 2, "%s", diag.msg);
      goto out;
    }
  }
  snprintf(it.job_id, sizeof it.job_id, "%s", d[0].job_id);
  it.stages = d[0].n_stages;
  it.microbatches = d[0].microbatches;
  check_files(&it, f, d, nf);
  if (it.status)
    goto out;

  zb_model_config cfg = {.vocab = d[0].vocab,
                         .hidden = d[0].hidden,
                         .heads = d[0].heads,
                         .layers = d[0].layers,
                         .seq_len = d[0].seq_len,
                         .batch = d[0].batch,
                         .seed = d[0].seed,
                         .loss_scale = 1.0f / (float)d[0].microbatches};
  zb_diag diag = {{0}};
  if (zb_model_stage_new(&cfg, 0, 1, &st, &diag) != ZB_OK) {
    gc_fail(&it, 1,
            "the dumps' model (vocab %d, hidden %d, heads %d, layers %d, seq_len %d, batch %d) cannot "
            "be built: %s",
            cfg.vocab, cfg.hidden, cfg.heads, cfg.layers, cfg.seq_len, cfg.batch, diag.msg);
    goto out;
  }
  int nt = zb_model_n_tensors(st);
  src = zb_calloc((size_t)(nt ? nt : 1), sizeof *src);
  off = zb_calloc((size_t)(nt ? nt : 1), sizeof *off);
  map_tensors(&it, st, f, d, nf, src, off);
  if (it.status)
    goto out;
  it.mapped = true;
  it.tensors = nt;
  it.params = zb_model_n_params(st);

  /* before the dumped weights overwrite the seeded ones */
  if (it.iteration == 0)
    check_init(&it, st, d, src, off);
  bool finite = true;
  for (int t = 0; t < nt; t++) {
    const zb_model_tensor *mt = zb_model_tensor_at(st, t);
    const float *b = d[src[t]].before + off[t];
    if (count_nonfinite(b, mt->numel)) {
      gc_fail(&it, 1, "tensor '%s' (stage %d): the weights before the step are not finite", mt->name,
              d[src[t]].stage);
      finite = false;
    }
    memcpy(mt->param, b, sizeof(float) * mt->numel);
  }
  /* other initial weights still give gradients to compare; weights that
   * are not finite do not */
  if (it.skipped || !finite)
    goto out;

  if (zb_model_stage_config(st)->vocab != 256) {
    gc_fail(&it, 1, "vocab %d: the text data gives byte tokens (vocab 256)",
            zb_model_stage_config(st)->vocab);
    goto out;
  }
  const char *data = o->data ? o->data : d[0].data;
  if (!data[0]) {
    gc_fail(&it, 2, "the dumps name no data file (pass --data)");
    goto out;
  }
  if (text_load(text, data, &diag) != ZB_OK) {
    gc_fail(&it, 2, "%s", diag.msg);
    goto out;
  }
  sum = zb_calloc(it.params ? it.params : 1, sizeof *sum);
  double loss_sum;
  if (run_reference(&it, st, &d[0], text, sum, &loss_sum))
    goto out;
  it.compared = true;
  compare(&it, st, d, src, off, sum);

  /* the loss: the last stage's file (sorted by stage: the last one) */
  const gc_file *lf = &f[nf - 1];
  it.loss = d[nf - 1].loss;
  it.loss_ref = loss_sum / d[0].microbatches;
  double diff = fabs(it.loss - it.loss_ref);
  it.loss_rel = it.loss_ref != 0 ? diff / fabs(it.loss_ref) : diff;
  if (!(it.loss_rel <= o->tol))
    gc_fail(&it, 1, "loss %.9g in '%s' differs from the reference %.9g: relative error %.3e > tolerance %g",
            it.loss, lf->path, it.loss_ref, it.loss_rel, o->tol);
out:
  report(&it);
  free(sum);
  free(src);
  free(off);
  zb_model_stage_free(st);
  for (int k = 0; k < nf; k++)
    zb_dump_free(&d[k]);
  free(d);
  return it.status;
}

/* ---- main --------------------------------------------------------------- */

int main(int argc, char **argv) {
  gc_opts o = {.tol = 1e-5, .iteration = -1};
  static const struct option opts[] = {{"tolerance", required_argument, NULL, 't'},
                                       {"iteration", required_argument, NULL, 'i'},
                                       {"data", required_argument, NULL, 'd'},
                                       {"json", no_argument, NULL, 'j'},
                                       {"quiet", no_argument, NULL, 'q'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  int c;
  while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
    switch (c) {
    case 't': {
      char *end;
      errno = 0;
      double v = strtod(optarg, &end);
      if (end == optarg || *end || errno || !isfinite(v) || v < 0) {
        fprintf(stderr, PREFIX "--tolerance takes a number >= 0, not '%s'\n", optarg);
        return 2;
      }
      o.tol = v;
      break;
    }
    case 'i': {
      char *end;
      errno = 0;
      long v = strtol(optarg, &end, 10);
      if (end == optarg || *end || errno || v < 0 || v > INT_MAX) {
        fprintf(stderr, PREFIX "--iteration takes an iteration number >= 0, not '%s'\n", optarg);
        return 2;
      }
      o.iteration = (int)v;
      break;
    }
    case 'd': o.data = optarg; break;
    case 'j': o.json = true; break;
    case 'q': o.quiet = true; break;
    case 'h': fputs(usage_text, stdout); return 0;
    default: fputs(usage_text, stderr); return 2;
    }
  }
  if (argc - optind != 1) {
    fprintf(stderr, PREFIX "%s\n%s", optind < argc ? "one JOB_DUMP_DIR, please" : "no JOB_DUMP_DIR given",
            usage_text);
    return 2;
  }
  o.dir = argv[optind];

  gc_file *files;
  int n;
  int rc = scan_dir(&o, &files, &n);
  if (rc)
    return rc;
  gc_text text = {0};
  for (int i = 0; i < n;) {
    int j = i;
    while (j < n && files[j].iteration == files[i].iteration)
      j++;
    int r = check_iteration(&o, files + i, j - i, &text);
    rc = r > rc ? r : rc;
    i = j;
  }
  for (int i = 0; i < n; i++)
    free(files[i].path);
  free(files);
  free(text.path);
  free(text.bytes);
  return rc;
}
