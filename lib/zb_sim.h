/* zb_sim.h — event-driven simulation of a schedule under a cost model.
 *
 * Every rank runs its list in order. A compute op starts when the rank is
 * free and its inputs have arrived: an input produced on another rank
 * arrives t_comm after its producer ends; one produced on the same rank is
 * there when the producer ends. Comm actions in the list take no time of
 * their own (their cost is the t_comm latency above), but a RECV holds its
 * rank until its tensor has arrived, as a worker's transport group does
 * (its start and end are that time); a SEND holds nothing; FSDP actions
 * take none. A REDUCE_GRAD of stage s holds its rank for t_reduce[s]
 * (the tcp transport's collective blocks the host), a WAIT_REDUCE_GRAD
 * then holds nothing more (docs/schedules.md, Gradient reduction). This
 * is the host-blocking executor's form; zb_simulate_device models the
 * device-ordered one, where reductions run on a stream of their own. Ownership: zb_sim_result owns its
 * arrays; zb_sim_result_free() accepts NULL.
 */
#ifndef ZB_SIM_H
#define ZB_SIM_H

#include "zb_schedule.h"

typedef struct zb_sim_result {
  int p;
  double makespan;               /* last op end over all ranks (first start is 0) */
  double bubble_ratio;           /* 1 - busy / (p * makespan) */
  double bubble_ratio_paper;     /* (S_max - m(T_F+T_B+T_W)) / S_max, see docs/schedules.md */
  double max_span;               /* S_max: longest first-start..last-end span */
  double *busy;                  /* per rank: sum of compute op times */
  double *span_start, *span_end; /* per rank */
  double *peak_memory;           /* per rank, in the units of the cost model */
  double *peak_memory_units;     /* per rank, in units of the rank's M_F */
  /* per action (indexed like the schedule's lists): start/end times;
   * comm and FSDP actions get the time the rank reached them. NULL in a
   * result of zb_simulate_figures; end NULL in one of zb_simulate_starts.
   * The ranks' arrays are slices of one block each, start[0] and end[0]
   * its base: zb_sim_result_free frees those, so a result built by hand
   * is freed by its builder. */
  double **start, **end;
  /* per rank, the gradient reduction (docs/schedules.md, Gradient
   * reduction): reduce_time the sum of its REDUCE_GRADs' t_reduce,
   * reduce_hidden the part of it during which the rank computed (0 in
   * the host-blocking mode, where the host is held), reduce_exposed the
   * rest (reduce_time - reduce_hidden). All 0 without reductions; NULL in
   * a result built by hand. */
  double *reduce_time, *reduce_hidden, *reduce_exposed;
  /* With start times but no end (zb_simulate_starts): each compute op's
   * time, zb_costs_op_table of the costs, for zb_sim_end; else NULL. */
  double *op_time;
  int n_stages;
} zb_sim_result;

/* The end of rank r's action a, the i-th of its list: its simulated end,
 * or from a starts-only result its start plus its op's time (the sum the
 * simulation made). Needs start times. */
static inline double zb_sim_end(const zb_sim_result *sim, const zb_action *a, int r, int i) {
  if (sim->end)
    return sim->end[r][i];
  if (!sim->op_time || !zb_op_is_compute(a->op))
    return sim->start[r][i];
  return sim->start[r][i] + sim->op_time[zb_costs_op_at(a->op, a->stage, sim->n_stages)];
}

/* Simulates s under c. On success *out is a new result the caller frees.
 * Fails with ZB_ERR_DEADLOCK (and names the stuck ranks in diag) when the
 * lists cannot complete under infinite buffering, ZB_ERR_INVALID_ARG when
 * c does not describe s's stages. Does not check the memory limit (the
 * validator does). */
zb_err zb_simulate(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag);
/* The same figures without the per-action times (start and end NULL):
 * half the memory of a lowered plan's simulation at scale, for callers
 * that never draw or trace it (the coordinator). */
zb_err zb_simulate_figures(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag);
void zb_sim_result_free(zb_sim_result *r);
/* A new result (caller frees) with r's figures and per-rank arrays but no
 * per-action times, as zb_simulate_figures gives them. */
zb_sim_result *zb_sim_result_copy_figures(const zb_sim_result *r);

