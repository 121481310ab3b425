/* zb_lower.h — the lowering pass: inserts SEND/RECV actions into a
 * compute-only schedule so that every rank's list runs with blocking
 * point-to-point semantics (a send completes only when the peer's receive
 * is posted) and batched groups, without deadlock.
 */
#ifndef ZB_LOWER_H
#define ZB_LOWER_H

#include "zb_par.h"
#include "zb_schedule.h"
#include "zb_sim.h"

/* Returns in *out a new schedule (caller owns) holding s's compute actions
 * in the same per-rank order with comm actions inserted. Comm between two
 * stages on one rank is local and gets no action. Comm actions that follow
 * each other on a rank form one batch. The order is derived from the
 * simulated timeline under c (NULL: unit costs): a send at its
 * producer's end, its receive where the tensor arrives (T_comm later)
 * unless a send of the receiving rank comes due first, which pulls it
 * ahead. Every rank's comm actions are thus in one global transfer
 * order, which makes the result deadlock-free by construction
 * (docs/schedules.md, Lowering). When c asks for gradient reductions
 * (some t_reduce > 0, zb_costs_reduces) and s holds none, every rank
 * also gets its REDUCE_GRADs at the earliest point and a final
 * WAIT_REDUCE_GRAD (zb_reduce_insert, ZB_REDUCE_EARLIEST); with every
 * t_reduce 0 nothing is added. The same holds for every lowering below.
 * Fails when s already has comm actions (ZB_ERR_INVALID_ARG) or cannot
 * be simulated (ZB_ERR_DEADLOCK). */
zb_err zb_lower(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag);

/* zb_lower with the per-rank merge split over par's runner (zb_par.h):
 * shares of the ranks at once, the same lists.
 *
 * Large plans (131,072 compute actions and more) are lowered through
 * their steady state (zb_period.h): a short run with most periods taken
 * out is lowered and the period of its lists repeated back, which gives
 * the full merge's lists while the simulated timeline repeats exactly
 * (docs/schedules.md, Planning at scale). */
zb_err zb_lower_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                    zb_diag *diag);

/* zb_lower_par for s when the caller holds a short run of it: run is s
 * with fewer periods of q microbatches (zb_plan_generate_run hands back
 * the one a generator planned). run is lowered and its lists' period
 * repeated back, on the same conditions as the steady-state shortcut
 * above; s is lowered as zb_lower_par does otherwise (run NULL too). */
zb_err zb_lower_par_run(const zb_schedule *s, const zb_schedule *run, int q, const zb_costs *c,
                        const zb_par *par, zb_schedule **out, zb_diag *diag);

/* zb_lower_par_run that also hands back in *figures (caller frees) the
 * lowered plan's simulated figures, as zb_simulate_figures gives them,
 * when lowering can take them from its own simulation of s: when it
 * merged s in full (not through a short run) and every receive it placed
 * arrives (its producer's end plus T_comm) by the start, in s's timeline,
 * of the compute action it precedes. The lowered lists then run on s's
 * timeline, action for action (a receive never holds its rank, a send
 * takes no time), and their figures are s's. With T_comm = 0 that always
 * holds, unless c asks for reductions (then *figures is NULL); with a T_comm that a receive's wait shows, it
 * rarely does, and *figures is NULL: simulate the lowered plan. */
zb_err zb_lower_par_figures(const zb_schedule *s, const zb_schedule *run, int q, const zb_costs *c,
                            const zb_par *par, zb_schedule **out, zb_sim_result **figures, zb_diag *diag);

/* zb_lower_par merging every rank in full, never through the steady
 * state: the reference that shortcut is tested against. */
zb_err zb_lower_full_par(const zb_schedule *s, const zb_costs *c, const zb_par *par, zb_schedule **out,
                         zb_diag *diag);

/* The reference form of the same pass: every rank's events in one global
 * time order (a heap of ranks and one of transfers). zb_lower gives the
 * same lists rank by rank when every F, B and W of c takes time (3x
 * faster at p = 256, m = 4096), and uses this walk otherwise; kept as the
 * definition the per-rank merge is tested against (tests/unit/test_lower.c). */
zb_err zb_lower_global(const zb_schedule *s, const zb_costs *c, zb_schedule **out, zb_diag *diag);

#endif
