/* model_loss.c — the last stage's per-microbatch losses, kept on the
 * device until the iteration's report (docs/model.md, Host syncs).
 *
 * An F that returns its loss at once must copy the per-row losses back and
 * wait for the device: one host sync per microbatch, so a GPU stalls m
 * times per iteration. An F called without a loss pointer instead writes
 * its rows into mb's slot of one device array, and zb_model_losses reads
 * every slot with one copy and one sync. The mean of a slot is summed in
 * row order in double, exactly as the immediate path does, so both give
 * the same float. */
#include <string.h>

#include "model_internal.h"
#include "zb_alloc.h"

/* Device rows of microbatch mb's losses, growing the array (a stream-
 * ordered copy of the earlier slots, then a stream-ordered free) when mb
 * is past its end; the array counts as workspace. NULL with st->err set
 * when the device cannot allocate. */
double *model_loss_slot(zb_model_stage *st, int mb) {
  size_t n = (size_t)st->n_tok;
  if (mb >= st->loss_cap) {
    int cap = st->loss_cap ? st->loss_cap : 4;
    while (cap <= mb)
      cap *= 2;
    void *p = NULL;
    MODEL_DEV(st, alloc, (size_t)cap * n * sizeof(double), &p);
    if (st->err != ZB_OK)
      return NULL;
    if (st->loss_rows)
      model_copy(st, p, st->loss_rows, (size_t)st->loss_cap * n * sizeof(double), ZB_COPY_D2D);
    if (st->loss_rows)
      st->dev->ops->free(st->dev->self, st->loss_rows);
    st->workspace_bytes += (int64_t)((size_t)(cap - st->loss_cap) * n * sizeof(double));
    st->loss_rows = p;
    st->loss_cap = cap;
  }
  return st->loss_rows + (size_t)mb * n;
}

zb_err zb_model_losses(zb_model_stage *st, int n_mb, float *out, zb_diag *diag) {
  if (!st->is_last || n_mb < 0 || (n_mb > 0 && !out))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: losses are the last stage's, for n_mb >= 0",
                       st->stage);
  if (n_mb > st->loss_cap)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: losses of %d microbatches asked, %d kept",
                       st->stage, n_mb, st->loss_cap);
  size_t n = (size_t)st->n_tok, rows = (size_t)n_mb * n;
  if (rows == 0)
    return ZB_OK;
  double *h = zb_malloc(rows * sizeof *h);
  model_begin(st);
  model_copy(st, h, st->loss_rows, rows * sizeof *h, ZB_COPY_D2H);
  if (st->err == ZB_OK)
    st->err = st->dev->ops->sync(st->dev->self, &st->ediag);
  for (int mb = 0; mb < n_mb && st->err == ZB_OK; mb++) {
    double sum = 0.0;
    for (size_t r = 0; r < n; r++)
      sum += h[(size_t)mb * n + r];
    out[mb] = (float)(sum / (double)n);
  }
  free(h);
  return model_end(st, diag);
}
