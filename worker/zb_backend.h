/* zb_backend.h — the worker's compute backends behind one vtable (see
 * docs/architecture.md, docs/model.md): run F, B, W and BW ops on (stage, microbatch), hold the buffers that
 * activations and gradients travel in, and account time and memory.
 *
 * The contract is submit + sync, so an asynchronous backend fits as well as
 * a synchronous one:
 *   - submit() starts one op. A synchronous backend (sim, cpu) runs it to
 *     completion before returning; an asynchronous one (cuda) enqueues it
 *     on its stream and returns at once.
 *   - sync() returns when every submitted op has finished. The executor
 *     calls it at the end of every iteration, then takes the stats, and,
 *     with a host-blocking transport, before posting a send (the data must
 *     be complete); a device-ordered one orders the send after its
 *     producer on the device instead (zb_executor.h).
 *   - buffer() hands out the memory a SEND reads from or a RECV writes into,
 *     so a backend with real math keeps activations where its kernels want
 *     them (host or device memory; the transport must be able to reach it).
 *     A device-ordered transport moves it on a stream of its own, so a
 *     buffer is written once per iteration and read once (the executor
 *     relies on it: docs/schedules.md, Execution model), and a buffer
 *     handed out for a receive has no device work pending on it.
 *   - take_stats() returns the busy seconds per kind and the memory in bytes
 *     since the previous call (an async backend times ops with events and
 *     sums them here, after sync).
 *
 * Ownership: a zb_backend is created by a constructor (zb_backend_sim_new,
 * later cpu and cuda ones) and owned by the caller, who frees it with
 * zb_backend_free() (NULL is a no-op). It borrows nothing from the caller
 * after the constructor returns, except the stop flag, which must outlive
 * it. One thread uses a backend at a time; the stop flag may be raised from
 * any thread.
 *
 * Results: zb_err from lib/zb_err.h. ZB_ERR_INVALID_ARG: bad op, stage or
 * microbatch; ZB_ERR_UNSUPPORTED: an op kind the backend cannot run;
 * ZB_ERR_IO: the op could not complete, including "stopped" (the stop flag
 * was raised while it ran; the caller that raised it knows it cancelled).
 */
#ifndef ZB_BACKEND_H
#define ZB_BACKEND_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "zb_schedule.h"

/* What a backend measured since the previous take_stats (or creation). */
typedef struct zb_backend_stats {
  /* Busy seconds per kind. A fused BW op is split between B and W in the
   * ratio of the configured (or profiled) T_B : T_W of its stage; all of it
   * counts as B when both are zero. */
  double busy_f, busy_b, busy_w;
  /* Seconds the ops were runnable but had no core: their wall time less
   * the thread CPU time they used (the cpu backend; 0 where not measured).
   * Part of the busy times above, not idle. */
  double cpu_wait;
  int64_t mem_bytes;  /* bytes held now; -1 when the backend does not track memory */
  int64_t peak_bytes; /* highest mem_bytes over the interval; -1 when untracked */
  /* Times the host waited for the device over the interval (docs/model.md,
   * Host syncs); -1 when the backend has no device. */
  int64_t host_syncs;
  /* The device's own figures (zb_device_mem; docs/model.md, Memory
   * accounting): its allocator's high-water mark since creation, workspace
   * and rounding included, and the device's used bytes sampled beside it;
   * -1 when the backend has no GPU. */
  int64_t device_peak, device_used;
} zb_backend_stats;

/* The vtable. `self` is the implementation's state. */
typedef struct zb_backend_ops {
  const char *name; /* "sim", "cpu", "cuda" */
  zb_err (*submit)(void *self, zb_op op, int stage, int mb, zb_diag *diag);
  zb_err (*sync)(void *self, zb_diag *diag);
  zb_err (*buffer)(void *self, zb_op comm, int stage, int mb, size_t len, void **out, zb_diag *diag);
  void (*take_stats)(void *self, zb_backend_stats *out);
  void (*free)(void *self);
} zb_backend_ops;

typedef struct zb_backend {
  const zb_backend_ops *ops;
  void *self;
} zb_backend;

