/* backend_cpu_internal.h — the model backends' state (cpu and cuda; see
 * zb_backend.h), shared by backend_cpu.c (the ops, construction and
 * getters) and backend_cpu_io.c (the data, the slots messages travel in,
 * and op timing). Internal to the worker. */
#ifndef ZB_BACKEND_CPU_INTERNAL_H
#define ZB_BACKEND_CPU_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "zb_backend_cpu.h"
#include "zb_device.h"
#include "zb_names.h"

/* Slot kinds, one per comm action. */
enum { SLOT_SEND_F, SLOT_RECV_F, SLOT_SEND_B, SLOT_RECV_B, SLOT_KINDS };

/* One activation or gradient buffer. epoch: the backend's iteration serial
 * when it was last written (by F or B) or handed to the transport for a
 * receive; 0 means never, so a slot from an earlier iteration is never
 * mistaken for this one's. */
typedef struct cpu_slot {
  float *buf;  /* device memory (host memory on the host device) */
  float *host; /* staging copy for a host transport on a device backend; NULL otherwise */
  uint64_t epoch;
  bool staged_in; /* a RECV landed in host and is not yet copied to buf */
} cpu_slot;

/* One timed op: device events around it, summed by take_stats after sync. */
typedef struct cpu_timed {
  zb_device_event *start, *end;
  zb_op kind;             /* F, B or W */
  int64_t cpu_start, cpu; /* host device: the thread's CPU time at the start, then the op's */
} cpu_timed;

typedef struct cpu_stage {
  int index; /* global stage index */
  zb_model_stage *st;
  cpu_slot *slots[SLOT_KINDS]; /* indexed by mb, cap entries each */
  int cap;
} cpu_stage;

typedef struct cpu_backend {
  int rank, total;
  cpu_stage *stages; /* ascending by index */
  int n;
  int *local; /* [total]: position in stages, or -1 when another rank hosts it */
  zb_model_config model;
  size_t act_numel, act_bytes;
  zb_cpu_data data;
  const atomic_bool *stop;
  bool nan_on; /* the inject_nan test hook */
  int64_t nan_iteration;
  int nan_mb;

  int64_t iteration;          /* what the data source samples */
  uint64_t epoch;             /* bumped by every begin_iteration; slots compare against it */
  uint8_t *tokens, *targets;  /* the data source's bytes */
  int32_t *tok_ids, *tgt_ids; /* the same widened to the model's token ids */
  float *losses;              /* per mb: the last stage's loss, valid where loss_epoch == epoch */
  uint64_t *loss_epoch;
  int loss_cap;

  zb_device *dev; /* the model's device; owned when own_dev */
  bool own_dev;
  bool cuda;        /* a device other than the host: the "cuda" backend */
  bool staging;     /* messages go through host copies (a host transport on a device) */
  cpu_timed *timed; /* events of the ops since the last take_stats; pool grows, kept */
  int n_timed, cap_timed;

  /* cuda: the device allocator's bytes that are not microbatch state
   * (parameters, gradients, workspace, slots, optimizer state), so its peak
   * less dev_base is the states' peak (docs/model.md, Memory accounting);
   * a slot allocated within the interval closes a stretch, whose states'
   * peak dev_peak keeps, and joins the base */
  int64_t dev_base, dev_peak;
  int64_t syncs_base; /* the device's host_syncs at the last take_stats */

  zb_backend_stats acc; /* busy of the current interval */
  int64_t mem, peak;    /* state bytes of the whole rank; peak of the interval */
  int64_t peak_ever;
  int64_t slot_bytes;
} cpu_backend;

/* "cpu" or "cuda", for messages. */
static inline const char *cpu_name(const cpu_backend *b) {
  return b->cuda ? ZB_BACKEND_CUDA : ZB_BACKEND_CPU;
}

/* ---- the device ----------------------------------------------------------- */

static inline zb_err dev_alloc(zb_device *d, size_t bytes, void **out, zb_diag *diag) {
  return d->ops->alloc(d->self, bytes, out, diag);
}
static inline void dev_release(zb_device *d, void *p) {
  d->ops->free(d->self, p);
}
static inline zb_err dev_zero(zb_device *d, void *p, size_t bytes, zb_diag *diag) {
  return d->ops->zero(d->self, p, bytes, diag);
}
static inline zb_err dev_copy(zb_device *d, void *dst, const void *src, size_t bytes, zb_copy_kind kind,
                              zb_diag *diag) {
  return d->ops->copy(d->self, dst, src, bytes, kind, diag);
}
static inline zb_err dev_sync(zb_device *d, zb_diag *diag) {
  return d->ops->sync(d->self, diag);
}

/* ---- backend_cpu_io.c ---- */

/* cuda: a slot of `bytes` is allocated between a call with done false
 * (the states' peak so far is kept) and one with done true (the slot
 * joins what is not microbatch state). */
void cpu_device_slot_alloc(cpu_backend *b, size_t bytes, bool done);

/* Fills b->tokens and b->targets for mb of the current iteration, and
 * their int32 copies b->tok_ids and b->tgt_ids. */
zb_err cpu_fill(cpu_backend *b, int stage, int mb, zb_diag *diag);
/* Grows every slot array of cs (and the loss arrays) to hold mb. */
void cpu_grow(cpu_backend *b, cpu_stage *cs, int mb);
/* The slot of (kind, cs, mb), allocated (zeroed) on the device, with its
 * host copy where messages are staged. */
zb_err cpu_slot_get(cpu_backend *b, cpu_stage *cs, int kind, int mb, cpu_slot **out, zb_diag *diag);
/* An input slot written (or received into) in the current iteration,
 * copied from its host stage first where staged; what: the producer. */
zb_err cpu_input(cpu_backend *b, cpu_stage *cs, int kind, int mb, const char *op, int stage, const char *what,
                 const float **out, zb_diag *diag);
/* Op timing with device events: start records before an op of kind F, B
 * or W (*t: its index), end after it (only then does the op count; ops are
 * never nested); collect adds the durations to the busy times (after a
 * sync) and starts over; free releases the events. */
zb_err cpu_time_start(cpu_backend *b, zb_op kind, int *t, zb_diag *diag);
zb_err cpu_time_end(cpu_backend *b, int t, zb_diag *diag);
void cpu_time_collect(cpu_backend *b);
void cpu_time_free(cpu_backend *b);

#endif
