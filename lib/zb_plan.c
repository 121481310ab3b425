#include <stdio.h>
#include <string.h>

#include "zb_alloc.h"
#include "zb_period.h"
#include "zb_plan_internal.h"

static const struct {
  const char *name;
  zb_placement placement;
  int default_v;
  bool splits_w;
} zb_plan_families[ZB_FAMILY_COUNT_] = {
    [ZB_FAMILY_GPIPE] = {"gpipe", ZB_PLACE_LOOP, 1, false},
    [ZB_FAMILY_1F1B] = {"1f1b", ZB_PLACE_LOOP, 1, false},
    [ZB_FAMILY_INTERLEAVED_1F1B] = {"interleaved-1f1b", ZB_PLACE_LOOP, 2, false},
    [ZB_FAMILY_ZB_H1] = {"zb-h1", ZB_PLACE_LOOP, 1, true},
    [ZB_FAMILY_ZB_H2] = {"zb-h2", ZB_PLACE_LOOP, 1, true},
    [ZB_FAMILY_ZB_AUTO] = {"zb-auto", ZB_PLACE_LOOP, 1, true},
    [ZB_FAMILY_ZB_V] = {"zb-v", ZB_PLACE_V, 2, true},
    [ZB_FAMILY_V_HALF] = {"v-half", ZB_PLACE_V, 2, true},
    [ZB_FAMILY_V_MIN] = {"v-min", ZB_PLACE_V, 2, true},
    [ZB_FAMILY_ZB_INTERLEAVED] = {"zb-interleaved", ZB_PLACE_LOOP, 2, true},
    [ZB_FAMILY_DUALPIPE_V] = {"dualpipe-v", ZB_PLACE_V, 2, true},
};

const char *zb_family_name(zb_family f) {
  return (f >= 0 && f < ZB_FAMILY_COUNT_) ? zb_plan_families[f].name : "?";
}

zb_err zb_family_parse(const char *name, zb_family *out, zb_diag *diag) {
  for (int f = 0; f < ZB_FAMILY_COUNT_; f++)
    if (strcmp(name, zb_plan_families[f].name) == 0) {
      *out = (zb_family)f;
      return ZB_OK;
    }
  return zb_diag_set(
      diag, ZB_ERR_INVALID_ARG,
      "unknown schedule '%s' (known: gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zb-auto, zb-v, "
      "v-half, v-min, zb-interleaved, dualpipe-v)",
      name);
}

zb_placement zb_family_placement(zb_family f) {
  return zb_plan_families[f].placement;
}
int zb_family_default_chunks(zb_family f) {
  return zb_plan_families[f].default_v;
}
bool zb_family_splits_w(zb_family f) {
  return zb_plan_families[f].splits_w;
}

zb_err zb_plan_check_shape(zb_family f, int p, int v, int m, zb_diag *diag) {
  if (f < 0 || f >= ZB_FAMILY_COUNT_)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "unknown schedule family %d", (int)f);
  const char *name = zb_plan_families[f].name;
  if (p < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s needs at least 1 rank (got %d)", name, p);
  if (p > ZB_MAX_RANKS)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s plans at most %d ranks (got %d)", name, ZB_MAX_RANKS, p);
  if (m < 1)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s needs at least 1 microbatch (got %d)", name, m);
  if (m > ZB_MAX_MICROBATCHES)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s plans at most %d microbatches (got %d)", name,
                       ZB_MAX_MICROBATCHES, m);
  if (v > ZB_MAX_STAGES / p)
    return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "%s plans at most %d stages (got %d ranks x %d chunks)",
                       name, ZB_MAX_STAGES, p, v);
  switch (f) {
  case ZB_FAMILY_INTERLEAVED_1F1B:
    if (v < 2)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                         "interleaved-1f1b needs at least 2 chunks per rank (got %d)", v);
    if (m < p)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                         "interleaved-1f1b needs at least as many microbatches as ranks (m=%d, p=%d)", m, p);
    return ZB_OK;
  case ZB_FAMILY_ZB_INTERLEAVED:
    if (v < 2)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "zb-interleaved needs at least 2 chunks per rank (got %d)",
                         v);
    return ZB_OK;
  case ZB_FAMILY_DUALPIPE_V:
    if (v != 2)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                         "dualpipe-v places exactly 2 chunks per rank in a V (got %d)", v);
    if (m < 2 * p - 1)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                         "dualpipe-v needs at least 2p-1 microbatches (m=%d, p=%d: try m=%d)", m, p,
                         2 * p - 1);
    return ZB_OK;
  case ZB_FAMILY_ZB_V:
  case ZB_FAMILY_V_HALF:
  case ZB_FAMILY_V_MIN:
    if (v != 2)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED, "%s places exactly 2 chunks per rank in a V (got %d)",
                         name, v);
    return ZB_OK;
  default:
    if (v != 1)
      return zb_diag_set(diag, ZB_ERR_UNSUPPORTED,
                         "%s runs one chunk per rank (got %d); use interleaved-1f1b or "
                         "zb-v for more",
                         name, v);
    return ZB_OK;
  }
}

