/* gradcheck_check.c — one iteration of zb-gradcheck (gradcheck.h): the
 * dumps must agree and cover every stage and tensor once; iteration 0's
 * weights must be the seeded ones; then the one-stage reference recomputes
 * the iteration from the dumped weights and its gradients and loss are
 * compared with the dumped ones. */
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gradcheck.h"
#include "zb_alloc.h"
#include "zb_backend_cpu.h"
#include "zb_dump.h"
#include "zb_file.h"
#include "zb_model.h"

void gc_fail(gc_iter *it, int status, const char *fmt, ...) {
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
  for (int k = 0; k < nf; k++)
    if (d[k].flags & ZB_DUMP_ARCH)
      gc_fail(it, 1,
              "'%s' holds a model with an architecture (gpt2 or llama): zb-gradcheck rebuilds only the "
              "builtin model; check such dumps against the transformers fixtures (docs/model.md)",
              f[k].path);
  for (int k = 1; k < nf; k++) {
    if (strcmp(d[k].job_id, d[0].job_id) != 0)
      gc_fail(it, 1, "'%s' is of job '%s', '%s' of job '%s'", f[k].path, d[k].job_id, f[0].path, d[0].job_id);
    same_int(it, "n_stages", &f[k], d[k].n_stages, &f[0], d[0].n_stages);
    same_int(it, "microbatches", &f[k], d[k].microbatches, &f[0], d[0].microbatches);
    same_int(it, "data_parallel", &f[k], d[k].data_parallel, &f[0], d[0].data_parallel);
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
    if (f[k].named && (f[k].name_iteration != d[k].iteration || f[k].name_stage != d[k].stage ||
                       f[k].name_replica != d[k].replica))
      gc_fail(it, 1, "'%s' holds iteration %d stage %d of replica %d, not what its name says", f[k].path,
              d[k].iteration, d[k].stage, d[k].replica);
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

/* The microbatches of the global batch the reference runs: d x m. */
static int gc_global_mbs(const zb_dump *d0) {
  return (d0->data_parallel > 1 ? d0->data_parallel : 1) * d0->microbatches;
}

/* The text's window bytes (tokens, then targets) widened to the model's
 * int32 ids, as the cpu backend hands them over. */
static void widen_ids(const uint8_t *bytes, int32_t *ids, size_t n) {
  for (size_t i = 0; i < n; i++)
    ids[i] = bytes[i];
}

/* The reference: the one-stage model with the dumped weights runs F and BW
 * on each microbatch from zeroed gradients; the per-microbatch gradients
 * are summed in double (as tests/unit/test_model.c's reference), so the
 * reference does not depend on an accumulation order. mb_loss: each
 * microbatch's loss (d x m of them). Returns 0 or 2 (an op failed). */
static int run_reference(gc_iter *it, zb_model_stage *st, const zb_dump *d0, const gc_text *text, double *sum,
                         double *mb_loss) {
  const zb_model_config *c = zb_model_stage_config(st);
  size_t ntok = (size_t)c->batch * (size_t)c->seq_len, n = zb_model_n_params(st);
  uint8_t *bytes = zb_malloc(2 * ntok);
  int32_t *ids = zb_malloc(2 * ntok * sizeof *ids);
  zb_cpu_text source = {.text = text->bytes, .len = text->len, .seed = d0->seed};
  const float *grads = zb_model_grads(st);
  int rc = 0;
  /* the global batch: d replicas x m microbatches, replica k's mb j being
   * the batch's k*m + j (docs/model.md, Data parallelism) */
  for (int mb = 0; mb < gc_global_mbs(d0) && !rc; mb++) {
    zb_diag diag = {{0}};
    float loss = 0;
    zb_model_zero_grads(st);
    zb_err err = zb_backend_cpu_text_fill(&source, it->iteration, mb, c->batch, c->seq_len, bytes,
                                          bytes + ntok, &diag);
    if (!err)
      widen_ids(bytes, ids, 2 * ntok);
    if (err || zb_model_forward(st, mb, ids, NULL, ids + ntok, NULL, &loss, &diag) ||
        zb_model_backward_bw(st, mb, NULL, NULL, &diag)) {
      gc_fail(it, 2, "the reference, microbatch %d (data '%s'): %s", mb, text->path, diag.msg);
      rc = 2;
      break;
    }
    mb_loss[mb] = (double)loss;
    for (size_t i = 0; i < n; i++)
      sum[i] += (double)grads[i];
  }
  free(bytes);
  free(ids);
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

/* Loads the nf dumps of one iteration into d and checks that replica
 * 0's (the first *nf0, sorted by stage) agree (check_files); returns the
 * iteration's status so far. */
static int load_iteration(gc_iter *it, const gc_file *f, zb_dump *d, int nf, int *nf0) {
  for (int k = 0; k < nf; k++) {
    zb_diag diag = {{0}};
    if (zb_dump_load(NULL, f[k].path, &d[k], &diag) != ZB_OK) {
      gc_fail(it, 2, "%s", diag.msg);
      return it->status;
    }
  }
  for (*nf0 = 0; *nf0 < nf && d[*nf0].replica == 0;)
    (*nf0)++;
  if (*nf0 == 0) {
    gc_fail(it, 1, "no dumps of replica 0 (it%d-stage<S>.dump in '%s')", it->iteration, it->o->dir);
    return it->status;
  }
  snprintf(it->job_id, sizeof it->job_id, "%s", d[0].job_id);
  it->stages = d[0].n_stages;
  it->microbatches = d[0].microbatches;
  it->data_parallel = d[0].data_parallel;
  check_files(it, f, d, *nf0);
  if (d[0].data_parallel < 1 || d[0].data_parallel > 1 << 16)
    gc_fail(it, 1, "'%s' says the job has %d replicas", f[0].path, d[0].data_parallel);
  return it->status;
}

/* The whole model the dumps describe as one stage (loss_scale 1/(d x m):
 * the mean over the global batch, what the replicas' reduction gives), or
 * NULL when it cannot be built. */
static zb_model_stage *reference_model(gc_iter *it, const zb_dump *d0) {
  zb_model_config cfg = {.vocab = d0->vocab,
                         .hidden = d0->hidden,
                         .heads = d0->heads,
                         .layers = d0->layers,
                         .seq_len = d0->seq_len,
                         .batch = d0->batch,
                         .seed = d0->seed,
                         .loss_scale = 1.0f / (float)gc_global_mbs(d0)};
  zb_diag diag = {{0}};
  zb_model_stage *st = NULL;
  if (zb_model_stage_new(&cfg, 0, 1, &st, &diag) != ZB_OK) {
    gc_fail(it, 1,
            "the dumps' model (vocab %d, hidden %d, heads %d, layers %d, seq_len %d, batch %d) cannot "
            "be built: %s",
            cfg.vocab, cfg.hidden, cfg.heads, cfg.layers, cfg.seq_len, cfg.batch, diag.msg);
    return NULL;
  }
  return st;
}

/* Overwrites the model's weights with the dumped weights from before the
 * step; false when some are not finite. */
static bool set_dumped_weights(gc_iter *it, zb_model_stage *st, const zb_dump *d, const int *src,
                               const size_t *off) {
  bool finite = true;
  for (int t = 0; t < zb_model_n_tensors(st); t++) {
    const zb_model_tensor *mt = zb_model_tensor_at(st, t);
    const float *b = d[src[t]].before + off[t];
    if (count_nonfinite(b, mt->numel)) {
      gc_fail(it, 1, "tensor '%s' (stage %d): the weights before the step are not finite", mt->name,
              d[src[t]].stage);
      finite = false;
    }
    memcpy(mt->param, b, sizeof(float) * mt->numel);
  }
  return finite;
}

/* The loss: the last stage's file (sorted by stage: the last one) against
 * the reference's mean over replica 0's microbatches (0 .. m-1: a
 * replica's dumped loss is its own mean). */
static void check_loss(gc_iter *it, const gc_file *f, const zb_dump *d, int nf, const double *mb_loss) {
  const gc_file *lf = &f[nf - 1];
  double loss_sum = 0;
  for (int mb = 0; mb < d[0].microbatches; mb++)
    loss_sum += mb_loss[mb];
  it->loss = d[nf - 1].loss;
  it->loss_ref = loss_sum / d[0].microbatches;
  double diff = fabs(it->loss - it->loss_ref);
  it->loss_rel = it->loss_ref != 0 ? diff / fabs(it->loss_ref) : diff;
  if (!(it->loss_rel <= it->o->tol))
    gc_fail(it, 1, "loss %.9g in '%s' differs from the reference %.9g: relative error %.3e > tolerance %g",
            it->loss, lf->path, it->loss_ref, it->loss_rel, it->o->tol);
}

/* Runs the reference on the iteration's text and compares the gradients
 * and the loss. */
static void compare_with_reference(gc_iter *it, zb_model_stage *st, const gc_file *f, const zb_dump *d,
                                   int nf, const int *src, const size_t *off, gc_text *text,
                                   double *mb_loss) {
  if (zb_model_stage_config(st)->vocab != 256) {
    gc_fail(it, 1, "vocab %d: the text data gives byte tokens (vocab 256)", zb_model_stage_config(st)->vocab);
    return;
  }
  const char *data = it->o->data ? it->o->data : d[0].data;
  if (!data[0]) {
    gc_fail(it, 2, "the dumps name no data file (pass --data)");
    return;
  }
  zb_diag diag = {{0}};
  if (text_load(text, data, &diag) != ZB_OK) {
    gc_fail(it, 2, "%s", diag.msg);
    return;
  }
  double *sum = zb_calloc(it->params ? it->params : 1, sizeof *sum);
  if (!run_reference(it, st, &d[0], text, sum, mb_loss)) {
    it->compared = true;
    compare(it, st, d, src, off, sum);
    check_loss(it, f, d, nf, mb_loss);
  }
  free(sum);
}

int gc_check_iteration(const gc_opts *o, const gc_file *f, int nf, gc_text *text) {
  gc_iter it = {.o = o, .iteration = f[0].iteration, .init = -1, .replicas_identical = -1};
  zb_dump *d = zb_calloc((size_t)nf, sizeof *d);
  zb_model_stage *st = NULL;
  int *src = NULL, nf0 = 0;
  size_t *off = NULL;
  double *mb_loss = NULL;
  if (load_iteration(&it, f, d, nf, &nf0) || !(st = reference_model(&it, &d[0])))
    goto out;
  int nt = zb_model_n_tensors(st);
  src = zb_calloc((size_t)(nt ? nt : 1), sizeof *src);
  off = zb_calloc((size_t)(nt ? nt : 1), sizeof *off);
  map_tensors(&it, st, f, d, nf0, src, off);
  if (it.status)
    goto out;
  it.mapped = true;
  it.tensors = nt;
  it.params = zb_model_n_params(st);

  /* before the dumped weights overwrite the seeded ones */
  if (it.iteration == 0)
    check_init(&it, st, d, src, off);
  /* other initial weights still give gradients to compare; weights that
   * are not finite do not */
  mb_loss = zb_calloc((size_t)gc_global_mbs(&d[0]), sizeof *mb_loss);
  if (set_dumped_weights(&it, st, d, src, off) && !it.skipped)
    compare_with_reference(&it, st, f, d, nf0, src, off, text, mb_loss);
  if (it.data_parallel > 1 || nf > nf0)
    gc_check_replicas(&it, f, d, nf0, f + nf0, d + nf0, nf - nf0, it.compared ? mb_loss : NULL);
out:
  gc_report(&it);
  free(src);
  free(off);
  free(mb_loss);
  zb_model_stage_free(st);
  for (int k = 0; k < nf; k++)
    zb_dump_free(&d[k]);
  free(d);
  return it.status;
}
