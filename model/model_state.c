/* model_state.c — per-microbatch state of a model stage: what F keeps for
 * B and W, the cache its buffers go back to, and the byte accounting the
 * memory stats report (zb_model.h; the state is described in
 * model_internal.h). State buffers are memory of the stage's device; the
 * accounting counts the bytes asked for, whatever the device is. */
#include <stdlib.h>
#include <string.h>

#include "model_internal.h"
#include "zb_alloc.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#else
#define ASAN_POISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#define ASAN_UNPOISON_MEMORY_REGION(p, n) ((void)(p), (void)(n))
#endif

static void account(zb_model_stage *st, mb_state *s, int64_t delta) {
  s->bytes += delta;
  st->state_bytes += delta;
  if (st->state_bytes > st->peak_bytes)
    st->peak_bytes = st->state_bytes;
}

/* Freed state buffers stay in the stage's cache and serve the next
 * request of the same size (the ops repeat a handful of sizes), so a
 * steady pipeline neither returns pages to the kernel nor faults them in
 * again on every F. Under ASan cached buffers are poisoned, so a use after
 * drop is still caught. */
static void *cache_get(zb_model_stage *st, size_t bytes) {
  for (int i = st->cache_n - 1; i >= 0; i--)
    if (st->cache[i].bytes == bytes) {
      void *p = st->cache[i].p;
      st->cache[i] = st->cache[--st->cache_n];
      st->cache_bytes -= (int64_t)bytes;
      if (st->host)
        ASAN_UNPOISON_MEMORY_REGION(p, bytes);
      return p;
    }
  void *p = NULL;
  if (st->err == ZB_OK)
    st->err = st->dev->ops->alloc(st->dev->self, bytes, &p, &st->ediag);
  return st->err == ZB_OK ? p : NULL;
}

static void cache_put(zb_model_stage *st, void *p, size_t bytes) {
  /* Held + cached never exceeds the peak of held: the cache costs no memory
   * a schedule's peak does not already need. Another device caches in its
   * own allocator, whose figures are then the states' bytes exactly. */
  if (!st->host || st->state_bytes + st->cache_bytes + (int64_t)bytes > st->peak_bytes) {
    st->dev->ops->free(st->dev->self, p);
    return;
  }
  if (st->cache_n == st->cache_cap) {
    st->cache_cap = st->cache_cap ? 2 * st->cache_cap : 32;
    st->cache = zb_realloc(st->cache, (size_t)st->cache_cap * sizeof *st->cache);
  }
  if (st->host)
    ASAN_POISON_MEMORY_REGION(p, bytes);
  st->cache[st->cache_n++] = (cached_buf){p, bytes};
  st->cache_bytes += (int64_t)bytes;
}

/* NULL (and st->err set) when the device cannot allocate; then nothing is
 * counted and the ops that would use it are skipped. */
void *model_take(zb_model_stage *st, mb_state *s, size_t bytes) {
  void *p = cache_get(st, bytes);
  if (p)
    account(st, s, (int64_t)bytes);
  return p;
}
float *model_takef(zb_model_stage *st, mb_state *s, size_t numel) {
  return model_take(st, s, numel * sizeof(float));
}

/* Give a state buffer back: to the cache, and out of the accounting. */
void model_drop(zb_model_stage *st, mb_state *s, void **p, size_t bytes) {
  if (*p) {
    account(st, s, -(int64_t)bytes);
    cache_put(st, *p, bytes);
    *p = NULL;
  }
}
void model_dropf(zb_model_stage *st, mb_state *s, float **p, size_t numel) {
  void *v = *p;
  model_drop(st, s, &v, numel * sizeof(float));
  *p = NULL;
}
static void drop_ids(zb_model_stage *st, mb_state *s, int32_t **p, size_t n) {
  size_t bytes = n * sizeof(int32_t);
  if (*p) {
    account(st, s, -(int64_t)bytes);
    cache_put(st, *p, bytes);
    *p = NULL;
  }
}

mb_state *model_mb_get(const zb_model_stage *st, int mb) {
  return mb >= 0 && mb < st->mb_cap ? st->mbs[mb] : NULL;
}