static zb_schedule *zb_plan_gpipe(int p, int m) {
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

/* Plans with fewer actions than this are generated in full: cheap, and
 * the grids the families are measured on keep their exact generators. */
#define PLAN_SHORT_RUN_ACTIONS 131072

int zb_plan_short_run(const zb_plan_request *req, int *q) {
  switch (req->family) {
  case ZB_FAMILY_V_HALF:
  case ZB_FAMILY_V_MIN: *q = 1; break;               /* the block repeats every microbatch */
  case ZB_FAMILY_ZB_INTERLEAVED: *q = req->p; break; /* a chunk's round of p microbatches */
  default: return 0;
  }
  /* warm-up, three periods and cool-down: a V's warm-up spans about p
   * microbatches, interleaved's a round per chunk. Two periods would make
   * a steady state of rounds (zb_period.h), but lowering from the run
   * compares the timeline past its first period (zb_period_times_repeat),
   * which needs the third */
  int base = 2 * req->p + 3 * *q;
  base += ((req->m - base) % *q + *q) % *q; /* the same microbatches modulo the period */
  int v = req->v > 0 ? req->v : zb_family_default_chunks(req->family);
  bool large = 3.0 * v * req->p * req->m >= PLAN_SHORT_RUN_ACTIONS;
  return large && 2 * base <= req->m ? base : 0;
}

/* The family's own generator for r (its costs c checked). */
static zb_err plan_family(const zb_plan_request *r, const zb_costs *c, zb_schedule **out, zb_diag *diag) {
  int v = r->v;
  switch (r->family) {
  case ZB_FAMILY_GPIPE: *out = zb_plan_gpipe(r->p, r->m); break;
  case ZB_FAMILY_1F1B: *out = zb_plan_1f1b(r->p, r->m); break;
  case ZB_FAMILY_INTERLEAVED_1F1B: *out = zb_plan_interleaved(r->p, v, r->m, r->par); break;
  case ZB_FAMILY_ZB_H1: *out = zb_plan_zb_h1(r->p, r->m); break;
  case ZB_FAMILY_ZB_H2: *out = zb_plan_zb_h2(r->p, r->m); break;
  case ZB_FAMILY_ZB_AUTO: return zb_plan_auto(r, c, out, diag);
  case ZB_FAMILY_ZB_V:
  case ZB_FAMILY_V_HALF:
  case ZB_FAMILY_V_MIN: return zb_plan_v_family(r, c, out, diag);
  case ZB_FAMILY_ZB_INTERLEAVED: return zb_plan_zb_interleaved(r, c, out, diag);
  case ZB_FAMILY_DUALPIPE_V: *out = zb_plan_dualpipe_v(r->p, r->m); break;
  default: return zb_diag_set(diag, ZB_ERR_INVALID_ARG, "unknown schedule family");
  }
  return ZB_OK;
}

zb_err zb_plan_generate_run(const zb_plan_request *req, zb_schedule **out, zb_schedule **run, int *period,
                            zb_diag *diag) {
  *run = NULL;
  *period = 0;
  int v = req->v > 0 ? req->v : zb_family_default_chunks(req->family);
  zb_err err = zb_plan_check_shape(req->family, req->p, v, req->m, diag);
  if (err)
    return err;
  zb_costs *own = NULL;
  const zb_costs *c = req->costs;
  if (!c) {
    zb_rank_costs rc = zb_rank_costs_default();
    c = own = zb_costs_from_rank_share(req->p, v, &rc, 0);
  }
  if (c->n_stages != req->p * v) {
    err = zb_diag_set(diag, ZB_ERR_INVALID_ARG, "costs describe %d stages but %s with p=%d, v=%d has %d",
                      c->n_stages, zb_family_name(req->family), req->p, v, req->p * v);
    goto cleanup;
  }
  if ((err = zb_costs_check(c, diag)))
    goto cleanup;
  zb_plan_request r = *req;
  r.v = v;
  int q, base = zb_plan_short_run(&r, &q);
  if (base > 0) { /* a short run, its steady state prolonged */
    zb_plan_request short_run = r;
    short_run.m = base;
    short_run.short_run = true;
    zb_schedule *s = NULL;
    *out = NULL;
    if (plan_family(&short_run, c, &s, diag) == ZB_OK)
      *out = zb_period_extend_par(s, r.m, q, r.par);
    if (*out) {
      *run = s;
      *period = q;
      goto cleanup;
    }
    zb_schedule_free(s);
  }
  err = plan_family(&r, c, out, diag);
cleanup:
  zb_costs_free(own);
  return err;
}

zb_err zb_plan_generate(const zb_plan_request *req, zb_schedule **out, zb_diag *diag) {
  zb_schedule *run;
  int period;
  zb_err err = zb_plan_generate_run(req, out, &run, &period, diag);
  zb_schedule_free(run);
  return err;
}
