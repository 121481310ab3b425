/* backend_sim.c — the sim compute backend: every op sleeps its configured
 * time, memory is accounted from the plan's deltas. It measures the
 * runtime and the control plane, not math (docs/model.md). Synchronous: submit
 * returns when the op's time has passed; sync has nothing to wait for.
 * Buffers: all sends read one pattern-filled buffer, all receives land in
 * one scratch buffer (the sim keeps no data, but the bytes on the wire are
 * real). */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "zb_alloc.h"
#include "zb_backend.h"
#include "zb_clock.h"
#include "zb_names.h"

/* Below this much time left, spin instead of sleeping (a sleep overshoots
 * by tens of microseconds). */
#define SIM_SPIN_NS 100000LL
/* Sleeps are cut into slices of at most this, so the stop flag is seen. */
#define SIM_SLICE_NS 100000000LL

typedef struct sim_backend {
  zb_costs *costs;
  double rank_mf;
  size_t bpa;
  const atomic_bool *stop;
  unsigned char *send_buf, *recv_buf;
  zb_backend_stats acc; /* busy of the current interval */
  double mem, peak;     /* in units of costs' memory deltas */
  double time_scale;
} sim_backend;

/* Sleeps until the absolute monotonic time `deadline_ns`: sleeps in slices
 * to 100 µs before it, then spins. ZB_ERR_IO when stopped first. */
static zb_err sim_wait_until(const sim_backend *b, int64_t deadline_ns, zb_diag *diag) {
  for (;;) {
    int64_t now = zb_clock_ns();
    int64_t left = deadline_ns - now;
    if (left <= 0)
      return ZB_OK;
    if (b->stop && atomic_load(b->stop))
      return zb_diag_set(diag, ZB_ERR_IO, "stopped (stop flag raised) during a compute op");
    if (left <= SIM_SPIN_NS)
      continue;
    int64_t until = deadline_ns - SIM_SPIN_NS;
    if (until - now > SIM_SLICE_NS)
      until = now + SIM_SLICE_NS;
    struct timespec ts = {.tv_sec = (time_t)(until / 1000000000LL), .tv_nsec = (long)(until % 1000000000LL)};
    int rc;
    do
      rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    while (rc == EINTR);
  }
}

static zb_err sim_submit(void *self, zb_op op, int stage, int mb, zb_diag *diag) {
  sim_backend *b = self;
  if (!zb_op_is_compute(op))
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "sim backend: %s is not a compute op", zb_op_name(op));
  if (stage < 0 || stage >= b->costs->n_stages || mb < 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "sim backend: %s stage %d mb %d out of range (%d stages)",
                       zb_op_name(op), stage, mb, b->costs->n_stages);
  double t = zb_costs_time(b->costs, op, stage) * b->time_scale;
  int64_t start = zb_clock_ns();
  zb_err err = sim_wait_until(b, start + (int64_t)llround(t * 1e9), diag);
  double took = (double)(zb_clock_ns() - start) * 1e-9;
  switch (op) {
  case ZB_OP_F: b->acc.busy_f += took; break;
  case ZB_OP_B: b->acc.busy_b += took; break;
  case ZB_OP_W: b->acc.busy_w += took; break;
  default: { /* BW: split in the ratio T_B : T_W */
    double tb = b->costs->t_b[stage], tw = b->costs->t_w[stage];
    double share_b = tb + tw > 0 ? tb / (tb + tw) : 1.0;
    b->acc.busy_b += took * share_b;
    b->acc.busy_w += took * (1.0 - share_b);
  }
  }
  if (err)
    return err;
  b->mem += zb_costs_mem(b->costs, op, stage);
  if (b->mem > b->peak)
    b->peak = b->mem;
  return ZB_OK;
}

static zb_err sim_sync(void *self, zb_diag *diag) {
  (void)self;
  (void)diag;
  return ZB_OK;
}

