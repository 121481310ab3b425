/* zb_plan_loop.c — the handcrafted loop-placement lists: GPipe, 1F1B,
 * ZB-H1, ZB-H2 and Megatron's interleaved 1F1B (docs/schedules.md,
 * Families). Fixed orders that depend on the shape alone; no costs, no
 * other generator. */
#include "zb_plan_internal.h"

zb_schedule *zb_plan_gpipe(int p, int m) {
  zb_schedule *s = zb_schedule_new_room(p, 1, m, ZB_PLACE_LOOP, 2);
  for (int r = 0; r < p; r++) {
    for (int i = 0; i < m; i++)
      zb_schedule_push_op(s, r, ZB_OP_F, r, i);
    for (int i = 0; i < m; i++)
      zb_schedule_push_op(s, r, ZB_OP_BW, r, i);
  }
  return s;
}

zb_schedule *zb_plan_1f1b(int p, int m) {
  zb_schedule *s = zb_schedule_new_room(p, 1, m, ZB_PLACE_LOOP, 2);
  for (int r = 0; r < p; r++) {
    int warm = p - 1 - r < m ? p - 1 - r : m;
    for (int i = 0; i < warm; i++)
      zb_schedule_push_op(s, r, ZB_OP_F, r, i);
    for (int i = 0; i < m - warm; i++) {
      zb_schedule_push_op(s, r, ZB_OP_F, r, warm + i);
      zb_schedule_push_op(s, r, ZB_OP_BW, r, i);
    }
    for (int i = m - warm; i < m; i++)
      zb_schedule_push_op(s, r, ZB_OP_BW, r, i);
  }
  return s;
}

/* The ZB-H family on loop placement: rank r warms up with `warm(r)` F,
 * then alternates F and B; each W trails its B by `lag(r)` microbatches
 * (filling the cool-down where 1F1B idles), then the rest drain. H1 keeps
 * 1F1B's warm-up (p-1-r) with lag r; H2 doubles both (2(p-1-r), 2r), so
 * that rank 0 holds 2p-1 microbatches and the warm-up bubble is filled. */
static zb_schedule *zb_plan_zb_h(int p, int m, int warm_mul) {
  zb_schedule *s = zb_schedule_new_room(p, 1, m, ZB_PLACE_LOOP, 3);
  for (int r = 0; r < p; r++) {
    int warm = warm_mul * (p - 1 - r);
    if (warm > m)
      warm = m;
    int lag = warm_mul * r, w = 0;
    for (int i = 0; i < warm; i++)
      zb_schedule_push_op(s, r, ZB_OP_F, r, i);
    for (int i = 0; i < m - warm; i++) {
      zb_schedule_push_op(s, r, ZB_OP_F, r, warm + i);
      zb_schedule_push_op(s, r, ZB_OP_B, r, i);
      if (i >= lag)
        zb_schedule_push_op(s, r, ZB_OP_W, r, w++);
    }
    for (int i = m - warm; i < m; i++) {
      zb_schedule_push_op(s, r, ZB_OP_B, r, i);
      zb_schedule_push_op(s, r, ZB_OP_W, r, w++);
    }
    while (w < m)
      zb_schedule_push_op(s, r, ZB_OP_W, r, w++);
  }
  return s;
}

zb_schedule *zb_plan_zb_h1(int p, int m) {
  return zb_plan_zb_h(p, m, 1);
}
zb_schedule *zb_plan_zb_h2(int p, int m) {
  return zb_plan_zb_h(p, m, 2);
}

/* Megatron's interleaved 1F1B: microbatches go through the chunks in
 * groups of p; rank r warms up with (v-1)p + 2(p-1-r) chunk-forwards, then
 * alternates one forward and one backward. When p does not divide m the
 * order is built for the next multiple and the microbatches past m are
 * left out: removing every op of a microbatch from a schedule that
 * completes leaves one that does. */
static void zb_plan_interleaved_unit(int p, int v, int k, bool backward, int rank, int *stage, int *mb) {
  int group = k / (p * v), j = k % (p * v);
  int chunk = j / p;
  if (backward)
    chunk = v - 1 - chunk;
  *mb = group * p + j % p;
  *stage = chunk * p + rank;
}

static void zb_plan_interleaved_push(zb_schedule *s, int p, int v, int k, bool backward, int r) {
  int stage, mb;
  zb_plan_interleaved_unit(p, v, k, backward, r, &stage, &mb);
  if (mb < s->m)
    zb_schedule_push_op(s, r, backward ? ZB_OP_BW : ZB_OP_F, stage, mb);
}

zb_schedule *zb_plan_interleaved(int p, int v, int m, const zb_par *par) {
  return zb_plan_interleaved_warm(p, v, m, m == p ? -1 : 0, par);
}

/* Rank r's list of the interleaved order (total units, warm-up extra). */
static void zb_plan_interleaved_rank(zb_schedule *s, int v, int total, int extra, int r) {
  int p = s->p;
  int warm = extra < 0 ? total : (v - 1) * p + 2 * (p - 1 - r) + extra;
  if (warm > total)
    warm = total;
  for (int k = 0; k < warm; k++)
    zb_plan_interleaved_push(s, p, v, k, false, r);
  for (int k = 0; k < total - warm; k++) {
    zb_plan_interleaved_push(s, p, v, warm + k, false, r);
    zb_plan_interleaved_push(s, p, v, k, true, r);
  }
  for (int k = total - warm; k < total; k++)
    zb_plan_interleaved_push(s, p, v, k, true, r);
}

typedef struct interleaved_job {
  zb_schedule *s;
  int v, total, extra, pieces;
} interleaved_job;

/* Piece k: a share of the ranks, each writing only its own list (within
 * the room new_room gave it: no list moves). */
static void zb_plan_interleaved_piece(void *arg, int k) {
  const interleaved_job *j = arg;
  int p = j->s->p;
  for (int r = zb_par_share(p, k, j->pieces); r < zb_par_share(p, k + 1, j->pieces); r++)
    zb_plan_interleaved_rank(j->s, j->v, j->total, j->extra, r);
}

/* Ranks' actions per piece below which one thread writes every list. */
#define PLAN_PIECE_ACTIONS 200000

zb_schedule *zb_plan_interleaved_warm(int p, int v, int m, int extra, const zb_par *par) {
  interleaved_job j = {.s = zb_schedule_new_room(p, v, m, ZB_PLACE_LOOP, 2 * v),
                       .v = v,
                       .total = (m + p - 1) / p * p * v, /* units of the padded order */
                       .extra = extra,
                       .pieces = zb_par_width(par)};
  if (j.pieces > p || 2L * v * m * p < (long)j.pieces * PLAN_PIECE_ACTIONS)
    j.pieces = 1;
  zb_par_run(par, zb_plan_interleaved_piece, &j, j.pieces);
  return j.s;
}
