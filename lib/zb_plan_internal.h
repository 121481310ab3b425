/* zb_plan_internal.h — what the generator files share inside libzb.
 *
 * The generators call each other in layers, never in a circle:
 *   zb_family.c        the family table (no generator)
 *   zb_plan_loop.c     the handcrafted loop lists (no generator)
 *   zb_plan_greedy.c   the greedy list scheduler
 *   zb_plan_keep.c     scores, keeping the better, the local search, the
 *                      best greedy within a limit (calls the greedy)
 *   zb_plan_auto.c, zb_plan_vblock.c, zb_plan_vtimed.c, zb_plan_zbi.c,
 *   zb_plan_dualpipe.c, then zb_plan_v.c (calls vblock and vtimed):
 *                      the families' generators, on the layers above
 *   zb_plan.c          the dispatcher, the only caller of every generator
 */
#ifndef ZB_PLAN_INTERNAL_H
#define ZB_PLAN_INTERNAL_H

#include "zb_plan.h"

/* Handcrafted loop-placement families (zb_plan_loop.c). */
zb_schedule *zb_plan_gpipe(int p, int m);
zb_schedule *zb_plan_zb_h1(int p, int m);
zb_schedule *zb_plan_zb_h2(int p, int m);
zb_schedule *zb_plan_1f1b(int p, int m);

/* When the greedy runs a pending W: GAP only into an idle gap at least
 * T_W long (an input not yet produced counts as far away); FILL_ALL into
 * any gap; CAUTIOUS like GAP but estimating when an unproduced input can
 * arrive at the earliest. ZB_W_POLICIES counts those three, which zb-v and
 * zb-interleaved try in turn. EVEN_IDLE (zb-auto's) like GAP, and into a
 * shorter gap too when idling through it would give the rank more idle
 * time since its first op than any rank has had so far: the Zero Bubble
 * authors' heuristic's bubble budget, which evens the ranks' spans. */
enum { ZB_W_GAP = 0, ZB_W_FILL_ALL = 1, ZB_W_CAUTIOUS = 2, ZB_W_POLICIES = 3, ZB_W_EVEN_IDLE = 3 };

/* Objective used to compare candidates: the request's objective first,
 * the other one on ties. */
typedef struct zb_plan_score {
  double makespan, span;
  zb_objective objective;
} zb_plan_score;
bool zb_plan_score_of(const zb_schedule *s, const zb_costs *c, zb_objective obj, zb_plan_score *out);
bool zb_plan_score_better(zb_plan_score a, zb_plan_score b);
/* The same with a ceiling on the other figure (the makespan when the
 * objective is span): when cap > 0 and either score's other figure is
 * over it, the lower of the two other figures wins (so one within the cap
 * beats one over it); else zb_plan_score_better. */
bool zb_plan_score_better_capped(zb_plan_score a, zb_plan_score b, double cap);

/* Greedy list scheduler over any placement (zb_plan_greedy.c). For every
 * stage s, cap[s] bounds the microbatches between its F and its B (<= 0:
 * unbounded); c->mem_limit (<= 0: none) bounds each rank's memory, so the
 * result always fits it; w_policy is one of ZB_W_*. Returns NULL when the
 * greedy gets stuck (memory too tight). When score is not NULL and a
 * schedule comes back, *score holds its makespan and longest span under c
 * (an upper bound of the figures zb_simulate gives for it, usually equal).
 * Caller owns the result. */
zb_schedule *zb_plan_greedy(int p, int v, int m, zb_placement pl, const zb_costs *c, const int *cap,
                            int w_policy, zb_objective obj, zb_plan_score *score);

/* Keeps order's F and B sequence on every rank and places its W ops anew
 * by the greedy's timing under c: a pending W runs when the next F or B
 * is not ready (by w_policy's rule, ZB_W_*) or the memory limit holds an
 * F back. NULL when it gets stuck (an F the limit forbids with no W to
 * run). *score as for zb_plan_greedy. Caller owns the result. */
zb_schedule *zb_plan_place_w(const zb_schedule *order, const zb_costs *c, int w_policy, zb_plan_score *score);

/* The best greedy schedule of the shape under c->mem_limit (zb_plan_keep.c):
 * stage 0 (where microbatches enter) may hold k in flight; the largest k
 * that does not get stuck is found by a galloping search, and it and 0.9
 * of it run in full. NULL when none gets through. Caller owns it. */
zb_schedule *zb_plan_greedy_search(int p, int v, int m, zb_placement pl, const zb_costs *c);

/* Keeps cand in *best when it scores better by obj (ties: the other
 * figure) and frees the loser; NULL cand is a no-op. known is cand's score
 * when the caller has it from a greedy run (whose result fits c's limit
 * by construction), or NULL to check the limit and simulate. */