static zb_err sim_buffer(void *self, zb_op comm, int stage, int mb, size_t len, void **out, zb_diag *diag) {
  sim_backend *b = self;
  (void)stage;
  (void)mb;
  if (len > b->bpa)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "sim backend: a %zu-byte buffer exceeds bytes_per_activation %zu", len, b->bpa);
  if (comm == ZB_OP_SEND_F || comm == ZB_OP_SEND_B)
    *out = b->send_buf;
  else if (comm == ZB_OP_RECV_F || comm == ZB_OP_RECV_B)
    *out = b->recv_buf;
  else
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "sim backend: %s has no buffer", zb_op_name(comm));
  return ZB_OK;
}

static int64_t sim_bytes(const sim_backend *b, double mem) {
  return (int64_t)llround(mem / b->rank_mf * (double)b->bpa);
}

static void sim_take_stats(void *self, zb_backend_stats *out) {
  sim_backend *b = self;
  *out = b->acc;
  out->mem_bytes = sim_bytes(b, b->mem);
  out->peak_bytes = sim_bytes(b, b->peak);
  out->device_peak = out->device_used = -1;
  out->host_syncs = -1; /* no device */
  memset(&b->acc, 0, sizeof b->acc);
  b->peak = b->mem;
}

static void sim_free(void *self) {
  sim_backend *b = self;
  zb_costs_free(b->costs);
  free(b->send_buf);
  free(b->recv_buf);
  free(b);
}

static const zb_backend_ops sim_ops = {
    .name = ZB_BACKEND_SIM,
    .submit = sim_submit,
    .sync = sim_sync,
    .buffer = sim_buffer,
    .take_stats = sim_take_stats,
    .free = sim_free,
};

zb_err zb_backend_sim_new(const zb_sim_backend_config *cfg, zb_backend **out, zb_diag *diag) {
  const zb_costs *c = cfg->costs;
  if (!c || c->n_stages <= 0)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "sim backend: no costs given");
  for (int s = 0; s < c->n_stages; s++)
    if (!(c->t_f[s] >= 0 && c->t_b[s] >= 0 && c->t_w[s] >= 0))
      return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "sim backend: stage %d has a negative or NaN op time", s);
  sim_backend *b = zb_calloc(1, sizeof *b);
  b->costs = zb_costs_clone(c);
  b->time_scale = cfg->time_scale > 0 ? cfg->time_scale : 1.0;
  b->rank_mf = cfg->rank_mf > 0 ? cfg->rank_mf : 1.0;
  b->bpa = cfg->bytes_per_activation;
  b->stop = cfg->stop;
  b->send_buf = zb_malloc(b->bpa ? b->bpa : 1);
  b->recv_buf = zb_malloc(b->bpa ? b->bpa : 1);
  for (size_t i = 0; i < b->bpa; i++)
    b->send_buf[i] = (unsigned char)(i * 131u + 7u);
  memset(b->recv_buf, 0, b->bpa);
  zb_backend *h = zb_calloc(1, sizeof *h);
  h->ops = &sim_ops;
  h->self = b;
  *out = h;
  return ZB_OK;
}

void zb_backend_sim_set_time_scale(zb_backend *b, double scale) {
  if (b && b->ops == &sim_ops)
    ((sim_backend *)b->self)->time_scale = scale > 0 ? scale : 1.0;
}

zb_err zb_backend_sim_hold(zb_backend *b, int64_t since_ns, int stage, zb_diag *diag) {
  if (!b || b->ops != &sim_ops)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "sim backend: hold on another backend");
  sim_backend *s = b->self;
  if (stage < 0 || stage >= s->costs->n_stages)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG,
                       "sim backend: REDUCE_GRAD of stage %d out of range (%d stages)", stage,
                       s->costs->n_stages);
  double t = s->costs->t_reduce[stage] * s->time_scale;
  return sim_wait_until(s, since_ns + (int64_t)llround(t * 1e9), diag);
}
