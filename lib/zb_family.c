/* zb_family.c — the family table: each family's name, placement, default
 * chunks and whether it splits B and W, the shapes it serves, and which
 * families plan a short run and prolong it (docs/schedules.md, Families
 * and Planning at scale). Depends on no generator. */
#include <string.h>

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