/* Gives back every buffer of block blk's state, fp32 and bf16. */
void model_block_drop(zb_model_stage *st, mb_state *s, int blk) {
  size_t n = (size_t)st->n_tok, h = (size_t)st->cfg.hidden;
  size_t att = model_attn_state_numel(st);
  size_t qkv = n * (size_t)st->qkv_cols, lo = n * (size_t)st->arch.heads * (size_t)st->arch.head_dim;
  size_t mlp = n * (size_t)st->arch.intermediate;
  block_state *b = &s->blocks[blk];
  model_dropf(st, s, &b->xhat1, n * h);
  model_dropf(st, s, &b->rstd1, n);
  model_dropf(st, s, &b->qkv, qkv);
  model_dropf(st, s, &b->att, att);
  model_dropf(st, s, &b->o, lo);
  model_dropf(st, s, &b->xhat2, n * h);
  model_dropf(st, s, &b->rstd2, n);
  model_dropf(st, s, &b->u, mlp);
  model_dropf(st, s, &b->up, mlp);
  model_dropf(st, s, &b->gel, mlp);
  model_dropf(st, s, &b->da1, n * h);
  model_dropf(st, s, &b->dqkv, qkv);
  model_dropf(st, s, &b->dproj, n * h);
  model_dropf(st, s, &b->da2, n * h);
  model_dropf(st, s, &b->dfc2, n * h);
  if (s->packed)
    model_bf16_drop_block(st, s, blk);
}

void model_mb_destroy(zb_model_stage *st, int mb) {
  mb_state *s = model_mb_get(st, mb);
  if (!s)
    return;
  const zb_model_config *c = &st->cfg;
  size_t n = (size_t)st->n_tok, h = (size_t)c->hidden;
  for (int i = 0; i < st->n_layers; i++)
    model_block_drop(st, s, i);
  drop_ids(st, s, &s->tokens, n);
  drop_ids(st, s, &s->targets, n);
  model_dropf(st, s, &s->dh0, n * h);
  model_dropf(st, s, &s->xhatf, n * h);
  model_dropf(st, s, &s->rstdf, n);
  model_dropf(st, s, &s->probs, n * (size_t)c->vocab);
  model_dropf(st, s, &s->daf, n * h);
  free(s->blocks);
  free(s->packed);
  free(s);
  st->mbs[mb] = NULL;
}

/* The limit keeps a bad microbatch id from growing the table without bound. */
#define MODEL_MAX_MB (1 << 24)

zb_err model_mb_create(zb_model_stage *st, int mb, mb_state **out, zb_diag *diag) {
  if (mb < 0 || mb >= MODEL_MAX_MB)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "microbatch %d out of range", mb);
  if (model_mb_get(st, mb))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "stage %d: F of microbatch %d: it already has state",
                       st->stage, mb);
  if (mb >= st->mb_cap) {
    int cap = st->mb_cap ? st->mb_cap : 8;
    while (cap <= mb)
      cap *= 2;
    st->mbs = zb_realloc(st->mbs, (size_t)cap * sizeof *st->mbs);
    memset(st->mbs + st->mb_cap, 0, (size_t)(cap - st->mb_cap) * sizeof *st->mbs);
    st->mb_cap = cap;
  }
  mb_state *s = zb_calloc(1, sizeof *s);
  s->blocks = zb_calloc(st->n_layers ? (size_t)st->n_layers : 1, sizeof *s->blocks);
  if (st->cfg.bf16)
    s->packed = zb_calloc((st->n_layers ? (size_t)st->n_layers : 1) * BF16_FIELDS, sizeof *s->packed);
  st->mbs[mb] = s;
  *out = s;
  return ZB_OK;
}

void zb_model_drop_states(zb_model_stage *st) {
  for (int mb = 0; mb < st->mb_cap; mb++)
    model_mb_destroy(st, mb);
}

/* ---- memory ----------------------------------------------------------- */

void zb_model_mem_stats(const zb_model_stage *st, zb_model_mem *out) {
  out->state_bytes = st->state_bytes;
  out->peak_state_bytes = st->peak_bytes;
  out->workspace_bytes = st->workspace_bytes;
  out->param_bytes = (int64_t)(2 * st->n_params * sizeof(float));
  if (st->cfg.bf16) /* the compute copy */
    out->param_bytes += (int64_t)(st->n_params * sizeof(uint16_t));
  out->cached_bytes = st->cache_bytes;
}

int64_t zb_model_mb_bytes(const zb_model_stage *st, int mb) {
  const mb_state *s = model_mb_get(st, mb);
  return s ? s->bytes : 0;
}

void zb_model_reset_peak(zb_model_stage *st) {
  st->peak_bytes = st->state_bytes;
}

void zb_model_release_cache(zb_model_stage *st) {
  for (int i = 0; i < st->cache_n; i++) {
    if (st->host)
      ASAN_UNPOISON_MEMORY_REGION(st->cache[i].p, st->cache[i].bytes);
    st->dev->ops->free(st->dev->self, st->cache[i].p);
  }
  st->cache_n = 0;
  st->cache_bytes = 0;
}
