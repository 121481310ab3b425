/* zb_plan.h — schedule families and the one generator entry point. */
#ifndef ZB_PLAN_H
#define ZB_PLAN_H

#include "zb_par.h"
#include "zb_schedule.h"

typedef enum zb_family {
  ZB_FAMILY_GPIPE = 0,
  ZB_FAMILY_1F1B,
  ZB_FAMILY_INTERLEAVED_1F1B,
  ZB_FAMILY_ZB_H1,
  ZB_FAMILY_ZB_H2,
  ZB_FAMILY_ZB_AUTO,
  ZB_FAMILY_ZB_V,
  ZB_FAMILY_V_HALF,
  ZB_FAMILY_V_MIN,
  ZB_FAMILY_ZB_INTERLEAVED,
  ZB_FAMILY_DUALPIPE_V,
  ZB_FAMILY_COUNT_
} zb_family;

/* What zb-auto minimises. MAKESPAN: one iteration end to end, what an
 * optimizer step that synchronises all ranks pays. SPAN: the longest
 * per-rank span (the paper's bubble definition), what steady-state training
 * pays once post-validation removes that sync. Ties go to the other one. */
typedef enum zb_objective {
  ZB_OBJ_MAKESPAN = 0,
  ZB_OBJ_SPAN = 1,
} zb_objective;

/* What to generate. costs describe the shape's p*v stages (already divided
 * among chunks, see zb_costs_from_rank_share); NULL means unit costs.
 * costs->mem_limit is honoured by zb-auto (and reported by the validator
 * for every family); <= 0 lets zb-auto default to 1F1B's peak. */
typedef struct zb_plan_request {
  zb_family family;
  int p, v, m;
  const zb_costs *costs;
  zb_objective objective; /* zb-auto only */
  const zb_par *par;      /* threads lent for copying a plan's lists (zb_par.h); NULL: none */
  /* set by zb_plan_generate_run on the short run of a plan it prolongs
   * (zb_plan_internal.h, zb_plan_short_run): the generator leaves out
   * what would not repeat */
  bool short_run;
} zb_plan_request;

/* Family name as used on the command line ("zb-h1", ...). */
const char *zb_family_name(zb_family f);
/* Parses a family name; ZB_ERR_INVALID_ARG (listing the names in diag). */
zb_err zb_family_parse(const char *name, zb_family *out, zb_diag *diag);
/* Placement and chunk count a family uses; v_request is the requested v
 * (0: the family's default). */
zb_placement zb_family_placement(zb_family f);
int zb_family_default_chunks(zb_family f);
/* Whether a family splits B and W. */
bool zb_family_splits_w(zb_family f);

/* Checks that the family can serve (p, v, m); ZB_ERR_UNSUPPORTED with a
 * sentence naming what it needs. */
zb_err zb_plan_check_shape(zb_family f, int p, int v, int m, zb_diag *diag);

/* Generates the compute-only schedule for req. Caller owns *out. Pure and
 * deterministic; may take a while for zb-auto on large shapes (bounded,
 * see docs/schedules.md, Families) but never blocks on anything external. */
zb_err zb_plan_generate(const zb_plan_request *req, zb_schedule **out, zb_diag *diag);

/* zb_plan_generate that also hands back, when the family planned a short
 * run and repeated its steady state (docs/schedules.md, Planning at
 * scale), that run in *run (caller owns it; NULL otherwise) and its
 * period in microbatches in *period (0 otherwise): zb_lower_par_run
 * lowers the plan from it. */
zb_err zb_plan_generate_run(const zb_plan_request *req, zb_schedule **out, zb_schedule **run, int *period,
                            zb_diag *diag);

#endif
