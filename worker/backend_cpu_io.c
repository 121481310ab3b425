/* backend_cpu_io.c — the model backends' data source, the slots that
 * activations and gradients travel in (on the device, staged through host
 * memory for a host transport), and op timing with device events
 * (backend_cpu_internal.h; docs/model.md, Backends). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend_cpu_internal.h"
#include "zb_alloc.h"

/* ---- op timing: device events, read after sync ---------------------------- */

/* CPU time the calling thread has used, in ns. */
static int64_t thread_cpu_ns(void) {
  struct timespec ts;
  if (clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts) != 0)
    return 0;
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Records the start of an op of kind F, B or W; *t is its index for
 * cpu_time_end. The pool of events grows on demand and is kept. The op
 * counts only once cpu_time_end recorded its end: an op that failed in
 * between leaves no pair whose end was never recorded (on a GPU
 * cudaEventElapsedTime refuses such a pair, which would poison the
 * device) or was recorded for an earlier op (a negative time). */
zb_err cpu_time_start(cpu_backend *b, zb_op kind, int *t, zb_diag *diag) {
  zb_device *d = b->dev;
  if (b->n_timed == b->cap_timed) {
    int cap = b->cap_timed ? 2 * b->cap_timed : 16;
    b->timed = zb_realloc(b->timed, sizeof *b->timed * (size_t)cap);
    memset(b->timed + b->cap_timed, 0, sizeof *b->timed * (size_t)(cap - b->cap_timed));
    b->cap_timed = cap;
  }
  cpu_timed *e = &b->timed[b->n_timed];
  zb_err err = ZB_OK;
  if (!e->start && (err = d->ops->event_new(d->self, &e->start, diag)))
    return err;
  if (!e->end && (err = d->ops->event_new(d->self, &e->end, diag)))
    return err;
  if ((err = d->ops->event_record(d->self, e->start, diag)))
    return err;
  e->kind = kind;
  e->cpu_start = b->cuda ? 0 : thread_cpu_ns();
  *t = b->n_timed;
  return ZB_OK;
}

zb_err cpu_time_end(cpu_backend *b, int t, zb_diag *diag) {
  zb_err err = b->dev->ops->event_record(b->dev->self, b->timed[t].end, diag);
  if (!err) {
    b->timed[t].cpu = b->cuda ? 0 : thread_cpu_ns() - b->timed[t].cpu_start;
    b->n_timed = t + 1;
  }
  return err;
}

/* Adds the timed ops' durations to the busy times (the caller synced). On
 * the host an op's wall time less its thread's CPU time is time it was
 * runnable without a core (docs/model.md, Backends): cpu_wait. With more
 * than one CBLAS thread the helpers' CPU time is not the caller's, and
 * cpu_wait overstates; the worker runs one. */
void cpu_time_collect(cpu_backend *b) {
  for (int i = 0; i < b->n_timed; i++) {
    cpu_timed *e = &b->timed[i];
    float ms = 0;
    zb_diag d = {{0}};
    if (b->dev->ops->event_elapsed_ms(b->dev->self, e->start, e->end, &ms, &d))
      continue; /* not reached: the sync before take_stats failed, and reported it */
    double s = (double)ms * 1e-3;
    if (!b->cuda && s > (double)e->cpu * 1e-9)
      b->acc.cpu_wait += s - (double)e->cpu * 1e-9;
    if (e->kind == ZB_OP_F)
      b->acc.busy_f += s;
    else if (e->kind == ZB_OP_B)
      b->acc.busy_b += s;
    else
      b->acc.busy_w += s;
  }
  b->n_timed = 0;
}

void cpu_time_free(cpu_backend *b) {
  for (int i = 0; i < b->cap_timed; i++) {
    if (b->timed[i].start)
      b->dev->ops->event_free(b->dev->self, b->timed[i].start);
    if (b->timed[i].end)
      b->dev->ops->event_free(b->dev->self, b->timed[i].end);
  }
  free(b->timed);
}

/* ---- the data ----------------------------------------------------------- */

static uint64_t cpu_mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

zb_err zb_backend_cpu_text_fill(void *ud, int64_t iteration, int mb, int batch, int seq_len, uint8_t *tokens,
                                uint8_t *targets, zb_diag *diag) {
  const zb_cpu_text *t = ud;
  if (!t || !t->text || seq_len < 1 || batch < 1 || t->len < (size_t)seq_len + 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "text data: %zu bytes of text cannot give windows of %d+1 bytes",
                       t && t->text ? t->len : 0, seq_len);
  /* Offsets 0 .. len-seq_len-1 leave room for the target of the window's
   * last byte. */
  uint64_t windows = (uint64_t)(t->len - (size_t)seq_len);
  for (int j = 0; j < batch; j++) {
    uint64_t key =
        cpu_mix(cpu_mix(cpu_mix(t->seed) ^ (uint64_t)iteration) ^ (uint64_t)(uint32_t)(t->first_mb + mb));
    size_t off = (size_t)(cpu_mix(key ^ (uint64_t)j) % windows);
    memcpy(tokens + (size_t)j * (size_t)seq_len, t->text + off, (size_t)seq_len);
    memcpy(targets + (size_t)j * (size_t)seq_len, t->text + off + 1, (size_t)seq_len);
  }
  return ZB_OK;
}

