/* zb_timeline.h — measured per-op timelines of one iteration, every rank's
 * placed on one clock, summarised with the simulator's definitions
 * (docs/schedules.md, Bubble definitions), so that a measured bubble and a
 * predicted one mean the same thing.
 *
 * Each rank lists what it ran, in order: compute ops (F, B, W, BW),
 * transport groups (a SEND_* or RECV_* op standing for the group) and
 * gradient reductions (REDUCE_GRAD of a stage, mb -1: from the
 * collective's launch to its completion, on the reduction's own stream
 * or holding the host; docs/schedules.md, Gradient reduction). Any other
 * kind (a WAIT_* marker) is listed as a group, as before. Pure:
 * no I/O, no clock of its own; the caller aligns the times.
 */
#ifndef ZB_TIMELINE_H
#define ZB_TIMELINE_H

#include <stdbool.h>

#include "zb_err.h"
#include "zb_schedule.h"

typedef struct zb_tl_op {
  zb_op op;          /* F, B, W, BW; SEND_F/RECV_F/SEND_B/RECV_B for a transport group; REDUCE_GRAD */
  int stage, mb;     /* of the op, or of the group's first action */
  int group_size;    /* actions in a transport group; 0 for compute */
  double start, end; /* seconds on the common clock, end >= start */
} zb_tl_op;

typedef struct zb_tl_rank {
  const zb_tl_op *ops; /* borrowed */
  int n;
} zb_tl_rank;

/* What one iteration's timelines say. Per-rank arrays have p entries and
 * are owned (zb_tl_summary_free). */
typedef struct zb_tl_summary {
  int p;
  double start, end;         /* first compute start; last compute or REDUCE_GRAD end, over all ranks */
  double span;               /* end - start: the simulator's makespan */
  double max_span;           /* S_max: the longest first-to-last compute span of a rank */
  double bubble_ratio;       /* 1 - sum busy / (p * span) */
  double bubble_ratio_paper; /* (S_max - busy_max) / S_max */
  double *compute;           /* per rank: seconds of compute ops */
  double *comm;              /* per rank: seconds in transport groups and reductions within [start, end] */
  double *idle;              /* per rank: span - compute - comm, never below 0 */
  int *compute_ops, *groups; /* per rank: how many of each */
  double *reduce;  /* per rank: seconds of REDUCE_GRAD spans (also in comm: the executor waits for them) */
  int *reduce_ops; /* per rank: how many REDUCE_GRAD spans */
} zb_tl_summary;

/* Summarises p ranks' timelines into *out (which the caller frees with
 * zb_tl_summary_free, also after a failure). ZB_ERR_INVALID_ARG when p < 1,
 * an op ends before it starts or a time is not finite, naming the rank and
 * op; a run with no compute op at all has span 0 and bubble 0. */
zb_err zb_timeline_summarize(const zb_tl_rank *ranks, int p, zb_tl_summary *out, zb_diag *diag);

void zb_tl_summary_free(zb_tl_summary *s);

/* ---- costs learned from a timeline ----
 * What one iteration's timelines show of the cost model (docs/schedules.md,
 * Cost and memory model), by stage: the mean duration of its F, B and W
 * ops (a fused BW split in the ratio of prior's T_B : T_W), and the
 * transfer latency T_comm: the median, over the inputs a rank waited for
 * (its previous compute op ended before the producer's on another rank),
 * of the consumer's start less the producer's end (0 at least); and each
 * stage's gradient reduction T_reduce as zb_timeline_reduce_times finds it
 * among the p ranks given. */
typedef struct zb_tl_costs {
  int n_stages;
  double *t_f, *t_b, *t_w; /* by stage; NAN where the iteration ran no such op */
  double *t_reduce;        /* by stage; NAN where no rank reduced the stage */
  double t_comm;           /* NAN without a sample */
  int comm_samples;
} zb_tl_costs;

/* Fills *out (free with zb_tl_costs_free, also after a failure) from p
 * ranks' timelines of a plan with prior->n_stages stages (one replica's
 * ranks: T_comm pairs producers and consumers by stage and microbatch).
 * ZB_ERR_INVALID_ARG when an op names a stage outside them, or a compute
 * op or transport group a negative microbatch (a REDUCE_GRAD's is -1;
 * WAIT_* markers are not looked at). */
zb_err zb_timeline_costs(const zb_tl_rank *ranks, int p, const zb_costs *prior, zb_tl_costs *out,
                         zb_diag *diag);
void zb_tl_costs_free(zb_tl_costs *c);

/* Each stage's T_reduce in one iteration, into t_reduce[n_stages]: the
 * shortest REDUCE_GRAD span of the stage among n ranks' timelines, NAN
 * where none reduced it. Give it every replica's ranks: the replicas'
 * reductions of a stage end together, so the replica that launched last
 * waited for no one and its span is the collective's own time, while the
 * others' also hold their wait for it (skew, not reduction). Durations
 * only: the timelines need no common clock. ZB_ERR_INVALID_ARG when a
 * REDUCE_GRAD names a stage outside [0, n_stages) or n_stages < 1. */
zb_err zb_timeline_reduce_times(const zb_tl_rank *ranks, int n, int n_stages, double *t_reduce,
                                zb_diag *diag);

/* ---- clock offsets ----
 * Another clock's offset from ours, NTP-style: a round trip sends at t1
 * (our clock), arrives at t2 and is answered at t3 (theirs), and is back
 * at t4 (ours). Its offset (theirs - ours) is ((t2 - t1) + (t3 - t4)) / 2,
 * wrong by at most half its delay (t4 - t1) - (t3 - t2), so the estimate
 * is the sample of least delay among the last ZB_CLOCK_SAMPLES. */
#define ZB_CLOCK_SAMPLES 16

typedef struct zb_clock_offset {
  double offset[ZB_CLOCK_SAMPLES], delay[ZB_CLOCK_SAMPLES];
  int n, next;
} zb_clock_offset; /* zero-initialised: no sample */

/* Adds one round trip; false (and nothing added) when a time is not
 * finite or it ran backwards (t4 < t1, t3 < t2, or a negative delay). */
bool zb_clock_offset_add(zb_clock_offset *c, double t1, double t2, double t3, double t4);

/* The estimate and its sample's delay; false before any sample. */
bool zb_clock_offset_get(const zb_clock_offset *c, double *offset, double *delay);

#endif