/* Starts compute op `op` (F, B, W or BW) of (stage, mb). Blocks for the
 * op's duration on synchronous backends (cancelled by the stop flag within
 * 100 ms), returns at once on asynchronous ones. */
static inline zb_err zb_backend_submit(zb_backend *b, zb_op op, int stage, int mb, zb_diag *diag) {
  return b->ops->submit(b->self, op, stage, mb, diag);
}

/* Blocks until every submitted op has finished (cancellable like submit). */
static inline zb_err zb_backend_sync(zb_backend *b, zb_diag *diag) {
  return b->ops->sync(b->self, diag);
}

/* Sets *out to a buffer of at least len bytes for comm action `comm`
 * (SEND_F/SEND_B: the output of that stage's F/B for mb; RECV_F/RECV_B: the
 * input the receiving stage's F/B for mb will read). The backend owns the
 * buffer; it stays valid until the op that consumes it ran or the backend
 * is freed. Does not block. */
static inline zb_err zb_backend_buffer(zb_backend *b, zb_op comm, int stage, int mb, size_t len, void **out,
                                       zb_diag *diag) {
  return b->ops->buffer(b->self, comm, stage, mb, len, out, diag);
}

/* Fills *out with what was measured since the previous call and starts a
 * new interval (busy times to zero, peak to the current bytes). Call after
 * sync. Does not block. */
static inline void zb_backend_take_stats(zb_backend *b, zb_backend_stats *out) {
  b->ops->take_stats(b->self, out);
}

/* Backend name ("sim", ...). */
static inline const char *zb_backend_name(const zb_backend *b) {
  return b->ops->name;
}

/* Frees b and everything it owns; NULL is a no-op. Does not block. */
static inline void zb_backend_free(zb_backend *b) {
  if (b) {
    b->ops->free(b->self);
    free(b);
  }
}

/* ---- sim: sleeps the configured op times (docs/model.md) ---- */

typedef struct zb_sim_backend_config {
  /* Per-stage op times in seconds (t_f, t_b, t_w; BW sleeps T_B + T_W) and
   * memory deltas (m_f, m_b, m_w) in any unit; copied. Must describe every
   * stage the rank will run. */
  const zb_costs *costs;
  /* The rank's M_F in the unit of costs' memory deltas (zb_costs_rank_mf);
   * <= 0 counts as 1. Memory is accounted as (deltas / rank_mf) units of
   * bytes_per_activation bytes, a stand-in until real math. */
  double rank_mf;
  size_t bytes_per_activation; /* size of the buffers buffer() hands out */
  const atomic_bool *stop;     /* may be NULL; borrowed, must outlive the backend */
  /* Every op takes this many times its configured time (<= 0: 1): a test
   * knob for a slow rank (zb-worker's ZB_TEST_SIM_SLOWDOWN). */
  double time_scale;
} zb_sim_backend_config;

/* Creates a sim backend. Ops sleep to an absolute CLOCK_MONOTONIC deadline
 * (so oversleeps do not add up across chunks) and spin the last 100 µs for
 * precision; busy times are the measured durations. Caller owns *out. Does
 * not block. ZB_ERR_INVALID_ARG when the costs are missing or negative. */
zb_err zb_backend_sim_new(const zb_sim_backend_config *cfg, zb_backend **out, zb_diag *diag);

/* Sets the time scale of a sim backend's ops from the next op on (<= 0:
 * 1); a no-op on other backends. */
void zb_backend_sim_set_time_scale(zb_backend *b, double scale);

/* A sim job's REDUCE_GRAD of stage (docs/schedules.md, Gradient
 * reduction): waits until since_ns (CLOCK_MONOTONIC, zb_clock_ns) plus the
 * stage's T_reduce times the time scale, so the reduction takes its
 * configured time however long the replicas' rendezvous before it took.
 * Counts as no op's busy time (the executor counts it as comm).
 * ZB_ERR_INVALID_ARG for another backend or a stage out of range;
 * ZB_ERR_IO when stopped. */
zb_err zb_backend_sim_hold(zb_backend *b, int64_t since_ns, int stage, zb_diag *diag);

/* The cpu and cuda backends, which run the model on a device, are
 * declared in zb_backend_cpu.h: this header, which the executor includes,
 * names no model type. */

#endif
