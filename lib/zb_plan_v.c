/* The V-shaped families (v = 2, stage s on rank s for s < p, else
 * 2p-1-s): ZB-V, V-Half and V-Min.
 *
 * ZB-V at even costs is handcrafted: rank r warms up with 2(p-r)-1
 * forwards of its first chunk, interleaves the two chunks' forwards, then
 * repeats F0 B0 W0 F1 B1 W1 with a cool-down that drains the W ops last.
 * It holds 1F1B's peak and has no bubble inside a rank's span once m >=
 * 2p-1. Under uneven costs the best of it, the V timed against the costs
 * (zb_plan_vtimed.c) and more candidates. Shorter runs, and V-Half /
 * V-Min (activation memory about 1/2 and 1/3 of 1F1B's), come from the
 * greedy list scheduler and the building blocks under the matching
 * memory limit.
 */
#include <math.h>
#include <stdlib.h>

#include "zb_lower.h"
#include "zb_plan_internal.h"

/* Under uneven costs ZB-V tries every candidate, and improves the best
 * with the local search, when p m is at most this (their simulations
 * grow with it); above, the handcrafted and the timed lists only. V-Half
 * and V-Min get the local search up to the same size. */
#define ZBV_COST_AWARE_PM 2048
#define ZBV_REFINE_EVALS 300
/* Above this p m uneven costs get the handcrafted lists, as even ones:
 * the timed lists gain little there (0.0274 -> 0.0269 at p=32, m=256)
 * and their runs and simulations cost seconds at p=256, m=4096. */
#define ZBV_TIMED_PM 65536

typedef struct vrank {
  zb_schedule *s;
  int r, s0, s1; /* rank, its chunk-0 and chunk-1 stages */
  int f0, f1, b0, b1, w0, w1;
} vrank;

static void v_op(vrank *x, zb_op op, int chunk) {
  int stage = chunk ? x->s1 : x->s0;
  int *n = op == ZB_OP_F   ? (chunk ? &x->f1 : &x->f0)
           : op == ZB_OP_B ? (chunk ? &x->b1 : &x->b0)
                           : (chunk ? &x->w1 : &x->w0);
  zb_schedule_push_op(x->s, x->r, op, stage, (*n)++);
}

static zb_schedule *zb_plan_zb_v_handcrafted(int p, int m) {
  zb_schedule *s = zb_schedule_new_room(p, 2, m, ZB_PLACE_V, 6);
  for (int r = 0; r < p; r++) {
    vrank x = {.s = s, .r = r, .s0 = r, .s1 = 2 * p - 1 - r};
    for (int k = 0; k < 2 * (p - r) - 1; k++)
      v_op(&x, ZB_OP_F, 0);
    for (int k = 0; k < r; k++) {
      v_op(&x, ZB_OP_F, 1);
      v_op(&x, ZB_OP_F, 0);
    }
    for (int k = 0; k < p - r; k++) {
      v_op(&x, ZB_OP_F, 1);
      v_op(&x, ZB_OP_B, 1);
      v_op(&x, ZB_OP_W, 1);
    }
    while (x.f1 < x.f0 || x.f0 < m) {
      if (x.f0 < m)
        v_op(&x, ZB_OP_F, 0);
      v_op(&x, ZB_OP_B, 0);
      v_op(&x, ZB_OP_W, 0);
      v_op(&x, ZB_OP_F, 1);
      v_op(&x, ZB_OP_B, 1);
      v_op(&x, ZB_OP_W, 1);
    }
    for (int k = 0; k < r; k++) {
      v_op(&x, ZB_OP_B, 0);
      v_op(&x, ZB_OP_B, 1);
    }
    for (int k = 0; k < p - r; k++) {
      v_op(&x, ZB_OP_B, 0);
      v_op(&x, ZB_OP_W, 0);
    }
    while (x.w1 < m)
      v_op(&x, ZB_OP_W, 1);
    while (x.w0 < m)
      v_op(&x, ZB_OP_W, 0);
  }
  return s;
}

/* Of the n candidates (owned; NULL ones skipped), the one whose longest
 * rank span is shortest once lowered among those whose lowered makespan
 * is within cap (zb_plan_score_better_capped; ties: the earlier), the
 * others freed. That span is what the plan's figures will say: with
 * T_comm > 0 it can differ from the compute-only lists' own (a transfer
 * then waits for both its sides), so candidates those figures rank
 * closely are told apart by it. */
static zb_schedule *v_pick_lowered(zb_schedule **cand, int n, const zb_costs *c, double cap) {
  zb_schedule *best = NULL;
  zb_plan_score best_sc = {INFINITY, INFINITY, ZB_OBJ_SPAN};
  for (int k = 0; k < n; k++) {
    zb_schedule *low = NULL;
    zb_plan_score sc = {INFINITY, INFINITY, ZB_OBJ_SPAN};
    bool ok =
        cand[k] && zb_lower(cand[k], c, &low, NULL) == ZB_OK && zb_plan_score_of(low, c, ZB_OBJ_SPAN, &sc);
    zb_schedule_free(low);
    if (cand[k] && (!best || (ok && zb_plan_score_better_capped(sc, best_sc, cap)))) {
      zb_schedule_free(best);
      best = cand[k];
      best_sc = sc;
    } else
      zb_schedule_free(cand[k]);
  }
  return best;
}

