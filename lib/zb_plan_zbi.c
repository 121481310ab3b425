/* zb-interleaved: zero bubble on loop placement with v >= 2 chunks per rank
 * (docs/schedules.md, Families). Interleaved 1F1B with the backward split
 * into B and W: the W ops fill what would otherwise be bubbles, within
 * interleaved-1f1b's peak memory (or the request's lower limit). Any m >= 1.
 *
 * Candidates, the best under the real costs kept:
 *   - Megatron's interleaved order (m a multiple of p) with each BW split
 *     into B then W, and the W ops placed anew by timing
 *     (zb_plan_place_w, every W policy);
 *   - the greedy list scheduler on loop placement with v chunks under the
 *     limit (zb_plan_greedy_search), which needs no multiple of p.
 */
#include <math.h>

#include "zb_plan_internal.h"

#define ZBI_REFINE_OPS 1024 /* p v m up to which the result is refined */
#define ZBI_REFINE_EVALS 200
#define ZBI_LARGE 8192 /* p v m above which fewer candidates run */

/* Interleaved 1F1B's peak on rank 0 in units of one rank's M_F: its
 * warm-up of (v-1)p + 2(p-1) chunk forwards and one more before the first
 * backward frees one, each 1/v of the rank's share (all m v of them when
 * m = p or fewer). */
static double zbi_limit_units(int p, int v, int m) {
  int held = m <= p ? m * v : (v - 1) * p + 2 * (p - 1) + 1;
  if (held > m * v)
    held = m * v;
  return (double)held / v;
}

/* The interleaved order (warm-up as zb_plan_interleaved_warm) with every
 * BW split into B and W. */
static zb_schedule *zbi_split_order(int p, int v, int m, int extra) {
  zb_schedule *il = zb_plan_interleaved_warm(p, v, m, extra, NULL);
  zb_schedule *s = zb_schedule_new_room(p, v, m, ZB_PLACE_LOOP, 3 * v);
  for (int r = 0; r < p; r++)
    for (int i = 0; i < il->ranks[r].n; i++) {
      const zb_action *a = &il->ranks[r].actions[i];
      if (a->op == ZB_OP_BW) {
        zb_schedule_push_op(s, r, ZB_OP_B, a->stage, a->mb);
        zb_schedule_push_op(s, r, ZB_OP_W, a->stage, a->mb);
      } else {
        zb_schedule_push_op(s, r, a->op, a->stage, a->mb);
      }
    }
  zb_schedule_free(il);
  return s;
}

zb_err zb_plan_zb_interleaved(const zb_plan_request *req, const zb_costs *cin, zb_schedule **out,
                              zb_diag *diag) {
  int p = req->p, v = req->v, m = req->m;
  double units = zbi_limit_units(p, v, m), unit = zb_costs_rank_mf(cin, ZB_PLACE_LOOP, p, v, 0);
  zb_costs *c = zb_costs_clone(cin);
  c->mem_limit = units * unit;
  if (cin->mem_limit > 0 && cin->mem_limit < c->mem_limit)
    c->mem_limit = cin->mem_limit;
  zb_schedule *best = NULL;
  zb_plan_score score;
  /* Megatron's warm-up, every forward first, and one or two more than
   * Megatron's (W may fill the longer wait for the first B) */
  static const int extras[] = {0, -1, 1, 2};
  /* large plans try Megatron's warm-up, with W only into gaps, and the
   * greedy only when no order fits: a fraction of the time, the order and
   * W placement are what matter there */
  bool large = (double)p * v * m > ZBI_LARGE;
  int n_extras = large ? 1 : (int)(sizeof extras / sizeof extras[0]), n_policies = large ? 1 : ZB_W_POLICIES;
  for (int k = 0; m >= p && k < n_extras; k++) {
    zb_schedule *order = zbi_split_order(p, v, m, extras[k]);
    for (int w = 0; w < n_policies; w++) {
      /* large plans: the one candidate, its score the greedy's (an upper
       * bound of the simulation's, which candidates compared need) */
      zb_plan_score known;
      zb_schedule *timed = zb_plan_place_w(order, c, w, &known);
      zb_plan_keep(&best, &score, timed, large ? &known : NULL, c, ZB_OBJ_MAKESPAN);
    }
    if (large && best) /* on large plans W placed by timing always won (p 2..128, v 2..4, m to 4096) */
      zb_schedule_free(order);
    else
      zb_plan_keep(&best, &score, order, NULL, c, ZB_OBJ_MAKESPAN);
  }
  if (!large || !best)
    zb_plan_keep(&best, &score, zb_plan_greedy_search(p, v, m, ZB_PLACE_LOOP, c), NULL, c, ZB_OBJ_MAKESPAN);
  /* small plans: swaps of neighbouring ops that shorten the critical path
   * (W next to its B or after the next one) are worth a few simulations */
  if (best && (double)p * v * m <= ZBI_REFINE_OPS)
    zb_plan_refine(best, c, ZB_OBJ_MAKESPAN, ZBI_REFINE_EVALS);
  zb_costs_free(c);
  if (!best)
    return zb_diag_set(diag, ZB_ERR_INFEASIBLE, "zb-interleaved found no schedule within %g x M_F per rank",
                       units);
  *out = best;
  return ZB_OK;
}
