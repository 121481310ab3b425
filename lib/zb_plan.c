/* zb_plan.c — the one generator entry point: checks the request, then
 * hands it to the family's generator (the handcrafted lists of
 * zb_plan_loop.c, zb-auto, the V families, zb-interleaved, DualPipeV),
 * through a short run prolonged by its steady state when the family plans
 * one (zb_plan_short_run). Only this file calls every generator; none of
 * them calls back. */
#include "zb_period.h"
#include "zb_plan_internal.h"

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