/* The makespan of the handcrafted lists under c, compute-only (*cap) and
 * lowered (*cap_lowered): zb-v's ceiling on small plans. */
static void v_hand_caps(const zb_schedule *hand, const zb_costs *c, double *cap, double *cap_lowered) {
  zb_plan_score sc;
  zb_schedule *low = NULL;
  *cap = zb_plan_score_of(hand, c, ZB_OBJ_SPAN, &sc) ? sc.makespan : 0;
  *cap_lowered = 0;
  if (c->t_comm > 0 && zb_lower(hand, c, &low, NULL) == ZB_OK && zb_plan_score_of(low, c, ZB_OBJ_SPAN, &sc))
    *cap_lowered = sc.makespan;
  zb_schedule_free(low);
}

/* zb-v's candidates so far: the best by span within cap (the makespan
 * ceiling; 0: none) and, when the ceiling is set, the best span of all
 * (wide), which the local search then brings under it. */
typedef struct v_best {
  const zb_costs *c;
  double cap;
  zb_schedule *s, *wide;
  zb_plan_score score, wide_score;
} v_best;

/* Keeps cand (owned; NULL: no-op; known as zb_plan_keep's) where it wins. */
static void v_keep(v_best *b, zb_schedule *cand, const zb_plan_score *known) {
  if (cand && b->cap > 0)
    zb_plan_keep(&b->wide, &b->wide_score, zb_schedule_clone(cand), known, b->c, ZB_OBJ_SPAN);
  zb_plan_keep_capped(&b->s, &b->score, cand, known, b->c, ZB_OBJ_SPAN, b->cap);
}

/* ZB-V under uneven costs, within 1F1B's peak (limit): the handcrafted
 * lists and the V timed against the costs (every variant); up to p m =
 * ZBV_COST_AWARE_PM (or when those find nothing) also the greedy, and up
 * to it the handcrafted F and B order with W placed by timing (every
 * policy) and the V building blocks. The shortest longest rank span;
 * for the makespan objective (the default), up to that size within the
 * handcrafted lists' makespan (the ceiling:
 * the authors' ZB-V, PyTorch's ZBVZeroBubble, whose iteration it never
 * lengthens there), improved by the local search from the best within
 * the ceiling and from the best span of all (which first walks its
 * makespan's critical path down under it); with T_comm > 0 the results,
 * what the search started from, the best timed and the handcrafted lists
 * then compete once more, lowered. */
static zb_err zb_v_cost_aware(int p, int m, const zb_costs *cin, double limit, zb_objective obj,
                              zb_schedule **out, zb_diag *diag) {
  zb_costs *c = zb_costs_clone(cin);
  c->mem_limit = cin->mem_limit > 0 && cin->mem_limit < limit ? cin->mem_limit : limit;
  bool small = (double)p * m <= ZBV_COST_AWARE_PM, recheck = small && c->t_comm > 0;
  v_best b = {.c = c};
  zb_schedule *timed = NULL, *hand = m >= 2 * p - 1 ? zb_plan_zb_v_handcrafted(p, m) : NULL;
  zb_plan_score timed_score;
  double cap_lowered = 0;
  if (hand && small && obj == ZB_OBJ_MAKESPAN) /* the span objective asks for the span alone */
    v_hand_caps(hand, c, &b.cap, &cap_lowered);
  for (int w = 0; hand && small && w < ZB_W_POLICIES; w++)
    v_keep(&b, zb_plan_place_w(hand, c, w, NULL), NULL);
  v_keep(&b, recheck && hand ? zb_schedule_clone(hand) : hand, NULL); /* hand: the recheck's */
  zb_schedule *variants[ZB_VT_VARIANTS];
  for (int k = 0, n = zb_plan_v_timed(p, m, c, variants); k < n; k++) {
    if (b.cap > 0) /* the best span of all may be a run the ceiling sets aside */
      zb_plan_keep(&b.wide, &b.wide_score, zb_schedule_clone(variants[k]), NULL, c, ZB_OBJ_SPAN);
    zb_plan_keep_capped(&timed, &timed_score, variants[k], NULL, c, ZB_OBJ_SPAN, b.cap);
  }
  if (timed) /* kept apart for the lowered recheck */
    zb_plan_keep_capped(&b.s, &b.score, recheck ? zb_schedule_clone(timed) : timed, &timed_score, c,
                        ZB_OBJ_SPAN, b.cap);
  if (small || !b.s)
    v_keep(&b, zb_plan_greedy_search(p, 2, m, ZB_PLACE_V, c), NULL);
  for (int hop = 1; small && hop <= 2; hop++)
    v_keep(&b, zb_plan_v_block(p, m, hop, c, true, ZB_VB_BOTH, NULL), NULL);
  zb_schedule *s = b.s, *start = s && recheck ? zb_schedule_clone(s) : NULL;
  if (s && small) {
    zb_plan_refine_capped(s, c, ZB_OBJ_SPAN, b.cap, ZBV_REFINE_EVALS);
    zb_plan_score_of(s, c, ZB_OBJ_SPAN, &b.score);
  }
  if (b.wide) {
    zb_plan_refine_capped(b.wide, c, ZB_OBJ_SPAN, b.cap, ZBV_REFINE_EVALS);
    zb_plan_keep_capped(&s, &b.score, b.wide, NULL, c, ZB_OBJ_SPAN, b.cap);
  }
  if (recheck)
    s = v_pick_lowered((zb_schedule *[]){s, start, timed, hand}, 4, c, cap_lowered);
  zb_costs_free(c);
  if (!s)
    return zb_diag_set(diag, ZB_ERR_INFEASIBLE, "zb-v found no V schedule within 1F1B's peak");
  *out = s;
  return ZB_OK;
}