void zb_plan_keep(zb_schedule **best, zb_plan_score *best_score, zb_schedule *cand,
                  const zb_plan_score *known, const zb_costs *c, zb_objective obj);
/* The same, compared by zb_plan_score_better_capped. */
void zb_plan_keep_capped(zb_schedule **best, zb_plan_score *best_score, zb_schedule *cand,
                         const zb_plan_score *known, const zb_costs *c, zb_objective obj, double cap);

/* Whether every stage's T_F, T_B and T_W are equal and T_comm is 0 (the
 * costs the handcrafted ZB-V is exact for; zb_plan_keep.c). */
bool zb_plan_costs_even(const zb_costs *c);

/* The largest running sum of memory deltas over s's ranks under c
 * (absolute units), and whether it is within c->mem_limit (or no limit). */
double zb_plan_peak(const zb_schedule *s, const zb_costs *c);
bool zb_plan_fits_memory(const zb_schedule *s, const zb_costs *c);

/* Local search on s in place: swaps two neighbouring ops of a rank where
 * the first delays the second on the critical path and the second does
 * not need the first; keeps strict improvements that fit the memory limit;
 * at most max_evals simulations. */
void zb_plan_refine(zb_schedule *s, const zb_costs *c, zb_objective obj, int max_evals);
/* The same, moves compared by zb_plan_score_better_capped: while s's
 * other figure is over cap (> 0) it walks that figure's critical path. */
void zb_plan_refine_capped(zb_schedule *s, const zb_costs *c, zb_objective obj, double cap, int max_evals);

/* The V building block (zb_plan_vblock.c): m microbatches of a block whose
 * chunk-0 F and chunk-1 B advance one rank per hop slots (1: V-Min's
 * memory, 2: V-Half's), squeezed within c->mem_limit; the best of its
 * spacings under c (by makespan; *score, when given, its figures, the
 * result fitting the limit), each spacing's W placed by timing (with
 * fill_all also with ZB_W_FILL_ALL) or left where the block put them.
 * squeezes says which squeezes compete: WHOLE moves every pass, HELD
 * keeps the steady stretch where the block put it and squeezes the
 * cool-down again with the W lifted out (the Zero Bubble authors'
 * reordering). NULL when none fits the limit. Caller owns it. */
enum { ZB_VB_WHOLE = 1, ZB_VB_HELD = 2, ZB_VB_BOTH = 3 };
zb_schedule *zb_plan_v_block(int p, int m, int hop, const zb_costs *c, bool fill_all, int squeezes,
                             zb_plan_score *score);

/* ZB-V timed against c (zb_plan_vtimed.c): the V built pass by pass on
 * a clock within c->mem_limit, W ops filling the waits for inputs, in
 * each variant of where an extra W may go to even the ranks' idle time
 * out that differs from the others; each variant's run with the least
 * worst idle time. Into out (room for ZB_VT_VARIANTS, caller owns them),
 * their number returned: 0 when every variant gets stuck. */
enum { ZB_VT_VARIANTS = 4 };
int zb_plan_v_timed(int p, int m, const zb_costs *c, zb_schedule **out);

/* Megatron's interleaved 1F1B order (zb_plan_loop.c); m % p == 0. The _warm
 * form warms rank r up with (v-1)p + 2(p-1-r) + extra chunk forwards
 * (extra < 0: all of them), where the plain one does so with extra 0, or
 * all when m = p. par (or NULL) writes the ranks' lists in shares. */
zb_schedule *zb_plan_interleaved(int p, int v, int m, const zb_par *par);
zb_schedule *zb_plan_interleaved_warm(int p, int v, int m, int extra, const zb_par *par);

/* Interleaved zero bubble (zb_plan_zbi.c): loop placement, v >= 2 chunks,
 * B and W split, within interleaved-1f1b's peak or the request's limit. */
zb_err zb_plan_zb_interleaved(const zb_plan_request *req, const zb_costs *c, zb_schedule **out,
                              zb_diag *diag);

/* DualPipeV as PyTorch lists it (zb_plan_dualpipe.c); m >= 2p - 1. */
zb_schedule *zb_plan_dualpipe_v(int p, int m);

/* Microbatches of the short run that req's family plans and then
 * prolongs to req->m (zb_period_extend; *q: microbatches per period), or
 * 0 when the family or the size plans in full (zb_family.c). */
int zb_plan_short_run(const zb_plan_request *req, int *q);

zb_err zb_plan_auto(const zb_plan_request *req, const zb_costs *c, zb_schedule **out, zb_diag *diag);
zb_err zb_plan_v_family(const zb_plan_request *req, const zb_costs *c, zb_schedule **out, zb_diag *diag);

#endif