/* Fills b->tokens and b->targets for mb of the current iteration, and
 * widens them to the model's int32 ids. */
zb_err cpu_fill(cpu_backend *b, int stage, int mb, zb_diag *diag) {
  zb_err err;
  size_t nt = (size_t)b->model.batch * (size_t)b->model.seq_len;
  if (b->data.fill_ids) {
    err = b->data.fill_ids(b->data.ud, b->iteration, mb, b->model.batch, b->model.seq_len, b->tok_ids,
                           b->tgt_ids, diag);
    nt = 0; /* ids already */
  } else {
    err = b->data.fill(b->data.ud, b->iteration, mb, b->model.batch, b->model.seq_len, b->tokens, b->targets,
                       diag);
  }
  for (size_t i = 0; !err && i < nt; i++) {
    b->tok_ids[i] = b->tokens[i];
    b->tgt_ids[i] = b->targets[i];
  }
  if (err && diag) {
    char inner[sizeof diag->msg];
    memcpy(inner, diag->msg, sizeof inner);
    zb_diag_set(diag, err, "cpu backend: data for stage %d mb %d of iteration %lld: %s", stage, mb,
                (long long)b->iteration, inner);
  }
  return err;
}

/* ---- slots -------------------------------------------------------------- */

/* Grows every slot array of cs (and the loss arrays) to hold mb. */
void cpu_grow(cpu_backend *b, cpu_stage *cs, int mb) {
  if (mb >= cs->cap) {
    int cap = cs->cap ? cs->cap : 8;
    while (cap <= mb)
      cap *= 2;
    for (int k = 0; k < SLOT_KINDS; k++) {
      cs->slots[k] = zb_realloc(cs->slots[k], sizeof(cpu_slot) * (size_t)cap);
      memset(cs->slots[k] + cs->cap, 0, sizeof(cpu_slot) * (size_t)(cap - cs->cap));
    }
    cs->cap = cap;
  }
  if (mb >= b->loss_cap) {
    int cap = b->loss_cap ? b->loss_cap : 8;
    while (cap <= mb)
      cap *= 2;
    b->losses = zb_realloc(b->losses, sizeof(float) * (size_t)cap);
    b->loss_epoch = zb_realloc(b->loss_epoch, sizeof(uint64_t) * (size_t)cap);
    memset(b->loss_epoch + b->loss_cap, 0, sizeof(uint64_t) * (size_t)(cap - b->loss_cap));
    b->loss_cap = cap;
  }
}

/* The slot of (kind, cs, mb), its buffer allocated (zeroed) on the device,
 * and its host copy where messages are staged. */
zb_err cpu_slot_get(cpu_backend *b, cpu_stage *cs, int kind, int mb, cpu_slot **out, zb_diag *diag) {
  cpu_grow(b, cs, mb);
  cpu_slot *s = &cs->slots[kind][mb];
  if (!s->buf) {
    void *p = NULL;
    cpu_device_slot_alloc(b, b->act_bytes, false);
    zb_err err = dev_alloc(b->dev, b->act_bytes, &p, diag);
    if (!err)
      err = dev_zero(b->dev, p, b->act_bytes, diag);
    /* a receive lands from the comm stream, ordered after nothing of the
     * compute stream (docs/schedules.md, Execution model): the zeroing, and
     * any op still using the memory the allocator hands out again, must be
     * done first. Once per slot: slots are kept. */
    if (!err && b->cuda && (kind == SLOT_RECV_F || kind == SLOT_RECV_B))
      err = dev_sync(b->dev, diag);
    if (err) {
      if (p)
        dev_release(b->dev, p);
      return err;
    }
    s->buf = p;
    b->slot_bytes += (int64_t)b->act_bytes;
    cpu_device_slot_alloc(b, b->act_bytes, true);
  }
  if (b->staging && !s->host)
    s->host = zb_calloc(b->act_numel, sizeof(float));
  *out = s;
  return ZB_OK;
}

/* An input slot that must have been written (or received into) in the
 * current iteration; what: the missing producer, for the message. A
 * message staged in host memory is copied to the device first (ordered
 * before the op on the device's stream). */
zb_err cpu_input(cpu_backend *b, cpu_stage *cs, int kind, int mb, const char *op, int stage, const char *what,
                 const float **out, zb_diag *diag) {
  cpu_slot *s;
  zb_err err = cpu_slot_get(b, cs, kind, mb, &s, diag);
  if (err)
    return err;
  if (s->epoch != b->epoch)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "%s backend: %s of stage %d mb %d before its input: %s has not happened in this "
                       "iteration",
                       cpu_name(b), op, stage, mb, what);
  if (s->staged_in) {
    if ((err = dev_copy(b->dev, s->buf, s->host, b->act_bytes, ZB_COPY_H2D, diag)))
      return err;
    s->staged_in = false;
  }
  *out = s->buf;
  return ZB_OK;
}