/* The V building block's best (zb_plan_v_block, *score its figures);
 * with refine, the local search run from the best of each squeeze apart
 * and the better kept: it climbs from where it starts, and a better start
 * can end worse (V-Min at p=8, m=8, 1:1.2:0.8:0.05: 40.7 from the whole
 * squeeze's best, 42.9 from the held one's). */
static zb_schedule *v_blocks(int p, int m, int hop, const zb_costs *c, bool fill_all, bool refine,
                             zb_plan_score *score) {
  zb_schedule *s = NULL;
  for (int k = 0; k < (refine ? 2 : 1); k++) {
    zb_plan_score known;
    zb_schedule *b = zb_plan_v_block(p, m, hop, c, fill_all,
                                     !refine ? ZB_VB_BOTH
                                     : k     ? ZB_VB_HELD
                                             : ZB_VB_WHOLE,
                                     &known);
    if (b && refine)
      zb_plan_refine(b, c, ZB_OBJ_MAKESPAN, ZBV_REFINE_EVALS);
    zb_plan_keep(&s, score, b, refine ? NULL : &known, c, ZB_OBJ_MAKESPAN); /* known: no second simulation */
  }
  return s;
}

zb_err zb_plan_v_family(const zb_plan_request *req, const zb_costs *cin, zb_schedule **out, zb_diag *diag) {
  int p = req->p, m = req->m;
  /* Limits in units of one rank's M_F: ZB-V 1F1B's p; V-Half (p+2)/2 and
   * V-Min (p+4)/3, what the building blocks hold at equal costs. */
  double unit = zb_costs_rank_mf(cin, ZB_PLACE_V, p, 2, 0);
  double units = req->family == ZB_FAMILY_ZB_V     ? p
                 : req->family == ZB_FAMILY_V_HALF ? (p + 2) / 2.0
                                                   : (p + 4) / 3.0;
  if (units > p)
    units = p;
  if (req->family == ZB_FAMILY_ZB_V && !zb_plan_costs_even(cin) && (double)p * m <= ZBV_TIMED_PM)
    return zb_v_cost_aware(p, m, cin, units * unit, req->objective, out, diag);
  if (req->family == ZB_FAMILY_ZB_V && m >= 2 * p - 1) {
    *out = zb_plan_zb_v_handcrafted(p, m);
    return ZB_OK;
  }
  zb_costs *c = zb_costs_clone(cin);
  c->mem_limit = units * unit;
  if (cin->mem_limit > 0 && cin->mem_limit < c->mem_limit)
    c->mem_limit = cin->mem_limit;
  zb_schedule *s = NULL;
  zb_plan_score score;
  /* Under uneven costs every W policy and (on small plans) the local
   * search, except where the plan is prolonged from a short run: what
   * they find need not repeat, and a prolonged plan must be the full
   * one's lists (zb_plan.h, short_run). */
  int q;
  bool extras = !zb_plan_costs_even(c) && !req->short_run && zb_plan_short_run(req, &q) == 0;
  /* the local search, as zb-v's, on plans small enough (V-Half at p <= 8
   * then meets the Zero Bubble authors' generator) */
  bool refine = extras && (double)p * m <= ZBV_COST_AWARE_PM;
  if (req->family != ZB_FAMILY_ZB_V)
    s = v_blocks(p, m, req->family == ZB_FAMILY_V_HALF ? 2 : 1, c, extras, refine, &score);
  if (!s) { /* zb-v below 2p-1, or a limit the block cannot keep */
    zb_plan_keep(&s, &score, zb_plan_greedy_search(p, 2, m, ZB_PLACE_V, c), NULL, c, ZB_OBJ_MAKESPAN);
    if (s && refine)
      zb_plan_refine(s, c, ZB_OBJ_MAKESPAN, ZBV_REFINE_EVALS);
  }
  zb_costs_free(c);
  if (!s)
    return zb_diag_set(diag, ZB_ERR_INFEASIBLE, "%s found no V schedule within %g x M_F per rank",
                       zb_family_name(req->family), units);
  *out = s;
  return ZB_OK;
}
