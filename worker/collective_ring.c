/* collective_ring.c — ring reduce-scatter, all-gather and all-reduce over
 * a zb_transport (zb_collective.h; docs/model.md, Ring collectives). */
#include <string.h>

#include "zb_alloc.h"
#include "zb_collective.h"

void zb_ring_shard(size_t n, int d, int i, size_t *off, size_t *len) {
  size_t q = n / (size_t)d, r = n % (size_t)d, k = (size_t)i;
  *off = k * q + (k < r ? k : r);
  *len = q + (k < r ? 1 : 0);
}

static int ring_mod(int a, int d) {
  return ((a % d) + d) % d;
}

static size_t min_size(size_t a, size_t b) {
  return a < b ? a : b;
}

static size_t slice_floats(const zb_ring *g) {
  return (g->slice_bytes ? g->slice_bytes : ZB_RING_SLICE_BYTES) / sizeof(float);
}

/* Checks g and the buffer before any message; a bad argument aborts the
 * transport so the other members fail at once instead of waiting. */
static zb_err ring_check(zb_ring *g, const float *buf, size_t n, const char *what, zb_diag *diag) {
  zb_diag d = {{0}};
  zb_err err = ZB_ERR_INVALID_ARG;
  if (!g->tr)
    return zb_diag_set(diag, err, "%s: no transport", what);
  if (g->size < 1)
    zb_diag_set(&d, err, "%s of stage %d: group size %d is below 1", what, (int)g->stage, g->size);
  else if (g->index < 0 || g->index >= g->size)
    zb_diag_set(&d, err, "%s of stage %d: member index %d is not in 0..%d", what, (int)g->stage, g->index,
                g->size - 1);
  else if (!g->ranks)
    zb_diag_set(&d, err, "%s of stage %d: no ranks for the group's %d members", what, (int)g->stage, g->size);
  else if (n > 0 && !buf)
    zb_diag_set(&d, err, "%s of stage %d: no buffer for %zu floats", what, (int)g->stage, n);
  else if (g->slice_bytes > 0 && g->slice_bytes < sizeof(float))
    zb_diag_set(&d, err, "%s of stage %d: a slice of %zu bytes holds no float", what, (int)g->stage,
                g->slice_bytes);
  else
    return ZB_OK;
  zb_transport_abort(g->tr, d.msg);
  return zb_diag_set(diag, err, "%s", d.msg);
}

/* One ring step: send[0, send_n) to the next member while receiving
 * recv_n floats from the previous one, slice by slice, each slice's pair
 * in one group. With scratch the received slice lands there and is added
 * to recv (received partial sum first, then this member's value: the
 * fixed order of zb_collective.h); without it, it lands in recv. */
typedef struct ring_step {
  const float *send;
  size_t send_n;
  float *recv;
  size_t recv_n;
  float *scratch; /* NULL: receive in place */
} ring_step;

/* acc[j] = x[j] + acc[j]: element by element, so vectorising it (which
 * restrict allows: the scratch slice never aliases the buffer) changes no
 * bit of the result. */
static void add_into(float *restrict acc, const float *restrict x, size_t n) {
  for (size_t j = 0; j < n; j++)
    acc[j] = x[j] + acc[j];
}

static zb_err ring_move(zb_ring *g, zb_tag tag, const ring_step *st, zb_diag *diag) {
  int next = g->ranks[ring_mod(g->index + 1, g->size)], prev = g->ranks[ring_mod(g->index - 1, g->size)];
  size_t slice = slice_floats(g);
  for (size_t at = 0; at < st->send_n || at < st->recv_n; at += slice) {
    size_t ns = at < st->send_n ? min_size(slice, st->send_n - at) : 0;
    size_t nr = at < st->recv_n ? min_size(slice, st->recv_n - at) : 0;
    float *into = st->scratch ? st->scratch : st->recv + at;
    zb_transport_group_start(g->tr);
    zb_err err = ns ? zb_transport_send(g->tr, next, tag, st->send + at, ns * sizeof(float), diag) : ZB_OK;
    if (!err && nr)
      err = zb_transport_recv(g->tr, prev, tag, into, nr * sizeof(float), diag);
    zb_err end = zb_transport_group_end(g->tr, err ? NULL : diag); /* closes the group even after a failure */
    if (err || end)
      return err ? err : end;
    if (st->scratch)
      add_into(st->recv + at, st->scratch, nr);
  }
  return ZB_OK;
}

static zb_tag ring_tag(const zb_ring *g, int32_t seq) {
  return (zb_tag){.kind = ZB_OP_REDUCE_GRAD, .stage = g->stage, .mb = seq};
}

/* The next collective's number (wrapping, as both ends count alike). */
static int32_t ring_next_seq(zb_ring *g) {
  int32_t seq = g->seq;
  g->seq = seq == INT32_MAX ? 0 : seq + 1;
  return seq;
}

/* The d - 1 steps of a ring pass: at step s this member sends shard
 * (i - s + lead) and receives shard (i - s + lead - 1), adding it in
 * through scratch (reduce-scatter: lead -1) or copying it in place
 * (all-gather: lead 0, scratch NULL). */
static zb_err ring_pass(zb_ring *g, zb_tag tag, float *buf, size_t n, int lead, float *scratch,
                        zb_diag *diag) {
  int d = g->size, i = g->index;
  zb_err err = ZB_OK;
  for (int s = 0; s < d - 1 && !err; s++) {
    size_t so, sn, ro, rn;
    zb_ring_shard(n, d, ring_mod(i - s + lead, d), &so, &sn);
    zb_ring_shard(n, d, ring_mod(i - s + lead - 1, d), &ro, &rn);
    ring_step st = {.send = buf + so, .send_n = sn, .recv = buf + ro, .recv_n = rn, .scratch = scratch};
    err = ring_move(g, tag, &st, diag);
  }
  return err;
}

zb_err zb_ring_reduce_scatter(zb_ring *g, float *buf, size_t n, zb_diag *diag) {
  zb_err err = ring_check(g, buf, n, "reduce-scatter", diag);
  if (err)
    return err;
  zb_tag tag = ring_tag(g, ring_next_seq(g));
  if (g->size == 1 || n == 0)
    return ZB_OK;
  size_t widest, off;
  zb_ring_shard(n, g->size, 0, &off, &widest); /* shard 0 is among the longest */
  float *scratch = zb_malloc(sizeof(float) * min_size(slice_floats(g), widest));
  err = ring_pass(g, tag, buf, n, -1, scratch, diag);
  free(scratch);
  return err;
}

zb_err zb_ring_all_gather(zb_ring *g, float *buf, size_t n, zb_diag *diag) {
  zb_err err = ring_check(g, buf, n, "all-gather", diag);
  if (err)
    return err;
  zb_tag tag = ring_tag(g, ring_next_seq(g));
  if (g->size == 1 || n == 0)
    return ZB_OK;
  return ring_pass(g, tag, buf, n, 0, NULL, diag);
}

zb_err zb_ring_all_reduce(zb_ring *g, float *buf, size_t n, zb_diag *diag) {
  zb_err err = zb_ring_reduce_scatter(g, buf, n, diag);
  return err ? err : zb_ring_all_gather(g, buf, n, diag);
}