/* How comm actions hold a rank (docs/schedules.md, Execution model).
 * ZB_SIM_BLOCKING is the host-blocking executor (tcp, blocking_comm):
 * zb_simulate. ZB_SIM_DEVICE is the device-ordered one (nccl over cuda):
 * zb_simulate_device with the transport's window. */
typedef enum zb_sim_mode { ZB_SIM_BLOCKING = 0, ZB_SIM_DEVICE = 1 } zb_sim_mode;
/* Groups a device-ordered transport keeps in flight (ZB_NCCL_WINDOW). */
#define ZB_SIM_WINDOW 8

/* The device-ordered mode (zb_sim_device.c) on lowered lists: per rank,
 * compute ops back to back in list order, each when the previous one
 * ended, its inputs are there (a received one when its receive's group
 * completed) and every group window or more before it in the list has
 * completed (window <= 0: no window); comm groups in list order on one
 * comm stream, each starting when the one before completed and its
 * sends' producers ended, and completing when each transfer has both its
 * sides' groups started plus T_comm. A comm action's start and end are
 * its group's. A REDUCE_GRAD runs on the rank's reduction stream (one
 * per rank, its reductions in list order) from the end of the compute
 * before it, for t_reduce of its stage; a WAIT_REDUCE_GRAD holds the
 * compute stream until that stream is done. Lists without comm actions
 * are simulated as zb_simulate does (their compute timeline is the
 * same), their reductions on that stream too. Results and errors as
 * zb_simulate's (ZB_ERR_DEADLOCK names where each rank's two walks
 * stopped). */
zb_err zb_simulate_device(const zb_schedule *s, const zb_costs *c, int window, zb_sim_result **out,
                          zb_diag *diag);
/* zb_simulate or zb_simulate_device (window ZB_SIM_WINDOW), by mode. */
zb_err zb_simulate_mode(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode, zb_sim_result **out,
                        zb_diag *diag);
/* zb_simulate_figures and zb_simulate_makespan by mode. ZB_SIM_DEVICE
 * runs lowered lists as zb_simulate_device does, and lists without comm
 * actions as zb_simulate does but for each rank's reductions, which run
 * on a stream of their own there: a REDUCE_GRAD starts once the compute
 * before it in the list has ended and the rank's earlier reductions are
 * done, and only a WAIT_REDUCE_GRAD waits for it. */
zb_err zb_simulate_figures_mode(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode,
                                zb_sim_result **out, zb_diag *diag);
zb_err zb_simulate_makespan_mode(const zb_schedule *s, const zb_costs *c, zb_sim_mode mode, double *makespan,
                                 double *max_span);

/* The figures and each action's start only (end NULL): an action's end
 * is its start plus zb_costs_time of it, the sum the simulation makes,
 * so a caller that needs both (lowering) recomputes the end exactly and
 * keeps a third less memory at scale. */
zb_err zb_simulate_starts(const zb_schedule *s, const zb_costs *c, zb_sim_result **out, zb_diag *diag);

/* zb_simulate_starts in two steps, so that a caller may fault the start
 * times in from another thread while the run writes them: the result
 * with room for s's start times (caller frees), and the run into it,
 * which fills its figures and times (on failure r is the caller's to
 * free, as it always is). zb_sim_result_populate asks the kernel for the
 * times' pages without writing them (zb_populate), which is safe beside
 * the run. */
zb_sim_result *zb_sim_result_new_starts(const zb_schedule *s);
zb_err zb_simulate_into(const zb_schedule *s, const zb_costs *c, zb_sim_result *r, zb_diag *diag);
void zb_sim_result_populate(zb_sim_result *r, const zb_schedule *s);

/* The bytes a simulation of s holds while it runs besides its result
 * (its completion times per stage and microbatch). */
size_t zb_sim_scratch_bytes(const zb_schedule *s);

/* Fast path for generators: makespan and max span only, no allocation of
 * per-action times. Returns ZB_ERR_DEADLOCK when stuck. */
zb_err zb_simulate_makespan(const zb_schedule *s, const zb_costs *c, double *makespan, double *max_span);
/* The same for lists known to be in range (every compute action's stage
 * and microbatch inside the shape, c describing its stages): what the
 * generators build and their local searches permute. Skips the check of
 * c, and the pass over every list that names the first action out of
 * range when a run stops short (one the run meets still fails it). */
zb_err zb_simulate_makespan_in_range(const zb_schedule *s, const zb_costs *c, double *makespan,
                                     double *max_span);

#endif
