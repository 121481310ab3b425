/* zb_format.h — schedules in and out of text.
 *
 * Action strings follow PyTorch's pipelining notation: "<stage><kind><mb>",
 * kind one of F, I (zb's B), W, B (zb's BW), SEND_F, RECV_F, SEND_B,
 * RECV_B; FSDP kinds UNSHARD, RESHARD (no microbatch) and REDUCE_GRAD are
 * carried. CSV holds one row per rank, one action string per cell (empty
 * cells allowed). Every writer appends to a zb_buf; every reader leaves
 * its outputs untouched on failure and explains in diag (with row and
 * column for CSV).
 *
 * Implemented by responsibility in zb_format_action.c (action strings),
 * zb_format_csv.c (CSV, comm peers), zb_format_csv_comm.c (csv-comm),
 * zb_format_report.c (JSON report, Chrome trace), zb_format_draw.c (SVG
 * and ASCII timelines) and zb_format_measured.c (a measured iteration
 * beside its plan).
 */
#ifndef ZB_FORMAT_H
#define ZB_FORMAT_H

#include "zb_buf.h"
#include "zb_schedule.h"
#include "zb_sim.h"
#include "zb_timeline.h"

/* Parses one action string (the whole of s, no surrounding space).
 * Comm actions get peer -1; zb_format_fill_peers() derives it. The empty
 * string is ZB_ERR_PARSE here (only a CSV cell may be empty: ZB_OP_NONE). */
zb_err zb_action_parse(const char *s, zb_action *out, zb_diag *diag);
/* Writes a's action string into buf (NUL-terminated); returns its length. */
int zb_action_format(const zb_action *a, char *buf, int len);

/* Reads a CSV schedule, PyTorch's own as it writes them (every action
 * kind, DualPipeV's "(A;B)OVERLAP_F_B" pairs, the waits as markers). p is
 * the number of rows; the stage count comes from the largest stage seen,
 * v = stages / p (must divide); every stage must run the same microbatches
 * 0..m-1 of each kind it runs (a stage whose numbering starts elsewhere is
 * named). placement is the caller's, or ZB_PLACE_INFER: V when every row
 * r holds only stages r and 2p-1-r (as PyTorch infers it), else loop. Sets
 * comm peers from placement. Caller owns *out. */
zb_err zb_csv_parse(const char *text, size_t len, zb_placement placement, zb_schedule **out, zb_diag *diag);
/* Writes s as CSV: one row per rank, cells joined by ',', rows ended by
 * '\n'. Parsing the output gives back s, and the bytes of a parsed file
 * are reproduced when it used this layout. */
void zb_csv_write(const zb_schedule *s, zb_buf *out);
/* A lowered schedule in PyTorch's "compute_comms" format, which
 * _PipelineScheduleRuntime runs with its default arguments: the lists,
 * each send's WAIT_SEND_F / WAIT_SEND_B after the first later action of
 * its rank that proves the peer received it (else at the list's end), and
 * every stage's REDUCE_GRAD + WAIT_REDUCE_GRAD after its last W or BW
 * (zb_format_csv_comm.c, docs/formats.md). The lists' own waits and
 * reductions are replaced, empty cells dropped. */
void zb_csv_write_comms(const zb_schedule *s, zb_buf *out);
/* Sets the peer of every comm action from the schedule's placement. */
void zb_format_fill_peers(zb_schedule *s);

/* Everything a report about one plan carries (the JSON fields of
 * `zbctl plan --format json`). sim and costs may be NULL. */
typedef struct zb_plan_report {
  const char *schedule;     /* family or source name */
  const zb_schedule *sched; /* lowered or compute-only */
  const zb_costs *costs;
  const zb_rank_costs *rank_costs;  /* what the user gave, may be NULL */
  double mem_limit_units;           /* in rank M_F units, <= 0: none */
  const zb_sim_result *sim;         /* the headline: of sched as it runs */
  const zb_sim_result *sim_compute; /* of the compute-only lists; NULL: none */
  double generation_seconds;
} zb_plan_report;

/* JSON object with: schedule, ranks, chunks, microbatches, placement,
 * costs, mem_limit, makespan, bubble_ratio, bubble_ratio_paper,
 * peak_memory (per rank, M_F units) of sim, compute_only (the same four
 * of sim_compute, or null), generation_seconds, actions (per rank arrays
 * of action strings). */
void zb_json_write(const zb_plan_report *r, zb_buf *out);
/* Chrome trace event JSON (chrome://tracing, Perfetto): one thread per
 * rank, one complete event per compute op; times in microseconds of the
 * simulation's time unit scaled by 1000. Needs sim. */
void zb_trace_write(const zb_schedule *s, const zb_sim_result *sim, zb_buf *out);
/* Standalone SVG timeline: one lane per rank, a box per compute op
 * coloured by kind and labelled with its microbatch. Needs sim. */
void zb_svg_write(const zb_schedule *s, const zb_sim_result *sim, zb_buf *out);
/* ASCII timeline for terminals, `width` columns for the time axis (<= 0:
 * 100): one line per rank, F/B/W/X(BW) letters per slot, '.' for idle,
 * then a legend and the headline figures. */
void zb_ascii_write(const zb_schedule *s, const zb_sim_result *sim, int width, zb_buf *out);

/* ---- a measured iteration beside its plan (zb_format_measured.c) ----
 * What `zbctl trace` draws: one iteration's per-op timelines as the ranks
 * measured them (zb_timeline.h, every rank's on one clock), and the plan
 * of the schedule that ran it with its simulated times. Both in seconds;
 * the measured times are shown from the iteration's first compute op
 * start (the simulator's time 0), so the two start together. */
typedef struct zb_measured_view {
  const char *planned_name; /* the planned process's name */
  const zb_schedule *sched; /* the plan (lowered or compute-only); NULL: none */
  const zb_sim_result *sim; /* its simulation, in seconds; NULL: none */
  int iteration;            /* 0-based */
  const char *schedule;     /* the family that ran it */
  int p;                    /* ranks measured */
  const zb_tl_rank *ranks;  /* p timelines, index = rank */
  double span;              /* the coordinator's figures of the iteration */
  double bubble_ratio, bubble_ratio_paper;
  double predicted_bubble_ratio, predicted_bubble_ratio_paper;
  bool predicted_from_learned; /* the coordinator predicted from learned costs */
} zb_measured_view;

/* Chrome trace JSON: process 0 is the plan (its name planned_name; one
 * thread per rank, a complete event per compute op at the simulated times,
 * seconds to microseconds), process 1 "measured iteration N" (one thread
 * per rank, a complete event per compute op, cat F/B/W/BW, and per
 * transport group, cat "comm", named "comm RECV_F s2 mb5 (+3)" for a group
 * of four). The figures are in the processes' args and labels and in
 * otherData. A group posted before the first compute op starts at 0, its
 * real start in args.posted_us. Without a matching plan, process 1 only. */
void zb_trace_write_measured(const zb_measured_view *v, zb_buf *out);
/* Standalone SVG: the planned lanes above the measured ones on one time
 * axis, a rect of class "op" per compute op coloured by kind, a thinner
 * grey rect of class "comm" per measured transport group, rank labels and
 * a title with the bubble figures. */
void zb_svg_write_measured(const zb_measured_view *v, zb_buf *out);

#endif
